package rldev

import (
	"testing"
	"time"

	pb "github.com/grovestore/grove/api/grovepb"
)

// Review 76: the disk watchdog (Config.DiskTimeout, watchDisks).

// r76Hang makes every disk read and write of node n wait (held) until
// released: a hung disk (syncs need a write first, so they wait too).
func r76Hang(h *harness, n *hnode) {
	h.holdRead = func(x *hnode, _ DiskRead) bool { return x == n }
	h.holdWrite = func(x *hnode, _ DiskWrite) bool { return x == n }
}

// r76Unhang lets n's disk answer again: every held I/O lands, in reverse
// order of issue (a node's disk runs them in any order).
func r76Unhang(h *harness) {
	h.holdRead, h.holdWrite = nil, nil
	for len(h.held) > 0 {
		h.release(len(h.held) - 1)
	}
}

// The watchdog fails only the replicas on the disk at the moment it is
// found hung (stuck && !d.hung). A segment placed on the disk afterwards
// -- a new RLDev (the txn directory creates them on its own), a move's
// target -- loads on the hung disk, never completes its load, and is
// never failed while the disk stays flagged hung: it never asks to be
// made stale. Its RLDev stays
// normal with both copies "up to date", and every write of it waits for
// the forward to a replica that answers NotServing, for as long as the
// disk hangs -- the very outage the watchdog is for.
//
// Schedule: RLDev 1 on a (primary) and b; b's disk hangs; a write of
// RLDev 1 finds it (the watchdog fails b's segment, RLDev 1 degrades,
// the write is acknowledged); then RLDev 2 is created with its primary
// on a and its secondary on b's hung disk; a write of RLDev 2 through a
// waits 60 s. Fixed: while a disk is hung, every watch fails the
// replicas placed on it since (watchDisks); the write is then answered.
func TestReview76SegmentPlacedOnHungDiskFails(t *testing.T) {
	h, id, a, b := r71Pair(t)
	h.mustWrite(a.id, id, 10, pattern(1, 1))
	r76Hang(h, b)
	q := h.write(a.id, id, 20, pattern(2, 1), nil)
	h.run()
	if !h.tickUntil(40*time.Second, func() bool { _, ok := h.replies[q]; return ok }) || h.replies[q].Err != nil {
		t.Fatalf("setup: the write of RLDev 1 during the hang: %+v (record %+v)", h.replies[q], h.rec(id))
	}
	if !b.e.diskHung(0) || b.e.reps[id].state != repFailed {
		t.Fatalf("setup: b's disk not found hung / its segment not failed")
	}
	// RLDev 2: primary a, secondary on b's hung disk.
	tb := h.table()
	r2, err := tb.CreateOn(1024, false, a.id, b.id)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.propose(&pb.Decree{Namespace: Namespace, ExpectedVersion: tb.Version, Ops: []*pb.Op{r2.PutOp()}}); err != nil {
		t.Fatal(err)
	}
	h.run()
	if !h.tickUntil(10*time.Second, func() bool { return h.rec(r2.ID).Inc[0] == a.inc }) {
		t.Fatalf("setup: a not named for RLDev %d: %+v", r2.ID, h.rec(r2.ID))
	}
	q2 := h.write(a.id, r2.ID, 0, pattern(3, 1), nil)
	h.run()
	h.tickUntil(60*time.Second, func() bool { _, ok := h.replies[q2]; return ok })
	rp, ok := h.replies[q2]
	rb := b.e.reps[r2.ID]
	t.Logf("60 s on: RLDev %d %+v; b's replica %v (disk hung %v); write answered %v %v", r2.ID, h.rec(r2.ID), rb.state, b.e.diskHung(0), ok, rp.Err)
	if !ok {
		t.Fatalf("DEFECT: a segment placed on a disk already found hung is never failed (state %v): RLDev %d stays %v with neither copy stale, and a write through its primary waits 60 s (for as long as the disk hangs)",
			rb.state, r2.ID, h.rec(r2.ID).State)
	}
}

