package fd_test

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/fd"
	"github.com/grovestore/grove/internal/fd/fdsim"
	"github.com/grovestore/grove/internal/sim"
	"github.com/grovestore/grove/internal/sim/simmeta"
)

// The simulation runs 5 nodes (observers 1–3) and two queriers on the real
// engine (fd.Engine, as the driver runs it) under packet loss up to 30 %,
// duplication, reordering, partitions, pauses longer than GracePeriod,
// crashes and restarts, clock drift within the bound, disks that are slow
// and fail writes, a config service that stalls for seconds, and a rogue
// host that sends garbage, datagrams signed with the wrong key, and replays
// of captured datagrams from spoofed addresses. Then the faults stop and
// liveness is checked.
//
// The checker is independent of the code under test: it sees a log of
// events (every "act" a node performs while it believes itself alive, every
// fence, crash and verdict, with true time), every answer an observer sends,
// and the simulated disks' platters and the config service's committed
// state, and judges them.

const (
	simNodes     = 5
	simObservers = 3
	querierA     = 100
	querierB     = 101
	rogue        = 666
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
	answers  int
}

type verdictEvent struct {
	at    time.Duration
	asked time.Duration
	key   simKey
	dead  bool
}

func (c *checker) logf(at time.Duration, format string, args ...any) {
	c.trace = append(c.trace, fmt.Sprintf("%9.3fs ", at.Seconds())+fmt.Sprintf(format, args...))
}

func (c *checker) fail(at time.Duration, format string, args ...any) {
	msg := fmt.Sprintf("%.3fs: ", at.Seconds()) + fmt.Sprintf(format, args...)
	c.fails = append(c.fails, msg)
	c.logf(at, "VIOLATION %s", msg)
}

func (c *checker) act(at time.Duration, k simKey) {
	c.lastAct[k] = at
}

