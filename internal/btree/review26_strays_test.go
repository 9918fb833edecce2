package btree

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/chunk"
	"github.com/grovestore/grove/internal/lock"
)

// review26Chunks is the stray rig's chunk clerk with one chunk pair in
// trouble: while hang is set, listing what a log tags does not finish (one
// pair's primary died and its secondary has not taken over yet, or the
// pair is down: chunk.Clerk.Owned retries it until its context ends); an
// allocation of stuckSize bytes does not finish either (it went to that
// pair: the clerk retries it until its caller's context ends). Every other
// allocation is served at once (the other pairs are fine).
type review26Chunks struct {
	*simChunkClerk
	hang      atomic.Bool
	listing   chan struct{} // a listing began (closed once)
	listOnce  atomic.Bool
	stuckSize uint64
}

func (c *review26Chunks) Owned(ctx context.Context, log uint64, below lock.Token) ([]Handle, error) {
	if c.hang.Load() {
		if c.listOnce.CompareAndSwap(false, true) {
			close(c.listing)
		}
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return c.simChunkClerk.Owned(ctx, log, below)
}

func (c *review26Chunks) Allocate(ctx context.Context, size uint64, owner chunk.Owner) (Handle, error) {
	if c.stuckSize != 0 && size == c.stuckSize {
		<-ctx.Done()
		return Handle{}, ctx.Err()
	}
	return c.simChunkClerk.Allocate(ctx, size, owner)
}

// TestReview26ListingHoldsAllocationsBack (outside review 26, failing on
// the first design of the collection, which held allocations back while it
// listed): a stray collection must not hold any owned allocation of its
// server back for as long as its listing of the pairs takes, since that
// listing waits for every pair. The collection runs
// when an allocation's answer was lost — typically because a pair's
// primary died — so it is exactly then that one pair's listing waits (for
// the failover, up to the collection's 30 s context; a pair that stays down:
// every turn again, since a failed collection does not mark the count).
// Meanwhile a put of a large value (and any split) on this server cannot
// allocate, from any pair: the chunk store here serves allocations at once.
func TestReview26ListingHoldsAllocationsBack(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g := newStrayRig(t, ctx, 10)
	rc := &review26Chunks{simChunkClerk: g.chunks, listing: make(chan struct{})}
	g.cache.cfg.Chunks = rc
	g.stray(t, ctx) // a lost answer: the count moved
	rc.hang.Store(true)
	cctx, ccancel := context.WithTimeout(ctx, 1500*time.Millisecond) // the server's loop gives it 30 s
	defer ccancel()
	done := make(chan error, 1)
	go func() {
		_, err := g.cache.CollectStrays(cctx)
		done <- err
	}()
	<-rc.listing
	pctx, pcancel := context.WithTimeout(ctx, time.Second)
	start := time.Now()
	_, err := g.tree.Put(pctx, []byte("big"), bytes.Repeat([]byte("y"), 500), Cond{})
	pcancel()
	took := time.Since(start)
	cerr := <-done
	t.Logf("put of a large value during the listing: %v after %v; the collection: %v", err, took, cerr)
	if err != nil {
		t.Fatalf("a put of a large value failed (%v, after %v) only because a stray collection's listing of one pair was slow: the gate held its allocation back", err, took)
	}
}

// TestReview26StuckAllocationHoldsOthersBack (outside review 26, failing
// on the first design): one owned allocation that does not end (it went to
// a pair that is failing over, or down) made every stray collection hold
// all other allocations back for strayHold (2 s) while it waited for it; a collection that gave up does not mark the
// count, so the loop (collectStraysEvery, a tick every second, one
// buffered while the collection waited) starts the next one at once. Each
// allocation of the server to a healthy pair then waits about 2 s.
func TestReview26StuckAllocationHoldsOthersBack(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g := newStrayRig(t, ctx, 10)
	rc := &review26Chunks{simChunkClerk: g.chunks, listing: make(chan struct{}), stuckSize: MinNodeSize + 1}
	g.cache.cfg.Chunks = rc
	g.stray(t, ctx)                                          // a lost answer: the count moved
	sctx, scancel := context.WithTimeout(ctx, 8*time.Second) // the op's deadline (30 s in a server)
	defer scancel()
	go func() { _, _ = g.cache.allocate(sctx, MinNodeSize+1) }()
	for {
		g.cache.mu.Lock()
		n := len(g.cache.mu.allocating)
		g.cache.mu.Unlock()
		if n == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	lctx, lcancel := context.WithCancel(ctx)
	loopDone := make(chan struct{})
	var failed review26Count
	go func() { collectStraysEvery(lctx, g.cache, StrayEvery, slog.New(&failed)); close(loopDone) }()
	defer func() { lcancel(); <-loopDone }()
	var worst time.Duration
	var total time.Duration
	n := 0
	end := time.Now().Add(3500 * time.Millisecond)
	for time.Now().Before(end) {
		start := time.Now()
		actx, acancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := g.cache.allocate(actx, MinNodeSize)
		acancel()
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatal(err)
		}
		d := time.Since(start)
		if d > 100*time.Millisecond {
			t.Logf("allocation at +%v: %v, %v", start.Sub(end.Add(-3500*time.Millisecond)).Round(time.Millisecond), d.Round(time.Millisecond), err)
		}
		worst, total, n = max(worst, d), total+d, n+1
		time.Sleep(50 * time.Millisecond) // the next split
	}
	t.Logf("%d allocations from a healthy pair in 3.5 s while one allocation was stuck: mean %v, worst %v; %d collections gave up", n, total/time.Duration(n), worst, failed.n.Load())
	if worst > 500*time.Millisecond {
		t.Fatalf("an allocation from a healthy pair waited %v (mean %v over %d) behind stray collections waiting for one stuck allocation", worst, total/time.Duration(n), n)
	}
}

// review26Count counts the warnings logged (failed collections).
type review26Count struct{ n atomic.Int64 }

func (h *review26Count) Enabled(context.Context, slog.Level) bool { return true }
func (h *review26Count) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		h.n.Add(1)
	}
	return nil
}
func (h *review26Count) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *review26Count) WithGroup(string) slog.Handler      { return h }
