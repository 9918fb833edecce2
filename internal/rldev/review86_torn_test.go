package rldev

import (
	"bytes"
	"errors"
	"math/rand"
	"os"
	"testing"
	"time"
)

// Outside review 86: a primary recovering its dirty regions degrades when
// its peer is declared dead (e91bbe6). These probes look at what that
// does to a block of an unpulled region torn on the primary at its crash.

// r86Block decodes block b of RLDev id as node n's disk holds it now.
func r86Block(h *harness, n *hnode, id, b uint64) ([]byte, BlockStatus) {
	rec := h.rec(id)
	for _, sg := range rec.Segs {
		if NodeID(sg.Node) != n.id {
			continue
		}
		raw := make([]byte, PhysBlockSize)
		n.devs[sg.Disk].ReadAt(raw, sg.Offset+blockOff(b))
		d, _, st := DecodeBlock(raw, id, b)
		return append([]byte(nil), d...), st
	}
	h.t.Fatalf("node %d holds no segment of %d", n.id, id)
	return nil, 0
}

// r86TornSetup: block 100 holds A (acknowledged, on both copies); a write
// of B to it is in flight at the primary (its local write issued, not
// synced; its forward never reaches the secondary). Both nodes crash, the
// primary's unsynced write torn (a seed that tears block 100 is taken);
// the primary restarts first and is recovering the region.
func r86TornSetup(t *testing.T) (*harness, *Record, *hnode, *hnode, []byte) {
	for seed := int64(1); seed < 64; seed++ {
		h := newHarness(t, 3, testDisk, func(h *harness) { h.scrubRate = -1 })
		r := h.create(256)
		p, s := h.nodes[NodeID(r.Segs[r.Primary].Node)], h.nodes[NodeID(r.Segs[1-r.Primary].Node)]
		a := pattern(1, 1)
		h.mustWrite(p.id, r.ID, 100, a) // acknowledged; its region stays dirty (lazy clearing)
		q := h.write(p.id, r.ID, 100, pattern(9, 1), nil)
		h.crash(s, false, nil) // the forward (queued) is never delivered
		h.crash(p, true, rand.New(rand.NewSource(seed)))
		h.run()
		if _, ok := h.replies[q]; ok {
			t.Fatalf("setup: the write of B was answered: %+v", h.replies[q])
		}
		if _, st := r86Block(h, p, r.ID, 100); st != BlockCorrupt {
			continue
		}
		if d, st := r86Block(h, s, r.ID, 100); st != BlockOK || !bytes.Equal(d, a) {
			t.Fatalf("setup: the secondary's block 100 is %v", st)
		}
		t.Logf("seed %d tears block 100 on the primary (node %d); the secondary (node %d) holds A", seed, p.id, s.id)
		h.start(p)
		if !h.tickUntil(3*time.Second, func() bool { rp := p.e.reps[r.ID]; return rp != nil && rp.recovering > 0 }) {
			t.Fatalf("setup: the primary is not recovering: %+v", h.rec(r.ID))
		}
		return h, r, p, s, a
	}
	t.Fatal("setup: no seed tears block 100")
	return nil, nil, nil, nil, nil
}

// Control (passes): the secondary comes back before any dead verdict
// (what every case did before e91bbe6): the recovery pulls its copy, and
// block 100 reads A on both copies.
func TestReview86TornDirtyBlockRecoveredWhenPeerReturns(t *testing.T) {
	h, r, p, s, a := r86TornSetup(t)
	h.start(s)
	if !h.tickUntil(10*time.Second, func() bool { return p.e.reps[r.ID].recovering == 0 }) {
		t.Fatalf("not recovered: %+v", h.rec(r.ID))
	}
	h.mustRead(p.id, r.ID, 100, a)
	h.mustRead(s.id, r.ID, 100, a)
	h.sameCopies(r.ID)
}

