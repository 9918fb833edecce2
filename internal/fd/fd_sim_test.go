package fd_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/fd"
	"github.com/grovestore/grove/internal/fd/fdsim"
	"github.com/grovestore/grove/internal/sim"
)

// The simulation runs 5 nodes (observers 1–3) and two queriers under packet
// loss up to 30 %, duplication, reordering, partitions, pauses longer than
// GracePeriod, crashes and restarts, and clock drift within the bound. Then
// the faults stop and liveness is checked.
//
// The checker is independent of the code under test: it sees only a log of
// events (every "act" a node performs while it believes itself alive, every
// fence, crash and verdict, with true time) and judges them.

const (
	simNodes     = 5
	simObservers = 3
	querierA     = 100
	querierB     = 101
)

type simKey struct {
	node fd.NodeID
	inc  fd.Incarnation
}

// checker is the independent oracle.
type checker struct {
	lastAct  map[simKey]time.Duration
	verdicts []verdictEvent
	fails    []string
	trace    []string
	fences   int
}

type verdictEvent struct {
	at   time.Duration
	key  simKey
	dead bool
}

func (c *checker) logf(at time.Duration, format string, args ...any) {
	c.trace = append(c.trace, fmt.Sprintf("%9.3fs ", at.Seconds())+fmt.Sprintf(format, args...))
}

func (c *checker) act(at time.Duration, k simKey) {
	c.lastAct[k] = at
}

func (c *checker) verdict(at time.Duration, k simKey, dead bool) {
	c.verdicts = append(c.verdicts, verdictEvent{at, k, dead})
	c.logf(at, "verdict node %d inc %d dead=%v", k.node, k.inc, dead)
}

// judge: for every dead verdict (X, i, T), X's incarnation i performed no
// act at or after T.
func (c *checker) judge() []string {
	fails := append([]string(nil), c.fails...)
	for _, v := range c.verdicts {
		if !v.dead {
			continue
		}
		if last, ok := c.lastAct[v.key]; ok && last >= v.at {
			fails = append(fails, fmt.Sprintf("node %d inc %d last acted at %v, after its dead verdict at %v", v.key.node, v.key.inc, last, v.at))
		}
	}
	return fails
}

type fdSim struct {
	w   *sim.World
	c   *fdsim.Cluster
	chk *checker
	q   map[uint64]*sim.Process
}

func newFDSim(seed int64, actualDrift float64) *fdSim {
	w := sim.NewWorld(seed)
	cfg := fd.Config{Interval: fd.DefaultInterval, GracePeriod: fd.DefaultGracePeriod, MaxDrift: fd.DefaultMaxDrift}
	for i := 1; i <= simObservers; i++ {
		cfg.Observers = append(cfg.Observers, fd.NodeID(i))
	}
	s := &fdSim{w: w, c: fdsim.New(w, w.NewNetwork(), cfg, simNodes, actualDrift), chk: &checker{lastAct: map[simKey]time.Duration{}}, q: map[uint64]*sim.Process{}}
	s.c.OnStart = func(n *fdsim.Node) {
		s.chk.logf(w.Now(), "node %d starts inc %d (clock rate %.4f)", n.ID, n.DiskInc, n.Clock.Rate())
	}
	s.c.OnFence = func(n *fdsim.Node, inc fd.Incarnation) {
		s.chk.fences++
		s.chk.logf(w.Now(), "node %d inc %d fences itself", n.ID, inc)
	}
	// Every event a node handles while it believes itself alive is an act.
	s.c.OnEvent = func(n *fdsim.Node) {
		if n.Subj.Alive(n.Clock.Now()) {
			s.chk.act(w.Now(), simKey{n.ID, n.Subj.Incarnation()})
		}
	}
	for id := fd.NodeID(1); id <= simNodes; id++ {
		s.c.Start(s.c.Nodes[id])
	}
	for _, id := range []uint64{querierA, querierB} {
		p := w.NewProcess(id)
		s.c.AttachQuerier(p)
		s.q[id] = p
		s.queryLoop(p)
	}
	return s
}

func (s *fdSim) ask(p *sim.Process, k simKey) {
	s.c.Query(p, k.node, k.inc, func(dead bool) {
		s.chk.verdict(s.w.Now(), k, dead)
		// Direct check as well: the node itself must not believe it is alive.
		if dead && s.c.Alive(k.node, k.inc) {
			s.chk.fails = append(s.chk.fails, fmt.Sprintf("node %d inc %d reported dead at %v while alive", k.node, k.inc, s.w.Now()))
		}
	})
}

// queryLoop asks about random nodes, mostly their newest incarnation,
// sometimes an older one.
func (s *fdSim) queryLoop(p *sim.Process) {
	id := fd.NodeID(1 + s.w.Rand.Intn(simNodes))
	inc := s.c.Nodes[id].DiskInc
	if inc > 1 && s.w.Rand.Intn(4) == 0 {
		inc--
	}
	s.ask(p, simKey{id, inc})
	p.Go(s.w.Between(20*time.Millisecond, 120*time.Millisecond), func() { s.queryLoop(p) })
}

