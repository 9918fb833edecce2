package rldev

import (
	"bytes"
	"errors"
	"testing"
	"time"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/lock"
)

// Scenarios from an outside review of segment moves (move.go), each a
// scripted interleaving that broke the first version; each fails with
// "DEFECT" if its fix is undone.

func (h *harness) rmStartMove(id uint64, seg int, node NodeID) {
	h.t.Helper()
	t := h.table()
	nr, err := t.StartMove(id, seg, node, -1)
	if err != nil {
		h.t.Fatal(err)
	}
	if err := h.propose(&pb.Decree{Namespace: Namespace, ExpectedVersion: t.Version, Ops: []*pb.Op{nr.PutOp()}}); err != nil {
		h.t.Fatal(err)
	}
}

// rmCopied: the primary's move copy has acknowledged at least n blocks.
func (h *harness) rmCopied(p NodeID, id, n uint64) func() bool {
	return func() bool {
		e := h.nodes[p].e
		r := e.reps[id]
		return r != nil && r.mv != nil && r.mv.copied >= n
	}
}

func rmFence(seq uint64) *Fence { return &Fence{Name: "map", Token: lock.Token{Epoch: 1, Seq: seq}} }

// (1) Fixed: the target mirrors the primary's fences (it keeps the newest
// token, refuses none). Before: a forward to the move's target refused
// with StaleToken was resent forever (targetAcked treats every non-OK code as "retry"). Reordering
// between two fenced writes (W1 token 5 admitted first at the primary,
// its forward to the target held by a broken session; W2 token 7 sent at
// once after the session is back) makes the target refuse W1: W1 never
// completes, holds its range lock, and the move never completes.
func TestRegressMoveTargetStaleTokenHangs(t *testing.T) {
	h := newHarness(t, 3, testDisk)
	r := h.create(1024)
	p, tg := r.Segs[0].Node, NodeID(3)
	h.rmStartMove(r.ID, 0, tg) // the primary's segment
	if !h.rvStepUntil(h.rmCopied(p, r.ID, 1)) && !h.rvStepUntil(func() bool { return h.nodes[p].e.reps[r.ID].mv != nil }) {
		t.Fatal("setup: no copy")
	}
	h.partition(p, tg)
	q1 := h.write(p, r.ID, 1000, pattern(1, 1), rmFence(5))
	h.run()
	h.heal(p, tg)
	q2 := h.write(p, r.ID, 900, pattern(2, 1), rmFence(7))
	h.run()
	if rp, ok := h.replies[q2]; !ok || rp.Err != nil {
		t.Fatalf("setup: W2 %v %v", ok, rp.Err)
	}
	h.tick(30 * time.Second)
	q3 := h.read(p, r.ID, 1000, 1)
	h.tick(5 * time.Second)
	_, w1 := h.replies[q1]
	_, rd := h.replies[q3]
	rec := h.rec(r.ID)
	t.Logf("after 35 s: W1 answered %v, read of its block answered %v, move %+v, segs %v", w1, rd, rec.Move, rec.Segs)
	if !w1 && rec.Move != nil {
		t.Errorf("DEFECT: W1 (token 5) never completes (the target refuses it with StaleToken, the primary resends forever); the move is stuck: %+v", rec.Move)
	}
}

// (2) Fixed: a range the primary takes from its peer marks the move's
// copy stale (copied again; a switch waits). Before: a write the
// secondary refuses with StaleToken was pulled back from the secondary at
// the primary (startRecoveryOf), but the move's target, which already
// applied it, kept it: after the switch the replicas differed, and reads
// alternated between the old and the refused value.
func TestRegressMoveStaleTokenPullBackDiverges(t *testing.T) {
	h := newHarness(t, 3, testDisk)
	r := h.create(1024)
	p, s, tg := r.Segs[0].Node, r.Segs[1].Node, NodeID(3)
	h.rmStartMove(r.ID, 1, tg) // the secondary's segment
	if !h.rvStepUntil(h.rmCopied(p, r.ID, 64)) {
		t.Fatal("setup: no copy")
	}
	h.partition(p, s)
	q0 := h.write(p, r.ID, 1020, pattern(9, 1), nil) // holds the last chunk until s is back
	q1 := h.write(p, r.ID, 0, pattern(1, 1), rmFence(5))
	h.run()
	h.heal(p, s)
	q2 := h.write(p, r.ID, 500, pattern(2, 1), rmFence(7))
	h.run()
	// Until W1 is answered, then until the move is done (the copy
	// starts again: the target must not keep the refused write).
	h.rvTickUntil(3*time.Second, func() bool { _, ok := h.replies[q1]; return ok })
	h.rvTickUntil(30*time.Second, func() bool { return h.rec(r.ID).Move == nil })
	h.run()
	for _, q := range []ReqID{q0, q1, q2} {
		t.Logf("req %d: %+v", q, h.replies[q].Err)
	}
	if !errors.Is(h.replies[q1].Err, ErrStaleToken) {
		t.Skipf("setup: W1 not refused by the secondary: %v", h.replies[q1].Err)
	}
	rec := h.rec(r.ID)
	if rec.Segs[1].Node != tg || rec.Move != nil {
		t.Fatalf("setup: move not done: %+v", rec)
	}
	a, b := h.rvPlatterBlock(p, r.ID, 0), h.rvPlatterBlock(tg, r.ID, 0)
	rb, ra := h.rvRead(tg, r.ID, 0, 1), h.rvRead(p, r.ID, 0, 1) // the target first, then the primary
	t.Logf("block 0: primary %x..., new secondary %x...; reads: primary %x... (%v), target %x... (%v)", a[:4], b[:4], ra.Data[:4], ra.Err, rb.Data[:4], rb.Err)
	if !bytes.Equal(a, b) || !bytes.Equal(ra.Data, rb.Data) {
		t.Errorf("DEFECT: after the move the replicas differ at block 0 (the refused write stayed on the target); reads disagree")
	}
}

