package fd

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// guardSeed is a randomized test's seed: GROVE_SEED replays one.
func guardSeed(t *testing.T) *rand.Rand {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("GROVE_SEED"); s != "" {
		if _, err := fmt.Sscan(s, &seed); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("seed %d (GROVE_SEED replays)", seed)
	return rand.New(rand.NewPCG(seed, 0))
}

// guardClock is a simulated host: real time advances; Raw runs at rate
// rawRate (the oscillator's error), Mono at rate monoRate (what a time
// daemon makes of it) and Boot with Mono plus the time suspended. Each
// reading carries up to jitter of skew between the clocks.
type guardClock struct {
	base               time.Time
	real               time.Duration
	raw, mono, suspend time.Duration
	rawRate, monoRate  float64
	jitter             time.Duration
	rng                *rand.Rand
}

func (c *guardClock) advance(d time.Duration) {
	c.real += d
	c.raw += time.Duration(float64(d) * c.rawRate)
	c.mono += time.Duration(float64(d) * c.monoRate)
}

func (c *guardClock) sample() ClockSample {
	j := func() time.Duration {
		if c.jitter == 0 {
			return 0
		}
		return time.Duration(c.rng.Int64N(int64(c.jitter)))
	}
	return ClockSample{Mono: c.base.Add(c.mono + j()), Raw: c.raw + j(), Boot: c.mono + c.suspend + j()}
}

// TestClockGuardQuietClocks: clocks as a healthy host keeps them (the
// oscillator 100 ppm off, the time daemon's corrections within 500 ppm,
// readings 10 µs apart) are trusted for a minute of ticks and checks.
func TestClockGuardQuietClocks(t *testing.T) {
	rng := guardSeed(t)
	for _, rho := range []float64{0, 0.001, DefaultMaxDrift, 0.1} {
		c := &guardClock{base: time.Unix(1e6, 0), rawRate: 1 + 100e-6, monoRate: 1, jitter: 10 * time.Microsecond, rng: rng}
		g := NewClockGuard(rho, 2*time.Second)
		for i := 0; i < 60*20; i++ {
			// The daemon's frequency correction wanders within ±450 ppm.
			c.monoRate = 1 + (rng.Float64()*2-1)*450e-6
			c.advance(time.Duration(40+rng.IntN(20)) * time.Millisecond)
			if ok, why := g.Check(c.sample(), true); !ok {
				t.Fatalf("ρ %v, at %v: a quiet clock untrusted: %s", rho, c.real, why)
			}
			c.advance(time.Duration(rng.IntN(40)) * time.Millisecond)
			if ok, why := g.Check(c.sample(), false); !ok {
				t.Fatalf("ρ %v, at %v (a check between ticks): a quiet clock untrusted: %s", rho, c.real, why)
			}
		}
		if g.Episode() != 0 || len(g.samples) > int(2*time.Second/(40*time.Millisecond))+1 {
			t.Fatalf("ρ %v: %d episodes, %d samples kept", rho, g.Episode(), len(g.samples))
		}
	}
}

// TestClockGuardSlewAndSuspend: a slew beyond ρ/2 either way, fast or
// slow, is caught at the first check (a tick's or one between ticks) once
// its error exceeds what the guard allows (ρ/2 of the time since the last
// tick, plus ClockSlack: 20 ms into a 5 % slew, 100 ms into a 1 % one),
// and the clock stays untrusted until a window after the last bad
// reading; a suspended host is caught likewise; a slew within the bound
// is not.
func TestClockGuardSlewAndSuspend(t *testing.T) {
	rng := guardSeed(t)
	const window = 2 * time.Second
	for _, tc := range []struct {
		name    string
		rate    float64 // Mono's rate during the fault
		suspend time.Duration
		within  time.Duration // when a check first sees it (0: never)
		caught  bool
	}{
		{"chrony's default maxslewrate, fast", 1.083, 0, 20 * time.Millisecond, true},
		{"5% slow", 0.95, 0, 20 * time.Millisecond, true},
		{"1% fast (twice ρ/2)", 1.01, 0, 40 * time.Millisecond, true},
		{"0.4% fast (within ρ/2)", 1.004, 0, 20 * time.Millisecond, false},
		{"suspended 3 s", 1, 3 * time.Second, 20 * time.Millisecond, true},
	} {
		c := &guardClock{base: time.Unix(1e6, 0), rawRate: 1, monoRate: 1, jitter: 10 * time.Microsecond, rng: rng}
		g := NewClockGuard(DefaultMaxDrift, window)
		tick := func(keep bool) bool { ok, _ := g.Check(c.sample(), keep); return ok }
		for i := 0; i < 60; i++ { // 3 s of ticks: a full window kept
			c.advance(50 * time.Millisecond)
			if !tick(true) {
				t.Fatalf("%s: untrusted before the fault", tc.name)
			}
		}
		// The fault starts just after a tick; a check some ms later.
		c.monoRate = tc.rate
		c.suspend += tc.suspend
		c.advance(tc.within)
		ok := tick(false)
		if ok == tc.caught {
			t.Fatalf("%s: a check %v into the fault said trusted=%v", tc.name, tc.within, ok)
		}
		if !tc.caught {
			for i := 0; i < 200; i++ {
				c.advance(50 * time.Millisecond)
				if !tick(true) {
					t.Fatalf("%s: untrusted after %v", tc.name, c.real)
				}
			}
			continue
		}
		// The fault lasts 1 s; untrusted all along, and for the window
		// after its last bad reading.
		for i := 0; i < 20; i++ {
			c.advance(50 * time.Millisecond)
			if tick(true) {
				t.Fatalf("%s: trusted again during the fault", tc.name)
			}
		}
		c.monoRate = 1
		end := c.raw
		for tick(true) == false {
			c.advance(50 * time.Millisecond)
			if c.raw-end > 2*window {
				t.Fatalf("%s: still untrusted %v after the fault", tc.name, c.raw-end)
			}
		}
		if c.raw-end < window {
			t.Fatalf("%s: trusted again %v after the fault's last bad reading (window %v)", tc.name, c.raw-end, window)
		}
		if g.Episode() != 1 {
			t.Fatalf("%s: %d untrusted episodes, want 1", tc.name, g.Episode())
		}
	}
}

// TestReview110SlewedClockGuarded: outside review 110's case. The
// subject's clock runs 5 % slow and the observers' 5 % fast, as two
// chrony-slewed hosts can: the core alone (the guard's premise broken)
// reports (4, 1) dead 74 ms before its own deadline. With the guard on
// the subject's clocks, as the driver runs it (a tick every 50 ms, Alive
// gated by a check), the subject stops considering itself alive within a
// tick of the slew's start, long before a majority can say dead. Without
// the guard it fails as the review's test did.
func TestReview110SlewedClockGuarded(t *testing.T) {
	cfg := Config{Interval: DefaultInterval, GracePeriod: DefaultGracePeriod, MaxDrift: DefaultMaxDrift, Observers: []NodeID{1, 2, 3}}
	const slew = 0.05
	base := time.Unix(1_000_000, 0)
	subjClock := func(real time.Duration) time.Time { return base.Add(time.Duration(float64(real) * (1 - slew))) }
	obsClock := func(real time.Duration) time.Time { return base.Add(time.Duration(float64(real) * (1 + slew))) }
	// The slew begins at real time 0; the guard has seen 2 s of quiet
	// ticks before it.
	guard := NewClockGuard(cfg.MaxDrift, 2*cfg.GracePeriod)
	for r := -2 * time.Second; r < 0; r += 50 * time.Millisecond {
		if ok, _ := guard.Check(ClockSample{Mono: base.Add(r), Raw: 10*time.Second + r, Boot: 10*time.Second + r}, true); !ok {
			t.Fatal("untrusted before the slew")
		}
	}
	sample := func(real time.Duration) ClockSample {
		m := subjClock(real)
		return ClockSample{Mono: m, Raw: 10*time.Second + real, Boot: 10*time.Second + m.Sub(base)}
	}
	s, obs := echoedSubject(t, cfg, subjClock(0), obsClock(0))
	resigned := false // the driver's tick gives the incarnation up
	alive := func(r time.Duration) bool {
		if resigned {
			return false
		}
		ok, _ := guard.Check(sample(r), false) // Driver.Alive's check
		return ok && s.Alive(subjClock(r))
	}
	for r := time.Duration(0); r < 2*time.Second; r += time.Millisecond {
		if r%(50*time.Millisecond) == 0 {
			if ok, _ := guard.Check(sample(r), true); !ok {
				resigned = true
			}
		}
		dead := 0
		for _, o := range obs {
			now := obsClock(r)
			switch o.Query(now, now, 4, 1) {
			case VerdictCondemned:
				t, _ := o.Tombstones()
				o.Durable(t)
				dead++
			case VerdictDead:
				dead++
			}
		}
		if CombineVerdicts(dead, len(obs)) && alive(r) {
			d, _ := s.Deadline()
			t.Fatalf("real time %v: the service reports (4,1) dead, yet (4,1) is alive on its own clock (%v before its deadline)", r, d.Sub(subjClock(r)))
		}
	}
	if !resigned {
		t.Fatal("the guard never gave the incarnation up")
	}
}

// TestDriverClockGuard: real drivers (UDP on loopback, the engines as
// run). Node 4's readings show its monotonic clock 5 % fast against the
// oscillator for 1 s: it gives its incarnation up at once (OnFence), its
// Alive and Deadline say no for the window after the slew, and then it is
// alive again under a new incarnation. Observer 1's readings show a
// suspended host: it answers no query (ErrClockUntrusted) until the
// window has passed, then answers again (and gives its own incarnation up
// too). The other nodes, on the real
// clocks, neither fence nor stop answering.
func TestDriverClockGuard(t *testing.T) {
	type slewed struct {
		mu            sync.Mutex
		raw0, last    time.Time
		skew, suspend time.Duration // accumulated
	}
	var slewing, suspending atomic.Bool
	mk := func(s *slewed, slewsRaw bool) func() (ClockSample, bool) {
		return func() (ClockSample, bool) {
			s.mu.Lock()
			defer s.mu.Unlock()
			now := time.Now()
			if slewsRaw && slewing.Load() {
				// Mono 5 % fast: Raw gains only 1/1.05 of it.
				s.skew += now.Sub(s.last) - time.Duration(float64(now.Sub(s.last))/1.05)
			}
			if !slewsRaw && suspending.Load() {
				s.suspend += 3 * time.Second
				suspending.Store(false)
			}
			s.last = now
			m := now.Sub(s.raw0)
			return ClockSample{Mono: now, Raw: m - s.skew, Boot: m + s.suspend}, true
		}
	}
	t0 := time.Now()
	n4 := &slewed{raw0: t0, last: t0}
	n1 := &slewed{raw0: t0, last: t0}
	clocks := []func() (ClockSample, bool){mk(n1, false), nil, nil, mk(n4, true)}
	nodes, _ := startRealClocks(t, 4, 3, nil, clocks)
	eventually(t, "all alive", allAlive(nodes))
	inc4, _ := nodes[3].d.Incarnation()
	if _, ok := nodes[3].d.Deadline(inc4); !ok {
		t.Fatal("node 4 has no deadline before the slew")
	}
	fences := nodes[3].fences.Load()

	slewing.Store(true)
	time.Sleep(200 * time.Millisecond)
	if nodes[3].d.Alive() || nodes[3].d.AliveAs(inc4) {
		t.Fatal("node 4 alive 200 ms into a 5 % slew")
	}
	if _, ok := nodes[3].d.Deadline(inc4); ok {
		t.Fatal("node 4 gives a deadline 200 ms into a 5 % slew")
	}
	eventually(t, "node 4 fenced", func() bool { return nodes[3].fences.Load() > fences })
	time.Sleep(800 * time.Millisecond)
	slewing.Store(false)
	stopped := time.Now()
	window := 2 * testCfg.GracePeriod
	eventually(t, "node 4 alive again", func() bool { return nodes[3].d.Alive() })
	if since := time.Since(stopped); since < window-60*time.Millisecond {
		t.Fatalf("node 4 alive again %v after the slew stopped (window %v)", since, window)
	}
	if inc, _ := nodes[3].d.Incarnation(); inc <= inc4 {
		t.Fatalf("node 4 alive again as incarnation %d, not above %d", inc, inc4)
	}

	// Observer 1's host is suspended (Boot jumps 3 s ahead of Mono).
	q := []Question{{Node: 2, Inc: 1}}
	if _, _, err := nodes[0].d.Query(t.Context(), q); err != nil {
		t.Fatalf("observer 1 before the suspend: %v", err)
	}
	suspending.Store(true)
	time.Sleep(100 * time.Millisecond) // a tick reads it
	if _, _, err := nodes[0].d.Query(t.Context(), q); !errors.Is(err, ErrClockUntrusted) {
		t.Fatalf("observer 1 after a suspend: %v, want ErrClockUntrusted", err)
	}
	if _, _, err := nodes[1].d.Query(t.Context(), q); err != nil {
		t.Fatalf("observer 2, on the real clocks: %v", err)
	}
	eventually(t, "observer 1 answers again", func() bool { _, _, err := nodes[0].d.Query(t.Context(), q); return err == nil })
	for i, rn := range nodes[1:3] {
		if f := rn.fences.Load(); f != 0 {
			t.Fatalf("node %d, on the real clocks, fenced %d times", i+2, f)
		}
	}
}

// echoedSubject returns subject (4, 1) and observers 1-3 (every node's
// first incarnation registered), after one beacon sent at subjNow and
// echoed by every observer at obsNow: the subject is alive.
func echoedSubject(t *testing.T, cfg Config, subjNow, obsNow time.Time) (*Subject, []*Observer) {
	t.Helper()
	s := NewSubject(cfg, 4, 1, subjNow)
	var obs []*Observer
	for _, id := range cfg.Observers {
		o := NewObserver(id, cfg.GracePeriod, obsNow, nil)
		o.SetRegistered(obsNow, map[NodeID]Incarnation{1: 1, 2: 1, 3: 1, 4: 1})
		obs = append(obs, o)
	}
	b, send, _ := s.Tick(subjNow)
	if !send {
		t.Fatal("no beacon")
	}
	for _, o := range obs {
		e, err := o.Beacon(obsNow, b)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Echo(subjNow, e); err != nil {
			t.Fatal(err)
		}
	}
	if !s.Alive(subjNow) {
		t.Fatal("subject not alive after a majority's echoes")
	}
	return s, obs
}
