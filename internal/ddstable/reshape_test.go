package ddstable

import (
	"errors"
	"slices"
	"testing"
)

// The reshape transitions: a lease, then the new partitions with the same
// group; what may not be leased; the encoding of leases; what a brick's
// replicas become.
func TestReshapeTransitions(t *testing.T) {
	m := testMaps() // 4 partitions at depth 2, 2 replicas
	p := Partition{Bits: 1, Depth: 2}
	g := m.RG[p]
	if _, err := WithSplitLease(m, p, br(9)); !errors.Is(err, ErrNotMember) {
		t.Fatalf("a lease for a non-member: %v", err)
	}
	l, err := WithSplitLease(m, p, g[1])
	if err != nil {
		t.Fatal(err)
	}
	if l.Epoch != m.Epoch+1 || l.Reshaping[p] != (Reshape{Holder: g[1]}) {
		t.Fatalf("lease: %+v", l.Reshaping)
	}
	if _, err := WithSplitLease(l, p, g[0]); !errors.Is(err, ErrReshaping) {
		t.Fatalf("a second lease: %v", err)
	}
	short := l.Clone()
	short.RG[p] = short.RG[p][1:]
	if _, err := WithLease(short, p, br(7)); !errors.Is(err, ErrReshaping) {
		t.Fatalf("a recovery's lease on a leased partition: %v", err)
	}
	// The lease encodes (version 2) and decodes to the same maps.
	b := l.AppendBinary(nil)
	if b[0] != mapsVersionExtensions || m.AppendBinary(nil)[0] != mapsVersion {
		t.Fatalf("versions %d, %d", b[0], m.AppendBinary(nil)[0])
	}
	d, err := DecodeMaps(b)
	if err != nil || d.Stamp() != l.Stamp() || d.Reshaping[p] != l.Reshaping[p] {
		t.Fatalf("round trip: %v %+v", err, d)
	}
	for i := range b {
		if _, err := DecodeMaps(b[:i]); err == nil {
			t.Fatalf("a truncation to %d of %d bytes decoded", i, len(b))
		}
	}
	if _, err := Split(l, p, g[0]); !errors.Is(err, ErrReshapeLost) {
		t.Fatalf("a split by a brick without the lease: %v", err)
	}
	sp, err := Split(l, p, g[1])
	if err != nil {
		t.Fatal(err)
	}
	zero, one, _ := p.Children()
	if sp.DP.Has(p) || !sp.DP.Has(zero) || !sp.DP.Has(one) || !slices.Equal(sp.RG[zero], g) || !slices.Equal(sp.RG[one], g) || len(sp.Reshaping) != 0 {
		t.Fatalf("split: %v %+v", sp.DP.Leaves(), sp.RG)
	}
	// Merging them back; siblings with other groups do not merge.
	if _, err := WithMergeLease(m, Partition{Bits: 1, Depth: 1}, g[0]); !errors.Is(err, ErrGroupsDiffer) && !errors.Is(err, ErrNotMember) {
		t.Fatalf("a merge of different groups: %v", err)
	}
	ml, err := WithMergeLease(sp, p, g[0])
	if err != nil {
		t.Fatal(err)
	}
	if d, err := DecodeMaps(ml.AppendBinary(nil)); err != nil || d.Stamp() != ml.Stamp() {
		t.Fatalf("merge lease round trip: %v", err)
	}
	// A dead holder loses both siblings' leases.
	if c, changed := withoutDead(ml, map[BrickID]bool{g[0]: true}); !changed || len(c.Reshaping) != 0 || c.Validate() != nil {
		t.Fatalf("dead holder: %+v %v", c.Reshaping, c.Validate())
	}
	if c, ok := WithoutReshape(ml, one, g[0]); !ok || len(c.Reshaping) != 0 {
		t.Fatalf("given up: %+v", c.Reshaping)
	}
	mg, err := Merged(ml, p, g[0])
	if err != nil {
		t.Fatal(err)
	}
	if !mg.DP.Equal(m.DP) || !slices.Equal(mg.RG[p], g) || len(mg.Reshaping) != 0 {
		t.Fatalf("merged: %v %+v", mg.DP.Leaves(), mg.RG)
	}

	// What bricks' replicas become.
	store := map[uint64]string{1: "a", 5: "b", 9: "c", 13: "d"} // keys of partition 01
	st, lost := Inherit(sp, g[0], map[Partition]Retiree[string]{p: {Store: store, Settled: true}})
	if len(lost) != 0 || len(st[zero]) != 2 || len(st[one]) != 2 || st[zero][1] != "a" || st[one][5] != "b" {
		t.Fatalf("split inherits %v, lost %v", st, lost)
	}
	if st, lost := Inherit(sp, g[0], map[Partition]Retiree[string]{p: {Store: store}}); len(st) != 0 || len(lost) != 2 {
		t.Fatalf("a split of a replica in doubt inherits %v, lost %v", st, lost)
	}
	st, lost = Inherit(mg, g[0], map[Partition]Retiree[string]{zero: {Store: map[uint64]string{1: "a"}, Settled: true}, one: {Store: map[uint64]string{5: "b"}, Settled: true}})
	if len(lost) != 0 || len(st[p]) != 2 {
		t.Fatalf("merge inherits %v, lost %v", st, lost)
	}
	if st, lost := Inherit(mg, g[0], map[Partition]Retiree[string]{zero: {Settled: true}}); len(st) != 0 || !slices.Equal(lost, []Partition{p}) {
		t.Fatalf("half a merge inherits %v, lost %v", st, lost)
	}
	if st, lost := Inherit(sp, br(9), map[Partition]Retiree[string]{p: {Store: store, Settled: true}}); len(st) != 0 || len(lost) != 0 {
		t.Fatalf("a brick not in the new groups inherits %v, lost %v", st, lost)
	}
}
