package rldev

import (
	"testing"
	"time"
)

// Outside review 92 (cosmetic): afterLoad's owed case runs
// abandonRecovery (StaleGivenUp: owedGiveUp marks the range givingUp,
// its degraded-mode mark in flight) and then pumpRecovery, which does not
// skip givingUp entries: a pull of the range given up is sent anyway (its
// answer is dropped by the callback's check, and recoveredNow deletes
// it). Harmless since the fix, but pumpRecovery should skip them.
func TestReview92PullSentForRangeBeingGivenUp(t *testing.T) {
	h, id, a, b := r90AcceptSetup(t)
	_ = b
	h.start(a)
	if !h.tickUntil(5*time.Second, func() bool { rp := a.e.reps[id]; return rp != nil && rp.ready() }) {
		t.Fatalf("setup: a not ready")
	}
	aseg := 0
	if NodeID(h.rec(id).Segs[1].Node) == a.id {
		aseg = 1
	}
	base := h.rec(id).Segs[aseg].Offset
	h.holdWrite = func(n *hnode, x DiskWrite) bool {
		return n == a && x.Off >= base+offDRL && x.Off < base+offDRL+2*PageSize
	}
	r90Accept(t, h, id)
	h.crash(a, false, nil)
	h.held = nil
	// a's degraded-mode log writes held: owedGiveUp's mark stays in flight.
	h.holdWrite = func(n *hnode, x DiskWrite) bool {
		return n == a && x.Off >= base+offDegraded && x.Off < base+offDegraded+2*PageSize
	}
	h.start(a)
	h.tick(2 * time.Second)
	rp := a.e.reps[id]
	n := 0
	for _, p := range rp.pulls {
		if p.q != nil && p.q.givingUp {
			n++
		}
	}
	t.Logf("a: recovering %d, pulls %d, of ranges being given up %d", rp.recovering(), len(rp.pulls), n)
	if n > 0 {
		t.Errorf("%d pull(s) sent for ranges being given up (pumpRecovery does not skip givingUp)", n)
	}
}
