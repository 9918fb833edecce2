package rldev

import (
	"bytes"
	"testing"
)

// TestReview115RotAfterLaterWrite: W (WriteID) lands on both copies, its
// answer lost; another client's B over the same block is acknowledged and
// read; then the primary's block rots. The retry of W rereads, finds the
// block corrupt, and falls back to applying W's own data: B is replaced
// by W on both copies (W, B, W: the original bug), though the secondary
// held B intact (a repair from it would give B, newer than W). Outside
// review 115; now the retry takes each block's newest sound copy.
func TestReview115RotAfterLaterWrite(t *testing.T) {
	h, rec, p, s, wid, w := landedOnce(t)
	b := pattern(3, 1)
	h.mustWrite(p.Node, rec.ID, 10, b)
	h.mustRead(s.Node, rec.ID, 10, b) // a reader saw B
	h.nodes[p.Node].devs[p.Disk].FlipBit(p.Offset+blockOff(10)+HeaderSize+7, 3)
	q := h.writeAs(p.Node, wid, rec.ID, 10, w) // the clerk's retry of W
	h.run()
	r := h.replies[q]
	pg, sg := h.rvPlatterBlock(p.Node, rec.ID, 10), h.rvPlatterBlock(s.Node, rec.ID, 10)
	t.Logf("retry: err %v landed before %v; primary holds B %v W %v; secondary holds B %v W %v; stale %d",
		r.Err, r.LandedBefore, bytes.Equal(pg, b), bytes.Equal(pg, w), bytes.Equal(sg, b), bytes.Equal(sg, w), h.nodes[p.Node].e.Stats().LandedStale)
	if bytes.Equal(pg, w) || bytes.Equal(sg, w) {
		t.Fatalf("the retry of W landed over the later acknowledged (and read) B: W, B, W")
	}
}

// TestReview115LostBlockOfTwo: W covers blocks 10-11 (answer lost); B, a
// later write of block 10 alone, is acknowledged and read; the primary's
// disk lost W's block 11 (it keeps the older X, well formed). The retry
// of W finds block 11 older and applies W's own data to both blocks:
// block 10 went back from B to W on both copies (outside review 115;
// now each block is judged alone).
func TestReview115LostBlockOfTwo(t *testing.T) {
	h := newHarness(t, 2, testDisk)
	rec := h.create(128)
	p, s := rec.Segs[rec.Primary], rec.Segs[1-rec.Primary]
	x, w, b := pattern(1, 2), pattern(9, 2), pattern(3, 1)
	wid := WriteID{Writer: 7, Seq: 1}
	h.mustWrite(p.Node, rec.ID, 10, x)
	dev := h.nodes[p.Node].devs[p.Disk]
	at := p.Offset + blockOff(11)
	old := dev.Platter(at, PhysBlockSize)
	q := h.writeAs(p.Node, wid, rec.ID, 10, w)
	h.run()
	if r := h.replies[q]; r.Err != nil {
		t.Fatalf("setup: %v", r.Err)
	}
	if _, err := dev.WriteAt(old, at); err != nil { // the primary's disk lost W's block 11
		t.Fatal(err)
	}
	if err := dev.Sync(); err != nil {
		t.Fatal(err)
	}
	h.mustWrite(p.Node, rec.ID, 10, b)
	h.mustRead(s.Node, rec.ID, 10, b) // a reader saw B
	q = h.writeAs(p.Node, wid, rec.ID, 10, w)
	h.run()
	r := h.replies[q]
	pg, sg := h.rvPlatterBlock(p.Node, rec.ID, 10), h.rvPlatterBlock(s.Node, rec.ID, 10)
	t.Logf("retry: err %v landed before %v; block 10: primary holds B %v, secondary holds B %v", r.Err, r.LandedBefore, bytes.Equal(pg, b), bytes.Equal(sg, b))
	if !bytes.Equal(pg, b) || !bytes.Equal(sg, b) {
		t.Fatalf("the retry of W landed over the later acknowledged (and read) B at block 10: W, B, W")
	}
}
