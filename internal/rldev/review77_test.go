package rldev

import (
	"bytes"
	"testing"
	"time"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/disk"
)

// Outside review 77: grove rldev accept-stale (Table.AcceptStale, the
// CLI's gate in cmd/grove/rldev_accept.go).

// r77Accept passes the accept decree for RLDev id at the record's epoch
// now (what the CLI does once its checks pass).
func (h *harness) r77Accept(id uint64) *Record {
	h.t.Helper()
	tb := h.table()
	nr, err := tb.AcceptStale(id, tb.RLDevs[id].Epoch)
	if err != nil {
		h.t.Fatalf("accept: %v", err)
	}
	if err := h.propose(&pb.Decree{Namespace: Namespace, ExpectedVersion: tb.Version, Ops: []*pb.Op{nr.PutOp()}}); err != nil {
		h.t.Fatalf("accept decree: %v", err)
	}
	h.run()
	return nr
}

// r77StaleGate is the CLI's check (CheckAccept) of n's stale copy of
// RLDev id, with the up-to-date copy's node dead to the failure detector.
func r77StaleGate(n *hnode, id uint64) (ReplicaStatus, error) {
	var rec *Record
	if n.e.table != nil {
		rec = n.e.table.RLDevs[id]
	}
	for _, st := range n.e.Status() {
		if st.RLDev == id && !st.MoveTarget {
			st := st
			_, err := CheckAccept(rec, AcceptView{Stale: &st, UpRegistered: true, UpInc: rec.Inc[rec.Primary]})
			return st, err
		}
	}
	_, err := CheckAccept(rec, AcceptView{UpRegistered: true, UpInc: rec.Inc[rec.Primary]})
	return ReplicaStatus{}, err
}

// r77Setup: block 10 and 20 written on both; b dies (declared dead), a
// takes block 10 alone (b misses it); a dies (declared dead), its disk
// intact (powered off, say).
func r77Setup(t *testing.T, opts ...func(*harness)) (*harness, uint64, *hnode, *hnode) {
	h, id, a, b := r71Pair(t, opts...)
	h.mustWrite(a.id, id, 10, pattern(1, 1))
	h.mustWrite(a.id, id, 20, pattern(2, 1))
	h.tick(3 * time.Second)
	h.crash(b, false, nil)
	h.dead[Subject{b.id, b.inc}] = true
	h.run()
	if !h.tickUntil(10*time.Second, func() bool { return h.rec(id).State == Degraded }) {
		t.Fatalf("setup: not degraded: %+v", h.rec(id))
	}
	h.mustWrite(a.id, id, 10, pattern(3, 1)) // b misses it
	h.crash(a, false, nil)
	h.dead[Subject{a.id, a.inc}] = true
	h.run()
	return h, id, a, b
}

