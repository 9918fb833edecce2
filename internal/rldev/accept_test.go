package rldev

import (
	"errors"
	"strings"
	"testing"
	"time"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/disk"
)

// TestAcceptStale: the secondary b dies, the primary a takes a write
// alone (degraded), then a's disk is lost with its node while b is still
// down. b comes back stale: nothing serves. The operator accepts b's
// copy (Table.AcceptStale, by decree): b serves what it held (the write it
// missed is given up), takes writes alone, and a, back with a new disk,
// is copied whole from it; the copies end identical, with b's data.
func TestAcceptStale(t *testing.T) {
	h, id, a, b := r71Pair(t)
	h.mustWrite(a.id, id, 10, pattern(1, 1))
	h.mustWrite(a.id, id, 20, pattern(2, 1))

	h.crash(b, false, nil)
	h.dead[Subject{b.id, b.inc}] = true
	h.run()
	h.tickUntil(10*time.Second, func() bool { return h.rec(id).State == Degraded })
	h.mustWrite(a.id, id, 10, pattern(3, 1)) // b misses it

	// a's node dies with its disk; b comes back, stale, with no one to
	// resync it.
	h.crash(a, false, nil)
	h.dead[Subject{a.id, a.inc}] = true
	a.devs[0] = disk.NewMemDevice(testDisk, nil)
	h.start(b)
	h.run()
	h.tick(5 * time.Second)
	if rec := h.rec(id); !rec.Stale[rec.SegmentOf(uint64(b.id))] {
		t.Fatalf("setup: b's copy not stale: %+v", rec)
	}
	q := h.read(b.id, id, 10, 1)
	h.run()
	if r := h.replies[q]; r.Err == nil {
		t.Fatalf("a stale copy served a read before it was accepted: %q", r.Data[:8])
	}

	// Refusals: another epoch than checked, a normal RLDev.
	tb := h.table()
	if _, err := tb.AcceptStale(id, h.rec(id).Epoch-1); !errors.Is(err, ErrAccept) {
		t.Fatalf("an epoch other than the record's: %v", err)
	}
	if _, err := tb.AcceptStale(id+100, 0); !errors.Is(err, ErrUnknown) {
		t.Fatalf("an unknown RLDev: %v", err)
	}
	nr, err := tb.AcceptStale(id, h.rec(id).Epoch)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.propose(&pb.Decree{Namespace: Namespace, ExpectedVersion: tb.Version, Ops: []*pb.Op{nr.PutOp()}}); err != nil {
		t.Fatal(err)
	}
	h.run()
	h.tick(time.Second)
	h.mustRead(b.id, id, 10, pattern(1, 1)) // its own: the write it missed is given up
	h.mustRead(b.id, id, 20, pattern(2, 1))
	h.mustWrite(b.id, id, 30, pattern(4, 1))

	// a comes back with its new disk: copied whole from b.
	h.start(a)
	h.run()
	if !h.tickUntil(60*time.Second, func() bool { r := h.rec(id); return r.State == Normal && r.Inc[r.SegmentOf(uint64(a.id))] == a.inc }) {
		t.Fatalf("never normal again: %+v", h.rec(id))
	}
	h.tick(2 * time.Second)
	h.sameCopies(id)
	h.mustRead(a.id, id, 10, pattern(1, 1))
	h.mustRead(a.id, id, 30, pattern(4, 1))
}

// TestAcceptStaleRefused: a normal RLDev, and one with a move in progress.
func TestAcceptStaleRefused(t *testing.T) {
	h := newHarness(t, 3, testDisk)
	r := h.create(64)
	tb := h.table()
	if _, err := tb.AcceptStale(r.ID, r.Epoch); !errors.Is(err, ErrAccept) {
		t.Fatalf("a normal RLDev: %v", err)
	}
	rec := tb.RLDevs[r.ID].Clone()
	rec.State, rec.Stale[rec.Secondary()] = Degraded, true
	rec.Move = &Move{Seg: rec.Secondary(), To: Segment{Node: 3, Offset: 1 << 20}}
	tb.RLDevs[r.ID] = rec
	if _, err := tb.AcceptStale(r.ID, rec.Epoch); !errors.Is(err, ErrAccept) {
		t.Fatalf("a move in progress: %v", err)
	}
}

// TestAcceptStaleOverLostCopy: the primary's disk is replaced (its node
// back at once, its copy lost: it serves nothing) while the secondary is
// stale, so no decree can say either: the RLDev waits, and a's status
// says its copy is lost (what grove rldev list and accept-stale read).
// Accepting b's copy: b serves, and a's new disk is copied whole from it.
func TestAcceptStaleOverLostCopy(t *testing.T) {
	h, id, a, b := r71Pair(t)
	h.mustWrite(a.id, id, 10, pattern(1, 1))
	h.crash(b, false, nil)
	h.dead[Subject{b.id, b.inc}] = true
	h.run()
	h.tickUntil(10*time.Second, func() bool { return h.rec(id).State == Degraded })
	h.mustWrite(a.id, id, 10, pattern(3, 1)) // b misses it
	// a's disk is replaced before b is resynced (a's resync decree held).
	oldInc := a.inc
	h.holdPropose = func(n *hnode, x Propose) bool {
		return n == a && n.inc == oldInc && strings.HasSuffix(x.What, ": resync]")
	}
	h.start(b)
	h.run()
	h.tick(time.Second)
	h.crash(a, false, nil)
	a.devs[0] = disk.NewMemDevice(testDisk, nil)
	h.start(a)
	h.run()
	h.tick(3 * time.Second)
	lost := false
	for _, st := range a.e.Status() {
		if st.RLDev == id && st.Lost {
			lost = true
		}
	}
	rec := h.rec(id)
	if !lost || rec.Stale[rec.SegmentOf(uint64(a.id))] {
		t.Fatalf("setup: a's copy lost %v, the table %+v (want: lost, not stale: b is stale)", lost, rec)
	}
	q := h.read(a.id, id, 10, 1)
	h.run()
	if r := h.replies[q]; r.Err == nil {
		t.Fatalf("a lost copy served a read: %q", r.Data[:8])
	}
	t.Logf("waiting for an operator: %+v; decrees so far %d", rec, a.e.Stats().Decrees+b.e.Stats().Decrees)
	tb := h.table()
	nr, err := tb.AcceptStale(id, rec.Epoch)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.propose(&pb.Decree{Namespace: Namespace, ExpectedVersion: tb.Version, Ops: []*pb.Op{nr.PutOp()}}); err != nil {
		t.Fatal(err)
	}
	h.run()
	h.tick(time.Second)
	h.mustRead(b.id, id, 10, pattern(1, 1))
	if !h.tickUntil(60*time.Second, func() bool { return h.rec(id).State == Normal }) {
		t.Fatalf("never normal again: %+v", h.rec(id))
	}
	h.tick(2 * time.Second)
	h.sameCopies(id)
	h.mustRead(a.id, id, 10, pattern(1, 1))
}
