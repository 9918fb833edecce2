package treecall

import (
	"math/rand"
	"testing"
)

// TestPending: the floor is the least open number, whatever the order in
// which writes end, and the next number once none is open.
func TestPending(t *testing.T) {
	var p Pending
	if f := p.Floor(); f != 1 {
		t.Fatalf("empty: floor %d", f)
	}
	r := rand.New(rand.NewSource(1))
	open := map[uint64]bool{}
	for step := 0; step < 2000; step++ {
		if len(open) == 0 || r.Intn(2) == 0 {
			open[p.Begin()] = true
		} else {
			for s := range open {
				p.End(s)
				delete(open, s)
				break
			}
		}
		want := p.last + 1
		for s := range open {
			want = min(want, s)
		}
		if f := p.Floor(); f != want {
			t.Fatalf("step %d: floor %d, want %d (open %v)", step, f, want, open)
		}
	}
}
