package rldev

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// TestRetiredReplicaLateReadAnswersPull (review 38, a lesser finding): a
// secondary moved away answered, after the switch, a Pull whose disk read
// had been in flight when it retired. Its extent was wiped meanwhile
// (Engine.inUse counted a retired replica's writes, not its reads): the
// read returned zeroed blocks, which decode as never written, and the
// answer said OK. The primary's read repair took them (the answer's
// sender and epoch were not checked either) and wrote zeros, generation
// 0, over the block it was repairing: an acknowledged write was gone, and
// the primary served zeros. Now a retired replica's extent is wiped only
// once none of its reads is in progress; a Pull answers data only if the
// replica still serves in the epoch asked when its read completes; and an
// answer counts only from the node the Pull went to while it is still the
// peer.
func TestRetiredReplicaLateReadAnswersPull(t *testing.T) {
	h := newHarness(t, 3, testDisk, func(h *harness) { h.scrubRate = -1 })
	rec := h.create(512)
	id := rec.ID
	a, b := h.nodes[rec.Segs[0].Node], h.nodes[rec.Segs[1].Node] // a primary, b secondary
	var tg *hnode
	for _, n := range h.sorted() {
		if n != a && n != b {
			tg = n
		}
	}
	h.mustWrite(a.id, id, 10, pattern(1, 1)) // D1 on both
	baseA, baseB := rec.Segs[0].Offset, rec.Segs[1].Offset

	// b's segment moves to tg; the last decree (b's extent retiring) is
	// held once everything is copied.
	h.holdPropose = func(n *hnode, x Propose) bool { return strings.Contains(x.What, "moved from") }
	h.rmStartMove(id, 1, tg.id)
	if !h.tickUntil(30*time.Second, func() bool { return len(h.heldDecrees) == 1 }) {
		t.Fatalf("setup: the move did not reach its switch: %+v", h.rec(id))
	}
	h.holdPropose = nil

	// Block 10 rots at a; a read there repairs it from b, whose read of
	// the block for the Pull hangs.
	a.devs[rec.Segs[0].Disk].FlipBit(baseA+blockOff(10)+HeaderSize+100, 3)
	h.holdRead = func(n *hnode, x DiskRead) bool {
		return n == b && x.Run != nil && x.Off == baseB+blockOff(10) && x.Run.N == 1
	}
	q := h.read(a.id, id, 10, 1)
	h.run()
	h.holdRead = nil
	if len(h.held) != 1 {
		t.Fatalf("setup: b's read for the repair's Pull not held (%d held, reply %+v)", len(h.held), h.replies[q])
	}

	// The switch commits: b retires. Time passes for its extent's wipe.
	held := h.heldDecrees[0]
	h.heldDecrees = nil
	err := h.commit(held)
	if err != nil {
		t.Fatalf("the held decree no longer commits: %v (record %+v)", err, h.rec(id))
	}
	h.exec(a, a.e.Decided(h.env(a), held.ID, err))
	h.run()
	if r := h.rec(id); r.Segs[1].Node != tg.id {
		t.Fatalf("setup: record %+v, want segment 1 on node %d", r, tg.id)
	}
	h.tick(200 * time.Millisecond) // fewer than RetryEvery: a has not asked tg yet
	wipedEarly := bytes.Equal(b.devs[rec.Segs[1].Disk].Platter(baseB+blockOff(10), PhysBlockSize), make([]byte, PhysBlockSize))

	// b's read completes (it reads the disk as it is now).
	h.release(0)
	h.tick(5 * time.Second)
	rp, ok := h.replies[q]
	if !ok || rp.Err != nil {
		t.Fatalf("read at a: %+v (replied %v)", rp.Err, ok)
	}
	if !bytes.Equal(rp.Data, pattern(1, 1)) {
		t.Fatalf("block 10 at node %d reads %#x..., not the acknowledged D1's %#x... (b's extent wiped while its read was in flight: %v): "+
			"a retired replica's late read answered the repair's Pull", a.id, rp.Data[0], pattern(1, 1)[0], wipedEarly)
	}
	if wipedEarly {
		t.Errorf("node %d began wiping its retired extent while a read of it was in progress", b.id)
	}
	if !h.tickUntil(30*time.Second, func() bool { return len(h.rec(id).Retiring) == 0 }) {
		t.Errorf("b's retired extent not freed once its read completed: %+v", h.rec(id))
	}
	h.sameCopies(id)
}

// TestFailedLifeScrubTakesNothingAfterReload (review 38, a lesser
// finding): a scrub's read of the failed life, completing after the
// failure, went on to take the peer's newer blocks (pullNewer), counting
// itself in peerChanges; its Pull, sent in the failed life, was dropped
// with the failed life's pulls at the reload, never answered: peerChanges
// stayed above zero, so that this replica, primary again, could never
// switch a move (moveCopied). Now a scrub of a replica no longer ready
// takes nothing from the peer, and a reload answers what the failed life
// still awaits before anything else, or waits.
func TestFailedLifeScrubTakesNothingAfterReload(t *testing.T) {
	h := newHarness(t, 2, testDisk)
	rec := h.create(512)
	id := rec.ID
	a, b := h.nodes[rec.Segs[0].Node], h.nodes[rec.Segs[1].Node] // a primary, b secondary
	baseA := rec.Segs[0].Offset
	old := h.r2Phys(a.id, id, 10)
	h.mustWrite(a.id, id, 10, pattern(1, 1))
	h.r2LoseWrite(a.id, id, 10, old) // a's copy of block 10 is older than b's

	// a's scrub reads the chunk with block 10 (step one), learns b's
	// generations, and reads it again (step two): that read hangs.
	reads := 0
	h.holdRead = func(n *hnode, x DiskRead) bool {
		if n == a && x.Run != nil && x.Run.First <= 10 && 10 < x.Run.First+x.Run.N {
			reads++
			return reads == 2
		}
		return false
	}
	if !h.tickUntil(30*time.Second, func() bool { return len(h.held) == 1 }) {
		t.Fatalf("setup: a's scrub did not reach block 10's second read (%d reads)", reads)
	}
	h.holdRead = nil

	// a's disk fails on a write; it leaves the RLDev (b degraded, primary).
	h.failWrite = func(n *hnode, x DiskWrite) bool { return n == a && x.Encode != nil && x.Off == baseA+blockOff(100) }
	h.writeBy(a, id, 100, pattern(9, 1))
	h.failWrite = nil
	ra := a.e.reps[id]
	if !h.tickUntil(3*time.Second, func() bool { r := h.rec(id); return ra.state == repFailed && r.Stale[0] && r.State == Degraded }) {
		t.Fatalf("setup: record %+v (a %v), want a failed and stale", h.rec(id), ra.state)
	}
	// Cut from b, a's scrub read completes in the failed life.
	h.partition(a.id, b.id)
	h.release(0)
	if !h.tickUntil(10*time.Second, func() bool { return ra.state != repFailed }) {
		t.Fatalf("a not loaded again: %v", ra.state)
	}
	if ra.peerChanges != 0 {
		t.Errorf("after the reload a counts %d ranges being taken from the peer, left by its failed life: a move with a primary here would never switch", ra.peerChanges)
	}
	h.heal(a.id, b.id)
	if !h.tickUntil(30*time.Second, func() bool { r := h.rec(id); return r.State == Normal && !r.Stale[0] && !r.Stale[1] }) {
		t.Fatalf("not resynced: %+v (a %v)", h.rec(id), ra.state)
	}
	h.run()
	h.mustRead(a.id, id, 10, pattern(1, 1))
	h.sameCopies(id)
}
