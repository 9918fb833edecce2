package lock_test

import (
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/fd"
	"github.com/grovestore/grove/internal/fd/fdsim"
	"github.com/grovestore/grove/internal/lock"
	"github.com/grovestore/grove/internal/sim"
	"github.com/grovestore/grove/internal/sim/simmeta"
)

// The lock-service simulation: 5 nodes on the real failure detector
// (observers and lock-service candidates 1–3), two clerks per node incarnation
// (one of kind "wal" with a recovery function, one without), each with two
// holders acquiring and releasing random locks in random modes. Faults:
// crashes and restarts, master kills, pauses longer than GracePeriod,
// partitions, datagram loss, session resets. Then faults stop and every
// pending request must be granted within a bound.
//
// The oracle sees every lease change at every clerk, every holder's acts,
// every recovery, and the ground truth of which node incarnations are alive;
// it judges from those alone.

const (
	lsNodes       = 5
	lsCandidates  = 3 // nodes that run a master or standby
	lsLocks       = 4
	livenessBound = 15 * time.Second
)

var lockNames = func() []string {
	var n []string
	for i := 0; i < lsLocks; i++ {
		n = append(n, fmt.Sprintf("lock-%d", i))
	}
	return n
}()

// config is the config service as the lock service uses it: the master
// record, the clerk list and the recovery records. Decrees are conditional
// on the version read, as in internal/meta; the simulation applies them
// atomically.
type config struct {
	version    uint64
	master     masterRecord
	clerks     map[lock.ClerkID]lock.ClerkInfo
	records    map[lock.ClerkID]lock.RecoveryRecord
	registered []func(lock.ClerkInfo) // watches of running masters
}

type masterRecord struct {
	node  fd.NodeID
	inc   fd.Incarnation
	epoch lock.Epoch
}

// oracle is the independent checker.
type oracle struct {
	s          *lockSim
	leases     map[string]map[lock.ClerkID]lock.Mode // per lock, per clerk: cached lease
	holding    map[string]map[*holder]lock.Mode
	deadHeld   map[lock.ClerkID]map[string]lock.Mode // wal clerks: leases at death
	recovered  map[lock.ClerkID]bool
	fails      []string
	tracing    bool // on when replaying one seed (GROVE_SEED): costly
	trace      []string
	grants     int
	recoveries int
	takeovers  int
}

func (o *oracle) logf(format string, args ...any) {
	if !o.tracing {
		return
	}
	o.trace = append(o.trace, fmt.Sprintf("%9.3fs ", o.s.w.Now().Seconds())+fmt.Sprintf(format, args...))
}

func (o *oracle) fail(format string, args ...any) {
	msg := fmt.Sprintf("%.3fs: ", o.s.w.Now().Seconds()) + fmt.Sprintf(format, args...)
	o.fails = append(o.fails, msg)
	if !o.tracing {
		return
	}
	o.logf("VIOLATION %s", msg)
}

func (o *oracle) alive(c lock.ClerkID) bool {
	return o.s.fd.Alive(fd.NodeID(c.Node), fd.Incarnation(c.Inc))
}

// lease records a clerk's cached lease changing to mode.
func (o *oracle) lease(c lock.ClerkID, name string, mode lock.Mode) {
	m := o.leases[name]
	if m == nil {
		m = map[lock.ClerkID]lock.Mode{}
		o.leases[name] = m
	}
	old := m[c]
	if mode == lock.None {
		delete(m, c)
	} else {
		m[c] = mode
	}
	o.logf("lease %s %s %s → %s", c, name, old, mode)
	if mode <= old {
		return
	}
	o.grants++
	if !o.alive(c) {
		return // a fenced clerk can never use it: no conflict
	}
	for other, om := range m {
		if other != c && !lock.Compatible(om, mode) && o.alive(other) {
			o.fail("clerk %s got %s %s while live clerk %s caches %s", c, name, mode, other, om)
		}
	}
	for dead, held := range o.deadHeld {
		if hm, ok := held[name]; ok && !lock.Compatible(hm, mode) && !o.recovered[dead] {
			o.fail("clerk %s got %s %s before recovery of dead clerk %s, which held it %s", c, name, mode, dead, hm)
		}
	}
}