// The primary's disk hangs with a write in flight there that its peer has
// acknowledged; the watchdog fails the primary, the secondary serves
// alone and takes a newer write of the same block; then the hung disk
// answers, the old write lands on the failed replica, which reloads and
// is resynced. Both copies must end equal, with the newer data.
func TestReview76PrimaryHungWriteLandsLate(t *testing.T) {
	h, id, a, b := r71Pair(t)
	h.mustWrite(a.id, id, 10, pattern(1, 1))
	h.tick(3 * time.Second) // dirty regions cleared
	// Only data writes hang (block writes past the metadata): a's log
	// writes land, so the write is forwarded and its local write hangs.
	h.holdWrite = func(x *hnode, w DiskWrite) bool {
		return x == a && w.Off >= a.e.reps[id].base+MetaSize
	}
	q := h.write(a.id, id, 10, pattern(2, 1), nil)
	h.run()
	if len(h.held) != 1 {
		t.Fatalf("setup: %d held writes", len(h.held))
	}
	h.holdRead = func(x *hnode, _ DiskRead) bool { return x == a }
	h.holdWrite = func(x *hnode, _ DiskWrite) bool { return x == a }
	if !h.tickUntil(40*time.Second, func() bool { r := h.rec(id); return r.Stale[0] && r.Primary == 1 }) {
		t.Fatalf("setup: a not failed and made stale: %+v", h.rec(id))
	}
	t.Logf("the write in flight at a: %v", h.replies[q].Err)
	h.mustWrite(b.id, id, 10, pattern(3, 1))
	h.mustWrite(b.id, id, 11, pattern(4, 1))
	h.tick(10 * time.Second)
	if a.e.reps[id].state != repFailed {
		t.Fatalf("a's replica reloaded while its write hangs: %v", a.e.reps[id].state)
	}
	r76Unhang(h)
	if !h.tickUntil(60*time.Second, func() bool { r := h.rec(id); return r.State == Normal && !r.Stale[0] && !r.Stale[1] }) {
		t.Fatalf("not normal again: %+v (a %v)", h.rec(id), a.e.reps[id].state)
	}
	h.tick(3 * time.Second)
	h.sameCopies(id)
	for _, n := range []NodeID{a.id, b.id} {
		h.mustRead(n, id, 10, pattern(3, 1)) // the newer write, from both copies (normal again)
	}
}

// The secondary's disk hangs with a forwarded write in flight (and more
// forwards queued behind its range lock); the watchdog fails it, the
// primary degrades and overwrites the block; the old forwards land late.
func TestReview76SecondaryHungForwardsLandLate(t *testing.T) {
	h, id, a, b := r71Pair(t)
	h.mustWrite(a.id, id, 10, pattern(1, 1))
	r76Hang(h, b)
	q := h.write(a.id, id, 10, pattern(2, 1), nil)
	h.run()
	h.tick(2 * time.Second) // resends of the forward queue at b
	if !h.tickUntil(40*time.Second, func() bool { _, ok := h.replies[q]; return ok }) {
		t.Fatalf("setup: the write not answered: %+v", h.rec(id))
	}
	h.mustWrite(a.id, id, 10, pattern(5, 1))
	h.tick(10 * time.Second)
	if b.e.reps[id].state != repFailed {
		t.Fatalf("b's replica reloaded while its writes hang: %v", b.e.reps[id].state)
	}
	r76Unhang(h)
	if !h.tickUntil(60*time.Second, func() bool { r := h.rec(id); return r.State == Normal && !r.Stale[0] && !r.Stale[1] }) {
		t.Fatalf("not normal again: %+v (b %v)", h.rec(id), b.e.reps[id].state)
	}
	h.tick(3 * time.Second)
	h.sameCopies(id)
	h.mustRead(b.id, id, 10, pattern(5, 1))
}