// The stale copy's disk was replaced while its node was down (a's,
// the only up-to-date copy, is intact but its node is powered off: dead
// to the failure detector). b's node starts; its replica is "loading"
// (here its metadata read is slow: a new engine's first load syncs and
// drops the segment's cache first, a drop leaving pages is tried again
// every RetryEvery up to 20 times). Its status says neither lost nor
// incomplete (the superblock is not read yet), so the CLI's gate passes
// (it refuses only nil, lost/incomplete and "failed", though its help
// says "up with its segment loaded"). The accept decree commits; b's
// load then finds a blank segment and formats it with Incomplete =
// r.stale() -- false now: a blank segment declared up to date. It
// serves zeros for every block, and when a comes back with its intact
// copy, that copy is overwritten whole with zeros: the RLDev's whole
// content is lost, not the one write b missed.
func TestReview77AcceptWhileStaleCopyLoadsBlankDisk(t *testing.T) {
	h, id, a, b := r77Setup(t)
	b.devs[0] = disk.NewMemDevice(testDisk, nil) // b's disk replaced
	bBase := h.rec(id).Segs[h.rec(id).SegmentOf(b.id)].Offset
	h.holdRead = func(n *hnode, x DiskRead) bool { return n == b && x.Off == bBase && x.Len == MetaSize }
	h.start(b)
	h.run()
	h.tick(time.Second)
	st, err := r77StaleGate(b, id)
	t.Logf("b's status while loading: state %q lost %v incomplete %v; the CLI's stale-copy gate: %v", st.State, st.Lost, st.Incomplete, err)
	if err == nil {
		t.Errorf("the CLI's gate passes a stale copy still loading")
	}
	h.r77Accept(id) // (what the gate now refuses: the engine must hold too)
	h.holdRead = nil
	for len(h.held) > 0 {
		h.release(0)
	}
	h.run()
	h.tick(2 * time.Second)
	rb := b.e.reps[id]
	rp := h.rvRead(b.id, id, 20, 1)
	t.Logf("after the accept: b ready %v stale %v lost %v incomplete %v; read of block 20 at b: %x... (%v)",
		rb.ready(), rb.stale(), rb.lost, rb.super.Incomplete, rp.Data[:min(2, len(rp.Data))], rp.Err)
	// a comes back, its disk intact (holding blocks 10 and 20).
	h.start(a)
	h.run()
	h.tickUntil(60*time.Second, func() bool { return h.rec(id).State == Normal })
	ra := h.rvRead(a.id, id, 20, 1)
	t.Logf("a back: record %+v; block 20 at a: %x... (%v)", h.rec(id), ra.Data[:min(2, len(ra.Data))], ra.Err)
	// Fixed: b holds nothing and serves nothing, and nothing is copied
	// from it over a's intact copy (the RLDev waits for an operator).
	if rp.Err == nil || !rb.lost {
		t.Errorf("the accepted blank copy serves (lost %v): %x... %v", rb.lost, rp.Data[:min(2, len(rp.Data))], rp.Err)
	}
	if h.rec(id).State == Normal {
		t.Errorf("the RLDev is normal again: a's intact copy was copied over from a blank one")
	}
	if rp.Err == nil && !bytes.Equal(rp.Data, pattern(2, 1)) {
		t.Fatalf("DEFECT: a blank stale segment (disk replaced, still loading when the CLI checked it) was accepted as up to date: block 20, written on both copies long before, reads %x... at b (want %x...), and a's intact copy is then overwritten with it (a reads %x...)",
			rp.Data[:2], pattern(2, 1)[:2], ra.Data[:min(2, len(ra.Data))])
	}
}

