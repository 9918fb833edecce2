package rldev

import (
	"errors"
	"strings"
	"testing"
	"time"

	pb "github.com/grovestore/grove/api/grovepb"
)

// Outside review 85: grove rldev forget-node (Table.Forget, Table.Evacuate,
// Disk.Forgotten, the engine's part).

// r85Commit passes a record by decree conditional on tb's version.
func (h *harness) r85Commit(tb *Table, nr *Record) {
	h.t.Helper()
	if err := h.propose(&pb.Decree{Namespace: Namespace, ExpectedVersion: tb.Version, Ops: []*pb.Op{nr.PutOp()}}); err != nil {
		h.t.Fatalf("decree: %v", err)
	}
	h.run()
}

// Outside review 85, Q1/Q3 (failing before ForgetDisks; Evacuate now
// drops them only on forgotten disks): Evacuate dropped the extents retiring on the node in its
// own decree, one per RLDev, before -- and apart from -- the decree that
// marks the node's disks forgotten. Between the two (and for good if the
// command stops after an Evacuate decree: forget-node --re-place
// --gone-for-good exits 3 at the first RLDev not degraded yet, or on a
// timeout, or on ErrNoSpace for a later RLDev) the table lists an
// unwiped extent as free space on a disk that is not forgotten. It is
// the one place the invariant "an extent is free only once wiped (or its
// disk forgotten)" breaks: Create/CreateOn/moves then place segments over
// an old superblock. If the node then runs again with that disk (the
// operator, seeing exit 3, finds it was not gone after all; or it comes
// back before the rerun, which then refuses "alive"), a new RLDev placed
// there has a replica that fails to load ("the segment at X holds rldev
// R") on every start: the new RLDev lives on one copy.
//
// Scenario (3 nodes p, s, tg; s has two disks): s dies; its stale segment
// is re-placed on s's other disk (review 82's "another disk of a downed
// node"), the old extent s/0@X retiring. s is then declared gone for
// good: Evacuate re-places the segment on tg, dropping s/0@X. The
// command stops there (no Forget). s comes back with its disks, the
// RLDev is rebuilt and normal; a new RLDev is created.
func TestReview85EvacuateFreesUnwipedExtentBeforeForget(t *testing.T) {
	h, id, p, s, tg := r81ThreeNodes(t)
	h.r82AddDisk(s)
	h.joined(id)
	h.mustWrite(p.id, id, 700, pattern(1, 1))
	h.tick(3 * time.Second)
	seg := h.rec(id).SegmentOf(uint64(s.id))
	old := h.rec(id).Segs[seg]
	h.crash(s, false, nil)
	h.dead[Subject{s.id, s.inc}] = true
	h.run()
	if !h.tickUntil(10*time.Second, func() bool { r := h.rec(id); return r.State == Degraded && r.Stale[seg] }) {
		t.Fatalf("setup: not degraded: %+v", h.rec(id))
	}
	h.r82Replace(id, seg, s.id, 1-int(old.Disk))
	h.run()
	if r := h.rec(id); len(r.Retiring) != 1 || r.Retiring[0] != old {
		t.Fatalf("setup: retiring %v, want %v", r.Retiring, old)
	}
	if _, ok := r82PlatterSuperAt(s, old); !ok {
		t.Fatalf("setup: the old extent holds no superblock")
	}

	// forget-node s --re-place --gone-for-good: the Evacuate decree.
	tb := h.table()
	nr, what, err := tb.Evacuate(id, uint64(s.id), []uint64{uint64(p.id), uint64(tg.id)})
	if err != nil || nr == nil {
		t.Fatalf("evacuate: %v %v", nr, err)
	}
	t.Logf("evacuate: %s", what)
	h.r85Commit(tb, nr)
	tb = h.table()
	dk := DiskKey{uint64(s.id), old.Disk}
	off, free := tb.FreeExtent(dk, h.rec(id).Blocks)
	t.Logf("after Evacuate: disk %v forgotten=%v; free extent there at %d (%v); the dropped, unwiped extent at %d", dk, tb.Disks[dk].Forgotten, off, free, old.Offset)

	// The command stopped before its Forget decree; s runs again.
	h.start(s)
	h.run()
	if !h.tickUntil(60*time.Second, func() bool { r := h.rec(id); return r.State == Normal && len(r.Retiring) == 0 }) {
		t.Fatalf("not normal again: %+v", h.rec(id))
	}
	_, stillSuper := r82PlatterSuperAt(s, old)
	var placed *Record
	for i := 0; i < 3 && placed == nil; i++ {
		c := h.create(1024)
		for _, sg := range c.Segs {
			if sg == old {
				placed = c
			}
		}
	}
	if placed == nil {
		if !tb.Disks[dk].Forgotten && free && off == old.Offset && stillSuper {
			t.Fatalf("DEFECT: the extent was not placed on in 3 creates, but it is free on a disk not forgotten and unwiped")
		}
		return
	}
	h.tick(10 * time.Second)
	r := h.rec(placed.ID)
	rep := s.e.reps[placed.ID]
	state := "none"
	if rep != nil {
		state = rep.state.String()
	}
	if stillSuper || r.State != Normal || rep == nil || !rep.ready() {
		t.Fatalf("DEFECT: Evacuate dropped node %d's retiring extent %v unwiped, on a disk not forgotten (old superblock still there: %v); rldev %d was then created over it: its replica there is %s, the record %v stale %v -- a new RLDev on one copy. Evacuate should leave the node's retiring extents to Forget (which drops them in the decree that marks the disk forgotten), or not count them against MaxRetiring",
			s.id, old, stillSuper, placed.ID, state, r.State, r.Stale)
	}
}