// (3) Fixed: only the incarnation of the primary that copied everything
// (and took nothing from its peer since) switches; another copies again.
// Before: the primary restarted (not declared dead) while the move of its own
// segment is switching, with a write in flight that reached the target
// but not the secondary. Its new incarnation pulls the dirty region back
// from the secondary, but Switch survives the restart (no new copy): the
// moving replica switches at once, and the target (new primary) and the
// secondary differ.
func TestRegressMovePrimaryRestartWhileSwitching(t *testing.T) {
	// The scrubber would copy a newer generation over, later: the rules
	// alone are tested.
	h := newHarness(t, 3, testDisk, func(h *harness) { h.scrubRate = -1 })
	r := h.create(1024)
	p, s, tg := r.Segs[0].Node, r.Segs[1].Node, NodeID(3)
	h.rmStartMove(r.ID, 0, tg)
	if !h.rvStepUntil(h.rmCopied(p, r.ID, 64)) {
		t.Fatal("setup: no copy")
	}
	h.partition(p, s)
	q1 := h.write(p, r.ID, 0, pattern(1, 1), nil) // reaches the target, not s
	h.run()
	if m := h.rec(r.ID).Move; m == nil || !m.Switch {
		t.Fatalf("setup: not switching: %+v", h.rec(r.ID))
	}
	h.crash(h.nodes[p], false, nil)
	h.run()
	delete(h.cut, [2]NodeID{p, s})
	delete(h.cut, [2]NodeID{s, p})
	h.start(h.nodes[p])
	h.rvTickUntil(30*time.Second, func() bool { return h.rec(r.ID).Move == nil })
	h.run()
	rec := h.rec(r.ID)
	t.Logf("W1 answered: %v; record %+v", h.replies[q1], rec)
	if rec.Segs[0].Node != tg {
		t.Fatalf("setup: no switch: %+v", rec)
	}
	a, b := h.rvPlatterBlock(tg, r.ID, 0), h.rvPlatterBlock(s, r.ID, 0)
	ra, rb := h.rvRead(tg, r.ID, 0, 1), h.rvRead(s, r.ID, 0, 1) // the target first, then the secondary
	t.Logf("block 0: target %x..., secondary %x...; reads: target %x... (%v), secondary %x... (%v)", a[:4], b[:4], ra.Data[:4], ra.Err, rb.Data[:4], rb.Err)
	if !bytes.Equal(a, b) || !bytes.Equal(ra.Data, rb.Data) {
		t.Errorf("DEFECT: after the primary's restart while switching, the new primary (target) and the secondary differ at block 0; reads disagree")
	}
}

// (4) Fixed: an RLDev whose client keeps the replicas itself (dirty-region
// log off, WriteReplica/ReadReplica) cannot be moved. Before: a
// WriteReplica during a move was never forwarded to the target, which is
// a copy of the primary; after the move the segment lacked it, and the
// primary's loss lost an acknowledged write.
func TestRegressMoveWriteReplicaLost(t *testing.T) {
	h := newHarness(t, 3, testDisk)
	tb := h.table()
	r, err := tb.Create(1024, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.propose(&pb.Decree{Namespace: Namespace, ExpectedVersion: tb.Version, Ops: []*pb.Op{r.PutOp()}}); err != nil {
		t.Fatal(err)
	}
	h.run()
	h.joined(r.ID)
	if _, err := h.table().StartMove(r.ID, 1, 3, -1); !errors.Is(err, ErrMove) {
		t.Errorf("DEFECT: a move of an RLDev with its dirty-region log off is not refused: %v", err)
	}
}
