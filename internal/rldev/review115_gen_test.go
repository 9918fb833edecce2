package rldev

import (
	"bytes"
	"testing"
	"time"

	pb "github.com/grovestore/grove/api/grovepb"
)

// TestReview115WriteReplicaLowerGen: on an RLDev with its log off, a
// WriteReplica on the secondary takes the secondary's own generation,
// which is below the primary's (forwarded) ones of the same epoch: a
// later write X carries a lower generation than an earlier remembered W.
// After a failover the retry of W found X "older" and applied W over it
// (outside review 115; now a forward raises the copy's own generations).
func TestReview115WriteReplicaLowerGen(t *testing.T) {
	h := newHarness(t, 2, testDisk)
	tb := h.table()
	r0, err := tb.Create(128, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.propose(&pb.Decree{Namespace: Namespace, ExpectedVersion: tb.Version, Ops: []*pb.Op{r0.PutOp()}}); err != nil {
		t.Fatal(err)
	}
	h.run()
	h.joined(r0.ID)
	rec := h.rec(r0.ID)
	p, s := h.nodes[rec.Segs[rec.Primary].Node], h.nodes[rec.Segs[1-rec.Primary].Node]
	w, x := pattern(9, 1), pattern(3, 1)
	h.mustWrite(p.id, rec.ID, 3, pattern(1, 1)) // the primary's generations run ahead of the secondary's
	wid := WriteID{Writer: 7, Seq: 1}
	q := h.writeAs(p.id, wid, rec.ID, 10, w)
	h.run()
	if r := h.replies[q]; r.Err != nil {
		t.Fatalf("setup: %v", r.Err)
	}
	// Another client writes X to the secondary's copy (WriteReplica).
	h.nextReq++
	q = h.nextReq
	h.exec(s, s.e.Write(h.env(s), q, rec.ID, 10, x, nil, 1-rec.Primary))
	h.run()
	if r := h.replies[q]; r.Err != nil {
		t.Fatalf("WriteReplica: %v", r.Err)
	}
	h.mustRead(s.id, rec.ID, 10, x)
	h.dead[Subject{p.id, p.inc}] = true
	h.crash(p, false, nil)
	if !h.tickUntil(10*time.Second, func() bool { r := h.rec(rec.ID); return r.State == Degraded && r.Segs[r.Primary].Node == s.id }) {
		t.Fatalf("setup: %d does not serve alone: %+v", s.id, h.rec(rec.ID))
	}
	q = h.writeAs(s.id, wid, rec.ID, 10, w) // the clerk's retry of W
	h.run()
	r := h.replies[q]
	got := h.rvPlatterBlock(s.id, rec.ID, 10)
	t.Logf("retry: err %v landed before %v; holds X %v W %v; stale %d", r.Err, r.LandedBefore, bytes.Equal(got, x), bytes.Equal(got, w), s.e.Stats().LandedStale)
	if !bytes.Equal(got, x) {
		t.Fatalf("W, X, W: the later write X carried a lower generation than W, and the retry landed over it")
	}
}
