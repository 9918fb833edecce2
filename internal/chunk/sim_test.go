package chunk

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/lock"
	"github.com/grovestore/grove/internal/sim"
)

// The chunk manager simulation: one pair's two managers (the real
// Manager, driven as the node runtime drives it) on nodes 1 and 2, clients
// on nodes 10.., over models of the layers below that keep exactly their
// contracts and fail in every way the contracts allow:
//
//   - the RLDevs: linearizable block stores (an operation takes effect at
//     one instant between its call and its answer); writes carry fencing
//     tokens, refused once a newer token of the lock was admitted; an
//     operation fails before it takes effect, or after (a write that may
//     have landed), or lands up to seconds after its caller was told it
//     failed; a whole RLDev refuses everything for a while;
//   - the lock service: exclusive and shared leases cached by each node
//     incarnation's clerk, revoked when another clerk asks (down to what
//     it asks for, once the holder has released its hold), each grant with
//     a newer token, a dead incarnation's leases freed after its verdict;
//   - the failure detector: a crashed, paused or isolated incarnation
//     stops being alive GracePeriod after it last was, and is declared dead
//     a little later (never before it stopped); a paused or isolated node
//     that comes back dead restarts with a new incarnation;
//   - the config service: conditional puts of the pair's record that
//     commit after a delay, are lost, or commit after their caller gave up;
//     watches that deliver late.
//
// The oracle keeps what each client was told and checks: a handle is never
// returned twice; a new chunk reads as zeros; a read returns the content of
// the last acknowledged write (or of a write that may have landed since);
// a chunk whose free was acknowledged is never read or written again
// through either manager; an id never handed out reads as unallocated;
// every manager's map is free of overlaps; at the end, after the faults
// stop, both managers serve, their maps agree with each other and with a
// map read afresh from the map RLDev, and with the oracle (every chunk
// acknowledged and not freed is there, none acknowledged freed is).

const (
	simGrace    = time.Second
	simVerdict  = 400 * time.Millisecond // after the grace period, the verdict
	simData     = 4096                   // blocks of the data RLDev (16 MiB)
	simGrow     = 8192                   // blocks of a data RLDev added later (32 MiB: more free than the first, so allocations go there)
	simMap      = 600                    // blocks of the map RLDev (a log of 75 blocks: frequent checkpoints)
	simSafety   = 25 * time.Second       // faults until then
	simLiveness = 45 * time.Second       // the checks after
	simClients  = 4
	simResvLife = 3 * time.Second // a reservation without its commit is kept whole then
	mapID       = 100
	dataID      = 101
)

type csim struct {
	t      *testing.T
	w      *sim.World
	net    *sim.Network
	nodes  map[uint64]*cnode
	rl     *rldevModel
	locks  *lockModel
	cfg    *configModel
	o      *oracle
	trace  []string
	faults bool // faults still being injected
	grown  int  // data RLDevs an operator added
	// lateDup is the share of peer messages delivered a second time,
	// 0.2-1.5 s late (as the runtime's transport may); lateDups counts them.
	lateDup  float64
	lateDups int
	opts     simOpts
	stats    struct {
		allocs, frees, writes, reads, takeovers, checkpoints, crashes, maybes int
		resvs, commits, cancels, abandons, kept                               int
		ownedAllocs, disowns, retires, listings, listed, refused, orphans     int
	}
	// ckpt is the checkpoint crash point's progress: 0 waiting for a
	// checkpoint's write, 1 in the checkpoint, 2 after its switch, 3 done.
	ckpt     int
	ckptNode *cnode
}

type simOpts struct {
	unsafe unsafeRules
	// lateSuper: a checkpoint's superblock write after 5 s is answered
	// as failed and lands 600 ms later, after the manager has loaded the
	// map again (what the fence blocks are for).
	lateSuper bool
	// ckptCrash (1-4), with no other faults: the primary crashes at one
	// step of its first checkpoint after 2 s: 1 before the checkpoint's
	// write lands, 2 after it landed (before the superblock), 3 after the
	// superblock (the log's truncation) landed but before the manager
	// heard (its in-memory switch), 4 after the switch, at its next map
	// write. It restarts 1 s later.
	ckptCrash  int
	noFaults   bool
	noBatching bool
}

// cnode is a node with a manager of the pair, one incarnation at a time.
type cnode struct {
	id               uint64
	p                *sim.Process
	inc              uint64
	mg               *Manager
	isolated, paused bool
	aliveTo          time.Duration // the incarnation is alive until then (the self-fence deadline)
	goneAt           time.Duration // when it stopped renewing (crash, pause, isolation); 0: renewing
	nextReq          ReqID
	pending          map[ReqID]func(Reply)
	holds            int             // local holds on the map lock (0 or 1)
	chunkMu          map[uint64]bool // chunks with a partial write in progress (read-modify-write)
}

func (s *csim) logf(format string, args ...any) {
	line := fmt.Sprintf("%8.3fs ", s.w.Now().Seconds()) + fmt.Sprintf(format, args...)
	s.trace = append(s.trace, line)
	if len(s.trace) > 200000 {
		s.trace = s.trace[len(s.trace)-150000:]
	}
}

func (s *csim) env(n *cnode) Env {
	now := sim.Epoch.Add(s.w.Now())
	if n.goneAt == 0 {
		n.aliveTo = s.w.Now() + simGrace
	}
	return Env{Now: now, Deadline: sim.Epoch.Add(n.aliveTo)}
}

// dead reports whether incarnation inc of node id has been declared dead.
func (s *csim) dead(id, inc uint64) bool {
	n := s.nodes[id]
	if n == nil {
		return false
	}
	if inc < n.inc {
		return true // a past incarnation (it restarted after being declared dead, or crashed)
	}
	return n.goneAt != 0 && s.w.Now() >= n.goneAt+simGrace+simVerdict
}

// start begins a new incarnation of node n (a restart after a crash or a fence).
func (s *csim) start(n *cnode) {
	n.inc++
	n.goneAt, n.paused, n.holds = 0, false, 0
	n.pending = map[ReqID]func(Reply){}
	n.chunkMu = map[uint64]bool{}
	n.p.Restart()
	n.mg = NewManager(Config{Node: n.id, Inc: n.inc, CM: 1, RetryEvery: 300 * time.Millisecond, PollEvery: 200 * time.Millisecond, ReserveStep: 16, MaxBatch: 20,
		Quarantine: 3 * time.Second, // the RLDev model lands a write at most 2 s after its answer
		ResvLife:   simResvLife,
		unsafe:     s.opts.unsafe})
	s.locks.newClerk(n)
	s.logf("node %d starts incarnation %d", n.id, n.inc)
	mg := n.mg
	p, ver := s.cfg.read()
	s.exec(n, mg, mg.SetPair(s.env(n), p, ver, true))
	s.tick(n, mg)
}

func (s *csim) tick(n *cnode, mg *Manager) {
	n.p.Go(100*time.Millisecond, func() {
		if n.mg != mg {
			return
		}
		s.checkFence(n)
		if n.mg != mg {
			return
		}
		s.exec(n, mg, mg.Tick(s.env(n)))
		s.checkMap(n)
		s.tick(n, mg)
	})
}

// checkFence restarts a node whose incarnation was declared dead while it
// was paused or isolated (it fenced itself: the node runtime restarts).
func (s *csim) checkFence(n *cnode) {
	if n.goneAt != 0 && !n.isolated && !n.paused && s.dead(n.id, n.inc) {
		s.logf("node %d incarnation %d finds itself dead: fences, restarts", n.id, n.inc)
		s.crash(n)
		s.w.After(s.w.Between(0, 200*time.Millisecond), func() {
			if n.mg == nil {
				s.start(n)
			}
		})
	}
}

// stopRenewing: the incarnation stops being acknowledged by the observers
// (crashed, paused, cut off): alive until GracePeriod after the last
// acknowledgement, dead a little later. Once stopped, never renewed
// unless it comes back before its deadline.
func (s *csim) stopRenewing(n *cnode) {
	if n.goneAt == 0 {
		n.goneAt = s.w.Now()
		n.aliveTo = n.goneAt + simGrace
	}
}

func (s *csim) crash(n *cnode) {
	s.stopRenewing(n)
	n.p.Crash()
	n.mg = nil
	for req, fn := range n.pending {
		delete(n.pending, req)
		_ = fn // the clients time out
	}
	s.stats.crashes++
}

func (s *csim) sortedNodes() []*cnode {
	return []*cnode{s.nodes[1], s.nodes[2]}
}

