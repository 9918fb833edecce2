package rldev

import (
	"bytes"
	"errors"
	"math/rand"
	"testing"
	"time"
)

// Outside review 86: a primary recovering its dirty regions degrades when
// its peer is declared dead (e91bbe6). These probes look at what that
// does to a block of an unpulled region torn on the primary at its crash.

// r86Block decodes block b of RLDev id as node n's disk holds it now.
func r86Block(h *harness, n *hnode, id, b uint64) ([]byte, BlockStatus) {
	rec := h.rec(id)
	for _, sg := range rec.Segs {
		if NodeID(sg.Node) != n.id {
			continue
		}
		raw := make([]byte, PhysBlockSize)
		n.devs[sg.Disk].ReadAt(raw, sg.Offset+blockOff(b))
		d, _, st := DecodeBlock(raw, id, b)
		return append([]byte(nil), d...), st
	}
	h.t.Fatalf("node %d holds no segment of %d", n.id, id)
	return nil, 0
}

// r86TornSetup: block 100 holds A (acknowledged, on both copies); a write
// of B to it is in flight at the primary (its local write issued, not
// synced; its forward never reaches the secondary). Both nodes crash, the
// primary's unsynced write torn (a seed that tears block 100 is taken);
// the primary restarts first and is recovering the region.
func r86TornSetup(t *testing.T) (*harness, *Record, *hnode, *hnode, []byte) {
	c := tornPair(t)
	h, r, p, s := c.h, c.r, c.p, c.s
	t.Logf("seed %d tears block 100 on the primary (node %d); the secondary (node %d) holds A", c.seed, p.id, s.id)
	h.start(p)
	if !h.tickUntil(3*time.Second, func() bool { rp := p.e.reps[r.ID]; return rp != nil && rp.recovering() > 0 }) {
		t.Fatalf("setup: the primary is not recovering: %+v", h.rec(r.ID))
	}
	return h, r, p, s, c.a
}

// tornCase is where every torn-block probe starts (r86TornSetup,
// r89TornSetup, reviews 90-93): block 100 holds A (acknowledged, on both
// copies); a write of B to it was in flight at the primary (its local
// write issued, not synced; its forward never delivered); both nodes
// crashed, the primary's unsynced write torn (the first seed that tears
// block 100 is taken). Both nodes are down; third is the RLDev's other
// node.
type tornCase struct {
	h           *harness
	r           *Record
	p, s, third *hnode
	a           []byte
	seed        int64
}

func tornPair(t *testing.T) tornCase {
	t.Helper()
	for seed := int64(1); seed < 64; seed++ {
		h := newHarness(t, 3, testDisk, func(h *harness) { h.scrubRate = -1 })
		r := h.create(256)
		c := tornCase{h: h, r: r, p: h.nodes[NodeID(r.Segs[r.Primary].Node)], s: h.nodes[NodeID(r.Segs[1-r.Primary].Node)], a: pattern(1, 1), seed: seed}
		for _, n := range h.nodes {
			if n != c.p && n != c.s {
				c.third = n
			}
		}
		h.mustWrite(c.p.id, r.ID, 100, c.a) // acknowledged; its region stays dirty (lazy clearing)
		q := h.write(c.p.id, r.ID, 100, pattern(9, 1), nil)
		h.crash(c.s, false, nil) // the forward (queued) is never delivered
		h.crash(c.p, true, rand.New(rand.NewSource(seed)))
		h.run()
		if _, ok := h.replies[q]; ok {
			t.Fatalf("setup: the write of B was answered: %+v", h.replies[q])
		}
		if _, st := r86Block(h, c.p, r.ID, 100); st != BlockCorrupt {
			continue
		}
		if d, st := r86Block(h, c.s, r.ID, 100); st != BlockOK || !bytes.Equal(d, c.a) {
			t.Fatalf("setup: the secondary's block 100 is %v", st)
		}
		return c
	}
	t.Fatal("setup: no seed tears block 100")
	return tornCase{}
}