// Outside review 85, Q4 (failing before the fix: now ErrForget naming
// accept-stale): the node lost for good holds the only up-to-date copy (the
// RLDev was already degraded with the other copy stale when it died).
// Evacuate says ErrForgetWait -- the CLI's exit 3, "the failure
// detector's verdict on the node has not reached the other copy's yet;
// run again in a few seconds" -- which can never change: the other copy
// is stale, no decree will ever make this segment stale. The operator
// should be told the RLDev's only current copy is on the node (and that
// forgetting it means accept-stale of the other copy, or giving the RLDev
// up), not to wait.
func TestReview85EvacuateOnlyCopyOnNodeSaysWait(t *testing.T) {
	h, id, p, s, tg := r81ThreeNodes(t)
	h.mustWrite(p.id, id, 700, pattern(1, 1))
	sseg := h.rec(id).SegmentOf(uint64(s.id))
	h.crash(s, false, nil)
	h.dead[Subject{s.id, s.inc}] = true
	h.run()
	if !h.tickUntil(10*time.Second, func() bool { r := h.rec(id); return r.State == Degraded && r.Stale[sseg] }) {
		t.Fatalf("setup: not degraded: %+v", h.rec(id))
	}
	h.mustWrite(p.id, id, 701, pattern(2, 1))
	// p (the only current copy) dies for good; s comes back and waits.
	h.crash(p, false, nil)
	h.dead[Subject{p.id, p.inc}] = true
	h.start(s)
	h.run()
	h.tick(20 * time.Second)
	r := h.rec(id)
	if r.State != Degraded || !r.Stale[sseg] || r.Segs[r.Primary].Node != uint64(p.id) {
		t.Fatalf("setup: %+v", r)
	}
	_, _, err := h.table().Evacuate(id, uint64(p.id), []uint64{uint64(s.id), uint64(tg.id)})
	t.Logf("Evacuate of node %d: %v", p.id, err)
	if !errors.Is(err, ErrForget) || !strings.Contains(err.Error(), "accept-stale") {
		t.Fatalf("node %d holds rldev %d's only up-to-date copy (its peer on node %d is stale, the RLDev degraded); forget-node --re-place answers ErrForgetWait (exit 3, \"run again in a few seconds\"), which no verdict can ever change: %v", p.id, id, s.id, err)
	}
}
