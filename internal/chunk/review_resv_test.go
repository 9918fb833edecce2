package chunk

// An outside review of allocation batching (reservations; a helper's,
// 2026-11-25). Each TestReviewResv* test asserts what the documentation
// promises and failed on the defect it demonstrated, before its fix.
//
// rvH is a small deterministic harness: one pair's two real Managers
// driven synchronously (a FIFO of effects), over an in-memory map RLDev,
// a lock service with cached leases (revoked on demand once the holder's
// hold ends, each grant a newer token), a config service that commits
// every decree, and a failure detector that says dead only when told.
// Peer messages can be held back (a slow or partitioned secondary).

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/lock"
)

func reviewOnly(t *testing.T) { t.Helper() }

type rvNode struct {
	id      NodeID
	inc     uint64
	mg      *Manager
	mode    lock.Mode // the cached lease
	tok     lock.Token
	holds   int
	nextReq ReqID
	replies map[ReqID]Reply
}

type rvWait struct {
	n    *rvNode
	mg   *Manager
	op   OpID
	mode lock.Mode
}

type rvH struct {
	t      *testing.T
	now    time.Time
	cfg    Config
	mapDev []byte
	pair   *Pair
	ver    uint64
	nodes  map[NodeID]*rvNode
	seq    uint64
	q      []func()
	waits  []rvWait
	dead   map[Subject]bool
	// hold: peer messages it returns true for are kept in held until
	// release.
	hold func(from, to NodeID, msg any) bool
	held []func()
	// zeroErr, if set, is each new chunk's zeroing's outcome.
	zeroErr func(ZeroWrite) error
}

func newRvH(t *testing.T, mapBlocks, dataBlocks uint64, cfg Config) *rvH {
	h := &rvH{t: t, now: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC), cfg: cfg, mapDev: make([]byte, mapBlocks*BlockSize),
		pair: &Pair{ID: 1, Nodes: [2]uint64{1, 2}, Primary: 0, MapRLDev: 100, MapBlocks: mapBlocks, Data: []DataRLDev{{ID: 101, Blocks: dataBlocks}}},
		ver:  1, nodes: map[NodeID]*rvNode{}, dead: map[Subject]bool{}}
	for _, id := range []NodeID{1, 2} {
		h.nodes[id] = &rvNode{id: id}
		h.startNode(id)
	}
	// Node 2 first: it waits for node 1 to format the map; node 1 formats,
	// is decreed primary; node 2 then joins as secondary.
	h.exec(h.nodes[2], h.nodes[2].mg.SetPair(h.env(), h.pair.Clone(), h.ver, true))
	h.exec(h.nodes[1], h.nodes[1].mg.SetPair(h.env(), h.pair.Clone(), h.ver, true))
	h.run()
	if st := h.nodes[1].mg.st; st != stPrimary || h.nodes[1].mg.busy {
		t.Fatalf("node 1 is %s (busy %v), not an idle primary", st, h.nodes[1].mg.busy)
	}
	if st := h.nodes[2].mg.st; st != stSecondary {
		t.Fatalf("node 2 is %s, not secondary", st)
	}
	return h
}

func (h *rvH) startNode(id NodeID) {
	n := h.nodes[id]
	n.inc++
	n.mode, n.holds, n.replies = lock.None, 0, map[ReqID]Reply{}
	c := h.cfg
	c.Node, c.Inc, c.CM = id, n.inc, 1
	n.mg = NewManager(c)
}

func (h *rvH) env() Env { return Env{Now: h.now, Deadline: h.now.Add(time.Hour)} }

// exec queues a manager's effects (run carries them out).
func (h *rvH) exec(n *rvNode, out []any) {
	mg := n.mg
	for _, o := range out {
		o := o
		h.q = append(h.q, func() { h.effect(n, mg, o) })
	}
}

func (h *rvH) run() {
	for len(h.q) > 0 {
		f := h.q[0]
		h.q = h.q[1:]
		f()
	}
}

