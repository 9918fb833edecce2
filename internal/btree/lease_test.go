package btree

import (
	"context"
	"errors"
	"math/rand"
	"sync/atomic"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/lock"
	"github.com/grovestore/grove/internal/rldev"
	"github.com/grovestore/grove/internal/txn"
)

// pausedLocks is a clerk whose leases' guaranteed time the test sets.
type pausedLocks struct {
	*simClerk
	until atomic.Pointer[time.Time]
}

func (p *pausedLocks) ValidUntil() time.Time { return *p.until.Load() }

// A server paused past its leases' guaranteed time (its node has not yet
// noticed and fenced itself) must not answer from its cache: another
// server may hold the node's lease by then. Before the check, a cached
// read was served on the pin alone (an outside review's finding).
func TestCacheRefusesReadsPastLeaseTime(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := rand.New(rand.NewSource(1))
	locks := newSimLocks(ctx, r)
	chunks := newSimChunks(r).clerk(1, func(context.Context) error { return nil })
	clerk := &pausedLocks{simClerk: locks.newClerk(1, func(context.Context, lock.Recovery) error { return nil })}
	soon := time.Now().Add(300 * time.Millisecond) // the guarantee the last renewal gave
	clerk.until.Store(&soon)
	fh, err := clerk.Acquire(ctx, FenceLock(1), lock.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	fence := func() *rldev.Fence { return &rldev.Fence{Name: FenceLock(1), Token: fh.Token()} }
	lh, err := clerk.Acquire(ctx, txn.LockName(LogName(1)), lock.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	cache := NewCache(CacheConfig{Locks: clerk, Chunks: chunks, Fence: fence,
		Renew: func(context.Context) error { return errors.New("no renewal") }, Log2: simLog})
	wal, err := txn.Open(ctx, txn.Config{Device: newSimDevice(txn.HeaderBlocks + 64), Fence: rldev.Fence{Name: txn.LockName(LogName(1)), Token: lh.Token()},
		Applier: replayApplier{chunks: chunks, fence: fence}, Checkpointer: cache, Log: simLog})
	if err != nil {
		t.Fatal(err)
	}
	cache.cfg.Log = wal
	ah, _ := chunks.Allocate(ctx, AnchorSize)
	rh, _ := chunks.Allocate(ctx, uint64(MinNodeSize))
	a, root := Init(ah, rh)
	if err := chunks.Write(ctx, rh, root.Encode(nil), fence()); err != nil {
		t.Fatal(err)
	}
	if err := chunks.Write(ctx, ah, a.Encode(nil), fence()); err != nil {
		t.Fatal(err)
	}
	tr, err := New(cache.Store(ah, MinNodeSize, nil), ah.ID, Config{NodeSize: MinNodeSize})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Put(ctx, []byte("a"), []byte("1"), Cond{}); err != nil {
		t.Fatal(err)
	}
	if v, ok, err := tr.Get(ctx, []byte("a")); err != nil || !ok || string(v) != "1" {
		t.Fatalf("get: %q %v %v", v, ok, err)
	}
	// The server pauses past the guarantee; its node has not renewed it
	// (deadlines only move forward, and this one did not).
	time.Sleep(time.Until(soon) + 10*time.Millisecond)
	if _, _, err := tr.Get(ctx, []byte("a")); !errors.Is(err, ErrLeaseExpired) {
		t.Fatalf("a cached read past the leases' time: %v, want ErrLeaseExpired", err)
	}
	if _, err := tr.Scan(ctx, Span{}, 0, false); !errors.Is(err, ErrLeaseExpired) {
		t.Fatalf("a cached scan past the leases' time: %v, want ErrLeaseExpired", err)
	}
	future := time.Now().Add(time.Hour)
	clerk.until.Store(&future) // the node renewed its lease
	if v, ok, err := tr.Get(ctx, []byte("a")); err != nil || !ok || string(v) != "1" {
		t.Fatalf("get after the renewal: %q %v %v", v, ok, err)
	}
}
