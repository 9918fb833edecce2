package rldev

import (
	"bytes"
	"errors"
	"testing"
	"time"
)

// TestReview37ReloadedReplicaLetsEarlierWriteLandLast (review 37): the
// sequencing of a clerk's connections (admitClerkConn) rests on "a write
// started on the engine before its retry lands before it". A replica whose
// disk failed was loaded again after ReloadEvery (replica.retry) with its
// range locks reset, while a write of its failed life still had its disk
// write in flight (held: its range is meant to stay locked until it
// lands). W1 starts, its disk write hangs; another write's I/O fails (the
// replica fails; W1 is answered "may have been written"); 5 s later the
// replica served again; the clerk's retry W2 and its next write W3 to the
// same blocks succeeded; then W1's disk write completed, over W3. The RLDev
// is degraded (this node holds the only up-to-date copy): the acknowledged
// W3 was gone. Now the replica loads again only once none of its disk
// writes is in progress: it stays failed while W1's hangs, and serves once
// it has landed, so W2 and W3 come after it.
func TestReview37ReloadedReplicaLetsEarlierWriteLandLast(t *testing.T) {
	h := newHarness(t, 2, testDisk)
	r := h.create(512)
	p, s := r.Segs[0].Node, r.Segs[1].Node
	h.crash(h.nodes[s], true, nil)
	h.run()
	h.dead[Subject{s, h.nodes[s].inc}] = true
	h.tick(time.Second)
	if rec := h.rec(r.ID); rec.State != Degraded || rec.Primary != 0 || !rec.Stale[1] {
		t.Fatalf("setup: record %+v, want degraded with node %d primary", rec, p)
	}
	pn := h.nodes[p]
	base := r.Segs[0].Offset
	dataAt := func(block uint64) func(*hnode, DiskWrite) bool {
		return func(n *hnode, x DiskWrite) bool { return n == pn && x.Encode != nil && x.Off == base+blockOff(block) }
	}

	// W1: its data write hangs.
	h.holdWrite = dataAt(10)
	w1 := h.writeBy(pn, r.ID, 10, pattern(1, 2))
	if len(h.held) != 1 {
		t.Fatalf("W1's data write not issued (%d held, reply %+v)", len(h.held), h.replies[w1])
	}
	h.holdWrite = nil
	// W0, elsewhere: its I/O fails; the replica fails, W1 is answered.
	h.failWrite = dataAt(100)
	h.writeBy(pn, r.ID, 100, pattern(9, 1))
	h.failWrite = nil
	if rp, ok := h.replies[w1]; !ok || !errors.Is(rp.Err, ErrMaybeWritten) {
		t.Fatalf("W1 after the failure: %+v (replied %v), want ErrMaybeWritten", rp.Err, ok)
	}
	// ReloadEvery later the replica still does not serve: W1's I/O hangs.
	h.tick(6 * time.Second)
	if st := pn.e.reps[r.ID].state; st == repReady {
		t.Fatal("replica loaded again and serving while a write of its failed life is still in progress")
	}
	if rp, ok := h.replies[h.writeBy(pn, r.ID, 10, pattern(1, 2))]; ok && rp.Err == nil {
		t.Fatal("W2 (the retry) accepted while W1's disk write is still in progress")
	}
	// The wait is visible (grove rldev list shows Wait).
	if st := statusOf(pn.e, r.ID, false); st.State != "failed" || st.Wait == "" {
		t.Errorf("status of the failed replica waiting for its failed life's write: %+v, want failed with a Wait", st)
	}
	// W1's hung I/O completes; the replica then loads again and serves.
	h.release(0)
	h.tick(6 * time.Second)
	if st := pn.e.reps[r.ID].state; st != repReady {
		t.Fatalf("replica %v once its writes landed and ReloadEvery passed, want ready", st)
	}
	if st := statusOf(pn.e, r.ID, false); st.Wait != "" {
		t.Errorf("status of the reloaded replica: %+v, want no Wait", st)
	}
	if rp, ok := h.replies[h.writeBy(pn, r.ID, 10, pattern(1, 2))]; !ok || rp.Err != nil {
		t.Fatalf("W2 (the retry): %+v (replied %v)", rp.Err, ok)
	}
	if rp, ok := h.replies[h.writeBy(pn, r.ID, 10, pattern(3, 2))]; !ok || rp.Err != nil {
		t.Fatalf("W3 (the next write): %+v (replied %v)", rp.Err, ok)
	}

	rp := h.rvRead(p, r.ID, 10, 2)
	if rp.Err != nil {
		t.Fatalf("read: %+v", rp.Err)
	}
	if !bytes.Equal(rp.Data, pattern(3, 2)) {
		t.Fatalf("blocks 10-11 hold %#x..., W1's data (started first, answered ErrMaybeWritten), not the acknowledged W3's %#x...: W1's disk write landed after W2 and W3",
			rp.Data[0], pattern(3, 2)[0])
	}
}

// statusOf is e's status of RLDev id's segment (target false) or move
// target (true); the zero status if e reports none.
func statusOf(e *Engine, id uint64, target bool) ReplicaStatus {
	for _, st := range e.Status() {
		if st.RLDev == id && st.MoveTarget == target {
			return st
		}
	}
	return ReplicaStatus{}
}
