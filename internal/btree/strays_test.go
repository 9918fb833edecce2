package btree

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/chunk"
)

// strayRig is a live B-tree server (node 1) on simulated chunks whose
// allocations carry its owner tag, with a tree of keys keys in fanout-6
// nodes and a value of its own chunk: its cache knows unlinked chunks (the
// pool's) and linked ones (a lazy log: no checkpoint disowned them yet).
type strayRig struct {
	store  *simChunks
	chunks *simChunkClerk
	cache  *Cache
	tree   *Tree
	owner  chunk.Owner
}

func newStrayRig(t *testing.T, ctx context.Context, keys int) *strayRig {
	t.Helper()
	store, chunks, solo, owner := newLoggedSolo(t, ctx, 1, nil)
	ah, _ := emptyTree(t, ctx, chunks, solo.fence, MinNodeSize)
	tr, err := New(solo.cache.Store(ah, MinNodeSize, nil), ah.ID, Config{NodeSize: MinNodeSize, MaxFanout: 6, MaxInline: 64})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < keys; i++ {
		v := []byte("v")
		if i == 7 {
			v = bytes.Repeat([]byte("x"), 500) // a value in a chunk of its own
		}
		if _, err := tr.Put(ctx, []byte(fmt.Sprintf("k%03d", i)), v, Cond{}); err != nil {
			t.Fatal(err)
		}
	}
	for start := time.Now(); solo.cache.Pooled() == 0; time.Sleep(time.Millisecond) { // the splits' refills
		if time.Since(start) > 10*time.Second {
			t.Fatal("the node pool was not refilled")
		}
	}
	// The refill goes on to the pool's size: it must be over before a test
	// puts another clerk in cfg.Chunks, which it reads unlocked (a CI run
	// crashed on a torn read of the interface: the new clerk's method on
	// the old clerk's pointer).
	solo.cache.refills.Wait()
	return &strayRig{store: store, chunks: chunks, cache: solo.cache, tree: tr, owner: owner}
}

// tagged lists the chunks tagged with the rig's owner.
func (g *strayRig) tagged() map[Handle]bool {
	g.store.mu.Lock()
	defer g.store.mu.Unlock()
	out := map[Handle]bool{}
	for h, o := range g.store.tag {
		if o == g.owner && g.store.data[h] != nil {
			out[h] = true
		}
	}
	return out
}

// stray leaves a chunk tagged with the owner that no allocation returned,
// and counts it at the cache's clerk, as a lost answer does.
func (g *strayRig) stray(t *testing.T, ctx context.Context) Handle {
	t.Helper()
	h, err := g.store.clerk(1, func(context.Context) error { return nil }).Allocate(ctx, MinNodeSize, g.owner)
	if err != nil {
		t.Fatal(err)
	}
	g.chunks.strays.Add(1)
	return h
}

// TestCollectStraysFreesOnlyWhatNobodyKnows: a live server's stray
// collection frees the chunk an allocation whose answer was lost left, and
// none of the chunks its cache knows (pooled, handed out, linked and not
// disowned yet); it runs only when the clerk's count moved.
func TestCollectStraysFreesOnlyWhatNobodyKnows(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g := newStrayRig(t, ctx, 60)
	g.cache.mu.Lock()
	unlinked, links := len(g.cache.mu.unlinked), len(g.cache.mu.links)
	g.cache.mu.Unlock()
	if unlinked == 0 || links == 0 {
		t.Fatalf("the rig knows %d unlinked chunks and %d linked ones; want some of both", unlinked, links)
	}
	if n, err := g.cache.CollectStrays(ctx); n != 0 || err != nil {
		t.Fatalf("a collection with no lost answer: freed %d, %v", n, err)
	}
	before := g.tagged()
	s := g.stray(t, ctx)
	n, err := g.cache.CollectStrays(ctx)
	if err != nil || n != 1 {
		t.Fatalf("collection: freed %d, %v; want the one stray", n, err)
	}
	after := g.tagged()
	if after[s] {
		t.Fatalf("the stray %v is still allocated", s)
	}
	for h := range before {
		if !after[h] {
			t.Fatalf("chunk %v, which the cache knows, was freed", h)
		}
	}
	for i := 0; i < 60; i++ {
		if _, ok, err := g.tree.Get(ctx, []byte(fmt.Sprintf("k%03d", i))); !ok || err != nil {
			t.Fatalf("k%03d after the collection: %v, %v", i, ok, err)
		}
	}
	// The count has not moved since: the next turn lists nothing.
	g.stray(t, ctx)
	g.chunks.strays.Add(^uint64(0))
	if n, err := g.cache.CollectStrays(ctx); n != 0 || err != nil {
		t.Fatalf("a collection with the count unmoved: freed %d, %v", n, err)
	}
	if got := g.cache.Stats().Strays; got != 1 {
		t.Fatalf("Stats().Strays = %d, want 1", got)
	}
}

// slowAllocs holds an allocation of holdSize bytes, made and tagged at its
// manager, before its answer comes back, until release closes.
type slowAllocs struct {
	*simChunkClerk
	holdSize      uint64
	made, release chan struct{}
}

func (c *slowAllocs) Allocate(ctx context.Context, size uint64, owner chunk.Owner) (Handle, error) {
	h, err := c.simChunkClerk.Allocate(ctx, size, owner)
	if size == c.holdSize {
		close(c.made)
		<-c.release
	}
	return h, err
}