// died records a node incarnation's end (crash or fence): its clerks' leases
// can no longer be used; a wal clerk's leases await recovery.
func (o *oracle) died(node fd.NodeID, inc fd.Incarnation) {
	for name, m := range o.leases {
		for c, mode := range m {
			if c.Node != uint64(node) || c.Inc != uint64(inc) {
				continue
			}
			if c.Seq == 1 { // the wal clerk
				if o.deadHeld[c] == nil {
					o.deadHeld[c] = map[string]lock.Mode{}
				}
				o.deadHeld[c][name] = mode
			}
			delete(m, c)
		}
	}
	for name, hs := range o.holding {
		for h := range hs {
			if h.clerk.id.Node == uint64(node) && h.clerk.id.Inc == uint64(inc) {
				delete(hs, h)
			}
		}
		_ = name
	}
}

// act: a holder uses its lock. It must be alive, hold a covering lease, and
// no other live holder may hold a conflicting mode.
func (o *oracle) act(h *holder, name string, mode lock.Mode) {
	c := h.clerk.id
	if !o.alive(c) {
		o.fail("holder of %s at clerk %s acts after its node fenced", name, c)
	}
	if o.leases[name][c] < mode {
		o.fail("holder of %s %s at clerk %s acts without a covering lease (%s)", name, mode, c, o.leases[name][c])
	}
	for other, om := range o.holding[name] {
		if other != h && !lock.Compatible(om, mode) && o.alive(other.clerk.id) {
			o.fail("holders at %s (%s) and %s (%s) of %s at once", c, mode, other.clerk.id, om, name)
		}
	}
}

type lockSim struct {
	t     *testing.T
	w     *sim.World
	fd    *fdsim.Cluster
	cfg   *config
	nodes map[fd.NodeID]*lnode
	o     *oracle
	waits map[*lock.Waiter]*pendingWait
	// lyingFD makes masters believe every suspect dead without asking the
	// failure detector: a broken system the oracle must catch.
	lyingFD bool
}

type pendingWait struct {
	w     *lock.Waiter
	since time.Duration
	done  bool
	c     *clerkRT
	cont  func() // the holder's continuation once granted
}

// lnode is the lock-service runtime of one node incarnation.
type lnode struct {
	n      *fdsim.Node
	inc    fd.Incarnation
	clerks []*clerkRT
	master *masterRT
}

type clerkRT struct {
	s    *lockSim
	ln   *lnode
	id   lock.ClerkID
	core *lock.Clerk
	sess *sim.End
	dead bool
}

type masterRT struct {
	core     *lock.Master
	sessions map[lock.ClerkID]*sim.End
	stopped  bool
}

type holder struct {
	clerk *clerkRT
}

func newLockSim(t *testing.T, seed int64) *lockSim {
	w := sim.NewWorld(seed)
	cfg := fd.Config{Interval: fd.DefaultInterval, GracePeriod: fd.DefaultGracePeriod, MaxDrift: fd.DefaultMaxDrift, Observers: []fd.NodeID{1, 2, 3}}
	s := &lockSim{t: t, w: w, fd: fdsim.New(w, w.NewNetwork(), simmeta.New(w), cfg, lsNodes, fd.DefaultMaxDrift),
		cfg:   &config{clerks: map[lock.ClerkID]lock.ClerkInfo{}, records: map[lock.ClerkID]lock.RecoveryRecord{}},
		nodes: map[fd.NodeID]*lnode{}, waits: map[*lock.Waiter]*pendingWait{}}
	s.o = &oracle{s: s, leases: map[string]map[lock.ClerkID]lock.Mode{}, holding: map[string]map[*holder]lock.Mode{},
		deadHeld: map[lock.ClerkID]map[string]lock.Mode{}, recovered: map[lock.ClerkID]bool{}, tracing: os.Getenv("GROVE_SEED") != ""}
	s.fd.OnStart = s.onStart
	s.fd.OnFence = func(n *fdsim.Node, inc fd.Incarnation) { s.stopNode(n.ID, inc, "fences itself") }
	for id := fd.NodeID(1); id <= lsNodes; id++ {
		n := s.fd.Nodes[id]
		n.Other = func(from uint64, msg any) {}
		s.fd.Start(n)
	}
	return s
}

