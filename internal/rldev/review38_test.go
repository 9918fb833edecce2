package rldev

import (
	"bytes"
	"testing"
	"time"
)

// TestReview38LateRepairReadWritesOldDataAfterReload (review 38): a read
// repair of the failed life (rewriteBad) whose disk read was still in
// flight when the replica loaded again (replica.retry reset the range
// locks; reads were not counted) completed in the new life: it wrote the
// peer's copy of the block as the failed life pulled it, under a range
// lock that no longer ordered anything, concurrently with the new life's
// resync copy of that block. The copy landed first, the stale repair
// second: once resynced, the replica served the block's old content,
// though a newer write was acknowledged before. Now a replica loads again
// only once none of its reads is in progress either: the repair finishes
// in the failed life, and the resync copies the block after it.
func TestReview38LateRepairReadWritesOldDataAfterReload(t *testing.T) {
	h := newHarness(t, 2, testDisk, func(h *harness) { h.scrubRate = -1 })
	rec := h.create(512)
	p, s := rec.Segs[0].Node, rec.Segs[1].Node // p primary, s (node a) the secondary
	h.mustWrite(p, rec.ID, 10, pattern(1, 1))  // D1 on both
	a := h.nodes[s]
	base := rec.Segs[1].Offset
	a.devs[rec.Segs[1].Disk].FlipBit(base+blockOff(10)+HeaderSize+100, 3) // block 10 rots at a

	// A read at a finds block 10 bad and repairs it from p (D1); the
	// repair's read of the block under its exclusive range lock hangs.
	runReads := 0
	h.holdRead = func(n *hnode, x DiskRead) bool {
		if n == a && x.Run != nil && x.Off == base+blockOff(10) && x.Run.N == 1 {
			runReads++
			return runReads == 2
		}
		return false
	}
	h.nextReq++
	r0 := h.nextReq
	h.exec(a, a.e.Read(h.env(a), r0, rec.ID, 10, 1, -1))
	h.run()
	if len(h.held) != 1 {
		t.Fatalf("setup: the repair's read not held (%d held, reply %+v)", len(h.held), h.replies[r0])
	}
	h.holdRead = nil
	readR := h.held[0]
	h.held = nil

	// a's disk fails on a forwarded write: a leaves (stale), p degraded.
	h.failWrite = func(n *hnode, x DiskWrite) bool { return n == a && x.Encode != nil && x.Off == base+blockOff(100) }
	h.nextReq++
	w0 := h.nextReq
	h.exec(h.nodes[p], h.nodes[p].e.Write(h.env(h.nodes[p]), w0, rec.ID, 100, pattern(9, 1), nil, -1))
	h.run()
	h.failWrite = nil
	if !h.tickUntil(3*time.Second, func() bool { r := h.rec(rec.ID); return r.State == Degraded && r.Stale[1] }) {
		t.Fatalf("setup: record %+v, want degraded, segment 1 stale", h.rec(rec.ID))
	}
	// W: block 10 = D2, acknowledged by p alone.
	h.nextReq++
	w := h.nextReq
	h.exec(h.nodes[p], h.nodes[p].e.Write(h.env(h.nodes[p]), w, rec.ID, 10, pattern(2, 1), nil, -1))
	h.run()
	if rp, ok := h.replies[w]; !ok || rp.Err != nil {
		t.Fatalf("W: %+v (replied %v)", rp.Err, ok)
	}

	// ReloadEvery later a still does not load again: the failed life's
	// repair read is in progress (before the fix it did, and the read,
	// completing in the new life, wrote D1 under a lock the reload had
	// dropped, over the resync's copy of D2).
	if h.tickUntil(10*time.Second, func() bool { return a.e.reps[rec.ID].state != repFailed }) {
		t.Fatalf("a loaded again (state %v) while a read of its failed life is in progress", a.e.reps[rec.ID].state)
	}
	// The read completes (block 10 still bad on disk): the failed life's
	// repair goes on in the failed life; then a loads again and is
	// resynced, its copy of block 10 (D2) after anything of that life.
	readR()
	h.run()
	if !h.tickUntil(20*time.Second, func() bool { r := h.rec(rec.ID); return r.State == Normal && !r.Stale[1] }) {
		t.Fatalf("not resynced: %+v (a: %v)", h.rec(rec.ID), a.e.reps[rec.ID].state)
	}

	h.nextReq++
	q := h.nextReq
	h.exec(a, a.e.Read(h.env(a), q, rec.ID, 10, 1, -1))
	h.run()
	rp, ok := h.replies[q]
	if !ok || rp.Err != nil {
		t.Fatalf("read at a: %+v (replied %v)", rp.Err, ok)
	}
	if !bytes.Equal(rp.Data, pattern(2, 1)) {
		t.Fatalf("block 10 read at node %d (resynced, serving) holds %#x..., the failed life's repair data, not the acknowledged W's %#x...: "+
			"a read of the failed life completed after the reload and wrote under a range lock the reload had dropped", s, rp.Data[0], pattern(2, 1)[0])
	}
}
