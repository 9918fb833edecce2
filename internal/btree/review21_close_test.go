package btree

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand"
	"strings"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/chunk"
	"github.com/grovestore/grove/internal/lock"
	"github.com/grovestore/grove/internal/rldev"
	"github.com/grovestore/grove/internal/txn"
)

// Outside review 21 (commit 74d5d65: owned allocations, link records).

// ownedLog is the review tests' rig for owned allocations: a manual log
// for solo's server on a fresh device, the cache's allocations tagged as
// StartServer tags them, and an empty tree's anchor and root.
func ownedLog(t *testing.T, ctx context.Context, solo *soloServer, chunks Chunks) (*simDevice, *txn.Log, chunk.Owner, Handle, Handle) {
	t.Helper()
	dev := newSimDevice(txn.HeaderBlocks + 256)
	wal, err := txn.Open(ctx, txn.Config{Device: dev, Fence: solo.logFence,
		Applier: replayApplier{chunks: chunks, fence: solo.fence}, Checkpointer: solo.cache, Manual: true, LazyInterval: time.Hour, Log: simLog})
	if err != nil {
		t.Fatal(err)
	}
	solo.cache.cfg.Log = wal
	owner := chunk.Owner{Log: OwnerLog(1), Token: solo.logFence.Token}
	solo.cache.setOwner(owner)
	ah, rh := emptyTree(t, ctx, chunks, solo.fence, MinNodeSize)
	return dev, wal, owner, ah, rh
}

// r21Chunks runs hook (once) when the first Disown is sent: what else
// the server does while a checkpoint's disown is on the wire.
type r21Chunks struct {
	*simChunkClerk
	hook func()
}

func (c *r21Chunks) Disown(ctx context.Context, hs []Handle) error {
	if f := c.hook; f != nil {
		c.hook = nil
		f()
	}
	return c.simChunkClerk.Disown(ctx, hs)
}