// exec carries out a manager's effects, as the node runtime does.
func (s *csim) exec(n *cnode, mg *Manager, out []any) {
	if n.mg != mg || mg == nil {
		return
	}
	for _, o := range out {
		switch x := o.(type) {
		case MapRead:
			s.rl.read(n, mg, mapID, x.Block, x.Blocks, func(data []byte, err error) {
				s.exec(n, mg, mg.Done(s.env(n), x.Op, data, err))
			})
		case MapWrite:
			if os.Getenv("GROVE_DEBUG") != "" && x.RLDev == 0 {
				if f, err := DecodeFrame(x.Data); err == nil {
					s.logf("node %d.%d: frame at %d gen %d: %d %v", n.id, n.inc, x.Block, f.Gen, f.First, f.Records)
				}
			}
			rl := uint64(mapID)
			if x.RLDev != 0 {
				rl = x.RLDev
			}
			s.rl.write(n, mg, rl, x.Block, x.Data, &lockFence{MapLock(1), x.Token}, func(err error) {
				s.exec(n, mg, mg.Done(s.env(n), x.Op, nil, err))
			})
		case ZeroWrite:
			s.rl.write(n, mg, x.RLDev, x.Block, make([]byte, x.Blocks*BlockSize), &lockFence{MapLock(1), x.Token}, func(err error) {
				s.exec(n, mg, mg.Done(s.env(n), x.Op, nil, err))
			})
		case Acquire:
			s.locks.acquire(n, mg, x.Op, x.Mode)
		case CancelAcquire:
			s.locks.cancel(n, mg, x.Op)
		case Release:
			s.locks.release(n, x.Drop)
		case Send:
			s.net.Send(n.id, x.To, peerMsg{inc: n.inc, msg: x.Msg})
			if s.faults && s.lateDup > 0 && s.w.Rand.Float64() < s.lateDup {
				// The node runtime's transport (unary calls queued
				// behind slow ones, a call given up at its client still
				// run at the server) may deliver a message twice, the
				// second time seconds late.
				s.lateDups++
				dst, from, msg := s.nodes[x.To], n.id, x.Msg
				s.w.After(s.w.Between(200*time.Millisecond, 1500*time.Millisecond), func() {
					if dst == nil {
						return
					}
					dst.p.Go(0, func() {
						if dst.mg != nil && !dst.isolated {
							s.logf("node %d.%d: a late duplicate from node %d: %T %+v", dst.id, dst.inc, from, msg, msg)
							s.exec(dst, dst.mg, dst.mg.Deliver(s.env(dst), from, msg))
						}
					})
				})
			}
		case Reply:
			if fn := n.pending[x.Req]; fn != nil {
				delete(n.pending, x.Req)
				fn(x)
			}
		case AskDead:
			n.p.Go(s.w.Between(time.Millisecond, 20*time.Millisecond), func() {
				if n.mg == mg {
					inc := x.Subject.Inc
					if inc == 0 { // the node's registered incarnation
						inc = s.nodes[x.Subject.Node].inc
					}
					s.exec(n, mg, mg.Verdict(s.env(n), x.Subject, inc, s.dead(x.Subject.Node, inc)))
				}
			})
		case Propose:
			s.cfg.propose(n, x.Version, x.Pair, func(ver uint64, err error) {
				if n.mg == mg {
					s.exec(n, mg, mg.Decided(s.env(n), x.Op, ver, err))
				}
			})
		case Refresh:
			n.p.Go(s.w.Between(time.Millisecond, 50*time.Millisecond), func() {
				if n.mg == mg {
					p, ver := s.cfg.read()
					s.exec(n, mg, mg.SetPair(s.env(n), p, ver, true))
				}
			})
		case Log:
			switch x.Msg {
			case "chunk manager: a reservation was not committed in time; all its chunks are kept":
				s.stats.kept++
			case "chunk manager serving as primary":
				s.stats.takeovers++
			case "chunk manager checkpoint":
				s.stats.checkpoints++
			}
			if x.Level >= 1 || os.Getenv("GROVE_DEBUG") != "" {
				s.logf("node %d.%d: %s %v", n.id, n.inc, x.Msg, x.Args)
			}
		default:
			s.t.Fatalf("unknown effect %T", o)
		}
	}
}

type peerMsg struct {
	inc uint64
	msg any
}

// checkMap asserts the invariants of a manager's map: no overlap, the
// free space and the chunks partition the RLDev.
func (s *csim) checkMap(n *cnode) {
	mg := n.mg
	if mg == nil || mg.m == nil {
		return
	}
	if err := mapConsistent(mg.m, mg.st == stPrimary && !mg.busy); err != nil {
		s.o.fail("node %d (%s): %v", n.id, mg.st, err)
	}
}

// mapConsistent checks that no block of a data RLDev is in two of: a
// chunk, a free run, a quarantined run, the fence block; and, if whole
// (a primary between changes), that every block is in one (no space
// leaked).
func mapConsistent(m *chunkMap, whole bool) error {
	type span struct {
		b, k uint64
		what string
	}
	for rl, sp := range m.spaces {
		// Every run of blocks the map accounts for, sorted: none may
		// overlap the next; with whole, together they cover the RLDev.
		var spans []span
		add := func(what string, b, k uint64) { spans = append(spans, span{b, k, what}) }
		for id, e := range m.chunks {
			if e.RLDev == rl {
				add(fmt.Sprintf("chunk %d", id), e.Block, blocksFor(e.Len))
			}
		}
		sp.byOff.Ascend(func(r run) bool {
			add("free run", r.start, r.n)
			return true
		})
		for _, q := range m.quarantined() {
			if q.RLDev == rl {
				add("quarantined", q.Block, q.Blocks)
			}
		}
		add("fence block", DataFence, 1)
		for id, rv := range m.resv {
			if rv.Run.RLDev != rl {
				continue
			}
			// The run's slots not yet allocated (all but in the middle of
			// the frame that closes it).
			for _, x := range rv.unallocatedRuns() {
				add(fmt.Sprintf("reservation %d", id), x.Block, x.Blocks)
			}
		}
		sort.Slice(spans, func(i, j int) bool { return spans[i].b < spans[j].b })
		next := uint64(0)
		for i, x := range spans {
			if x.b+x.k > sp.blocks {
				return fmt.Errorf("rldev %d block %d used past its end (%s)", rl, x.b+x.k-1, x.what)
			}
			if i > 0 && x.b < next {
				return fmt.Errorf("rldev %d block %d used twice (%s, %s)", rl, x.b, spans[i-1].what, x.what)
			}
			if whole && x.b > next {
				return fmt.Errorf("rldev %d block %d is in no chunk, free run or quarantine: leaked", rl, next)
			}
			next = x.b + x.k
		}
		if whole && next < sp.blocks {
			return fmt.Errorf("rldev %d block %d is in no chunk, free run or quarantine: leaked", rl, next)
		}
	}
	return nil
}

// ------------------------------------------------------------------ the RLDev model

type lockFence struct {
	name string
	tok  lock.Token
}

type rldevModel struct {
	s              *csim
	blocks         map[uint64][]byte
	admit          map[string]lock.Token
	downTo         map[uint64]time.Duration // refuses everything until then
	faulty         bool
	lateOdds       int // one write in lateOdds (when faulty) lands after its caller was told it failed
	lateDone       bool
	afterSuperRead func()
}

var errRLDevDown = errors.New("rldev model: unavailable")

func (r *rldevModel) failing(id uint64) bool {
	return r.s.w.Now() < r.downTo[id]
}

// read takes effect at a random instant before its answer.
func (r *rldevModel) read(n *cnode, mg *Manager, id, block, blocks uint64, done func([]byte, error)) {
	w := r.s.w
	at := w.Between(50*time.Microsecond, 2*time.Millisecond)
	w.After(at, func() {
		var data []byte
		var err error
		if r.failing(id) || r.faulty && w.Rand.Intn(200) == 0 {
			err = fmt.Errorf("%w: rldev %d", errRLDevDown, id)
		} else {
			data = bytes.Clone(r.blocks[id][block*BlockSize : (block+blocks)*BlockSize])
			if fn := r.afterSuperRead; fn != nil && id == mapID && block == blockSuper {
				r.afterSuperRead = nil
				fn()
			}
		}
		n.p.Go(w.Between(50*time.Microsecond, time.Millisecond), func() {
			if n.mg == mg {
				done(data, err)
			}
		})
	})
}

// write takes effect at one instant (or never); its answer may say it
// failed although it landed, and, rarely, it lands long after its caller
// was told it failed.
func (r *rldevModel) write(n *cnode, mg *Manager, id, block uint64, data []byte, f *lockFence, done func(error)) {
	w := r.s.w
	data = bytes.Clone(data)
	answer := func(err error) {
		n.p.Go(w.Between(50*time.Microsecond, time.Millisecond), func() {
			if n.mg == mg {
				done(err)
			}
		})
	}
	land := func() error {
		if f != nil {
			if cur := r.admit[f.name]; f.tok.Less(cur) {
				return fmt.Errorf("%w: %s saw %s, write carries %s", lock.ErrStaleToken, f.name, cur, f.tok)
			}
			r.admit[f.name] = f.tok
		}
		copy(r.blocks[id][block*BlockSize:], data)
		return nil
	}
	at := w.Between(100*time.Microsecond, 3*time.Millisecond)
	if r.s.opts.ckptCrash > 0 && id == mapID && r.ckptStep(n, block, land, answer, at) {
		return
	}
	if r.s.opts.lateSuper && !r.lateDone && id == mapID && (block == blockSuper || block == blockSuper+1) && w.Now() > 5*time.Second {
		r.lateDone = true
		w.After(at, func() { answer(fmt.Errorf("%w: rldev %d: given up (scripted)", errRLDevDown, id)) })
		// It lands just after the superblock is next read (the load of
		// the manager's takeover), before anything else is written.
		r.afterSuperRead = func() {
			err := land()
			r.s.logf("rldev %d: the scripted late superblock write landed at block %d: %v", id, block, err)
		}
		return
	}
	w.After(at, func() {
		switch {
		case r.failing(id):
			answer(fmt.Errorf("%w: rldev %d", errRLDevDown, id))
		case r.faulty && w.Rand.Intn(150) == 0:
			answer(fmt.Errorf("%w: rldev %d: failed before landing", errRLDevDown, id))
		case r.faulty && w.Rand.Intn(150) == 0:
			err := land()
			if err == nil {
				err = fmt.Errorf("%w: rldev %d: failed after landing", errRLDevDown, id)
			}
			answer(err)
		case r.faulty && w.Rand.Intn(r.lateOdds) == 0:
			// Told it failed; lands later (a request still queued in the
			// RLDev layer).
			answer(fmt.Errorf("%w: rldev %d: given up", errRLDevDown, id))
			w.After(w.Between(10*time.Millisecond, 2*time.Second), func() {
				if err := land(); err == nil {
					r.s.logf("rldev %d: a write given up landed late at block %d (%d blocks, fence %v)", id, block, len(data)/BlockSize, f)
				}
			})
		default:
			answer(land())
		}
	})
}

