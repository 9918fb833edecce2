package rldev

import (
	"bytes"
	"errors"
	"slices"
	"testing"
	"time"
)

// Scenarios from a second outside review of segment moves (and of the
// dirty-region rule), each a scripted interleaving that broke the engine
// before its fix; each fails with "DEFECT" if its fix is undone: a
// scrubber's pull from the peer that let a move switch before it landed;
// a moving secondary whose newer block (one the primary lost) was dropped
// with it; a range pulled back from the peer whose dirty region was
// cleared before the pull.

// r2LoseWrite makes node n's copy of block b hold old (a physical block
// captured before the last write): what a lost or misdirected write
// leaves, a well-formed block with an older generation.
func (h *harness) r2LoseWrite(n NodeID, id, b uint64, old []byte) {
	h.t.Helper()
	rec := h.rec(id)
	seg := rec.Segs[rec.SegmentOf(n)]
	dev := h.nodes[n].devs[seg.Disk]
	if _, err := dev.WriteAt(old, seg.Offset+blockOff(b)); err != nil {
		h.t.Fatal(err)
	}
	if err := dev.Sync(); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) r2Phys(n NodeID, id, b uint64) []byte {
	rec := h.rec(id)
	seg := rec.Segs[rec.SegmentOf(n)]
	return h.nodes[n].devs[seg.Disk].Platter(seg.Offset+blockOff(b), PhysBlockSize)
}

// (A) pullNewer (scrub.go:135) calls moveStale() when it *starts*, before
// its pull is answered and long before it writes; the next moveTick
// (move.go:217-222) restarts the copy and clears mvStale. The restarted
// copy reads the old block, completes, Switch is set, and the primary's
// later write of the newer block is not seen by moveCopied(): the switch
// commits with the target lacking the block. Here the pull is delayed by
// a short partition of the primary from the secondary (no verdict); after
// the heal it is answered in the switching epoch just before the probe,
// and nothing checks, when its data lands, that the epoch it was pulled
// in is still current.
func TestRegressMove2MovePullNewerStaleClearedEarly(t *testing.T) {
	h := newHarness(t, 3, testDisk, func(h *harness) { h.scrubRate = -1; h.copyRate = 1 << 20 })
	r := h.create(1024)
	p, s, tg := r.Segs[0].Node, r.Segs[1].Node, NodeID(3)
	const b = 5
	h.mustWrite(p, r.ID, b, pattern(1, 1))
	old := h.r2Phys(p, r.ID, b)
	h.mustWrite(p, r.ID, b, pattern(2, 1)) // acknowledged: on both
	h.r2LoseWrite(p, r.ID, b, old)         // the primary's copy silently lost it

	h.rmStartMove(r.ID, 1, tg) // the secondary's segment
	if !h.rvTickUntil(10*time.Second, h.rmCopied(p, r.ID, 64)) {
		t.Fatal("setup: no copy")
	}
	pr := h.nodes[p].e.reps[r.ID]
	// The scrubber's next chunk at the primary (scrubRate off: run by hand).
	h.exec(h.nodes[p], pr.scrubChunk(0, 64))
	if !h.rvStepUntil(func() bool { return h.nodes[p].e.reps[r.ID].mvStale }) {
		t.Fatal("setup: the scrubber did not find the newer block")
	}
	h.partition(p, s) // pullNewer's data pull is lost with the session
	// Before the fix the move switched here, the block not yet pulled;
	// now it waits for the pull (and copies again once it landed).
	h.rvTickUntil(4*time.Second, func() bool { m := h.rec(r.ID).Move; return m != nil && m.Switch })
	h.run()
	h.heal(p, s)
	h.rvTickUntil(30*time.Second, func() bool { return h.rec(r.ID).Move == nil })
	h.tick(time.Second)
	rec := h.rec(r.ID)
	if rec.Move != nil || rec.Segs[1].Node != tg {
		t.Fatalf("setup: move not done: %+v %+v", rec, rec.Move)
	}
	a, c := h.rvPlatterBlock(p, r.ID, b), h.rvPlatterBlock(tg, r.ID, b)
	rp, rt := h.rvRead(p, r.ID, b, 1), h.rvRead(tg, r.ID, b, 1)
	t.Logf("block %d: primary %x, new secondary %x; reads: primary %x (%v), target %x (%v)", b, a[:2], c[:2], rp.Data[:2], rp.Err, rt.Data[:2], rt.Err)
	if !bytes.Equal(a, c) || !bytes.Equal(rp.Data, rt.Data) {
		t.Errorf("DEFECT: the switch committed while the target lacked the block the primary pulled from the secondary (mvStale set at pullNewer's start, cleared by the copy restart before the write landed); reads disagree")
	}
}