// A resync in progress when the up-to-date copy dies: b, the target,
// holds some chunks copied, every write forwarded during the resync, and
// its old data elsewhere. Accepted from the resyncing state: b serves at
// once (no copy of the dead source's left to land, none pending on b),
// takes writes; a comes back with its disk intact (holding newer
// generations of every block b missed) and is copied whole: the copies
// end identical, with b's data, and stay so through scrub passes.
func TestReview77AcceptMidResync(t *testing.T) {
	h, id, a, b := r71Pair(t, func(h *harness) { h.copyRate = 64 * BlockSize })
	for blk := uint64(0); blk < 1024; blk += 100 {
		h.mustWrite(a.id, id, blk, pattern(1, 1))
	}
	h.tick(3 * time.Second)
	h.crash(b, false, nil)
	h.dead[Subject{b.id, b.inc}] = true
	h.run()
	h.tickUntil(10*time.Second, func() bool { return h.rec(id).State == Degraded })
	for blk := uint64(0); blk < 1024; blk += 100 {
		h.mustWrite(a.id, id, blk, pattern(2, 1)) // b misses them
	}
	h.start(b)
	h.run()
	if !h.tickUntil(10*time.Second, func() bool { ra := a.e.reps[id]; return ra.resync != nil && ra.resync.copied >= 128 }) {
		t.Fatalf("setup: no resync: %+v", h.rec(id))
	}
	h.mustWrite(a.id, id, 950, pattern(5, 1)) // during the resync: forwarded to b
	copied := a.e.reps[id].resync.copied
	h.crash(a, false, nil)
	h.dead[Subject{a.id, a.inc}] = true
	h.run()
	h.tick(2 * time.Second)
	if s := h.rec(id).State; s != Resyncing {
		t.Fatalf("setup: state %v", s)
	}
	st, gate := r77StaleGate(b, id)
	t.Logf("a died after copying %d blocks; b's status %+v, gate %v", copied, st, gate)
	if gate != nil {
		t.Fatalf("the gate refuses a resync target: %v", gate)
	}
	h.r77Accept(id)
	h.tick(time.Second)
	rb := b.e.reps[id]
	t.Logf("b after the accept: ready %v stale %v lost %v primary %v; pulls %d copies %d resyncReq %v writes %d locks idle %v",
		rb.ready(), rb.stale(), rb.lost, rb.isPrimary(), len(rb.pulls), len(rb.copies), rb.resyncReq != nil, len(rb.writes), rb.locks.idle())
	var got []byte
	for blk := uint64(0); blk < 1024; blk += 100 {
		rp := h.rvRead(b.id, id, blk, 1)
		if rp.Err != nil {
			t.Fatalf("read %d at b: %v", blk, rp.Err)
		}
		got = append(got, rp.Data[0])
	}
	t.Logf("b's blocks 0, 100, ..., 1000 (1: before, 2: the writes b missed): %v", got)
	h.mustRead(b.id, id, 950, pattern(5, 1))
	h.mustWrite(b.id, id, 300, pattern(7, 1))
	h.start(a)
	h.run()
	if !h.tickUntil(60*time.Second, func() bool { r := h.rec(id); return r.State == Normal && r.Inc[r.SegmentOf(uint64(a.id))] == a.inc }) {
		t.Fatalf("never normal again: %+v", h.rec(id))
	}
	h.tick(5 * time.Second) // scrub passes
	h.sameCopies(id)
	for i, blk := 0, uint64(0); blk < 1024; i, blk = i+1, blk+100 {
		want := pattern(got[i], 1)
		if blk == 300 {
			want = pattern(7, 1)
		}
		h.mustRead(a.id, id, blk, want)
		h.mustRead(b.id, id, blk, want)
	}
}

// The up-to-date copy's node comes back (a new incarnation, its disk
// intact) after the CLI read its status (dead) but before it read the
// table: the new incarnation is named (epoch+1), serves, acknowledges a
// write. The CLI checks the node's liveness from the status it fetched
// first (rldev_accept.go: fetchStatus, then the table; "!ns.Alive" is
// tested before the replica status, and the verdict's incarnation is
// never compared with rec.Inc), and passes the decree conditional on the
// epoch of the table it read after: nothing refuses it. The live,
// up-to-date copy is made stale and its acknowledged write is given up.
// Modelled here: the dead verdict is taken on a's first incarnation, then
// a restarts and is named, then the accept at the table's epoch.
func TestReview77AcceptAfterUpToDateCopyCameBack(t *testing.T) {
	h, id, a, b := r77Setup(t)
	h.start(b)
	h.run()
	h.tick(3 * time.Second)
	deadInc := a.inc // the CLI's status: node a (this incarnation) dead
	h.start(a)       // a is back, its disk intact
	h.run()
	if !h.tickUntil(10*time.Second, func() bool { r := h.rec(id); return r.Inc[r.SegmentOf(uint64(a.id))] == a.inc }) {
		t.Fatalf("setup: a not named: %+v", h.rec(id))
	}
	h.mustWrite(a.id, id, 40, pattern(9, 1)) // acknowledged by the copy that came back
	t.Logf("status said incarnation %d dead; the table now names %d (epoch %d) and a serves", deadInc, a.inc, h.rec(id).Epoch)
	// Fixed: the CLI reads the table first, then the status; a status of
	// the past (the old incarnation's verdict) against the table now is
	// refused, as is the status now (a alive, answering with its copy).
	rec := h.rec(id)
	var bst *ReplicaStatus
	for _, st := range b.e.Status() {
		if st.RLDev == id {
			bst = &st
		}
	}
	if _, err := CheckAccept(rec, AcceptView{Stale: bst, UpRegistered: true, UpAlive: false, UpInc: deadInc}); err == nil {
		t.Errorf("accepted on a verdict about incarnation %d while the table names %d", deadInc, a.inc)
	}
	var ast *ReplicaStatus
	for _, st := range a.e.Status() {
		if st.RLDev == id {
			ast = &st
		}
	}
	if _, err := CheckAccept(rec, AcceptView{Stale: bst, UpRegistered: true, UpAlive: true, UpInc: a.inc, UpStatus: ast}); err == nil {
		t.Errorf("accepted while the up-to-date copy answers with its copy")
	}
	// And a decree at the epoch seen before a was named fails.
	if _, err := h.table().AcceptStale(id, rec.Epoch-1); err == nil {
		t.Errorf("an accept at an epoch before a was named passed")
	}
	h.mustRead(a.id, id, 40, pattern(9, 1))
}

