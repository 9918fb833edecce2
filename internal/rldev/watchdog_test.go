package rldev

import (
	"testing"
	"time"
)

// The disk watchdog (Config.DiskTimeout, watchDisks) tells a hung disk
// from one that is only overloaded: an operation's age includes its wait
// in the node's disk queue, so age alone would fail every segment of a
// disk that answers all the while, slowly, and have them copied whole.

// wdSlowSecondary: RLDev id's secondary b holds every disk write; the
// primary a takes n writes of distinct blocks, each forwarded to b.
func wdSlowSecondary(t *testing.T, n int) (*harness, uint64, *hnode, *hnode, []ReqID) {
	t.Helper()
	h, id, a, b := r71Pair(t)
	h.mustWrite(a.id, id, 0, pattern(1, 1))
	h.holdWrite = func(x *hnode, _ DiskWrite) bool { return x == b }
	var qs []ReqID
	for i := 0; i < n; i++ {
		qs = append(qs, h.write(a.id, id, uint64(10+i), pattern(byte(2+i), 1), nil))
	}
	h.run()
	if len(h.held) < n {
		t.Fatalf("setup: %d of b's writes held, want %d", len(h.held), n)
	}
	return h, id, a, b, qs
}

// An overloaded disk: 30 writes queued on the secondary's disk, which
// answers one a second, in order. The last waits 30 s, past the 20 s disk
// timeout, but the disk answers throughout: it is not hung, and its
// segment must not fail (before the disk's progress counted, it failed at
// 20 s and the RLDev was degraded, its secondary to be copied whole).
func TestDiskWatchdogOverloadedDiskIsNotHung(t *testing.T) {
	h, id, _, b, qs := wdSlowSecondary(t, 30)
	if DefaultDiskTimeout >= 30*time.Second {
		t.Fatalf("the test wants the queue's wait (30 s) past the disk timeout (%v)", DefaultDiskTimeout)
	}
	// Count b's disk writes from here: the 30 forwards, and those sent
	// again because b was slow to answer (resend).
	writes := 0
	h.holdWrite = func(x *hnode, _ DiskWrite) bool {
		if x == b {
			writes++
		}
		return x == b
	}
	for i := 0; len(h.held) > 0 && i < 200; i++ {
		h.tick(time.Second)
		h.release(0)
	}
	h.tick(time.Second)
	t.Logf("b's disk did %d more writes for the 30 held (forwards sent again while b was behind)", writes)
	if writes > 2*30 {
		t.Fatalf("b's disk did %d more writes for 30 forwards: each write sent again and again while the peer was slow", writes)
	}
	for i, q := range qs {
		if r, ok := h.replies[q]; !ok || r.Err != nil {
			t.Fatalf("write %d: answered %v, %+v", i, ok, r)
		}
	}
	if n := b.e.Stats().DiskHangs; n != 0 || b.e.diskHung(0) {
		t.Fatalf("an overloaded disk, answering once a second, was found hung (%d hangs): its segment failed (record %+v)", n, h.rec(id))
	}
	if rec := h.rec(id); rec.State != Normal || rec.Stale[0] || rec.Stale[1] {
		t.Fatalf("the RLDev left the normal state: %+v", rec)
	}
}

// One operation stuck while the disk's others are answered (a sector the
// device retries for ever holds one worker): the disk counts as hung once
// that operation is StuckFactor disk timeouts old, not before, and the
// write waiting on it is then answered by the primary alone.
func TestDiskWatchdogOneStuckOperation(t *testing.T) {
	h, id, a, b, qs := wdSlowSecondary(t, 1)
	stuck := qs[0]
	// Other writes keep b's disk answering: one a second, each let
	// through at once.
	h.holdWrite = func(x *hnode, w DiskWrite) bool { return false }
	timeout := DefaultDiskTimeout
	var hungAt time.Duration
	for s := time.Duration(0); s < StuckFactor*timeout+10*time.Second; s += time.Second {
		q := h.write(a.id, id, 100+uint64(s/time.Second)%500, pattern(7, 1), nil)
		h.tick(time.Second)
		if hungAt == 0 {
			if r, ok := h.replies[q]; !ok || r.Err != nil {
				t.Fatalf("at %v: a write of the other blocks: answered %v, %+v", s, ok, r)
			}
		}
		if hungAt == 0 && b.e.diskHung(0) {
			hungAt = s + time.Second
		}
	}
	if hungAt == 0 {
		t.Fatalf("one operation unanswered for %v (the others answered) never made the disk hung", StuckFactor*timeout+10*time.Second)
	}
	if hungAt < StuckFactor*timeout {
		t.Fatalf("the disk was found hung after %v, while it answered its other operations (want %v)", hungAt, StuckFactor*timeout)
	}
	if hungAt > StuckFactor*timeout+2*time.Second {
		t.Fatalf("the disk was found hung only after %v (want %v)", hungAt, StuckFactor*timeout)
	}
	if r, ok := h.replies[stuck]; !ok || r.Err != nil {
		t.Fatalf("the write waiting on the stuck operation: answered %v, %+v (record %+v)", ok, r, h.rec(id))
	}
	t.Logf("found hung after %v; record %+v", hungAt, h.rec(id))
	r76Unhang(h)
}

// A disk that answers nothing is hung after the disk timeout, as before.
func TestDiskWatchdogSilentDiskIsHung(t *testing.T) {
	h, id, _, b, qs := wdSlowSecondary(t, 3)
	var hungAt time.Duration
	for s := time.Duration(0); s < 2*DefaultDiskTimeout && hungAt == 0; s += 100 * time.Millisecond {
		h.tick(100 * time.Millisecond)
		if b.e.diskHung(0) {
			hungAt = s + 100*time.Millisecond
		}
	}
	if hungAt < DefaultDiskTimeout || hungAt > DefaultDiskTimeout+2*time.Second {
		t.Fatalf("a silent disk found hung after %v (want %v)", hungAt, DefaultDiskTimeout)
	}
	h.tick(2 * time.Second)
	for i, q := range qs {
		if r, ok := h.replies[q]; !ok || r.Err != nil {
			t.Fatalf("write %d: answered %v, %+v (record %+v)", i, ok, r, h.rec(id))
		}
	}
	r76Unhang(h)
}
