package chunk

import (
	"slices"
	"testing"
)

// A clerk tries every pair, in turn from one allocation to the next, and
// new clerks start at different pairs: a clerk per command (grove chunk
// alloc) used to start at the same pair every time.
func TestAllocOrderRotatesFromARandomPair(t *testing.T) {
	ids := []uint32{3, 5, 8, 13}
	firsts := map[uint32]int{}
	for range 64 {
		c := newClerk(nil)
		a, b := c.allocOrder(ids), c.allocOrder(ids)
		for _, o := range [][]uint32{a, b} {
			s := slices.Clone(o)
			slices.Sort(s)
			if !slices.Equal(s, ids) {
				t.Fatalf("order %v is not every pair once", o)
			}
		}
		i := slices.Index(ids, a[0])
		if b[0] != ids[(i+1)%len(ids)] || !slices.Equal(a, append(slices.Clone(ids[i:]), ids[:i]...)) {
			t.Fatalf("orders %v then %v: want a rotation of %v, then the next", a, b, ids)
		}
		firsts[a[0]]++
	}
	if len(firsts) < 2 {
		t.Fatalf("64 new clerks all started at pair %v", firsts)
	}
}