// Both copies' nodes restart around the accept: b's new incarnation is
// loaded but not named yet (joining, its naming decree held) when the
// accept commits; a's new incarnation, its disk intact, is loaded and
// joining too (its naming decree, planned on the table before the
// accept, fails on the version). b is named and serves; a is named
// stale and copied whole (its newer generations overwritten): identical.
func TestReview77AcceptWhileBothJoining(t *testing.T) {
	h, id, a, b := r77Setup(t)
	var owner []*hnode
	h.holdPropose = func(n *hnode, x Propose) bool { owner = append(owner, n); return true }
	h.start(b)
	h.start(a)
	h.run()
	h.tick(time.Second)
	held := h.heldDecrees
	h.heldDecrees, h.holdPropose = nil, nil
	st, gate := r77StaleGate(b, id)
	t.Logf("held decrees %d; b's status %q, gate %v; a's replica %v", len(held), st.State, gate, a.e.reps[id].state)
	if gate != nil {
		t.Fatalf("gate: %v", gate)
	}
	h.r77Accept(id)
	for i, x := range held {
		n := owner[i]
		err := h.commit(x)
		h.exec(n, n.e.Decided(h.env(n), x.ID, err))
		t.Logf("held %q: %v", x.What, err)
	}
	h.run()
	if !h.tickUntil(10*time.Second, func() bool { rb := b.e.reps[id]; return rb.ready() && !rb.stale() }) {
		t.Fatalf("b never serves: %+v, b %v", h.rec(id), b.e.reps[id].state)
	}
	h.mustRead(b.id, id, 10, pattern(1, 1))
	h.mustWrite(b.id, id, 30, pattern(4, 1))
	if !h.tickUntil(60*time.Second, func() bool { r := h.rec(id); return r.State == Normal }) {
		t.Fatalf("never normal again: %+v", h.rec(id))
	}
	h.tick(5 * time.Second)
	h.sameCopies(id)
	h.mustRead(a.id, id, 10, pattern(1, 1))
	h.mustRead(a.id, id, 30, pattern(4, 1))
}