// ckptStep drives the checkpoint crash point (simOpts.ckptCrash): it
// reports whether it took the write.
func (r *rldevModel) ckptStep(n *cnode, block uint64, land func() error, answer func(error), at time.Duration) bool {
	s, w := r.s, r.s.w
	l, _ := NewLayout(simMap)
	slot := block >= l.slotStart(0)
	super := block == blockSuper || block == blockSuper+1
	crash := func(why string) {
		s.logf("CRASH POINT %d: node %d %s", s.opts.ckptCrash, n.id, why)
		s.crash(n)
		s.ckpt = 3
		w.After(time.Second, func() {
			if n.mg == nil {
				s.start(n)
			}
		})
	}
	switch {
	case s.ckpt == 0 && slot && w.Now() > 2*time.Second:
		s.ckpt, s.ckptNode = 1, n
		switch s.opts.ckptCrash {
		case 1:
			w.After(at, func() { crash("at its checkpoint's write, which never lands") })
			return true
		case 2:
			w.After(at, func() {
				if err := land(); err != nil {
					s.o.fail("the checkpoint's write was refused: %v", err)
				}
				crash("after its checkpoint's write landed, before the superblock")
			})
			return true
		}
	case s.ckpt == 1 && super && n == s.ckptNode:
		switch s.opts.ckptCrash {
		case 3:
			w.After(at, func() {
				if err := land(); err != nil {
					s.o.fail("the checkpoint's superblock was refused: %v", err)
				}
				crash("after its superblock landed, before its in-memory switch")
			})
			return true
		case 4:
			s.ckpt = 2
		}
	case s.ckpt == 2 && n == s.ckptNode && !super && !slot:
		w.After(at, func() { crash("after the checkpoint's switch, at its next log write") })
		return true
	}
	_ = answer
	return false
}

// ------------------------------------------------------------------ the lock service model

// lockModel is the lock service for the pair's map lock: leases cached by
// each node incarnation's clerk (keyed by node and incarnation), revoked
// down to what a waiter needs once their holder has released its hold,
// each grant with a newer token; a dead incarnation's lease is freed.
type lockModel struct {
	s       *csim
	seq     uint64
	leases  map[[2]uint64]*leaseState
	waiting []*lockWait
	pumping bool
}

type leaseState struct {
	node, inc uint64
	mode      lock.Mode
	tok       lock.Token
	reqRev    bool      // a revocation is pending (the holder has a hold)
	keep      lock.Mode // what the revocation leaves
}

type lockWait struct {
	n    *cnode
	mg   *Manager
	op   OpID
	mode lock.Mode
}

func (l *lockModel) newClerk(n *cnode) {}

func (l *lockModel) lease(n *cnode) *leaseState {
	k := [2]uint64{n.id, n.inc}
	ls := l.leases[k]
	if ls == nil {
		ls = &leaseState{node: n.id, inc: n.inc}
		l.leases[k] = ls
	}
	return ls
}

func (l *lockModel) acquire(n *cnode, mg *Manager, op OpID, mode lock.Mode) {
	ls := l.lease(n)
	allowed := ls.mode
	if ls.reqRev {
		allowed = min(allowed, ls.keep)
	}
	if allowed >= mode {
		// Cached: the clerk answers at once.
		n.holds++
		tok := ls.tok
		n.p.Go(l.s.w.Between(10*time.Microsecond, 200*time.Microsecond), func() {
			if n.mg == mg {
				l.s.exec(n, mg, mg.Granted(l.s.env(n), op, tok, nil))
			} else {
				n.holds--
			}
		})
		return
	}
	l.waiting = append(l.waiting, &lockWait{n: n, mg: mg, op: op, mode: mode})
	l.kick()
}

func (l *lockModel) kick() {
	if !l.pumping {
		l.pumping = true
		l.s.w.After(l.s.w.Between(100*time.Microsecond, 5*time.Millisecond), l.pump)
	}
}

func (l *lockModel) cancel(n *cnode, mg *Manager, op OpID) {
	for i, wt := range l.waiting {
		if wt.n == n && wt.op == op {
			l.waiting = append(l.waiting[:i], l.waiting[i+1:]...)
			return
		}
	}
}

func (l *lockModel) release(n *cnode, drop bool) {
	if n.holds > 0 {
		n.holds--
	}
	if drop {
		if ls := l.leases[[2]uint64{n.id, n.inc}]; ls != nil {
			ls.mode, ls.reqRev = 0, false
		}
	}
	l.kick()
}

// keys are the leases' keys in order (the simulation is deterministic).
func (l *lockModel) keys() [][2]uint64 {
	ks := make([][2]uint64, 0, len(l.leases))
	for k := range l.leases {
		ks = append(ks, k)
	}
	sort.Slice(ks, func(i, j int) bool { return ks[i][0] < ks[j][0] || ks[i][0] == ks[j][0] && ks[i][1] < ks[j][1] })
	return ks
}

func compatible(a, b lock.Mode) bool { return a == 0 || b == 0 || a == lock.Shared && b == lock.Shared }

// pump grants the first waiter once no other clerk's lease conflicts:
// conflicting leases are revoked (given up at once by a clerk whose node
// has no hold on them and answers; otherwise when it does); a dead
// incarnation's leases are freed.
func (l *lockModel) pump() {
	s := l.s
	l.pumping = false
	for _, k := range l.keys() {
		ls := l.leases[k]
		if ls.mode != 0 && s.dead(ls.node, ls.inc) {
			s.logf("lock: node %d incarnation %d is dead: its lease (%v) freed", ls.node, ls.inc, ls.mode)
			ls.mode = 0
		}
		if ls.mode == 0 && s.nodes[ls.node].inc != ls.inc {
			delete(l.leases, k)
		}
	}
	for len(l.waiting) > 0 {
		wt := l.waiting[0]
		if wt.n.mg != wt.mg {
			l.waiting = l.waiting[1:]
			continue
		}
		blocked := false
		for _, k := range l.keys() {
			ls := l.leases[k]
			if ls.node == wt.n.id && ls.inc == wt.n.inc || compatible(ls.mode, wt.mode) {
				continue
			}
			keep := lock.Mode(0)
			if wt.mode == lock.Shared {
				keep = lock.Shared
			}
			h := s.nodes[ls.node]
			if h.inc == ls.inc && h.holds == 0 && h.mg != nil && !h.paused && !h.isolated {
				ls.mode, ls.reqRev = keep, false
			} else {
				ls.reqRev, ls.keep = true, keep
			}
			if !compatible(ls.mode, wt.mode) {
				blocked = true
			}
		}
		if blocked {
			l.pumping = true
			s.w.After(20*time.Millisecond, l.pump)
			return
		}
		l.waiting = l.waiting[1:]
		ls := l.lease(wt.n)
		l.seq++
		ls.mode, ls.tok, ls.reqRev = max(ls.mode, wt.mode), lock.Token{Epoch: 1, Seq: l.seq}, false
		wt.n.holds++
		n, mg, op, tok := wt.n, wt.mg, wt.op, ls.tok
		s.logf("lock: map lock %v granted to node %d incarnation %d (token %s)", wt.mode, n.id, n.inc, tok)
		n.p.Go(s.w.Between(100*time.Microsecond, 2*time.Millisecond), func() {
			if n.mg == mg {
				s.exec(n, mg, mg.Granted(s.env(n), op, tok, nil))
			} else {
				n.holds--
			}
		})
	}
}

// ------------------------------------------------------------------ the config service model

type configModel struct {
	s    *csim
	pair *Pair
	ver  uint64
}

func (c *configModel) read() (*Pair, uint64) { return c.pair.Clone(), c.ver }

// propose commits p if ver is current, after a delay; the answer may be
// lost (the caller times out) whether it committed or not.
func (c *configModel) propose(n *cnode, ver uint64, p *Pair, done func(uint64, error)) {
	w := c.s.w
	w.After(w.Between(time.Millisecond, 300*time.Millisecond), func() {
		var err error
		var got uint64
		lost := w.Rand.Intn(10) == 0
		if w.Rand.Intn(20) == 0 {
			err = errors.New("config model: decree lost")
		} else if ver != c.ver {
			err = fmt.Errorf("config model: stale version %d (now %d)", ver, c.ver)
		} else {
			c.pair, c.ver = p.Clone(), c.ver+1
			got = c.ver
			c.s.logf("config: pair decreed: primary node %d incarnation %d (version %d)", c.pair.PrimaryNode(), c.pair.PrimaryInc, c.ver)
			c.broadcast()
		}
		if lost {
			err = errors.New("config model: decree timed out at the client")
			w.After(2*time.Second, func() { n.p.Go(0, func() { done(0, err) }) })
			return
		}
		n.p.Go(w.Between(100*time.Microsecond, 5*time.Millisecond), func() { done(got, err) })
	})
}

// broadcast delivers the record to every node's manager, late.
func (c *configModel) broadcast() {
	p, ver := c.read()
	for _, n := range c.s.sortedNodes() {
		mg := n.mg
		n.p.Go(c.s.w.Between(time.Millisecond, 400*time.Millisecond), func() {
			if n.mg == mg && mg != nil {
				c.s.exec(n, mg, mg.SetPair(c.s.env(n), p, ver, false))
			}
		})
	}
}

// ------------------------------------------------------------------ a node's request handling (the runtime's)

type clientReq struct {
	client uint64
	seq    uint64
	kind   string // alloc, free, read, write, reserve, commit, disown, retire, owned
	size   uint64
	count  int      // reserve
	live   []uint64 // commit, disown
	owner  Owner    // alloc; retire and owned: the log and the token below which
	h      Handle
	off, n uint64
	data   []byte
}

type clientResp struct {
	seq  uint64
	h    Handle
	data []byte
	err  error
	ids  []uint64 // owned
}

// nodeIO is the sim's blockIO of one node incarnation.
type nodeIO struct {
	s  *csim
	n  *cnode
	mg *Manager
}

func (x nodeIO) readBlocks(rl, block, blocks uint64, done func([]byte, error)) {
	x.s.rl.read(x.n, x.mg, rl, block, blocks, done)
}

func (x nodeIO) writeBlocks(rl, block uint64, data []byte, done func(error)) {
	x.s.rl.write(x.n, x.mg, rl, block, data, nil, done)
}

