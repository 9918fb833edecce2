package rldev

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
)

// Outside review 91: review 90's fix keeps a moving segment whose own
// disk failed only if the table already says the primary owes it ranges
// (moveDegraded(me, !rec.Owed)). Record.Owed is set by the primary's own
// decree once it has loaded, joined and made its owed page durable; the
// secondary's failure decree can come first:
//
//   - primaryDown: the primary crashed (no verdict yet) and the
//     secondary's disk fails before the primary is back;
//   - toggleHeld: the primary is back, recovering, its "ranges owed"
//     decree not yet committed (one config-service round trip).
//
// Either way the move's target replaces the only good copy of the dirty
// region, the target answers NotWhole, the primary's torn block stands
// and, once the rebuild ends, the old extent (holding A) is wiped.
func TestReview91MoveDegradedWhilePrimaryDown(t *testing.T) { r91MoveDegraded(t, "primaryDown") }
func TestReview91MoveDegradedBeforeOwedToggle(t *testing.T) { r91MoveDegraded(t, "toggleHeld") }

func r91MoveDegraded(t *testing.T, mode string) {
	c := tornPair(t)
	h, r, p, s, third, a, seed := c.h, c.r, c.p, c.s, c.third, c.a, c.seed
	sseg := 1 - r.Primary
	h.rmStartMove(r.ID, sseg, third.id)
	h.run()
	sr := func() *replica { return s.e.reps[r.ID] }
	switch mode {
	case "primaryDown":
		h.start(s)
		if !h.tickUntil(5*time.Second, func() bool { return sr() != nil && sr().ready() }) {
			t.Fatalf("setup: s not ready: %+v", h.rec(r.ID))
		}
		h.exec(s, sr().fail(errors.New("EIO (injected)")))
		h.run()
		h.tick(time.Second)
		t.Logf("seed %d; s failed while p is down: %+v", seed, h.rec(r.ID))
		h.start(p)
	case "toggleHeld":
		h.mute = func(from, to NodeID, msg any) bool {
			_, pull := msg.(Pull)
			return pull && from == p.id && to == s.id
		}
		h.holdPropose = func(n *hnode, x Propose) bool { return n == p && strings.Contains(x.What, "ranges owed") }
		h.start(p)
		h.start(s)
		// Since the fix the decree naming p's incarnation says Owed
		// (no separate "ranges owed" decree to hold): once p is
		// named, s's failure keeps its moving copy.
		if !h.tickUntil(5*time.Second, func() bool {
			return sr() != nil && sr().ready() && p.e.reps[r.ID].recovering() > 0 && (len(h.heldDecrees) > 0 || h.rec(r.ID).Owed)
		}) {
			t.Fatalf("setup: not recovering with s ready and the owed decree held: %+v", h.rec(r.ID))
		}
		h.exec(s, sr().fail(errors.New("EIO (injected)")))
		h.run()
		h.tickUntil(3*time.Second, func() bool { return h.rec(r.ID).State == Degraded })
		var err error
		if len(h.heldDecrees) > 0 {
			held := h.heldDecrees[0]
			err = h.commit(held)
			h.exec(p, p.e.Decided(h.env(p), held.ID, err))
		}
		h.holdPropose, h.heldDecrees = nil, nil
		h.run()
		h.mute = nil
		t.Logf("seed %d; s failed before p's owed decree (%v): %+v", seed, err, h.rec(r.ID))
	}
	h.tickUntil(60*time.Second, func() bool { return h.rec(r.ID).State == Normal && p.e.reps[r.ID].recovering() == 0 })
	h.tick(5 * time.Second)
	rp := h.rvRead(p.id, r.ID, 100, 1)
	if rp.Err != nil || !bytes.Equal(rp.Data, a) {
		t.Errorf("block 100's acknowledged value A (whole on s's old extent) is lost: read %v; table %+v; owed-not-whole %d",
			rp.Err, h.rec(r.ID), p.e.stats.OwedNotWhole)
	}
}