func (h *rvH) effect(n *rvNode, mg *Manager, o any) {
	if n.mg != mg {
		return // a past incarnation's
	}
	env := h.env()
	switch x := o.(type) {
	case MapRead:
		data := bytes.Clone(h.mapDev[x.Block*BlockSize : (x.Block+x.Blocks)*BlockSize])
		h.exec(n, mg.Done(env, x.Op, data, nil))
	case MapWrite:
		if x.RLDev == 0 {
			copy(h.mapDev[x.Block*BlockSize:], x.Data)
		}
		h.exec(n, mg.Done(env, x.Op, nil, nil))
	case ZeroWrite:
		var err error
		if h.zeroErr != nil {
			err = h.zeroErr(x)
		}
		h.exec(n, mg.Done(env, x.Op, nil, err))
	case Acquire:
		if n.mode >= x.Mode {
			n.holds++
			h.exec(n, mg.Granted(env, x.Op, n.tok, nil))
			return
		}
		h.waits = append(h.waits, rvWait{n, mg, x.Op, x.Mode})
		h.pumpLock()
	case CancelAcquire:
		for i, w := range h.waits {
			if w.n == n && w.op == x.Op {
				h.waits = append(h.waits[:i], h.waits[i+1:]...)
				break
			}
		}
	case Release:
		if n.holds > 0 {
			n.holds--
		}
		if x.Drop {
			n.mode = lock.None
		}
		h.pumpLock()
	case Send:
		to := h.nodes[x.To]
		deliver := func() {
			if to != nil && to.mg != nil {
				h.exec(to, to.mg.Deliver(h.env(), n.id, x.Msg))
			}
		}
		if h.hold != nil && h.hold(n.id, x.To, x.Msg) {
			h.held = append(h.held, deliver)
			return
		}
		deliver()
	case Reply:
		n.replies[x.Req] = x
	case AskDead:
		inc := x.Subject.Inc
		if inc == 0 {
			inc = h.nodes[x.Subject.Node].inc
		}
		h.exec(n, mg.Verdict(env, x.Subject, inc, h.dead[Subject{x.Subject.Node, inc}]))
	case Propose:
		if x.Version != h.ver {
			h.exec(n, mg.Decided(env, x.Op, 0, fmt.Errorf("stale version %d (now %d)", x.Version, h.ver)))
			return
		}
		h.pair, h.ver = x.Pair.Clone(), h.ver+1
		h.exec(n, mg.Decided(env, x.Op, h.ver, nil))
		for _, o := range []NodeID{1, 2} {
			if m := h.nodes[o]; m != n && m.mg != nil {
				h.exec(m, m.mg.SetPair(env, h.pair.Clone(), h.ver, false))
			}
		}
	case Refresh:
		h.exec(n, mg.SetPair(env, h.pair.Clone(), h.ver, true))
	case Log:
		if os.Getenv("GROVE_REVIEW_LOG") != "" {
			h.t.Logf("node %d.%d: %s %v", n.id, n.inc, x.Msg, x.Args)
		}
	default:
		h.t.Fatalf("unknown effect %T", o)
	}
}

// pumpLock grants waiters in order, revoking conflicting leases whose
// holders hold nothing now (down to shared for a shared waiter).
func (h *rvH) pumpLock() {
	for len(h.waits) > 0 {
		w := h.waits[0]
		if w.n.mg != w.mg {
			h.waits = h.waits[1:]
			continue
		}
		blocked := false
		for _, o := range h.nodes {
			if o == w.n || lock.Compatible(o.mode, w.mode) {
				continue
			}
			if o.holds > 0 {
				blocked = true
				continue
			}
			o.mode = lock.None
			if w.mode == lock.Shared {
				o.mode = lock.Shared
			}
		}
		if blocked {
			return
		}
		h.waits = h.waits[1:]
		h.seq++
		w.n.mode, w.n.tok = max(w.n.mode, w.mode), lock.Token{Epoch: 1, Seq: h.seq}
		w.n.holds++
		n, mg, op, tok := w.n, w.mg, w.op, w.n.tok
		h.q = append(h.q, func() {
			if n.mg == mg {
				h.exec(n, mg.Granted(h.env(), op, tok, nil))
			}
		})
	}
}

