package fd

import (
	"encoding/binary"
	"fmt"
	"strings"
	"testing"
	"time"

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
	node NodeID
	inc  Incarnation
}

// checker is the independent oracle.
type checker struct {
	lastAct  map[simKey]time.Duration
	verdicts []verdictEvent
	fails    []string
	trace    []string
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
	for _, v := range c.verdicts {
		if v.dead && v.key == k && v.at <= at {
			c.fails = append(c.fails, fmt.Sprintf("node %d inc %d acted at %v after a dead verdict at %v", k.node, k.inc, at, v.at))
		}
	}
}

func (c *checker) verdict(at time.Duration, k simKey, dead bool) {
	c.verdicts = append(c.verdicts, verdictEvent{at, k, dead})
	c.logf(at, "verdict node %d inc %d dead=%v", k.node, k.inc, dead)
}

// simNode is one node: a Subject, an Observer on observer nodes, and a
// "disk" holding the persisted incarnation.
type simNode struct {
	id       NodeID
	proc     *sim.Process
	clock    *sim.Clock
	diskInc  Incarnation            // persisted incarnation: survives crashes
	diskTomb map[NodeID]Incarnation // persisted observer tombstones
	subj     *Subject
	obs      *Observer
	observer bool
}

type fdSim struct {
	t     *testing.T
	w     *sim.World
	net   *sim.Network
	cfg   Config
	nodes map[NodeID]*simNode
	chk   *checker
	// queriers' pending queries
	qclock  map[uint64]*sim.Clock
	qprocs  map[uint64]*sim.Process
	pending map[uint64]*query
	nextQID uint64
}

type query struct {
	key  simKey
	dead map[uint64]bool // observers that answered dead (the network duplicates)
	done bool
}

func newFDSim(t *testing.T, seed int64, actualDrift float64) *fdSim {
	w := sim.NewWorld(seed)
	s := &fdSim{t: t, w: w, net: w.NewNetwork(), nodes: map[NodeID]*simNode{}, chk: &checker{lastAct: map[simKey]time.Duration{}},
		qclock: map[uint64]*sim.Clock{}, qprocs: map[uint64]*sim.Process{}, pending: map[uint64]*query{}}
	s.cfg = Config{Interval: DefaultInterval, GracePeriod: DefaultGracePeriod, MaxDrift: DefaultMaxDrift}
	for i := 1; i <= simObservers; i++ {
		s.cfg.Observers = append(s.cfg.Observers, NodeID(i))
	}
	for i := 1; i <= simNodes; i++ {
		n := &simNode{id: NodeID(i), proc: w.NewProcess(uint64(i)), clock: w.NewClock(actualDrift), observer: i <= simObservers}
		s.nodes[n.id] = n
		s.net.Attach(n.proc)
		s.start(n)
	}
	for _, q := range []uint64{querierA, querierB} {
		p := w.NewProcess(q)
		s.qprocs[q] = p
		s.qclock[q] = w.NewClock(s.cfg.MaxDrift)
		s.net.Attach(p)
		p.Deliver = s.answer
		s.queryLoop(q)
	}
	return s
}

func known(n NodeID) bool { return n >= 1 && n <= simNodes }

// start begins a new life of n: new incarnation persisted before use.
func (s *fdSim) start(n *simNode) {
	now := n.clock.Now()
	n.diskInc++ // persisted before the subject uses it
	n.subj = NewSubject(s.cfg, n.id, n.diskInc, now)
	if n.observer {
		n.obs = NewObserver(n.id, s.cfg.GracePeriod, now, n.diskTomb, known)
	}
	n.proc.Deliver = func(from uint64, b []byte) { s.deliver(n, from, b) }
	s.chk.logf(s.w.Now(), "node %d starts inc %d (clock rate %.4f)", n.id, n.diskInc, n.clock.Rate())
	s.tick(n)
}

// newIncarnation is the in-process restart after a self-fence.
func (s *fdSim) newIncarnation(n *simNode) {
	n.diskInc++
	n.subj = NewSubject(s.cfg, n.id, n.diskInc, n.clock.Now())
	s.chk.logf(s.w.Now(), "node %d comes back as inc %d", n.id, n.diskInc)
}

func (s *fdSim) actIfAlive(n *simNode) {
	if n.subj.Alive(n.clock.Now()) {
		s.chk.act(s.w.Now(), simKey{n.id, n.subj.Incarnation()})
	}
}

