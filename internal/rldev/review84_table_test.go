package rldev

import (
	"math/rand"
	"reflect"
	"slices"
	"testing"
	"time"

	pb "github.com/grovestore/grove/api/grovepb"
	"google.golang.org/protobuf/proto"
)

// Outside review 84, question 1: Retiring and RetiringTargets in step.

// Soundness (passes): random sequences of every table change that
// touches a move or the extents retiring -- StartMove (moves and
// re-places), CancelMove, the target named, Switch, switchMove, parkMove,
// moveDegraded (replaced or waiting), targetWant's abandon, wipeRetiring
// (an engine of the extent's node), resync and back to normal, and an
// older build's rewrite (field 16 dropped) -- keep: Check; RetiringTargets
// exactly the entries retired as a move's target given up (a subset after
// an older build's rewrite, never an entry retired as a segment); no
// extent both retiring and a segment or Move.To, in any record; no extent
// retiring twice; the record round-trips through its encoding and
// DecodeTable; Clone does not alias either list.
func TestReview84TableRetiringInStep(t *testing.T) {
	for seed := int64(1); seed <= 300; seed++ {
		r84TableWalk(t, seed)
		if t.Failed() {
			return
		}
	}
}

func r84TableWalk(t *testing.T, seed int64) {
	rnd := rand.New(rand.NewSource(seed))
	const blocks = 64
	tb := &Table{Version: 1, RLDevs: map[uint64]*Record{}, Disks: map[DiskKey]*Disk{}}
	for n := uint64(1); n <= 4; n++ {
		for d := uint32(0); d < 2; d++ {
			tb.Disks[DiskKey{n, d}] = &Disk{Node: n, Index: d, Size: DiskReserved + 12*SegmentSize(blocks)}
		}
	}
	for i := 0; i < 2; i++ {
		r, err := tb.Create(blocks, false)
		if err != nil {
			t.Fatal(err)
		}
		tb.RLDevs[r.ID] = r
	}
	// kind[id][extent]: true retired as a target given up, false as a segment's old place.
	kind := map[uint64]map[Segment]bool{1: {}, 2: {}}
	stripped := map[uint64]bool{}
	var log []string
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("seed %d after %v: "+format, append([]any{seed, log}, args...)...)
	}
	for step := 0; step < 120; step++ {
		id := uint64(1 + rnd.Intn(2))
		rec := tb.RLDevs[id]
		nr := rec.Clone()
		var op string
		before := append([]Segment(nil), rec.Retiring...)
		switch rnd.Intn(12) {
		case 0, 1:
			op = "start"
			seg, node, disk := rnd.Intn(2), uint64(1+rnd.Intn(4)), rnd.Intn(3)-1
			x, err := tb.StartMove(id, seg, node, disk)
			if err != nil {
				continue
			}
			nr = x
		case 2:
			op = "cancel"
			x, err := tb.CancelMove(id)
			if err != nil {
				continue
			}
			nr = x
		case 3:
			op = "name"
			if nr.Move == nil || nr.State != Normal || nr.Move.Inc != 0 {
				continue
			}
			nr.Move.Inc = uint64(10 + step)
			nr.Epoch++
		case 4:
			op = "switch-flag"
			if nr.Move == nil || nr.Move.Inc == 0 {
				continue
			}
			nr.Move.Switch = true
			nr.Epoch++
		case 5:
			op = "switchMove"
			if nr.Move == nil || nr.Move.Inc == 0 || nr.State != Normal {
				continue
			}
			nr.switchMove()
		case 6:
			op = "park"
			if nr.Move == nil || nr.Move.Inc == 0 {
				continue
			}
			nr.parkMove()
		case 7:
			op = "degrade"
			if nr.State != Normal {
				continue
			}
			gone := rnd.Intn(2)
			nr.Primary, nr.State, nr.Stale[gone], nr.FullCopy = 1-gone, Degraded, true, true
			nr.Epoch++
			nr.moveDegraded(gone, rnd.Intn(2) == 0)
		case 8:
			op = "resync/normal"
			switch nr.State {
			case Degraded:
				nr.State = Resyncing
			case Resyncing:
				nr.State, nr.Stale, nr.FullCopy = Normal, [2]bool{}, false
			default:
				continue
			}
			nr.Epoch++
		case 9:
			op = "abandon"
			if nr.Move == nil || len(nr.Retiring) >= MaxRetiring {
				continue
			}
			m := nr.Move
			nr.Move = nil
			nr.retire(m.To, true)
			nr.Epoch++
		case 10:
			op = "wipe"
			if len(nr.Retiring) == 0 {
				continue
			}
			sg := nr.Retiring[rnd.Intn(len(nr.Retiring))]
			e := &Engine{cfg: Config{Node: sg.Node}, wiped: map[Segment]bool{sg: true}, disks: map[uint32]*diskState{0: {}, 1: {}}}
			x, _ := e.wipeRetiring(Env{Now: time.Unix(1, 0)}, rec, nil)
			if x == nil {
				fail("wipe of %v freed nothing", sg)
			}
			nr = x
		case 11:
			op = "older build's rewrite"
			if rnd.Intn(4) != 0 {
				continue
			}
			m := nr.PB()
			m.RetiringTargets = nil // what an older build writes back: field 16 unknown, dropped
			b, _ := proto.Marshal(m)
			back := &pb.RLDevRecord{}
			proto.Unmarshal(b, back)
			x, err := recordFromPB(back)
			if err != nil {
				fail("older rewrite: %v", err)
			}
			nr = x
			stripped[id] = true
		}
		if err := nr.Check(); err != nil {
			if op == "switch-flag" || op == "name" || op == "degrade" || op == "resync/normal" {
				continue // the walk's own change, not one the code makes
			}
			fail("%s on rldev %d: %v (%+v)", op, id, err, nr)
		}
		log = append(log, op)
		// The model.
		for _, sg := range nr.Retiring {
			if !slices.Contains(before, sg) {
				k, ok := kind[id][sg]
				if ok {
					fail("%v retiring again (was %v)", sg, k)
				}
				kind[id][sg] = nr.isRetiringTarget(sg)
				want := op == "cancel" || op == "abandon"
				if kind[id][sg] != want {
					fail("%s retired %v as target=%v", op, sg, kind[id][sg])
				}
			}
		}
		for sg := range kind[id] {
			if !slices.Contains(nr.Retiring, sg) {
				delete(kind[id], sg)
			}
		}
		for _, sg := range nr.RetiringTargets {
			if !kind[id][sg] {
				fail("%v in RetiringTargets but retired as a segment's old place", sg)
			}
		}
		if !stripped[id] {
			for sg, k := range kind[id] {
				if k && !nr.isRetiringTarget(sg) {
					fail("target %v lost from RetiringTargets by %s", sg, op)
				}
			}
		}
		tb.RLDevs[id] = nr
		tb.Version++
		// Invariants over the table.
		var live []Segment
		for _, r := range tb.RLDevs {
			live = append(live, r.Segs[0], r.Segs[1])
			if r.Move != nil {
				live = append(live, r.Move.To)
			}
		}
		seen := map[Segment]bool{}
		for _, r := range tb.RLDevs {
			for _, sg := range r.Retiring {
				if seen[sg] {
					fail("%v retiring twice", sg)
				}
				seen[sg] = true
				if slices.Contains(live, sg) {
					fail("%v retiring and in use: %+v", sg, r)
				}
			}
		}
		ns := &pb.Namespace{Version: tb.Version}
		for _, r := range tb.RLDevs {
			b, _ := proto.Marshal(r.PB())
			ns.Entries = append(ns.Entries, &pb.Entry{Key: recordKey(r.ID), Value: b})
		}
		back, err := DecodeTable(ns)
		if err != nil {
			fail("decode: %v", err)
		}
		for rid, r := range tb.RLDevs {
			if !reflect.DeepEqual(back.RLDevs[rid], r) {
				fail("round trip of rldev %d: %+v != %+v", rid, back.RLDevs[rid], r)
			}
		}
		c := nr.Clone()
		if len(c.RetiringTargets) > 0 {
			c.RetiringTargets[0] = Segment{Node: 99}
			if nr.RetiringTargets[0].Node == 99 {
				fail("Clone aliases RetiringTargets")
			}
		}
	}
}

