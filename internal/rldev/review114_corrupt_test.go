package rldev

import (
	"errors"
	"testing"
)

// TestReview114RetryOverRotFails (outside review 114): write W lands
// (answer lost); the block then rots on the primary (a flipped bit, no
// read yet). The retry of W (same WriteID) rereads the range and found
// the block bad: it failed with ErrCorrupt, which the clerk treats as
// final, where applied again (the teeth variant, Unsafe.ApplyRetries) the
// write succeeds and its data replaces the rotten block, as any write
// does; on a degraded RLDev every retry of W failed so for LandedFor. Now
// the retry takes the block from the peer's sound copy (review 115), or,
// with none, applies its own data (landed.go). The primary's copy is
// then W, and so is the secondary's.
func TestReview114RetryOverRotFails(t *testing.T)      { review114Rot(t, false) }
func TestReview114RetryOverRotFailsTeeth(t *testing.T) { review114Rot(t, true) }

func review114Rot(t *testing.T, unsafe bool) {
	h := newHarness(t, 2, testDisk, func(h *harness) { h.unsafe.ApplyRetries = unsafe; h.scrubRate = 1 })
	rec := h.create(128)
	p := rec.Segs[rec.Primary]
	w := pattern(9, 1)
	wid := WriteID{Writer: 7, Seq: 1}
	q := h.writeAs(p.Node, wid, rec.ID, 10, w)
	h.run()
	if r := h.replies[q]; r.Err != nil {
		t.Fatalf("setup: %v", r.Err)
	}
	h.nodes[p.Node].devs[p.Disk].FlipBit(p.Offset+blockOff(10)+HeaderSize+7, 3)
	q = h.writeAs(p.Node, wid, rec.ID, 10, w)
	h.run()
	r := h.replies[q]
	t.Logf("retry: err %v, landed before %v, final for the clerk %v", r.Err, r.LandedBefore, r.Err != nil && final(r.Err))
	if r.Err != nil {
		t.Fatalf("the retry of a write over a rotten block failed (final %v, maybe %v): %v", final(r.Err), errors.Is(r.Err, ErrMaybeWritten), r.Err)
	}
	h.mustRead(p.Node, rec.ID, 10, w)
	if st := h.nodes[p.Node].e.Stats(); !unsafe && (!r.LandedBefore || st.LandedStale != 0) {
		t.Fatalf("the rotten block, whole on the peer, is taken from it (review 115): landed before %v, %d applied again", r.LandedBefore, st.LandedStale)
	}
	h.sameCopies(rec.ID)
}
