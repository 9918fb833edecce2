package ddstable

import (
	"errors"
	"slices"
	"testing"
	"time"
)

// The move transitions: a lease that replaces a member, the join in its
// place (or beside it, when a member died meanwhile), the lease given up;
// the encoding; the plan; the replaced member's hand-off.
func TestMoveTransitions(t *testing.T) {
	m := testMaps() // 4 partitions at depth 2, 2 replicas, on bricks 1-3
	p := m.DP.Leaves()[0]
	g := slices.Clone(m.RG[p])
	if _, err := WithMoveLease(m, p, br(4), br(3)); !errors.Is(err, ErrNotReplaceable) {
		t.Fatalf("replacing a non-member: %v", err)
	}
	if _, err := WithMoveLease(m, p, g[1], g[0]); !errors.Is(err, ErrInGroup) {
		t.Fatalf("a member moving in: %v", err)
	}
	short0 := m.Clone()
	short0.RG[p] = g[:1]
	if _, err := WithMoveLease(short0, p, br(4), g[0]); !errors.Is(err, ErrGroupShort) {
		t.Fatalf("a move of a short group: %v", err)
	}
	l, err := WithMoveLease(m, p, br(4), g[0])
	if err != nil {
		t.Fatal(err)
	}
	if l.Epoch != m.Epoch+1 || l.Joining[p] != br(4) || l.Replacing[p] != g[0] {
		t.Fatalf("lease: %v %v", l.Joining, l.Replacing)
	}
	if _, err := WithMoveLease(l, p, br(5), g[1]); !errors.Is(err, ErrLeaseHeld) {
		t.Fatalf("a second move: %v", err)
	}
	if _, err := WithSplitLease(l, p, g[1]); err == nil {
		t.Fatal("a split of a partition being moved")
	}
	// Encoded (version 2) and decoded to the same maps; every truncation
	// refused.
	b := l.AppendBinary(nil)
	d, err := DecodeMaps(b)
	if err != nil || b[0] != mapsVersionExtensions || d.Stamp() != l.Stamp() || d.Replacing[p] != g[0] {
		t.Fatalf("round trip: %v %v", d, err)
	}
	for i := range b {
		if _, err := DecodeMaps(b[:i]); err == nil {
			t.Fatalf("a truncation to %d of %d bytes decoded", i, len(b))
		}
	}
	// The join swaps the members; the degree is kept.
	j, err := Joined(l, p, br(4))
	if err != nil {
		t.Fatal(err)
	}
	if want := []BrickID{g[1], br(4)}; !slices.Equal(j.RG[p], want) || j.Replacing != nil && j.Replacing[p] != (BrickID{}) {
		t.Fatalf("joined: %v (want %v), replacing %v", j.RG[p], want, j.Replacing)
	}
	// A member died during the move: the replaced one stays.
	short, _ := withoutDead(l, map[BrickID]bool{g[1]: true})
	j, err = Joined(short, p, br(4))
	if err != nil || !slices.Equal(j.RG[p], []BrickID{g[0], br(4)}) {
		t.Fatalf("joined a short group: %v %v", j.RG[p], err)
	}
	// The joiner died: its lease and the move go.
	gone, _ := withoutDead(l, map[BrickID]bool{br(4): true})
	if gone.Joining[p] != (BrickID{}) || gone.Replacing[p] != (BrickID{}) {
		t.Fatalf("a dead joiner's move kept: %v %v", gone.Joining, gone.Replacing)
	}
	if u, ok := WithoutLease(l, p, br(4)); !ok || u.Replacing[p] != (BrickID{}) || u.Validate() != nil {
		t.Fatalf("a move given up: %v", u.Replacing)
	}
	// Maps with a move and no lease, or a lease on a full group without
	// a move, are refused.
	bad := l.Clone()
	delete(bad.Joining, p)
	if bad.Validate() == nil {
		t.Error("a move without its lease validated")
	}
	bad = l.Clone()
	delete(bad.Replacing, p)
	if bad.Validate() == nil {
		t.Error("a lease on a full group without a move validated")
	}
}