// TestReview21CloseForgetsLinkOfLateCommit: Server.Close is FlushAll (=
// WriteBack(∞): disownLogged, freeLogged, the dirty nodes), ReleaseAll,
// cache.Close, wal.Close, which releases the log's lock. Nothing stops
// operations meanwhile: Service.Close only unpublishes the server, calls
// already in it go on, and the cache refuses commits only at cache.Close.
// disownLogged takes its list of link records once, at its start. A put
// that commits after that (here: while the disown RPC is in flight) has
// its link record in the log and its chunk still tagged; FlushAll then
// writes its leaf back (the leaf is dirty below ∞), the log closes
// cleanly and the lock is released. The next start opens the log with
// keep == nil (nothing replayed, so no disown), which truncates it, and
// collectOrphans(log, its own newer token) frees every chunk still tagged
// with the older token: the value chunk the durable leaf names.
//
// Before the change the same late commit was harmless: its leaf was
// written back by FlushAll or ReleaseAll, and nothing freed its chunks.
//
// Fixed twice over: Server.Close is now Cache.Shutdown, which quiesces the
// cache first (every commit from then on is refused, not applied), and a
// server opening its own log disowns the chunks of the committed link
// records it finds there. The test now closes as Shutdown does; the late
// put is refused, or, if it got in, its value survives the next start.
func TestReview21CloseForgetsLinkOfLateCommit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := rand.New(rand.NewSource(21))
	locks := newSimLocks(ctx, r)
	store := newSimChunks(r)
	chunks := &r21Chunks{simChunkClerk: store.clerk(1, func(context.Context) error { return nil })}
	solo := newSoloServer(t, ctx, locks, chunks)
	cache, fence := solo.cache, solo.fence
	dev, wal, _, ah, rh := ownedLog(t, ctx, solo, chunks)
	tr, err := New(cache.Store(ah, MinNodeSize, nil), ah.ID, Config{NodeSize: MinNodeSize, MaxInline: 13})
	if err != nil {
		t.Fatal(err)
	}
	big := func(i int) []byte { return []byte(fmt.Sprintf("value-%04d-%s", i, strings.Repeat("v", 40))) }
	if _, err := tr.Put(ctx, []byte("k1"), big(1), Cond{}); err != nil {
		t.Fatal(err)
	}

	// Server.Close, with a put in flight that commits during FlushAll.
	var lateErr error
	chunks.hook = func() {
		_, lateErr = tr.Put(ctx, []byte("k2"), big(2), Cond{})
	}
	cache.Quiesce() // (Shutdown's steps, one by one, to look in between)
	if err := cache.FlushAll(ctx); err != nil {
		t.Fatalf("FlushAll: %v", err)
	}
	if lateErr == nil {
		t.Fatalf("the late put, during a clean close's final write-back, was acknowledged")
	}
	if !errors.Is(lateErr, ErrNotApplied) {
		t.Fatalf("the late put: %v, want ErrNotApplied", lateErr)
	}
	t.Logf("the late put was refused: %v", lateErr)
	cache.ReleaseAll()
	cache.Close()
	if err := wal.Close(ctx); err != nil {
		t.Fatalf("closing the log: %v", err)
	}
	// The next start: a newer token on the log's lock, the log opened with
	// keep == nil, then the background collection; k1 stays readable.
	next := lock.Token{Epoch: solo.logFence.Token.Epoch + 1, Seq: 1}
	wal2, err := txn.Open(ctx, txn.Config{Device: dev, Fence: rldev.Fence{Name: txn.LockName(LogName(1)), Token: next},
		Applier: replayApplier{chunks: chunks, fence: fence}, Manual: true, Log: simLog})
	if err != nil {
		t.Fatal(err)
	}
	defer wal2.Close(ctx)
	freed := collectOrphans(ctx, chunks, nil, OwnerLog(1), next, simLog, "start")
	t.Logf("the next start's collection freed %d chunks (the refused put freed its own value)", freed)
	b, err := store.clerk(2, func(context.Context) error { return nil }).Read(ctx, rh, MinNodeSize)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := Decode(b, ah.ID, rh)
	if err != nil {
		t.Fatal(err)
	}
	i, found := leaf.Search([]byte("k1"))
	if !found || !leaf.IsExt(i) {
		t.Fatalf("the leaf on its chunk has no k1")
	}
	if _, found := leaf.Search([]byte("k2")); found {
		t.Fatalf("the refused put of k2 is in the leaf")
	}
	r1, err := DecodeRef(leaf.Vals[i])
	if err != nil {
		t.Fatal(err)
	}
	c2 := NewCache(CacheConfig{Locks: solo.clerk, Chunks: chunks, Fence: fence})
	if got, err := c2.Store(ah, MinNodeSize, nil).ReadValue(ctx, r1); err != nil || !bytes.Equal(got, big(1)) {
		t.Fatalf("k1's value after the next start: %q %v", got, err)
	}
}

// TestOpenDisownsCommittedLinks: a log closed with a committed change
// whose link record no checkpoint disowned (a close that skipped its
// final write-back) is opened by its own server's next start: the open
// disowns the chunk, so that the start's collection leaves it alone.
func TestOpenDisownsCommittedLinks(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := rand.New(rand.NewSource(22))
	locks := newSimLocks(ctx, r)
	store := newSimChunks(r)
	chunks := store.clerk(1, func(context.Context) error { return nil })
	solo := newSoloServer(t, ctx, locks, chunks)
	cache, fence := solo.cache, solo.fence
	dev, wal, _, ah, _ := ownedLog(t, ctx, solo, chunks)
	tr, err := New(cache.Store(ah, MinNodeSize, nil), ah.ID, Config{NodeSize: MinNodeSize, MaxInline: 13})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Put(ctx, []byte("k"), []byte(strings.Repeat("v", 60)), Cond{}); err != nil {
		t.Fatal(err)
	}
	_, ref, ok, err := tr.getRef(ctx, []byte("k"))
	if err != nil || !ok || ref == nil {
		t.Fatalf("k: %v %v %v", ref, ok, err)
	}
	store.mu.Lock()
	_, tagged := store.tag[ref.Chunk]
	store.mu.Unlock()
	if !tagged {
		t.Fatalf("the value chunk %v has no tag before any checkpoint", ref.Chunk)
	}
	if err := wal.Close(ctx); err != nil { // no FlushAll: nothing disowned
		t.Fatal(err)
	}
	next := lock.Token{Epoch: solo.logFence.Token.Epoch + 1, Seq: 1}
	wal2, err := txn.Open(ctx, txn.Config{Device: dev, Fence: rldev.Fence{Name: txn.LockName(LogName(1)), Token: next},
		Applier: replayApplier{chunks: chunks, fence: fence}, Manual: true, Log: simLog})
	if err != nil {
		t.Fatal(err)
	}
	defer wal2.Close(ctx)
	store.mu.Lock()
	_, tagged = store.tag[ref.Chunk]
	store.mu.Unlock()
	if tagged {
		t.Fatalf("the open of the log left the committed change's value chunk %v tagged: the start's collection would free it", ref.Chunk)
	}
	if n := collectOrphans(ctx, chunks, nil, OwnerLog(1), next, simLog, "start"); n != 0 {
		t.Fatalf("the start's collection freed %d chunks", n)
	}
}

