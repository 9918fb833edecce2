package rldev

import (
	"testing"
	"time"

	pb "github.com/grovestore/grove/api/grovepb"
)

// Outside review 80: grove rldev accept-stale (accept.go: CheckAccept,
// Table.AcceptStale; replica.go: staleSeen, AcceptedEpoch, takeRecord).

// r80FirstAccept: block 900 written on both (01); b dies, a takes block
// 900 alone (03, b misses it); a dies; b is accepted (serves 01) and
// writes block 5 (07) after the accept. Returns with a down (its disk
// intact, holding 03 at block 900) and b the primary, a stale, FullCopy.
func r80FirstAccept(t *testing.T) (*harness, uint64, *hnode, *hnode) {
	h, id, a, b := r71Pair(t, func(h *harness) { h.copyRate = 64 * BlockSize })
	h.mustWrite(a.id, id, 900, pattern(1, 1))
	h.tick(3 * time.Second)
	h.crash(b, false, nil)
	h.dead[Subject{b.id, b.inc}] = true
	h.run()
	if !h.tickUntil(10*time.Second, func() bool { return h.rec(id).State == Degraded }) {
		t.Fatalf("setup: not degraded: %+v", h.rec(id))
	}
	h.mustWrite(a.id, id, 900, pattern(3, 1)) // b misses it: given up below
	h.crash(a, false, nil)
	h.dead[Subject{a.id, a.inc}] = true
	h.start(b)
	h.run()
	h.tick(2 * time.Second)
	if _, gate := r77StaleGate(b, id); gate != nil {
		t.Fatalf("setup: the gate refuses the first accept: %v", gate)
	}
	h.r77Accept(id)
	h.tick(time.Second)
	h.mustRead(b.id, id, 900, pattern(1, 1))
	h.mustWrite(b.id, id, 5, pattern(7, 1)) // after the accept
	return h, id, a, b
}

// The full copy onto the given-up copy a (after a first accept) is
// stopped part-way by a's node going down: the RLDev goes back to
// degraded ("resync stopped"), FullCopy still set, Progress reset to 0.
// Then b, the accepted copy, dies for good; a's node comes back. a now
// holds a mix of two divergent histories: block 5 copied from b (07,
// written after the first accept) and block 900 of its own (03, the write
// the first accept gave up). CheckAccept refuses such a copy without
// --mixed only while the state is Resyncing (rec.State == Resyncing &&
// rec.FullCopy): in Degraded it passes, and nothing in the record or in
// a's status (not incomplete: its disk was never blank) says that a full
// copy was ever being written onto a. Accepted, a serves the mix.
func TestReview80SecondAcceptAfterStoppedFullCopy(t *testing.T) {
	h, id, a, b := r80FirstAccept(t)
	h.start(a) // intact disk: stale, copied whole from b (ascending)
	h.run()
	if !h.tickUntil(20*time.Second, func() bool { rb := b.e.reps[id]; return rb.resync != nil && rb.resync.copied >= 128 }) {
		t.Fatalf("setup: no full copy: %+v", h.rec(id))
	}
	copied := b.e.reps[id].resync.copied
	// a's node goes down mid-copy (a reboot, say): b stops the resync.
	h.crash(a, false, nil)
	h.run()
	if !h.tickUntil(10*time.Second, func() bool { return h.rec(id).State == Degraded }) {
		t.Fatalf("setup: the resync did not stop: %+v", h.rec(id))
	}
	t.Logf("the full copy stopped after %d blocks; record %+v", copied, h.rec(id))
	// b's node dies for good; a's comes back.
	h.crash(b, false, nil)
	h.dead[Subject{b.id, b.inc}] = true
	h.start(a)
	h.run()
	h.tick(3 * time.Second)
	st, gate := r77StaleGate(a, id)
	t.Logf("record %+v; a's status %q stale %v incomplete %v lost %v; the CLI's gate (no --mixed): %v",
		h.rec(id), st.State, st.Stale, st.Incomplete, st.Lost, gate)
	if gate == nil {
		h.r77Accept(id)
		h.tick(time.Second)
		r5, r900 := h.rvRead(a.id, id, 5, 1), h.rvRead(a.id, id, 900, 1)
		t.Logf("a after the accept: block 5 %x... (%v), block 900 %x... (%v)", r5.Data[:min(2, len(r5.Data))], r5.Err, r900.Data[:min(2, len(r900.Data))], r900.Err)
		t.Fatalf("DEFECT: CheckAccept passes (without --mixed) a copy a full copy was being written onto once that full copy stopped (the RLDev back to degraded, FullCopy still set): accepted, a serves block 5 = %x (b's write after the first accept) beside block 900 = %x (the write the first accept gave up, resurfacing): two histories mixed",
			r5.Data[:min(1, len(r5.Data))], r900.Data[:min(1, len(r900.Data))])
	}
}