// (B) The move's copy trusts the primary's blocks (only checksums are
// checked): a block the primary silently lost (misdirected write) is
// copied old, and when the secondary is the one moving, the only good
// copy of an acknowledged write is retired and wiped. Afterwards both
// copies agree (same generation): the scrubber can never find it.
func TestRegressMove2MoveSecondaryDiscardsOnlyGoodCopy(t *testing.T) {
	h := newHarness(t, 3, testDisk, func(h *harness) { h.scrubRate = -1 })
	r := h.create(1024)
	p, tg := r.Segs[0].Node, NodeID(3)
	const b = 5
	h.mustWrite(p, r.ID, b, pattern(1, 1))
	old := h.r2Phys(p, r.ID, b)
	h.mustWrite(p, r.ID, b, pattern(2, 1)) // acknowledged
	h.r2LoseWrite(p, r.ID, b, old)
	h.rmStartMove(r.ID, 1, tg)
	h.rvTickUntil(20*time.Second, func() bool { return h.rec(r.ID).Move == nil })
	h.tick(2 * time.Second)
	if rec := h.rec(r.ID); rec.Segs[1].Node != tg {
		t.Fatalf("setup: move not done: %+v", rec)
	}
	rp, rt := h.rvRead(p, r.ID, b, 1), h.rvRead(tg, r.ID, b, 1)
	t.Logf("block %d after the move: primary %x (%v), new secondary %x (%v)", b, rp.Data[:2], rp.Err, rt.Data[:2], rt.Err)
	if !bytes.Equal(rp.Data, pattern(2, 1)) && !bytes.Equal(rt.Data, pattern(2, 1)) {
		t.Errorf("DEFECT: an acknowledged write is gone from both replicas after the secondary moved (the copy took the primary's silently old block; the only good copy was retired)")
	}
}

// (C) lazyClear (datapath.go:739-744) protects only recoveries of dirty
// regions (q.x != noRegion); a range pulled back after the secondary
// refused a write (startRecoveryOf, x = noRegion) is not held, and the
// write itself has finished (inflight 0). Two flushes later the region is
// cleared while this replica holds a block the peer does not; a crash
// before the pull-back completes leaves the replicas different for good
// (no dirty region to recover after the restart).
func TestRegressMove2PullBackRegionClearedBeforePull(t *testing.T) {
	h := newHarness(t, 2, testDisk, func(h *harness) { h.scrubRate = -1 })
	r := h.create(1024)
	p, s := r.Segs[0].Node, r.Segs[1].Node
	h.partition(p, s)
	q1 := h.write(p, r.ID, 0, pattern(1, 1), rmFence(5)) // lands at p, waits for s
	h.run()
	h.heal(p, s)
	q2 := h.write(p, r.ID, 500, pattern(2, 1), rmFence(7)) // s admits 7 first
	h.run()
	if rp, ok := h.replies[q2]; !ok || rp.Err != nil {
		t.Fatalf("setup: W2 %v %v", ok, rp.Err)
	}
	if !h.rvTickUntil(3*time.Second, func() bool { _, ok := h.replies[q1]; return ok }) || !errors.Is(h.replies[q1].Err, ErrStaleToken) {
		t.Skipf("setup: W1 not refused by the secondary: %+v", h.replies[q1])
	}
	h.partition(p, s) // the pull-back waits
	h.tick(3 * time.Second)
	drl := h.rvPlatterLog(p, r.ID, PageDRL)
	pr := h.nodes[p].e.reps[r.ID]
	t.Logf("primary: recovering %d, dirty regions on the platter %v", pr.recovering(), drl)
	if pr.recovering() == 0 {
		t.Skip("setup: the pull-back completed")
	}
	cleared := !slices.Contains(drl, 0)
	h.crash(h.nodes[p], false, nil)
	delete(h.cut, [2]NodeID{p, s})
	delete(h.cut, [2]NodeID{s, p})
	h.start(h.nodes[p])
	h.joined(r.ID)
	h.tick(2 * time.Second)
	a, c := h.rvPlatterBlock(p, r.ID, 0), h.rvPlatterBlock(s, r.ID, 0)
	ra, rb := h.rvRead(p, r.ID, 0, 1), h.rvRead(s, r.ID, 0, 1)
	t.Logf("block 0: primary %x, secondary %x; reads %x (%v) / %x (%v)", a[:2], c[:2], ra.Data[:2], ra.Err, rb.Data[:2], rb.Err)
	if cleared && (!bytes.Equal(a, c) || !bytes.Equal(ra.Data, rb.Data)) {
		t.Errorf("DEFECT: the dirty region of a range being pulled back was cleared before the pull; after the primary's crash the replicas differ at block 0 (the primary serves the write the secondary refused)")
	}
}
