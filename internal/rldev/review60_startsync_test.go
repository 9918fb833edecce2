package rldev

import (
	"testing"
	"time"
)

// Outside review 60: a loading replica's drop joins a sync of its disk
// (replica.dropCache), and a failure of that sync fails the replica, which
// has nothing in flight: it is marked stale with FullCopy and copied
// whole. A new process's first fdatasync reports a write-back failure
// that its predecessor never heard (it died before its fdatasync: see
// internal/disk/review60_newprocess_test.go, where the next process's
// first Sync fails and the second succeeds), and that first sync is the
// one the first replica's load joins. The lost pages are clean after the
// failed sync, so the drop would evict them all the same; the replica's
// disk holds a crash-consistent state its logs recover, as after any
// crash.
func TestReview60FirstSyncFailureAtStartFailsAReplica(t *testing.T) {
	h := newHarness(t, 2, testDisk, func(h *harness) { h.suspect = true })
	r := h.create(256)
	p, s := h.nodes[r.Segs[0].Node], h.nodes[r.Segs[1].Node]
	h.mustWrite(p.id, r.ID, 0, pattern(1, 4))
	// s's process restarts; its first sync reports its predecessor's
	// unheard failure.
	failed := failNextSync(h, s)
	h.dead[Subject{s.id, s.inc}] = true
	h.start(s)
	h.run()
	staleSeen, fullCopy := false, false
	h.tickUntil(15*time.Second, func() bool {
		rec := h.rec(r.ID)
		if rec.Stale[1] {
			staleSeen = true
		}
		if rec.FullCopy {
			fullCopy = true
		}
		return *failed && rec.State == Normal && rec.Inc[1] == s.inc && !rec.Stale[1]
	})
	if !*failed {
		t.Fatal("setup: no sync failed")
	}
	h.mustRead(s.id, r.ID, 0, pattern(1, 4))
	t.Logf("after the restart: replica on node %d made stale: %v, copied whole (FullCopy): %v; record now %+v", s.id, staleSeen, fullCopy, h.rec(r.ID))
	if staleSeen {
		t.Errorf("a failed sync joined by a load that had nothing in flight failed the replica: stale=%v FullCopy=%v (a whole copy of the RLDev, for pages the drop would have evicted anyway)", staleSeen, fullCopy)
	}
}
