package rldev

import (
	"errors"
	"testing"
	"time"
)

// Outside review 90: a request waiting on an owed range pulled in parts.
// owedAwait registers a waiter only if an owed range not being written
// (!q.writing) blocks it, and owedFail runs only when the peer turns
// stale. A read admitted while a part's pulled data is being written is
// not registered; the peer is then declared dead (the RLDev degrades);
// the part lands, the next part cannot be pulled (the peer is down), and
// the range stays owed: the read waits until the peer is back, for ever
// if it never is, while a new read of the same block fails at once.
// (Single-part ranges are let go when their write lands; only ranges
// larger than a pull keep the lock afterwards.)
func TestReview90WaiterOnMultiPartRangeNeverAnswered(t *testing.T) {
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
	p, s := h.nodes[NodeID(r.Segs[r.Primary].Node)], h.nodes[NodeID(r.Segs[1-r.Primary].Node)]
	h.mustWrite(p.id, r.ID, 100, pattern(1, 1)) // region 0 dirty
	h.crash(p, false, nil)
	base := r.Segs[r.Primary].Offset
	h.holdWrite = func(n *hnode, x DiskWrite) bool {
		return n == p && x.Off >= base+blockOff(0) && x.Off < base+blockOff(MaxPullBlocks)
	}
	r89Start(h, p, region)
	h.run()
	if !h.tickUntil(3*time.Second, func() bool { return len(h.held) > 0 }) {
		t.Fatalf("setup: the first part's data write is not held: %+v", h.rec(r.ID))
	}
	h.holdWrite = nil
	q := h.read(p.id, r.ID, 4500, 1) // in the second part
	h.run()
	h.crash(s, false, nil)
	h.dead[Subject{s.id, s.inc}] = true
	if !h.tickUntil(5*time.Second, func() bool { return h.rec(r.ID).State == Degraded }) {
		t.Fatalf("setup: not degraded: %+v", h.rec(r.ID))
	}
	for len(h.held) > 0 {
		h.release(0)
	}
	h.tick(30 * time.Second)
	if rp := h.rvRead(p.id, r.ID, 4500, 1); !errors.Is(rp.Err, ErrUnavailable) {
		t.Fatalf("a new read: %v, want Unavailable", rp.Err)
	}
	if _, ok := h.replies[q]; !ok {
		t.Errorf("the read admitted while part 1 landed is unanswered 30 s on (a new read of block 4500 fails at once, Unavailable); owed %d, landed %d",
			p.e.reps[r.ID].owedCount(), p.e.reps[r.ID].recoverQ[0].landed)
	}
}
