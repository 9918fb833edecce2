package rldev

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// Outside review 84, question 1: Record.RetiringTargets (commit cafd85c):
// a move's target given up is wiped in any state, other retiring extents
// only once the RLDev is normal.

// Soundness (passes): the secondary's segment moves to tg; the copy is
// complete and Switch set (s answered the probe: it serves nothing), and
// the switch decree is out when the operator's cancel commits first. The
// switch decree then fails (version), the target retires as a target
// (RetiringTargets), s serves again -- it took every forward while
// switching, so nothing it lacks -- and tg wipes the target at once.
func TestReview84CancelWhileSwitching(t *testing.T) {
	h, id, p, s, tg := r81ThreeNodes(t)
	h.mustWrite(p.id, id, 700, pattern(1, 1))
	h.tick(3 * time.Second)
	sseg := h.rec(id).SegmentOf(uint64(s.id))
	h.holdPropose = func(n *hnode, x Propose) bool { return n == p && strings.Contains(x.What, "moved from") }
	h.rmStartMove(id, sseg, tg.id)
	if !h.tickUntil(60*time.Second, func() bool { return len(h.heldDecrees) == 1 }) {
		t.Fatalf("setup: no switch decree: %+v", h.rec(id))
	}
	h.holdPropose = nil
	held := h.heldDecrees[0]
	h.heldDecrees = nil
	rec := h.rec(id)
	if rec.Move == nil || !rec.Move.Switch {
		t.Fatalf("setup: not switching: %+v", rec.Move)
	}
	x := rec.Move.To
	if b := r82BlockAt(tg, x, id, 700); len(b) == 0 || b[0] != 1 {
		t.Fatalf("setup: target not whole: %x", b)
	}
	tb := h.table()
	nr, err := tb.CancelMove(id)
	if err != nil {
		t.Fatal(err)
	}
	if !nr.isRetiringTarget(x) || len(nr.RetiringTargets) != 1 || len(nr.Retiring) != 1 {
		t.Fatalf("cancel: %+v", nr)
	}
	h.r83Commit(tb, nr)
	err = h.commit(held)
	if err == nil {
		t.Fatalf("DEFECT: the switch decree committed after the cancel")
	}
	h.exec(p, p.e.Decided(h.env(p), held.ID, err))
	h.run()
	h.mustWrite(p.id, id, 701, pattern(2, 1))
	h.mustRead(s.id, id, 700, pattern(1, 1))
	h.mustRead(s.id, id, 701, pattern(2, 1))
	if !h.tickUntil(20*time.Second, func() bool { return len(h.rec(id).Retiring) == 0 }) {
		t.Fatalf("target never freed: %+v", h.rec(id))
	}
	rec = h.rec(id)
	if len(rec.RetiringTargets) != 0 || rec.State != Normal || rec.Segs[sseg].Node != uint64(s.id) {
		t.Fatalf("after the cancel: %+v", rec)
	}
	if _, ok := r82PlatterSuperAt(tg, x); ok {
		t.Fatalf("freed without a wipe")
	}
	h.sameCopies(id)
}

// Soundness (passes): a target that becomes a segment -- by the switch,
// or by moveDegraded when the moving segment's disk fails -- is never
// listed in RetiringTargets when it later retires; the old place retires
// as a segment's (kept until normal).
func TestReview84SwitchedInTargetRetiresAsSegment(t *testing.T) {
	t.Run("switch, then re-placed", func(t *testing.T) {
		h, id, p, s, tg := r81ThreeNodes(t)
		h.mustWrite(p.id, id, 700, pattern(1, 1))
		h.tick(3 * time.Second)
		sseg := h.rec(id).SegmentOf(uint64(s.id))
		h.rmStartMove(id, sseg, tg.id)
		if !h.tickUntil(60*time.Second, func() bool {
			r := h.rec(id)
			return r.Move == nil && r.Segs[sseg].Node == uint64(tg.id) && r.State == Normal && len(r.Retiring) == 0
		}) {
			t.Fatalf("setup: no switch: %+v", h.rec(id))
		}
		x := h.rec(id).Segs[sseg]
		// tg's disk fails writes: its segment fails, the RLDev degrades.
		h.failWrite = func(n *hnode, w DiskWrite) bool { return n == tg }
		h.mustWrite(p.id, id, 701, pattern(2, 1))
		if !h.tickUntil(10*time.Second, func() bool { r := h.rec(id); return r.State == Degraded && r.Stale[sseg] }) {
			t.Fatalf("setup: not degraded: %+v", h.rec(id))
		}
		h.failWrite = nil
		nr := h.r82Replace(id, sseg, s.id, -1)
		if !slices.Contains(nr.Retiring, x) || nr.isRetiringTarget(x) || len(nr.RetiringTargets) != 0 {
			t.Fatalf("DEFECT: the switched-in extent retires as %v (targets %v)", nr.Retiring, nr.RetiringTargets)
		}
		h.run()
		for i := 0; h.rec(id).State != Normal && i < 600; i++ {
			h.tick(100 * time.Millisecond)
			if h.rec(id).State != Normal {
				if _, ok := r82PlatterSuperAt(tg, x); !ok {
					t.Fatalf("DEFECT: the switched-in extent wiped before the rebuild ended: %+v", h.rec(id))
				}
			}
		}
		if !h.tickUntil(20*time.Second, func() bool { r := h.rec(id); return r.State == Normal && len(r.Retiring) == 0 }) {
			t.Fatalf("not normal with x freed: %+v", h.rec(id))
		}
		h.sameCopies(id)
	})
	t.Run("moving segment's disk fails", func(t *testing.T) {
		h, id, p, s, tg := r81ThreeNodes(t)
		h.mustWrite(p.id, id, 700, pattern(1, 1))
		h.tick(3 * time.Second)
		sseg := h.rec(id).SegmentOf(uint64(s.id))
		old := h.rec(id).Segs[sseg]
		h.rmStartMove(id, sseg, tg.id)
		if !h.tickUntil(20*time.Second, h.rmCopied(p.id, id, 256)) {
			t.Fatalf("setup: no move copy: %+v", h.rec(id))
		}
		x := h.rec(id).Move.To
		h.failWrite = func(n *hnode, w DiskWrite) bool { return n == s }
		h.mustWrite(p.id, id, 701, pattern(2, 1))
		if !h.tickUntil(10*time.Second, func() bool { return h.rec(id).Segs[sseg] == x }) {
			t.Fatalf("setup: the target did not replace the failed moving segment: %+v", h.rec(id))
		}
		rec := h.rec(id)
		if !slices.Contains(rec.Retiring, old) || rec.isRetiringTarget(old) || len(rec.RetiringTargets) != 0 {
			t.Fatalf("DEFECT: moveDegraded: retiring %v targets %v", rec.Retiring, rec.RetiringTargets)
		}
		h.failWrite = nil
		if !h.tickUntil(60*time.Second, func() bool { r := h.rec(id); return r.State == Normal && len(r.Retiring) == 0 }) {
			t.Fatalf("not normal: %+v", h.rec(id))
		}
		h.sameCopies(id)
	})
}

