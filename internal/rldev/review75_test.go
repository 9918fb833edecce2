package rldev

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
)

// Review 75: a2f2289's loadedStale rule and resync binding, tried again.

// loadedStale's rule is gated on !rec.Stale[peer]: it fires only while
// the table says both segments up to date. When the peer is made stale
// first -- its own disk failure, rule 2, which needs no verdict and no
// naming -- the rule never fires, and the joining incarnation, whose
// blank disk was declared resynced for its past incarnation, is then
// named up to date (rule 3 keeps Stale[me] false) and serves as the
// primary: the review-74 schedule again, with one more fault. Nothing
// re-reads the segment's Incomplete superblock once the table stops
// saying stale (lost is decided at load only). The failed peer, reloaded,
// is then resynced from the blank primary: the data is gone everywhere.
//
// Schedule: TestReview74ResyncFromPastIncarnationWithoutPeerDown's up to
// the point where a's "resync" and "resynced" (planned from inc 2's
// request) commit while inc 3 (blank disk, loaded stale) has its decrees
// held; then a write through a fails on a's disk (EIO): a proposes
// itself stale (segment failed), primary b; b's held decrees fail and
// are proposed again; block 10 is read at b.
func TestReview75LoadedStaleBypassedWhenPeerFailsFirst(t *testing.T) {
	h, id, a, b := r71Pair(t)
	h.mustWrite(a.id, id, 10, pattern(1, 1))
	h.tick(3 * time.Second)
	h.dead[Subject{b.id, b.inc}] = true
	h.crash(b, false, nil)
	if !h.tickUntil(10*time.Second, func() bool { return h.rec(id).State == Degraded }) {
		t.Fatalf("setup: not degraded: %+v", h.rec(id))
	}
	r74OneWayRequest(t, h, id, a, b)
	r74SilentDiskLoss(b)
	h.holdPropose = func(n *hnode, x Propose) bool { return n == b }
	h.start(b)
	h.run()
	if !h.tickUntil(10*time.Second, func() bool { r := h.rec(id); return r.State == Normal && !r.Stale[0] && !r.Stale[1] }) {
		t.Fatalf("setup: the past incarnation's resync did not end: %+v", h.rec(id))
	}
	rb := b.e.reps[id]
	if rb == nil || !rb.loadedStale || rb.state != repJoining {
		t.Fatalf("setup: b's replica %+v", rb)
	}
	// a's disk fails a write: a leaves, the table makes it stale.
	h.failWrite = func(n *hnode, x DiskWrite) bool { return n == a }
	h.write(a.id, id, 30, pattern(3, 1), nil)
	h.run()
	if !h.tickUntil(10*time.Second, func() bool { return h.rec(id).Stale[a.e.reps[id].seg] }) {
		t.Fatalf("setup: a's failure not in the table: %+v", h.rec(id))
	}
	h.failWrite = nil
	bHeld := h.heldDecrees
	h.heldDecrees, h.holdPropose = nil, nil
	for _, x := range bHeld {
		h.exec(b, b.e.Decided(h.env(b), x.ID, errors.New("stale version")))
	}
	h.run()
	if !h.tickUntil(10*time.Second, func() bool { r := h.rec(id); return rb.ready() && r.Inc[rb.seg] == b.inc }) {
		t.Fatalf("b not named: %+v", h.rec(id))
	}
	r := h.rec(id)
	rp := h.rvRead(b.id, id, 10, 1)
	t.Logf("record %+v; b stale %v, loadedStale %v; read of block 10 at b: %x... (%v)", r, rb.stale(), rb.loadedStale, rp.Data[:min(2, len(rp.Data))], rp.Err)
	// With a stale too, b cannot be made stale by decree (one copy must
	// stay up to date in the table): it must serve nothing (lost: stale
	// in fact), and the RLDev waits for an operator rather than serve
	// zeros and copy them to a.
	if !r.Stale[rb.seg] && (!rb.stale() || rp.Err == nil) {
		t.Fatalf("DEFECT: b's blank incarnation (loaded stale, its past incarnation declared resynced) is named up to date once a failed first, primary %d: it serves block 10 as %x... (%v; written %x...); a is resynced from it", r.Primary, rp.Data[:min(2, len(rp.Data))], rp.Err, pattern(1, 1)[:2])
	}
}

