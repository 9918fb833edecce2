package ddstable

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
)

// The paper's Figure 3 and §4.2 examples: partition 10 splits into 010 and
// 110; 000 and 100 merge into 00.
func TestDPMapPaperExamples(t *testing.T) {
	m := NewDPMap()
	if got := m.Lookup(12345); got != Root {
		t.Fatalf("a new map sends every key to the root, got %v", got)
	}
	mustSplit := func(s string) {
		t.Helper()
		p, err := ParsePartition(s)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Split(p); err != nil {
			t.Fatal(err)
		}
	}
	// Build Figure 3's shape: leaves 000, 100, 10, 01, 11 (bit 0 rightmost).
	mustSplit("*")
	mustSplit("0")
	mustSplit("1")
	mustSplit("00")
	want := []string{"000", "100", "10", "01", "11"}
	var got []string
	for _, p := range m.Leaves() {
		got = append(got, p.String())
	}
	if !slices.Equal(got, want) {
		t.Fatalf("leaves %v, want %v", got, want)
	}
	for key, part := range map[uint64]string{0b000: "000", 0b100: "100", 0b010: "10", 0b110: "10", 0b001: "01", 0b101: "01", 0b011: "11", 0b111: "11", 0b1000: "000"} {
		if p := m.Lookup(key); p.String() != part {
			t.Errorf("key %b: partition %v, want %s", key, p, part)
		}
	}
	mustSplit("10")
	if p := m.Lookup(0b010); p.String() != "010" {
		t.Errorf("after splitting 10, key 010 is in %v", p)
	}
	if p := m.Lookup(0b110); p.String() != "110" {
		t.Errorf("after splitting 10, key 110 is in %v", p)
	}
	p00, _ := ParsePartition("00")
	if err := m.Merge(p00); err != nil {
		t.Fatal(err)
	}
	if p := m.Lookup(0b100); p.String() != "00" {
		t.Errorf("after merging into 00, key 100 is in %v", p)
	}
	if err := m.Merge(p00); !errors.Is(err, ErrNotMergeable) {
		t.Errorf("merging a leaf: %v", err)
	}
	if err := m.Split(Partition{Bits: 1, Depth: 3}); !errors.Is(err, ErrNotLeaf) {
		t.Errorf("splitting a partition not in the map: %v", err)
	}
	if err := m.Merge(Root); !errors.Is(err, ErrNotMergeable) {
		t.Errorf("merging the root, whose children are not both leaves: %v", err)
	}
}

func TestPartitionNames(t *testing.T) {
	for _, s := range []string{"*", "0", "1", "10", "0110", "1111111111111111111111111111111111111111111111111111111111111111"} {
		p, err := ParsePartition(s)
		if err != nil {
			t.Fatal(err)
		}
		if p.String() != s || !p.Valid() {
			t.Errorf("%q → %+v → %q", s, p, p.String())
		}
	}
	for _, s := range []string{"", "2", "01x", "11111111111111111111111111111111111111111111111111111111111111111"} {
		if _, err := ParsePartition(s); err == nil {
			t.Errorf("%q parsed", s)
		}
	}
	p, _ := ParsePartition("10")
	z, o, _ := p.Children()
	if z.String() != "010" || o.String() != "110" {
		t.Errorf("children of 10: %v %v", z, o)
	}
	if par, _ := o.Parent(); par != p {
		t.Errorf("parent of 110: %v", par)
	}
	if _, ok := Root.Parent(); ok {
		t.Error("the root has a parent")
	}
	deep := Partition{Bits: 0, Depth: 64}
	if _, _, ok := deep.Children(); ok {
		t.Error("a depth-64 partition has children")
	}
	if !deep.Contains(0) || deep.Contains(1) {
		t.Error("depth-64 containment")
	}
}

// Random splits and merges against a model: the set of leaves, each key in
// exactly one; the encoding round-trips.
func TestDPMapRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	m := NewDPMap()
	for step := 0; step < 3000; step++ {
		leaves := m.Leaves()
		if len(leaves) != m.Len() {
			t.Fatalf("Len %d, %d leaves", m.Len(), len(leaves))
		}
		if rng.IntN(3) > 0 && m.Len() < 200 {
			p := leaves[rng.IntN(len(leaves))]
			if err := m.Split(p); err != nil && p.Depth < 64 {
				t.Fatal(err)
			}
		} else if p, ok := leaves[rng.IntN(len(leaves))].Parent(); ok {
			err := m.Merge(p)
			z, o, _ := p.Children()
			if (err == nil) != (slices.Contains(leaves, z) && slices.Contains(leaves, o)) {
				t.Fatalf("merge %v: %v with leaves %v", p, err, leaves)
			}
		}
		for range 20 {
			k := rng.Uint64()
			n := 0
			for _, p := range m.Leaves() {
				if p.Contains(k) {
					n++
					if m.Lookup(k) != p {
						t.Fatalf("key %x: lookup %v, contained in %v", k, m.Lookup(k), p)
					}
				}
			}
			if n != 1 {
				t.Fatalf("key %x in %d partitions", k, n)
			}
		}
		b := m.AppendBinary(nil)
		d, rest, err := decodeDPMap(b)
		if err != nil || len(rest) != 0 || !d.Equal(m) || d.Len() != m.Len() {
			t.Fatalf("round trip: %v, %d left", err, len(rest))
		}
	}
}

