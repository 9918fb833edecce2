package btree

import (
	"context"
	"errors"
	"math/rand"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/lock"
	"github.com/grovestore/grove/internal/rldev"
	"github.com/grovestore/grove/internal/txn"
)

// Review (an outside review, 2026-11-26; failed before the fix): a checkpoint can move the log's head past a committed change
// whose image the cache has not published (hence not marked dirty) yet.
// Cache.commit appends the commit record (tx.Commit, lazy) and only then,
// under c.mu, publishes the images and sets dirty/recLSN. If, in between,
// the commit record is flushed, the transaction leaves the log's active
// set, and a checkpoint computes its target past it and takes
// Cache.WriteBack's snapshot, the node is neither written back nor kept in
// the log. The put is acknowledged (its commit is durable); a crash before
// the next write-back of that node loses it.
//
// The interleaving is forced without touching non-test code: GOMAXPROCS 1,
// the committer parked first in the log's wait for space (between commit's
// two c.mu sections), then on c.mu, which the test holds; the test then
// releases c.mu and runs the real Checkpoint (real Cache.WriteBack) without
// yielding, so it takes c.mu before the woken committer runs.

// reviewGateDevice blocks one header write (blocks 0 and 1) while armed.
type reviewGateDevice struct {
	*simDevice
	mu      sync.Mutex
	armed   bool
	arrived chan struct{}
	release chan struct{}
}

func (d *reviewGateDevice) Write(ctx context.Context, block uint64, data []byte, f *rldev.Fence) error {
	d.mu.Lock()
	hold := d.armed && block < 2
	if hold {
		d.armed = false
	}
	d.mu.Unlock()
	if hold {
		close(d.arrived)
		<-d.release
	}
	return d.simDevice.Write(ctx, block, data, f)
}

// reviewGateCkpt is the cache as the log's checkpointer, switched off while
// pass is false (a checkpoint then fails, harmlessly: the head stays).
type reviewGateCkpt struct {
	c    *Cache
	pass atomic.Bool
}

func (g *reviewGateCkpt) WriteBack(ctx context.Context, upTo txn.LSN) error {
	if !g.pass.Load() {
		return errors.New("review: checkpoints held off")
	}
	return g.c.WriteBack(ctx, upTo)
}

