package rldev

import (
	"bytes"
	"errors"
	"testing"
	"time"
)

// Outside review 90: a re-place of the stale copy owed ranges that
// Record.Owed does not guard. moveDegraded(replace) -- the moving
// segment's own disk failure, decreed by the moving replica itself --
// puts the move's target in its place (stale, FullCopy) and retires the
// old extent. When the primary is back from a crash and still owes its
// dirty regions to that copy (recovering in the normal state: the table
// does not say Owed, and the decree is the secondary's anyway), the
// owed range is then pulled from the target, which answers NotWhole: the
// primary's torn block stands, and the only good copy (the old extent,
// on a node still up, its disk mostly readable -- a transient EIO is
// all it took) is retired and wiped.
//
// The same failure without a move (TestReview89OwePageWriteFailsAfter
// PeerFailure's setting) pulls the range from the failed copy once it
// loads again.
func TestReview90MoveDegradedReplacesOwedCopy(t *testing.T) {
	r90MoveDegraded(t, true)
}

// Control: no move. Passes.
func TestReview90ControlPeerFailsNoMove(t *testing.T) {
	r90MoveDegraded(t, false)
}

func r90MoveDegraded(t *testing.T, move bool) {
	c := tornPair(t)
	h, r, p, s, third, a, seed := c.h, c.r, c.p, c.s, c.third, c.a, c.seed
	sseg := 1 - r.Primary
	if move {
		// The operator empties s's failing disk: its segment moves
		// to the third node (the move waits for the RLDev).
		h.rmStartMove(r.ID, sseg, third.id)
		h.run()
	}
	// The primary is back and owes region 0 to s; s is back, its
	// pulls not answered yet (muted), and fails on its own (EIO).
	h.mute = func(from, to NodeID, msg any) bool {
		_, pull := msg.(Pull)
		return pull && from == p.id && to == s.id
	}
	h.start(p)
	h.start(s)
	sr := func() *replica { return s.e.reps[r.ID] }
	if !h.tickUntil(5*time.Second, func() bool { return sr() != nil && sr().ready() && p.e.reps[r.ID].recovering() > 0 }) {
		t.Fatalf("setup: not recovering with s ready: %+v", h.rec(r.ID))
	}
	h.exec(s, sr().fail(errors.New("EIO (injected)")))
	h.run()
	if !h.tickUntil(5*time.Second, func() bool { return h.rec(r.ID).State == Degraded }) {
		t.Fatalf("setup: s's failure did not degrade: %+v", h.rec(r.ID))
	}
	h.mute = nil
	t.Logf("seed %d; after s's failure: %+v", seed, h.rec(r.ID))
	h.tickUntil(60*time.Second, func() bool { return h.rec(r.ID).State == Normal && p.e.reps[r.ID].recovering() == 0 })
	rp := h.rvRead(p.id, r.ID, 100, 1)
	if rp.Err != nil || !bytes.Equal(rp.Data, a) {
		t.Errorf("block 100's acknowledged value A (whole on s's old extent) is lost: read %v; table %+v; owed-not-whole %d",
			rp.Err, h.rec(r.ID), p.e.stats.OwedNotWhole)
	}
}