// A move of the secondary's segment is copying to its target (node c)
// when the secondary's node s crashes (its disk intact) and is declared
// dead: moveDegraded puts the target in s's place, stale and due for a
// full copy, and lists s's extent as retiring. The rebuild onto the
// target is slow; before it ends, the primary p's node dies for good.
// Without the move, s's copy (every write up to its crash) could be
// accepted, giving up only the one write it missed. With it: the target
// is incomplete (CheckAccept refuses it, even with --mixed), and s's node,
// back, wipes its old extent (retiring): every block of the RLDev is
// gone, not just the write s missed.
func TestReview80MoveDegradeDiscardsAcceptableCopy(t *testing.T) {
	h := newHarness(t, 3, testDisk, func(h *harness) { h.copyRate = 64 * BlockSize })
	r := h.create(1024)
	id := r.ID
	p, s := h.nodes[r.Segs[r.Primary].Node], h.nodes[r.Segs[1-r.Primary].Node]
	var tg *hnode
	for _, n := range h.sorted() {
		if n != p && n != s {
			tg = n
		}
	}
	h.mustWrite(p.id, id, 700, pattern(1, 1))
	h.mustWrite(p.id, id, 10, pattern(2, 1))
	h.tick(3 * time.Second)
	h.rmStartMove(id, 1-r.Primary, tg.id)
	if !h.tickUntil(20*time.Second, h.rmCopied(p.id, id, 128)) {
		t.Fatalf("setup: no move copy: %+v", h.rec(id))
	}
	// s's node crashes mid-move, declared dead: the target replaces it.
	h.crash(s, false, nil)
	h.dead[Subject{s.id, s.inc}] = true
	h.run()
	if !h.tickUntil(10*time.Second, func() bool { rc := h.rec(id); return rc.State != Normal }) {
		t.Fatalf("setup: not degraded: %+v", h.rec(id))
	}
	h.mustWrite(p.id, id, 10, pattern(3, 1)) // s misses it
	t.Logf("after s's death: %+v", h.rec(id))
	// p's node dies for good before the rebuild onto the target ends.
	h.tick(time.Second)
	h.crash(p, false, nil)
	h.dead[Subject{p.id, p.inc}] = true
	h.run()
	// s's node comes back, its disk intact.
	h.start(s)
	h.run()
	h.tick(5 * time.Second)
	rec := h.rec(id)
	st, gate := r77StaleGate(tg, id)
	_, mixedGate := CheckAccept(rec, AcceptView{Stale: &st, UpRegistered: true, UpInc: rec.Inc[rec.Primary], Mixed: true})
	t.Logf("with --mixed: %v", mixedGate)
	old := r.Segs[1-r.Primary] // s's extent before the move

	raw := s.devs[old.Disk].Platter(old.Offset+blockOff(700), PhysBlockSize)
	d, _, bst := DecodeBlock(raw, id, 700)
	t.Logf("record %+v; target's status %q stale %v incomplete %v; the CLI's gate: %v; s's old extent, block 700: %v %x...", rec, st.State, st.Stale, st.Incomplete, gate, bst, d[:min(2, len(d))])
	if gate != nil && (bst != BlockOK || d[0] != 1) {
		t.Fatalf("DEFECT: s's copy (disk intact, missing only the write at block 10) was dropped for a move target still being rebuilt: the target cannot be accepted (%v) and s's old extent is wiped (block 700: %v): the RLDev's every block is lost, not just the write s missed", gate, bst)
	}
	// Fixed (moveDegraded keeps a dead node's moving segment): the
	// operator cancels the move and accepts s's copy, giving up only the
	// write at block 10.
	if rec.Segs[rec.SegmentOf(uint64(s.id))] != old || rec.Move == nil {
		t.Fatalf("s's segment not kept in place with the move waiting: %+v", rec)
	}
	tb := h.table()
	nr, err := tb.CancelMove(id)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.propose(&pb.Decree{Namespace: Namespace, ExpectedVersion: tb.Version, Ops: []*pb.Op{nr.PutOp()}}); err != nil {
		t.Fatal(err)
	}
	h.run()
	h.tick(2 * time.Second)
	if _, err := r77StaleGate(s, id); err != nil {
		t.Fatalf("s's copy, the move cancelled: %v (record %+v)", err, h.rec(id))
	}
	h.r77Accept(id)
	if !h.tickUntil(10*time.Second, func() bool { r := h.rvRead(s.id, id, 700, 1); return r.Err == nil }) {
		t.Fatalf("s does not serve after the accept: %+v", h.rec(id))
	}
	if r := h.rvRead(s.id, id, 700, 1); r.Err != nil || r.Data[0] != 1 {
		t.Fatalf("block 700 after the accept: %v %x", r.Err, r.Data[:1])
	}
	if r := h.rvRead(s.id, id, 10, 1); r.Err != nil || r.Data[0] != 2 {
		t.Fatalf("block 10 after the accept: %v %x (want s's own, 02: only the write s missed is given up)", r.Err, r.Data[:1])
	}
}