// loadedStale is set for any replica loaded while the table says its
// segment stale, also one whose disk is intact and whose past
// incarnation's resync (to this very disk) ended: "resynced" commits
// after the next incarnation loaded (a's decree slow). The rule then
// makes it stale again, ahead of want's other rules -- with the peer
// dead, ahead of "peer dead: degraded", which would have made this
// replica, up to date, the primary. The table ends with the only live
// copy stale and the dead one primary: the RLDev serves nothing until a
// returns (for ever, if its disk is gone). A full copy would be a cost;
// this is the only up-to-date copy made stale. (A blank or Incomplete
// segment is what the rule is for; an intact one, of the same disk, holds
// every copy its past incarnation acknowledged.)
//
// Schedule: b crashes, is declared dead, a degrades; block 20 written in
// degraded mode; b restarts (inc 2), is resynced; a's "resynced" decree
// is held; b crashes (disk intact), restarts (inc 3, its decrees held):
// loaded stale; a's "resynced" commits; a crashes and is declared dead;
// b's decrees fail and are proposed again; blocks 10 and 20 are read at b.
func TestReview75IntactReplicaMadeStaleWhilePeerDead(t *testing.T) {
	h, id, a, b := r71Pair(t)
	h.mustWrite(a.id, id, 10, pattern(1, 1))
	h.tick(3 * time.Second)
	h.dead[Subject{b.id, b.inc}] = true
	h.crash(b, false, nil)
	if !h.tickUntil(10*time.Second, func() bool { return h.rec(id).State == Degraded }) {
		t.Fatalf("setup: not degraded: %+v", h.rec(id))
	}
	h.mustWrite(a.id, id, 20, pattern(2, 1))
	h.holdPropose = func(n *hnode, x Propose) bool { return n == a && strings.HasSuffix(x.What, ": resynced]") }
	h.start(b)
	if !h.tickUntil(10*time.Second, func() bool { return len(h.heldDecrees) == 1 }) {
		t.Fatalf("setup: no resynced decree: %+v", h.rec(id))
	}
	resynced := h.heldDecrees[0]
	h.heldDecrees = nil
	h.crash(b, false, nil) // its disk keeps every copy it acknowledged
	h.holdPropose = func(n *hnode, x Propose) bool { return n == b }
	h.start(b)
	h.run()
	rb := b.e.reps[id]
	if rb == nil || rb.state != repJoining || !rb.rec.Stale[rb.seg] {
		t.Fatalf("setup: b's replica, loaded stale: %+v", rb)
	}
	if err := h.commit(resynced); err != nil {
		t.Fatalf("setup: the held resynced decree: %v", err)
	}
	h.exec(a, a.e.Decided(h.env(a), resynced.ID, nil))
	h.run()
	if r := h.rec(id); r.State != Normal || r.Stale[0] || r.Stale[1] {
		t.Fatalf("setup: %+v", r)
	}
	h.dead[Subject{a.id, a.inc}] = true
	h.crash(a, false, nil)
	bHeld := h.heldDecrees
	h.heldDecrees, h.holdPropose = nil, nil
	for _, x := range bHeld {
		h.exec(b, b.e.Decided(h.env(b), x.ID, errors.New("stale version")))
	}
	h.run()
	h.tickUntil(20*time.Second, func() bool { r := h.rec(id); return r.Primary == rb.seg && !r.Stale[rb.seg] && rb.ready() })
	r := h.rec(id)
	for _, blk := range []uint64{10, 20} {
		rp := h.rvRead(b.id, id, blk, 1)
		want := pattern(1, 1)
		if blk == 20 {
			want = pattern(2, 1)
		}
		if rp.Err != nil || !bytes.Equal(rp.Data, want) {
			t.Fatalf("DEFECT: with a dead, b (its disk intact, its past incarnation resynced) was made stale by the loadedStale rule: record %+v; read of block %d at b: %v", r, blk, rp.Err)
		}
	}
}
