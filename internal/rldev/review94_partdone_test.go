package rldev

import (
	"testing"
	"time"
)

// Review 94 (white-box: q.owe cleared and Stale set by hand, to reach the
// partDone branch with a non-owed multi-part range). The branch set
// q.pulling=false and waited for a degraded-mode mark; a tick meanwhile
// pumped the next part from the (stale) peer, and when the mark landed the
// branch's callback called recovered(q) with no q.writing check: the range
// was released while pulled data was still being written (review 71).
// Now the range is givingUp: no next part is asked, and it is released
// once the mark lands.
func TestReview94PartDoneReleasesWhileWriting(t *testing.T) {
	const region = 5000
	h := newHarness(t, 2, testDisk, func(h *harness) { h.scrubRate = -1 })
	for _, n := range h.sorted() {
		h.crash(n, false, nil)
	}
	for _, n := range h.sorted() {
		r89Start(h, n, region)
	}
	h.run()
	r := h.create(region)
	p := h.nodes[NodeID(r.Segs[r.Primary].Node)]
	h.mustWrite(p.id, r.ID, 100, pattern(1, 1)) // region 0 dirty
	h.crash(p, false, nil)
	holdData, holdDeg := true, false
	h.holdWrite = func(n *hnode, x DiskWrite) bool {
		rp := n.e.reps[r.ID]
		if n != p || rp == nil {
			return false
		}
		if holdData && x.Off >= rp.base+blockOff(0) && x.Off < rp.base+blockOff(region) {
			return true
		}
		d0, _ := pageSlot(PageDegraded, 0)
		d1, _ := pageSlot(PageDegraded, 1)
		return holdDeg && (x.Off == rp.base+d0 || x.Off == rp.base+d1)
	}
	r89Start(h, p, region)
	h.run()
	rp := p.e.reps[r.ID]
	if !h.tickUntil(3*time.Second, func() bool { return len(rp.recoverQ) == 1 && rp.recoverQ[0].writing }) {
		t.Fatalf("setup: part 1 not being written: q=%d held=%d", len(rp.recoverQ), len(h.held))
	}
	q := rp.recoverQ[0]
	if q.n != region || q.landed != 0 {
		t.Fatalf("setup: q %+v", q)
	}
	dataHeld := len(h.held)
	// The range is not owed (startRecoveryOf with a stale peer / no room),
	// and the peer turns stale while part 1 lands.
	q.owe, q.owed = false, false
	holdDeg = true
	rp.rec.Stale[rp.peer()] = true
	h.exec(p, rp.abandonRecovery())
	h.run()
	if len(h.held) != dataHeld+1 {
		t.Fatalf("setup: the degraded-mode mark not held: %d vs %d", len(h.held), dataHeld)
	}
	// Part 1 lands (every data write held so far).
	holdData = true
	for i := 0; i < dataHeld; i++ {
		h.release(0)
	}
	if q.landed != MaxPullBlocks || q.writing {
		t.Fatalf("setup: part 1 not landed: %+v", q)
	}
	pulls0 := rp.e.stats.PulledBlocks
	h.tick(100 * time.Millisecond)
	if rp.e.stats.PulledBlocks != pulls0 {
		t.Errorf("a tick asked the stale peer for the next part (%d blocks) while the degraded-mode mark was being written", rp.e.stats.PulledBlocks-pulls0)
	}
	// Since the fix no part 2 is asked (givingUp): if one were, it
	// would be being written now, and what follows checks the range is
	// not released under it.
	rp.rec.Stale[rp.peer()] = false // (undo the hand-made record: no decree follows)
	if rp.heldNow(q.lock) == false {
		t.Fatalf("the range was released before its degraded-mode mark landed")
	}
	// The degraded-mode mark lands (held first).
	f := h.held[0] // (part 2's data writes follow it)
	h.held = h.held[1:]
	f()
	for len(h.queue) > 0 && rp.heldNow(q.lock) {
		g := h.queue[0]
		h.queue = h.queue[1:]
		g()
	}
	if q.writing && !rp.heldNow(q.lock) {
		t.Errorf("the range was released while part 2 (pulled from the stale peer) is still being written: a write let in now is undone when it lands")
	}
	if !q.writing && rp.heldNow(q.lock) {
		t.Errorf("the range is still held after its mark landed")
	}
	if q.landed != MaxPullBlocks {
		t.Errorf("a second part landed (%d blocks) though the range was being given up", q.landed)
	}
}
