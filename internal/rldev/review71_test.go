package rldev

import (
	"bytes"
	"errors"
	"testing"
	"time"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/disk"
)

// Review 71: continuations and clocks that outlive what they belong to.

// r71Pair makes a 1024-block RLDev on two nodes and returns its primary
// and secondary nodes.
func r71Pair(t *testing.T, opts ...func(*harness)) (*harness, uint64, *hnode, *hnode) {
	h := newHarness(t, 2, testDisk, opts...)
	r := h.create(1024)
	return h, r.ID, h.nodes[r.Segs[r.Primary].Node], h.nodes[r.Segs[1-r.Primary].Node]
}

// The primary's "resync" decree is in flight when the stale replica's
// node goes down again (its session breaks: peerDown, but no resync runs
// yet to stop). The decree commits; startResync then starts a resync to
// a node that is down. Nothing stops it: peerDown has passed, copyStall
// counts only refusals, and want's dead-peer rule is for the normal
// state alone. The RLDev stays resyncing, and every write waits for the
// (down) peer's acknowledgement (needPeer in the resyncing state): the
// RLDev takes no write until that node returns, for ever if it never
// does.
//
// Schedule: b crashes, is declared dead, a degrades; b restarts and asks
// to be resynced; a proposes "resync" (held); b crashes again (declared
// dead too); the decree commits; a write is sent through a.
func TestReview71ResyncStartedToPeerAlreadyDown(t *testing.T) {
	h, id, a, b := r71Pair(t)
	h.mustWrite(a.id, id, 10, pattern(1, 1))
	held := h.heldResync(id, a, b)

	h.crash(b, false, nil)
	h.dead[Subject{b.id, b.inc}] = true
	h.run()
	if err := h.commit(held); err != nil {
		t.Fatalf("setup: the held resync decree: %v", err)
	}
	h.exec(a, a.e.Decided(h.env(a), held.ID, nil))
	h.run()
	t.Logf("state after the resync decree and its answer: %v (degraded again at once since the fix)", h.rec(id).State)
	q := h.write(a.id, id, 20, pattern(2, 1), nil)
	h.run()
	h.tickUntil(30*time.Second, func() bool { _, ok := h.replies[q]; return ok && h.rec(id).State != Resyncing })
	rp, ok := h.replies[q]
	t.Logf("30 s later: record %+v; write answered %v (%v)", h.rec(id), ok, rp.Err)
	if !ok || h.rec(id).State == Resyncing {
		t.Fatalf("DEFECT: a resync started toward a node already down never stops: state %v 30 s on, a write through the primary answered %v",
			h.rec(id).State, ok)
	}
	if rp.Err != nil {
		t.Fatalf("the write: %v", rp.Err)
	}
	h.mustRead(a.id, id, 20, pattern(2, 1))
}