// No backstop in the engine: a stale copy that is incomplete (its disk
// replaced, formatted blank) and named under its own incarnation
// (loadedStale cleared) is declared "whole again" by an accept decree
// (takeRecord clears Incomplete) and serves zeros as up to date. Only the
// CLI's Incomplete check stands in the way (Table.AcceptStale has no
// such check, and cannot see it).
func TestReview77AcceptOfIncompleteCopyEngineBackstop(t *testing.T) {
	h, id, _, b := r77Setup(t)
	b.devs[0] = disk.NewMemDevice(testDisk, nil)
	h.start(b)
	h.run()
	h.tick(3 * time.Second)
	st, gate := r77StaleGate(b, id)
	t.Logf("b: %q incomplete %v; the CLI's gate: %v", st.State, st.Incomplete, gate)
	h.r77Accept(id) // what the CLI refuses, the table takes
	h.tick(2 * time.Second)
	rp := h.rvRead(b.id, id, 20, 1)
	t.Logf("block 20 at b after the decree: %x... (%v); b incomplete now %v", rp.Data[:min(2, len(rp.Data))], rp.Err, b.e.reps[id].super.Incomplete)
	if gate == nil {
		t.Errorf("the gate passes an incomplete copy")
	}
	// Fixed: the engine holds too: an incomplete copy declared up to
	// date other than by a resync's end serves nothing.
	if rp.Err == nil {
		t.Errorf("an incomplete copy accepted serves block 20: %x...", rp.Data[:2])
	}
	if !b.e.reps[id].super.Incomplete {
		t.Errorf("the accepted incomplete copy's superblock no longer says incomplete")
	}
}

// A second accept during the full copy that follows the first: b (the
// accepted copy) writes block 5 after the accept; a returns, intact, and
// is being copied whole (ascending) when b's node dies for good. a's
// superblock is not incomplete (its disk was never blank), so the CLI
// passes it, and a is accepted: it then holds b's post-accept write at
// block 5 and, at block 900, the very write the first accept gave up --
// a mix of two divergent histories, and a given-up write resurfacing.
// The record said FullCopy (a was being overwritten whole).
func TestReview77SecondAcceptMidFullCopy(t *testing.T) {
	h, id, a, b := r71Pair(t, func(h *harness) { h.copyRate = 64 * BlockSize })
	h.mustWrite(a.id, id, 900, pattern(1, 1))
	h.tick(3 * time.Second)
	h.crash(b, false, nil)
	h.dead[Subject{b.id, b.inc}] = true
	h.run()
	h.tickUntil(10*time.Second, func() bool { return h.rec(id).State == Degraded })
	h.mustWrite(a.id, id, 900, pattern(3, 1)) // b misses it: given up below
	h.crash(a, false, nil)
	h.dead[Subject{a.id, a.inc}] = true
	h.start(b)
	h.run()
	h.tick(2 * time.Second)
	h.r77Accept(id)
	h.tick(time.Second)
	h.mustRead(b.id, id, 900, pattern(1, 1))
	h.mustWrite(b.id, id, 5, pattern(7, 1)) // after the accept
	h.start(a)
	h.run()
	if !h.tickUntil(20*time.Second, func() bool { rb := b.e.reps[id]; return rb.resync != nil && rb.resync.copied >= 128 }) {
		t.Fatalf("setup: no full copy: %+v", h.rec(id))
	}
	h.crash(b, false, nil)
	h.dead[Subject{b.id, b.inc}] = true
	h.run()
	h.tick(2 * time.Second)
	st, gate := r77StaleGate(a, id)
	t.Logf("record %+v; a's status %q incomplete %v; the CLI's gate: %v", h.rec(id), st.State, st.Incomplete, gate)
	if gate == nil {
		t.Errorf("the gate passes a copy a full copy was being written onto")
	}
	// --mixed takes it anyway: the operator was told what it holds.
	h.r77Accept(id)
	h.tick(time.Second)
	r5, r900 := h.rvRead(a.id, id, 5, 1), h.rvRead(a.id, id, 900, 1)
	t.Logf("a after the second accept: block 5 %x... (b's post-accept write 07), block 900 %x... (01 served since the first accept; 03 the write it gave up)",
		r5.Data[:min(2, len(r5.Data))], r900.Data[:min(2, len(r900.Data))])
	if r5.Err != nil || r900.Err != nil {
		t.Errorf("the copy accepted with --mixed does not serve: %v, %v", r5.Err, r900.Err)
	}
}