func TestPlanMove(t *testing.T) {
	m := testMaps() // bricks 1, 2 with 3 replicas each, brick 3 with 2
	live := []BrickID{br(1), br(2), br(3), br(4)}
	p, from, ok := PlanMove(m, live, br(4), nil)
	if !ok || from != br(1) || !slices.Contains(m.RG[p], br(1)) {
		t.Fatalf("plan for the new brick: %v from %v (%v)", p, from, ok)
	}
	if _, _, ok := PlanMove(m, live, br(3), nil); ok {
		t.Fatal("brick 3, one below the others, planned a move")
	}
	if _, _, ok := PlanMove(m, live[:3], br(4), nil); ok {
		t.Fatal("a brick not alive planned a move")
	}
	// Bricks that each take the moves their plans give, one at a time,
	// end within one replica of each other.
	for range 20 {
		moved := false
		for _, b := range live {
			p, from, ok := PlanMove(m, live, b, nil)
			if !ok {
				continue
			}
			l, err := WithMoveLease(m, p, b, from)
			if err != nil {
				t.Fatal(err)
			}
			if m, err = Joined(l, p, b); err != nil {
				t.Fatal(err)
			}
			moved = true
		}
		if !moved {
			break
		}
	}
	n := ReplicaCounts(m)
	lo, hi := n[br(1)], n[br(1)]
	for _, b := range live {
		lo, hi = min(lo, n[b]), max(hi, n[b])
	}
	if hi-lo > 1 || n[br(4)] == 0 {
		t.Fatalf("after the moves: %v", n)
	}
}

// The replaced member stops serving reads once it handed off, and only
// for the move in its maps; the move ended, it serves again. Without the
// hand-off, a library whose maps are as old as the member's would read
// there after the join decree let the new group commit a later write.
func TestHandOff(t *testing.T) {
	m := testMaps()
	p := m.DP.Leaves()[0]
	a := m.RG[p][0]
	now := time.Unix(1, 0)
	cfg := DefaultParticipantConfig(a)
	pt, err := NewParticipant(cfg, m, p)
	if err != nil {
		t.Fatal(err)
	}
	key := uint64(0) // partition 00 holds key 0
	if !p.Contains(key) {
		t.Fatalf("key %d not in %v", key, p)
	}
	if err := pt.HandOff(br(4)); !errors.Is(err, ErrNoLease) {
		t.Fatalf("a hand-off with no move in the maps: %v", err)
	}
	l, _ := WithMoveLease(m, p, br(4), a)
	if _, member := pt.SetMaps(now, l); !member {
		t.Fatal("not a member under the lease")
	}
	if err := pt.Read(key, l.Stamp()); err != nil {
		t.Fatalf("a read under the lease, before the hand-off: %v", err)
	}
	if err := pt.HandOff(br(5)); !errors.Is(err, ErrNoLease) {
		t.Fatalf("a hand-off to another brick: %v", err)
	}
	if err := pt.HandOff(br(4)); err != nil {
		t.Fatal(err)
	}
	if err := pt.Read(key, l.Stamp()); !errors.Is(err, ErrHandedOff) {
		t.Fatalf("a read after the hand-off: %v", err)
	}
	// Another partition's decree keeps the hand-off.
	o := l.Clone()
	o.Epoch++
	pt.SetMaps(now, o)
	if err := pt.Read(key, o.Stamp()); !errors.Is(err, ErrHandedOff) {
		t.Fatalf("a read after an unrelated decree: %v", err)
	}
	// The move given up: it serves again.
	u, _ := WithoutLease(o, p, br(4))
	pt.SetMaps(now, u)
	if err := pt.Read(key, u.Stamp()); err != nil {
		t.Fatalf("a read after the move was given up: %v", err)
	}
}