// release delivers the held peer messages and stops holding.
func (h *rvH) release() {
	h.hold = nil
	held := h.held
	h.held = nil
	for _, f := range held {
		h.q = append(h.q, f)
	}
	h.run()
}

// call makes a client request at node id (its effects run at the next run).
func (h *rvH) call(id NodeID, f func(mg *Manager, env Env, req ReqID) []any) ReqID {
	n := h.nodes[id]
	n.nextReq++
	req := n.nextReq
	h.exec(n, f(n.mg, h.env(), req))
	return req
}

func (h *rvH) reply(id NodeID, req ReqID) (Reply, bool) {
	r, ok := h.nodes[id].replies[req]
	return r, ok
}

// mustReply runs the harness and returns request req's answer.
func (h *rvH) mustReply(id NodeID, req ReqID) Reply {
	h.t.Helper()
	h.run()
	r, ok := h.reply(id, req)
	if !ok {
		h.t.Fatalf("request %d at node %d: no answer", req, id)
	}
	return r
}

func (h *rvH) tick(id NodeID) {
	n := h.nodes[id]
	if n.mg != nil {
		h.exec(n, n.mg.Tick(h.env()))
	}
	h.run()
}

func (h *rvH) reserve(size uint64, count int) Handle {
	h.t.Helper()
	r := h.mustReply(1, h.call(1, func(mg *Manager, env Env, req ReqID) []any { return mg.Reserve(env, req, size, count) }))
	if r.Err != nil {
		h.t.Fatalf("reserve: %v", r.Err)
	}
	return r.Handle
}

func (h *rvH) commit(resv uint64, live ...uint64) ReqID {
	return h.call(1, func(mg *Manager, env Env, req ReqID) []any { return mg.Commit(env, req, resv, live) })
}

// isChunk reports whether id is a chunk at node id's manager (Admit).
func (h *rvH) isChunk(node NodeID, id uint64) (bool, error) {
	n := h.nodes[node]
	_, err := n.mg.Admit(h.env(), id, 0, 1)
	if err == nil {
		n.mg.Finished(h.env(), id)
		return true, nil
	}
	return false, err
}

func holdUpdates(from, to NodeID, msg any) bool {
	_, ok := msg.(Update)
	return ok && from == 1
}

func reviewCfg() Config {
	return Config{ResvLife: 10 * time.Second, Quarantine: 3 * time.Second, RetryEvery: 500 * time.Millisecond, PollEvery: 500 * time.Millisecond}
}

// ---------------------------------------------------------------- the defects

// Expiry racing a commit: the clerk's commit arrives while the primary's
// own expiry of the reservation (ResvLife passed) is queued or in flight.
// Commit takes it for a retry of that request and answers it with the
// expiry's outcome: OK. The expiry kept every chunk, so the chunk the
// clerk freed before its commit (R+2) is allocated, and so are R+3, R+4,
// never handed out. Told OK, the Batcher frees none of them (it frees
// what it did not keep only on ErrUnallocated): a chunk freed before its
// commit became a chunk although the clerk is alive, and leaks for good.
func TestReviewResvExpiryAbsorbsCommit(t *testing.T) {
	reviewOnly(t)
	h := newRvH(t, 600, 4096, reviewCfg())
	R := h.reserve(4096, 4).ID
	// The clerk handed out R+1 and R+2 and freed R+2 (no message); its
	// commit is late (a partition, a slow network, a failover).
	h.now = h.now.Add(h.cfg.ResvLife + time.Second)
	h.hold = holdUpdates // the secondary is slow: the expiry's change waits for it
	h.tick(1)
	req := h.commit(R, R+1)
	h.run()
	h.release()
	r, ok := h.reply(1, req)
	if !ok {
		t.Fatal("the commit was not answered")
	}
	isR2, _ := h.isChunk(1, R+2)
	isR4, _ := h.isChunk(1, R+4)
	t.Logf("commit of reservation %d keeping %d: answered %v; chunk %d (freed before the commit) allocated: %v; chunk %d (never handed out) allocated: %v", R, R+1, r.Err, R+2, isR2, R+4, isR4)
	if r.Err == nil && (isR2 || isR4) {
		t.Errorf("DEFECT: the clerk's commit was answered OK, yet the reservation was closed by its expiry keeping every chunk: %d, freed before the commit, is a chunk (and %d, never handed out); the Batcher, told OK, never frees them", R+2, R+4)
	}
}