// serve handles a client's request at node n, as the node runtime does.
func (s *csim) serve(n *cnode, q clientReq) {
	mg := n.mg
	answer := func(r clientResp) {
		r.seq = q.seq
		s.net.Send(n.id, q.client, r)
	}
	if mg == nil {
		return
	}
	env := s.env(n)
	switch q.kind {
	case "owned":
		ids, _, err := mg.Owned(env, q.owner.Log, q.owner.Token, 0, MaxOwnedList)
		answer(clientResp{ids: ids, err: err})
	case "alloc", "free", "reserve", "commit", "disown", "retire":
		if (q.kind == "free" || q.kind == "commit") && q.h.CM != 1 {
			answer(clientResp{err: fmt.Errorf("%w: %s", ErrUnknownManager, q.h)})
			return
		}
		n.nextReq++
		req := n.nextReq
		n.pending[req] = func(r Reply) { answer(clientResp{h: r.Handle, err: r.Err}) }
		switch q.kind {
		case "alloc":
			s.exec(n, mg, mg.AllocateOwned(env, req, q.size, q.owner))
		case "disown":
			s.exec(n, mg, mg.Disown(env, req, q.live))
		case "retire":
			s.exec(n, mg, mg.Retire(env, req, q.owner.Log, q.owner.Token))
		case "free":
			s.exec(n, mg, mg.Free(env, req, q.h.ID))
		case "reserve":
			s.exec(n, mg, mg.Reserve(env, req, q.size, q.count))
		case "commit":
			s.exec(n, mg, mg.Commit(env, req, q.h.ID, q.live))
		}
	case "read", "write":
		if q.h.CM != 1 {
			answer(clientResp{err: fmt.Errorf("%w: %s", ErrUnknownManager, q.h)})
			return
		}
		n := n
		ext, err := mg.Admit(env, q.h.ID, q.off, q.n)
		if err != nil {
			answer(clientResp{err: err})
			return
		}
		io := nodeIO{s, n, mg}
		if q.kind == "read" {
			readChunk(io, ext, q.off, q.n, func(b []byte, err error) {
				if n.mg == mg {
					s.exec(n, mg, mg.Finished(s.env(n), q.h.ID))
				}
				if err != nil {
					answer(clientResp{err: err})
					return
				}
				answer(clientResp{data: b})
			})
			return
		}
		// Writes of one chunk are serialized here (read-modify-write).
		var try func()
		try = func() {
			if n.mg != mg {
				return
			}
			if n.chunkMu[q.h.ID] {
				n.p.Go(time.Millisecond, try)
				return
			}
			n.chunkMu[q.h.ID] = true
			writeChunk(io, ext, q.off, q.data, func(err error) {
				delete(n.chunkMu, q.h.ID)
				if n.mg == mg {
					s.exec(n, mg, mg.Finished(s.env(n), q.h.ID))
				}
				if err != nil {
					err = fmt.Errorf("%w: %w", ErrMaybeDone, err)
				}
				answer(clientResp{err: err})
			})
		}
		try()
	}
}

// ------------------------------------------------------------------ clients and the oracle

type oracle struct {
	s       *csim
	fails   []string
	handles map[Handle]*ochunk // every handle an allocation returned
	maxID   uint64
}

type ochunk struct {
	h    Handle
	size uint64
	// cands is every content the chunk may have now: each acknowledged
	// write applied, each write that may have landed applied or not (in
	// any order with the writes after it, until it cannot land any more).
	cands   [][]byte
	maybe   []maybeWrite  // writes that may still land
	freedAt time.Duration // when its free was acknowledged (0: not)
	// freeMaybe: a free that may have happened (the client retries it
	// until it is certain).
	freeMaybe bool
	// Batching (a reservation's chunk handed out by its clerk): pending
	// until the commit is acknowledged (it reads as unallocated until
	// then); cancelled: freed by its caller before the commit (never
	// readable, unless its clerk died: then the reservation is kept whole,
	// and the chunk leaks); abandoned: its clerk died before the commit
	// (at then, the chunk is allocated, zeroed, by ResvLife after).
	pending, cancelled bool
	abandoned          time.Duration
	// Owned allocations: owner (zero: none), when the allocation was
	// acknowledged, when a disown of it was (0: not), or whether one may
	// have taken effect; orphan: an id the owner's listing found that no
	// allocation returned (its answer was lost): its size is unknown.
	owner       Owner
	ackedAt     time.Duration
	disownedAt  time.Duration
	disownMaybe bool
	orphan      bool
}

// batch is a client's open reservation (the clerk's batching).
type batch struct {
	r      Handle // the reservation
	size   uint64
	count  int
	next   int // slots handed out
	chunks []*ochunk
	sent   bool          // a commit was sent (it may have taken effect)
	asked  time.Duration // when it was asked for (it cannot expire before ResvLife after)
}

// maybeWrite is a write that failed after it may have started: it lands
// (or not) as a write of whole blocks from off: one of images, the blocks
// as the manager read them for its read-modify-write, with the write's
// bytes in them (a partial write's neighbouring bytes go back to what they
// were then: the documented effect of a failed partial write).
type maybeWrite struct {
	off    uint64
	images [][]byte
	until  time.Duration // it cannot land after this
}

// maxCands bounds the contents the oracle follows per chunk: past it the
// client writes the chunk whole and does not read it until the maybe
// writes have expired.
const maxCands = 32

func (c *ochunk) addCands(more [][]byte) {
	for _, x := range more {
		dup := false
		for _, y := range c.cands {
			if bytes.Equal(x, y) {
				dup = true
				break
			}
		}
		if !dup {
			c.cands = append(c.cands, x)
		}
	}
}

func applyWrite(c []byte, off uint64, data []byte) []byte {
	y := bytes.Clone(c)
	copy(y[off:], data)
	return y
}

// expire forgets maybe writes that can no longer land.
func (c *ochunk) expire(now time.Duration) {
	var live []maybeWrite
	for _, m := range c.maybe {
		if now <= m.until {
			live = append(live, m)
		}
	}
	c.maybe = live
}

// acked applies an acknowledged write that began at start.
func (c *ochunk) acked(start time.Duration, off uint64, data []byte) {
	var next [][]byte
	for _, x := range c.cands {
		next = append(next, applyWrite(x, off, data))
	}
	c.cands = nil
	c.addCands(next)
	var after []maybeWrite
	for _, m := range c.maybe {
		if m.until > start { // it may land after this write
			after = append(after, m)
		}
	}
	c.close(after)
}

// close adds every content the maybe writes ms can make of the
// candidates, landing in any order, any of them or none.
func (c *ochunk) close(ms []maybeWrite) {
	for grew := true; grew && len(c.cands) <= 4*maxCands; {
		n := len(c.cands)
		for _, m := range ms {
			var more [][]byte
			for _, x := range c.cands {
				for _, img := range m.images {
					more = append(more, applyWrite(x, m.off, img))
				}
			}
			c.addCands(more)
		}
		grew = len(c.cands) > n
	}
}

// maybeWrote adds a write of data at off that may land until until, as
// a write of its whole blocks over the content it read (any of before,
// the candidates when it was issued).
func (c *ochunk) maybeWrote(before [][]byte, off uint64, data []byte, until time.Duration) {
	first := off / BlockSize * BlockSize
	end := min(c.size, (off+uint64(len(data))+BlockSize-1)/BlockSize*BlockSize)
	m := maybeWrite{off: first, until: until}
	for _, b := range before {
		img := bytes.Clone(b[first:end])
		copy(img[off-first:], data)
		dup := false
		for _, x := range m.images {
			dup = dup || bytes.Equal(x, img)
		}
		if !dup {
			m.images = append(m.images, img)
		}
	}
	c.maybe = append(c.maybe, m)
	c.close(c.maybe)
}

type client struct {
	s     *csim
	id    uint64
	p     *sim.Process
	seq   uint64
	wait  map[uint64]func(clientResp)
	owned []*ochunk
	view  *Pair // the client's cached pair record (a clerk's hint)
	next  int   // which node to try for reads and writes
	r     *rand.Rand
	b     *batch    // the open reservation (nil: none)
	todo  []*ochunk // frees to make (one at a time: a client makes one call at a time)
	// batching: this client allocates through reservations (two clients
	// of four do)
	batching bool
	// Owned allocations (the clients that do not batch): the client plays
	// a log's successive holders (log 100+id): ownerTok is the current
	// holder's token; a recovery retires every older holder (retireSent:
	// the newest retirement asked; retired: the newest acknowledged),
	// lists what they left and frees it. maybeOwned counts, per token,
	// the allocations whose outcome stayed unknown.
	ownerTok, retireSent, retired lock.Token
	maybeOwned                    map[lock.Token]int
}

func (c *client) ownerLog() uint64 { return 100 + c.id }

const clientTimeout = 1500 * time.Millisecond

// call sends q to node and calls done with the answer, or with nil after
// clientTimeout (the outcome is then unknown).
func (c *client) call(node uint64, q clientReq, done func(*clientResp)) {
	c.seq++
	q.seq, q.client = c.seq, c.id
	seq := c.seq
	answered := false
	c.wait[seq] = func(r clientResp) {
		if answered {
			return
		}
		answered = true
		done(&r)
	}
	c.s.net.Send(c.id, node, q)
	c.p.Go(clientTimeout, func() {
		if !answered {
			answered = true
			delete(c.wait, seq)
			done(nil)
		}
	})
}

func (c *client) primary() uint64 {
	if c.view == nil {
		p, _ := c.s.cfg.read()
		c.view = p
	}
	return c.view.PrimaryNode()
}

// refresh re-reads the pair (a clerk refreshes its hint on a misdirected
// request), late.
func (c *client) refresh() {
	c.p.Go(c.s.w.Between(time.Millisecond, 200*time.Millisecond), func() {
		p, _ := c.s.cfg.read()
		c.view = p
	})
}

func (c *client) loop() {
	s := c.s
	c.p.Go(s.w.Between(time.Millisecond, 40*time.Millisecond), func() {
		if !s.faults && s.w.Now() > simLiveness-2*time.Second {
			return
		}
		c.step()
	})
}