// onStart: a new node incarnation gets fresh clerks, registered in the
// config service before use, and (on candidates) a standby loop.
func (s *lockSim) onStart(n *fdsim.Node) {
	ln := &lnode{n: n, inc: n.Inc}
	s.nodes[n.ID] = ln
	s.o.logf("node %d starts incarnation %d", n.ID, ln.inc)
	for seq, kind := range []string{"wal", ""} {
		c := &clerkRT{s: s, ln: ln, id: lock.ClerkID{Node: uint64(n.ID), Inc: uint64(ln.inc), Seq: uint32(seq + 1)}}
		c.core = lock.NewClerk(c.id, kind)
		ln.clerks = append(ln.clerks, c)
		s.register(c)
		n.Proc.Go(s.w.Between(0, 50*time.Millisecond), func() { s.connectLoop(c) })
		for h := 0; h < 2; h++ {
			hd := &holder{clerk: c}
			n.Proc.Go(s.w.Between(0, 100*time.Millisecond), func() { s.holderLoop(hd) })
		}
	}
	if n.ID <= lsCandidates {
		n.Proc.Go(s.w.Between(0, 100*time.Millisecond), func() { s.standbyLoop(ln) })
	}
}

func (s *lockSim) register(c *clerkRT) {
	info := lock.ClerkInfo{ID: c.id, Kind: c.core.Kind()}
	s.cfg.clerks[c.id] = info
	s.cfg.version++
	for _, fn := range s.cfg.registered {
		fn(info)
	}
}

// current reports whether ln is its node's live incarnation.
func (s *lockSim) current(ln *lnode) bool {
	return ln.n.Proc.Up() && s.nodes[ln.n.ID] == ln && ln.n.Inc == ln.inc
}

// stopNode ends a node incarnation's lock roles (crash or self-fence).
func (s *lockSim) stopNode(id fd.NodeID, inc fd.Incarnation, why string) {
	ln := s.nodes[id]
	if ln == nil || ln.inc != inc {
		return
	}
	s.o.logf("node %d inc %d %s", id, inc, why)
	s.o.died(id, inc)
	for _, c := range ln.clerks {
		c.dead = true
		for _, w := range c.core.Fence() {
			_ = w
		}
		if c.sess != nil {
			c.sess.Close()
		}
	}
	if ln.master != nil {
		s.stopMaster(ln, "its node "+why)
	}
}

func (s *lockSim) stopMaster(ln *lnode, why string) {
	m := ln.master
	if m == nil || m.stopped {
		return
	}
	m.stopped = true
	ln.master = nil
	for _, sess := range m.sessions {
		sess.Close()
	}
	s.o.logf("master on node %d epoch %d stops: %s", ln.n.ID, m.core.Epoch(), why)
}

// alive is the node's own belief: every lease-protected action checks it.
func (s *lockSim) alive(ln *lnode) bool {
	return s.current(ln) && ln.n.Eng.AliveAs(ln.n.Clock.Now(), ln.inc)
}

// standbyLoop: if the master record names a dead incarnation (or nobody),
// take over by a conditional decree.
func (s *lockSim) standbyLoop(ln *lnode) {
	if !s.current(ln) {
		return
	}
	next := func() {
		ln.n.Proc.Go(s.w.Between(150*time.Millisecond, 250*time.Millisecond), func() { s.standbyLoop(ln) })
	}
	if ln.master != nil || !s.alive(ln) {
		next()
		return
	}
	rec, version := s.cfg.master, s.cfg.version
	if rec.node == 0 {
		s.takeover(ln, version)
		next()
		return
	}
	if rec.node == ln.n.ID && rec.inc == ln.inc {
		next()
		return
	}
	s.fd.Query(ln.n.Proc, rec.node, rec.inc, func(dead bool) {
		if dead && s.cfg.version == version && s.alive(ln) && ln.master == nil {
			s.takeover(ln, version)
		}
	})
	next()
}

func (s *lockSim) takeover(ln *lnode, version uint64) {
	if s.cfg.version != version {
		return // stale version: a racing decree won
	}
	epoch := s.cfg.master.epoch + 1
	s.cfg.master = masterRecord{node: ln.n.ID, inc: ln.inc, epoch: epoch}
	s.cfg.version++
	var clerks []lock.ClerkInfo
	for _, c := range s.cfg.clerks {
		clerks = append(clerks, c)
	}
	sort.Slice(clerks, func(i, j int) bool { return clerks[i].ID.Less(clerks[j].ID) })
	var recs []lock.RecoveryRecord
	for _, r := range s.cfg.records {
		recs = append(recs, r)
	}
	sort.Slice(recs, func(i, j int) bool { return recs[i].Dead.Less(recs[j].Dead) })
	m := &masterRT{core: lock.NewMaster(epoch, clerks, recs), sessions: map[lock.ClerkID]*sim.End{}}
	ln.master = m
	s.o.takeovers++
	s.o.logf("node %d inc %d becomes master, epoch %d (%d clerks, %d recovery records)", ln.n.ID, ln.inc, epoch, len(clerks), len(recs))
	s.cfg.registered = append(s.cfg.registered, func(ci lock.ClerkInfo) {
		ln.n.Proc.Go(s.w.Between(time.Millisecond, 20*time.Millisecond), func() {
			if ln.master == m && s.masterOK(ln) {
				s.apply(ln, m, m.core.ClerkRegistered(ci))
			}
		})
	})
	s.masterTick(ln, m)
}

