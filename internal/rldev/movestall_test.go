package rldev

import (
	"bytes"
	"fmt"
	"math/rand"
	"strings"
	"testing"
	"time"
)

// A move's target that restarts while the primary still cannot reach it
// (its session to the target not up yet, or a failure in one direction)
// was parked again at once: the primary's stall clock ran from the
// previous incarnation's loss, the target asked to be named again at
// once, and the two traded decrees as fast as the config service took
// them (about 300 table versions in half a second in a real cluster:
// grove rldev move, the target SIGKILLed during the copy and restarted).
// Each naming now has moveStall of its own before the primary parks it.
func TestMoveTargetBackNotParkedAtOnce(t *testing.T) {
	h := newHarness(t, 3, testDisk)
	r := h.create(1024)
	p, tg := r.Segs[0].Node, NodeID(3)
	if r.Segs[1].Node == tg {
		t.Fatalf("setup: node %d holds a segment", tg)
	}
	h.rmStartMove(r.ID, 1, tg)
	if !h.rvStepUntil(h.rmCopied(p, r.ID, 1)) {
		t.Fatal("setup: no copy")
	}
	h.crash(h.nodes[tg], false, rand.New(rand.NewSource(1)))
	h.tick(6 * time.Second) // not declared dead: parked once unreachable for moveStall
	if m := h.rec(r.ID).Move; m == nil || m.Inc != 0 {
		t.Fatalf("setup: the move is not parked: %+v", m)
	}

	// The target comes back and sees the primary; the primary does not
	// see the target.
	var what []string
	h.holdPropose = func(n *hnode, x Propose) bool {
		what = append(what, x.What)
		return len(what) > 40 // a livelock stops here
	}
	h.partition(p, tg)
	tn := h.nodes[tg]
	h.start(tn)
	h.exec(tn, tn.e.PeerUp(h.env(tn), p))
	h.run()
	h.tick(3 * time.Second)
	parks := func() (n int) {
		for _, w := range what {
			if strings.Contains(w, "the move waits for it") {
				n++
			}
		}
		return n
	}
	t.Logf("decrees in the 3 s after the target's restart: %d, %d of them parking it", len(what), parks())
	if parks() > 0 || len(what) > 1 {
		t.Fatalf("DEFECT: the target restarted was parked at once (%d decrees, %d parks in 3 s): %q", len(what), parks(), what[:min(len(what), 6)])
	}
	// Still unreachable after moveStall of its own: parked (the target
	// asks again: one round per moveStall, not per decree).
	h.tick(9 * time.Second)
	t.Logf("after 12 s: %d decrees, %d parks", len(what), parks())
	if parks() < 1 || parks() > 3 {
		t.Fatalf("a target unreachable for 12 s was parked %d times (want 1-3): %q", parks(), what)
	}
	// Reachable again: the move completes.
	h.holdPropose = nil
	h.heal(p, tg)
	if !h.tickUntil(60*time.Second, func() bool { return h.rec(r.ID).Move == nil }) {
		t.Fatalf("the move did not complete after the heal: %+v", h.rec(r.ID).Move)
	}
	h.run()
	if got := h.rec(r.ID).Segs[1].Node; got != tg {
		t.Fatalf("segment 1 on node %d after the move (want %d)", got, tg)
	}
	h.sameCopies(r.ID)
}

// A move's copy chunk that waited for its range while the copy stopped
// went on once granted: a move of the secondary compares each chunk
// with the secondary first, and the stopped copy's comparison was asked
// of the peer after stopCopy had answered the copy's pulls. Nothing
// answered it when the peer turned stale (only pulls of no copy are
// answered then), so the chunk held its range for ever and the resync
// that followed waited behind it: the RLDev never returned to normal
// (the simulator, seed 5084 of the as-run stream with slow copies).
func TestStoppedMoveChunkReleasesItsRange(t *testing.T) {
	h := newHarness(t, 4, testDisk)
	r := h.create(1024)
	p, s := h.nodes[r.Segs[0].Node], h.nodes[r.Segs[1].Node]
	var tg *hnode
	for _, n := range h.sorted() {
		if n != p && n != s {
			tg = n
			break
		}
	}
	h.mustWrite(p.id, r.ID, 100, pattern(7, 1))
	// A read of block 100 (in the copy's second chunk) held in p's disk
	// queue: it shares the range until it is answered.
	hold := true
	h.holdRead = func(n *hnode, x DiskRead) bool { return hold && n == p }
	q := h.read(p.id, r.ID, 100, 1)
	h.run()
	hold = false
	if len(h.held) == 0 {
		t.Fatal("setup: the read is not held")
	}
	h.rmStartMove(r.ID, 1, tg.id) // the secondary's segment
	h.run()
	if !h.tickUntil(2*time.Second, func() bool { return p.e.reps[r.ID].mv != nil }) {
		t.Fatal("setup: no move copy")
	}
	// The target dies: the move waits, its copy stops.
	h.crash(tg, false, nil)
	h.dead[Subject{tg.id, tg.inc}] = true
	if !h.tickUntil(5*time.Second, func() bool { m := h.rec(r.ID).Move; return m != nil && m.Inc == 0 }) {
		t.Fatalf("setup: the move did not wait: %+v", h.rec(r.ID).Move)
	}
	// p is cut from s; the read is answered, the stopped chunk granted.
	h.partition(p.id, s.id)
	for len(h.held) > 0 {
		h.release(0)
	}
	h.run()
	if rp, ok := h.replies[q]; !ok || rp.Err != nil || !bytes.Equal(rp.Data, pattern(7, 1)) {
		t.Fatalf("setup: the held read: answered %v, %v", ok, rp.Err)
	}
	// s dies: its segment stays in place, stale (moveDegraded keeps a
	// dead node's moving segment; until 2026-11-30 (night) the target replaced
	// it), comes back and is resynced, behind the stopped chunk's range.
	h.crash(s, false, nil)
	h.dead[Subject{s.id, s.inc}] = true
	if !h.tickUntil(5*time.Second, func() bool { return h.rec(r.ID).State == Degraded }) {
		t.Fatalf("setup: not degraded: %+v", h.rec(r.ID))
	}
	h.start(tg)
	h.start(s)
	h.heal(p.id, s.id)
	h.run()
	if !h.tickUntil(30*time.Second, func() bool { return h.rec(r.ID).State == Normal }) {
		var held []string
		for _, l := range p.e.reps[r.ID].locks.held {
			held = append(held, fmt.Sprintf("[%d,%d)", l.first, l.end))
		}
		t.Fatalf("DEFECT: the RLDev is not normal 30 s after its peer came back (%+v); ranges held on the primary: %v", h.rec(r.ID), held)
	}
	h.mustRead(p.id, r.ID, 100, pattern(7, 1))
	h.sameCopies(r.ID)
}
