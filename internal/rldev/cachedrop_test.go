package rldev

import (
	"bytes"
	"errors"
	"math/rand"
	"testing"
	"time"
)

// Linux may answer a failed writeback by marking the pages clean and
// reporting the error once: the lost writes then stay readable from the
// page cache until the pages are evicted, though a crash will not keep
// them. A replica that loads its segment again after such a failure, or a
// new engine after one whose failure it never heard, must read what the
// disk holds (DiskDrop), or it serves, and copies to its peer, writes that
// a crash then takes back: a read that saw them is followed by one that
// does not, and the two copies differ after the peer's resync.

// degradedOnP makes node p's copy the only up-to-date one of a new RLDev
// (its peer crashed and declared dead), holding want at block 0.
func degradedOnP(t *testing.T, h *harness, want []byte) (*Record, *hnode) {
	t.Helper()
	r := h.create(64)
	p, s := h.nodes[r.Segs[0].Node], h.nodes[r.Segs[1].Node]
	h.mustWrite(p.id, r.ID, 0, pattern(1, 1))
	h.crash(s, false, nil)
	h.dead[Subject{s.id, s.inc}] = true
	if !h.tickUntil(10*time.Second, func() bool { rec := h.rec(r.ID); return rec.State == Degraded && rec.Stale[1] }) {
		t.Fatalf("setup: not degraded: %+v", h.rec(r.ID))
	}
	h.mustWrite(p.id, r.ID, 0, want)
	return r, p
}

// failNextSync makes node n's next sync fail, losing the writes it
// covered (still readable until the cache is dropped); it reports whether
// that has happened.
func failNextSync(h *harness, n *hnode) *bool {
	failed := new(bool)
	h.failSync = func(x *hnode, _ DiskSync) bool {
		if x != n || *failed {
			return false
		}
		*failed = true
		return true
	}
	return failed
}

// readsEventually reads block 0 through n until it is served (the replica
// reloads after ReloadEvery) and returns what it read.
func readsEventually(t *testing.T, h *harness, n *hnode, id uint64) []byte {
	t.Helper()
	var got []byte
	if !h.tickUntil(20*time.Second, func() bool {
		q := h.read(n.id, id, 0, 1)
		h.run()
		if rp, ok := h.replies[q]; ok && rp.Err == nil {
			got = rp.Data
			return true
		}
		return false
	}) {
		t.Fatalf("node %d never served rldev %d again: %+v", n.id, id, h.rec(id))
	}
	return got
}

// TestReloadAfterFailedSyncReadsTheDisk: the only up-to-date copy's sync
// fails, losing a write that stays in the cache. The replica fails, loads
// again, and must then serve what the disk holds — what it would serve
// after a crash — not the lost write.
func TestReloadAfterFailedSyncReadsTheDisk(t *testing.T) {
	h := newHarness(t, 2, testDisk)
	durable, lost := pattern(2, 1), pattern(3, 1)
	r, p := degradedOnP(t, h, durable)
	failed := failNextSync(h, p)
	q := h.write(p.id, r.ID, 0, lost, nil)
	h.run()
	if !*failed {
		t.Fatal("setup: no sync failed")
	}
	if rp, ok := h.replies[q]; !ok || rp.Err == nil {
		t.Fatalf("the write whose sync failed: %+v (replied %v)", rp, ok)
	}
	got := readsEventually(t, h, p, r.ID)
	if bytes.Equal(got, lost) {
		t.Fatalf("after its sync failed the replica served the write that sync lost (a crash now would take it back)")
	}
	if !bytes.Equal(got, durable) {
		t.Fatalf("read %q..., want the durable %q...", got[:4], durable[:4])
	}
	if h.drops == 0 {
		t.Fatal("no DiskDrop")
	}
	// A crash changes nothing a reader saw.
	h.crash(p, false, nil)
	h.dead[Subject{p.id, p.inc}] = true
	h.start(p)
	if got := readsEventually(t, h, p, r.ID); !bytes.Equal(got, durable) {
		t.Fatalf("after a crash: read %q..., want %q...", got[:4], durable[:4])
	}
}

// TestNewEngineAfterUnheardSyncFailure (outside review 58): a sync fails
// while its engine is being fenced, so its failure reaches no engine. The
// next engine of the node must not trust the cache of that disk.
func TestNewEngineAfterUnheardSyncFailure(t *testing.T) {
	h := newHarness(t, 2, testDisk)
	durable, lost := pattern(2, 1), pattern(3, 1)
	r, p := degradedOnP(t, h, durable)
	failed := failNextSync(h, p)
	h.write(p.id, r.ID, 0, lost, nil)
	// Carry out the engine's effects until the sync has failed, then
	// fence the node before the failure is delivered.
	for i := 0; !*failed; i++ {
		if len(h.queue) == 0 || i > 1000 {
			t.Fatal("setup: the write's sync never ran")
		}
		f := h.queue[0]
		h.queue = h.queue[1:]
		f()
	}
	h.dead[Subject{p.id, p.inc}] = true
	h.start(p) // a new incarnation: the old one's queued completions are dropped
	h.run()
	got := readsEventually(t, h, p, r.ID)
	if bytes.Equal(got, lost) {
		t.Fatalf("the new engine served a write its predecessor's failed sync lost")
	}
	if !bytes.Equal(got, durable) {
		t.Fatalf("read %q..., want the durable %q...", got[:4], durable[:4])
	}
}