// TestReview21ClosePutAfterReleaseAllLost (pre-existing, not this
// commit's; found looking at FlushAll's callers): a put that runs after
// Close's ReleaseAll (an RPC already in the server) takes the leaf's
// lease again, commits, and is acknowledged once wal.Close flushes it;
// nothing writes the leaf back (FlushAll is over), the log closes
// cleanly, its lock is released, and the next start opens the log with
// keep == nil: the acknowledged put is gone. Fixed: the close quiesces
// the cache first, and the late put is refused.
func TestReview21ClosePutAfterReleaseAllLost(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := rand.New(rand.NewSource(21))
	locks := newSimLocks(ctx, r)
	store := newSimChunks(r)
	chunks := store.clerk(1, func(context.Context) error { return nil })
	solo := newSoloServer(t, ctx, locks, chunks)
	cache, fence := solo.cache, solo.fence
	dev := newSimDevice(txn.HeaderBlocks + 256)
	wal, err := txn.Open(ctx, txn.Config{Device: dev, Fence: solo.logFence,
		Applier: replayApplier{chunks: chunks, fence: fence}, Checkpointer: cache, LazyInterval: time.Hour, Log: simLog})
	if err != nil {
		t.Fatal(err)
	}
	cache.cfg.Log = wal
	ah, rh := emptyTree(t, ctx, chunks, fence, MinNodeSize)
	tr, err := New(cache.Store(ah, MinNodeSize, nil), ah.ID, Config{NodeSize: MinNodeSize, MaxInline: 13})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Put(ctx, []byte("a"), []byte("1"), Cond{}); err != nil {
		t.Fatal(err)
	}
	cache.Quiesce() // Shutdown's steps, one by one
	if err := cache.FlushAll(ctx); err != nil {
		t.Fatal(err)
	}
	cache.ReleaseAll()
	// The late put: fixed, it is refused (not applied).
	lateErr := func() error { _, err := tr.Put(ctx, []byte("late"), []byte("2"), Cond{}); return err }()
	if !errors.Is(lateErr, ErrNotApplied) {
		t.Fatalf("the late put after the final write-back: %v, want ErrNotApplied", lateErr)
	}
	cache.Close()
	if err := wal.Close(ctx); err != nil {
		t.Fatalf("closing the log: %v", err)
	}
	next := lock.Token{Epoch: solo.logFence.Token.Epoch + 1, Seq: 1}
	wal2, err := txn.Open(ctx, txn.Config{Device: dev, Fence: rldev.Fence{Name: txn.LockName(LogName(1)), Token: next},
		Applier: replayApplier{chunks: chunks, fence: fence}, Manual: true, Log: simLog})
	if err != nil {
		t.Fatal(err)
	}
	defer wal2.Close(ctx)
	b, err := store.clerk(2, func(context.Context) error { return nil }).Read(ctx, rh, MinNodeSize)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := Decode(b, ah.ID, rh)
	if err != nil {
		t.Fatal(err)
	}
	if _, found := leaf.Search([]byte("a")); !found {
		t.Fatalf("the put of \"a\" before the close is not in its chunk (leaf keys %q)", leaf.Keys)
	}
}