// A commit sent again with a different live list while the first is still
// in flight (a Batcher's commitLocked whose context ended -- the flusher
// gives each try FlushEvery -- keeps the reservation, and its user may
// free a handed-out chunk, which only drops it from live, before the next
// try) is taken for a retry and answered with the first: the chunk freed
// before the commit that was acknowledged becomes a chunk.
func TestReviewResvCommitRetryShorterLive(t *testing.T) {
	reviewOnly(t)
	h := newRvH(t, 600, 4096, reviewCfg())
	R := h.reserve(4096, 4).ID
	h.hold = holdUpdates
	first := h.commit(R, R+1, R+2) // its answer never reaches the clerk
	h.run()
	second := h.commit(R, R+1) // after Batcher.Free(R+2)
	h.run()
	h.release()
	r1, _ := h.reply(1, first)
	r2, ok := h.reply(1, second)
	if !ok {
		t.Fatal("the second commit was not answered")
	}
	isR2, _ := h.isChunk(1, R+2)
	t.Logf("commit [%d %d]: %v; commit [%d]: %v; %d allocated: %v", R+1, R+2, r1.Err, R+1, r2.Err, R+2, isR2)
	if r2.Err == nil && isR2 {
		t.Errorf("DEFECT: the commit keeping only %d was answered OK, yet %d (freed before it) is a chunk: the manager answered it with an earlier attempt's different live list", R+1, R+2)
	}
}

// The same with a longer list (the Batcher handed out R+2 after a commit
// attempt that failed, then a write of R+2 commits first): the second
// commit is answered OK, but R+2 was never allocated: a handle the
// Batcher handed out and whose commit was acknowledged is lost.
func TestReviewResvCommitRetryLongerLive(t *testing.T) {
	reviewOnly(t)
	h := newRvH(t, 600, 4096, reviewCfg())
	R := h.reserve(4096, 4).ID
	h.hold = holdUpdates
	h.commit(R, R+1)
	h.run()
	second := h.commit(R, R+1, R+2)
	h.run()
	h.release()
	r2, ok := h.reply(1, second)
	if !ok {
		t.Fatal("the second commit was not answered")
	}
	isR2, err := h.isChunk(1, R+2)
	t.Logf("commit [%d %d]: %v; %d allocated: %v (%v)", R+1, R+2, r2.Err, R+2, isR2, err)
	if r2.Err == nil && !isR2 {
		t.Errorf("DEFECT: the commit naming %d was answered OK, but %d is not a chunk (%v): a handle handed out and acknowledged is lost", R+2, R+2, err)
	}
}

// The Batcher's sequence after a commit attempt that took effect but whose
// answer was lost (commitLocked returns the error and keeps b.cur; the
// next Allocate hands out R+2 from the same reservation; a write of R+2
// commits first; the primary answers ErrUnallocated -- "committed by an
// earlier attempt, or kept whole" -- and commitLocked then treats every
// live chunk as kept and clears b.cur). R+2 was dropped by the first
// commit: the Batcher's write of it fails "unallocated", and the handle
// is lost although the clerk never died.
func TestReviewResvBatcherHandoutAfterLostCommit(t *testing.T) {
	reviewOnly(t)
	h := newRvH(t, 600, 4096, reviewCfg())
	R := h.reserve(4096, 4).ID
	// Flush: commit [R+1]; it takes effect, its answer is lost (the
	// flusher's context, FlushEvery, ends first; or a failover).
	if r := h.mustReply(1, h.commit(R, R+1)); r.Err != nil {
		t.Fatalf("first commit: %v", r.Err)
	}
	// Fixed: the Batcher sealed [R+1] at that attempt: it hands out
	// nothing more from R and sends the same list again, which finds R
	// no longer open; it then frees what it did not keep (R+2..R+4,
	// never chunks: each free finds it unallocated), and R+1 stays.
	r := h.mustReply(1, h.commit(R, R+1))
	if !errors.Is(r.Err, ErrUnallocated) {
		t.Fatalf("the same list again: %v (want not open)", r.Err)
	}
	if ok, err := h.isChunk(1, R+1); !ok {
		t.Fatalf("%d, committed, is not a chunk: %v", R+1, err)
	}
	if ok, _ := h.isChunk(1, R+2); ok {
		t.Fatalf("%d, never handed out, is a chunk", R+2)
	}
}