// Outside review 86 (failing on e91bbe6; now the RLDev stays normal, and
// the recovery pulls A once the secondary is back): the secondary, whose
// disk holds A (the last acknowledged value of block 100), was declared
// dead while the primary recovers; the RLDev degraded (e91bbe6), abandonRecovery puts the region in the
// degraded-mode log, and block 100 reads ErrCorrupt at the primary. When
// the secondary comes back the resync copies the region from the primary,
// the torn block as badGen: the secondary's good copy of A is overwritten
// with a block that fails its check, and the acknowledged A is gone for
// good from both copies. Before e91bbe6 the RLDev stayed normal (writes
// waiting) until the secondary returned, and the recovery pulled A.
func TestReview86TornDirtyBlockOverwritesPeerAtResync(t *testing.T) {
	h, r, p, s, a := r86TornSetup(t)
	h.dead[Subject{s.id, s.inc}] = true
	h.tick(5 * time.Second)
	if st := h.rec(r.ID).State; st != Normal || p.e.reps[r.ID].recovering == 0 {
		t.Fatalf("degraded on the verdict while recovering: %v", st)
	}
	h.dead = map[Subject]bool{}
	h.start(s)
	if !h.tickUntil(10*time.Second, func() bool { return p.e.reps[r.ID].recovering == 0 }) {
		t.Fatalf("not recovered: %+v", h.rec(r.ID))
	}
	h.mustRead(p.id, r.ID, 100, a)
	h.mustRead(s.id, r.ID, 100, a)
	h.sameCopies(r.ID)
}

// DEFECT, pre-existing (fails, here and before e91bbe6): the same loss by
// abandonRecovery's older use -- the secondary's disk fails a read while
// the primary pulls the torn block's region (it turns stale by its own
// failure), then it loads again (the error was transient) and is
// resynced: the torn block, sent as badGen, overwrites its whole copy of
// A. Only a double fault reached it before; e91bbe6 makes a dead verdict
// (both nodes lost power, the secondary slower to come back) enough.
func TestReview86TornDirtyBlockOverwritesPeerAfterPeerDiskError(t *testing.T) {
	if os.Getenv("GROVE_KNOWN_DEFECTS") == "" {
		t.Skip("a known defect, not fixed yet (README, RLDev known limits): GROVE_KNOWN_DEFECTS=1 runs it, and it fails")
	}
	h, r, p, s, a := r86TornSetup(t)
	h.holdRead = func(n *hnode, x DiskRead) bool { return n == s && x.Run != nil }
	h.start(s)
	sr := func() *replica { return s.e.reps[r.ID] }
	if !h.tickUntil(5*time.Second, func() bool { return len(h.held) > 0 }) {
		t.Fatalf("setup: the secondary does not read for the pull: %+v", h.rec(r.ID))
	}
	h.holdRead = nil
	// The read fails (EIO): what onPull's error path does.
	h.exec(s, sr().fail(errors.New("EIO (injected)")))
	h.run()
	for len(h.held) > 0 {
		h.release(0)
	}
	if !h.tickUntil(5*time.Second, func() bool { return h.rec(r.ID).State == Degraded }) {
		t.Fatalf("setup: the secondary's failure did not degrade: %+v (secondary %v)", h.rec(r.ID), sr().state)
	}
	if !h.tickUntil(60*time.Second, func() bool { return h.rec(r.ID).State == Normal }) {
		t.Fatalf("not resynced: %+v", h.rec(r.ID))
	}
	_, st := r86Block(h, s, r.ID, 100)
	q := h.read(s.id, r.ID, 100, 1)
	h.run()
	rp := h.replies[q]
	t.Logf("after the resync: the secondary's block 100 is %v on disk; a read answers %v (primary recovering %d)", st, rp.Err, p.e.reps[r.ID].recovering)
	if rp.Err != nil || !bytes.Equal(rp.Data, a) && !bytes.Equal(rp.Data, pattern(9, 1)) {
		t.Errorf("DEFECT (pre-existing): block 100's acknowledged value A, whole on the secondary, was overwritten by the resync with the primary's torn block (%v, read: %v)", st, rp.Err)
	}
}
