package rldev

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
)

// Review 39: scripted interleavings against replica.retry's reload rule
// (commits 59820f0, 77ce6c6) and the retired-replica guards (b7f4bfc).

// TestReview39ReloadDropsFailedLifePullMoveStuck: a continuation of the
// failed life that the reload drops without running. pullNewer (scrub.go)
// counts peerChanges from its start until its Pull is answered and its
// data landed; moveCopied requires peerChanges == 0. A scrub chunk whose
// disk read (scrubGens' read of its own generations) is in flight when the
// replica fails completes in the failed life and starts pullNewer there
// (scrubGens checks nothing of the replica's state): peerChanges 1, its
// Pull registered in r.pulls. If that Pull is lost (the session to the
// peer broke; a peer answering "not serving" or "wrong epoch" has it
// re-queued the same way), nothing sends it again: retry resends only for
// a ready replica. The reload (replica.retry: not busy, no decree, the
// table seen) then empties r.pulls without answering them, and does not
// reset peerChanges: it stays 1 for the replica's whole life, and once the
// replica is the primary again no move of the RLDev ever switches. Fails
// at b7f4bfc; passes since 4936d7a (a regression test: the move's
// end-to-end effect, beside TestFailedLifeScrubTakesNothingAfterReload).
func TestReview39ReloadDropsFailedLifePullMoveStuck(t *testing.T) {
	h := newHarness(t, 3, testDisk, func(h *harness) { h.scrubRate = -1 })
	rec := h.create(1024)
	id := rec.ID
	a, b := h.nodes[rec.Segs[0].Node], h.nodes[rec.Segs[1].Node] // a primary, b secondary
	var c *hnode
	for _, n := range h.sorted() {
		if n != a && n != b {
			c = n
		}
	}
	baseA := rec.Segs[0].Offset
	const X = 5

	// a's copy of block X silently lost the newer write (b holds D2): what
	// the scrubber's second step is for.
	h.mustWrite(a.id, id, X, pattern(1, 1))
	old := h.r2Phys(a.id, id, X)
	h.mustWrite(a.id, id, X, pattern(2, 1))
	h.r2LoseWrite(a.id, id, X, old)

	// a scrubs blocks [0, 64) (the scrubber's chunk, started by hand): its
	// read of them for step two (after b's generations came) hangs.
	ra := a.e.reps[id]
	chunkReads := 0
	h.holdRead = func(n *hnode, x DiskRead) bool {
		if n == a && x.Run != nil && x.Off == baseA+blockOff(0) && x.Run.N == 64 {
			chunkReads++
			return chunkReads == 2
		}
		return false
	}
	h.exec(a, ra.scrubChunk(0, 64))
	h.run()
	h.holdRead = nil
	if len(h.held) != 1 || !ra.scrub.busy {
		t.Fatalf("setup: scrubGens' read not held (%d held)", len(h.held))
	}

	// a's disk fails on another write: a leaves (b primary, a stale).
	h.failWrite = func(n *hnode, x DiskWrite) bool { return n == a && x.Encode != nil && x.Off == baseA+blockOff(100) }
	h.writeBy(a, id, 100, pattern(9, 1))
	h.failWrite = nil
	if ra.state != repFailed {
		t.Fatalf("setup: a's replica %v, want failed", ra.state)
	}

	// The session a-b breaks; the hung read completes: pullNewer starts in
	// the failed life, its Pull waits for the peer. The session heals.
	h.partition(a.id, b.id)
	h.release(0)
	// (b7f4bfc: pullNewer starts here, peerChanges 1, its Pull waiting;
	// a scrub of a failed replica that takes nothing is a fix.)
	t.Logf("the failed life's scrub read completed: peerChanges %d, pulls %d", ra.peerChanges, len(ra.pulls))
	h.heal(a.id, b.id)

	// a loads again ReloadEvery later and is resynced (b primary).
	if !h.tickUntil(30*time.Second, func() bool {
		r := h.rec(id)
		return r.State == Normal && !r.Stale[0] && !r.Stale[1] && ra.ready()
	}) {
		t.Fatalf("setup: a not back: record %+v, a %v", h.rec(id), ra.state)
	}
	t.Logf("a reloaded and resynced: peerChanges %d, pulls %d (no pullNewer of this life is in progress)", ra.peerChanges, len(ra.pulls))

	// b dies: a primary (degraded); b's next incarnation is resynced.
	h.dead[Subject{b.id, b.inc}] = true
	h.crash(b, false, nil)
	if !h.tickUntil(10*time.Second, func() bool { r := h.rec(id); return r.State == Degraded && r.Primary == 0 }) {
		t.Fatalf("setup: not degraded with a primary: %+v", h.rec(id))
	}
	h.start(b)
	if !h.tickUntil(30*time.Second, func() bool {
		r := h.rec(id)
		return r.State == Normal && r.Primary == 0 && !r.Stale[1]
	}) {
		t.Fatalf("setup: not normal with a primary: %+v", h.rec(id))
	}
	if a.e.reps[id] != ra {
		t.Fatal("setup: a's replica object changed")
	}

	// A move of b's segment to c: a copies it all, then should switch.
	h.rmStartMove(id, 1, c.id)
	if !h.tickUntil(60*time.Second, func() bool { return h.rec(id).Move == nil }) {
		r := h.rec(id)
		copied := ra.mv != nil && ra.mv.done()
		t.Fatalf("the move never switches (60 s): move %+v, copy done %v, moveCopied %v, peerChanges %d: "+
			"a pullNewer of the failed life, its Pull dropped by the reload, never ended", r.Move, copied, ra.moveCopied(), ra.peerChanges)
	}
	h.sameCopies(id)
}

