package rldev

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/disk"
)

// Review 74: the fixes of review 71, tried again.

// r74OneWayRequest restarts b with a's session to it down and b's to a
// up (a restarted node dials at once, the survivor with backoff), and
// waits for b's request to be resynced to reach a's replica.
func r74OneWayRequest(t *testing.T, h *harness, id uint64, a, b *hnode) *replica {
	t.Helper()
	h.start(b)
	h.exec(a, a.e.PeerDown(h.env(a), b.id))
	h.run()
	ra := a.e.reps[id]
	if !h.tickUntil(10*time.Second, func() bool { return ra.resyncReq != nil }) {
		t.Fatalf("setup: b's request not at a: %+v", h.rec(id))
	}
	return ra
}

// r74SilentDiskLoss crashes b without telling anyone (no PeerDown: the
// sessions to it were down) and replaces its disk.
func r74SilentDiskLoss(b *hnode) {
	b.up = false
	b.devs[0].Crash(nil, false)
	b.devs[0] = disk.NewMemDevice(testDisk, nil)
}

// peerDown drops a stale peer's resync request, so that a "resync"
// decree planned from a past incarnation's request starts nothing. But a
// request is kept whenever no PeerDown follows it: the primary's own
// session to the stale node need not be up when the stale node asks (the
// stale node's session to the primary comes up first after its restart;
// the primary redials with backoff; a break in one direction). Then the
// stale incarnation crashes, no PeerDown arrives (the primary's session
// to it was never up), its disk is replaced, and the next incarnation's
// session comes up: the primary proposes "resync" from the past
// incarnation's request (not blank), copies what that one lacked
// (nothing), and declares the blank segment resynced.
//
// Schedule: block 10 written and settled; b crashes, is declared dead, a
// degrades; b restarts (inc 2), but a's session to b breaks at once (b's
// to a stays up); b is named and asks to be resynced (not blank); b
// crashes again (no PeerDown at a: its session to b was down already),
// its disk replaced; b starts (inc 3), both sessions up, its own decrees
// (disk registration, naming) slow: a's "resync" commits first, planned
// from inc 2's request, then "resynced"; b is named; block 10 is read at
// b once the RLDev is normal. (The same holds when inc 2's ResyncMe is
// delivered after a's PeerDown for it: its link to a is another
// connection, drained in its own goroutine. The request carries neither
// the asker's incarnation nor is checked against the record's epoch or
// Inc: binding it, or the resync, to rec.Inc[peer] would close both.)
func TestReview74ResyncFromPastIncarnationWithoutPeerDown(t *testing.T) {
	h, id, a, b := r71Pair(t)
	h.mustWrite(a.id, id, 10, pattern(1, 1))
	h.tick(3 * time.Second)
	h.dead[Subject{b.id, b.inc}] = true
	h.crash(b, false, nil)
	if !h.tickUntil(10*time.Second, func() bool { r := h.rec(id); return r.State == Degraded }) {
		t.Fatalf("setup: not degraded: %+v", h.rec(id))
	}
	r74OneWayRequest(t, h, id, a, b)
	if h.rec(id).State != Degraded {
		t.Fatalf("setup: %+v", h.rec(id))
	}
	// b crashes; a hears nothing of it (its session to b was down).
	r74SilentDiskLoss(b)
	// b's own decrees (its new disk, its naming) are slow; a's are not.
	var what []string
	h.holdPropose = func(n *hnode, x Propose) bool {
		what = append(what, fmt.Sprintf("%d: %s", n.id, x.What))
		return n == b
	}
	h.start(b)
	h.run()
	h.tick(time.Second)
	bHeld := h.heldDecrees
	h.heldDecrees, h.holdPropose = nil, func(n *hnode, x Propose) bool { what = append(what, fmt.Sprintf("%d: %s", n.id, x.What)); return false }
	for _, x := range bHeld {
		h.exec(b, b.e.Decided(h.env(b), x.ID, errors.New("stale version")))
	}
	h.run()
	ok := h.tickUntil(30*time.Second, func() bool {
		r := h.rec(id)
		rb := b.e.reps[id]
		return r.State == Normal && rb != nil && rb.ready() && r.Inc[rb.seg] == b.inc
	})
	if !ok {
		t.Logf("record 30 s on: %+v", h.rec(id))
		return
	}
	rp := h.rvRead(b.id, id, 10, 1)
	t.Logf("decrees since b's last start: %q", what)
	t.Logf("record %+v; read of block 10 at b: %x... (%v)", h.rec(id), rp.Data[:min(2, len(rp.Data))], rp.Err)
	if rp.Err == nil && !bytes.Equal(rp.Data, pattern(1, 1)) {
		t.Fatalf("DEFECT: b's blank incarnation was declared resynced from its past incarnation's request and serves block 10 as %x... (written %x...)", rp.Data[:2], pattern(1, 1)[:2])
	}
}

