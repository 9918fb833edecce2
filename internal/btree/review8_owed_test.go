package btree

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"

	"github.com/grovestore/grove/internal/chunk"
	"github.com/grovestore/grove/internal/rldev"
	"github.com/grovestore/grove/internal/txn"
)

// review8Chunks loses the answer of the next write of one chosen chunk
// (kept to land when the test says) and cancels the writer's context.
type review8Chunks struct {
	*simChunkClerk
	mu     sync.Mutex
	target Handle
	cancel context.CancelFunc
	kept   func() error
}

func (c *review8Chunks) Write(ctx context.Context, h Handle, data []byte, f *rldev.Fence) error {
	c.mu.Lock()
	lose := c.cancel != nil && h == c.target
	if lose {
		d, fc := append([]byte(nil), data...), *f
		c.kept = func() error { return c.s.apply(h, d, &fc, true) }
		c.cancel()
		c.cancel = nil
	}
	c.mu.Unlock()
	if lose {
		return errors.New("review8: the write's answer was lost")
	}
	return c.simChunkClerk.Write(ctx, h, data, f)
}

// TestReview8OwedPaidByAnotherNode (a soundness check, expected to pass):
// leaf L1's checkpoint write is lost (its time runs out); the renewal it
// is owed is paid by the write-back of another leaf, L2; L1's next image
// then goes out without a renewal of its own, under the paid token, and
// the lost write, landing after it, is refused.
func TestReview8OwedPaidByAnotherNode(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var rc *review8Chunks
	tr := oneServerTree(t, ctx, func(c *simChunkClerk) Chunks {
		rc = &review8Chunks{simChunkClerk: c}
		return rc
	}, nil, Config{MaxFanout: 4}, true)
	st := tr.s.(*TreeStore)
	cache := st.c
	for i := 0; i < 40; i++ {
		if _, err := tr.Put(ctx, []byte(fmt.Sprintf("k%03d", i)), []byte("v0"), Cond{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := cache.WriteBack(ctx, txn.LSN(math.MaxUint64)); err != nil {
		t.Fatal(err)
	}
	k1, k2 := []byte("k001"), []byte("k038")
	l1, _, err := tr.locate(ctx, target{key: k1}, 0)
	if err != nil {
		t.Fatal(err)
	}
	l2, _, err := tr.locate(ctx, target{key: k2}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if l1.Self == l2.Self {
		t.Fatal("one leaf")
	}
	// L1's write-back is lost.
	if _, err := tr.Put(ctx, k1, []byte("v1"), Cond{}); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithCancel(ctx)
	rc.mu.Lock()
	rc.target, rc.cancel = l1.Self, wcancel
	rc.mu.Unlock()
	if err := cache.WriteBack(wctx, txn.LSN(math.MaxUint64)); err == nil {
		t.Fatal("the lost write-back succeeded")
	}
	renews0 := cache.Stats().Renews
	// L2's write-back pays the renewal.
	if _, err := tr.Put(ctx, k2, []byte("v1"), Cond{}); err != nil {
		t.Fatal(err)
	}
	cache.mu.Lock()
	e2 := cache.mu.m[l2.Self]
	cache.mu.Unlock()
	if err := cache.writeBack(ctx, e2); err != nil {
		t.Fatal(err)
	}
	if cache.Stats().Renews != renews0+1 {
		t.Fatalf("renews %d, want %d", cache.Stats().Renews, renews0+1)
	}
	// L1's next image, without a renewal of its own.
	if _, err := tr.Put(ctx, k1, []byte("v2"), Cond{}); err != nil {
		t.Fatal(err)
	}
	if err := cache.WriteBack(ctx, txn.LSN(math.MaxUint64)); err != nil {
		t.Fatal(err)
	}
	if cache.Stats().Renews != renews0+1 {
		t.Fatalf("renews %d, want %d (paid once)", cache.Stats().Renews, renews0+1)
	}
	landErr := rc.kept()
	got, ok := chunkLeafValue(t, ctx, rc.simChunkClerk, l1.Self, k1)
	if !ok || got != "v2" || !errors.Is(landErr, chunk.ErrFenced) {
		t.Fatalf("late write: %v; chunk holds %q (found %v), want v2", landErr, got, ok)
	}
}
