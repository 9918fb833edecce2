package rldev

import (
	"testing"
	"time"
)

// A primary that restarts with dirty regions pulls them from its peer
// (recovering); if that peer is declared dead meanwhile -- here it died
// first, and the primary fenced itself before any verdict could degrade
// the RLDev, as when the observers lose their majority -- the primary
// degrades the RLDev and serves its own copy of the regions (they go to
// the peer by resync, abandonRecovery). Before, a primary recovering never
// degraded: the RLDev stayed normal, every write waiting on the dead peer,
// and, the peer lost for good, neither a re-place nor accept-stale could
// help (found by the simulation's lost nodes, as-run seed 5002).
func TestRecoveringPrimaryDegradesWhenPeerDies(t *testing.T) {
	h := newHarness(t, 3, testDisk)
	r := h.create(256)
	p, s := h.nodes[NodeID(r.Segs[r.Primary].Node)], h.nodes[NodeID(r.Segs[1-r.Primary].Node)]
	h.mustWrite(p.id, r.ID, 0, pattern(1, 1))
	h.mustWrite(p.id, r.ID, 100, pattern(2, 1)) // its region dirty still (lazy clearing)
	h.crash(s, false, nil)
	h.crash(p, false, nil)
	h.start(p)
	if !h.tickUntil(3*time.Second, func() bool { rp := p.e.reps[r.ID]; return rp != nil && rp.recovering > 0 }) {
		t.Fatalf("setup: the primary is not recovering dirty regions: %+v", h.rec(r.ID))
	}
	h.dead[Subject{s.id, s.inc}] = true
	if !h.tickUntil(10*time.Second, func() bool { return h.rec(r.ID).State == Degraded }) {
		rp := p.e.reps[r.ID]
		t.Fatalf("the peer dead, the RLDev is not degraded: %+v (recovering %d)", h.rec(r.ID), rp.recovering)
	}
	h.mustWrite(p.id, r.ID, 101, pattern(3, 1))
	h.mustRead(p.id, r.ID, 0, pattern(1, 1))
	h.mustRead(p.id, r.ID, 100, pattern(2, 1))
	// The peer back: resynced from the primary, both copies whole.
	h.dead = map[Subject]bool{}
	h.start(s)
	if !h.tickUntil(20*time.Second, func() bool { return h.rec(r.ID).State == Normal }) {
		t.Fatalf("not resynced: %+v", h.rec(r.ID))
	}
	h.mustRead(s.id, r.ID, 100, pattern(2, 1))
	h.mustRead(s.id, r.ID, 101, pattern(3, 1))
}
