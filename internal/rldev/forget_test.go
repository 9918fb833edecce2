package rldev

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/disk"
)

// forgetCommit passes node's Forget by decree, conditional on the table.
func (h *harness) forgetCommit(node NodeID) (*ForgetPlan, error) {
	h.t.Helper()
	tb := h.table()
	plan, err := tb.Forget(uint64(node))
	if err != nil {
		return nil, err
	}
	if len(plan.Ops) > 0 {
		if err := h.propose(&pb.Decree{Namespace: Namespace, ExpectedVersion: tb.Version, Ops: plan.Ops}); err != nil {
			h.t.Fatalf("decree: %v", err)
		}
	}
	h.run()
	return plan, nil
}

// A node lost for good: forgetting it is refused while it holds a
// segment; once that segment is re-placed, the forget drops the old extent
// retiring there (its node will never wipe it) and marks its disk
// forgotten, so that nothing is placed there again. The node, back with
// the same disk, does not register it anew and serves nothing; back with
// a wiped disk, it is a node like any other.
func TestForgetNodeGoneForGood(t *testing.T) {
	h, id, p, s, tg := r81ThreeNodes(t)
	h.mustWrite(p.id, id, 5, pattern(1, 1))
	seg := h.rec(id).SegmentOf(uint64(s.id))
	h.crash(s, false, nil)
	h.dead[Subject{s.id, s.inc}] = true
	h.run()
	if !h.tickUntil(10*time.Second, func() bool { r := h.rec(id); return r.State == Degraded && r.Stale[seg] }) {
		t.Fatalf("setup: not degraded: %+v", h.rec(id))
	}
	h.mustWrite(p.id, id, 6, pattern(2, 1))

	// Refused while node s holds the stale segment.
	if _, err := h.forgetCommit(s.id); !errors.Is(err, ErrForget) || !strings.Contains(err.Error(), "rldev 1's") {
		t.Fatalf("forget of a node holding a segment: %v", err)
	}
	if _, err := h.table().Forget(99); !errors.Is(err, ErrForget) {
		t.Fatalf("forget of a node with no disk: %v", err)
	}

	// Re-placed on tg: the old extent retires on s, which never wipes it.
	tb := h.table()
	nr, err := tb.StartMove(id, seg, uint64(tg.id), -1)
	if err != nil || nr.Move != nil {
		t.Fatalf("re-place: %v %+v", err, nr)
	}
	old := tb.RLDevs[id].Segs[seg]
	h.r83Commit(tb, nr)
	if !h.tickUntil(30*time.Second, func() bool { return h.rec(id).State == Normal }) {
		t.Fatalf("the re-placed segment was not rebuilt: %+v", h.rec(id))
	}
	if r := h.rec(id); len(r.Retiring) != 1 || r.Retiring[0] != old {
		t.Fatalf("retiring %v, want the old extent %v", r.Retiring, old)
	}
	plan, err := h.forgetCommit(s.id)
	if err != nil {
		t.Fatal(err)
	}
	if plan.DroppedCount() != 1 || len(plan.Disks) != 1 {
		t.Fatalf("plan %+v", plan)
	}
	r := h.rec(id)
	if len(r.Retiring) != 0 {
		t.Fatalf("still retiring after the forget: %v", r.Retiring)
	}
	if d := h.table().Disks[DiskKey{uint64(s.id), 0}]; d == nil || !d.Forgotten {
		t.Fatalf("disk of node %d: %+v", s.id, d)
	}
	// Forgetting again changes nothing.
	if plan, err := h.table().Forget(uint64(s.id)); err != nil || len(plan.Ops) != 0 || !strings.Contains(plan.Describe(), "already") {
		t.Fatalf("second forget: %+v %v", plan, err)
	}
	// Nothing is placed on the forgotten node: two nodes are left to
	// chain over, and a move there is refused.
	for i := 0; i < 4; i++ {
		nr := h.create(256)
		for _, sg := range nr.Segs {
			if sg.Node == uint64(s.id) {
				t.Fatalf("rldev %d placed on the forgotten node: %v", nr.ID, nr.Segs)
			}
		}
	}
	if _, err := h.table().StartMove(id, seg, uint64(s.id), -1); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("a move to the forgotten node: %v", err)
	}

	// The node comes back with its old disk: not registered anew, and the
	// RLDevs go on as they were.
	h.start(s)
	h.tick(5 * time.Second)
	if d := h.table().Disks[DiskKey{uint64(s.id), 0}]; d == nil || !d.Forgotten {
		t.Fatalf("the forgotten disk was registered anew: %+v", d)
	}
	if r := h.rec(id); r.State != Normal || r.Segs[seg].Node != uint64(tg.id) {
		t.Fatalf("rldev %d after the forgotten node came back: %+v", id, r)
	}
	h.mustRead(p.id, id, 5, pattern(1, 1))
	h.mustRead(tg.id, id, 6, pattern(2, 1))

	// Back with a wiped disk (another header): a disk like any other.
	h.crash(s, false, nil)
	s.devs[0] = disk.NewMemDevice(testDisk, nil)
	h.start(s)
	h.tick(5 * time.Second)
	if d := h.table().Disks[DiskKey{uint64(s.id), 0}]; d == nil || d.Forgotten || d.UUID != s.uuid[0] {
		t.Fatalf("a wiped disk on the forgotten node: %+v (its uuid %s)", d, s.uuid[0])
	}
	nr = nil
	for i := 0; i < 3 && nr == nil; i++ {
		c := h.create(256)
		for _, sg := range c.Segs {
			if sg.Node == uint64(s.id) {
				nr = c
			}
		}
	}
	if nr == nil {
		t.Fatalf("nothing placed on the node with a wiped disk")
	}
	h.mustWrite(p.id, nr.ID, 1, pattern(3, 1))
}