func (c *client) step() {
	s, r := c.s, c.r
	var live []*ochunk
	for _, ch := range c.owned {
		if ch.freedAt == 0 && !ch.freeMaybe && !ch.pending && !ch.cancelled {
			live = append(live, ch)
		}
	}
	if len(c.todo) > 0 {
		ch := c.todo[0]
		c.todo = c.todo[1:]
		c.free(ch)
		return
	}
	if c.batching && c.b != nil && (c.b.sent || c.b.next == c.b.count || r.Intn(8) == 0) {
		if r.Intn(25) == 0 && !c.b.sent {
			c.abandon() // the clerk dies: its reservation is never committed
			c.loop()
			return
		}
		c.commit()
		return
	}
	switch x := r.Intn(100); {
	case x < 20 || len(live) == 0:
		if c.batching {
			c.batchAlloc()
			return
		}
		c.alloc()
	case x < 30:
		if c.b != nil && c.b.next > 0 && r.Intn(2) == 0 {
			// A free of a chunk handed out from the open reservation: the
			// clerk cancels it locally (never sent).
			ch := c.b.chunks[r.Intn(c.b.next)]
			ch.cancelled = true
			s.logf("client %d: free %s before its commit: cancelled", c.id, ch.h)
			c.loop()
			return
		}
		c.free(live[r.Intn(len(live))])
	case x < 60:
		c.write(live[r.Intn(len(live))])
	case x < 95:
		c.read(live[r.Intn(len(live))])
	case x < 97 && !c.batching:
		c.disown(live)
	case x < 98 && !c.batching:
		c.recoverOwner()
	default:
		c.probe()
	}
	_ = s
}

func (c *client) alloc() {
	s := c.s
	size := uint64(1 + c.r.Intn(3*BlockSize))
	if c.r.Intn(10) == 0 {
		size = uint64(1 + c.r.Intn(64*BlockSize))
	}
	start := s.w.Now()
	var owner Owner
	if !c.batching && c.r.Intn(2) == 0 {
		owner = Owner{Log: c.ownerLog(), Token: c.ownerTok}
		if c.retired.Seq > 1 && c.r.Intn(4) == 0 {
			// A holder the latest acknowledged recovery retired: refused.
			owner.Token = lock.Token{Epoch: 1, Seq: uint64(1 + c.r.Intn(int(c.retired.Seq-1)))}
		}
	}
	retiredAtSend := c.retired
	c.call(c.primary(), clientReq{kind: "alloc", size: size, owner: owner}, func(resp *clientResp) {
		if !owner.IsZero() && (resp == nil || errors.Is(resp.err, ErrMaybeDone)) {
			c.maybeOwned[owner.Token]++
		}
		switch {
		case resp == nil:
			s.stats.maybes++
		case resp.err == nil && !owner.IsZero() && owner.Token.Less(retiredAtSend):
			s.o.fail("client %d: an allocation for %v, sent after the retirement of its log's owners below %v was acknowledged, succeeded (%s)", c.id, owner, retiredAtSend, resp.h)
		case errors.Is(resp.err, ErrRetired):
			s.stats.refused++
			if owner.IsZero() || !owner.Token.Less(c.retireSent) {
				s.o.fail("client %d: an allocation for %v refused as retired; no retirement above it was asked (newest %v): %v", c.id, owner, c.retireSent, resp.err)
			}
		case resp.err == nil:
			s.stats.allocs++
			h := resp.h
			if prev := s.o.handles[h]; prev != nil {
				s.o.fail("alloc returned %s again (first at size %d, freed at %v)", h, prev.size, prev.freedAt)
			} else if h.CM != 1 || h.ID == 0 {
				s.o.fail("alloc returned a malformed handle %s", h)
			}
			ch := &ochunk{h: h, size: size, cands: [][]byte{make([]byte, size)}, owner: owner, ackedAt: s.w.Now()}
			if !owner.IsZero() {
				s.stats.ownedAllocs++
			}
			s.o.handles[h] = ch
			s.o.maxID = max(s.o.maxID, h.ID)
			c.owned = append(c.owned, ch)
			s.logf("client %d: alloc %d bytes for %v -> %s (%v)", c.id, size, owner, h, s.w.Now()-start)
		case errors.Is(resp.err, ErrNotPrimary), errors.Is(resp.err, ErrNotServing):
			c.refresh()
		case errors.Is(resp.err, ErrFull), errors.Is(resp.err, ErrMapFull), errors.Is(resp.err, ErrMaybeDone):
		default:
			s.logf("client %d: alloc: %v", c.id, resp.err)
		}
		c.loop()
	})
}

// batchAlloc hands out the open reservation's next chunk (no message), or
// asks for a reservation.
func (c *client) batchAlloc() {
	s := c.s
	if b := c.b; b != nil && b.next < b.count {
		id := b.r.ID + 1 + uint64(b.next)
		h := Handle{1, id}
		if prev := s.o.handles[h]; prev != nil {
			s.o.fail("a reservation handed out %s again", h)
		}
		ch := &ochunk{h: h, size: b.size, cands: [][]byte{make([]byte, b.size)}, pending: true}
		s.o.handles[h] = ch
		s.o.maxID = max(s.o.maxID, id)
		c.owned = append(c.owned, ch)
		b.chunks = append(b.chunks, ch)
		b.next++
		s.stats.allocs++
		c.loop()
		return
	}
	size := uint64(1 + c.r.Intn(3*BlockSize))
	count := 1 + c.r.Intn(20)
	asked := s.w.Now()
	c.call(c.primary(), clientReq{kind: "reserve", size: size, count: count}, func(resp *clientResp) {
		switch {
		case resp == nil:
			s.stats.maybes++
		case resp.err == nil:
			h := resp.h
			for i := uint64(0); i <= uint64(count); i++ {
				if prev := s.o.handles[Handle{1, h.ID + i}]; prev != nil {
					s.o.fail("reservation %s of %d includes %s, handed out before", h, count, prev.h)
				}
			}
			s.o.maxID = max(s.o.maxID, h.ID+uint64(count))
			c.b = &batch{r: h, size: size, count: count, asked: asked}
			s.stats.resvs++
			s.logf("client %d: reservation %s of %d chunks of %d bytes", c.id, h, count, size)
		case errors.Is(resp.err, ErrNotPrimary), errors.Is(resp.err, ErrNotServing):
			c.refresh()
		default:
			s.logf("client %d: reserve: %v", c.id, resp.err)
		}
		c.loop()
	})
}

// commit sends the open reservation's batch: the chunks handed out and not
// cancelled.
func (c *client) commit() {
	s, b := c.s, c.b
	var live []uint64
	for _, ch := range b.chunks {
		if !ch.cancelled {
			live = append(live, ch.h.ID)
		}
	}
	first := !b.sent
	b.sent = true
	done := func() {
		for _, ch := range b.chunks {
			ch.pending = false
			if ch.cancelled && ch.freedAt == 0 {
				ch.freedAt = s.w.Now()
			}
		}
		c.b = nil
	}
	c.call(c.primary(), clientReq{kind: "commit", h: b.r, live: live}, func(resp *clientResp) {
		switch {
		case resp == nil, errors.Is(resp.err, ErrMaybeDone):
			// Sent again at the next step.
		case resp.err == nil:
			s.logf("client %d: commit %s: %d kept, %d cancelled", c.id, b.r, len(live), len(b.chunks)-len(live))
			s.stats.commits++
			s.stats.cancels += len(b.chunks) - len(live)
			done()
		case errors.Is(resp.err, ErrUnallocated):
			// Not open: an earlier attempt committed it (or, if it took
			// longer than ResvLife, it was kept whole): the cancelled
			// chunks are freed one by one (a free finding one gone is
			// done).
			s.logf("client %d: commit %s: %v (first attempt: %v)", c.id, b.r, resp.err, first)
			if first && s.w.Now() < b.asked+simResvLife {
				s.o.fail("the first commit of reservation %s, within ResvLife, answered %v", b.r, resp.err)
			}
			for _, ch := range b.chunks {
				ch.pending = false
				if ch.cancelled {
					ch.cancelled, ch.freeMaybe = false, true
					c.todo = append(c.todo, ch)
				}
			}
			c.b = nil
		case errors.Is(resp.err, ErrNotPrimary), errors.Is(resp.err, ErrNotServing):
			c.refresh()
		default:
			s.o.fail("commit of reservation %s: %v", b.r, resp.err)
		}
		c.loop()
	})
}

// abandon: the clerk goes away with its reservation open. Every chunk it
// handed out must become usable (the primary keeps the reservation
// whole after ResvLife): the oracle stops treating them as pending then.
func (c *client) abandon() {
	s, b := c.s, c.b
	s.logf("client %d: abandons reservation %s (%d handed out)", c.id, b.r, b.next)
	s.stats.abandons++
	for _, ch := range b.chunks {
		ch.abandoned = s.w.Now()
	}
	c.b = nil
}

func (c *client) free(ch *ochunk) {
	s := c.s
	start := s.w.Now()
	c.call(c.primary(), clientReq{kind: "free", h: ch.h}, func(resp *clientResp) {
		switch {
		case resp == nil:
			ch.freeMaybe = true
		case resp.err == nil:
			s.stats.frees++
			if ch.freedAt == 0 {
				ch.freedAt = s.w.Now()
			}
			s.logf("client %d: free %s (%v)", c.id, ch.h, s.w.Now()-start)
		case errors.Is(resp.err, ErrUnallocated):
			s.logf("client %d: free %s: %v (maybe freed before: %v)", c.id, ch.h, resp.err, ch.freeMaybe)
			if !ch.freeMaybe {
				s.o.fail("free of %s (allocated, never freed) answered %v", ch.h, resp.err)
			}
			ch.freedAt = s.w.Now() // a retried free whose first attempt took effect
		case errors.Is(resp.err, ErrMaybeDone):
			ch.freeMaybe = true
		case errors.Is(resp.err, ErrNotPrimary), errors.Is(resp.err, ErrNotServing):
			c.refresh()
		default:
			s.logf("client %d: free %s: %v", c.id, ch.h, resp.err)
		}
		if ch.freeMaybe && ch.freedAt == 0 {
			// Retry until the free is certain (acknowledged, or the chunk
			// answers unallocated).
			c.p.Go(50*time.Millisecond, func() { c.free(ch) })
			return
		}
		c.loop()
	})
}