// Limitation (passes, documents it): the review 83 pin survives an
// upgrade, and comes back with any decree of an older build. The four
// targets cancelled while degraded were retired by an older build (or a
// newer one whose record an older node rewrote since: field 16 unknown to
// it, dropped): nothing marks them targets, tg -- up, on the newer build
// -- keeps them until normal, and the re-place that would make the RLDev
// normal is refused (MaxRetiring).
func TestReview84OlderBuildRewriteRepins(t *testing.T) {
	h, id, p, _, tg, seg := r82Degraded(t)
	h.mustWrite(p.id, id, 11, pattern(3, 1))
	pseg := h.rec(id).Primary
	h.crash(tg, false, nil) // down while the cancels commit
	h.run()
	for i := 0; i < MaxRetiring; i++ {
		tb := h.table()
		nr, err := tb.StartMove(id, pseg, uint64(tg.id), -1)
		if err != nil {
			t.Fatalf("setup: move %d: %v", i, err)
		}
		h.r83Commit(tb, nr)
		tb = h.table()
		if nr, err = tb.CancelMove(id); err != nil {
			t.Fatalf("setup: cancel %d: %v", i, err)
		}
		h.r83Commit(tb, nr)
	}
	rec := h.rec(id)
	if len(rec.RetiringTargets) != MaxRetiring {
		t.Fatalf("setup: %+v", rec)
	}
	// An older build's decree on the record (any: here p's, unchanged
	// but for the fields it does not know).
	tb := h.table()
	old := tb.RLDevs[id].Clone()
	old.RetiringTargets = nil
	h.r83Commit(tb, old)
	h.start(tg)
	h.run()
	h.tick(30 * time.Second)
	rec = h.rec(id)
	_, err := h.table().StartMove(id, seg, uint64(tg.id), -1)
	t.Logf("after the older build's rewrite, tg up 30 s: state %v retiring %d (targets %d); re-place: %v", rec.State, len(rec.Retiring), len(rec.RetiringTargets), err)
	if err == nil || len(rec.Retiring) != MaxRetiring {
		t.Fatalf("the targets were freed after all: %+v (%v)", rec, err)
	}
	t.Logf("LIMITATION: targets retired without the mark (before the upgrade, or rewritten by an older node) wait for normal as before cafd85c: the review 83 pin is not undone by the upgrade; no command marks them")
}
