package rldev

import (
	"testing"
	"time"
)

// TestReview115HungPrimaryWriteAfterLandedBefore (question 3): attempt 1
// of W is forwarded and lands on the secondary b; a's local write hangs;
// the watchdog fails a; b serves alone; the retry of W at b answers
// LandedBefore; B is written at b; then a's hung write of W lands late.
// The sim records W as done by the LandedBefore answer: nothing of W may
// be served after it, and the copies must end equal with B.
func TestReview115HungPrimaryWriteAfterLandedBefore(t *testing.T) {
	h, id, a, b := r71Pair(t)
	h.mustWrite(a.id, id, 10, pattern(1, 1))
	h.tick(3 * time.Second)
	h.holdWrite = func(x *hnode, w DiskWrite) bool { return x == a && w.Off >= a.e.reps[id].base+MetaSize }
	wid := WriteID{Writer: 3, Seq: 1}
	h.writeAs(a.id, wid, id, 10, pattern(2, 1))
	h.run()
	if len(h.held) != 1 {
		t.Fatalf("setup: %d held writes", len(h.held))
	}
	h.holdRead = func(x *hnode, _ DiskRead) bool { return x == a }
	h.holdWrite = func(x *hnode, _ DiskWrite) bool { return x == a }
	if !h.tickUntil(40*time.Second, func() bool { r := h.rec(id); return r.Stale[0] && r.Primary == 1 }) {
		t.Fatalf("setup: a not failed and made stale: %+v", h.rec(id))
	}
	q := h.writeAs(b.id, wid, id, 10, pattern(2, 1))
	h.run()
	if r := h.replies[q]; r.Err != nil || !r.LandedBefore {
		t.Fatalf("the retry at b: %+v, want landed before", r)
	}
	h.mustWrite(b.id, id, 10, pattern(3, 1))
	r76Unhang(h)
	if !h.tickUntil(60*time.Second, func() bool { r := h.rec(id); return r.State == Normal && !r.Stale[0] && !r.Stale[1] }) {
		t.Fatalf("not normal again: %+v (a %v)", h.rec(id), a.e.reps[id].state)
	}
	h.tick(3 * time.Second)
	h.sameCopies(id)
	for _, n := range []NodeID{a.id, b.id} {
		h.mustRead(n, id, 10, pattern(3, 1))
	}
}
