package btree

import (
	"context"
	"errors"
	"math/rand"
	"sync/atomic"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/rldev"
	"github.com/grovestore/grove/internal/txn"
)

// failDevice fails every write while failing is set (the log's storage cut
// off).
type failDevice struct {
	*simDevice
	failing atomic.Bool
}

func (d *failDevice) Write(ctx context.Context, block uint64, data []byte, f *rldev.Fence) error {
	if d.failing.Load() {
		return errors.New("test: the log's storage is cut off")
	}
	return d.simDevice.Write(ctx, block, data, f)
}

// TestDropMarkRetryWaitsForDurability: a drop's mark whose commit was
// published but whose flush failed leaves the anchor marked dropped in
// the cache; a retry on the same server found it so and reported the
// drop marked, though the mark was never durable (the server, its log
// failed, restarts and finds the tree undropped). The retry now makes the
// mark it finds durable first, and so fails while the log does. (TestSimTreeDrop,
// seed 474298 in a CI race run, and 928708 before: a get after the drop
// found the tree on the server that had marked it.)
func TestDropMarkRetryWaitsForDurability(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := rand.New(rand.NewSource(1))
	locks := newSimLocks(ctx, r)
	store := newSimChunks(r)
	chunks := store.clerk(1, func(context.Context) error { return nil })
	solo := newSoloServer(t, ctx, locks, chunks)
	cache, fence := solo.cache, solo.fence
	dev := &failDevice{simDevice: newSimDevice(txn.HeaderBlocks + 64)}
	wal, err := txn.Open(ctx, txn.Config{Device: dev, Fence: solo.logFence,
		Applier: replayApplier{chunks: chunks, fence: fence}, Manual: true, LazyInterval: time.Hour, Log: simLog})
	if err != nil {
		t.Fatal(err)
	}
	cache.cfg.Log = wal
	ah, _ := emptyTree(t, ctx, chunks, fence, MinNodeSize)
	st := cache.Store(ah, MinNodeSize, nil)

	dev.failing.Store(true)
	if err := markDropped(ctx, st); err == nil {
		t.Fatal("the mark's flush failed, and markDropped said marked")
	}
	if err := markDropped(ctx, st); err == nil {
		t.Fatal("a retry found its own mark, not durable (the log failed), and said the tree is marked dropped")
	}
}
