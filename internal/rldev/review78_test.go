package rldev

import (
	"strings"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/disk"
)

// Outside review 78: takeRecord's new branch (bc05e27) makes an
// incomplete segment declared up to date in a record whose state is not
// Normal lost, assuming only an accept-stale does that. But a replica
// sees the latest table, not every epoch: a full copy onto b ends
// ("resynced": Normal, b up to date), and before b's node hears of that
// table a's disk fails, so a's replica decrees itself stale and b the
// primary (Degraded). b jumps from "stale, resyncing" to "up to date,
// degraded" with its superblock still Incomplete (it clears it only on
// hearing the resync's end): the new branch calls it an accept-stale of
// an empty copy and makes it lost. b holds every block, a's copy is
// stale: the RLDev serves nothing, for good (b reloads Incomplete and
// not stale: lost again). Fixed: the record says when an accept-stale
// was decreed (Record.AcceptedEpoch), and only a replica stale before it
// and up to date after it is taken as accepted.
func TestReview78FullCopyEndUnseenThenPeerDiskFails(t *testing.T) {
	h, id, a, b := r71Pair(t)
	h.mustWrite(a.id, id, 10, pattern(1, 1))
	h.mustWrite(a.id, id, 20, pattern(2, 1))
	h.tick(3 * time.Second)
	h.crash(b, false, nil)
	h.dead[Subject{b.id, b.inc}] = true
	h.run()
	if !h.tickUntil(10*time.Second, func() bool { return h.rec(id).State == Degraded }) {
		t.Fatalf("setup: not degraded: %+v", h.rec(id))
	}
	h.mustWrite(a.id, id, 10, pattern(3, 1))
	b.devs[0] = disk.NewMemDevice(testDisk, nil) // b's disk replaced: full copy
	h.holdPropose = func(n *hnode, x Propose) bool { return n == a && strings.HasSuffix(x.What, ": resynced]") }
	h.start(b)
	h.run()
	if !h.tickUntil(60*time.Second, func() bool { return len(h.heldDecrees) == 1 }) {
		t.Fatalf("setup: the full copy did not end: %+v", h.rec(id))
	}
	h.holdPropose = nil
	held := h.heldDecrees[0]
	h.heldDecrees = nil
	rb := b.e.reps[id]
	t.Logf("full copy done: b incomplete %v stale %v lost %v; record %+v", rb.super.Incomplete, rb.stale(), rb.lost, h.rec(id))
	// The "resynced" decree commits; b's node does not hear of that table
	// yet (a watch delivers the latest table, not every version).
	h.noTables = true
	if err := h.commit(held); err != nil {
		t.Fatalf("resynced decree: %v", err)
	}
	h.exec(a, a.e.SetTable(h.env(a), h.table(), false, h.incs()))
	h.exec(a, a.e.Decided(h.env(a), held.ID, nil))
	h.run()
	if h.rec(id).State != Normal {
		t.Fatalf("setup: not normal: %+v", h.rec(id))
	}
	// a's disk fails: its replica decrees itself stale, b the primary.
	h.failWrite = func(n *hnode, x DiskWrite) bool { return n == a }
	h.write(a.id, id, 30, pattern(4, 1), nil)
	h.run()
	h.tickUntil(10*time.Second, func() bool { r := h.rec(id); return r.Stale[r.SegmentOf(a.id)] })
	h.failWrite = nil
	rec := h.rec(id)
	if !rec.Stale[rec.SegmentOf(a.id)] || rec.Stale[rec.SegmentOf(b.id)] {
		t.Fatalf("setup: a's failure not decreed: %+v", rec)
	}
	h.noTables = false
	h.tables(false)
	h.run()
	h.tick(2 * time.Second)
	rb = b.e.reps[id]
	rp := h.rvRead(b.id, id, 10, 1)
	t.Logf("b: ready %v stale %v lost %v incomplete %v; record %+v; read of block 10 at b: %v", rb.ready(), rb.stale(), rb.lost, rb.super.Incomplete, h.rec(id), rp.Err)
	if rb.lost || rp.Err != nil {
		h.tick(60 * time.Second) // a's replica reloads (its disk answers again)
		rp = h.rvRead(b.id, id, 10, 1)
		t.Logf("a minute later: record %+v; b lost %v; read at b: %v", h.rec(id), b.e.reps[id].lost, rp.Err)
		t.Fatalf("DEFECT: b, copied whole (its full copy ended, \"resynced\" committed), is made lost when it first sees the record after a's disk failure (degraded, b primary): the RLDev's only up-to-date copy serves nothing (read: %v)", rp.Err)
	}
}