func (c *checker) verdict(at, asked time.Duration, k simKey, dead bool) {
	c.verdicts = append(c.verdicts, verdictEvent{at, asked, k, dead})
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

type fdOptions struct {
	drift     float64 // actual clock drift (the config promises 1 %)
	lyingDisk bool    // observers' disks acknowledge writes they lose
	ungated   bool    // observers answer without their contact gate
}

type fdSim struct {
	w      *sim.World
	net    *sim.Network
	svc    *simmeta.Service
	c      *fdsim.Cluster
	chk    *checker
	q      map[uint64]*sim.Process
	groups [][]uint64 // the current partition (nil: none)
	// captured datagrams, for the rogue's replays
	captured [][2]any
}

func newFDSim(seed int64, o fdOptions) *fdSim {
	w := sim.NewWorld(seed)
	cfg := fd.Config{Interval: fd.DefaultInterval, GracePeriod: fd.DefaultGracePeriod, MaxDrift: fd.DefaultMaxDrift}
	for i := 1; i <= simObservers; i++ {
		cfg.Observers = append(cfg.Observers, fd.NodeID(i))
	}
	net := w.NewNetwork()
	svc := simmeta.New(w)
	s := &fdSim{w: w, net: net, svc: svc, chk: &checker{lastAct: map[simKey]time.Duration{}}, q: map[uint64]*sim.Process{}}
	s.c = fdsim.New(w, net, svc, cfg, simNodes, o.drift)
	s.c.Ungated = o.ungated
	svc.Reachable = s.reachesConfig
	if o.lyingDisk {
		for _, id := range cfg.Observers {
			s.c.Nodes[id].Disk.Lies = true
		}
	}
	s.c.OnStart = func(n *fdsim.Node) {
		s.chk.logf(w.Now(), "node %d starts inc %d (clock rate %.4f)", n.ID, n.Inc, n.Clock.Rate())
	}
	s.c.OnFence = func(n *fdsim.Node, inc fd.Incarnation) {
		s.chk.fences++
		s.chk.logf(w.Now(), "node %d inc %d fences itself", n.ID, inc)
	}
	// Every event a node handles while it believes itself alive is an act.
	s.c.OnEvent = func(n *fdsim.Node) {
		if n.Inc != 0 && n.Eng.AliveAs(n.Clock.Now(), n.Inc) {
			s.chk.act(w.Now(), simKey{n.ID, n.Inc})
		}
	}
	// An observer says "dead" only with the verdict on its platter (or a
	// newer incarnation registered in the config service).
	s.c.OnAnswer = func(ob *fdsim.Node, q fd.Question, dead bool) {
		s.chk.answers++
		if !dead {
			return
		}
		if fdsim.DurableTombstones(ob)[q.Node] < q.Inc && s.c.Registered(q.Node) <= q.Inc {
			s.chk.fail(w.Now(), "observer %d answers node %d inc %d dead without a durable tombstone", ob.ID, q.Node, q.Inc)
		}
	}
	net.Tap = func(from, to uint64, payload any) {
		if b, ok := payload.([]byte); ok && from != rogue && len(s.captured) < 2000 {
			s.captured = append(s.captured, [2]any{from, b})
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
	net.Attach(w.NewProcess(rogue))
	return s
}

// reachesConfig models where the config service lives during a partition:
// on the side that holds a majority of its members (the observers), if
// they are up; processes outside the partition reach everyone.
func (s *fdSim) reachesConfig(id uint64) bool {
	up := 0
	for _, o := range s.c.Cfg.Observers {
		if s.c.Nodes[o].Proc.Up() {
			up++
		}
	}
	if up < simObservers/2+1 {
		return false
	}
	if s.groups == nil {
		return true
	}
	for _, g := range s.groups {
		in, members := false, 0
		for _, x := range g {
			in = in || x == id
			if x <= simObservers && s.c.Nodes[fd.NodeID(x)].Proc.Up() {
				members++
			}
		}
		if in {
			return members >= simObservers/2+1
		}
	}
	return true
}

func (s *fdSim) partition(a, b []uint64) {
	s.groups = [][]uint64{a, b}
	s.net.Partition(a, b)
}

func (s *fdSim) heal() {
	s.groups = nil
	s.net.Heal()
}

func (s *fdSim) ask(p *sim.Process, k simKey) {
	asked := s.w.Now()
	s.c.Query(p, k.node, k.inc, func(dead bool) {
		s.chk.verdict(s.w.Now(), asked, k, dead)
		// Direct check as well: the node itself must not believe it is alive.
		if dead && s.c.Alive(k.node, k.inc) {
			s.chk.fail(s.w.Now(), "node %d inc %d reported dead while alive", k.node, k.inc)
		}
	})
}

// queryLoop asks about random nodes, mostly their registered incarnation,
// sometimes an older or a newer one.
func (s *fdSim) queryLoop(p *sim.Process) {
	id := fd.NodeID(1 + s.w.Rand.Intn(simNodes))
	inc := s.c.Registered(id)
	switch r := s.w.Rand.Intn(8); {
	case r == 0 && inc > 1:
		inc--
	case r == 1:
		inc++
	}
	if inc > 0 {
		s.ask(p, simKey{id, inc})
	}
	p.Go(s.w.Between(20*time.Millisecond, 120*time.Millisecond), func() { s.queryLoop(p) })
}

// rogueAct: a host on the network without the cluster key sends garbage,
// datagrams sealed with another key, and replays of captured datagrams,
// often from spoofed addresses.
func (s *fdSim) rogueAct() {
	w := s.w
	to := uint64(1 + w.Rand.Intn(simNodes))
	from := uint64(rogue)
	if w.Rand.Intn(2) == 0 {
		from = uint64(1 + w.Rand.Intn(simNodes)) // spoofed source
	}
	var b []byte
	switch w.Rand.Intn(4) {
	case 0:
		b = make([]byte, w.Rand.Intn(2*fd.PacketSize))
		w.Rand.Read(b)
	case 1: // a beacon announcing a huge incarnation, with the wrong key
		b = fd.Packet{Kind: fd.KindBeacon, Subject: fd.NodeID(from%simNodes + 1), Incarnation: 1_000_000, Seq: 1}.Seal(nil, fd.Key("not-the-cluster-key-at-all-00000"))
	case 2: // a forged echo, with the wrong key
		b = fd.Packet{Kind: fd.KindEcho, Subject: fd.NodeID(to), Incarnation: s.c.Registered(fd.NodeID(to)), Seq: 1, Observer: 1}.Seal(nil, fd.Key("not-the-cluster-key-at-all-00000"))
	default: // a replay of a captured datagram, from its original sender
		if len(s.captured) == 0 {
			return
		}
		c := s.captured[w.Rand.Intn(len(s.captured))]
		from, b = c[0].(uint64), c[1].([]byte)
	}
	s.net.Send(from, to, b)
}

func runFDSim(seed int64, o fdOptions) *fdSim {
	s := newFDSim(seed, o)
	w, net := s.w, s.net
	const safety = 30 * time.Second
	net.DropRate = 0.3 * w.Rand.Float64()
	net.DupRate = 0.05 * w.Rand.Float64()
	net.MaxDelay = w.Between(time.Millisecond, 30*time.Millisecond)
	for at := time.Duration(0); at < safety; at += w.Between(200*time.Millisecond, 1500*time.Millisecond) {
		w.At(at, func() {
			n := s.c.Nodes[fd.NodeID(1+w.Rand.Intn(simNodes))]
			switch r := w.Rand.Intn(14); {
			case r < 2:
				s.chk.logf(w.Now(), "CRASH node %d inc %d", n.ID, n.Inc)
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
				s.heal()
				s.partition(a, b)
			case r < 8:
				s.chk.logf(w.Now(), "HEAL")
				s.heal()
			case r < 9:
				d := w.Between(500*time.Millisecond, 4*time.Second)
				s.chk.logf(w.Now(), "CONFIG STALL %v", d)
				s.svc.StallFor(d)
			case r < 11:
				n.Disk.FailRate = 0.5 * w.Rand.Float64()
				n.Disk.StallRate = 0.2 * w.Rand.Float64()
				s.chk.logf(w.Now(), "DISK node %d fails %.2f stalls %.2f", n.ID, n.Disk.FailRate, n.Disk.StallRate)
			case r < 12:
				for i := 0; i < 50; i++ {
					w.After(w.Between(0, time.Second), s.rogueAct)
				}
			default:
				net.DropRate = 0.3 * w.Rand.Float64()
				s.chk.logf(w.Now(), "drop rate %.2f", net.DropRate)
			}
		})
	}
	w.RunUntil(safety)
	s.liveness()
	return s
}

// liveness: faults stop; some nodes stay crashed (at most one observer, so
// that a majority of observers lives); every crashed incarnation must be
// reported dead and every live node's current one alive.
func (s *fdSim) liveness() {
	w, net := s.w, s.net
	s.heal()
	net.DropRate, net.DupRate = 0, 0
	s.svc.EndStall()
	permDead := map[fd.NodeID]bool{}
	deadObservers := 0
	for id := fd.NodeID(1); id <= simNodes; id++ {
		n := s.c.Nodes[id]
		n.Disk.FailRate, n.Disk.StallRate = 0, 0
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
	w.RunUntil(w.Now() + 4*s.c.Cfg.GracePeriod)

	// A node may still move to a new incarnation here (an observer that
	// tombstoned it during the faults refuses it, and with one observer
	// down it loses its majority), so the check is repeated until no
	// incarnation changed while it ran.
	settled := func(incs map[fd.NodeID]fd.Incarnation) bool {
		for id := fd.NodeID(1); id <= simNodes; id++ {
			inc := s.c.Registered(id)
			if incs != nil && inc != incs[id] || !permDead[id] && !s.c.Alive(id, inc) {
				return false
			}
		}
		return true
	}
	for attempt := 0; ; attempt++ {
		if !settled(nil) && attempt < 5 {
			w.RunUntil(w.Now() + 2*s.c.Cfg.GracePeriod)
			continue
		}
		incs := map[fd.NodeID]fd.Incarnation{}
		for id := fd.NodeID(1); id <= simNodes; id++ {
			incs[id] = s.c.Registered(id)
		}
		// A superseded incarnation is reported dead GracePeriod after the
		// observers learn of the newer one.
		w.RunUntil(w.Now() + s.c.Cfg.GracePeriod + 100*time.Millisecond)
		if !settled(incs) && attempt < 5 {
			continue
		}
		round := w.Now()
		for id := fd.NodeID(1); id <= simNodes; id++ {
			for inc := fd.Incarnation(1); inc <= incs[id]; inc++ {
				s.ask(s.q[querierA], simKey{id, inc})
			}
		}
		w.RunUntil(w.Now() + 2*fdsim.QueryTimeout)
		if !settled(incs) && attempt < 5 {
			w.RunUntil(w.Now() + 2*s.c.Cfg.GracePeriod)
			continue
		}
		for id := fd.NodeID(1); id <= simNodes; id++ {
			for inc := fd.Incarnation(1); inc <= incs[id]; inc++ {
				k := simKey{id, inc}
				got := s.lastVerdict(k, round)
				wantDead := permDead[id] || inc < incs[id]
				if got == nil || got.dead != wantDead {
					s.chk.fail(w.Now(), "liveness: node %d inc %d: verdict %v, want dead=%v", id, inc, got, wantDead)
				}
			}
		}
		break
	}
}

// lastVerdict is the last verdict on k of a query asked at or after since.
func (s *fdSim) lastVerdict(k simKey, since time.Duration) *verdictEvent {
	for i := len(s.chk.verdicts) - 1; i >= 0; i-- {
		if s.chk.verdicts[i].key == k && s.chk.verdicts[i].asked >= since {
			return &s.chk.verdicts[i]
		}
	}
	return nil
}

func reportFD(t *testing.T, test string, seed int64, s *fdSim, fails []string) {
	t.Helper()
	if path := os.Getenv("GROVE_TRACE"); path != "" {
		os.WriteFile(path, []byte(strings.Join(s.chk.trace, "\n")+"\n"), 0o644)
	}
	tail := s.chk.trace
	if len(tail) > 80 {
		tail = tail[len(tail)-80:]
	}
	t.Fatalf("seed %d: %d violations, first: %s\n%s\ntrace tail:\n%s", seed, len(fails), fails[0], sim.ReplayHint(test, seed), strings.Join(tail, "\n"))
}

func TestFailureDetectorSimulation(t *testing.T) {
	seeds := sim.Seeds(t, 200)
	deadVerdicts, fences, diskFails, stalls, answers := 0, 0, 0, 0, 0
	for _, seed := range seeds {
		s := runFDSim(seed, fdOptions{drift: fd.DefaultMaxDrift})
		if fails := s.chk.judge(); len(fails) > 0 {
			reportFD(t, "TestFailureDetectorSimulation", seed, s, fails)
		}
		for _, v := range s.chk.verdicts {
			if v.dead {
				deadVerdicts++
			}
		}
		fences += s.chk.fences
		answers += s.chk.answers
		stalls += s.svc.Ambiguous
		for _, n := range s.c.Nodes {
			diskFails += n.Disk.Failures
		}
	}
	// The faults must actually bite, or the test proves nothing.
	if len(seeds) >= 20 && (deadVerdicts == 0 || fences == 0 || diskFails == 0) {
		t.Fatalf("faults did not bite: %d dead verdicts, %d self-fences, %d failed disk writes", deadVerdicts, fences, diskFails)
	}
	t.Logf("%d seeds (first %d): %d dead verdicts, %d observer answers, %d self-fences, %d failed disk writes, %d decrees that timed out before committing; no violations",
		len(seeds), seeds[0], deadVerdicts, answers, fences, diskFails, stalls)
}

// TestFailureDetectorCheckerHasTeeth breaks the protocol's assumption (clocks
// drift 30 % while the configuration promises 1 %) and requires the oracle to
// notice: a checker that cannot fail proves nothing.
func TestFailureDetectorCheckerHasTeeth(t *testing.T) {
	for seed := int64(1); seed <= 50; seed++ {
		if fails := runFDSim(seed, fdOptions{drift: 0.3}).chk.judge(); len(fails) > 0 {
			t.Logf("seed %d: checker caught: %s", seed, fails[0])
			return
		}
	}
	t.Fatal("30 % clock drift against a 1 % bound produced no violation in 50 seeds")
}

// TestDurableVerdictCheckerHasTeeth: observers whose disks acknowledge
// writes they lose must be caught answering "dead" without a durable
// tombstone.
func TestDurableVerdictCheckerHasTeeth(t *testing.T) {
	for seed := int64(1); seed <= 20; seed++ {
		if fails := runFDSim(seed, fdOptions{drift: fd.DefaultMaxDrift, lyingDisk: true}).chk.judge(); len(fails) > 0 {
			if !strings.Contains(fails[0], "durable") {
				t.Fatalf("seed %d: expected the durability check to fire first, got: %s", seed, fails[0])
			}
			t.Logf("seed %d: checker caught: %s", seed, fails[0])
			return
		}
	}
	t.Fatal("lying disks produced no violation in 20 seeds")
}

// runCascade: observer 1's node is cut off for 5 s while queriers that can
// still reach it ask about every node; the network heals; then observer 2's
// node is cut off for 5 s. It returns the nodes (other than 1 and 2) that
// fenced during either isolation: each of them had a majority of observers
// within reach throughout.
func runCascade(seed int64, ungated bool) (*fdSim, []string) {
	s := newFDSim(seed, fdOptions{drift: fd.DefaultMaxDrift, ungated: ungated})
	w := s.w
	var bad []string
	watching := false
	s.c.OnFence = func(n *fdsim.Node, inc fd.Incarnation) {
		s.chk.logf(w.Now(), "node %d inc %d fences itself", n.ID, inc)
		if watching && n.ID > 2 {
			bad = append(bad, fmt.Sprintf("node %d fenced at %.3fs", n.ID, w.Now().Seconds()))
		}
	}
	// Queriers ask about every node's registered incarnation, often.
	for _, p := range s.q {
		var loop func()
		loop = func() {
			for id := fd.NodeID(1); id <= simNodes; id++ {
				if inc := s.c.Registered(id); inc > 0 {
					s.ask(p, simKey{id, inc})
				}
			}
			p.Go(w.Between(50*time.Millisecond, 150*time.Millisecond), loop)
		}
		p.Go(0, loop)
	}
	w.At(3*time.Second, func() { watching = true; s.partition([]uint64{1}, []uint64{2, 3, 4, 5}) })
	w.At(8*time.Second, func() { watching = false; s.heal() })
	w.At(11*time.Second, func() { watching = true; s.partition([]uint64{2}, []uint64{1, 3, 4, 5}) })
	w.At(16*time.Second, func() { watching = false; s.heal() })
	w.RunUntil(18 * time.Second)
	return s, bad
}

// TestObserverIsolationNoCascade: an observer cut off from the others must
// not leave permanent verdicts on healthy nodes behind: after it heals, the
// isolation of a second observer must not fence any node that still reaches
// a majority of observers. TestCascadeCheckHasTeeth shows it would without
// the observers' contact gate.
func TestObserverIsolationNoCascade(t *testing.T) {
	for _, seed := range sim.Seeds(t, 20) {
		s, bad := runCascade(seed, false)
		if fails := s.chk.judge(); len(fails) > 0 {
			reportFD(t, "TestObserverIsolationNoCascade", seed, s, fails)
		}
		if len(bad) > 0 {
			reportFD(t, "TestObserverIsolationNoCascade", seed, s, bad)
		}
	}
}

func TestCascadeCheckHasTeeth(t *testing.T) {
	for seed := int64(1); seed <= 10; seed++ {
		if _, bad := runCascade(seed, true); len(bad) > 0 {
			t.Logf("seed %d: without the gate: %s", seed, bad[0])
			return
		}
	}
	t.Fatal("ungated observers caused no cascade in 10 seeds")
}
