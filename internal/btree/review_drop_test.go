package btree

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/grovestore/grove/internal/lock"
)

// goneStore is a MemStore whose chunks in freed read as freed (ErrGone): a
// drop cut off after freeing them.
type goneStore struct {
	*MemStore
	freed map[Handle]bool
}

func (g goneStore) Read(ctx context.Context, h Handle) (*Node, error) {
	if g.freed[h] {
		return nil, ErrGone
	}
	return g.MemStore.Read(ctx, h)
}

// An outside review's finding (failed before the fix): a drop freed a
// level's nodes in the order it found them, so a node reachable only
// through its left neighbour's right link (a split whose downlink is not in
// yet) was freed after that neighbour; a drop cut off between the two
// frees left the node unreachable to the resumed drop: its chunk leaked.
// dropOrder now frees a level in the reverse of the order it found it.
func TestReview2DropResumeLeaksNodeWithoutDownlink(t *testing.T) {
	ctx := context.Background()
	tr, s, _ := newMemTree(t, Config{MaxFanout: 4})
	for i := 0; i < 60; i++ {
		if _, err := tr.Put(ctx, []byte(fmt.Sprintf("k%03d", i*2)), []byte("v"), Cond{}); err != nil {
			t.Fatal(err)
		}
	}
	// The next leaf split "crashes" before its separator reaches the parent.
	fired := false
	tr.crashPoint = func(point string, level int) error {
		if point == "split" && level == 0 && !fired {
			fired = true
			return errors.New("crash")
		}
		return nil
	}
	for i := 0; i < 60 && !fired; i++ {
		_, _ = tr.Put(ctx, []byte(fmt.Sprintf("k%03d", i*2+1)), []byte("v"), Cond{})
	}
	if !fired {
		t.Fatal("setup: no leaf split")
	}
	tr.crashPoint = nil
	s.mu.Lock() // the dead operation's lock on the split's new node
	var held []Handle
	for h, l := range s.mu.locks {
		if l.exclusive {
			held = append(held, h)
		}
	}
	s.mu.Unlock()
	for _, h := range held {
		s.Unlock(h, lock.Exclusive)
	}
	sh, err := Walk(ctx, s, false)
	if err != nil {
		t.Fatal(err)
	}
	if sh.Missing == 0 || sh.Height < 2 {
		t.Fatalf("setup: height %d, %d downlinks missing", sh.Height, sh.Missing)
	}
	a, _ := s.Anchor(ctx)
	order, err := dropOrder(ctx, s, a)
	if err != nil {
		t.Fatal(err)
	}
	for k := 0; k <= len(order); k++ {
		g := goneStore{MemStore: s, freed: map[Handle]bool{}}
		for _, h := range order[:k] {
			g.freed[h] = true
		}
		resumed, err := dropOrder(ctx, g, a)
		if err != nil {
			t.Fatal(err)
		}
		found := map[Handle]bool{}
		for _, h := range resumed {
			found[h] = true
		}
		for _, h := range order[k:] {
			if !found[h] {
				t.Fatalf("a drop cut off after %d of %d frees (last freed %v) resumes without node %v: its chunk leaks (%d downlinks missing)",
					k, len(order), order[k-1], h, sh.Missing)
			}
		}
	}
}