// TestDropLeavingPagesCachedIsTriedAgain: a drop that leaves pages of the
// segment cached (a large folio shared with a neighbour's write in
// flight) does not let the replica load; it is tried again, and the
// replica then serves what the disk holds. A drop that keeps failing
// fails the replica: it never serves from the cache.
func TestDropLeavingPagesCachedIsTriedAgain(t *testing.T) {
	for _, always := range []bool{false, true} {
		h := newHarness(t, 2, testDisk)
		durable, lost := pattern(2, 1), pattern(3, 1)
		r, p := degradedOnP(t, h, durable)
		failed := failNextSync(h, p)
		busy := 0
		h.failDrop = func(n *hnode, _ DiskDrop) bool {
			if n == p && (always || busy < 3) {
				busy++
				return true
			}
			return false
		}
		h.write(p.id, r.ID, 0, lost, nil)
		h.run()
		if !*failed {
			t.Fatal("setup: no sync failed")
		}
		if always {
			h.tick(30 * time.Second)
			q := h.read(p.id, r.ID, 0, 1)
			h.run()
			if rp, ok := h.replies[q]; ok && rp.Err == nil {
				t.Fatalf("drops that always left pages cached: the replica served %q...", rp.Data[:4])
			}
			// maxDropTries+1 in a row, then the replica fails; as the
			// only up-to-date copy it loads again after ReloadEvery.
			if busy < maxDropTries+1 {
				t.Errorf("%d drops, want %d in a row before the replica fails", busy, maxDropTries+1)
			}
			continue
		}
		got := readsEventually(t, h, p, r.ID)
		if !bytes.Equal(got, durable) {
			t.Fatalf("read %q..., want the durable %q... (drops %d, %d refused)", got[:4], durable[:4], h.drops, busy)
		}
		if busy != 3 {
			t.Fatalf("%d drops refused, want 3", busy)
		}
	}
}

// TestSuspectDisksAtEveryStart: as in the runtime, every engine starts
// with its disks suspect, so every replica's first load syncs and drops
// its segment's pages: writes, a crash, a failover and a resync lose
// nothing and leave identical copies.
func TestSuspectDisksAtEveryStart(t *testing.T) {
	h := newHarness(t, 2, testDisk, func(h *harness) { h.suspect = true })
	r := h.create(256)
	if h.drops < 2 {
		t.Fatalf("%d drops for two new replicas", h.drops)
	}
	p, s := h.nodes[r.Segs[0].Node], h.nodes[r.Segs[1].Node]
	h.mustWrite(p.id, r.ID, 0, pattern(1, 4))
	drops := h.drops
	h.crash(s, true, rand.New(rand.NewSource(1)))
	h.dead[Subject{s.id, s.inc}] = true
	h.tick(time.Second)
	h.mustWrite(p.id, r.ID, 100, pattern(2, 4))
	h.start(s)
	if !h.tickUntil(10*time.Second, func() bool { rec := h.rec(r.ID); return rec.State == Normal && !rec.Stale[1] }) {
		t.Fatalf("not resynced: %+v", h.rec(r.ID))
	}
	if h.drops == drops {
		t.Fatal("the restarted replica loaded without a drop")
	}
	h.mustRead(s.id, r.ID, 100, pattern(2, 4))
	h.mustRead(s.id, r.ID, 0, pattern(1, 4))
	h.sameCopies(r.ID)
}

// TestReadRepairWhosePeerTurnsStale (outside review 61): a read meets a
// corrupt block and asks the peer for its copy; the peer is cut off, then
// declared dead and made stale. The read must end (not served: the clerk
// tries again), not wait for an answer no stale peer gives; asked again,
// it fails at once as corrupt (this replica is the only up-to-date copy).
func TestReadRepairWhosePeerTurnsStale(t *testing.T) {
	h := newHarness(t, 2, testDisk)
	r := h.create(64)
	p, s := h.nodes[r.Segs[0].Node], h.nodes[r.Segs[1].Node]
	h.mustWrite(p.id, r.ID, 5, pattern(4, 1))
	sg := r.Segs[0]
	p.devs[sg.Disk].FlipBit(sg.Offset+blockOff(5)+HeaderSize+100, 3)
	h.partition(p.id, s.id)
	q := h.read(p.id, r.ID, 5, 1)
	h.run()
	if _, ok := h.replies[q]; ok {
		t.Fatalf("setup: the read ended with its peer cut off: %+v", h.replies[q])
	}
	h.dead[Subject{s.id, s.inc}] = true
	if !h.tickUntil(10*time.Second, func() bool { _, ok := h.replies[q]; return ok && h.rec(r.ID).Stale[1] }) {
		t.Fatalf("the read never ended once its peer was stale (record %+v)", h.rec(r.ID))
	}
	if rp := h.replies[q]; !errors.Is(rp.Err, ErrNotServing) {
		t.Fatalf("the read whose repair lost its peer: %v, want not served", rp.Err)
	}
	q = h.read(p.id, r.ID, 5, 1)
	h.run()
	if rp, ok := h.replies[q]; !ok || !errors.Is(rp.Err, ErrCorrupt) {
		t.Fatalf("a read of the block with the peer stale: %+v (replied %v), want corrupt", rp.Err, ok)
	}
}
