package rldev

import (
	"bytes"
	"slices"
	"testing"
	"time"
)

// Outside review 91: owedGiveUp lets a range go without dropping its pull.
//
// abandonRecovery's non-owed path and dropRecovery delete r.pulls entries
// of the ranges they let go; owedGiveUp (review 90's StaleGivenUp and
// re-placed-peer paths) does not. afterLoad's owed case runs
// holdRecover, abandonRecovery (StaleGivenUp: owedGiveUp, its deg mark in
// flight), then pumpRecovery, which sends the range's pull (queued: the
// given-up peer is down). The mark lands, the range is let go -- and its
// pullWait stays in r.pulls, sent again on every retry (refused
// NotServing while the peer is stale). Once the peer is resynced, the
// plain pull is served, and its then() writes the peer's copy of the
// range over this one with no lock held: a client write acknowledged
// meanwhile is undone on the primary.
func TestReview91GivenUpRangePullLeaksAndUndoesWrite(t *testing.T) {
	h, id, a, b := r90AcceptSetup(t)
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
	h.crash(a, false, nil) // its dirty-region log's clearing not yet landed
	h.holdWrite, h.held = nil, nil
	h.start(a)
	h.tick(2 * time.Second)
	rp := a.e.reps[id]
	leaked := 0
	for _, p := range rp.pulls {
		if p.q != nil && !slices.Contains(rp.recoverQ, p.q) {
			leaked++
		}
	}
	t.Logf("a: recovering %d, pulls %d (of ranges let go: %d), table %+v", rp.recovering(), len(rp.pulls), leaked, h.rec(id))
	if leaked > 0 {
		t.Errorf("%d pull(s) of owed ranges given up (StaleGivenUp) are still waiting in r.pulls", leaked)
	}
	h.mustRead(a.id, id, 10, pattern(1, 1))

	// b is back: resynced from a. Any write of pulled data at a over
	// block 10 is held from now on (a client write is encoded lazily:
	// Data nil; pulled data is not).
	t10 := base + blockOff(10)
	h.holdWrite = func(n *hnode, x DiskWrite) bool {
		return n == a && len(x.Data) > 0 && x.Off <= t10 && t10 < x.Off+int64(len(x.Data))
	}
	h.dead = map[Subject]bool{}
	h.start(b)
	if !h.tickUntil(30*time.Second, func() bool { return h.rec(id).State == Normal && len(h.held) > 0 }) {
		t.Logf("no pulled-data write at a (state %v): the leak did not bite here", h.rec(id).State)
		return
	}
	h.holdWrite = nil
	// A client write of block 10, acknowledged, while the stale pull's
	// data write is in flight.
	h.mustWrite(a.id, id, 10, pattern(7, 1))
	for len(h.held) > 0 {
		h.release(0)
	}
	h.run()
	if got := h.rvRead(a.id, id, 10, 1); got.Err != nil || !bytes.Equal(got.Data, pattern(7, 1)) {
		d, _ := r86Block(h, a, id, 10)
		t.Errorf("block 10 at the primary after an acknowledged write of 7s: read %v, first byte %d on disk (want 7): the leaked pull's data undid it", got.Err, d[0])
	}
}