// disown takes the owner off a few of the client's owned chunks (as a
// B-tree server does once their linking record is durable).
func (c *client) disown(live []*ochunk) {
	s := c.s
	var pick []*ochunk
	for _, ch := range live {
		if !ch.owner.IsZero() && ch.disownedAt == 0 && len(pick) < 1+c.r.Intn(4) && c.r.Intn(2) == 0 {
			pick = append(pick, ch)
		}
	}
	if len(pick) == 0 {
		c.probe()
		return
	}
	var ids []uint64
	for _, ch := range pick {
		ids = append(ids, ch.h.ID)
	}
	c.call(c.primary(), clientReq{kind: "disown", live: ids}, func(resp *clientResp) {
		switch {
		case resp == nil, errors.Is(resp.err, ErrMaybeDone):
			for _, ch := range pick {
				ch.disownMaybe = true
			}
		case resp.err == nil:
			s.stats.disowns++
			for _, ch := range pick {
				ch.disownedAt = s.w.Now()
			}
			s.logf("client %d: disown %v", c.id, ids)
		case errors.Is(resp.err, ErrNotPrimary), errors.Is(resp.err, ErrNotServing):
			c.refresh()
		default:
			s.logf("client %d: disown %v: %v", c.id, ids, resp.err)
		}
		c.loop()
	})
}

// recoverOwner plays the recovery of the log's current holder, as a
// B-tree server's replay of a dead server's log: a newer holder's token
// retires the older ones, lists what they allocated and did not disown,
// and frees it. The oracle checks the list against what the client was
// told: nothing disowned, freed or another owner's in it (ids no
// allocation returned only as many as allocations with an unknown
// outcome), and every acknowledged allocation of an older holder that was
// not disowned or freed (or may have been) in it.
func (c *client) recoverOwner() {
	s := c.s
	below := lock.Token{Epoch: 1, Seq: c.ownerTok.Seq + 1}
	c.ownerTok, c.retireSent = below, below // the next holder's, from now on
	log := c.ownerLog()
	c.call(c.primary(), clientReq{kind: "retire", owner: Owner{Log: log, Token: below}}, func(resp *clientResp) {
		switch {
		case resp != nil && resp.err == nil:
			s.stats.retires++
			c.retired = below
			s.logf("client %d: retired log %d's owners below %v", c.id, log, below)
			c.listOwned(log, below)
			return
		case resp != nil && (errors.Is(resp.err, ErrNotPrimary) || errors.Is(resp.err, ErrNotServing)):
			c.refresh()
		}
		c.loop()
	})
}

func (c *client) listOwned(log uint64, below lock.Token) {
	s := c.s
	start := s.w.Now()
	c.call(c.primary(), clientReq{kind: "owned", owner: Owner{Log: log, Token: below}}, func(resp *clientResp) {
		if resp == nil || resp.err != nil {
			if resp != nil && (errors.Is(resp.err, ErrNotPrimary) || errors.Is(resp.err, ErrNotServing)) {
				c.refresh()
			}
			c.loop() // the next recovery lists again
			return
		}
		s.stats.listings++
		s.stats.listed += len(resp.ids)
		listed := map[uint64]bool{}
		unknown := 0
		for _, id := range resp.ids {
			listed[id] = true
			ch := s.o.handles[Handle{1, id}]
			switch {
			case ch == nil:
				unknown++
			case ch.owner.Log != log || !ch.owner.Token.Less(below):
				s.o.fail("client %d: log %d's chunks below %v listed %s, allocated for %v", c.id, log, below, ch.h, ch.owner)
			case ch.disownedAt != 0 && ch.disownedAt < start:
				s.o.fail("client %d: log %d's chunks listed %s, whose disown was acknowledged at %v", c.id, log, ch.h, ch.disownedAt)
			case ch.freedAt != 0 && ch.freedAt < start:
				s.o.fail("client %d: log %d's chunks listed %s, whose free was acknowledged at %v", c.id, log, ch.h, ch.freedAt)
			}
		}
		maybe := 0
		for t, n := range c.maybeOwned {
			if t.Less(below) {
				maybe += n
			}
		}
		if unknown > maybe {
			s.o.fail("client %d: log %d's chunks below %v listed %d ids no allocation returned; only %d allocations had an unknown outcome", c.id, log, below, unknown, maybe)
		}
		for _, ch := range c.owned {
			if ch.owner.Log == log && ch.owner.Token.Less(below) && ch.ackedAt < start && ch.disownedAt == 0 && !ch.disownMaybe &&
				ch.freedAt == 0 && !ch.freeMaybe && !listed[ch.h.ID] {
				s.o.fail("client %d: log %d's chunks below %v do not list %s (allocated at %v, never disowned nor freed)", c.id, log, below, ch.h, ch.ackedAt)
			}
		}
		s.logf("client %d: log %d's chunks below %v: %v (%d unknown)", c.id, log, below, resp.ids, unknown)
		// Free them all: what a recovery does with what nothing linked.
		for _, id := range resp.ids {
			h := Handle{1, id}
			ch := s.o.handles[h]
			if ch == nil {
				s.stats.orphans++
				ch = &ochunk{h: h, orphan: true, owner: Owner{Log: log}}
				s.o.handles[h] = ch
				s.o.maxID = max(s.o.maxID, id)
			}
			if ch.freedAt == 0 && !ch.freeMaybe {
				c.todo = append(c.todo, ch)
			}
		}
		c.loop()
	})
}

func (c *client) node() uint64 {
	c.next++
	return []uint64{1, 2}[c.next%2]
}

func (c *client) write(ch *ochunk) {
	s, r := c.s, c.r
	var off, n uint64
	ch.expire(s.w.Now())
	if len(ch.cands) > 1 || r.Intn(2) == 0 {
		off, n = 0, ch.size // whole
	} else {
		off = uint64(r.Int63n(int64(ch.size)))
		n = 1 + uint64(r.Int63n(int64(ch.size-off)))
	}
	data := make([]byte, n)
	r.Read(data)
	start := s.w.Now()
	before := ch.cands
	node := c.node()
	c.call(node, clientReq{kind: "write", h: ch.h, off: off, n: n, data: data}, func(resp *clientResp) {
		s.o.checkUse(ch, "write", start, resp)
		s.logf("client %d: write %s [%d, +%d) %x... via node %d: %v", c.id, ch.h, off, n, data[:min(4, len(data))], node, respErr(resp))
		switch {
		case resp != nil && resp.err == nil:
			s.stats.writes++
			ch.acked(start, off, data)
		case resp == nil || errors.Is(resp.err, ErrMaybeDone):
			// It may land until its node's manager gives up on it: the
			// client's timeout, a pause (at most 2.5 s), the RLDev's late
			// landing (2 s): 10 s is past all of them.
			ch.maybeWrote(before, off, data, s.w.Now()+10*time.Second)
			if r.Intn(2) == 0 {
				// A client gives up on a chunk a write failed on: frees it
				// (the late write must not land in the chunk that reuses
				// its space).
				c.free(ch)
				return
			}
		case errors.Is(resp.err, ErrNotServing):
			c.refresh()
		}
		c.loop()
	})
}

func (c *client) read(ch *ochunk) {
	s, r := c.s, c.r
	ch.expire(s.w.Now())
	if len(ch.cands) > maxCands {
		c.write(ch) // collapse (whole writes) before reading again
		return
	}
	off := uint64(r.Int63n(int64(ch.size)))
	n := 1 + uint64(r.Int63n(int64(ch.size-off)))
	if r.Intn(2) == 0 {
		off, n = 0, ch.size
	}
	start := s.w.Now()
	node := c.node()
	c.call(node, clientReq{kind: "read", h: ch.h, off: off, n: n}, func(resp *clientResp) {
		s.o.checkUse(ch, "read", start, resp)
		if resp != nil && resp.err == nil {
			s.logf("client %d: read %s [%d, +%d) via node %d: %x...", c.id, ch.h, off, n, node, resp.data[:min(4, len(resp.data))])
		} else {
			s.logf("client %d: read %s [%d, +%d) via node %d: %v", c.id, ch.h, off, n, node, respErr(resp))
		}
		if resp != nil && resp.err == nil {
			s.stats.reads++
			ok := false
			for _, cand := range ch.cands {
				if bytes.Equal(resp.data, cand[off:off+n]) {
					ok = true
					break
				}
			}
			if !ok {
				s.o.fail("read of %s [%d, +%d) returned data that no acknowledged (or possibly landed) write left there", ch.h, off, n)
			}
		}
		c.loop()
	})
}

// probe uses a freed handle, or an id never handed out, through either
// manager: it must fail as unallocated.
func (c *client) probe() {
	s := c.s
	var h Handle
	var ch *ochunk
	var freed []*ochunk
	for _, x := range c.owned {
		if x.freedAt != 0 {
			freed = append(freed, x)
		}
	}
	if len(freed) > 0 && c.r.Intn(2) == 0 {
		ch = freed[c.r.Intn(len(freed))]
		h = ch.h
	} else {
		h = Handle{1, s.o.maxID + 1_000_000 + uint64(c.r.Intn(1000))} // above any id a Reserve could cover
	}
	kind := []string{"read", "write", "free"}[c.r.Intn(3)]
	q := clientReq{kind: kind, h: h, off: 0, n: 1, data: []byte{7}}
	node := c.node()
	if kind == "free" {
		node = c.primary()
	}
	start := s.w.Now()
	c.call(node, q, func(resp *clientResp) {
		if resp != nil && resp.err == nil {
			if ch == nil || ch.freedAt != 0 && ch.freedAt < start {
				s.o.fail("%s of %s (freed at %v, or never allocated) through node %d succeeded", kind, h, func() time.Duration {
					if ch == nil {
						return 0
					}
					return ch.freedAt
				}(), node)
			}
		}
		c.loop()
	})
}

func respErr(r *clientResp) any {
	if r == nil {
		return "no answer"
	}
	return r.err
}