func (s *fdSim) tick(n *simNode) {
	now := n.clock.Now()
	b, send, fenced := n.subj.Tick(now)
	if fenced {
		s.chk.logf(s.w.Now(), "node %d inc %d fences itself", n.id, n.subj.Incarnation())
		s.newIncarnation(n)
		b, send, _ = n.subj.Tick(n.clock.Now())
	}
	if send {
		buf := b.Encode(nil)
		for _, o := range s.cfg.Observers {
			s.net.Send(uint64(n.id), uint64(o), buf)
		}
	}
	s.actIfAlive(n)
	// Ticks at a random 5–25 ms keep acts dense around the deadline.
	n.proc.Go(s.w.Between(5*time.Millisecond, 25*time.Millisecond), func() { s.tick(n) })
}

func (s *fdSim) deliver(n *simNode, from uint64, b []byte) {
	if len(b) > 0 && b[0] == 'Q' {
		s.serveQuery(n, from, b)
		return
	}
	p, err := Decode(b)
	if err != nil {
		s.t.Fatalf("seed %d: undecodable packet from %d: %v", s.w.Seed, from, err)
	}
	now := n.clock.Now()
	switch p.Kind {
	case KindBeacon:
		if n.obs == nil {
			return
		}
		e, err := n.obs.Beacon(now, p)
		if err != nil {
			return // old incarnation: logged and dropped by the real driver
		}
		s.net.Send(uint64(n.id), uint64(p.Subject), e.Encode(nil))
	case KindEcho:
		_ = n.subj.Echo(now, p)
	}
	s.actIfAlive(n)
}

// Query wire for the simulation only ('Q' qid target inc / 'A' qid dead).
func (s *fdSim) serveQuery(n *simNode, from uint64, b []byte) {
	if n.obs == nil || len(b) != 25 {
		return
	}
	qid := binary.BigEndian.Uint64(b[1:])
	target := NodeID(binary.BigEndian.Uint64(b[9:]))
	inc := Incarnation(binary.BigEndian.Uint64(b[17:]))
	dead, persist := n.obs.Query(n.clock.Now(), target, inc)
	if persist {
		n.diskTomb = n.obs.Tombstones() // durable before the answer leaves
	}
	ans := make([]byte, 10)
	ans[0] = 'A'
	binary.BigEndian.PutUint64(ans[1:], qid)
	if dead {
		ans[9] = 1
	}
	s.net.Send(uint64(n.id), from, ans)
}

func (s *fdSim) ask(q uint64, k simKey) {
	s.nextQID++
	qid := s.nextQID
	s.pending[qid] = &query{key: k, dead: map[uint64]bool{}}
	b := make([]byte, 25)
	b[0] = 'Q'
	binary.BigEndian.PutUint64(b[1:], qid)
	binary.BigEndian.PutUint64(b[9:], uint64(k.node))
	binary.BigEndian.PutUint64(b[17:], uint64(k.inc))
	for _, o := range s.cfg.Observers {
		s.net.Send(q, uint64(o), b)
	}
	// A query that gets no majority of "dead" within its timeout says alive.
	s.qprocs[q].Go(300*time.Millisecond, func() {
		if pq := s.pending[qid]; pq != nil && !pq.done {
			pq.done = true
			s.chk.verdict(s.w.Now(), pq.key, false)
		}
	})
}

func (s *fdSim) answer(from uint64, b []byte) {
	if len(b) != 10 || b[0] != 'A' {
		return
	}
	q := s.pending[binary.BigEndian.Uint64(b[1:])]
	if q == nil || q.done {
		return
	}
	if b[9] == 1 {
		q.dead[from] = true
	}
	if Verdict(len(q.dead), len(s.cfg.Observers)) {
		q.done = true
		s.chk.verdict(s.w.Now(), q.key, true)
		// Direct check as well: the node itself must not believe it is alive.
		if n := s.nodes[q.key.node]; n.proc.Up() && n.subj.Incarnation() == q.key.inc && n.subj.Alive(n.clock.Now()) {
			s.chk.fails = append(s.chk.fails, fmt.Sprintf("node %d inc %d reported dead at %v while alive", q.key.node, q.key.inc, s.w.Now()))
		}
	}
}

// queryLoop asks about random nodes, mostly their newest incarnation,
// sometimes an older one.
func (s *fdSim) queryLoop(q uint64) {
	id := NodeID(1 + s.w.Rand.Intn(simNodes))
	inc := s.nodes[id].diskInc
	if inc > 1 && s.w.Rand.Intn(4) == 0 {
		inc--
	}
	s.ask(q, simKey{id, inc})
	s.qprocs[q].Go(s.w.Between(20*time.Millisecond, 120*time.Millisecond), func() { s.queryLoop(q) })
}

func (s *fdSim) crash(n *simNode) {
	if !n.proc.Up() {
		return
	}
	s.chk.logf(s.w.Now(), "CRASH node %d inc %d", n.id, n.subj.Incarnation())
	n.proc.Crash()
}

