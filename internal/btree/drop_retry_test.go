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

// failingLogServer is a solo server (node 1) on simulated chunks whose
// log writes to dev, which fails every write while dev.failing is set,
// with one empty tree (anchor, root).
type failingLogServer struct {
	cache        *Cache
	chunks       Chunks
	dev          *failDevice
	anchor, root Handle
}

func newFailingLogServer(t *testing.T, ctx context.Context) failingLogServer {
	t.Helper()
	r := rand.New(rand.NewSource(1))
	locks := newSimLocks(ctx, r)
	store := newSimChunks(r)
	chunks := store.clerk(1, func(context.Context) error { return nil })
	solo := newSoloServer(t, ctx, locks, chunks)
	dev := &failDevice{simDevice: newSimDevice(txn.HeaderBlocks + 64)}
	wal, err := txn.Open(ctx, txn.Config{Device: dev, Fence: solo.logFence,
		Applier: replayApplier{chunks: chunks, fence: solo.fence}, Manual: true, LazyInterval: time.Hour, Log: simLog})
	if err != nil {
		t.Fatal(err)
	}
	solo.cache.cfg.Log = wal
	ah, rh := emptyTree(t, ctx, chunks, solo.fence, MinNodeSize)
	return failingLogServer{cache: solo.cache, chunks: chunks, dev: dev, anchor: ah, root: rh}
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
	f := newFailingLogServer(t, ctx)
	st := f.cache.Store(f.anchor, MinNodeSize, nil)

	f.dev.failing.Store(true)
	if err := markDropped(ctx, st); err == nil {
		t.Fatal("the mark's flush failed, and markDropped said marked")
	}
	if err := markDropped(ctx, st); err == nil {
		t.Fatal("a retry found its own mark, not durable (the log failed), and said the tree is marked dropped")
	}
}