// checkUse: a read or write that succeeded must not be of a chunk whose
// free was acknowledged before it began; one of a chunk allocated and
// never freed must not answer that it is not allocated.
func (o *oracle) checkUse(ch *ochunk, what string, start time.Duration, resp *clientResp) {
	if resp != nil && resp.err == nil && ch.freedAt != 0 && ch.freedAt < start {
		o.fail("%s of %s succeeded after its free was acknowledged (at %v)", what, ch.h, ch.freedAt)
	}
	if resp != nil && errors.Is(resp.err, ErrUnallocated) && ch.freedAt == 0 && !ch.freeMaybe {
		o.fail("%s of %s, allocated and never freed, answered %v", what, ch.h, resp.err)
	}
}

// ------------------------------------------------------------------ the run

func newCSim(t *testing.T, seed int64, opts simOpts) *csim {
	w := sim.NewWorld(seed)
	s := &csim{t: t, w: w, net: w.NewNetwork(), nodes: map[uint64]*cnode{}, opts: opts}
	s.net.MinDelay, s.net.MaxDelay = 50*time.Microsecond, 2*time.Millisecond
	s.rl = &rldevModel{s: s, blocks: map[uint64][]byte{mapID: make([]byte, simMap*BlockSize), dataID: make([]byte, simData*BlockSize)},
		admit: map[string]lock.Token{}, downTo: map[uint64]time.Duration{}}
	s.locks = &lockModel{s: s, leases: map[[2]uint64]*leaseState{}}
	s.cfg = &configModel{s: s, ver: 1, pair: &Pair{ID: 1, Nodes: [2]uint64{1, 2}, Primary: int(w.Rand.Intn(2)), MapRLDev: mapID, MapBlocks: simMap,
		Data: []DataRLDev{{ID: dataID, Blocks: simData}}}}
	s.o = &oracle{s: s, handles: map[Handle]*ochunk{}}
	for _, id := range []uint64{1, 2} {
		n := &cnode{id: id, p: w.NewProcess(id)}
		s.nodes[id] = n
		s.net.Attach(n.p)
		n.p.Deliver = func(from uint64, payload any) {
			switch x := payload.(type) {
			case peerMsg:
				if n.mg != nil && !n.isolated {
					s.exec(n, n.mg, n.mg.Deliver(s.env(n), from, x.msg))
				}
			case clientReq:
				if !n.isolated {
					s.serve(n, x)
				}
			}
		}
	}
	for i := 0; i < simClients; i++ {
		c := &client{s: s, id: uint64(10 + i), p: w.NewProcess(uint64(10 + i)), wait: map[uint64]func(clientResp){}, r: rand.New(rand.NewSource(seed*100 + int64(i))),
			batching: i%2 == 1 && !opts.noBatching, maybeOwned: map[lock.Token]int{}, ownerTok: lock.Token{Epoch: 1, Seq: 1}}
		s.net.Attach(c.p)
		c.p.Deliver = func(from uint64, payload any) {
			if r, ok := payload.(clientResp); ok {
				if fn := c.wait[r.seq]; fn != nil {
					delete(c.wait, r.seq)
					fn(r)
				}
			}
		}
		w.At(time.Second, c.loop)
	}
	return s
}

func runCSim(t *testing.T, seed int64, opts simOpts) *csim {
	s := newCSim(t, seed, opts)
	w := s.w
	for _, n := range s.sortedNodes() {
		w.At(w.Between(0, 500*time.Millisecond), func() { s.start(n) })
	}
	s.faults = true
	s.rl.faulty = w.Rand.Intn(2) == 0
	s.rl.lateOdds = []int{300, 40}[w.Rand.Intn(2)]
	s.lateDup = []float64{0, 0.02, 0.1}[w.Rand.Intn(3)]
	if opts.noFaults {
		s.rl.faulty, s.lateDup = false, 0
	}
	for at := 2 * time.Second; at < simSafety && !opts.noFaults; at += w.Between(500*time.Millisecond, 2500*time.Millisecond) {
		w.At(at, s.fault)
	}
	w.At(simSafety, s.heal)
	w.RunUntil(simLiveness)
	// The checks compare the maps in memory with the map on its RLDev: a
	// change under way (a reservation's expiry, which the primary makes on
	// its own, can begin just before the end) has its frame on the RLDev
	// and not yet in memory. Let it finish (bounded: one second more).
	for i := 0; i < 100 && s.changing(); i++ {
		w.RunUntil(w.Now() + 10*time.Millisecond)
	}
	s.finalChecks()
	if f := os.Getenv("GROVE_TRACE"); f != "" {
		os.WriteFile(f, []byte(strings.Join(s.trace, "\n")+"\n"), 0o644)
	}
	return s
}

// fault injects one fault.
func (s *csim) fault() {
	w := s.w
	n := s.nodes[uint64(1+w.Rand.Intn(2))]
	switch k := w.Rand.Intn(9); k {
	case 0, 1: // crash, restart later
		if n.mg == nil {
			return
		}
		s.logf("FAULT: crash node %d", n.id)
		s.crash(n)
		w.After(w.Between(200*time.Millisecond, 3*time.Second), func() {
			if n.mg == nil {
				s.start(n)
			}
		})
	case 2: // pause (past the grace period now and then)
		if n.mg == nil || n.paused {
			return
		}
		d := w.Between(300*time.Millisecond, 2500*time.Millisecond)
		s.logf("FAULT: pause node %d for %v", n.id, d)
		n.paused = true
		s.stopRenewing(n)
		n.p.Pause(d)
		w.After(d, func() {
			n.paused = false
			if n.mg != nil && !n.isolated && !s.dead(n.id, n.inc) && w.Now() < n.aliveTo {
				n.goneAt = 0
			}
			s.checkFence(n)
			s.locks.kick()
		})
	case 3: // the two managers cut from each other alone
		d := w.Between(500*time.Millisecond, 4*time.Second)
		s.logf("FAULT: partition nodes 1 and 2 for %v", d)
		s.net.Block(1, 2)
		s.net.Block(2, 1)
		w.After(d, func() { s.net.Heal() })
	case 4: // isolated: cut from the observers and everyone
		if n.mg == nil || n.isolated {
			return
		}
		d := w.Between(500*time.Millisecond, 3*time.Second)
		s.logf("FAULT: isolate node %d for %v", n.id, d)
		n.isolated = true
		s.stopRenewing(n)
		w.After(d, func() {
			n.isolated = false
			if n.mg != nil && !n.paused && !s.dead(n.id, n.inc) && w.Now() < n.aliveTo {
				n.goneAt = 0
			}
			s.checkFence(n)
			s.locks.kick()
		})
	case 5: // an RLDev refuses everything for a while
		id := []uint64{mapID, dataID}[w.Rand.Intn(2)]
		d := w.Between(100*time.Millisecond, 1500*time.Millisecond)
		s.logf("FAULT: rldev %d down for %v", id, d)
		s.rl.downTo[id] = w.Now() + d
	case 6: // packet loss
		s.net.DropRate = []float64{0, 0.05, 0.2}[w.Rand.Intn(3)]
		s.logf("FAULT: packet loss %.0f%%", s.net.DropRate*100)
	case 7: // an operator adds a data RLDev to the pair, by decree
		if s.grown >= 2 {
			return
		}
		s.grown++
		id := uint64(dataID + s.grown)
		s.rl.blocks[id] = make([]byte, simGrow*BlockSize)
		p := s.cfg.pair.Clone()
		p.Data = append(p.Data, DataRLDev{ID: id, Blocks: simGrow})
		s.cfg.pair, s.cfg.ver = p, s.cfg.ver+1
		s.logf("GROW: data rldev %d added to the pair (version %d)", id, s.cfg.ver)
		s.cfg.broadcast()
	}
}

// heal ends the faults: the liveness phase.
func (s *csim) heal() {
	s.logf("HEAL")
	s.faults = false
	s.net.Heal()
	s.net.DropRate = 0
	s.rl.faulty = false
	s.rl.downTo = map[uint64]time.Duration{}
	for _, n := range s.sortedNodes() {
		if n.mg == nil && !n.p.Up() {
			s.w.After(s.w.Between(0, 300*time.Millisecond), func() {
				if n.mg == nil {
					s.start(n)
				}
			})
		}
	}
}