// A primary back from a crash pulls its dirty regions from the secondary
// (startRecovery); a region's pulled data is being written when the
// secondary fails and is made stale. abandonRecovery then ends the
// region's recovery as soon as its degraded-mode mark is durable and
// releases its range, though the recovery's own disk write of the
// pulled data is still in flight. A client write of the range, ordered
// after the release, lands and is acknowledged; the recovery's write,
// issued earlier, lands after it (the disk runs writes in any order: the
// reason writeOp keeps its range while its own write is in flight,
// `held`) and puts the secondary's older copy back: the acknowledged
// write is lost, and the only up-to-date replica serves the old data.
//
// Schedule: block 0 written (its dirty region marked); the primary a
// crashes and restarts, not declared dead; its recovery pulls region 0
// from b and writes it (held in a's disk queue); b's disk fails on a
// forward of another region, b asks to be made stale; a abandons the
// recovery (deg mark durable: range released); W2 writes block 0
// (acknowledged); the held recovery write lands; block 0 is read.
func TestReview71AbandonedRecoveryWriteLandsAfterNewWrite(t *testing.T) {
	h, id, a, b := r71Pair(t, func(h *harness) { h.scrubRate = -1 })
	h.mustWrite(a.id, id, 0, pattern(1, 1))
	h.crash(a, false, nil)
	h.run()
	aBase := h.rec(id).Segs[h.rec(id).SegmentOf(a.id)].Offset
	held := false
	h.holdWrite = func(n *hnode, x DiskWrite) bool {
		if !held && n == a && x.Off == aBase+blockOff(0) && len(x.Data) >= PhysBlockSize {
			held = true
			return true
		}
		return false
	}
	h.start(a)
	h.run()
	h.joined(id)
	if !h.tickUntil(3*time.Second, func() bool { return held }) {
		t.Fatalf("setup: no recovery write of region 0 (recovering %d)", a.e.reps[id].recovering())
	}
	h.holdWrite = nil
	ra := a.e.reps[id]
	if ra.recovering() == 0 {
		t.Fatal("setup: not recovering")
	}
	// b's disk fails on a forward of block 300 (another dirty region).
	h.failWrite = func(n *hnode, x DiskWrite) bool { return n == b && x.Encode != nil }
	q1 := h.write(a.id, id, 300, pattern(3, 1), nil)
	h.run()
	h.failWrite = nil
	if !h.tickUntil(5*time.Second, func() bool { _, ok := h.replies[q1]; return ok && h.rec(id).Stale[1-ra.seg] }) {
		t.Fatalf("setup: b not made stale, or W1 unanswered: %+v", h.rec(id))
	}
	// W2 of block 0: answered at once before the fix (the abandoned
	// region's range was released with its write in flight); now it
	// waits for that write to land.
	q2 := h.write(a.id, id, 0, pattern(2, 1), nil)
	h.run()
	_, early := h.replies[q2]
	h.release(0) // the recovery's write of region 0 lands
	h.run()
	if rp, ok := h.replies[q2]; !ok || rp.Err != nil {
		t.Fatalf("W2 of block 0 answered %v: %v", ok, rp.Err)
	}
	t.Logf("W2 answered before the recovery's write landed: %v; recovering now %d", early, ra.recovering())
	rp := h.rvRead(a.id, id, 0, 1)
	t.Logf("read of block 0 at the only up-to-date replica: %x... (%v)", rp.Data[:2], rp.Err)
	if rp.Err != nil || !bytes.Equal(rp.Data, pattern(2, 1)) {
		t.Fatalf("DEFECT: an acknowledged write of block 0 was undone by the abandoned recovery's write landing after it (read %x..., %v)", rp.Data[:min(2, len(rp.Data))], rp.Err)
	}
}

// The primary's "resync" decree, and the resync it starts when it
// commits, are planned from the stale replica's ResyncMe (resyncReq),
// whichever incarnation sent it. Here the incarnation that asked crashes
// while the decree is in flight, and its node comes back with its disk
// replaced (a blank segment: its next ResyncMe would say Blank, and need
// a full copy). The decree commits before the new incarnation asks: the
// resync copies what the old one lacked (here nothing), the primary
// decrees "resynced", and the new incarnation, once named, serves its
// blank segment as up to date: a block written long before reads as
// zeros there (and it is the only copy if the primary is lost next).
//
// Schedule: block 10 written; b crashes, is declared dead, a degrades;
// b restarts and asks to be resynced (not blank); a's "resync" decree is
// held; b crashes again, its disk is replaced, b starts (loads a blank
// segment, stale in the table; its naming decree held); a's decree
// commits; then b is named; block 10 is read at b.
func TestReview71ResyncPlannedFromPreviousIncarnation(t *testing.T) {
	h, id, a, b := r71Pair(t)
	h.mustWrite(a.id, id, 10, pattern(1, 1))
	h.tick(3 * time.Second) // its dirty region cleared: both replicas hold it
	held := h.heldResync(id, a, b)

	h.crash(b, false, nil)
	b.devs[0] = disk.NewMemDevice(testDisk, nil) // the disk replaced
	h.run()
	h.holdPropose = func(n *hnode, x Propose) bool { return n == b }
	h.start(b)
	h.run()
	if len(h.heldDecrees) == 0 {
		t.Fatal("setup: b's new incarnation asked for nothing")
	}
	bHeld := h.heldDecrees
	h.heldDecrees, h.holdPropose = nil, nil
	if err := h.commit(held); err != nil {
		t.Fatalf("setup: the held resync decree: %v", err)
	}
	h.exec(a, a.e.Decided(h.env(a), held.ID, nil))
	h.run()
	for _, x := range bHeld {
		h.exec(b, b.e.Decided(h.env(b), x.ID, errors.New("stale version")))
	}
	h.run()
	if !h.tickUntil(30*time.Second, func() bool {
		r := h.rec(id)
		rb := b.e.reps[id]
		return r.State == Normal && rb != nil && rb.ready() && r.Inc[rb.seg] == b.inc
	}) {
		t.Logf("record 30 s on: %+v", h.rec(id))
		return // not served as up to date: nothing lost
	}
	rp := h.rvRead(b.id, id, 10, 1)
	t.Logf("record %+v; read of block 10 at b: %x... (%v)", h.rec(id), rp.Data[:min(2, len(rp.Data))], rp.Err)
	if rp.Err == nil && !bytes.Equal(rp.Data, pattern(1, 1)) {
		t.Fatalf("DEFECT: b's new incarnation, its disk blank, was declared resynced from its previous incarnation's request and serves block 10 as %x... (written %x...)", rp.Data[:2], pattern(1, 1)[:2])
	}
}