func TestReviewCheckpointOutrunsCommitPublish(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := rand.New(rand.NewSource(1))
	locks := newSimLocks(ctx, r)
	store := newSimChunks(r)
	chunks := store.clerk(1, func(context.Context) error { return nil })
	solo := newSoloServer(t, ctx, locks, chunks)
	cache, fence := solo.cache, solo.fence
	const ring = 16
	dev := &reviewGateDevice{simDevice: newSimDevice(txn.HeaderBlocks + ring), arrived: make(chan struct{}), release: make(chan struct{})}
	ck := &reviewGateCkpt{c: cache}
	wal, err := txn.Open(ctx, txn.Config{Device: dev, Fence: solo.logFence,
		Applier: replayApplier{chunks: chunks, fence: fence}, Checkpointer: ck, CheckpointAt: 0.9, LazyInterval: time.Hour, Log: simLog})
	if err != nil {
		t.Fatal(err)
	}
	cache.cfg.Log = wal

	// An empty tree, as CreateTree makes one.
	nodeSize := MinNodeSize
	ah, rh := emptyTree(t, ctx, chunks, fence, nodeSize)
	tr, err := New(cache.Store(ah, nodeSize, nil), ah.ID, Config{NodeSize: nodeSize})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Put(ctx, []byte("a"), []byte("1"), Cond{}); err != nil {
		t.Fatal(err)
	}

	// Fill the ring (other committed, durable transactions) so that the
	// next update waits for space.
	for wal.Stats().UsedBlocks < ring-1 {
		tx := wal.Begin()
		// Redo-only, as the tree's own: an update with undo sets aside
		// its compensation and a block of padding (txn's padAllowance),
		// and the last fillers did not fit.
		if _, err := tx.Update(ctx, []byte("review-filler"), 0, make([]byte, 64), nil); err != nil {
			t.Fatal(err)
		}
		end, err := tx.Commit(ctx, false)
		if err != nil {
			t.Fatal(err)
		}
		if err := wal.Flush(ctx, end); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(50 * time.Millisecond) // stray checkpoints (held off) settle

	// K1: a checkpoint that writes "a"'s leaf back and stops in its header
	// write.
	dev.mu.Lock()
	dev.armed = true
	dev.mu.Unlock()
	ck.pass.Store(true)
	go func() { _ = wal.Checkpoint(ctx) }()
	<-dev.arrived
	ck.pass.Store(false)

	// G: a put; it passes commit's first c.mu section and waits for log space.
	commits0 := wal.Stats().Commits
	type res struct {
		r   Result
		err error
	}
	done := make(chan res, 1)
	go func() {
		pctx, pcancel := context.WithTimeout(ctx, 10*time.Second)
		defer pcancel()
		r, err := tr.Put(pctx, []byte("b"), []byte("2"), Cond{})
		done <- res{r, err}
	}()
	time.Sleep(50 * time.Millisecond)
	if wal.Stats().Commits != commits0 || len(done) != 0 {
		t.Skip("review: the put did not wait for log space; interleaving not reproduced")
	}

	// Hold c.mu; let K1 finish (space): G appends its update and commit
	// record and parks on c.mu before publishing.
	cache.mu.Lock()
	close(dev.release)
	time.Sleep(50 * time.Millisecond)
	if len(done) != 0 {
		cache.mu.Unlock()
		t.Skip("review: the put finished under c.mu; interleaving not reproduced")
	}
	if wal.Stats().Commits == commits0 {
		// The fix: the commit record's append waits for c.mu, so the
		// checkpoint below sees the put's transaction open, or its node
		// dirty; never neither.
		t.Log("the put's commit record waits for c.mu (its append and the publish are one step)")
	}
	// Release c.mu and checkpoint at once (no yield: G is runnable, not
	// running): the real Checkpoint flushes G's commit and snapshots dirty
	// nodes before G publishes.
	gc := debug.SetGCPercent(-1)
	ck.pass.Store(true)
	cache.mu.Unlock()
	cerr := wal.Checkpoint(ctx)
	ck.pass.Store(false)
	debug.SetGCPercent(gc)
	if cerr != nil {
		t.Fatalf("checkpoint: %v", cerr)
	}
	out := <-done
	if out.err != nil || !out.r.Applied {
		t.Fatalf("put b: %+v %v", out.r, out.err)
	}
	cache.mu.Lock()
	e := cache.mu.m[rh]
	dirty, recLSN := e.dirty, e.recLSN
	cache.mu.Unlock()
	head := wal.Stats().Head
	t.Logf("put b acknowledged; its leaf dirty %v with recLSN %d, the log's head %d", dirty, recLSN, head)

	// The server dies now (nothing more is written back); another server
	// replays its log under a newer token, for every lease it held.
	rep, err := ReplayDead(ctx, dev.simDevice, lock.Recovery{Dead: lock.ClerkID{Node: 1}, Names: []string{LockName(ah), LockName(rh), txn.LockName(LogName(1))},
		Token: lock.Token{Epoch: 2, Seq: 1}}, chunks)
	if err != nil {
		t.Fatal(err)
	}
	b, err := chunks.Read(ctx, rh, uint64(nodeSize))
	if err != nil {
		t.Fatal(err)
	}
	n, err := Decode(b, ah.ID, rh)
	if err != nil {
		t.Fatal(err)
	}
	_, hasA := n.Search([]byte("a"))
	_, hasB := n.Search([]byte("b"))
	t.Logf("after recovery (records %d, redone %d): leaf holds a %v, b %v", rep.Records, rep.Redone, hasA, hasB)
	if !hasB {
		t.Fatalf("DEFECT: the acknowledged put of b is lost: checkpoint moved the head past its commit before the cache published (and dirtied) the image")
	}
}
