package rldev

import (
	"bytes"
	"errors"
	"testing"
	"time"
)

// Outside review 93: the primary crashes (block 100 torn, a write in
// flight), and the moving secondary's disk fails while the primary is
// down (before the failure detector's verdict): its decree names the
// down primary, sets MovingFailed. The primary comes back with no owed
// page (its pull never began): Owed false, recovering 0, so it replaces
// the secondary's copy -- the only good copy of block 100 -- by the
// target. moving=false is the control (a secondary not moving).
func TestReview93MovingSecondaryFailsWhilePrimaryDown(t *testing.T)  { r93Down(t, true) }
func TestReview93SecondaryFailsWhilePrimaryDownControl(t *testing.T) { r93Down(t, false) }

func r93Down(t *testing.T, moving bool) {
	c := tornPair(t)
	h, r, p, s, third, a, seed := c.h, c.r, c.p, c.s, c.third, c.a, c.seed
	sseg := 1 - r.Primary
	if moving {
		h.rmStartMove(r.ID, sseg, third.id)
		h.run()
	}
	sr := func() *replica { return s.e.reps[r.ID] }
	h.start(s)
	if !h.tickUntil(5*time.Second, func() bool { return sr() != nil && sr().ready() }) {
		t.Fatalf("setup: s not ready: %+v", h.rec(r.ID))
	}
	h.exec(s, sr().fail(errors.New("EIO (injected)")))
	h.exec(s, s.e.Tick(h.env(s)))
	h.run()
	rec := h.rec(r.ID)
	t.Logf("seed %d: after s's failure (p down): %+v move %+v", seed, rec, rec.Move)
	if rec.State != Degraded || rec.Primary != r.Primary {
		t.Fatalf("setup: p was declared dead first: %+v", rec)
	}
	h.start(p)
	h.tickUntil(90*time.Second, func() bool { return h.rec(r.ID).State == Normal })
	h.tick(5 * time.Second)
	rec = h.rec(r.ID)
	t.Logf("after: %+v move %+v", rec, rec.Move)
	rp := h.rvRead(p.id, r.ID, 100, 1)
	if rp.Err != nil || !bytes.Equal(rp.Data, a) && !bytes.Equal(rp.Data, pattern(9, 1)) {
		t.Errorf("block 100 (acknowledged A, whole on s's copy) lost: read %v; s's copy replaced by the target: %v",
			rp.Err, NodeID(rec.Segs[sseg].Node) == third.id)
	}
}
