package rldev

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestReview38bDecreeAfterReload (review 38, defect B): a decree of a
// replica's failed life committing after the replica loaded again. Primary
// a has resynced b and proposed "resynced" (Normal, nothing stale); the
// config service is slow. Meanwhile W_f (block 20) is forwarded to b and
// lands there, and a's own write of it fails: a fails, W_f is answered
// "may have been written". The table a holds still says b stale, so a
// loaded again after ReloadEvery and served as the only up-to-date copy,
// moving W_f's dirty region into its degraded-mode log. Then the old
// decree committed: Normal, nothing stale, and lazyClear dropped the
// degraded-mode region, never copied: block 20 read D1 at a and W_f at b,
// both serving in the normal state. Now a replica loads again only once no
// decree of its engine is in flight (decreeOut) and the table has shown
// the last one decided (awaitTable): a stays failed until the "resynced"
// table arrives, then leaves the RLDev by decree (b primary, a stale) and
// is resynced from b, block 20 with the rest.
func TestReview38bDecreeAfterReload(t *testing.T) {
	// No scrubber: it compares the replicas' generations and would
	// eventually repair the divergence this test looks for (the defect is
	// that the normal state served two versions, however long).
	h := newHarness(t, 2, testDisk, func(h *harness) { h.scrubRate = -1 })
	rec := h.create(512)
	id := rec.ID
	a, b := h.nodes[rec.Segs[0].Node], h.nodes[rec.Segs[1].Node] // a primary, b secondary
	baseA, baseB := rec.Segs[0].Offset, rec.Segs[1].Offset
	h.mustWrite(a.id, id, 20, pattern(1, 1)) // D1 on both
	dataAt := func(node *hnode, base int64, block uint64) func(*hnode, DiskWrite) bool {
		return func(n *hnode, x DiskWrite) bool { return n == node && x.Encode != nil && x.Off == base+blockOff(block) }
	}

	// b's disk fails on a forwarded write: b leaves (stale), a degraded.
	// ReloadEvery later b loads again, asks to be resynced, and a copies
	// it whole; once done a proposes "resynced", which the config service
	// holds.
	h.holdPropose = func(n *hnode, x Propose) bool { return n == a && strings.Contains(x.What, "resynced") }
	h.failWrite = dataAt(b, baseB, 100)
	if rp, ok := h.replies[h.writeBy(a, id, 100, pattern(9, 1))]; !ok || rp.Err != nil {
		t.Fatalf("setup: the write that fails b: %+v (replied %v)", rp.Err, ok)
	}
	h.failWrite = nil
	if !h.tickUntil(30*time.Second, func() bool { return len(h.heldDecrees) == 1 }) {
		t.Fatalf("setup: no \"resynced\" decree from node %d: record %+v", a.id, h.rec(id))
	}
	held := h.heldDecrees[0]
	if r := h.rec(id); r.State != Resyncing || !r.Stale[1] || r.Primary != 0 {
		t.Fatalf("setup: record %+v, want resyncing, node %d primary, segment 1 stale", r, a.id)
	}

	// W_f: forwarded to b, where it lands; a's write of it fails. a
	// fails; W_f is answered "may have been written".
	h.failWrite = dataAt(a, baseA, 20)
	wf := h.writeBy(a, id, 20, pattern(2, 1))
	h.failWrite = nil
	if rp, ok := h.replies[wf]; !ok || !errors.Is(rp.Err, ErrMaybeWritten) {
		t.Fatalf("W_f: %+v (replied %v), want ErrMaybeWritten", rp.Err, ok)
	}
	ra := a.e.reps[id]
	if ra.state != repFailed {
		t.Fatalf("setup: node %d's replica %v after W_f's local write failed, want failed", a.id, ra.state)
	}

	// ReloadEvery (5 s) and more pass, the decree still held: a must not
	// load again (before the fix it did at 5 s, the table it holds
	// saying b stale, and served).
	reloaded := false
	if h.tickUntil(10*time.Second, func() bool { return ra.state != repFailed }) {
		reloaded = true
		t.Errorf("node %d loaded its failed replica again (state %v) while its \"resynced\" decree was in flight", a.id, ra.state)
	}

	// The decree commits and is answered, but the table that shows it is
	// slow to arrive (no watch, the Refresh unanswered): a still must not
	// load again, since the table it holds does not show its decree yet.
	h.noTables = true
	err := h.commit(held)
	if err != nil {
		t.Fatalf("the held decree no longer commits: %v (record %+v)", err, h.rec(id))
	}
	h.exec(a, a.e.Decided(h.env(a), held.ID, err))
	h.run()
	if r := h.rec(id); r.State != Normal || r.Stale[0] || r.Stale[1] {
		t.Fatalf("the held decree committed: record %+v, want normal, nothing stale", r)
	}
	if h.tickUntil(2*time.Second, func() bool { return ra.state != repFailed }) && !reloaded {
		t.Errorf("node %d loaded its failed replica again (state %v) after its decree was decided, before a table showed it", a.id, ra.state)
	}
	// The table arrives: a, failed in a normal RLDev, leaves it by decree
	// and is resynced from b.
	h.noTables = false
	h.tables(true)
	h.run()
	rb := b.e.reps[id]
	if !h.tickUntil(60*time.Second, func() bool {
		r := h.rec(id)
		return r.State == Normal && !r.Stale[0] && !r.Stale[1] && a.e.reps[id] == ra && ra.ready() && rb.ready() &&
			a.e.table.Version == h.ns.Version && b.e.table.Version == h.ns.Version
	}) {
		t.Fatalf("not normal again with both replicas serving: record %+v (node %d: %v, node %d: %v)", h.rec(id), a.id, ra.state, b.id, rb.state)
	}

	// Normal, both serving: each replica's copy of block 20 is the same.
	rpA, rpB := h.rvRead(a.id, id, 20, 1), h.rvRead(b.id, id, 20, 1)
	if rpA.Err != nil || rpB.Err != nil {
		t.Fatalf("reads of block 20: node %d: %v, node %d: %v", a.id, rpA.Err, b.id, rpB.Err)
	}
	if !bytes.Equal(rpA.Data, rpB.Data) {
		t.Fatalf("block 20 in the normal state (record %+v): node %d serves %#x..., node %d serves %#x... (W_f's is %#x, D1's %#x): "+
			"a decree of the failed life committed after the replica loaded again, and the degraded-mode region that named W_f's block was cleared, never copied",
			h.rec(id), a.id, rpA.Data[0], b.id, rpB.Data[0], pattern(2, 1)[0], pattern(1, 1)[0])
	}
	if !bytes.Equal(rpA.Data, pattern(2, 1)) {
		t.Errorf("block 20 holds %#x... on both, want W_f's %#x... (it landed on node %d and nothing wrote the block since)", rpA.Data[0], pattern(2, 1)[0], b.id)
	}
	h.sameCopies(id)
}
