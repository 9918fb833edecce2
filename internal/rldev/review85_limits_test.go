package rldev

import (
	"errors"
	"testing"
	"time"

	pb "github.com/grovestore/grove/api/grovepb"
)

// Outside review 85 (Q3/Q4; a limitation until StartMove re-placed a
// stale segment of a degraded RLDev whose dirty-region log is off): a
// transaction log's RLDev (txn/directory.go creates them with the log
// off) with a segment on a node lost for good could never be evacuated,
// and the node never forgotten; it stayed on one copy. Now it is
// re-placed and rebuilt whole from the primary, as after a disk loss, its
// client's WriteReplica and ReadReplica of the primary going on meanwhile;
// the forget follows. A move (copy and switch) of such an RLDev is still
// refused.
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
	p, s := h.nodes[NodeID(r.Segs[0].Node)], h.nodes[NodeID(r.Segs[1].Node)]
	var other *hnode
	for _, n := range h.sorted() {
		if n != p && n != s {
			other = n
		}
	}
	if _, err := h.table().StartMove(r.ID, 1, uint64(other.id), -1); !errors.Is(err, ErrMove) {
		t.Fatalf("a move of a normal RLDev with its log off: %v", err)
	}
	h.mustWrite(p.id, r.ID, 7, pattern(1, 1))
	h.crash(s, false, nil)
	h.dead[Subject{s.id, s.inc}] = true
	h.run()
	if !h.tickUntil(10*time.Second, func() bool { x := h.rec(r.ID); return x.State == Degraded && x.Stale[1] }) {
		t.Fatalf("setup: not degraded: %+v", h.rec(r.ID))
	}
	h.mustWrite(p.id, r.ID, 8, pattern(2, 1))
	tb = h.table()
	nr, what, err := tb.Evacuate(r.ID, uint64(s.id), []uint64{uint64(p.id), uint64(other.id)})
	if err != nil || nr == nil {
		t.Fatalf("Evacuate: %v", err)
	}
	t.Logf("Evacuate: %s", what)
	h.r85Commit(tb, nr)
	if !h.tickUntil(30*time.Second, func() bool { return h.rec(r.ID).State == Normal }) {
		t.Fatalf("not rebuilt: %+v", h.rec(r.ID))
	}
	x := h.rec(r.ID)
	if x.Segs[1].Node != uint64(other.id) {
		t.Fatalf("re-placed on %v", x.Segs)
	}
	for seg := range 2 { // ReadReplica of each copy, at its node
		n := h.nodes[NodeID(x.Segs[seg].Node)]
		h.nextReq++
		q := h.nextReq
		h.exec(n, n.e.Read(h.env(n), q, r.ID, 7, 2, seg))
		h.run()
		if rp, ok := h.replies[q]; !ok || rp.Err != nil || string(rp.Data) != string(append(pattern(1, 1), pattern(2, 1)...)) {
			t.Fatalf("segment %d: answered %v, %v", seg, ok, rp.Err)
		}
	}
	if _, err := h.forgetCommit(s.id); err != nil {
		t.Fatal(err)
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
