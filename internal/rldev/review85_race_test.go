package rldev

import (
	"testing"
	"time"
)

// Soundness (passes) for Q1: the node's next incarnation starts between
// the CLI's status check and its decrees. s dies, the RLDev degrades; s's
// next incarnation starts and asks for a resync, whose decree (p's) is
// slow. The Evacuate decree commits first: s's segment re-placed on tg.
// The resync decree then fails (version); s's replica retires; the
// RLDev is rebuilt on tg and normal, every acknowledged write on both
// copies. The CLI then forgets s (it does not look again whether s is
// alive) while s is wiping the old extent (held mid-wipe): the extent is
// dropped, the disk marked forgotten; the wipe ends harmlessly, s
// registers nothing anew and proposes nothing about the extent, nothing
// is placed on s, and the RLDev serves.
func TestReview85EvacuateRacesNextIncarnation(t *testing.T) {
	h, id, p, s, tg := r81ThreeNodes(t)
	h.mustWrite(p.id, id, 700, pattern(1, 1))
	h.tick(3 * time.Second)
	seg := h.rec(id).SegmentOf(uint64(s.id))
	old := h.rec(id).Segs[seg]
	held := h.heldResync(id, p, s)
	if r := h.rec(id); r.State != Degraded || r.Segs[seg] != old {
		t.Fatalf("setup: %+v", r)
	}
	h.mustWrite(p.id, id, 701, pattern(2, 1))

	tb := h.table()
	nr, what, err := tb.Evacuate(id, uint64(s.id), []uint64{uint64(p.id), uint64(tg.id)})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("evacuate: %s", what)
	h.r85Commit(tb, nr)
	err = h.commit(held)
	if err == nil {
		t.Fatalf("DEFECT: the resync decree committed after the re-place: %+v", h.rec(id))
	}
	h.exec(p, p.e.Decided(h.env(p), held.ID, err))
	h.run()
	if r := s.e.reps[id]; r != nil && r.state != repRetired {
		t.Fatalf("s's replica of the re-placed segment not retired: %v", r.state)
	}
	h.mustWrite(p.id, id, 702, pattern(3, 1))

	// s wipes the old extent once the RLDev is normal: held mid-wipe.
	h.holdWrite = func(n *hnode, x DiskWrite) bool {
		return n == s && x.Disk == old.Disk && x.Off >= old.Offset && x.Off < old.Offset+SegmentSize(h.rec(id).Blocks)
	}
	if !h.tickUntil(60*time.Second, func() bool { return h.rec(id).State == Normal && len(h.held) > 0 }) {
		t.Fatalf("not normal with s wiping: %+v (held %d)", h.rec(id), len(h.held))
	}
	plan, err := h.forgetCommit(s.id)
	if err != nil {
		t.Fatal(err)
	}
	if plan.DroppedCount() != 1 || plan.Dropped[id][0] != old {
		t.Fatalf("plan: %+v", plan)
	}
	h.holdWrite = nil
	for len(h.held) > 0 {
		h.release(0)
	}
	decrees := s.e.stats.Decrees
	h.tick(10 * time.Second)
	if s.e.stats.Decrees != decrees {
		t.Fatalf("s proposed %d decrees after its disk was forgotten", s.e.stats.Decrees-decrees)
	}
	tb = h.table()
	if d := tb.Disks[DiskKey{uint64(s.id), 0}]; !d.Forgotten {
		t.Fatalf("s's disk: %+v", d)
	}
	r := h.rec(id)
	if r.State != Normal || len(r.Retiring) != 0 || r.SegmentOf(uint64(s.id)) >= 0 {
		t.Fatalf("after the forget: %+v", r)
	}
	for b, want := range map[uint64]byte{700: 1, 701: 2, 702: 3} {
		h.mustRead(p.id, id, b, pattern(want, 1))
		h.mustRead(tg.id, id, b, pattern(want, 1))
	}
	h.sameCopies(id)
	for i := 0; i < 3; i++ {
		c := h.create(256)
		if c.SegmentOf(uint64(s.id)) >= 0 {
			t.Fatalf("rldev %d placed on the forgotten node: %v", c.ID, c.Segs)
		}
	}
}

// Soundness (passes) for Q2: the settling decree of an engine whose disk
// is forgotten writes the disk record as the table holds it (forgotten),
// never the engine's own view (which would register it anew).
func TestReview85SettlingDecreeKeepsForgotten(t *testing.T) {
	h, id, p, s, tg := r81ThreeNodes(t)
	seg := h.rec(id).SegmentOf(uint64(s.id))
	h.crash(s, false, nil)
	h.dead[Subject{s.id, s.inc}] = true
	h.run()
	if !h.tickUntil(10*time.Second, func() bool { r := h.rec(id); return r.State == Degraded && r.Stale[seg] }) {
		t.Fatalf("setup: %+v", h.rec(id))
	}
	tb := h.table()
	nr, _, err := tb.Evacuate(id, uint64(s.id), []uint64{uint64(p.id), uint64(tg.id)})
	if err != nil {
		t.Fatal(err)
	}
	h.r85Commit(tb, nr)
	if !h.tickUntil(60*time.Second, func() bool { return h.rec(id).State == Normal }) {
		t.Fatalf("not rebuilt: %+v", h.rec(id))
	}
	if _, err := h.forgetCommit(s.id); err != nil {
		t.Fatal(err)
	}
	h.start(s)
	h.tick(2 * time.Second)
	// An unanswered decree, the table unchanged since: settle.
	s.e.unsettled, s.e.decreeOut = true, false
	s.e.decreeFailed = time.Time{}
	out := s.e.decide(h.env(s))
	var prop *Propose
	for _, o := range out {
		if x, ok := o.(Propose); ok {
			prop = &x
		}
	}
	if prop == nil {
		t.Fatalf("no settling decree: %v", out)
	}
	if err := h.commit(*prop); err != nil {
		t.Fatal(err)
	}
	h.exec(s, s.e.Decided(h.env(s), prop.ID, nil))
	h.run()
	if d := h.table().Disks[DiskKey{uint64(s.id), 0}]; d == nil || !d.Forgotten || d.UUID != s.uuid[0] {
		t.Fatalf("DEFECT: the settling decree (%s) changed the forgotten disk: %+v", prop.What, d)
	}
}
