package btree

import (
	"context"
	"math/rand"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/lock"
	"github.com/grovestore/grove/internal/txn"
)

// Outside review 23 (commits 46008c9, c611d18: Cache.releaseStragglers,
// fenceHolder.released/broken).

// r23Rig: a solo server with one committed, written-back key in a
// one-leaf tree (anchor ah, root leaf rh).
func r23Rig(t *testing.T, ctx context.Context) (*simLocks, *soloServer, *Tree, *txn.Log, Handle, Handle) {
	return closeRig(t, ctx, func(c *simChunkClerk) Chunks { return c })
}

// closeRig is r23Rig with the server's chunk clerk wrapped by wrap.
func closeRig(t *testing.T, ctx context.Context, wrap func(*simChunkClerk) Chunks) (*simLocks, *soloServer, *Tree, *txn.Log, Handle, Handle) {
	t.Helper()
	r := rand.New(rand.NewSource(23))
	locks := newSimLocks(ctx, r)
	store := newSimChunks(r)
	chunks := wrap(store.clerk(1, func(context.Context) error { return nil }))
	solo := newSoloServer(t, ctx, locks, chunks)
	_, wal, _, ah, rh := ownedLog(t, ctx, solo, chunks)
	tr, err := New(solo.cache.Store(ah, MinNodeSize, nil), ah.ID, Config{NodeSize: MinNodeSize})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Put(ctx, []byte("k1"), []byte("v1"), Cond{}); err != nil {
		t.Fatal(err)
	}
	if err := solo.cache.FlushAll(ctx); err != nil {
		t.Fatal(err)
	}
	return locks, solo, tr, wal, ah, rh
}

// nodeHolds lists the node leases clerk c has local holds on (not the
// rig's fence and log locks).
func nodeHolds(locks *simLocks, c *simClerk) []string {
	locks.mu.Lock()
	defer locks.mu.Unlock()
	var out []string
	for name, l := range c.leases {
		if name == FenceLock(1) || name == txn.LockName(LogName(1)) {
			continue
		}
		if l.exclusive || l.shared > 0 {
			out = append(out, name)
		}
	}
	return out
}

// TestReview23ShutdownWaitsForWaiterWithoutPin: an operation in flight at
// the close waits in Acquire for a node whose lease another server holds
// (its holder is slow to give it up). It holds no lease: before
// releaseStragglers the clean close went through (ClerkRT.Close fails a
// waiter: lock.Clerk.Close counts holders only). releaseStragglers counts
// it (users > 0) and waits for it until the close's ctx ends, then fails
// the close: the leases stay, left to a recovery. Fails on c611d18. Fixed:
// a lease acquisition gives up when the cache closes (Cache.acquire).
func TestReview23ShutdownWaitsForWaiterWithoutPin(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	locks, solo, tr, _, _, rh := r23Rig(t, ctx)
	cache := solo.cache
	cache.ReleaseAll() // A holds no node now

	// Server B takes the root leaf exclusively and is slow to give it up
	// (no revocation handler: its holder is busy).
	b := locks.newClerk(2, func(context.Context, lock.Recovery) error { return nil })
	bh, err := b.Acquire(ctx, LockName(rh), lock.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	defer bh.Release()

	opCtx, opCancel := context.WithTimeout(ctx, 20*time.Second) // (an OpTimeout: 30 s in production)
	defer opCancel()
	got := make(chan error, 1)
	go func() {
		_, _, err := tr.Get(opCtx, []byte("k1"))
		got <- err
	}()
	// Wait until A's Get asks for the leaf (B's lease is being revoked).
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		locks.mu.Lock()
		l := b.leases[LockName(rh)]
		rev := l != nil && l.revoking
		locks.mu.Unlock()
		if rev {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the Get never asked for the leaf")
		}
	}
	sctx, scancel := context.WithTimeout(ctx, 300*time.Millisecond) // (Service.Close: 10 s)
	defer scancel()
	start := time.Now()
	serr := cache.Shutdown(sctx)
	hs := nodeHolds(locks, solo.clerk)
	t.Logf("Shutdown after %v: %v; A's node holds then: %v", time.Since(start).Round(time.Millisecond), serr, hs)
	opCancel()
	<-got
	if serr != nil && len(hs) == 0 {
		t.Errorf("the clean close failed (%v) although the server held no node lease: the only straggler was a waiter, which the clerk's close would fail; the leases are left to a recovery", serr)
	}
}

// gatedLocks wraps the cache's Locks: the Release of a hold on gate's name
// blocks until release is closed (entered is closed when it starts).
type gatedLocks struct {
	Locks
	gate             string
	armed            atomic.Bool
	entered, release chan struct{}
	once             sync.Once
}

type gatedHold struct {
	Hold
	l    *gatedLocks
	name string
}

func (l *gatedLocks) Acquire(ctx context.Context, name string, mode lock.Mode) (Hold, error) {
	h, err := l.Locks.Acquire(ctx, name, mode)
	if err != nil {
		return nil, err
	}
	return &gatedHold{Hold: h, l: l, name: name}, nil
}

func (h *gatedHold) Release() {
	if h.name == h.l.gate && h.l.armed.Load() {
		h.l.once.Do(func() { close(h.l.entered) })
		<-h.l.release
	}
	h.Hold.Release()
}

// TestReview23ShutdownReturnsWithHoldOut: a revocation's give-up
// (Revoked -> giveUpRef) clears the entry's pin and forgets the entry under
// c.mu, then releases the hold after unlocking. releaseStragglers, which
// looks only at the entries, can return nil in between: Shutdown reports
// "every lease given back" while a hold is still out, and the clerk's close
// that follows is refused (ErrStillHeld) if the release is still pending
// by then. The delay here is injected (a Release that blocks); in the
// runtime the window is a lock-service mutex acquisition, and wal.Close
// runs in between. Fails on c611d18. Fixed: pins taken off their entries
// are counted until released (Cache.releasing), and Shutdown waits for
// them.
func TestReview23ShutdownReturnsWithHoldOut(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := rand.New(rand.NewSource(23))
	locks := newSimLocks(ctx, r)
	store := newSimChunks(r)
	chunks := store.clerk(1, func(context.Context) error { return nil })
	solo := newSoloServer(t, ctx, locks, chunks)
	cache := solo.cache
	_, _, _, ah, rh := ownedLog(t, ctx, solo, chunks)
	gl := &gatedLocks{Locks: cache.cfg.Locks, gate: LockName(rh), entered: make(chan struct{}), release: make(chan struct{})}
	cache.cfg.Locks = gl // before any operation
	tr, err := New(cache.Store(ah, MinNodeSize, nil), ah.ID, Config{NodeSize: MinNodeSize})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Put(ctx, []byte("k1"), []byte("v1"), Cond{}); err != nil {
		t.Fatal(err)
	}
	if err := cache.FlushAll(ctx); err != nil {
		t.Fatal(err)
	}
	gl.armed.Store(true)
	go cache.Revoked(LockName(rh)) // the clerk's notice (its own goroutine)
	<-gl.entered
	go func() { // the release ends a while after Shutdown began
		time.Sleep(50 * time.Millisecond)
		close(gl.release)
	}()
	if err := cache.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if hs := nodeHolds(locks, solo.clerk); len(hs) != 0 {
		t.Errorf("Shutdown returned nil (no pin left) while %v is still held: the clerk's close now is refused (ErrStillHeld)", hs)
	}
}
