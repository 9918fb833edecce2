package chunk

import (
	"fmt"

	"github.com/google/btree"
)

// space is the free space of one RLDev, in blocks. The allocator is best
// fit: a request takes the smallest free run that holds it (the lowest
// such run among equals) and carves it from that run's start; a freed run
// is merged with its free neighbours at once. Best fit keeps large runs
// whole for large requests; its known weakness is many small leftovers
// when request sizes vary widely (external fragmentation): an allocation
// fails with ErrFull when no single run is large enough even if the free
// total is (the error says the largest run). Chunks do not move, so
// fragmentation is never repaired, only avoided.
//
// Free runs are kept twice, by start (to merge neighbours) and by size (to
// find the best fit), each in a B-tree: O(log n) per allocation and free.
// Not safe for concurrent use.
type space struct {
	blocks uint64
	free   uint64
	byOff  *btree.BTreeG[run]
	bySize *btree.BTreeG[run]
}

type run struct{ start, n uint64 }

func (r run) end() uint64 { return r.start + r.n }

func newSpace(blocks uint64) *space {
	s := &space{
		blocks: blocks,
		byOff:  btree.NewG(16, func(a, b run) bool { return a.start < b.start }),
		bySize: btree.NewG(16, func(a, b run) bool { return a.n < b.n || a.n == b.n && a.start < b.start }),
	}
	if blocks > 0 {
		s.insert(run{0, blocks})
	}
	return s
}

func (s *space) insert(r run) {
	s.byOff.ReplaceOrInsert(r)
	s.bySize.ReplaceOrInsert(r)
	s.free += r.n
}

func (s *space) remove(r run) {
	s.byOff.Delete(r)
	s.bySize.Delete(r)
	s.free -= r.n
}

// alloc takes n blocks (n > 0) by best fit.
func (s *space) alloc(n uint64) (uint64, bool) {
	var best run
	found := false
	s.bySize.AscendGreaterOrEqual(run{n: n}, func(r run) bool {
		best, found = r, true
		return false
	})
	if !found {
		return 0, false
	}
	s.remove(best)
	if best.n > n {
		s.insert(run{best.start + n, best.n - n})
	}
	return best.start, true
}

// release frees [start, start+n), merging it with free neighbours. The
// run must be wholly in use (a double free is a programmer error).
func (s *space) release(start, n uint64) {
	if n == 0 || start+n > s.blocks {
		panic(fmt.Sprintf("chunk: release of [%d, +%d) in a space of %d blocks", start, n, s.blocks))
	}
	r := run{start, n}
	if prev, ok := s.before(start); ok {
		if prev.end() > start {
			panic(fmt.Sprintf("chunk: release of [%d, +%d) overlaps free run [%d, +%d)", start, n, prev.start, prev.n))
		}
		if prev.end() == start {
			s.remove(prev)
			r = run{prev.start, prev.n + r.n}
		}
	}
	if next, ok := s.atOrAfter(start); ok {
		if next.start < start+n {
			panic(fmt.Sprintf("chunk: release of [%d, +%d) overlaps free run [%d, +%d)", start, n, next.start, next.n))
		}
		if next.start == start+n {
			s.remove(next)
			r = run{r.start, r.n + next.n}
		}
	}
	s.insert(r)
}

// take marks [start, start+n) in use: it must be wholly free (rebuilding
// the free space from the map at load: two chunks over one block is a
// corrupt map).
func (s *space) take(start, n uint64) error {
	r, ok := s.before(start + 1)
	if !ok || r.start > start || r.end() < start+n {
		return fmt.Errorf("%w: blocks [%d, +%d) are not free (two chunks over them, or past the RLDev's %d)", ErrCorrupt, start, n, s.blocks)
	}
	s.remove(r)
	if r.start < start {
		s.insert(run{r.start, start - r.start})
	}
	if r.end() > start+n {
		s.insert(run{start + n, r.end() - start - n})
	}
	return nil
}

// takeFree takes whatever of [start, start+n) is free, and returns the
// pieces taken.
func (s *space) takeFree(start, n uint64) []run {
	var got []run
	end := start + n
	var pieces []run
	if r, ok := s.before(start + 1); ok && r.end() > start {
		pieces = append(pieces, r)
	}
	s.byOff.AscendRange(run{start: start + 1}, run{start: end}, func(r run) bool {
		pieces = append(pieces, r)
		return true
	})
	for _, r := range pieces {
		a, b := max(r.start, start), min(r.end(), end)
		if a < b {
			if err := s.take(a, b-a); err != nil {
				panic(err) // inside a free run
			}
			got = append(got, run{a, b - a})
		}
	}
	return got
}

// before is the free run starting before x (the last one), if any.
func (s *space) before(x uint64) (run, bool) {
	var got run
	found := false
	if x == 0 {
		return got, false
	}
	s.byOff.DescendLessOrEqual(run{start: x - 1}, func(r run) bool {
		got, found = r, true
		return false
	})
	return got, found
}

// atOrAfter is the first free run starting at or after x, if any.
func (s *space) atOrAfter(x uint64) (run, bool) {
	var got run
	found := false
	s.byOff.AscendGreaterOrEqual(run{start: x}, func(r run) bool {
		got, found = r, true
		return false
	})
	return got, found
}

// largest is the largest free run's length.
func (s *space) largest() uint64 {
	if r, ok := s.bySize.Max(); ok {
		return r.n
	}
	return 0
}

// runs is the number of free runs (fragmentation, for stat).
func (s *space) runs() int { return s.byOff.Len() }