// MaxEntries: the primary counts its present quarantine, but a reload (a
// takeover) quarantines anew every run the log's records freed that is
// free now -- here the unused slots of a closed reservation (one run per
// gap) and some frees, whose quarantine had long ended at the old primary.
// The new primary's map then holds more checkpoint entries than a slot
// can: its checkpoint (at once: the log is half full) panics; every
// takeover does the same, and the pair cannot fail over.
func TestReviewResvReloadOverflowsCheckpoint(t *testing.T) {
	reviewOnly(t)
	// 71 blocks: a log of 64 blocks and checkpoint slots of 2 (254 entries).
	h := newRvH(t, 71, 4096, reviewCfg())
	maxE := h.nodes[1].mg.sup.Layout.MaxEntries()
	R := h.reserve(4096, 200).ID
	var live []uint64
	for i := uint64(2); i <= 200; i += 2 {
		live = append(live, R+i)
	}
	if r := h.mustReply(1, h.commit(R, live...)); r.Err != nil {
		t.Fatalf("commit: %v", r.Err)
	}
	// 100 one-block gaps, quarantined; their quarantine ends.
	h.now = h.now.Add(h.cfg.Quarantine + time.Second)
	h.tick(1)
	// Fill the map up to MaxEntries with two-block chunks (which the
	// one-block gaps cannot hold).
	var reqs []ReqID
	for i := 0; i < 153; i++ { // (one entry kept for a quarantined run since review 72)
		reqs = append(reqs, h.call(1, func(mg *Manager, env Env, req ReqID) []any { return mg.Allocate(env, req, 8192) }))
	}
	h.run()
	var hs []Handle
	for _, q := range reqs {
		r, ok := h.reply(1, q)
		if !ok || r.Err != nil {
			t.Fatalf("allocation: %v %v", ok, r.Err)
		}
		hs = append(hs, r.Handle)
	}
	// Thirty frees, a frame each (the log passes half full).
	for _, x := range hs[:30] {
		id := x.ID
		if r := h.mustReply(1, h.call(1, func(mg *Manager, env Env, req ReqID) []any { return mg.Free(env, req, id) })); r.Err != nil {
			t.Fatalf("free: %v", r.Err)
		}
	}
	m := h.nodes[1].mg.m
	t.Logf("old primary: %d chunks + %d quarantined runs + %d reserved = %d entries of %d; log %d of %d blocks",
		len(m.chunks), len(m.quarantined()), m.reservedChunks(), uint64(len(m.chunks)+len(m.quarantined()))+m.reservedChunks(), maxE,
		h.nodes[1].mg.logPos-blockLog, h.nodes[1].mg.sup.Layout.LogBlocks)
	// The primary's node crashes; the secondary takes over.
	h.nodes[1].mg, h.nodes[1].mode, h.nodes[1].holds = nil, lock.None, 0
	h.dead[Subject{1, 1}] = true
	h.now = h.now.Add(time.Second)
	var panicked any
	func() {
		defer func() { panicked = recover() }()
		h.tick(2)
		h.now = h.now.Add(time.Second)
		h.tick(2)
	}()
	if panicked != nil {
		t.Errorf("DEFECT: the takeover panicked: %v", panicked)
		return
	}
	n2 := h.nodes[2].mg
	t.Logf("node 2 is %s", n2.st)
	if n2.m != nil {
		_, c := n2.m.checkpointIn(uint64(n2.sup.Layout.SlotBlocks) * BlockSize)
		if uint64(len(c)) > uint64(n2.sup.Layout.SlotBlocks)*BlockSize {
			t.Errorf("DEFECT: the new primary's map needs a checkpoint of %d bytes; a slot holds %d", len(c), uint64(n2.sup.Layout.SlotBlocks)*BlockSize)
		}
	}
}