// Limitation (passes, documents it): "a move's target given up never held
// a copy the RLDev may need" is not so for a target whose copy completed
// before the RLDev left the normal state. The primary's segment moves to
// tg; the copy is whole (the switching decree is held), when s's disk
// fails for good: the RLDev degrades, the move is parked, tg holds a whole
// copy as of the degrade -- the only one besides p's (s's disk is dead).
// The operator follows the documented path to repair s's segment (cancel
// the move, then re-place it): the cancel lists tg's extent in
// RetiringTargets and tg wipes it at once, while p is the one copy left.
// Before cafd85c it was kept until the RLDev was normal, as a segment's
// old place is (review 82's gate). No command can name either kind of kept
// extent (TestReview83KeptOldCopyUnreachable), so only recovery by hand
// loses a source.
func TestReview84WholeTargetWipedWhileDegraded(t *testing.T) {
	h, id, p, s, tg := r81ThreeNodes(t)
	h.mustWrite(p.id, id, 700, pattern(1, 1))
	h.tick(3 * time.Second)
	pseg := h.rec(id).Primary
	sseg := 1 - pseg
	h.holdPropose = func(n *hnode, x Propose) bool { return n == p && strings.Contains(x.What, "move copied") }
	h.rmStartMove(id, pseg, tg.id)
	if !h.tickUntil(60*time.Second, func() bool { return len(h.heldDecrees) == 1 }) {
		t.Fatalf("setup: the copy did not complete: %+v", h.rec(id))
	}
	h.holdPropose = nil
	held := h.heldDecrees[0]
	h.heldDecrees = nil
	x := h.rec(id).Move.To
	whole := 0
	for b := uint64(0); b < 1024; b++ {
		if len(r82BlockAt(tg, x, id, b)) > 0 {
			whole++
		}
	}
	if b := r82BlockAt(tg, x, id, 700); len(b) == 0 || b[0] != 1 {
		t.Fatalf("setup: block 700 not on the target")
	}
	// s's disk dies (every write fails from now on).
	h.failWrite = func(n *hnode, w DiskWrite) bool { return n == s }
	h.mustWrite(p.id, id, 701, pattern(2, 1))
	if !h.tickUntil(10*time.Second, func() bool { r := h.rec(id); return r.State == Degraded && r.Stale[sseg] }) {
		t.Fatalf("setup: not degraded: %+v", h.rec(id))
	}
	err := h.commit(held)
	h.exec(p, p.e.Decided(h.env(p), held.ID, err))
	h.run()
	if m := h.rec(id).Move; m == nil || m.Inc != 0 {
		t.Fatalf("setup: move not parked: %+v", m)
	}
	h.mustWrite(p.id, id, 702, pattern(3, 1)) // p alone
	if b := r82BlockAt(tg, x, id, 701); len(b) == 0 || b[0] != 2 {
		t.Fatalf("setup: the target missed block 701 (forwarded before the degrade): %x", b)
	}
	tb := h.table()
	nr, err := tb.CancelMove(id)
	if err != nil {
		t.Fatal(err)
	}
	h.r83Commit(tb, nr)
	h.tick(5 * time.Second)
	rec := h.rec(id)
	_, kept := r82PlatterSuperAt(tg, x)
	t.Logf("target %v held %d of 1024 blocks decodable (block 700, 701 as of the degrade); after the cancel: state %v, retiring %v, extent kept %v", x, whole, rec.State, rec.Retiring, kept)
	if rec.State == Normal {
		t.Fatalf("setup: normal again")
	}
	if kept {
		t.Fatalf("the cancelled whole target was kept while degraded (the commit's rule is not in force)")
	}
	t.Logf("LIMITATION: a move's target whose copy completed before the RLDev degraded, cancelled (the documented way to re-place the stale segment), is wiped at once while p holds the only other copy; before cafd85c it waited for normal like a segment's old place")
}
