package rldev

import (
	"strings"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/disk"
)

// review87Resyncing: p serves alone while s is away, writes every chunk;
// s comes back (blank: its disk replaced) and the RLDev is resyncing.
func review87Resyncing(t *testing.T, blank bool) (*harness, *Record, *hnode, *hnode) {
	h := newHarness(t, 3, testDisk, func(h *harness) { h.copyRate = 64 * BlockSize; h.scrubRate = -1 })
	r := h.create(1024)
	p, s := h.nodes[NodeID(r.Segs[r.Primary].Node)], h.nodes[NodeID(r.Segs[1-r.Primary].Node)]
	h.mustWrite(p.id, r.ID, 1, pattern(1, 1))
	h.crash(s, false, nil)
	h.dead[Subject{s.id, s.inc}] = true
	h.run()
	if !h.tickUntil(10*time.Second, func() bool { return h.rec(r.ID).State == Degraded }) {
		t.Fatalf("setup: not degraded: %+v", h.rec(r.ID))
	}
	for b := uint64(0); b < 1024; b += 64 {
		h.mustWrite(p.id, r.ID, b, pattern(byte(b), 8))
	}
	if blank {
		s.devs[0] = disk.NewMemDevice(testDisk, nil)
	}
	h.dead = map[Subject]bool{}
	h.start(s)
	if !h.tickUntil(10*time.Second, func() bool { return h.rec(r.ID).State == Resyncing }) {
		t.Fatalf("setup: not resyncing: %+v", h.rec(r.ID))
	}
	return h, r, p, s
}

// The target answers forwards but no copy: writes of the resyncing epoch
// are acknowledged with its answer; the resync is given up, writes go on
// degraded; once the target answers copies again it is resynced after the
// hold, and both copies hold every acknowledged write.
func TestReview87GiveUpKeepsAcknowledgedWrites(t *testing.T) {
	h, r, p, s := review87Resyncing(t, false)
	copySeqs := map[uint64]bool{}
	muteCopies := true
	h.mute = func(from, to NodeID, msg any) bool {
		switch m := msg.(type) {
		case Copy:
			copySeqs[m.Seq] = true
		case Ack:
			return muteCopies && from == s.id && copySeqs[m.Seq]
		}
		return false
	}
	// Writes while resyncing (answered by the target's forwards).
	// Some wait for the range of a copy left unanswered (held until its
	// answer): they end once the resync is given up.
	want := map[uint64][]byte{}
	reqs := map[ReqID]uint64{}
	data := map[uint64][]byte{}
	for i := uint64(0); i < 6; i++ {
		b := 5 + i*150
		d := pattern(byte(40+i), 2)
		reqs[h.write(p.id, r.ID, b, d, nil)] = b
		data[b] = d
		h.tick(2 * time.Second)
	}
	if !h.tickUntil(copyStall+10*time.Second, func() bool { return h.rec(r.ID).State == Degraded }) {
		t.Fatalf("not given up: %+v", h.rec(r.ID))
	}
	h.tick(2 * time.Second)
	for q, b := range reqs {
		rp, ok := h.replies[q]
		if !ok {
			t.Fatalf("write at %d never answered after the give-up", b)
		}
		t.Logf("write at %d: %v", b, rp.Err)
		if rp.Err == nil {
			want[b] = data[b]
		}
	}
	if rec := h.rec(r.ID); !rec.Stale[1-rec.Primary] {
		t.Fatalf("given up, the target is not stale: %+v", rec)
	}
	// A read through the stale target is not served from it.
	q := h.read(s.id, r.ID, 5, 2)
	h.run()
	if rp := h.replies[q]; rp.Err == nil && want[5] != nil && string(rp.Data) != string(want[5]) {
		t.Fatalf("the stale target served block 5 wrongly")
	}
	for i := uint64(0); i < 4; i++ {
		b := 7 + i*200
		d := pattern(byte(90+i), 3)
		h.mustWrite(p.id, r.ID, b, d)
		want[b] = d
	}
	muteCopies = false
	if !h.tickUntil(resyncHold+60*time.Second, func() bool { return h.rec(r.ID).State == Normal }) {
		t.Fatalf("not resynced: %+v", h.rec(r.ID))
	}
	h.tick(3 * time.Second)
	h.sameCopies(r.ID)
	for b, d := range want {
		h.mustRead(s.id, r.ID, b, d)
		h.mustRead(p.id, r.ID, b, d)
	}
}

