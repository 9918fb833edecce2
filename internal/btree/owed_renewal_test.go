package btree

import (
	"context"
	"errors"
	"math"
	"sync"
	"testing"

	"github.com/grovestore/grove/internal/chunk"
	"github.com/grovestore/grove/internal/rldev"
	"github.com/grovestore/grove/internal/txn"
)

// losingChunks is the sim chunk clerk whose next node write loses its
// answer: the write is kept to land when the test says, and the writer's
// time runs out (cancel) as it learns nothing.
type losingChunks struct {
	*simChunkClerk
	mu     sync.Mutex
	lose   bool
	cancel context.CancelFunc
	kept   func() error // lands the lost write
}

func (c *losingChunks) Write(ctx context.Context, h Handle, data []byte, f *rldev.Fence) error {
	c.mu.Lock()
	lose := c.lose && isNodeImage(data)
	if lose {
		c.lose = false
		data, fc := append([]byte(nil), data...), *f
		c.kept = func() error { return c.s.apply(h, data, &fc, true) }
		c.cancel()
	}
	c.mu.Unlock()
	if lose {
		return errors.New("the write's answer was lost")
	}
	return c.simChunkClerk.Write(ctx, h, data, f)
}

// TestOwedRenewal: a write-back whose answer is lost and whose caller's
// time runs out before it could renew the fence leaves its write in
// flight under the current token. The node's next image must not go out
// under that token: the old write, landing after it, would replace it in
// the chunk (an acknowledged put lost once the log is truncated). Found by
// the simulator (TestSimTree seed 463440: a late write of v7 landed over
// v8 under one token, and the put in v8 was gone after the restart). The
// teeth (unsafeNoOwedRenewal) write on under the old token and lose it.
func TestOwedRenewal(t *testing.T) {
	for _, teeth := range []bool{false, true} {
		ctx, cancel := context.WithCancel(context.Background())
		var lc *losingChunks
		tr := oneServerTree(t, ctx, func(c *simChunkClerk) Chunks {
			lc = &losingChunks{simChunkClerk: c}
			return lc
		}, nil, Config{}, true)
		cache := tr.s.(*TreeStore).c
		cache.unsafeNoOwedRenewal = teeth
		key := []byte("k")
		if _, err := tr.Put(ctx, key, []byte("v1"), Cond{}); err != nil {
			t.Fatal(err)
		}
		// The checkpoint's write-back of the leaf with v1: its answer is
		// lost and its time runs out.
		wctx, wcancel := context.WithCancel(ctx)
		lc.mu.Lock()
		lc.lose, lc.cancel = true, wcancel
		lc.mu.Unlock()
		if err := cache.WriteBack(wctx, txn.LSN(math.MaxUint64)); err == nil {
			t.Fatal("a write-back whose answer was lost succeeded")
		}
		if lc.kept == nil {
			t.Fatal("no node write was lost")
		}
		if _, err := tr.Put(ctx, key, []byte("v2"), Cond{}); err != nil {
			t.Fatal(err)
		}
		if err := cache.WriteBack(ctx, txn.LSN(math.MaxUint64)); err != nil {
			t.Fatal(err)
		}
		// The lost write of v1 lands now.
		landErr := lc.kept()
		root := tr.s.(*TreeStore)
		a, err := root.Anchor(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := chunkLeafValue(t, ctx, lc.simChunkClerk, a.Root, key)
		t.Logf("teeth %v: the late write: %v; the chunk holds %q", teeth, landErr, got)
		switch {
		case !teeth && (got != "v2" || !errors.Is(landErr, chunk.ErrFenced)):
			t.Errorf("the late write of v1 (%v) left %q in the chunk, not v2", landErr, got)
		case teeth && got != "v1":
			t.Errorf("teeth: writing on under the old token, the chunk holds %q (the test cannot fail)", got)
		}
		cancel()
	}
}

// chunkLeafValue is key's value in the leaf image chunk h holds (read
// straight from the chunks, past every cache), and whether it is there.
func chunkLeafValue(t *testing.T, ctx context.Context, c *simChunkClerk, h Handle, key []byte) (string, bool) {
	t.Helper()
	img, err := c.Read(ctx, h, uint64(MinNodeSize))
	if err != nil {
		t.Fatal(err)
	}
	n, err := decode(img)
	if err != nil {
		t.Fatal(err)
	}
	i, ok := n.Search(key)
	if !ok {
		return "", false
	}
	return string(n.Vals[i]), true
}