// TestReview39DroppedTargetLateWriteOverNewReplica: a move's target that
// is not ready (joining: the move was parked and it asks to be named
// again) when the moving segment fails is not promoted (hostSegment
// promotes a ready target only): the engine makes a new replica of the
// segment at the very same extent, and retires the old target object,
// whose Copy write to that extent is still in flight. Engine.inUse keeps
// the extent from being wiped meanwhile, but nothing keeps the new
// replica from using it: it loads, is resynced (a full copy), serves;
// then the old target's write lands over what the resync and the writes
// since put there. The replicas differ in the normal state, and the new
// secondary serves the block's old content in place of an acknowledged
// write. Now a new replica waits until no retired replica's I/O on its
// extent is in progress (Engine.extentBusy).
func TestReview39DroppedTargetLateWriteOverNewReplica(t *testing.T) {
	h := newHarness(t, 3, testDisk, func(h *harness) { h.scrubRate = -1 })
	rec := h.create(1024)
	id := rec.ID
	a, b := h.nodes[rec.Segs[0].Node], h.nodes[rec.Segs[1].Node] // a primary, b secondary
	var c *hnode
	for _, n := range h.sorted() {
		if n != a && n != b {
			c = n
		}
	}
	const X = 5
	h.mustWrite(a.id, id, X, pattern(1, 1)) // D1 on both

	// b's segment moves to c; c's write of the copy's first chunk (with
	// block X, D1) hangs.
	h.rmStartMove(id, 1, c.id)
	to := h.rec(id).Move.To
	h.holdWrite = func(n *hnode, x DiskWrite) bool {
		return n == c && x.Encode != nil && x.Off == to.Offset+blockOff(0)
	}
	if !h.tickUntil(10*time.Second, func() bool { return len(h.held) == 1 }) {
		t.Fatalf("setup: c's copy write not held: %+v", h.rec(id))
	}
	h.holdWrite = nil
	// c's request to be named again, once the primary parks the move (the
	// chunk unacknowledged for moveStall), is slow to commit.
	h.holdPropose = func(n *hnode, x Propose) bool { return n == c && strings.Contains(x.What, "receiving") }
	if !h.tickUntil(15*time.Second, func() bool { return len(h.heldDecrees) == 1 }) {
		t.Fatalf("setup: the move not parked / c not asking again: %+v", h.rec(id))
	}
	h.holdPropose = nil
	tg := c.e.tgts[id]
	if tg == nil || tg.ready() || tg.pending == 0 {
		t.Fatalf("setup: c's target %+v, want joining with its write in flight", tg)
	}

	// b's disk fails: b leaves, c's extent takes its place (stale, a full
	// copy due). c's slow decree then fails (the table moved on).
	h.failWrite = func(n *hnode, x DiskWrite) bool {
		return n == b && x.Encode != nil && x.Off == rec.Segs[1].Offset+blockOff(100)
	}
	h.writeBy(a, id, 100, pattern(9, 1))
	h.failWrite = nil
	if !h.tickUntil(3*time.Second, func() bool { r := h.rec(id); return r.Segs[1] == to && r.Move == nil }) {
		t.Fatalf("setup: c's extent not in segment 1's place: %+v", h.rec(id))
	}
	held := h.heldDecrees[0]
	h.heldDecrees = nil
	err := h.commit(held)
	if err == nil {
		t.Fatalf("setup: c's held decree committed")
	}
	h.exec(c, c.e.Decided(h.env(c), held.ID, err))
	h.run()
	// While the old target's write is in flight, c must not serve the
	// segment from that extent (before the fix a new replica loaded
	// there at once and was resynced).
	ready := func() bool {
		r2 := c.e.reps[id]
		r := h.rec(id)
		return r.State == Normal && !r.Stale[1] && r2 != nil && r2.ready()
	}
	if h.tickUntil(10*time.Second, ready) {
		// The defect: W then the old write landing over it.
		h.mustWrite(a.id, id, X, pattern(2, 1))
		h.release(0)
		h.tick(time.Second)
		rp := h.rvRead(c.id, id, X, 1)
		t.Errorf("node %d served the segment from an extent a retired target still had a write in flight to; block %d then reads %#x... (W's is %#x...: %v)",
			c.id, X, rp.Data[0], pattern(2, 1)[0], rp.Err)
		h.sameCopies(id)
		return
	}
	if tg.state != repRetired {
		t.Fatalf("the old target %v, want retired", tg.state)
	}
	// The wait is visible (grove rldev list shows Wait).
	if st := statusOf(c.e, id, false); st.State != "waiting" || st.Wait == "" || st.Segment != 1 {
		t.Errorf("node %d's status of the segment waiting for its extent: %+v, want waiting with a Wait", c.id, st)
	}
	// The old write lands; then c hosts the segment, is resynced, and W
	// writes block X (D2).
	h.release(0)
	if !h.tickUntil(30*time.Second, ready) {
		t.Fatalf("not resynced once the old target's write ended: %+v (c: %v)", h.rec(id), c.e.reps[id])
	}
	if st := statusOf(c.e, id, false); st.State != "ready" || st.Wait != "" {
		t.Errorf("node %d's status of the segment once hosted: %+v, want ready with no Wait", c.id, st)
	}
	h.mustWrite(a.id, id, X, pattern(2, 1))
	h.tick(time.Second)
	rp := h.rvRead(c.id, id, X, 1)
	if rp.Err != nil || !bytes.Equal(rp.Data, pattern(2, 1)) {
		t.Errorf("block %d read at node %d: %#x... (%v), want W's %#x...", X, c.id, rp.Data[0], rp.Err, pattern(2, 1)[0])
	}
	h.sameCopies(id)
}

