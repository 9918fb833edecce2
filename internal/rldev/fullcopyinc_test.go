package rldev

import (
	"strings"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/disk"
)

// A full copy's target dies between the "resynced" decree and clearing
// its superblock's Incomplete flag (it never hears of that table). Its
// next incarnation finds the segment incomplete and, before
// Super.TargetInc named the incarnation a full copy goes to, took it for
// lost: a second full copy, and meanwhile a fault of the peer left the
// RLDev nothing to serve. Now the table naming that incarnation, up to
// date, says the copy it received is whole: it serves, and when the
// peer's disk then fails it takes over as primary.
func TestFullCopyTargetDiesBeforeClearingIncomplete(t *testing.T) {
	h, id, a, b := r71Pair(t)
	h.mustWrite(a.id, id, 10, pattern(1, 1))
	h.tick(3 * time.Second)
	h.crash(b, false, nil)
	h.dead[Subject{b.id, b.inc}] = true
	h.run()
	if !h.tickUntil(10*time.Second, func() bool { return h.rec(id).State == Degraded }) {
		t.Fatalf("setup: not degraded: %+v", h.rec(id))
	}
	h.mustWrite(a.id, id, 20, pattern(2, 1))
	b.devs[0] = disk.NewMemDevice(testDisk, nil) // b's disk replaced: full copy
	h.dead = map[Subject]bool{}
	h.holdPropose = func(n *hnode, x Propose) bool { return n == a && strings.HasSuffix(x.What, ": resynced]") }
	h.start(b)
	h.run()
	if !h.tickUntil(60*time.Second, func() bool { return len(h.heldDecrees) == 1 }) {
		t.Fatalf("setup: the full copy did not end: %+v", h.rec(id))
	}
	h.holdPropose = nil
	held := h.heldDecrees[0]
	h.heldDecrees = nil
	t.Logf("the full copy's target (incarnation %d): superblock %+v", b.inc, b.e.reps[id].super)
	// "resynced" commits; b dies before it hears of it.
	h.noTables = true
	if err := h.commit(held); err != nil {
		t.Fatalf("resynced decree: %v", err)
	}
	h.exec(a, a.e.SetTable(h.env(a), h.table(), false, h.incs()))
	h.exec(a, a.e.Decided(h.env(a), held.ID, nil))
	h.run()
	h.crash(b, false, nil)
	h.noTables = false
	if rec := h.rec(id); rec.State != Normal {
		t.Fatalf("setup: not normal: %+v", rec)
	}
	e0 := h.rec(id).Epoch
	h.start(b)
	lost := false
	if !h.tickUntil(10*time.Second, func() bool {
		rb := b.e.reps[id]
		lost = lost || rb != nil && rb.lost || h.rec(id).State != Normal
		return rb != nil && rb.ready() && h.rec(id).Inc[h.rec(id).SegmentOf(b.id)] == b.inc
	}) {
		t.Fatalf("b not back: %+v", h.rec(id))
	}
	// One decree only: the one naming b's new incarnation (a lost copy
	// is made stale, resynced whole, declared resynced: three more).
	if rb := b.e.reps[id]; lost || rb.super.Incomplete || h.rec(id).Epoch != e0+1 {
		t.Fatalf("b back: superblock %+v, record %+v (epoch %d before): its whole copy was taken for lost (copied whole again)", rb.super, h.rec(id), e0)
	}
	h.mustRead(b.id, id, 10, pattern(1, 1))
	h.mustRead(b.id, id, 20, pattern(2, 1))
	// a's disk fails: b takes over.
	h.failWrite = func(n *hnode, x DiskWrite) bool { return n == a }
	h.write(a.id, id, 30, pattern(4, 1), nil)
	h.run()
	h.failWrite = nil
	if !h.tickUntil(10*time.Second, func() bool { r := h.rec(id); return r.Stale[r.SegmentOf(a.id)] }) {
		t.Fatalf("a's failure not decreed: %+v", h.rec(id))
	}
	h.mustRead(b.id, id, 20, pattern(2, 1))
}
