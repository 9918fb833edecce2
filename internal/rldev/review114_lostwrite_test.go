package rldev

import (
	"bytes"
	"testing"
	"time"
)

// TestReview114LostWriteRewritten (outside review 114): write W lands on
// both copies (its answer lost), but the primary's disk lost it (a lost
// or misdirected write: the block keeps X, well formed, its older
// generation). The scrubber exists for exactly this
// (TestScrubFindsMisdirectedWrite): the secondary holds W with a newer
// generation. The clerk's retry of W (same WriteID) was answered
// LandedBefore: the rewrite read X on the primary, gave it a new
// generation and forwarded it over the secondary's good copy of W. W,
// acknowledged, was gone from both copies. Now the rewrite checks the
// generations it reads (W's or later) and, finding X's older, applies W
// (landed.go). Applied again (teeth: Unsafe.ApplyRetries) both copies
// hold W too.
// Control (no retry): the scrubber finds the primary's block older than
// the secondary's and repairs it.
func TestReview114LostWriteRewritten(t *testing.T)      { review114LostWrite(t, false, true) }
func TestReview114LostWriteRewrittenTeeth(t *testing.T) { review114LostWrite(t, true, true) }
func TestReview114LostWriteControlNoRetry(t *testing.T) { review114LostWrite(t, false, false) }

func review114LostWrite(t *testing.T, unsafe, retry bool) {
	h := newHarness(t, 2, testDisk, func(h *harness) { h.unsafe.ApplyRetries = unsafe })
	rec := h.create(128)
	p, s := rec.Segs[rec.Primary], rec.Segs[1-rec.Primary]
	x, w := pattern(1, 1), pattern(9, 1)
	wid := WriteID{Writer: 7, Seq: 1}
	h.mustWrite(p.Node, rec.ID, 10, x)
	dev := h.nodes[p.Node].devs[p.Disk]
	at := p.Offset + blockOff(10)
	old := dev.Platter(at, PhysBlockSize)
	q := h.writeAs(p.Node, wid, rec.ID, 10, w)
	h.run()
	if r := h.replies[q]; r.Err != nil || r.LandedBefore {
		t.Fatalf("setup: first attempt %+v", r)
	}
	// The primary's disk lost W (what a checksum cannot see).
	if _, err := dev.WriteAt(old, at); err != nil {
		t.Fatal(err)
	}
	if err := dev.Sync(); err != nil {
		t.Fatal(err)
	}
	if got := h.rvPlatterBlock(s.Node, rec.ID, 10); !bytes.Equal(got, w) {
		t.Fatalf("setup: the secondary does not hold W")
	}
	// The answer of the first attempt was lost: the clerk retries.
	var r Reply
	if retry {
		q = h.writeAs(p.Node, wid, rec.ID, 10, w)
		h.run()
		r = h.replies[q]
	}
	if r.Err != nil {
		t.Fatalf("retry: %v", r.Err)
	}
	h.tick(3 * time.Second) // the scrubber's passes
	pg, sg := h.rvPlatterBlock(p.Node, rec.ID, 10), h.rvPlatterBlock(s.Node, rec.ID, 10)
	t.Logf("retry: landed before %v; primary holds W %v, secondary holds W %v", r.LandedBefore, bytes.Equal(pg, w), bytes.Equal(sg, w))
	if !bytes.Equal(pg, w) || !bytes.Equal(sg, w) {
		t.Fatalf("write W acknowledged (landed before %v) but lost: primary holds W %v, secondary holds W %v (X on both: the rewrite copied the lost write's older content over the good copy)",
			r.LandedBefore, bytes.Equal(pg, w), bytes.Equal(sg, w))
	}
}