// masterOK: the master acts only while its node believes itself alive.
func (s *lockSim) masterOK(ln *lnode) bool {
	if ln.master == nil {
		return false
	}
	if !s.alive(ln) {
		s.stopMaster(ln, "node not alive")
		return false
	}
	return true
}

func (s *lockSim) masterTick(ln *lnode, m *masterRT) {
	if ln.master != m || !s.masterOK(ln) {
		return
	}
	for _, c := range m.core.Tick() {
		c := c
		if s.lyingFD {
			s.apply(ln, m, m.core.Verdict(c, true))
			continue
		}
		s.fd.Query(ln.n.Proc, fd.NodeID(c.Node), fd.Incarnation(c.Inc), func(dead bool) {
			if ln.master == m && s.masterOK(ln) {
				s.apply(ln, m, m.core.Verdict(c, dead))
			}
		})
	}
	ln.n.Proc.Go(250*time.Millisecond, func() { s.masterTick(ln, m) })
}

// apply carries out a master's outputs.
func (s *lockSim) apply(ln *lnode, m *masterRT, out []any) {
	for _, o := range out {
		switch x := o.(type) {
		case lock.Send:
			if sess := m.sessions[x.To]; sess != nil {
				sess.Send(x.Msg)
			}
		case lock.Drop:
			if sess := m.sessions[x.Clerk]; sess != nil {
				delete(m.sessions, x.Clerk)
				sess.Close()
			}
		case lock.Persist:
			s.cfg.records[x.Record.Dead] = x.Record
			s.cfg.version++
			s.o.logf("recovery record for %s (all=%v names=%v)", x.Record.Dead, x.Record.All, x.Record.Names)
		case lock.Forget:
			delete(s.cfg.records, x.Clerk)
			delete(s.cfg.clerks, x.Clerk)
			s.cfg.version++
		}
	}
}

// accept is the master's end of a new session from a clerk's node.
func (s *lockSim) accept(ln *lnode, sess *sim.End) {
	var clerk lock.ClerkID
	sess.Handle(func(msg any) {
		m := ln.master
		if m == nil || !s.masterOK(ln) {
			sess.Close()
			return
		}
		if h, ok := msg.(lock.Hello); ok {
			clerk = h.Clerk
			if old := m.sessions[clerk]; old != nil && old != sess {
				old.Close()
			}
			m.sessions[clerk] = sess
			s.apply(ln, m, m.core.Hello(h))
			return
		}
		if m.sessions[clerk] == sess {
			s.apply(ln, m, m.core.Handle(clerk, msg))
		}
	}, func() {
		if m := ln.master; m != nil && m.sessions[clerk] == sess {
			delete(m.sessions, clerk)
			if s.masterOK(ln) {
				s.apply(ln, m, m.core.Disconnected(clerk))
			}
		}
	})
}

// connectLoop keeps the clerk connected to the master the config names.
func (s *lockSim) connectLoop(c *clerkRT) {
	if c.dead || !s.current(c.ln) {
		return
	}
	defer c.ln.n.Proc.Go(s.w.Between(80*time.Millisecond, 120*time.Millisecond), func() { s.connectLoop(c) })
	rec := s.cfg.master
	if c.sess != nil && !c.sess.Closed() {
		if c.core.Epoch() == rec.epoch {
			return
		}
		c.sess.Close() // a newer master: leave the old one
	}
	if rec.node == 0 || !s.alive(c.ln) {
		return
	}
	mln := s.nodes[rec.node]
	if mln == nil || !mln.n.Proc.Up() {
		return
	}
	sess, remote := s.fd.Net.OpenSession(uint64(c.ln.n.ID), uint64(rec.node))
	c.sess = sess
	sess.Handle(func(msg any) {
		if c.sess != sess || c.dead || !s.alive(c.ln) {
			return // a clerk applies nothing once its node is not alive
		}
		if r, ok := msg.(lock.Reject); ok {
			s.o.logf("clerk %s rejected: %s", c.id, r.Reason)
			sess.Close()
			return
		}
		s.clerkOut(c, c.core.Handle(msg))
	}, func() {
		if c.sess == sess {
			c.sess = nil
			c.core.Disconnected()
		}
	})
	s.accept(mln, remote) // the listener's handlers are in place before any message arrives
	sess.Send(c.core.Connect(rec.epoch))
}

