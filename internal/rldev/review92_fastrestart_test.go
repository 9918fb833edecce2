package rldev

import (
	"bytes"
	"errors"
	"testing"
	"time"
)

// Outside review 92, F2: primaryLive compares rec.Inc[peer] with
// r.e.nodes[pn], the registered incarnations as of the last table this
// engine took. The primary's node restarts: its session to the secondary
// is up (PeerUp) before the secondary's engine has taken a table with the
// new registration (in the harness: until the next decree; in the
// service: the membership watch lags the link's hello). The table still
// names the crashed incarnation, e.nodes still says it: "live". The
// secondary's disk fails while the new primary loads (its owed page
// durable, its naming decree -- the one that sets Owed -- not yet made):
// the move's target replaces the only good copy of block 100.
func TestReview92MoveDegradedPrimaryRestartedRegistrationLags(t *testing.T) {
	c := tornPair(t)
	h, r, p, s, third, a, seed := c.h, c.r, c.p, c.s, c.third, c.a, c.seed
	sseg := 1 - r.Primary
	h.rmStartMove(r.ID, sseg, third.id)
	h.run()
	sr := func() *replica { return s.e.reps[r.ID] }
	h.start(s)
	if !h.tickUntil(5*time.Second, func() bool { return sr() != nil && sr().ready() }) {
		t.Fatalf("setup: s not ready: %+v", h.rec(r.ID))
	}
	oldInc := p.inc
	// (The target is cut from p for the moment: its "receiving"
	// decree would otherwise bring every engine a table, and in the
	// harness the registered incarnations with it.)
	h.partition(p.id, third.id)
	h.start(p) // PeerUp at s; s's e.nodes still has p's old incarnation
	pn := NodeID(h.rec(r.ID).Segs[r.Primary].Node)
	t.Logf("seed %d: p restarted as %d; at s: up %v, e.nodes[p] %d, table Inc %d, Owed %v",
		seed, p.inc, s.e.up[pn], s.e.nodes[pn], h.rec(r.ID).Inc[r.Primary], h.rec(r.ID).Owed)
	if s.e.nodes[pn] != oldInc {
		t.Fatalf("setup: s already knows p's new incarnation")
	}
	h.exec(s, sr().fail(errors.New("EIO (injected)")))
	h.exec(s, s.e.Tick(h.env(s))) // s's decree (before p's load ends)
	h.run()
	h.heal(p.id, third.id)
	rec := h.rec(r.ID)
	replaced := NodeID(rec.Segs[sseg].Node) == third.id
	t.Logf("after s's failure: %+v (s's copy replaced by the target: %v)", rec, replaced)
	h.tickUntil(60*time.Second, func() bool { return h.rec(r.ID).State == Normal && p.e.reps[r.ID].recovering() == 0 })
	h.tick(5 * time.Second)
	rp := h.rvRead(p.id, r.ID, 100, 1)
	if rp.Err != nil || !bytes.Equal(rp.Data, a) {
		t.Errorf("block 100's acknowledged value A (whole on s's old extent) is lost: read %v; replaced %v; table %+v; owed-not-whole %d",
			rp.Err, replaced, h.rec(r.ID), p.e.stats.OwedNotWhole)
	}
}
