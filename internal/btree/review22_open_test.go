package btree

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/lock"
	"github.com/grovestore/grove/internal/rldev"
	"github.com/grovestore/grove/internal/txn"
)

// TestReview22OpenAfterCleanCloseNeedsChunkStore: since 2cbbbbf a server
// opening its own log (keep == nil) disowns the chunks of every committed
// link record still in it. Log.Close does not move the head, so after a
// clean close the log still holds the link records of every change since
// the last checkpoint, all of them disowned by the close's final
// write-back already. The next start disowns them again, one chunk at a
// time, and a disown that fails fails the open (and so StartServer): a
// start now needs every chunk pair a record names reachable, where it
// needed none before. With the runtime's chunk clerk (which retries until
// its context ends, and StartServer's context from Service.run has no
// deadline) the start does not fail but waits, holding the node's fence
// and log locks, for as long as the pair is down; a pair gone for good
// stops the node's B-tree server from ever starting again.
// Fixed: a clean close (Shutdown) checkpoints the log after its final
// write-back, so that its next open finds no record, and no link record to
// disown: it needs no chunk pair.
func TestReview22OpenAfterCleanCloseNeedsChunkStore(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := rand.New(rand.NewSource(22))
	locks := newSimLocks(ctx, r)
	store := newSimChunks(r)
	var down atomic.Bool
	errDown := errors.New("review22: the chunk pair is unreachable")
	var disowns atomic.Int64
	chunks := &r22CountingChunks{simChunkClerk: store.clerk(1, func(context.Context) error {
		if down.Load() {
			return errDown
		}
		return nil
	}), disowns: &disowns}
	solo := newSoloServer(t, ctx, locks, chunks)
	cache, fence := solo.cache, solo.fence
	dev, wal, owner, ah, _ := ownedLog(t, ctx, solo, chunks)
	tr, err := New(cache.Store(ah, MinNodeSize, nil), ah.ID, Config{NodeSize: MinNodeSize, MaxFanout: 4, MaxInline: 13})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 12; i++ {
		if _, err := tr.Put(ctx, []byte(fmt.Sprintf("k%02d", i)), []byte(strings.Repeat("v", 40)), Cond{}); err != nil {
			t.Fatal(err)
		}
	}
	// A clean close, as Server.Close: Shutdown, then the log's close
	// (once the pool's refill is done: TestReview22ShutdownLeavesRefilledChunk).
	r22WaitRefills(t, cache)
	if err := cache.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := wal.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if left := r22Tagged(store, owner); len(left) != 0 {
		t.Fatalf("the clean close left %d chunks tagged", len(left))
	}
	// The node starts again while the chunk pair is unreachable: nothing
	// in the log needs the pair (every chunk it names was disowned).
	down.Store(true)
	next := lock.Token{Epoch: solo.logFence.Token.Epoch + 1, Seq: 1}
	start := time.Now()
	wal2, openErr := txn.Open(ctx, txn.Config{Device: dev, Fence: rldev.Fence{Name: txn.LockName(LogName(1)), Token: next},
		Applier: replayApplier{chunks: chunks, fence: fence}, Manual: true, Log: simLog})
	took := time.Since(start)
	if openErr == nil {
		wal2.Close(ctx)
	} else {
		// The pair back: the open goes through, disowning again what the
		// close disowned.
		down.Store(false)
		disowns.Store(0)
		again := lock.Token{Epoch: next.Epoch, Seq: next.Seq + 1} // (a start taken again: the lock anew)
		wal2, err := txn.Open(ctx, txn.Config{Device: dev, Fence: rldev.Fence{Name: txn.LockName(LogName(1)), Token: again},
			Applier: replayApplier{chunks: chunks, fence: fence}, Manual: true, Log: simLog})
		if err != nil {
			t.Fatal(err)
		}
		wal2.Close(ctx)
		t.Logf("with the pair back, the open sent %d Disown calls (one per link record, serially), every one of them for a chunk the close had disowned", disowns.Load())
		t.Fatalf("after a clean close, opening the log (the server's next start) with the chunk pair unreachable failed after %v: %v", took.Round(time.Millisecond), openErr)
	}
}

type r22CountingChunks struct {
	*simChunkClerk
	disowns *atomic.Int64
}

func (c *r22CountingChunks) Disown(ctx context.Context, hs []Handle) error {
	c.disowns.Add(1)
	return c.simChunkClerk.Disown(ctx, hs)
}