func runFDSim(seed int64, actualDrift float64) *fdSim {
	s := newFDSim(seed, actualDrift)
	w, net := s.w, s.c.Net
	const safety = 30 * time.Second
	net.DropRate = 0.3 * w.Rand.Float64()
	net.DupRate = 0.05 * w.Rand.Float64()
	net.MaxDelay = w.Between(time.Millisecond, 30*time.Millisecond)
	for at := time.Duration(0); at < safety; at += w.Between(200*time.Millisecond, 1500*time.Millisecond) {
		w.At(at, func() {
			n := s.c.Nodes[fd.NodeID(1+w.Rand.Intn(simNodes))]
			switch r := w.Rand.Intn(10); {
			case r < 2:
				s.chk.logf(w.Now(), "CRASH node %d inc %d", n.ID, n.Subj.Incarnation())
				s.c.Crash(n)
				w.After(w.Between(100*time.Millisecond, 5*time.Second), func() {
					if w.Now() < safety { // the liveness phase decides restarts itself
						s.c.Restart(n)
					}
				})
			case r < 4:
				d := w.Between(100*time.Millisecond, 3*time.Second) // often > GracePeriod
				s.chk.logf(w.Now(), "PAUSE node %d for %v", n.ID, d)
				n.Proc.Pause(d)
			case r < 6:
				a, b := w.RandomSplit(simNodes)
				s.chk.logf(w.Now(), "PARTITION %v | %v", a, b)
				net.Partition(a, b)
			case r < 8:
				s.chk.logf(w.Now(), "HEAL")
				net.Heal()
			default:
				net.DropRate = 0.3 * w.Rand.Float64()
				s.chk.logf(w.Now(), "drop rate %.2f", net.DropRate)
			}
		})
	}
	w.RunUntil(safety)

	// Liveness phase: faults stop. Some nodes stay crashed (at most one
	// observer, so that a majority of observers lives).
	net.Heal()
	net.DropRate, net.DupRate = 0, 0
	permDead := map[fd.NodeID]bool{}
	deadObservers := 0
	for id := fd.NodeID(1); id <= simNodes; id++ {
		n := s.c.Nodes[id]
		if w.Rand.Intn(3) == 0 && (!n.IsObserver || deadObservers == 0) {
			if n.IsObserver {
				deadObservers++
			}
			permDead[id] = true
			s.c.Crash(n)
		} else {
			s.c.Restart(n)
		}
	}
	w.RunUntil(safety + 4*s.c.Cfg.GracePeriod)

	// (a): every crashed incarnation is reported dead; every live node's
	// current incarnation is reported alive. A node may still move to a new
	// incarnation here (an observer that tombstoned it during the faults
	// refuses it, and with one observer down it loses its majority), so the
	// check is repeated until no incarnation changed while it ran.
	for attempt := 0; ; attempt++ {
		incs := map[fd.NodeID]fd.Incarnation{}
		for id := fd.NodeID(1); id <= simNodes; id++ {
			incs[id] = s.c.Nodes[id].DiskInc
			for inc := fd.Incarnation(1); inc <= incs[id]; inc++ {
				s.ask(s.q[querierA], simKey{id, inc})
			}
		}
		w.RunUntil(w.Now() + 2*fdsim.QueryTimeout)
		stable := true
		for id := fd.NodeID(1); id <= simNodes; id++ {
			stable = stable && s.c.Nodes[id].DiskInc == incs[id]
		}
		if !stable && attempt < 5 {
			w.RunUntil(w.Now() + 2*s.c.Cfg.GracePeriod)
			continue
		}
		for id := fd.NodeID(1); id <= simNodes; id++ {
			for inc := fd.Incarnation(1); inc <= incs[id]; inc++ {
				k := simKey{id, inc}
				got := s.lastVerdict(k)
				wantDead := permDead[id] || inc < incs[id]
				if got == nil || got.dead != wantDead {
					s.chk.fails = append(s.chk.fails, fmt.Sprintf("liveness: node %d inc %d: verdict %v, want dead=%v", id, inc, got, wantDead))
				}
			}
		}
		break
	}
	return s
}

func (s *fdSim) lastVerdict(k simKey) *verdictEvent {
	for i := len(s.chk.verdicts) - 1; i >= 0; i-- {
		if s.chk.verdicts[i].key == k {
			return &s.chk.verdicts[i]
		}
	}
	return nil
}

func TestFailureDetectorSimulation(t *testing.T) {
	seeds := sim.Seeds(t, 200)
	deadVerdicts, fences := 0, 0
	for _, seed := range seeds {
		s := runFDSim(seed, fd.DefaultMaxDrift)
		if fails := s.chk.judge(); len(fails) > 0 {
			tail := s.chk.trace
			if len(tail) > 60 {
				tail = tail[len(tail)-60:]
			}
			t.Fatalf("seed %d: %d violations, first: %s\n%s\ntrace tail:\n%s", seed, len(fails), fails[0], sim.ReplayHint("TestFailureDetectorSimulation", seed), strings.Join(tail, "\n"))
		}
		for _, v := range s.chk.verdicts {
			if v.dead {
				deadVerdicts++
			}
		}
		fences += s.chk.fences
	}
	// The faults must actually bite, or the test proves nothing.
	if len(seeds) >= 20 && (deadVerdicts == 0 || fences == 0) {
		t.Fatalf("faults never produced a dead verdict (%d) or a self-fence (%d)", deadVerdicts, fences)
	}
	t.Logf("%d seeds (first %d): %d dead verdicts, %d self-fences, no violations", len(seeds), seeds[0], deadVerdicts, fences)
}

// TestFailureDetectorCheckerHasTeeth breaks the protocol's assumption (clocks
// drift 30 % while the configuration promises 1 %) and requires the oracle to
// notice: a checker that cannot fail proves nothing.
func TestFailureDetectorCheckerHasTeeth(t *testing.T) {
	for seed := int64(1); seed <= 50; seed++ {
		if fails := runFDSim(seed, 0.3).chk.judge(); len(fails) > 0 {
			t.Logf("seed %d: checker caught: %s", seed, fails[0])
			return
		}
	}
	t.Fatal("30 % clock drift against a 1 % bound produced no violation in 50 seeds")
}
