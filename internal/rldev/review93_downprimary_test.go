package rldev

import (
	"bytes"
	"errors"
	"math/rand"
	"testing"
	"time"
)

// Outside review 93: the primary crashes (block 100 torn, a write in
// flight), and the moving secondary's disk fails while the primary is
// down (before the failure detector's verdict): its decree names the
// down primary, sets MovingFailed. The primary comes back with no owed
// page (its pull never began): Owed false, recovering 0, so it replaces
// the secondary's copy -- the only good copy of block 100 -- by the
// target. moving=false is the control (a secondary not moving).
func TestReview93MovingSecondaryFailsWhilePrimaryDown(t *testing.T)  { r93Down(t, true) }
func TestReview93SecondaryFailsWhilePrimaryDownControl(t *testing.T) { r93Down(t, false) }

func r93Down(t *testing.T, moving bool) {
	for seed := int64(1); seed < 64; seed++ {
		h := newHarness(t, 3, testDisk, func(h *harness) { h.scrubRate = -1 })
		r := h.create(256)
		p, s := h.nodes[NodeID(r.Segs[r.Primary].Node)], h.nodes[NodeID(r.Segs[1-r.Primary].Node)]
		var third *hnode
		for _, n := range h.nodes {
			if n != p && n != s {
				third = n
			}
		}
		sseg := 1 - r.Primary
		a := pattern(1, 1)
		h.mustWrite(p.id, r.ID, 100, a)
		q := h.write(p.id, r.ID, 100, pattern(9, 1), nil)
		h.crash(s, false, nil)
		h.crash(p, true, rand.New(rand.NewSource(seed)))
		h.run()
		if _, ok := h.replies[q]; ok {
			t.Fatalf("setup: the write of B was answered")
		}
		if _, st := r86Block(h, p, r.ID, 100); st != BlockCorrupt {
			continue
		}
		if moving {
			h.rmStartMove(r.ID, sseg, third.id)
			h.run()
		}
		sr := func() *replica { return s.e.reps[r.ID] }
		h.start(s)
		if !h.tickUntil(5*time.Second, func() bool { return sr() != nil && sr().ready() }) {
			t.Fatalf("setup: s not ready: %+v", h.rec(r.ID))
		}
		h.failWrite = func(n *hnode, x DiskWrite) bool { return n == s && x.Off > 0 && false }
		h.exec(s, sr().fail(errors.New("EIO (injected)")))
		h.exec(s, s.e.Tick(h.env(s)))
		h.run()
		rec := h.rec(r.ID)
		t.Logf("seed %d: after s's failure (p down): %+v move %+v", seed, rec, rec.Move)
		if rec.State != Degraded || rec.Primary != r.Primary {
			t.Fatalf("setup: p was declared dead first: %+v", rec)
		}
		h.start(p)
		h.tickUntil(90*time.Second, func() bool { return h.rec(r.ID).State == Normal })
		h.tick(5 * time.Second)
		rec = h.rec(r.ID)
		t.Logf("after: %+v move %+v", rec, rec.Move)
		rp := h.rvRead(p.id, r.ID, 100, 1)
		if rp.Err != nil || !bytes.Equal(rp.Data, a) && !bytes.Equal(rp.Data, pattern(9, 1)) {
			t.Errorf("block 100 (acknowledged A, whole on s's copy) lost: read %v; s's copy replaced by the target: %v",
				rp.Err, NodeID(rec.Segs[sseg].Node) == third.id)
		}
		return
	}
	t.Fatal("setup: no seed tears block 100")
}