// Control (passes): the secondary comes back before any dead verdict
// (what every case did before e91bbe6): the recovery pulls its copy, and
// block 100 reads A on both copies.
func TestReview86TornDirtyBlockRecoveredWhenPeerReturns(t *testing.T) {
	h, r, p, s, a := r86TornSetup(t)
	h.start(s)
	if !h.tickUntil(10*time.Second, func() bool { return p.e.reps[r.ID].recovering() == 0 }) {
		t.Fatalf("not recovered: %+v", h.rec(r.ID))
	}
	h.mustRead(p.id, r.ID, 100, a)
	h.mustRead(s.id, r.ID, 100, a)
	h.sameCopies(r.ID)
}

// Outside review 86 (failing on e91bbe6, which degraded and served the
// region; now the RLDev degrades with the region owed: owed.go): the
// secondary, whose disk holds A (the last acknowledged value of block
// 100), is declared dead while the primary recovers. e91bbe6 degraded,
// abandonRecovery put the region in the degraded-mode log, block 100 read
// ErrCorrupt at the primary, and when the secondary came back the resync
// copied the torn block over its good copy of A: gone from both copies.
// Now the region is owed: the RLDev degrades, block 100 answers
// ErrUnavailable at once, and when the secondary is back (stale, its copy
// whole) the region is pulled from it before the resync.
func TestReview86TornDirtyBlockOverwritesPeerAtResync(t *testing.T) {
	h, r, p, s, a := r86TornSetup(t)
	h.dead[Subject{s.id, s.inc}] = true
	if !h.tickUntil(5*time.Second, func() bool { return h.rec(r.ID).State == Degraded }) {
		t.Fatalf("not degraded on the verdict while recovering (owed %d): %+v", p.e.reps[r.ID].owedCount(), h.rec(r.ID))
	}
	if rp := h.rvRead(p.id, r.ID, 100, 1); !errors.Is(rp.Err, ErrUnavailable) {
		t.Fatalf("block 100 at the degraded primary: %v, want ErrUnavailable", rp.Err)
	}
	wq := h.write(p.id, r.ID, 100, pattern(7, 1), nil)
	h.run()
	if rp := h.replies[wq]; !errors.Is(rp.Err, ErrUnavailable) {
		t.Fatalf("a write of block 100 at the degraded primary: %v, want ErrUnavailable", rp.Err)
	}
	// A restart of the primary meanwhile finds the region owed again.
	h.crash(p, false, nil)
	h.start(p)
	if !h.tickUntil(5*time.Second, func() bool { rp := p.e.reps[r.ID]; return rp != nil && rp.ready() && rp.owedCount() == 1 }) {
		t.Fatalf("the restarted primary does not owe the region: %+v", h.rec(r.ID))
	}
	if rp := h.rvRead(p.id, r.ID, 100, 1); !errors.Is(rp.Err, ErrUnavailable) {
		t.Fatalf("block 100 at the restarted primary: %v, want ErrUnavailable", rp.Err)
	}
	h.dead = map[Subject]bool{}
	h.start(s)
	if !h.tickUntil(20*time.Second, func() bool { return h.rec(r.ID).State == Normal && p.e.reps[r.ID].recovering() == 0 }) {
		t.Fatalf("not resynced: %+v", h.rec(r.ID))
	}
	h.mustRead(p.id, r.ID, 100, a)
	h.mustRead(s.id, r.ID, 100, a)
	h.sameCopies(r.ID)
}

