package rldev

import (
	"bytes"
	"testing"
	"time"
)

// writeAs asks node n to write as client write wid (through the primary
// there).
func (h *harness) writeAs(n NodeID, wid WriteID, id, block uint64, data []byte) ReqID {
	h.nextReq++
	q := h.nextReq
	nd := h.nodes[n]
	h.exec(nd, nd.e.WriteAs(h.env(nd), q, wid, id, block, data, nil, -1))
	return q
}

// landedOnce writes W (pattern 9, WriteID 7/1) at block 10 of a new
// RLDev of two nodes, through its primary p (s: the secondary).
func landedOnce(t *testing.T) (h *harness, rec *Record, p, s Segment, wid WriteID, w []byte) {
	t.Helper()
	h = newHarness(t, 2, testDisk)
	rec = h.create(128)
	p, s = rec.Segs[rec.Primary], rec.Segs[1-rec.Primary]
	w, wid = pattern(9, 1), WriteID{Writer: 7, Seq: 1}
	q := h.writeAs(p.Node, wid, rec.ID, 10, w)
	h.run()
	if r := h.replies[q]; r.Err != nil {
		t.Fatalf("setup: %v", r.Err)
	}
	return h, rec, p, s, wid, w
}

// TestRetryAfterFailoverNotAppliedAgain is CI's seed 62704 (2026-12-02)
// in the harness: write A is forwarded and lands on the secondary while
// the primary's own disk write hangs; the primary dies, the secondary
// serves alone and a read there returns A; another client's write B is
// acknowledged; then the clerk's retry of A (the same WriteID) arrives.
// Applied again it would land over B (A, B, then A again: not a
// register's history); the secondary remembers A landed and writes the
// range's current content instead, answering LandedBefore. The teeth:
// with Unsafe.ApplyRetries the block reads A again.
func TestRetryAfterFailoverNotAppliedAgain(t *testing.T) { retryAfterFailover(t, false) }
func TestRetryAfterFailoverTeeth(t *testing.T)           { retryAfterFailover(t, true) }

func retryAfterFailover(t *testing.T, unsafe bool) {
	h := newHarness(t, 2, 64<<20, func(h *harness) { h.unsafe.ApplyRetries = unsafe })
	rec := h.create(256)
	p, s := h.nodes[rec.Segs[rec.Primary].Node], h.nodes[rec.Segs[1-rec.Primary].Node]
	a, b := pattern(1, 1), pattern(7, 1)
	wid := WriteID{Writer: 99, Seq: 1}
	h.holdWrite = func(n *hnode, w DiskWrite) bool { return n == p && w.Encode != nil } // p's block writes hang
	q := h.writeAs(p.id, wid, rec.ID, 10, a)
	h.run()
	if _, ok := h.replies[q]; ok {
		t.Fatalf("setup: the write was answered with the primary's disk write hung: %+v", h.replies[q])
	}
	h.dead[Subject{p.id, p.inc}] = true
	h.crash(p, false, nil)
	h.held = nil
	if !h.tickUntil(10*time.Second, func() bool { r := h.rec(rec.ID); return r.State == Degraded && r.Segs[r.Primary].Node == s.id }) {
		t.Fatalf("setup: %d does not serve alone: %+v", s.id, h.rec(rec.ID))
	}
	h.mustRead(s.id, rec.ID, 10, a) // the forwarded write, seen
	h.mustWrite(s.id, rec.ID, 10, b)
	q = h.writeAs(s.id, wid, rec.ID, 10, a) // the clerk's retry
	h.run()
	r, ok := h.replies[q]
	if !ok || r.Err != nil {
		t.Fatalf("the retry: %v (answered %v)", r.Err, ok)
	}
	got := h.rvRead(s.id, rec.ID, 10, 1)
	if unsafe {
		if r.LandedBefore || !bytes.Equal(got.Data, a) {
			t.Fatalf("teeth: a retry applied again should land over B: landed before %v, block holds A %v", r.LandedBefore, bytes.Equal(got.Data, a))
		}
		return
	}
	if !r.LandedBefore || got.Err != nil || !bytes.Equal(got.Data, b) {
		t.Fatalf("the retry of a write that landed here: landed before %v; the block holds B %v (%v), want B: A, B, A is no register's history",
			r.LandedBefore, bytes.Equal(got.Data, b), got.Err)
	}
	if st := s.e.Stats(); st.LandedBefore != 1 {
		t.Fatalf("stats: %d writes landed before, want 1", st.LandedBefore)
	}
}