func (s *fdSim) restart(n *simNode) {
	if n.proc.Up() {
		return
	}
	n.proc.Restart()
	s.start(n)
}

func runFDSim(t *testing.T, seed int64, actualDrift float64) *fdSim {
	s := newFDSim(t, seed, actualDrift)
	w := s.w
	const safety = 30 * time.Second
	// Fault schedule for the safety phase.
	s.net.DropRate = 0.3 * w.Rand.Float64()
	s.net.DupRate = 0.05 * w.Rand.Float64()
	s.net.MaxDelay = w.Between(time.Millisecond, 30*time.Millisecond)
	for at := time.Duration(0); at < safety; at += w.Between(200*time.Millisecond, 1500*time.Millisecond) {
		at := at
		w.At(at, func() {
			ids := []NodeID{}
			for i := 1; i <= simNodes; i++ {
				ids = append(ids, NodeID(i))
			}
			n := s.nodes[ids[w.Rand.Intn(len(ids))]]
			switch r := w.Rand.Intn(10); {
			case r < 2:
				s.crash(n)
				d := w.Between(100*time.Millisecond, 5*time.Second)
				w.After(d, func() {
					if w.Now() < safety { // the liveness phase decides restarts itself
						s.restart(n)
					}
				})
			case r < 4:
				d := w.Between(100*time.Millisecond, 3*time.Second) // often > GracePeriod
				s.chk.logf(w.Now(), "PAUSE node %d for %v", n.id, d)
				n.proc.Pause(d)
			case r < 6:
				var a, b []uint64
				for i := 1; i <= simNodes; i++ {
					if w.Rand.Intn(2) == 0 {
						a = append(a, uint64(i))
					} else {
						b = append(b, uint64(i))
					}
				}
				s.chk.logf(w.Now(), "PARTITION %v | %v", a, b)
				s.net.Partition(a, b)
			case r < 8:
				s.chk.logf(w.Now(), "HEAL")
				s.net.Heal()
			default:
				s.net.DropRate = 0.3 * w.Rand.Float64()
				s.chk.logf(w.Now(), "drop rate %.2f", s.net.DropRate)
			}
		})
	}
	w.RunUntil(safety)

	// Liveness phase: faults stop. Some nodes stay crashed (at most one
	// observer, so that a majority of observers lives).
	s.net.Heal()
	s.net.DropRate, s.net.DupRate = 0, 0
	permDead := map[NodeID]bool{}
	deadObservers := 0
	for id := NodeID(1); id <= simNodes; id++ {
		n := s.nodes[id]
		if w.Rand.Intn(3) == 0 && (!n.observer || deadObservers == 0) {
			if n.observer {
				deadObservers++
			}
			permDead[id] = true
			s.crash(n)
		} else {
			s.restart(n)
		}
	}
	w.RunUntil(safety + 4*s.cfg.GracePeriod)

	// (a): every crashed incarnation is reported dead; every live node's
	// current incarnation is reported alive. A node may still move to a new
	// incarnation here (an observer that tombstoned it during the faults
	// refuses it, and with one observer down it loses its majority), so the
	// check is repeated until no incarnation changed while it ran.
	for attempt := 0; ; attempt++ {
		incs := map[NodeID]Incarnation{}
		for id := NodeID(1); id <= simNodes; id++ {
			incs[id] = s.nodes[id].diskInc
			for inc := Incarnation(1); inc <= incs[id]; inc++ {
				s.ask(querierA, simKey{id, inc})
			}
		}
		w.RunUntil(w.Now() + 400*time.Millisecond)
		stable := true
		for id := NodeID(1); id <= simNodes; id++ {
			stable = stable && s.nodes[id].diskInc == incs[id]
		}
		if !stable && attempt < 5 {
			w.RunUntil(w.Now() + 2*s.cfg.GracePeriod)
			continue
		}
		for id := NodeID(1); id <= simNodes; id++ {
			for inc := Incarnation(1); inc <= incs[id]; inc++ {
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

// judge is the final pass of the oracle over the whole log: for every dead
// verdict (X, i, T), X's incarnation i performed no act at or after T.
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

func TestFailureDetectorSimulation(t *testing.T) {
	seeds := sim.Seeds(t, 200)
	deadVerdicts, fences := 0, 0
	for _, seed := range seeds {
		s := runFDSim(t, seed, DefaultMaxDrift)
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
		for _, l := range s.chk.trace {
			if strings.Contains(l, "fences itself") {
				fences++
			}
		}
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
		if fails := runFDSim(t, seed, 0.3).chk.judge(); len(fails) > 0 {
			t.Logf("seed %d: checker caught: %s", seed, fails[0])
			return
		}
	}
	t.Fatal("30 % clock drift against a 1 % bound produced no violation in 50 seeds")
}
