package rldev

import (
	"testing"
	"time"
)

// The silent target is given up and then restarted (a new incarnation,
// answering: what an operator does to a wedged engine). The hold, kept by
// time alone on the source's replica, applies to the new incarnation too:
// its first request waits out the rest of resyncHold (bounded: it is then
// resynced). A limitation, logged, not a failure.
func TestReview87HoldOutlivesTargetIncarnation(t *testing.T) {
	h, r, p, s := review87Resyncing(t, false)
	h.mute = func(from, to NodeID, msg any) bool { return from == s.id }
	if !h.tickUntil(copyStall+10*time.Second, func() bool { return h.rec(r.ID).State == Degraded }) {
		t.Fatalf("not given up: %+v", h.rec(r.ID))
	}
	pr := p.e.reps[r.ID]
	if pr.resyncHeld.IsZero() {
		t.Fatalf("setup: no hold")
	}
	h.mute = nil
	h.crash(s, false, nil)
	h.run()
	h.start(s)
	t0 := h.now
	if !h.tickUntil(resyncHold+60*time.Second, func() bool { return h.rec(r.ID).State == Resyncing || h.rec(r.ID).State == Normal }) {
		t.Fatalf("the restarted target was never resynced: %+v", h.rec(r.ID))
	}
	wait := h.now.Sub(t0)
	t.Logf("a new incarnation of the given-up target waited %v for its resync (hold %v, until %v after its start)", wait, resyncHold, pr.resyncHeld.Sub(t0))
	if wait > resyncHold/2 {
		// The hold is for the incarnation that was silent: a restarted
		// target (an operator's fix) is resynced at once (since review
		// 87's limitation; it waited the whole hold).
		t.Fatalf("the restarted target was held %v", wait)
	}
	if !h.tickUntil(120*time.Second, func() bool { return h.rec(r.ID).State == Normal }) {
		t.Fatalf("not resynced: %+v", h.rec(r.ID))
	}
	h.sameCopies(r.ID)
}

// Given up, the hold set, then the source's segment fails and is loaded
// again (same engine): resyncHeld is kept by time (not reset by the
// reload) and expires; the RLDev is resynced after it.
func TestReview87HoldAcrossSourceReload(t *testing.T) {
	h, r, p, s := review87Resyncing(t, false)
	h.mute = func(from, to NodeID, msg any) bool { return from == s.id }
	if !h.tickUntil(copyStall+10*time.Second, func() bool { return h.rec(r.ID).State == Degraded }) {
		t.Fatalf("not given up: %+v", h.rec(r.ID))
	}
	pr := p.e.reps[r.ID]
	held := pr.resyncHeld
	h.mute = nil
	fail := true
	h.failWrite = func(n *hnode, x DiskWrite) bool { return fail && n == p }
	q := h.write(p.id, r.ID, 3, pattern(3, 1), nil)
	h.run()
	fail = false
	h.failWrite = nil
	t.Logf("write on failing disk: %+v; replica state %v", h.replies[q].Err, pr.state)
	if !h.tickUntil(20*time.Second, func() bool { return pr.state == repReady }) {
		t.Fatalf("source not reloaded: state %v", pr.state)
	}
	t.Logf("after reload: hold until %v (was %v), now %v", pr.resyncHeld.Sub(h.now), held.Sub(h.now), h.now)
	if !h.tickUntil(resyncHold+120*time.Second, func() bool { return h.rec(r.ID).State == Normal }) {
		t.Fatalf("not resynced after the reload: %+v", h.rec(r.ID))
	}
	h.sameCopies(r.ID)
}
