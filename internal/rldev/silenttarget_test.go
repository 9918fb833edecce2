package rldev

import (
	"testing"
	"time"
)

// A resync target that is up but answers nothing (its session up, its
// engine wedged): the source gives the resync up once a copy has gone
// unanswered for copyStall, the RLDev is degraded again and writes no
// longer wait for the target; its next request is taken only after a
// hold (resyncHold), so that writes are not held up again and again.
// Before, the RLDev stayed resyncing for ever, every write waiting.
func TestSilentResyncTargetIsGivenUp(t *testing.T) {
	h := newHarness(t, 3, testDisk, func(h *harness) { h.copyRate = 64 * BlockSize })
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
	h.dead = map[Subject]bool{}
	h.start(s)
	if !h.tickUntil(10*time.Second, func() bool { return h.rec(r.ID).State == Resyncing }) {
		t.Fatalf("setup: not resyncing: %+v", h.rec(r.ID))
	}
	// s goes silent: nothing it sends arrives, its session stays up.
	h.mute = func(from, to NodeID, msg any) bool { return from == s.id }
	q := h.write(p.id, r.ID, 3, pattern(9, 1), nil)
	h.run()
	if !h.tickUntil(copyStall+10*time.Second, func() bool { return h.rec(r.ID).State == Degraded }) {
		t.Fatalf("a silent resync target kept the RLDev %v for %v", h.rec(r.ID).State, copyStall+10*time.Second)
	}
	if !h.tickUntil(5*time.Second, func() bool { _, ok := h.replies[q]; return ok }) {
		t.Fatalf("the write waiting on the silent target was never answered")
	}
	if rp := h.replies[q]; rp.Err != nil {
		t.Logf("the write waiting on the silent target: %v", rp.Err)
	}
	// Writes go on without it, and its next request waits for the hold.
	h.mustWrite(p.id, r.ID, 4, pattern(10, 1))
	h.tick(resyncHold / 2)
	if st := h.rec(r.ID).State; st != Degraded {
		t.Fatalf("the silent target's next request was taken at once: %v", st)
	}
	// Answering again, it is resynced once the hold has passed.
	h.mute = nil
	if !h.tickUntil(resyncHold+60*time.Second, func() bool { return h.rec(r.ID).State == Normal }) {
		t.Fatalf("not resynced once the target answers: %+v", h.rec(r.ID))
	}
	h.mustRead(s.id, r.ID, 4, pattern(10, 1))
}
