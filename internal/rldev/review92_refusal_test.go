package rldev

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
)

// Outside review 92, F2: the naming decree carries Owed only for ranges
// owed at load. A range pulled back after the moving secondary refused a
// write for its token (startRecoveryOf) is owed in the normal state, and
// the table says so only with the primary's later "ranges owed" toggle (a
// config-service round trip). The secondary's disk fails meanwhile: the
// primary is live and named, rec.Owed is false, so the move's target
// replaces the secondary; the primary gives the range up and the write
// the secondary refused (fenced out by a newer token) stands in place of
// the acknowledged value A.
func TestReview92MoveDegradedRefusalPullBackBeforeToggle(t *testing.T) {
	// (The move's copy slow: it is still going when s fails.)
	h, r, p, s, third := slowMoveTrio(t)
	sseg := 1 - r.Primary
	a := pattern(1, 1)
	h.mustWrite(p.id, r.ID, 0, a)
	h.rmStartMove(r.ID, sseg, third.id)
	h.run()
	h.tick(time.Second)

	h.partition(p.id, s.id)
	q1 := h.write(p.id, r.ID, 0, pattern(9, 1), rmFence(5)) // W1: lands at p, its forward waits
	h.run()
	h.heal(p.id, s.id)
	// From now on: p's pulls to s are lost (the peer slow), and p's
	// "ranges owed" decree is held (the config service slow).
	h.mute = func(from, to NodeID, msg any) bool {
		_, pull := msg.(Pull)
		return pull && from == p.id && to == s.id
	}
	h.holdPropose = func(n *hnode, x Propose) bool { return n == p && strings.Contains(x.What, "ranges owed") }
	h.write(p.id, r.ID, 200, pattern(2, 1), rmFence(7)) // W2 reaches s first: s admits 7
	h.run()
	if !h.tickUntil(5*time.Second, func() bool { _, ok := h.replies[q1]; return ok && len(h.heldDecrees) > 0 }) {
		t.Fatalf("setup: W1 not refused or no owed decree: W1 %+v, held %d, table %+v", h.replies[q1], len(h.heldDecrees), h.rec(r.ID))
	}
	if !errors.Is(h.replies[q1].Err, ErrStaleToken) {
		t.Fatalf("setup: W1 not refused by s: %v", h.replies[q1].Err)
	}
	pr := p.e.reps[r.ID]
	t.Logf("p recovering %d (owed %d); table Owed %v, move %+v", pr.recovering(), pr.owedCount(), h.rec(r.ID).Owed, h.rec(r.ID).Move)

	sr := s.e.reps[r.ID]
	h.exec(s, sr.fail(errors.New("EIO (injected)")))
	h.exec(s, s.e.Tick(h.env(s)))
	h.run()
	replaced := NodeID(h.rec(r.ID).Segs[sseg].Node) == third.id
	t.Logf("s failed before p's owed decree: replaced by the target %v: %+v", replaced, h.rec(r.ID))
	for _, held := range h.heldDecrees {
		err := h.commit(held)
		h.exec(p, p.e.Decided(h.env(p), held.ID, err))
	}
	h.holdPropose, h.heldDecrees, h.mute = nil, nil, nil
	h.run()
	h.tickUntil(60*time.Second, func() bool { return h.rec(r.ID).State == Normal && p.e.reps[r.ID].recovering() == 0 })
	h.tick(5 * time.Second)
	rp := h.rvRead(p.id, r.ID, 0, 1)
	if rp.Err != nil || !bytes.Equal(rp.Data, a) {
		got := byte(0)
		if len(rp.Data) > 0 {
			got = rp.Data[0]
		}
		t.Errorf("block 0 after W1 (token 5) was refused by s, which had admitted token 7: read %v, first byte %d (want A, %d; W1 was 9): replaced %v; table %+v",
			rp.Err, got, a[0], replaced, h.rec(r.ID))
	}
}