// TestCollectStraysWaitsForAllocations: a chunk allocated and tagged whose
// answer is on its way when a collection lists is not a stray: the
// collection waits for every allocation begun before its listing answered
// and counts what they return as known. Allocations are not held back
// meanwhile: one begun during the wait ends at once.
func TestCollectStraysWaitsForAllocations(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g := newStrayRig(t, ctx, 10)
	slow := &slowAllocs{simChunkClerk: g.chunks, holdSize: MinNodeSize + 1, made: make(chan struct{}), release: make(chan struct{})}
	g.cache.cfg.Chunks = slow
	// The goroutines report errors on their channels, not with t.Error:
	// they may outlive a test that failed (then nothing reads them).
	type handleErr struct {
		h   Handle
		err error
	}
	type countErr struct {
		n   int
		err error
	}
	got := make(chan handleErr, 1)
	go func() {
		h, err := g.cache.allocate(ctx, MinNodeSize+1)
		got <- handleErr{h, err}
	}()
	<-slow.made
	s := g.stray(t, ctx)
	done := make(chan countErr, 1)
	go func() {
		n, err := g.cache.CollectStrays(ctx)
		done <- countErr{n, err}
	}()
	select {
	case r := <-done:
		t.Fatalf("the collection ended (freed %d, %v) while an allocation begun before its listing was under way", r.n, r.err)
	case <-time.After(100 * time.Millisecond):
	}
	// An allocation held back would wait for the release below: it is
	// bounded instead (generously: a loaded CI machine stalls for tens of
	// milliseconds).
	actx, acancel := context.WithTimeout(ctx, 5*time.Second)
	start := time.Now()
	_, err := g.cache.allocate(actx, MinNodeSize)
	acancel()
	if err != nil {
		t.Fatalf("an allocation during the collection's wait: %v after %v (held back?)", err, time.Since(start))
	}
	close(slow.release)
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	h := r.h
	if c := <-done; c.err != nil || c.n != 1 {
		t.Fatalf("freed %d (%v), want the one stray", c.n, c.err)
	}
	tagged := g.tagged()
	if !tagged[h] {
		t.Fatalf("chunk %v, listed while its allocation's answer was on its way, was freed", h)
	}
	if tagged[s] {
		t.Fatalf("the stray %v is still allocated", s)
	}
}

// downPair is a chunk clerk whose pair is down for frees: the first free
// of each chunk in fail fails at once; while hang is set, every free lasts
// until its context ends (the clerk retries until then).
type downPair struct {
	*simChunkClerk
	fail map[Handle]bool
	hang bool
}

func (c *downPair) Free(ctx context.Context, h Handle) error {
	if c.fail[h] {
		delete(c.fail, h)
		return errors.New("the chunk's pair is down")
	}
	if c.hang {
		<-ctx.Done()
		return ctx.Err()
	}
	return c.simChunkClerk.Free(ctx, h)
}

// TestRefreeFailed: a chunk the server gave back whose free failed (its
// pair down) stays in the unlinked set, where the stray collection leaves
// it alone; the server's loop frees it again (RefreeFailed) instead of
// leaving it to the log's next holder.
func TestRefreeFailed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g := newStrayRig(t, ctx, 10)
	h, err := g.cache.allocate(ctx, MinNodeSize)
	if err != nil {
		t.Fatal(err)
	}
	g.cache.cfg.Chunks = &downPair{simChunkClerk: g.chunks, fail: map[Handle]bool{h: true}}
	if err := g.cache.free(ctx, h); err == nil {
		t.Fatal("the first free did not fail")
	}
	g.chunks.strays.Add(1)
	if n, err := g.cache.CollectStrays(ctx); n != 0 || err != nil {
		t.Fatalf("the stray collection: freed %d, %v (the chunk is one the server knows)", n, err)
	}
	if !g.tagged()[h] {
		t.Fatalf("chunk %v was freed by the stray collection", h)
	}
	if n, err := g.cache.RefreeFailed(ctx); n != 1 || err != nil {
		t.Fatalf("RefreeFailed: %d, %v; want 1", n, err)
	}
	if g.tagged()[h] {
		t.Fatalf("chunk %v is still allocated", h)
	}
	if n, err := g.cache.RefreeFailed(ctx); n != 0 || err != nil {
		t.Fatalf("RefreeFailed again: %d, %v; want nothing to do", n, err)
	}
}

// TestGiveBackIsBounded: a chunk the server gives back outside its
// caller's context (a value whose write failed, a node a split could not
// use, a refill that ended late) is freed under a bounded context of its
// own: a pair that is down holds neither the operation nor a close up for
// ever (before: context.Background or WithoutCancel), and the failed free
// is tried again by the server's loop.
func TestGiveBackIsBounded(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g := newStrayRig(t, ctx, 10)
	h, err := g.cache.allocate(ctx, MinNodeSize)
	if err != nil {
		t.Fatal(err)
	}
	defer func(w time.Duration) { giveBackWait = w }(giveBackWait)
	giveBackWait = 200 * time.Millisecond
	hf := &downPair{simChunkClerk: g.chunks, hang: true}
	g.cache.cfg.Chunks = hf
	start := time.Now()
	if err := g.cache.giveBack(h); err == nil {
		t.Fatal("a give-back to a pair that is down succeeded")
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("the give-back took %v (bound %v)", took, giveBackWait)
	}
	hf.hang = false
	if n, err := g.cache.RefreeFailed(ctx); n != 1 || err != nil {
		t.Fatalf("RefreeFailed: %d, %v; want the chunk freed", n, err)
	}
	if g.tagged()[h] {
		t.Fatalf("chunk %v is still allocated", h)
	}
}