// clerkOut carries out a clerk's outputs and tells the oracle about lease
// changes.
func (s *lockSim) clerkOut(c *clerkRT, out []any) {
	for _, name := range lockNames {
		if c.s.o.leases[name][c.id] != c.core.Held(name) {
			s.o.lease(c.id, name, c.core.Held(name))
		}
	}
	for _, o := range out {
		switch x := o.(type) {
		case lock.ToMaster:
			if c.sess != nil {
				c.sess.Send(x.Msg)
			}
		case lock.RunRecovery:
			s.runRecovery(c, x.Req)
		case lock.Woken:
			for _, w := range x.Waiters {
				if p := s.waits[w]; p != nil {
					p.done = true
					delete(s.waits, w)
					c.ln.n.Proc.Go(0, p.cont)
				}
			}
		}
	}
}

// runRecovery: the "wal" kind's recovery function. It takes a while, fails
// now and then, and is idempotent.
func (s *lockSim) runRecovery(c *clerkRT, r lock.Recover) {
	s.o.logf("clerk %s recovers %s (all=%v)", c.id, r.Dead, r.All)
	c.ln.n.Proc.Go(s.w.Between(10*time.Millisecond, 150*time.Millisecond), func() {
		if c.dead || !s.alive(c.ln) {
			return
		}
		ok := s.w.Rand.Intn(5) != 0
		if ok {
			s.o.recovered[r.Dead] = true
			s.o.recoveries++
		}
		s.clerkOut(c, c.core.RecoveryDone(r.Dead, ok))
	})
}

// holderLoop: acquire a random lock in a random mode, use it for a while
// (acting every few ms, each act checked by the oracle), release, repeat.
func (s *lockSim) holderLoop(h *holder) {
	c := h.clerk
	if c.dead || !s.current(c.ln) {
		return
	}
	name := lockNames[s.w.Rand.Intn(lsLocks)]
	mode := lock.Shared
	if s.w.Rand.Intn(2) == 0 {
		mode = lock.Exclusive
	}
	w, out := c.core.Acquire(name, mode)
	pw := &pendingWait{w: w, since: s.w.Now(), c: c, done: w.Granted}
	pw.cont = func() {
		if c.dead || w.Failed || !s.current(c.ln) {
			return
		}
		s.use(h, w, s.w.Rand.Intn(8))
	}
	if !w.Granted {
		s.waits[w] = pw
	}
	s.clerkOut(c, out)
	if w.Granted {
		pw.cont()
	}
}

func (s *lockSim) use(h *holder, w *lock.Waiter, acts int) {
	c := h.clerk
	if c.dead || !s.current(c.ln) {
		return
	}
	// The fence check every lease user makes before acting.
	if !s.alive(c.ln) {
		return
	}
	if acts > 0 {
		hs := s.o.holding[w.Name]
		if hs == nil {
			hs = map[*holder]lock.Mode{}
			s.o.holding[w.Name] = hs
		}
		hs[h] = w.Mode
		s.o.act(h, w.Name, w.Mode)
		c.ln.n.Proc.Go(s.w.Between(time.Millisecond, 10*time.Millisecond), func() { s.use(h, w, acts-1) })
		return
	}
	delete(s.o.holding[w.Name], h)
	out, err := c.core.Release(w)
	if err != nil {
		s.o.fail("release at %s: %v", c.id, err)
	}
	s.clerkOut(c, out)
	c.ln.n.Proc.Go(s.w.Between(0, 30*time.Millisecond), func() { s.holderLoop(h) })
}

func (s *lockSim) crash(n *fdsim.Node) {
	if !n.Proc.Up() {
		return
	}
	inc := n.Inc
	s.fd.Crash(n)
	s.stopNode(n.ID, inc, "crashes")
}

