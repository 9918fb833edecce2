package rldev

import (
	"bytes"
	"strings"
	"testing"
	"time"

	pb "github.com/grovestore/grove/api/grovepb"
)

// Outside review 90: owedDirty and accept-stale.
//
// owedDirty owes every dirty region without a degraded-mode mark to the
// peer, whatever the table says, and afterLoad keeps them when the table
// names this replica the primary with a stale peer. After an operator's
// accept-stale that peer's copy is the history given up: this copy was
// accepted as it is. dropRecovery drops what a live replica owed when it
// turned stale, but a replica whose dirty regions are still in its log
// when it joins (or loads) as the accepted primary owes them again, to
// the copy given up: the region is Unavailable until that node is back
// (or forgotten), and then filled with the given-up history.

// r90AcceptSetup: a (primary) takes P1 at block 10 and crashes with the
// region still in its dirty-region log; b takes over (a stale), takes P2
// at block 10 alone, then dies for good. Returns the harness, the RLDev,
// a and b (both down).
func r90AcceptSetup(t *testing.T) (*harness, uint64, *hnode, *hnode) {
	h, id, a, b := r71Pair(t)
	h.mustWrite(a.id, id, 10, pattern(1, 1))
	h.crash(a, false, nil) // region 0 still in a's dirty-region log (cleared lazily)
	h.dead[Subject{a.id, a.inc}] = true
	aseg := 0
	if NodeID(h.rec(id).Segs[1].Node) == a.id {
		aseg = 1
	}
	if !h.tickUntil(10*time.Second, func() bool { r := h.rec(id); return r.State == Degraded && r.Stale[aseg] }) {
		t.Fatalf("setup: b did not take over: %+v", h.rec(id))
	}
	h.mustWrite(b.id, id, 10, pattern(2, 1)) // acknowledged by b alone
	h.crash(b, false, nil)
	h.dead[Subject{b.id, b.inc}] = true
	h.run()
	return h, id, a, b
}

func r90Accept(t *testing.T, h *harness, id uint64) {
	t.Helper()
	tb := h.table()
	nr, err := tb.AcceptStale(id, h.rec(id).Epoch)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.propose(&pb.Decree{Namespace: Namespace, ExpectedVersion: tb.Version, Ops: []*pb.Op{nr.PutOp()}}); err != nil {
		t.Fatal(err)
	}
	h.run()
}

// The operator accepts a's copy while a is joining (CheckAccept allows
// "joining"): a's naming decree, in flight, fails on the accept's version
// and is made again; a joins as the accepted primary, and region 0 --
// owed at load by owedDirty -- is owed to b's copy, the one given up.
func TestReview90AcceptWhileJoiningOwesGivenUpCopy(t *testing.T) {
	h, id, a, b := r90AcceptSetup(t)
	h.holdPropose = func(n *hnode, x Propose) bool { return n == a && strings.Contains(x.What, "served by incarnation") }
	h.start(a)
	if !h.tickUntil(5*time.Second, func() bool { return len(h.heldDecrees) > 0 }) {
		t.Fatalf("setup: a's naming decree not held: %+v", h.rec(id))
	}
	if st := a.e.reps[id].state; st != repJoining {
		t.Fatalf("setup: a is %v, want joining", st)
	}
	r90Accept(t, h, id) // the operator's checks: b dead, a joining
	h.holdPropose = nil
	held := h.heldDecrees[0]
	h.heldDecrees = nil
	err := h.commit(held)
	h.exec(a, a.e.Decided(h.env(a), held.ID, err))
	h.run()
	h.tick(2 * time.Second)
	rec := h.rec(id)
	t.Logf("after the accept: %+v (a owes %d)", rec, a.e.reps[id].owedCount())
	rp := h.rvRead(a.id, id, 10, 1)
	if rp.Err != nil || !bytes.Equal(rp.Data, pattern(1, 1)) {
		t.Errorf("accepted copy: block 10 is %v (owed %d, table Owed %v); want a's own P1, as accepted", rp.Err, a.e.reps[id].owedCount(), rec.Owed)
	}
	// b's node comes back after all: the region is pulled from the copy
	// the operator gave up.
	h.dead = map[Subject]bool{}
	h.start(b)
	h.tickUntil(30*time.Second, func() bool { return h.rec(id).State == Normal })
	if rp := h.rvRead(a.id, id, 10, 1); rp.Err == nil && bytes.Equal(rp.Data, pattern(2, 1)) {
		t.Errorf("block 10 holds P2, the write of the history given up by the accept (it resurfaced in the accepted copy)")
	}
}

// The same without a join race: a is accepted while ready; the accept
// clears its logs (takeRecordRest: "logs of its past are obsolete"), but
// a restarts before that dirty-region log write lands (held here):
// owedDirty owes region 0 again, to the copy given up.
func TestReview90AcceptThenRestartOwesGivenUpCopy(t *testing.T) {
	h, id, a, _ := r90AcceptSetup(t)
	h.start(a)
	if !h.tickUntil(5*time.Second, func() bool { rp := a.e.reps[id]; return rp != nil && rp.ready() }) {
		t.Fatalf("setup: a not ready")
	}
	base := h.rec(id).Segs[0].Offset
	if NodeID(h.rec(id).Segs[1].Node) == a.id {
		base = h.rec(id).Segs[1].Offset
	}
	h.holdWrite = func(n *hnode, x DiskWrite) bool {
		return n == a && x.Off >= base+offDRL && x.Off < base+offDRL+2*PageSize
	}
	r90Accept(t, h, id)
	h.mustRead(a.id, id, 10, pattern(1, 1))
	h.crash(a, false, nil) // its dirty-region log's clearing not yet landed
	h.holdWrite, h.held = nil, nil
	h.start(a)
	h.tick(2 * time.Second)
	rp := h.rvRead(a.id, id, 10, 1)
	if rp.Err != nil || !bytes.Equal(rp.Data, pattern(1, 1)) {
		t.Errorf("accepted copy after a restart: block 10 is %v (owed %d, table Owed %v); want P1", rp.Err, a.e.reps[id].owedCount(), h.rec(id).Owed)
	}
}