// The secondary is lost for good while the primary owes it the region:
// its segment is re-placed (forget-node --re-place's decree) on the third
// node, whose blank copy answers the owed pull NotWhole; the primary's
// copy then stands (the torn block reads as corrupt: both copies of A are
// gone, one torn, one lost), and the RLDev ends normal on the new pair.
func TestOwedRangeReleasedWhenPeerReplaced(t *testing.T) {
	h, r, p, s, _ := r86TornSetup(t)
	h.dead[Subject{s.id, s.inc}] = true
	if !h.tickUntil(5*time.Second, func() bool { return h.rec(r.ID).State == Degraded }) {
		t.Fatalf("not degraded: %+v", h.rec(r.ID))
	}
	var live []uint64
	for id := range h.nodes {
		if id != s.id {
			live = append(live, uint64(id))
		}
	}
	tb := h.table()
	nr, what, err := tb.Evacuate(r.ID, uint64(s.id), live)
	if err != nil || nr == nil {
		t.Fatalf("evacuate: %v %v", nr, err)
	}
	t.Logf("evacuate: %s", what)
	h.r83Commit(tb, nr)
	if !h.tickUntil(30*time.Second, func() bool {
		rec := h.rec(r.ID)
		return rec.State == Normal && p.e.reps[r.ID].recovering() == 0
	}) {
		t.Fatalf("not normal on the new pair: %+v (owed %d)", h.rec(r.ID), p.e.reps[r.ID].owedCount())
	}
	rec := h.rec(r.ID)
	for _, sg := range rec.Segs {
		if NodeID(sg.Node) == s.id {
			t.Fatalf("the lost node still holds a segment: %+v", rec)
		}
	}
	for _, sg := range rec.Segs {
		n := NodeID(sg.Node)
		if rp := h.rvRead(n, r.ID, 0, 1); rp.Err != nil {
			t.Fatalf("block 0 at node %d: %v", n, rp.Err)
		}
		if rp := h.rvRead(n, r.ID, 100, 1); !errors.Is(rp.Err, ErrCorrupt) {
			t.Fatalf("block 100 (torn on the only copy left) at node %d: %v, want ErrCorrupt", n, rp.Err)
		}
	}
}

// Outside review 86, a defect older than e91bbe6 (failing before owed
// ranges): the same loss by abandonRecovery's older use -- the
// secondary's disk fails a read while the primary pulls the torn block's
// region (it turns stale by its own failure), then it loads again (the
// error was transient) and is resynced: the torn block, sent as badGen,
// overwrote its whole copy of A. Now the region is owed, pulled from the
// secondary once it is back, before the resync.
func TestReview86TornDirtyBlockOverwritesPeerAfterPeerDiskError(t *testing.T) {
	h, r, p, s, a := r86TornSetup(t)
	h.holdRead = func(n *hnode, x DiskRead) bool { return n == s && x.Run != nil }
	h.start(s)
	sr := func() *replica { return s.e.reps[r.ID] }
	if !h.tickUntil(5*time.Second, func() bool { return len(h.held) > 0 }) {
		t.Fatalf("setup: the secondary does not read for the pull: %+v", h.rec(r.ID))
	}
	h.holdRead = nil
	// The read fails (EIO): what onPull's error path does.
	h.exec(s, sr().fail(errors.New("EIO (injected)")))
	h.run()
	for len(h.held) > 0 {
		h.release(0)
	}
	if !h.tickUntil(5*time.Second, func() bool { return h.rec(r.ID).State == Degraded }) {
		t.Fatalf("setup: the secondary's failure did not degrade: %+v (secondary %v)", h.rec(r.ID), sr().state)
	}
	if !h.tickUntil(60*time.Second, func() bool { return h.rec(r.ID).State == Normal }) {
		t.Fatalf("not resynced: %+v", h.rec(r.ID))
	}
	_, st := r86Block(h, s, r.ID, 100)
	q := h.read(s.id, r.ID, 100, 1)
	h.run()
	rp := h.replies[q]
	t.Logf("after the resync: the secondary's block 100 is %v on disk; a read answers %v (primary recovering %d)", st, rp.Err, p.e.reps[r.ID].recovering())
	if rp.Err != nil || !bytes.Equal(rp.Data, a) && !bytes.Equal(rp.Data, pattern(9, 1)) {
		t.Errorf("block 100's acknowledged value A, whole on the secondary, was overwritten by the resync with the primary's torn block (%v, read: %v)", st, rp.Err)
	}
}