// finalChecks: both managers serve, their maps agree with each other, with
// the map RLDev read afresh, and with the oracle.
func (s *csim) finalChecks() {
	var prim, sec *cnode
	for _, n := range s.nodes {
		if n.mg == nil {
			s.o.fail("node %d runs no manager at the end", n.id)
			continue
		}
		switch n.mg.st {
		case stPrimary:
			prim = n
		case stSecondary:
			sec = n
		default:
			s.o.fail("node %d's manager is %s at the end (%v)", n.id, n.mg.st, n.mg.why)
		}
	}
	if prim == nil || sec == nil {
		s.o.fail("no primary and secondary at the end")
		return
	}
	pm, sm := prim.mg.m, sec.mg.m
	if sm.lsn != pm.lsn {
		s.o.fail("the secondary's map is at LSN %d, the primary's at %d", sm.lsn, pm.lsn)
	}
	fresh, err := s.readMap()
	if err != nil {
		s.o.fail("reading the map afresh: %v", err)
		return
	}
	for name, m := range map[string]*chunkMap{"secondary": sm, "fresh": fresh} {
		if len(m.chunks) != len(pm.chunks) {
			s.o.fail("the %s map has %d chunks, the primary's %d", name, len(m.chunks), len(pm.chunks))
		}
		for id, e := range pm.chunks {
			if x := m.chunks[id]; x == nil || x.Extent != e.Extent {
				s.o.fail("chunk %d: the primary maps it to %+v, the %s map to %+v", id, e.Extent, name, x)
			} else if x.owner != e.owner {
				s.o.fail("chunk %d: the primary gives it owner %v, the %s map %v", id, e.owner, name, x.owner)
			}
		}
		if len(m.retired) != len(pm.retired) {
			s.o.fail("the %s map retires %v, the primary's %v", name, m.retired, pm.retired)
		}
		for l, t := range pm.retired {
			if m.retired[l] != t {
				s.o.fail("the %s map retires log %d's owners below %v, the primary's below %v", name, l, m.retired[l], t)
			}
		}
	}
	for name, m := range map[string]*chunkMap{"secondary": sm, "fresh": fresh} {
		if len(m.resv) != len(pm.resv) {
			s.o.fail("the %s map has %d open reservations, the primary's %d", name, len(m.resv), len(pm.resv))
		}
	}
	for h, ch := range s.o.handles {
		e := pm.chunks[h.ID]
		if ch.pending {
			// Its clerk left the batch unsent: if it went away long
			// enough before the end, the reservation was kept whole.
			if ch.abandoned != 0 && ch.abandoned < simSafety && !ch.cancelled && e == nil && pm.resv[pm.resvIDOf(h.ID)] == nil {
				s.o.fail("chunk %s, handed out by a clerk that went away at %v, is not in the map", h, ch.abandoned)
			}
			continue
		}
		switch {
		case ch.freedAt == 0 && !ch.freeMaybe && e == nil:
			s.o.fail("chunk %s, allocated and never freed, is not in the map", h)
		case ch.freedAt == 0 && !ch.freeMaybe && !ch.orphan && e.Len != ch.size:
			s.o.fail("chunk %s is %d bytes in the map, %d allocated", h, e.Len, ch.size)
		case ch.freedAt != 0 && e != nil:
			s.o.fail("chunk %s, freed at %v, is in the map", h, ch.freedAt)
		case e != nil && ch.disownedAt != 0 && !e.owner.IsZero():
			s.o.fail("chunk %s, disowned at %v, has owner %v", h, ch.disownedAt, e.owner)
		case e != nil && ch.disownedAt == 0 && !ch.disownMaybe && !ch.orphan && e.owner != ch.owner:
			s.o.fail("chunk %s, allocated for %v and never disowned, has owner %v", h, ch.owner, e.owner)
		}
	}
	for id := range pm.chunks {
		if id >= pm.hw {
			s.o.fail("chunk %d at or above the high-water id %d", id, pm.hw)
		}
	}
}

// changing reports whether a manager is in the middle of a change.
func (s *csim) changing() bool {
	for _, n := range s.nodes {
		if n.mg != nil && (n.mg.busy || n.mg.waitAck != nil || len(n.mg.queue) > 0) {
			return true
		}
	}
	return false
}

// readMap reads the map RLDev model as a manager loads it.
func (s *csim) readMap() (*chunkMap, error) {
	p, _ := s.cfg.read()
	mg := NewManager(Config{Node: 9, Inc: 1, CM: 1})
	mg.pair = p
	var result error
	done := false
	out := mg.load(func(err error) []any { result, done = err, true; return nil })
	for len(out) > 0 {
		var next []any
		for _, o := range out {
			x := o.(MapRead)
			next = append(next, mg.Done(Env{}, x.Op, bytes.Clone(s.rl.blocks[mapID][x.Block*BlockSize:(x.Block+x.Blocks)*BlockSize]), nil)...)
		}
		out = nil
		for _, o := range next {
			if _, ok := o.(MapRead); ok {
				out = append(out, o)
			}
		}
	}
	if !done {
		return nil, errors.New("the load did not finish")
	}
	return mg.m, result
}

func TestChunkSimulation(t *testing.T) {
	seeds := sim.Seeds(t, 100)
	var st struct {
		allocs, frees, writes, reads, crashes, maybes, dups, grown, resvs, commits, cancels, abandons, kept int
		owned, disowns, retires, listings, listed, refused, orphans                                         int
	}
	for _, seed := range seeds {
		s := runCSim(t, seed, simOpts{})
		if len(s.o.fails) > 0 {
			t.Logf("seed %d trace (last lines):\n%s", seed, strings.Join(s.trace[max(0, len(s.trace)-150):], "\n"))
			t.Fatalf("seed %d: %d violations:\n%s\n%s", seed, len(s.o.fails), strings.Join(s.o.fails[:min(10, len(s.o.fails))], "\n"), sim.ReplayHint("TestChunkSimulation", seed))
		}
		st.allocs += s.stats.allocs
		st.frees += s.stats.frees
		st.writes += s.stats.writes
		st.reads += s.stats.reads
		st.crashes += s.stats.crashes
		st.maybes += s.stats.maybes
		st.dups += s.lateDups
		st.grown += s.grown
		st.resvs += s.stats.resvs
		st.commits += s.stats.commits
		st.cancels += s.stats.cancels
		st.abandons += s.stats.abandons
		st.kept += s.stats.kept
		st.owned += s.stats.ownedAllocs
		st.disowns += s.stats.disowns
		st.retires += s.stats.retires
		st.listings += s.stats.listings
		st.listed += s.stats.listed
		st.refused += s.stats.refused
		st.orphans += s.stats.orphans
	}
	t.Logf("owned allocations: %d acknowledged, %d disowns, %d retirements, %d listings of %d chunks (%d no allocation had returned), %d allocations refused as retired",
		st.owned, st.disowns, st.retires, st.listings, st.listed, st.orphans, st.refused)
	t.Logf("%d seeds (first %d): %d allocations, %d frees, %d writes, %d reads acknowledged; %d crashes; %d allocations timed out; %d peer messages delivered twice, late; %d data RLDevs added; %d reservations, %d commits, %d chunks cancelled before their commit, %d reservations abandoned, %d kept whole; no violation",
		len(seeds), seeds[0], st.allocs, st.frees, st.writes, st.reads, st.crashes, st.maybes, st.dups, st.grown, st.resvs, st.commits, st.cancels, st.abandons, st.kept)
}

func (o *oracle) fail(format string, args ...any) {
	msg := fmt.Sprintf("%8.3fs ", o.s.w.Now().Seconds()) + fmt.Sprintf(format, args...)
	o.fails = append(o.fails, msg)
	o.s.logf("VIOLATION: %s", msg)
}

// The oracle's teeth: each rule of the manager switched off is caught
// within a few seeds.
func TestChunkOracleHasTeeth(t *testing.T) {
	if testing.Short() {
		t.Skip("a sweep of simulations: the full suite runs it")
	}
	for _, c := range []struct {
		name string
		u    unsafeRules
	}{
		{"changes acknowledged without the secondary", unsafeRules{noPeerWait: true}},
		{"ids handed out without a Reserve record", unsafeRules{noReserve: true}},
		{"freed space reused at once", unsafeRules{noQuarantine: true}},
		{"answers to an earlier lease's messages taken", unsafeRules{anyAckToken: true}},
		{"a reservation without its commit ended keeping nothing", unsafeRules{expiryFrees: true}},
		{"a retired owner's allocation accepted", unsafeRules{retireIgnore: true}},
		{"checkpoints without the chunks' owners", unsafeRules{ownersLost: true}},
		// Without the fence blocks nothing is caught: every later write
		// carries the newer token, and a primary whose lease was revoked
		// reads the map's tail again before changing it; the fence closes
		// the window between a takeover's load and its first write
		// (TestChunkLateSuperblockFenced drives a late write into it).
	} {
		caught := false
		for seed := int64(1); seed <= 100 && !caught; seed++ {
			s := runCSim(t, seed, simOpts{unsafe: c.u})
			if len(s.o.fails) > 0 {
				t.Logf("%s: seed %d: caught: %s", c.name, seed, s.o.fails[0])
				caught = true
			}
		}
		if !caught {
			t.Errorf("%s: the oracle caught nothing in seeds 1-100", c.name)
		}
	}
}

// Crash injection at every step of a checkpoint: before, between and after
// its write and the superblock's (which truncates the log), and after the
// in-memory switch; the primary restarts, the secondary takes over, and the
// oracle checks every acknowledged allocation, write and free, and the
// maps at the end.
func TestChunkCheckpointCrashPoints(t *testing.T) {
	if testing.Short() {
		t.Skip("20 simulations: the full suite runs them")
	}
	for point := 1; point <= 4; point++ {
		for seed := int64(1); seed <= 5; seed++ {
			s := runCSim(t, seed, simOpts{ckptCrash: point, noFaults: true})
			if s.ckpt != 3 {
				t.Fatalf("point %d seed %d: the crash point was not reached (%d; %d checkpoints)", point, seed, s.ckpt, s.stats.checkpoints)
			}
			if len(s.o.fails) > 0 {
				t.Logf("trace (last lines):\n%s", strings.Join(s.trace[max(0, len(s.trace)-100):], "\n"))
				t.Fatalf("point %d seed %d: %v", point, seed, s.o.fails[:min(5, len(s.o.fails))])
			}
			if seed == 1 {
				for _, l := range s.trace {
					if strings.Contains(l, "CRASH POINT") {
						t.Logf("%s; %d allocations, %d frees, %d writes acknowledged, %d checkpoints, %d times a manager served as primary", l, s.stats.allocs, s.stats.frees, s.stats.writes, s.stats.checkpoints, s.stats.takeovers)
					}
				}
			}
		}
	}
}

// shortSweep is a fixed seed sweep's length: n, or 2 under -short (the race
// phase of scripts/test.sh). The simulation is single-threaded (one
// goroutine runs every node's core on internal/sim's event queue): the race
// detector has nothing to compare in it, and the whole sweep runs in the
// full suite.
func shortSweep(n int64) int64 {
	if testing.Short() {
		return min(n, 2)
	}
	return n
}

// A checkpoint's superblock write that its primary was told failed lands
// after the primary loaded the map again: the fence block written with the
// new token first refuses it (without the fence, TestChunkOracleHasTeeth).
func TestChunkLateSuperblockFenced(t *testing.T) {
	for seed := int64(1); seed <= shortSweep(20); seed++ {
		s := runCSim(t, seed, simOpts{lateSuper: true})
		if len(s.o.fails) > 0 {
			t.Fatalf("seed %d: %v\n%s", seed, s.o.fails[:min(5, len(s.o.fails))], sim.ReplayHint("TestChunkLateSuperblockFenced", seed))
		}
	}
}
