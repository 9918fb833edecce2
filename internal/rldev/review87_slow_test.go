package rldev

import (
	"testing"
	"time"
)

// review87SlowTarget: the secondary s of a 1024-block RLDev comes back
// stale after the primary wrote every chunk degraded; once s is loaded its
// disk answers one write at a time, each lat after the one before (FIFO:
// slow, but alive and answering everything). It returns the harness, the
// record, p, s and counters of the copies sent to s and of s's OK answers
// to them.
type r87Counts struct{ copies, copyOK, copyOKMatched int }

func review87SlowTarget(t *testing.T, lat time.Duration, opts ...func(*harness)) (*harness, *Record, *hnode, *hnode, *r87Counts, func(time.Duration) bool) {
	h := newHarness(t, 3, testDisk, opts...)
	r := h.create(1024)
	p, s := h.nodes[NodeID(r.Segs[r.Primary].Node)], h.nodes[NodeID(r.Segs[1-r.Primary].Node)]
	h.mustWrite(p.id, r.ID, 1, pattern(1, 1))
	h.crash(s, false, nil)
	h.dead[Subject{s.id, s.inc}] = true
	h.run()
	if !h.tickUntil(10*time.Second, func() bool { return h.rec(r.ID).State == Degraded }) {
		t.Fatalf("setup: not degraded: %+v", h.rec(r.ID))
	}
	for b := uint64(0); b < 1024; b += 64 {
		h.mustWrite(p.id, r.ID, b, pattern(byte(b), 8))
	}
	// s's disk: slow from its restart on.
	slow := false
	h.holdWrite = func(n *hnode, x DiskWrite) bool { return slow && n == s }
	cnt := &r87Counts{}
	copySeqs := map[uint64]bool{}
	h.mute = func(from, to NodeID, msg any) bool {
		switch m := msg.(type) {
		case Copy:
			if from == p.id && to == s.id {
				cnt.copies++
				copySeqs[m.Seq] = true
			}
		case Ack:
			if from == s.id && to == p.id && copySeqs[m.Seq] && m.Code == OK {
				cnt.copyOK++
				if pr := p.e.reps[r.ID]; pr != nil && pr.copies[m.Seq] != nil {
					cnt.copyOKMatched++
				}
			}
		}
		return false
	}
	h.dead = map[Subject]bool{}
	slow = true
	h.start(s)
	var since time.Duration
	// step ticks 100 ms, releasing s's oldest held write every lat.
	step := func(d time.Duration) bool {
		for x := time.Duration(0); x < d; x += 100 * time.Millisecond {
			h.tick(100 * time.Millisecond)
			since += 100 * time.Millisecond
			if since >= lat && len(h.held) > 0 {
				since = 0
				h.release(0)
			}
		}
		return true
	}
	return h, r, p, s, cnt, step
}

// A resync target whose disk takes 300 ms a write (about 850 KB/s of
// copies, 4 MiB to copy): alive, answering every copy it is sent. It is
// not silent, and its resync should end (the RLDev normal), not be given
// up as a silent target's and held.
func TestReview87SlowTargetNotGivenUp(t *testing.T) {
	h, r, p, _, cnt, step := review87SlowTarget(t, 300*time.Millisecond)
	pr := p.e.reps[r.ID]
	sawResync, stops := false, 0
	last := h.rec(r.ID).State
	for i := 0; i < 1800 && h.rec(r.ID).State != Normal; i++ { // 180 s
		step(100 * time.Millisecond)
		st := h.rec(r.ID).State
		if st == Resyncing {
			sawResync = true
		}
		if last == Resyncing && st == Degraded {
			stops++
		}
		last = st
	}
	t.Logf("copies sent %d, answered OK %d, of which matched an awaited seq %d; resync stopped %d times; held until %v (now %v)",
		cnt.copies, cnt.copyOK, cnt.copyOKMatched, stops, pr.resyncHeld.Sub(h.now), h.now)
	if !sawResync {
		t.Fatalf("setup: no resync")
	}
	if !pr.resyncHeld.IsZero() {
		t.Errorf("a target answering every copy (%d OK answers) was given up as silent (%d stops)", cnt.copyOK, stops)
	}
	if st := h.rec(r.ID).State; st != Normal {
		t.Fatalf("the slow target's resync never ended in 180 s: %v", st)
	}
}