// grove rldev forget-node --re-place: every RLDev with something on a node
// lost for good is evacuated (a segment there re-placed on the live node
// without its other copy that has the most room, a move's target there
// given up), one decree each; every RLDev is normal again with both copies
// off that node, and the forget then drops what still retires there.
func TestEvacuateNodeGoneForGood(t *testing.T) {
	h := newHarness(t, 4, testDisk, func(h *harness) { h.copyRate = 256 * BlockSize })
	var ids []uint64
	for i := 0; i < 4; i++ {
		r := h.create(256)
		ids = append(ids, r.ID)
		h.mustWrite(NodeID(r.Segs[r.Primary].Node), r.ID, 3, pattern(byte(i), 1))
	}
	lost := NodeID(4)
	// A move to the node that will be lost, of an RLDev not on it.
	var moving uint64
	for _, id := range ids {
		if h.rec(id).SegmentOf(uint64(lost)) < 0 {
			moving = id
			break
		}
	}
	tb := h.table()
	nr, err := tb.StartMove(moving, 1-h.rec(moving).Primary, uint64(lost), -1)
	if err != nil {
		t.Fatal(err)
	}
	h.r83Commit(tb, nr)
	// Not yet: the RLDevs on the node are normal.
	for _, id := range ids {
		if h.rec(id).SegmentOf(uint64(lost)) >= 0 {
			if _, _, err := h.table().Evacuate(id, uint64(lost), []uint64{1, 2, 3}); !errors.Is(err, ErrForgetWait) {
				t.Fatalf("evacuating normal rldev %d: %v", id, err)
			}
		}
	}
	n := h.nodes[lost]
	h.crash(n, false, nil)
	h.dead[Subject{n.id, n.inc}] = true
	h.run()
	if !h.tickUntil(10*time.Second, func() bool {
		for _, id := range ids {
			if r := h.rec(id); r.SegmentOf(uint64(lost)) >= 0 && r.State != Degraded {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("setup: not degraded")
	}
	for _, id := range ids {
		tb := h.table()
		nr, what, err := tb.Evacuate(id, uint64(lost), []uint64{1, 2, 3})
		if err != nil {
			t.Fatalf("evacuate rldev %d: %v", id, err)
		}
		t.Logf("rldev %d: %s", id, what)
		if (nr != nil) != (tb.RLDevs[id].SegmentOf(uint64(lost)) >= 0 || id == moving) {
			t.Fatalf("rldev %d: evacuated %v (%q)", id, nr != nil, what)
		}
		if nr != nil {
			h.r83Commit(tb, nr)
		}
	}
	if !h.tickUntil(60*time.Second, func() bool {
		for _, id := range ids {
			if r := h.rec(id); r.State != Normal || r.Move != nil {
				return false
			}
		}
		return true
	}) {
		for _, id := range ids {
			t.Logf("%+v", h.rec(id))
		}
		t.Fatalf("not all normal again")
	}
	for i, id := range ids {
		r := h.rec(id)
		if r.SegmentOf(uint64(lost)) >= 0 {
			t.Fatalf("rldev %d still on the lost node: %v", id, r.Segs)
		}
		for _, sg := range r.Segs {
			h.mustRead(NodeID(sg.Node), id, 3, pattern(byte(i), 1))
		}
	}
	if _, err := h.forgetCommit(lost); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		for _, sg := range h.rec(id).Retiring {
			if sg.Node == uint64(lost) {
				t.Fatalf("rldev %d: %v still retiring on the forgotten node", id, sg)
			}
		}
	}
}

// The steps of forget-node --re-place (NextEvacStep, what the clerk and
// the simulator both run): the disks forgotten first, then the RLDev
// re-placed, then the forget, which drops the re-placed segment's old
// extent; asked again, the last step again, with nothing to do.
func TestNextEvacStepOrder(t *testing.T) {
	h, id, s, _, cands := lostSecondary(t)
	var kinds []string
	for i := 0; ; i++ {
		tb := h.table()
		st, err := tb.NextEvacStep(uint64(s.id), cands)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		switch {
		case st.Final:
			kinds = append(kinds, "forget")
		case st.ID != 0:
			kinds = append(kinds, fmt.Sprintf("rldev %d", st.ID))
		default:
			kinds = append(kinds, "disks")
		}
		if len(st.Ops) > 0 {
			if err := h.propose(&pb.Decree{Namespace: Namespace, ExpectedVersion: tb.Version, Ops: st.Ops}); err != nil {
				t.Fatal(err)
			}
			h.run()
		}
		if st.Final {
			if st.Plan.DroppedCount() != 1 {
				t.Fatalf("the forget dropped %v, want the re-placed segment's old extent", st.Plan.Dropped)
			}
			break
		}
		if i > 5 {
			t.Fatalf("no end: %v", kinds)
		}
	}
	if want := []string{"disks", fmt.Sprintf("rldev %d", id), "forget"}; !slices.Equal(kinds, want) {
		t.Fatalf("steps %v, want %v", kinds, want)
	}
	if st, err := h.table().NextEvacStep(uint64(s.id), cands); err != nil || !st.Final || len(st.Ops) != 0 {
		t.Fatalf("asked again: %+v %v", st, err)
	}
	if !h.tickUntil(30*time.Second, func() bool { return h.rec(id).State == Normal }) {
		t.Fatalf("not rebuilt: %+v", h.rec(id))
	}
	if r := h.rec(id); r.SegmentOf(uint64(s.id)) >= 0 || len(r.Retiring) != 0 {
		t.Fatalf("after the steps: %+v", r)
	}
}

// An extent retiring on the node that appears after its disks were
// forgotten (a move ending meanwhile) is dropped by its RLDev's step, and
// that step says so (EvacStep.Dropped), so that forget-node's plan counts
// it (ForgetReplacing: before, only the first and last steps' were).
func TestNextEvacStepReportsMidDrops(t *testing.T) {
	h, id, s, seg, cands := lostSecondary(t)
	tb := h.table()
	st, err := tb.NextEvacStep(uint64(s.id), cands)
	if err != nil || st.ID != 0 || st.Final {
		t.Fatalf("first step: %+v %v", st, err)
	}
	if err := h.propose(&pb.Decree{Namespace: Namespace, ExpectedVersion: tb.Version, Ops: st.Ops}); err != nil {
		t.Fatal(err)
	}
	h.run()
	tb = h.table()
	rec := tb.RLDevs[id].Clone()
	old := rec.Segs[seg]
	extra := Segment{Node: old.Node, Disk: old.Disk, Offset: old.Offset + SegmentSize(rec.Blocks) + 1<<20}
	rec.Retiring = append(rec.Retiring, extra)
	tb.RLDevs[id] = rec
	st, err = tb.NextEvacStep(uint64(s.id), cands)
	if err != nil || st.ID != id {
		t.Fatalf("the RLDev's step: %+v %v", st, err)
	}
	if !slices.Equal(st.Dropped, []Segment{extra}) {
		t.Fatalf("the RLDev's step dropped %v, want %v", st.Dropped, extra)
	}
}

// lostSecondary: r81ThreeNodes with a write, then the secondary's node s
// crashed and declared dead, the RLDev degraded with s's segment (seg)
// stale; cands are the nodes an evacuation of s may use.
func lostSecondary(t *testing.T) (h *harness, id uint64, s *hnode, seg int, cands []uint64) {
	h, id, p, s, tg := r81ThreeNodes(t)
	h.mustWrite(p.id, id, 5, pattern(1, 1))
	seg = h.rec(id).SegmentOf(uint64(s.id))
	h.crash(s, false, nil)
	h.dead[Subject{s.id, s.inc}] = true
	h.run()
	if !h.tickUntil(10*time.Second, func() bool { r := h.rec(id); return r.State == Degraded && r.Stale[seg] }) {
		t.Fatalf("setup: not degraded: %+v", h.rec(id))
	}
	return h, id, s, seg, []uint64{uint64(p.id), uint64(tg.id)}
}
