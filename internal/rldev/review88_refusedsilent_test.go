package rldev

import (
	"testing"
	"time"
)

// Outside review 88 (of 0450264; failing before silence was counted from
// the chunk's last answer, copyChunk.answeredAt): a resync target that refuses the first
// copies (NotServing: its engine not fresh yet, as at the start of many
// resyncs) and then goes silent (its engine wedged, its session up). Every
// chunk in flight is marked refused, and refused stays set for good, so
// the silent-target check (retry: !c.refused) skips them all; copyAcked
// gives up only on an answer, and none comes. The resync is never given
// up and the write waiting for the target is never answered: the very
// hang the silent-target give-up exists for (TestSilentResyncTargetIsGivenUp).
func TestSilentResyncReview88RefusedThenSilent(t *testing.T) {
	h, r, p, s := review87Resyncing(t, false)
	refuseUntil := h.now.Add(10 * time.Second)
	refused := 0
	h.mute = func(from, to NodeID, msg any) bool {
		if from != s.id {
			if m, ok := msg.(Copy); ok && from == p.id && to == s.id && h.now.Before(refuseUntil) {
				// The target answers it NotServing (Engine.Deliver, !e.fresh).
				refused++
				ack := Ack{RLDev: m.RLDev, Seq: m.Seq, Code: NotServing, Epoch: m.Epoch}
				h.queue = append(h.queue, func() { h.exec(p, p.e.Deliver(h.env(p), s.id, ack)) })
				return true
			}
			return false
		}
		// s itself: silent after the refusals.
		return !h.now.Before(refuseUntil)
	}
	h.tick(11 * time.Second)
	t.Logf("after 11s: refused %d, state %v, copies %d", refused, h.rec(r.ID).State, len(p.e.reps[r.ID].copies))
	for _, c := range p.e.reps[r.ID].copies {
		t.Logf("in flight: block %d last answered %v resends %d", c.first, c.answeredAt, c.resends)
	}
	if refused == 0 {
		t.Fatalf("setup: no copy refused")
	}
	q := h.write(p.id, r.ID, 3, pattern(9, 1), nil)
	h.run()
	if !h.tickUntil(5*time.Minute, func() bool { return h.rec(r.ID).State == Degraded }) {
		_, answered := h.replies[q]
		t.Fatalf("a target that refused %d copies and then went silent kept the RLDev %v for %v (resync never given up; the write waiting on it answered: %v)",
			refused, h.rec(r.ID).State, 5*time.Minute, answered)
	}
	if !h.tickUntil(5*time.Second, func() bool { _, ok := h.replies[q]; return ok }) {
		t.Fatalf("the write waiting on the silent target was never answered")
	}
}