// TestRetryAtTheSamePrimary: a write acknowledged, its answer lost, then
// another write over it, then the retry at the same primary: not applied
// again, both copies hold the later write; a retry of a write that never
// landed (another WriteID) is applied; the same WriteID for other blocks
// is another write.
func TestRetryAtTheSamePrimary(t *testing.T) {
	h := newHarness(t, 2, 64<<20)
	rec := h.create(256)
	p := rec.Segs[rec.Primary].Node
	a, b := pattern(1, 2), pattern(7, 2)
	wid := WriteID{Writer: 5, Seq: 1}
	q := h.writeAs(p, wid, rec.ID, 20, a)
	h.run()
	if r := h.replies[q]; r.Err != nil || r.LandedBefore {
		t.Fatalf("the first attempt: %+v", r)
	}
	h.mustWrite(p, rec.ID, 20, b)
	q = h.writeAs(p, wid, rec.ID, 20, a)
	h.run()
	if r := h.replies[q]; r.Err != nil || !r.LandedBefore {
		t.Fatalf("the retry: %+v, want done, landed before", r)
	}
	h.mustRead(p, rec.ID, 20, b)
	h.sameCopies(rec.ID)

	q = h.writeAs(p, WriteID{Writer: 5, Seq: 2}, rec.ID, 20, a) // never sent before
	h.run()
	if r := h.replies[q]; r.Err != nil || r.LandedBefore {
		t.Fatalf("a write never sent before: %+v", r)
	}
	h.mustRead(p, rec.ID, 20, a)
	q = h.writeAs(p, wid, rec.ID, 21, b[:BlockSize]) // wid, other blocks
	h.run()
	if r := h.replies[q]; r.Err != nil || r.LandedBefore {
		t.Fatalf("a WriteID named for other blocks: %+v", r)
	}
	h.mustRead(p, rec.ID, 21, b[:BlockSize])
	h.sameCopies(rec.ID)
}

// TestLandedWritesForgetAndExpire: the memory forgets everything when
// another copy's blocks land, a write older than LandedFor, and the
// oldest past LandedMax.
func TestLandedWritesForgetAndExpire(t *testing.T) {
	var l landedWrites
	t0 := time.Unix(1000, 0)
	id := func(i int) WriteID { return WriteID{Writer: 1, Seq: uint64(i)} }
	l.remember(WriteID{}, 0, 1, 1, t0)
	has := func(id WriteID, block, n uint64, now time.Time) bool { _, ok := l.landed(id, block, n, now); return ok }
	if len(l.order) != 0 || has(WriteID{}, 0, 1, t0) {
		t.Fatal("a write without a WriteID is remembered")
	}
	l.remember(id(1), 3, 2, 1, t0)
	if !has(id(1), 3, 2, t0) || has(id(1), 3, 1, t0) || has(id(2), 3, 2, t0) {
		t.Fatal("lookup")
	}
	if has(id(1), 3, 2, t0.Add(LandedFor)) {
		t.Fatal("a write LandedFor old is remembered")
	}
	l.remember(id(2), 0, 1, 1, t0.Add(LandedFor))
	if _, ok := l.m[id(1)]; ok || len(l.order) != 1 {
		t.Fatalf("expired writes kept: %d", len(l.order))
	}
	for i := 3; i < 3+LandedMax+10; i++ {
		l.remember(id(i), uint64(i), 1, 1, t0.Add(LandedFor))
	}
	if len(l.order) != LandedMax || len(l.m) != LandedMax || has(id(2), 0, 1, t0.Add(LandedFor)) || !has(id(3+LandedMax+9), uint64(3+LandedMax+9), 1, t0.Add(LandedFor)) {
		t.Fatalf("past LandedMax: %d in order, %d in the map", len(l.order), len(l.m))
	}
	l.forget()
	if has(id(3+LandedMax+9), uint64(3+LandedMax+9), 1, t0.Add(LandedFor)) {
		t.Fatal("a write remembered after forget")
	}
}

// BenchmarkLandedRemember: what remembering a write costs each copy, at
// steady state (LandedMax remembered, the oldest let go at each write).
func BenchmarkLandedRemember(b *testing.B) {
	var l landedWrites
	t0 := time.Unix(1000, 0)
	for i := 0; i < b.N; i++ {
		l.remember(WriteID{Writer: 1, Seq: uint64(i + 1)}, uint64(i%1000), 1, uint64(i), t0)
	}
}
