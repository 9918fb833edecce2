package rldev

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
)

// Review 40: scripted interleavings against 425bdc7 (Engine.extentBusy,
// the settling decree).

// TestReview40LateDecreeBeatsSettle: the decree answered failed was only
// slow. The engine settles it (a decree on the same version, changing
// nothing), but the slow one commits first: the settle must fail, the
// engine must see the slow decree's effect (the table), and the failed
// replica must still come back and serve what was acknowledged.
func TestReview40LateDecreeBeatsSettle(t *testing.T) {
	h := newHarness(t, 2, testDisk, func(h *harness) { h.scrubRate = -1 })
	rec := h.create(512)
	id := rec.ID
	a, b := h.nodes[rec.Segs[0].Node], h.nodes[rec.Segs[1].Node]
	baseA := rec.Segs[0].Offset
	h.mustWrite(a.id, id, 10, pattern(1, 1))

	// b dies; a serves alone; b's next incarnation asks to be resynced,
	// and a's "resync" decree is held by a slow config service.
	held := h.heldResync(id, a, b)

	h.failWrite = func(n *hnode, x DiskWrite) bool { return n == a && x.Encode != nil && x.Off == baseA+blockOff(100) }
	h.writeBy(a, id, 100, pattern(9, 1))
	h.failWrite = nil
	ra := a.e.reps[id]
	if ra.state != repFailed {
		t.Fatalf("setup: a's replica %v, want failed", ra.state)
	}
	// The slow decree times out at a (it is still in the config service).
	h.exec(a, a.e.Decided(h.env(a), held.ID, errors.New("context deadline exceeded")))
	h.run()
	// a settles it: hold the settle.
	h.holdPropose = func(n *hnode, x Propose) bool { return n == a && strings.Contains(x.What, "settling") }
	if !h.tickUntil(5*time.Second, func() bool { return len(h.heldDecrees) == 1 }) {
		t.Fatalf("no settling decree: unsure %v unsettled %v awaitTable %v", a.e.unsure, a.e.unsettled, a.e.awaitTable)
	}
	h.holdPropose = nil
	settle := h.heldDecrees[0]
	h.heldDecrees = nil
	// The slow decree commits first; then the settle is tried: it fails.
	if err := h.commit(held); err != nil {
		t.Fatalf("the slow decree: %v", err)
	}
	h.run()
	serr := h.commit(settle)
	if serr == nil {
		t.Fatalf("the settle committed after the slow decree")
	}
	h.exec(a, a.e.Decided(h.env(a), settle.ID, serr))
	h.run()
	t.Logf("after: record %+v, a %v, awaitTable %v", h.rec(id), ra.state, a.e.awaitTable)
	if !h.tickUntil(60*time.Second, func() bool {
		r := h.rec(id)
		return r.State == Normal && !r.Stale[0] && !r.Stale[1]
	}) {
		t.Fatalf("never normal again: %+v (a %v, b %v)", h.rec(id), ra.state, b.e.reps[id])
	}
	for _, n := range []*hnode{a, b} {
		rp := h.rvRead(n.id, id, 10, 1)
		if rp.Err != nil || !bytes.Equal(rp.Data, pattern(1, 1)) {
			t.Errorf("read of block 10 at node %d: %v", n.id, rp.Err)
		}
	}
	h.sameCopies(id)
}

// TestReview40NoSettleAfterStaleVersion: a decree refused because the
// namespace moved (a healthy cluster's conflict) is not settled: the
// linearizable table that follows is past its base version.
func TestReview40NoSettleAfterStaleVersion(t *testing.T) {
	h := newHarness(t, 2, testDisk, func(h *harness) { h.scrubRate = -1 })
	rec := h.create(512)
	id := rec.ID
	a, b := h.nodes[rec.Segs[0].Node], h.nodes[rec.Segs[1].Node]
	// b dies; a serves alone; b's next incarnation asks to be resynced,
	// and a's "resync" decree is held by a slow config service.
	held := h.heldResync(id, a, b)
	// Someone else's decree moves the namespace (watch lost), then a's is
	// answered stale.
	h.noTables = true
	tb := h.table()
	if err := h.commit(Propose{Version: tb.Version, Ops: nil}); err != nil {
		t.Fatal(err)
	}
	h.noTables = false
	err := h.commit(held)
	if err == nil {
		t.Fatal("setup: held decree committed")
	}
	before := a.e.stats.Decrees
	settles := 0
	h.holdPropose = func(n *hnode, x Propose) bool {
		if strings.Contains(x.What, "settling") {
			settles++
		}
		return false
	}
	h.exec(a, a.e.Decided(h.env(a), held.ID, err))
	h.run()
	h.tick(10 * time.Second)
	if settles > 0 {
		t.Errorf("%d settling decrees after a stale-version refusal", settles)
	}
	t.Logf("decrees since: %d; record %+v", a.e.stats.Decrees-before, h.rec(id))
}
