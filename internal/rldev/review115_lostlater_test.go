package rldev

import (
	"bytes"
	"testing"
	"time"
)

// TestReview115LostLaterWrite: W lands on both copies (answer lost); B,
// a later write of the block, is acknowledged and read; the primary's
// disk lost B (it keeps W, well formed, W's generation). The retry of W
// finds W's generation and rewrites W, with a new generation, over the
// secondary's good copy of B: B is gone from both copies for good (the
// scrubber, which would have repaired the primary from the secondary,
// now finds them equal). Review 114's lost-write defect, for the later
// write (outside review 115; now the retry takes each block's newest
// sound copy, the peer's here).
// Control (retry false): the scrubber restores B.
func TestReview115LostLaterWrite(t *testing.T)        { review115LostLater(t, true) }
func TestReview115LostLaterWriteControl(t *testing.T) { review115LostLater(t, false) }

func review115LostLater(t *testing.T, retry bool) {
	h, rec, p, s, wid, w := landedOnce(t)
	b := pattern(3, 1)
	dev := h.nodes[p.Node].devs[p.Disk]
	at := p.Offset + blockOff(10)
	old := dev.Platter(at, PhysBlockSize) // W, W's generation
	h.mustWrite(p.Node, rec.ID, 10, b)
	h.mustRead(s.Node, rec.ID, 10, b)               // a reader saw B
	if _, err := dev.WriteAt(old, at); err != nil { // the primary's disk lost B
		t.Fatal(err)
	}
	if err := dev.Sync(); err != nil {
		t.Fatal(err)
	}
	var r Reply
	if retry {
		q := h.writeAs(p.Node, wid, rec.ID, 10, w)
		h.run()
		r = h.replies[q]
	}
	h.tick(3 * time.Second) // the scrubber's passes
	pg, sg := h.rvPlatterBlock(p.Node, rec.ID, 10), h.rvPlatterBlock(s.Node, rec.ID, 10)
	t.Logf("retry %v: err %v landed before %v; primary holds B %v, secondary holds B %v", retry, r.Err, r.LandedBefore, bytes.Equal(pg, b), bytes.Equal(sg, b))
	if !bytes.Equal(pg, b) || !bytes.Equal(sg, b) {
		t.Fatalf("B, acknowledged and read, lost from both copies: the rewrite copied the primary's older W over the secondary's B")
	}
}