// The same past-incarnation resync, caught later: the resync planned
// from incarnation 2's request starts once incarnation 3's sessions are
// up (its own decrees slow), and is still copying (slow copies, regions
// written in degraded mode) when incarnation 3, its disk blank, is named
// (stale: its naming clears loadedStale). No PeerDown reached the
// primary, so nothing stopped the resync: it ended and declared
// incarnation 3, which had received only the degraded-mode regions,
// resynced. The resync is bound to the peer incarnation the table named
// when it started (resyncSrc.peerInc): a new one named stops it.
func TestResyncOfPastIncarnationStopsWhenNextIsNamed(t *testing.T) {
	h, id, a, b := r71Pair(t, func(h *harness) { h.copyRate = 256 << 10 })
	h.mustWrite(a.id, id, 10, pattern(1, 1))
	h.tick(3 * time.Second)
	h.dead[Subject{b.id, b.inc}] = true
	h.crash(b, false, nil)
	if !h.tickUntil(10*time.Second, func() bool { return h.rec(id).State == Degraded }) {
		t.Fatalf("setup: not degraded: %+v", h.rec(id))
	}
	for blk := uint64(100); blk < 1024; blk += 64 {
		h.mustWrite(a.id, id, blk, pattern(2, 1)) // degraded-mode regions: a resync of several chunks
	}
	ra := r74OneWayRequest(t, h, id, a, b)
	// b crashes (a hears nothing: its session to b was down), its disk
	// replaced; the next incarnation starts, its decrees slow, and a's
	// resync, planned from the request of the one before, starts (its copies land once the new one is named).
	r74SilentDiskLoss(b)
	h.holdPropose = func(n *hnode, x Propose) bool { return n == b }
	h.start(b)
	h.run()
	if !h.tickUntil(10*time.Second, func() bool { return ra.resync != nil && !ra.resync.failed }) {
		t.Fatalf("setup: no resync copying: %+v", h.rec(id))
	}
	bHeld := h.heldDecrees
	h.heldDecrees, h.holdPropose = nil, nil
	for _, x := range bHeld {
		h.exec(b, b.e.Decided(h.env(b), x.ID, errors.New("stale version")))
	}
	h.run()
	if !h.tickUntil(60*time.Second, func() bool {
		r := h.rec(id)
		rb := b.e.reps[id]
		return r.State == Normal && rb != nil && rb.ready() && r.Inc[rb.seg] == b.inc
	}) {
		t.Fatalf("not normal 60 s on: %+v", h.rec(id))
	}
	rp := h.rvRead(b.id, id, 10, 1)
	if rp.Err != nil || !bytes.Equal(rp.Data, pattern(1, 1)) {
		t.Fatalf("DEFECT: b's blank incarnation, named while a resync planned for the one before copied, serves block 10 as %x... (%v; written %x...)", rp.Data[:min(2, len(rp.Data))], rp.Err, pattern(1, 1)[:2])
	}
	h.sameCopies(id)
}
