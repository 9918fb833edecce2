package rldev

import (
	"errors"
	"testing"
	"time"

	pb "github.com/grovestore/grove/api/grovepb"
)

// Limitation (passes, documents it) for Q3/Q4: an RLDev with its
// dirty-region log off (every transaction log's: txn/directory.go creates
// them so) cannot be moved or re-placed (StartMove refuses). One with a
// segment on a node lost for good can therefore never be evacuated, and
// the node never forgotten: forget-node --re-place exits 1 with the
// move's message ("it cannot be moved"), forget-node without it exits 1
// naming the segment and hinting a grove rldev move that is refused too.
// The RLDev stays on one copy.
func TestReview85EvacuateDRLOff(t *testing.T) {
	h := newHarness(t, 3, testDisk, func(h *harness) { h.copyRate = 256 * BlockSize })
	tb := h.table()
	r, err := tb.Create(256, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.propose(&pb.Decree{Namespace: Namespace, ExpectedVersion: tb.Version, Ops: []*pb.Op{r.PutOp()}}); err != nil {
		t.Fatal(err)
	}
	h.run()
	h.joined(r.ID)
	s := h.nodes[NodeID(r.Segs[1].Node)]
	h.crash(s, false, nil)
	h.dead[Subject{s.id, s.inc}] = true
	h.run()
	if !h.tickUntil(10*time.Second, func() bool { x := h.rec(r.ID); return x.State == Degraded && x.Stale[1] }) {
		t.Fatalf("setup: not degraded: %+v", h.rec(r.ID))
	}
	var cands []uint64
	for _, n := range h.sorted() {
		if n != s {
			cands = append(cands, uint64(n.id))
		}
	}
	_, _, err = h.table().Evacuate(r.ID, uint64(s.id), cands)
	t.Logf("Evacuate: %v", err)
	if !errors.Is(err, ErrMove) {
		t.Fatalf("changed: %v", err)
	}
	_, err = h.table().Forget(uint64(s.id))
	t.Logf("Forget: %v", err)
	if !errors.Is(err, ErrForget) {
		t.Fatalf("changed: %v", err)
	}
}

// Limitation (passes, documents it) for Q2: the forgotten disk is known
// by its header's UUID alone. A disk whose header only is wiped (what a
// "wipe it" in the engine's log may be taken to mean: wipefs, the first
// MiB zeroed), or whose two header copies are unreadable (ReadDiskHeader:
// "taken as a new disk", formatted anew), comes back with another UUID
// and is registered anew, not forgotten -- over extents Forget freed
// without a wipe (the extents retiring there, the old places of its
// segments). A segment placed there finds the old superblock and fails
// to load on every start ("the segment at X holds rldev R"): the new
// RLDev lives on one copy. Before forget-node, an extent was freed only
// once wiped, so a header-only wipe was harmless.
func TestReview85ForgottenDiskHeaderWiped(t *testing.T) {
	h, id, p, s, tg := r81ThreeNodes(t)
	h.mustWrite(p.id, id, 700, pattern(1, 1))
	seg := h.rec(id).SegmentOf(uint64(s.id))
	old := h.rec(id).Segs[seg]
	h.crash(s, false, nil)
	h.dead[Subject{s.id, s.inc}] = true
	h.run()
	if !h.tickUntil(10*time.Second, func() bool { r := h.rec(id); return r.State == Degraded && r.Stale[seg] }) {
		t.Fatalf("setup: %+v", h.rec(id))
	}
	tb := h.table()
	nr, _, err := tb.Evacuate(id, uint64(s.id), []uint64{uint64(p.id), uint64(tg.id)})
	if err != nil {
		t.Fatal(err)
	}
	h.r85Commit(tb, nr)
	if !h.tickUntil(60*time.Second, func() bool { return h.rec(id).State == Normal }) {
		t.Fatalf("not rebuilt: %+v", h.rec(id))
	}
	if _, err := h.forgetCommit(s.id); err != nil {
		t.Fatal(err)
	}
	// The header wiped (both copies), nothing else.
	dev := s.devs[0]
	if _, err := dev.WriteAt(make([]byte, 2*PageSize), 0); err != nil {
		t.Fatal(err)
	}
	if err := dev.Sync(); err != nil {
		t.Fatal(err)
	}
	h.start(s)
	h.tick(2 * time.Second)
	d := h.table().Disks[DiskKey{uint64(s.id), 0}]
	_, super := r82PlatterSuperAt(s, old)
	t.Logf("disk %+v; the old extent %v still holds a superblock: %v", d, old, super)
	if d.Forgotten || !super {
		t.Fatalf("changed: %+v %v", d, super)
	}
	for i := 0; i < 3; i++ {
		c := h.create(1024)
		if c.SegmentOf(uint64(s.id)) >= 0 && c.Segs[c.SegmentOf(uint64(s.id))] == old {
			h.tick(5 * time.Second)
			rep := s.e.reps[c.ID]
			t.Logf("rldev %d placed at %v: s's replica %v; the record %v stale %v", c.ID, old, rep.state, h.rec(c.ID).State, h.rec(c.ID).Stale)
			return
		}
	}
	t.Logf("no create landed on %v", old)
}