func runLockSim(t *testing.T, seed int64, lying bool) *lockSim {
	s := newLockSim(t, seed)
	s.lyingFD = lying
	w, net := s.w, s.fd.Net
	const safety = 20 * time.Second
	net.DropRate = 0.2 * w.Rand.Float64()
	net.ResetRate = 0.002 * w.Rand.Float64()
	net.MaxDelay = w.Between(time.Millisecond, 10*time.Millisecond)
	for at := 2 * time.Second; at < safety; at += w.Between(300*time.Millisecond, 2*time.Second) {
		w.At(at, func() {
			n := s.fd.Nodes[fd.NodeID(1+w.Rand.Intn(lsNodes))]
			switch r := w.Rand.Intn(12); {
			case r < 2:
				s.o.logf("CRASH node %d", n.ID)
				s.crash(n)
				w.After(w.Between(100*time.Millisecond, 4*time.Second), func() {
					if w.Now() < safety {
						s.fd.Restart(n)
					}
				})
			case r < 4: // kill the master
				if rec := s.cfg.master; rec.node != 0 {
					mn := s.fd.Nodes[rec.node]
					s.o.logf("CRASH master node %d", mn.ID)
					s.crash(mn)
					w.After(w.Between(500*time.Millisecond, 4*time.Second), func() {
						if w.Now() < safety {
							s.fd.Restart(mn)
						}
					})
				}
			case r < 6:
				d := w.Between(100*time.Millisecond, 2500*time.Millisecond)
				s.o.logf("PAUSE node %d for %v", n.ID, d)
				n.Proc.Pause(d)
			case r < 8:
				a, b := w.RandomSplit(lsNodes)
				s.o.logf("PARTITION %v | %v", a, b)
				net.Partition(a, b)
				net.BreakBlockedSessions()
			case r < 10:
				s.o.logf("HEAL")
				net.Heal()
			default:
				net.DropRate = 0.3 * w.Rand.Float64()
			}
		})
	}
	w.RunUntil(safety)
	// Liveness: faults stop, every node comes back.
	net.Heal()
	net.DropRate, net.ResetRate = 0, 0
	for id := fd.NodeID(1); id <= lsNodes; id++ {
		s.fd.Restart(s.fd.Nodes[id])
	}
	end := safety + livenessBound + 5*time.Second
	w.RunUntil(end)
	for _, p := range s.waits {
		if !p.done && !p.w.Failed && !p.c.dead && s.current(p.c.ln) && p.since < end-livenessBound {
			s.o.fail("liveness: %s %s at clerk %s waiting since %v, not granted by %v", p.w.Name, p.w.Mode, p.c.id, p.since, end)
		}
	}
	return s
}

func TestLockServiceSimulation(t *testing.T) {
	seeds := sim.Seeds(t, 500)
	grants, recoveries, takeovers := 0, 0, 0
	for _, seed := range seeds {
		s := runLockSim(t, seed, false)
		if len(s.o.fails) > 0 {
			first := len(s.o.trace)
			for i, l := range s.o.trace {
				if strings.Contains(l, "VIOLATION") {
					first = i + 1
					break
				}
			}
			t.Fatalf("seed %d: %d violations, first: %s\n%s (the replay prints a trace)\ntrace up to the first violation:\n%s", seed, len(s.o.fails), s.o.fails[0],
				sim.ReplayHint("TestLockServiceSimulation", seed), strings.Join(s.o.trace[max(0, first-100):first], "\n"))
		}
		grants += s.o.grants
		recoveries += s.o.recoveries
		takeovers += s.o.takeovers
	}
	if len(seeds) >= 20 && (recoveries == 0 || takeovers <= len(seeds)) {
		t.Fatalf("faults did not bite: %d recoveries, %d takeovers in %d seeds", recoveries, takeovers, len(seeds))
	}
	t.Logf("%d seeds (first %d): %d lease grants, %d recoveries, %d master takeovers, no violations", len(seeds), seeds[0], grants, recoveries, takeovers)
}

// TestLockOracleHasTeeth: with masters that take every suspect for dead (a
// failure detector that lies), the oracle must catch conflicting leases.
func TestLockOracleHasTeeth(t *testing.T) {
	for seed := int64(1); seed <= 20; seed++ {
		if s := runLockSim(t, seed, true); len(s.o.fails) > 0 {
			t.Logf("seed %d: oracle caught: %s", seed, s.o.fails[0])
			return
		}
	}
	t.Fatal("a lying failure detector produced no violation in 20 seeds")
}