// The resync completes (every copy answered) and its "resynced" decree is
// held by a slow config service for longer than copyStall: the stall
// check must not fire (nothing unanswered), and the decree, committed,
// makes the RLDev normal.
func TestReview87ResyncedDecreeHeldPastStall(t *testing.T) {
	h, r, p, s := review87Resyncing(t, false)
	h.holdPropose = func(n *hnode, x Propose) bool { return n == p && strings.Contains(x.What, "resynced") }
	if !h.tickUntil(60*time.Second, func() bool { return len(h.heldDecrees) == 1 }) {
		t.Fatalf("setup: no resynced decree: %+v", h.rec(r.ID))
	}
	h.holdPropose = nil
	held := h.heldDecrees[0]
	h.heldDecrees = nil
	_ = s
	h.tick(copyStall + 10*time.Second)
	pr := p.e.reps[r.ID]
	if !pr.resyncHeld.IsZero() || pr.resync == nil || pr.resync.failed {
		t.Fatalf("a completed resync, its decree out, was given up (held until %v)", pr.resyncHeld)
	}
	if err := h.commit(held); err != nil {
		t.Fatalf("held decree: %v", err)
	}
	h.exec(p, p.e.Decided(h.env(p), held.ID, nil))
	h.run()
	if !h.tickUntil(5*time.Second, func() bool { return h.rec(r.ID).State == Normal }) {
		t.Fatalf("not normal: %+v", h.rec(r.ID))
	}
	h.sameCopies(r.ID)
}

// A full copy to a blank target that goes silent: given up, the record
// keeps FullCopy and the target stale (its half-copied segment serves
// nothing); resynced whole once it answers again.
func TestReview87FullCopyGivenUp(t *testing.T) {
	h, r, p, s := review87Resyncing(t, true)
	if !h.rec(r.ID).FullCopy {
		t.Fatalf("setup: not a full copy: %+v", h.rec(r.ID))
	}
	h.tick(3 * time.Second) // a few chunks land
	h.mute = func(from, to NodeID, msg any) bool { return from == s.id }
	if !h.tickUntil(copyStall+10*time.Second, func() bool { return h.rec(r.ID).State == Degraded }) {
		t.Fatalf("not given up: %+v", h.rec(r.ID))
	}
	rec := h.rec(r.ID)
	if !rec.FullCopy || !rec.Stale[1-rec.Primary] || rec.Primary != r.Primary {
		t.Fatalf("given up, the record lost the full copy or the target's staleness: %+v", rec)
	}
	h.mustWrite(p.id, r.ID, 1000, pattern(77, 4))
	h.mute = nil
	if !h.tickUntil(resyncHold+120*time.Second, func() bool { return h.rec(r.ID).State == Normal }) {
		t.Fatalf("not resynced: %+v", h.rec(r.ID))
	}
	h.tick(3 * time.Second)
	h.sameCopies(r.ID)
	h.mustRead(s.id, r.ID, 1000, pattern(77, 4))
	h.mustRead(s.id, r.ID, 64, pattern(64, 8))
}

// A move's target that is up but silent for longer than copyStall: the
// move copy is not the resync's (c.src.move): no hold is set and the move
// copy is not stopped by the silent-target rule; answering again, the
// move completes.
func TestReview87MoveCopyUnaffected(t *testing.T) {
	h := newHarness(t, 3, testDisk, func(h *harness) { h.copyRate = 64 * BlockSize; h.scrubRate = -1 })
	r := h.create(1024)
	p, tg := r.Segs[r.Primary].Node, NodeID(6-r.Segs[0].Node-r.Segs[1].Node)
	h.rmStartMove(r.ID, 1-r.Primary, tg)
	if !h.tickUntil(10*time.Second, func() bool { x := h.nodes[p].e.reps[r.ID]; return x != nil && x.mv != nil && x.mv.copied > 0 }) {
		t.Fatalf("setup: no move copy: %+v", h.rec(r.ID))
	}
	h.mute = func(from, to NodeID, msg any) bool { return from == tg }
	h.tick(copyStall + 10*time.Second)
	pr := h.nodes[p].e.reps[r.ID]
	if !pr.resyncHeld.IsZero() {
		t.Fatalf("a move's silent target set the resync hold")
	}
	t.Logf("after %v silent: move %+v, copy failed=%v", copyStall+10*time.Second, h.rec(r.ID).Move, pr.mv != nil && pr.mv.failed)
	h.mute = nil
	if !h.tickUntil(120*time.Second, func() bool { return h.rec(r.ID).Move == nil }) {
		t.Fatalf("the move did not complete: %+v", h.rec(r.ID).Move)
	}
	h.run()
	h.sameCopies(r.ID)
}
