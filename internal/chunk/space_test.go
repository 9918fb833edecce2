package chunk

import (
	"errors"
	"math/rand"
	"testing"
)

// The allocator against a bitmap of the same space: random allocations and
// frees of random sizes; after every step the free runs are exactly the
// bitmap's maximal free runs (merged: no two adjacent), the totals agree,
// and every allocation took a smallest run that fits, at its start.
func TestSpaceAgainstBitmap(t *testing.T) {
	for seed := int64(1); seed <= 50; seed++ {
		r := rand.New(rand.NewSource(seed))
		const blocks = 2000
		s := newSpace(blocks)
		used := make([]bool, blocks)
		type chunk struct{ start, n uint64 }
		var live []chunk
		for step := 0; step < 3000; step++ {
			if len(live) > 0 && r.Intn(2) == 0 {
				i := r.Intn(len(live))
				c := live[i]
				live = append(live[:i], live[i+1:]...)
				s.release(c.start, c.n)
				for b := c.start; b < c.start+c.n; b++ {
					used[b] = false
				}
			} else {
				n := uint64(1 + r.Intn(40))
				if r.Intn(10) == 0 {
					n = uint64(1 + r.Intn(400))
				}
				want := smallestFit(used, n)
				start, ok := s.alloc(n)
				if ok != (want.n > 0) {
					t.Fatalf("seed %d step %d: alloc(%d) ok=%v, the bitmap's smallest fit %+v", seed, step, n, ok, want)
				}
				if !ok {
					continue
				}
				if start != want.start {
					t.Fatalf("seed %d step %d: alloc(%d) at %d, the smallest fit starts at %d (%d long)", seed, step, n, start, want.start, want.n)
				}
				for b := start; b < start+n; b++ {
					used[b] = true
				}
				live = append(live, chunk{start, n})
			}
			checkRuns(t, seed, step, s, used)
		}
	}
}

// smallestFit is the first of the smallest maximal free runs of at least n.
func smallestFit(used []bool, n uint64) run {
	var best run
	for i := 0; i < len(used); {
		if used[i] {
			i++
			continue
		}
		j := i
		for j < len(used) && !used[j] {
			j++
		}
		if l := uint64(j - i); l >= n && (best.n == 0 || l < best.n) {
			best = run{uint64(i), l}
		}
		i = j
	}
	return best
}

func checkRuns(t *testing.T, seed int64, step int, s *space, used []bool) {
	t.Helper()
	var want []run
	var free uint64
	for i := 0; i < len(used); {
		if used[i] {
			i++
			continue
		}
		j := i
		for j < len(used) && !used[j] {
			j++
		}
		want = append(want, run{uint64(i), uint64(j - i)})
		free += uint64(j - i)
		i = j
	}
	var got []run
	s.byOff.Ascend(func(r run) bool { got = append(got, r); return true })
	if len(got) != len(want) || s.free != free || s.bySize.Len() != len(want) {
		t.Fatalf("seed %d step %d: %d runs (%d by size), %d free; the bitmap has %d runs, %d free", seed, step, len(got), s.bySize.Len(), s.free, len(want), free)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("seed %d step %d: run %d is %+v, the bitmap's is %+v", seed, step, i, got[i], want[i])
		}
	}
}

// take rebuilds the free space from a map; overlapping chunks are refused.
func TestSpaceTake(t *testing.T) {
	s := newSpace(100)
	for _, c := range []run{{10, 5}, {0, 3}, {50, 50}, {15, 1}} {
		if err := s.take(c.start, c.n); err != nil {
			t.Fatal(err)
		}
	}
	if s.free != 100-5-3-50-1 || s.largest() != 34 {
		t.Fatalf("free %d largest %d", s.free, s.largest())
	}
	for _, bad := range []run{{12, 1}, {2, 2}, {99, 1}, {100, 1}, {95, 10}} {
		if err := s.take(bad.start, bad.n); !errors.Is(err, ErrCorrupt) {
			t.Errorf("take %+v over a used block: %v", bad, err)
		}
	}
	s.release(10, 5)
	s.release(15, 1)
	if s.largest() != 47 || s.runs() != 1 { // [3, 50) merged
		t.Fatalf("largest %d runs %d", s.largest(), s.runs())
	}
}

// The simulation's map check fails on a block in two places, on a leaked
// block, and on a reservation over a chunk.
func TestMapConsistentHasTeeth(t *testing.T) {
	m := newChunkMap(1, []DataRLDev{{ID: 7, Blocks: 64}})
	if err := m.add(1, Extent{RLDev: 7, Block: 4, Len: 3 * BlockSize}); err != nil {
		t.Fatal(err)
	}
	if err := mapConsistent(m, true); err != nil {
		t.Fatalf("a consistent map: %v", err)
	}
	m.chunks[2] = &entry{Extent: Extent{RLDev: 7, Block: 5, Len: BlockSize}} // inside chunk 1
	if err := mapConsistent(m, false); err == nil {
		t.Fatal("a block in two chunks passed")
	}
	delete(m.chunks, 2)
	m.spaces[7].take(20, 2) // in nothing
	if err := mapConsistent(m, true); err == nil {
		t.Fatal("a leaked block passed")
	}
	m.spaces[7].release(20, 2)
	m.resv[30] = &openResv{Resv: Resv{ID: 30, Run: Run{RLDev: 7, Block: 2, Blocks: 4}, Count: 2, Size: 2 * BlockSize}, mat: map[uint64]bool{}}
	if err := mapConsistent(m, false); err == nil {
		t.Fatal("a reservation over a chunk passed")
	}
}