// TestReview39LostDecreeKeepsFailedReplicaDown: awaitTable (77ce6c6) is
// cleared only by a table newer than the last decided decree's base
// version. A decree answered failed (the config service's call timed out)
// that never commits (the proposal was lost) leaves the namespace at that
// version; if nothing else is wanted afterwards, no decree of this engine
// moves it, and in a quiet cluster no one else's does: a failed replica
// then never loads again. Here the primary of a degraded RLDev (the only
// up-to-date copy) proposes "resync" for its returning peer; its disk
// fails meanwhile (the proposal, no longer wanted, is never proposed
// again) and the proposal times out, lost. The RLDev stays unavailable
// for good although the disk error was transient. Now the engine settles
// a decree answered failed that a linearizable table does not show: a
// decree conditional on the same version, changing nothing (unsettled).
func TestReview39LostDecreeKeepsFailedReplicaDown(t *testing.T) {
	h := newHarness(t, 2, testDisk, func(h *harness) { h.scrubRate = -1 })
	rec := h.create(512)
	id := rec.ID
	a, b := h.nodes[rec.Segs[0].Node], h.nodes[rec.Segs[1].Node] // a primary, b secondary
	baseA := rec.Segs[0].Offset
	h.mustWrite(a.id, id, 10, pattern(1, 1))

	// b dies; a serves alone; b's next incarnation asks to be resynced,
	// and a's "resync" decree is held by a slow config service.
	held := h.heldResync(id, a, b)

	// a's disk fails on a write (transiently).
	h.failWrite = func(n *hnode, x DiskWrite) bool { return n == a && x.Encode != nil && x.Off == baseA+blockOff(100) }
	h.writeBy(a, id, 100, pattern(9, 1))
	h.failWrite = nil
	ra := a.e.reps[id]
	if ra.state != repFailed {
		t.Fatalf("setup: a's replica %v, want failed", ra.state)
	}
	// The held proposal times out at a; it never commits.
	h.exec(a, a.e.Decided(h.env(a), held.ID, errors.New("context deadline exceeded")))
	h.run()

	if !h.tickUntil(60*time.Second, func() bool { return ra.ready() }) {
		t.Errorf("a's replica still %v after 60 s (awaitTable %v, decreeOut %v, table version %d = the lost decree's base %d): "+
			"the only up-to-date copy never loads again", ra.state, a.e.awaitTable, a.e.decreeOut, a.e.table.Version, held.Version)
	}
	rp := h.rvRead(a.id, id, 10, 1)
	if rp.Err != nil || !bytes.Equal(rp.Data, pattern(1, 1)) {
		t.Errorf("read of block 10 at node %d: %v", a.id, rp.Err)
	}
	if err := h.commit(held); err == nil {
		t.Errorf("the lost decree still commits after the engine settled it: record %+v", h.rec(id))
	}
}
