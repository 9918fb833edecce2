package rldev

import (
	"errors"
	"testing"
	"time"
)

// Outside review 92, F2 converse: primaryLive is read once, in the
// secondary's own failure decree. A moving secondary whose disk fails
// while its session to the primary is down (a partition; the primary
// alive, named, owing nothing) is kept, stale, the move waiting -- and
// nothing looks again once the session is back: its disk failing for
// good, the RLDev stays degraded with the move parked until an operator
// cancels it and re-places the segment (before review 91 the move's
// target replaced it at once: "the move empties a failing disk").
func TestReview92MovingSecondaryFailedDuringPartitionKeptForEver(t *testing.T) {
	r92MovingFailed(t, true)
}

// The control: the same failure with the session up is replaced.
func TestReview92MovingSecondaryFailedControl(t *testing.T) { r92MovingFailed(t, false) }

func r92MovingFailed(t *testing.T, cut bool) {
	h, r, p, s, third := slowMoveTrio(t)
	sseg := 1 - r.Primary
	h.mustWrite(p.id, r.ID, 0, pattern(1, 1))
	h.rmStartMove(r.ID, sseg, third.id)
	h.run()
	h.tick(time.Second)
	if cut {
		h.partition(p.id, s.id)
	}
	h.failWrite = func(n *hnode, x DiskWrite) bool { return n == s } // s's disk fails for good (writes)
	h.exec(s, s.e.reps[r.ID].fail(errors.New("EIO (injected)")))
	h.exec(s, s.e.Tick(h.env(s)))
	h.run()
	t.Logf("s failed while cut from p: %+v move %+v", h.rec(r.ID), h.rec(r.ID).Move)
	if cut {
		h.heal(p.id, s.id)
	}
	h.tick(120 * time.Second)
	rec := h.rec(r.ID)
	t.Logf("2 min later: %+v move %+v", rec, rec.Move)
	if NodeID(rec.Segs[sseg].Node) != third.id {
		t.Errorf("the moving secondary's failed disk (p alive, owing nothing) is still the segment after 2 min: state %v, move %+v", rec.State, rec.Move)
	}
}

// slowMoveTrio: three nodes, no scrubber, copies at 4 KiB/s (a move's copy
// is still going seconds later); an RLDev of 256 blocks, its primary p,
// its secondary s, and the third node, where nothing of it is.
func slowMoveTrio(t *testing.T) (*harness, *Record, *hnode, *hnode, *hnode) {
	h := newHarness(t, 3, testDisk, func(h *harness) { h.scrubRate, h.copyRate = -1, 4096 })
	r := h.create(256)
	p, s := h.nodes[NodeID(r.Segs[r.Primary].Node)], h.nodes[NodeID(r.Segs[1-r.Primary].Node)]
	var third *hnode
	for _, n := range h.nodes {
		if n != p && n != s {
			third = n
		}
	}
	return h, r, p, s, third
}