// The up-to-date copy's node a restarts (incarnation i2) and dies again
// before its replica is named (here its disk hangs on the first metadata
// read: the replica stays loading; a node whose disk fails as it loads is
// never named either: a failed replica asks for nothing while its peer is
// stale). The table still names i1. Both are dead to the failure
// detector, and neither served after b went stale other than i1. The
// CLI's gate compares the registered incarnation with the table's first
// (v.UpInc != rec.Inc[up]) and refuses, "its copy will serve once
// loaded", whether or not that incarnation is alive: with a's node gone
// for good, b can never be accepted (the RLDev serves nothing for good);
// each restart of a on its failing disk ends the same way.
func TestReview80AcceptRefusedForDeadUnnamedIncarnation(t *testing.T) {
	h, id, a, b := r77Setup(t)
	h.start(b)
	h.run()
	h.tick(3 * time.Second)
	named := h.rec(id).Inc[h.rec(id).SegmentOf(uint64(a.id))]
	aBase := h.rec(id).Segs[h.rec(id).SegmentOf(uint64(a.id))].Offset
	h.holdRead = func(n *hnode, x DiskRead) bool { return n == a && x.Off == aBase && x.Len == MetaSize }
	h.start(a) // its disk hangs: loading, never named
	h.run()
	h.tick(3 * time.Second)
	h.crash(a, false, nil) // powered off for good
	h.dead[Subject{a.id, a.inc}] = true
	h.held, h.holdRead = nil, nil
	h.run()
	rec := h.rec(id)
	var bst *ReplicaStatus
	for _, st := range b.e.Status() {
		if st.RLDev == id && !st.MoveTarget {
			st := st
			bst = &st
		}
	}
	gone, err := CheckAccept(rec, AcceptView{Stale: bst, UpRegistered: true, UpAlive: false, UpInc: a.inc})
	t.Logf("table names a's incarnation %d (dead); a's registered incarnation %d, dead, never named; b's status %+v; gate: %q %v", named, a.inc, *bst, gone, err)
	if rec.Inc[rec.SegmentOf(uint64(a.id))] == a.inc {
		t.Fatalf("setup: a's new incarnation was named: %+v", rec)
	}
	if err != nil {
		t.Fatalf("DEFECT: accept-stale is refused for good once the up-to-date copy's node died again before its new incarnation was named: both incarnations are dead to the failure detector, nothing can serve a's copy, yet CheckAccept says %q", err)
	}
}
