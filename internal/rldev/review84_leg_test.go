package rldev

import (
	"testing"
	"time"
)

// Outside review 84, question 2: one forward path for the peer and a
// move's target (commit dde06ea, leg).

func r84WriteOf(r *replica, block uint64) *writeOp {
	for w := range r.writes {
		if w.block == block {
			return w
		}
	}
	return nil
}

// Soundness (passes): during a move's copy, a write's two legs: the
// peer's registered in fwd only, the target's in tfwd only, distinct
// seqs, the current epoch; the peer's forward lands in s's segment, the
// target's (Target set) in tg's target extent; two Forwards counted. With
// the target unreachable its forward is registered, not sent, and not
// sent again (no Resends) until it is back; then sent again once (its
// resends 1, Stats.Resends +1, a new seq, the old one forgotten), and
// the write completes. With no move, the target's leg is never used.
func TestReview84LegForwards(t *testing.T) {
	h, id, p, s, tg := r81ThreeNodes(t)
	h.mustWrite(p.id, id, 700, pattern(1, 1))
	h.tick(3 * time.Second)
	sseg := h.rec(id).SegmentOf(uint64(s.id))
	h.rmStartMove(id, sseg, tg.id)
	if !h.tickUntil(10*time.Second, h.rmCopied(p.id, id, 64)) {
		t.Fatalf("setup: no copy: %+v", h.rec(id))
	}
	rec := h.rec(id)
	x, sg := rec.Move.To, rec.Segs[sseg]
	r := p.e.reps[id]
	at := func(n *hnode, ext Segment, b uint64) func(*hnode, DiskWrite) bool {
		return func(m *hnode, w DiskWrite) bool {
			return m == n && w.Disk == ext.Disk && w.Off == ext.Offset+blockOff(b)
		}
	}
	holdS, holdT := at(s, sg, 5), at(tg, x, 5)
	h.holdWrite = func(n *hnode, w DiskWrite) bool { return holdS(n, w) || holdT(n, w) }
	st0 := p.e.Stats()
	q := h.write(p.id, id, 5, pattern(9, 1), nil)
	h.run()
	w := r84WriteOf(r, 5)
	if w == nil {
		t.Fatalf("no write in flight")
	}
	if w.peer.target || !w.tgt.target {
		t.Fatalf("legs: peer %+v tgt %+v", w.peer, w.tgt)
	}
	if w.peer.seq == 0 || w.tgt.seq == 0 || w.peer.seq == w.tgt.seq {
		t.Fatalf("seqs: peer %d tgt %d", w.peer.seq, w.tgt.seq)
	}
	if r.fwd[w.peer.seq] != w || r.tfwd[w.tgt.seq] != w || r.fwd[w.tgt.seq] != nil || r.tfwd[w.peer.seq] != nil {
		t.Fatalf("maps: fwd %v tfwd %v", r.fwd, r.tfwd)
	}
	if w.peer.epoch != r.rec.Epoch || w.tgt.epoch != r.rec.Epoch || w.peer.acked || w.tgt.acked {
		t.Fatalf("epochs: %+v %+v (epoch %d)", w.peer, w.tgt, r.rec.Epoch)
	}
	if len(h.held) != 2 {
		t.Fatalf("the forwards did not land where they go (Target flag): %d held", len(h.held))
	}
	if d := p.e.Stats().Forwards - st0.Forwards; d != 2 {
		t.Fatalf("Forwards +%d, want 2", d)
	}
	h.holdWrite = nil
	for len(h.held) > 0 {
		h.release(0)
	}
	if rp, ok := h.replies[q]; !ok || rp.Err != nil {
		t.Fatalf("write: %+v %v", rp, ok)
	}
	if r.fwd[w.peer.seq] != nil || r.tfwd[w.tgt.seq] != nil {
		t.Fatalf("done write still registered")
	}

	// The target unreachable (less than moveStall).
	h.partition(p.id, tg.id)
	st1 := p.e.Stats()
	q = h.write(p.id, id, 6, pattern(7, 1), nil)
	h.run()
	w = r84WriteOf(r, 6)
	if w == nil || w.tgt.seq == 0 || r.tfwd[w.tgt.seq] != w || !w.peer.acked {
		t.Fatalf("unreachable target: %+v", w)
	}
	seq0 := w.tgt.seq
	h.tick(2 * time.Second)
	if d := p.e.Stats().Resends - st1.Resends; d != 0 || w.tgt.resends != 0 || w.tgt.seq != seq0 {
		t.Fatalf("sent again to an unreachable target: Resends +%d, leg %+v", d, w.tgt)
	}
	if h.rec(id).Move.Inc == 0 {
		t.Fatalf("setup: parked already")
	}
	h.heal(p.id, tg.id)
	h.run()
	if rp, ok := h.replies[q]; !ok || rp.Err != nil {
		t.Fatalf("write after heal: %+v %v (leg %+v)", rp, ok, w.tgt)
	}
	if d := p.e.Stats().Resends - st1.Resends; d != 1 || w.tgt.resends != 1 || w.peer.resends != 0 {
		t.Fatalf("after the heal: Resends +%d, tgt %+v peer %+v", d, w.tgt, w.peer)
	}
	if d := p.e.Stats().Forwards - st1.Forwards; d != 3 {
		t.Fatalf("Forwards +%d, want 3 (peer, target, target again)", d)
	}
	if _, ok := r.tfwd[seq0]; ok {
		t.Fatalf("the first seq still registered")
	}

	// No move: the target's leg is never used.
	tb := h.table()
	nr, err := tb.CancelMove(id)
	if err != nil {
		t.Fatal(err)
	}
	h.r83Commit(tb, nr)
	h.holdWrite = at(s, sg, 7)
	q = h.write(p.id, id, 7, pattern(5, 1), nil)
	h.run()
	w = r84WriteOf(r, 7)
	if w == nil || w.tgt.seq != 0 || w.tgt.epoch != 0 || len(r.tfwd) != 0 || w.peer.seq == 0 {
		t.Fatalf("no move: %+v, tfwd %v", w, r.tfwd)
	}
	h.holdWrite = nil
	for len(h.held) > 0 {
		h.release(0)
	}
	h.tick(time.Second)
	if rp, ok := h.replies[q]; !ok || rp.Err != nil {
		t.Fatalf("write with no move: %+v %v", rp, ok)
	}
}