func testMaps() *Maps {
	dp, _ := NewDPMapUniform(2)
	m := &Maps{Table: "users", Epoch: 7, Replicas: 2, DP: dp, RG: map[Partition][]BrickID{}}
	for i, p := range dp.Leaves() {
		m.RG[p] = []BrickID{br(uint64(i%3 + 1)), br(uint64((i+1)%3 + 1))}
	}
	return m
}

func TestMapsEncoding(t *testing.T) {
	m := testMaps()
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	b := m.AppendBinary(nil)
	d, err := DecodeMaps(b)
	if err != nil {
		t.Fatal(err)
	}
	if d.Stamp() != m.Stamp() || !d.DP.Equal(m.DP) || d.Table != m.Table || d.Epoch != m.Epoch {
		t.Fatalf("round trip: %+v", d)
	}
	// The stamp sees group order, epoch and membership.
	c := m.Clone()
	p := c.DP.Leaves()[0]
	c.RG[p][0], c.RG[p][1] = c.RG[p][1], c.RG[p][0]
	if c.Stamp() == m.Stamp() {
		t.Error("reordering a group left the hash unchanged")
	}
	if m.Stamp() != testMaps().Stamp() {
		t.Error("equal maps, different stamps")
	}
	// Every truncation is refused, with an error.
	for i := range b {
		if _, err := DecodeMaps(b[:i]); err == nil {
			t.Fatalf("a truncation to %d of %d bytes decoded", i, len(b))
		}
	}
	bad := []*Maps{
		func() *Maps { c := m.Clone(); c.RG[p] = nil; return c }(),
		func() *Maps { c := m.Clone(); c.RG[p] = []BrickID{br(1), {Node: 1, Inc: 2}}; return c }(),
		func() *Maps { c := m.Clone(); c.Replicas = 0; return c }(),
		func() *Maps { c := m.Clone(); c.Table = ""; return c }(),
		func() *Maps { c := m.Clone(); delete(c.RG, p); return c }(),
		func() *Maps { c := m.Clone(); c.RG[Partition{Bits: 1, Depth: 5}] = []BrickID{br(1)}; return c }(),
	}
	for i, c := range bad {
		if err := c.Validate(); err == nil {
			t.Errorf("bad maps %d validated", i)
		}
	}
}

func FuzzDecodeMaps(f *testing.F) {
	f.Add(testMaps().AppendBinary(nil))
	m := testMaps()
	m.DP = NewDPMap()
	m.RG = map[Partition][]BrickID{Root: {br(9)}}
	f.Add(m.AppendBinary(nil))
	for _, fn := range []func(*Maps) (*Maps, error){
		func(m *Maps) (*Maps, error) {
			return WithSplitLease(m, Partition{Bits: 1, Depth: 2}, m.RG[Partition{Bits: 1, Depth: 2}][1])
		},
		func(m *Maps) (*Maps, error) {
			p := Partition{Bits: 3, Depth: 2}
			return WithMoveLease(m, p, br(9), m.RG[p][0])
		},
		func(m *Maps) (*Maps, error) {
			m.RG[Partition{Bits: 2, Depth: 2}] = slices.Clone(m.RG[Partition{Bits: 0, Depth: 2}])
			return WithMergeLease(m, Partition{Bits: 0, Depth: 1}, m.RG[Partition{Bits: 0, Depth: 2}][0])
		},
	} {
		r, err := fn(testMaps())
		if err != nil {
			f.Fatal(err)
		}
		f.Add(r.AppendBinary(nil))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeMaps(b)
		if err != nil {
			return
		}
		// What decodes re-encodes to the same bytes: one map, one encoding,
		// so that two copies' hashes agree.
		if again := m.AppendBinary(nil); string(again) != string(b) {
			t.Fatalf("re-encoded %x as %x", b, again)
		}
		for _, p := range m.DP.Leaves() {
			if !p.Valid() || !m.DP.Has(p) {
				t.Fatalf("leaf %v", p)
			}
		}
	})
}
