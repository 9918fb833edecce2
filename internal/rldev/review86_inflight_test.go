package rldev

import (
	"bytes"
	"errors"
	"testing"
	"time"
)

// Outside review 86: the recovery's pulled data is being written at the
// primary (q.writing) when the secondary is declared dead. The RLDev
// degrades (the range is durably owed: owed.go); a client write of the
// range waits for the pulled data, is not undone, and both copies end
// with it once the secondary is back.
func TestReview86PullWritingWhenDegraded(t *testing.T) {
	h := newHarness(t, 3, testDisk, func(h *harness) { h.scrubRate = -1 })
	r := h.create(256)
	p, s := h.nodes[NodeID(r.Segs[r.Primary].Node)], h.nodes[NodeID(r.Segs[1-r.Primary].Node)]
	h.mustWrite(p.id, r.ID, 100, pattern(1, 1)) // region 0 dirty (lazy clearing)
	h.crash(p, false, nil)
	base := r.Segs[r.Primary].Offset
	held := 0
	h.holdWrite = func(n *hnode, x DiskWrite) bool {
		if n == p && x.Off >= base+MetaSize && x.Off < base+blockOff(256) {
			held++
			return true
		}
		return false
	}
	h.start(p)
	if !h.tickUntil(3*time.Second, func() bool { return held > 0 }) {
		t.Fatalf("setup: no pulled data written: %+v", h.rec(r.ID))
	}
	h.holdWrite = nil
	pr := p.e.reps[r.ID]
	if pr.recovering() == 0 || len(pr.recoverQ) == 0 || !pr.recoverQ[0].writing {
		t.Fatalf("setup: recovering %d", pr.recovering())
	}
	h.crash(s, false, nil)
	h.dead[Subject{s.id, s.inc}] = true
	q := h.write(p.id, r.ID, 100, pattern(5, 1), nil)
	h.tick(2 * time.Second)
	if rp, ok := h.replies[q]; ok {
		t.Fatalf("a client write of the range was answered (%v) while the pulled data's write was still in flight", rp.Err)
	}
	if st := h.rec(r.ID).State; st != Degraded || !pr.recoveryOwed() {
		t.Fatalf("not degraded on the verdict with the range durably owed: %v", st)
	}
	for len(h.held) > 0 {
		h.release(0)
	}
	h.dead = map[Subject]bool{}
	h.start(s)
	if !h.tickUntil(20*time.Second, func() bool { _, ok := h.replies[q]; return ok && h.rec(r.ID).State == Normal }) {
		t.Fatalf("client write not answered once the secondary is back: %+v", h.rec(r.ID))
	}
	if rp := h.replies[q]; rp.Err != nil {
		t.Fatalf("client write: %v", rp.Err)
	}
	h.mustRead(p.id, r.ID, 100, pattern(5, 1))
	h.mustRead(s.id, r.ID, 100, pattern(5, 1))
	h.sameCopies(r.ID)
}

// Outside review 86 (failing on e91bbe6, which degraded and served the
// range here; now the RLDev degrades with the range owed, unserved, until
// the pull-back ends): a
// write the secondary refused (ErrStaleToken: it admitted a newer token)
// landed at the primary, which pulls the range back from the secondary
// (x = noRegion). The secondary is declared dead before the pull-back:
// the RLDev degrades, abandonRecovery serves the primary's copy -- the
// refused write -- over the acknowledged value, and the resync copies it
// to the returning secondary. Before e91bbe6 the RLDev stayed normal until
// the secondary came back and the pull-back restored the acknowledged
// value.
func TestReview86RefusedWriteServedAfterDegrade(t *testing.T) {
	h := newHarness(t, 2, testDisk, func(h *harness) { h.scrubRate = -1 })
	r := h.create(1024)
	p, s := r.Segs[0].Node, r.Segs[1].Node
	old := pattern(3, 1)
	q0 := h.write(p, r.ID, 0, old, rmFence(4))
	h.run()
	if rp, ok := h.replies[q0]; !ok || rp.Err != nil {
		t.Fatalf("setup: W0 %v %v", ok, rp.Err)
	}
	h.partition(p, s)
	q1 := h.write(p, r.ID, 0, pattern(1, 1), rmFence(5)) // lands at p, waits for s
	h.run()
	h.heal(p, s)
	q2 := h.write(p, r.ID, 500, pattern(2, 1), rmFence(7)) // s admits 7 first
	h.run()
	if rp, ok := h.replies[q2]; !ok || rp.Err != nil {
		t.Fatalf("setup: W2 %v %v", ok, rp.Err)
	}
	if !h.rvTickUntil(3*time.Second, func() bool { _, ok := h.replies[q1]; return ok }) || !errors.Is(h.replies[q1].Err, ErrStaleToken) {
		t.Fatalf("setup: W1 not refused by the secondary: %+v", h.replies[q1])
	}
	h.partition(p, s) // the pull-back waits
	h.tick(time.Second)
	pr := h.nodes[p].e.reps[r.ID]
	if pr.recovering() == 0 {
		t.Fatal("setup: the pull-back completed")
	}
	h.crash(h.nodes[s], false, nil)
	h.dead[Subject{s, h.nodes[s].inc}] = true
	h.tick(5 * time.Second)
	// Degraded with the pull-back owed (owed.go): block 0 waits for the
	// secondary's copy, unserved; the rest is served.
	if st := h.rec(r.ID).State; st != Degraded || pr.owedCount() != 1 {
		t.Fatalf("the primary, its pull-back owed, not degraded on the verdict: %v (owed %d)", st, pr.owedCount())
	}
	if rp := h.rvRead(p, r.ID, 0, 1); !errors.Is(rp.Err, ErrUnavailable) {
		t.Fatalf("the owed block read at the degraded primary: %v, want ErrUnavailable", rp.Err)
	}
	if rp := h.rvRead(p, r.ID, 500, 1); rp.Err != nil || !bytes.Equal(rp.Data, pattern(2, 1)) {
		t.Fatalf("block 500 read at the degraded primary: %v", rp.Err)
	}
	delete(h.cut, [2]NodeID{p, s})
	delete(h.cut, [2]NodeID{s, p})
	h.dead = map[Subject]bool{}
	h.start(h.nodes[s])
	if !h.tickUntil(20*time.Second, func() bool { return pr.recovering() == 0 && h.rec(r.ID).State == Normal }) {
		t.Fatalf("the pull-back did not end: %+v", h.rec(r.ID))
	}
	for _, n := range []NodeID{p, s} {
		if rp := h.rvRead(n, r.ID, 0, 1); rp.Err != nil || !bytes.Equal(rp.Data, old) {
			t.Errorf("block 0 at node %d: %v, want the acknowledged value, not the refused write", n, rp.Err)
		}
	}
}