// The primary's stall clock for a move's target (tgtDown) is read and
// reset only when decide runs, and decide does not run while a decree
// of this engine is in flight. A target that was unreachable, then
// reachable again for longer than moveStall while a decree was out (a
// slow config service), keeps the first loss's clock: at its next loss
// the primary parks it at once, and the move's copy starts over from
// block 0 after the target is named again.
//
// Schedule: a move of segment 1 to node 3 copying (slowly: CopyRate);
// the primary p loses the target (clock starts); 1 s on, a decree of p
// is held (its disk record rewritten by someone, it registers it
// again); the target is back at once, and for 6 s; it is lost again;
// p's decree is answered: p parks the target at once.
func TestReview71TargetStallClockSpansUnseenReconnect(t *testing.T) {
	h := newHarness(t, 3, testDisk, func(h *harness) { h.copyRate = 64 * BlockSize; h.scrubRate = -1 })
	r := h.create(1024)
	p, tg := r.Segs[r.Primary].Node, NodeID(3)
	if r.Segs[0].Node == tg || r.Segs[1].Node == tg {
		t.Fatalf("setup: node %d holds a segment", tg)
	}
	h.rmStartMove(r.ID, 1-r.Primary, tg)
	if !h.tickUntil(5*time.Second, h.rmCopied(p, r.ID, 64)) {
		t.Fatal("setup: no copy")
	}
	h.partition(p, tg)
	h.tick(time.Second)
	if m := h.rec(r.ID).Move; m == nil || m.Inc == 0 {
		t.Fatalf("setup: parked after 1 s: %+v", m)
	}
	// p's next decree is held: its disk record changed under it.
	pn := h.nodes[p]
	h.holdPropose = func(n *hnode, x Propose) bool { return n == pn }
	tb := h.table()
	d := *tb.Disks[DiskKey{p, 0}]
	d.Path = "elsewhere"
	if err := h.propose(&pb.Decree{Namespace: Namespace, ExpectedVersion: tb.Version, Ops: []*pb.Op{PutDiskOp(&d)}}); err != nil {
		t.Fatal(err)
	}
	h.run()
	if len(h.heldDecrees) != 1 {
		t.Fatalf("setup: %d decrees of p held", len(h.heldDecrees))
	}
	x := h.heldDecrees[0]
	h.heldDecrees, h.holdPropose = nil, nil
	h.heal(p, tg)
	h.tick(6 * time.Second) // reachable for longer than moveStall
	before := h.rec(r.ID).Move
	h.partition(p, tg)
	h.run()
	if pr := pn.e.reps[r.ID]; !pr.tgtDown.IsZero() {
		t.Logf("p's stall clock for the target, as the decree is answered: started %v ago", h.now.Sub(pr.tgtDown))
	}
	if err := h.commit(x); err != nil {
		t.Fatalf("setup: p's decree: %v", err)
	}
	h.exec(pn, pn.e.Decided(h.env(pn), x.ID, nil))
	h.run()
	h.tick(time.Second)
	m := h.rec(r.ID).Move
	t.Logf("move before the second loss %+v, 1 s after it %+v", before, m)
	if before == nil || before.Inc == 0 {
		t.Fatalf("setup: the move was parked while the target was reachable: %+v", before)
	}
	if m == nil || m.Inc == 0 {
		t.Fatalf("DEFECT: the target, unreachable for 1 s after 6 s reachable, was parked at once (the stall clock of its first loss carried over): %+v", m)
	}
}
