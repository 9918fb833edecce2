package btree

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/chunk"
	"github.com/grovestore/grove/internal/lock"
	"github.com/grovestore/grove/internal/rldev"
	"github.com/grovestore/grove/internal/txn"
)

// maybeChunks is the sim chunk clerk whose next value-chunk write fails
// the way the real chunk clerk fails a write whose attempt was sent and
// not answered, then timed out: "<cause> (ErrMaybeDone: an earlier
// attempt may have landed)" (chunk/clerk.go WriteFencedReport). Here the
// lost attempt never lands: the chunk stays zero.
type maybeChunks struct {
	*simChunkClerk
	failNextValue atomic.Bool
}

func (c *maybeChunks) Write(ctx context.Context, h Handle, data []byte, f *rldev.Fence) error {
	if len(data) >= 4 && string(data[:4]) == valueMagic && c.failNextValue.CompareAndSwap(true, false) {
		return fmt.Errorf("writing chunk %v: %w (%w: an earlier attempt may have landed)", h, context.DeadlineExceeded, chunk.ErrMaybeDone)
	}
	return c.simChunkClerk.Write(ctx, h, data, f)
}

// newOneServerTree is one B-tree server's cache (sim lock service, sim
// chunks, sim log) over an empty tree. wrapChunks and wrapLocks (nil:
// none) put a test's stand-in in front of the chunks or the clerk.
func newOneServerTree(t *testing.T, ctx context.Context, wrapChunks func(*simChunkClerk) Chunks, wrapLocks func(*simClerk) Locks, cfg Config) *Tree {
	t.Helper()
	return oneServerTree(t, ctx, wrapChunks, wrapLocks, cfg, false)
}

// oneServerTree is newOneServerTree; renew gives the cache a fence
// renewal that takes the fence lock again (a newer token), as a server's.
func oneServerTree(t *testing.T, ctx context.Context, wrapChunks func(*simChunkClerk) Chunks, wrapLocks func(*simClerk) Locks, cfg Config, renew bool) *Tree {
	t.Helper()
	r := rand.New(rand.NewSource(1))
	locks := newSimLocks(ctx, r)
	raw := newSimChunks(r).clerk(1, func(context.Context) error { return nil })
	var chunks Chunks = raw
	if wrapChunks != nil {
		chunks = wrapChunks(raw)
	}
	sc := locks.newClerk(1, func(context.Context, lock.Recovery) error { return nil })
	var clerk Locks = sc
	if wrapLocks != nil {
		clerk = wrapLocks(sc)
	}
	fh, err := clerk.Acquire(ctx, FenceLock(1), lock.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	var held atomic.Pointer[Hold]
	held.Store(&fh)
	fence := func() *rldev.Fence { return &rldev.Fence{Name: FenceLock(1), Token: (*held.Load()).Token()} }
	renewal := func(context.Context) error { return errors.New("one server: no renewal") }
	if renew {
		var mu sync.Mutex
		renewal = func(ctx context.Context) error {
			mu.Lock()
			defer mu.Unlock()
			(*held.Load()).Release()
			if err := sc.drop(FenceLock(1)); err != nil {
				return err
			}
			h, err := clerk.Acquire(ctx, FenceLock(1), lock.Exclusive)
			if err != nil {
				return err
			}
			held.Store(&h)
			return nil
		}
	}
	lh, err := clerk.Acquire(ctx, txn.LockName(LogName(1)), lock.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	cache := NewCache(CacheConfig{Locks: clerk, Chunks: chunks, Fence: fence, Renew: renewal, Log2: simLog})
	t.Cleanup(cache.Close)
	wal, err := txn.Open(ctx, txn.Config{Device: newSimDevice(txn.HeaderBlocks + 64), Fence: rldev.Fence{Name: txn.LockName(LogName(1)), Token: lh.Token()},
		Applier: replayApplier{chunks: chunks, fence: fence}, Checkpointer: cache, Log: simLog})
	if err != nil {
		t.Fatal(err)
	}
	cache.cfg.Log = wal
	ah, _ := emptyTree(t, ctx, chunks, fence, MinNodeSize)
	if cfg.NodeSize == 0 {
		cfg.NodeSize = MinNodeSize
	}
	tr, err := New(cache.Store(ah, MinNodeSize, nil), ah.ID, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// TestReview6ValueWriteMaybeDoneIsNotDurable: TreeStore.WriteValue takes
// chunk.ErrMaybeDone for success. The real clerk returns it for a write
// that FAILED after an attempt was sent and not answered (it may or may not
// have landed); chunkStore.Write also uses it for a success whose earlier
// attempt may still land. Taking both for success lets the leaf commit a
// reference to a chunk that never received the value: the put is
// acknowledged (Applied, nil error) and the key is then unreadable.
func TestReview6ValueWriteMaybeDoneIsNotDurable(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mc *maybeChunks
	tr := newOneServerTree(t, ctx, func(c *simChunkClerk) Chunks {
		mc = &maybeChunks{simChunkClerk: c}
		return mc
	}, nil, Config{})
	key, val := []byte("big"), bytes.Repeat([]byte("v"), 4000) // past MaxInline: a chunk of its own
	mc.failNextValue.Store(true)
	res, err := tr.Put(ctx, key, val, Cond{})
	if err != nil {
		t.Logf("put failed (%v): acceptable, nothing acknowledged", err)
		return
	}
	if !res.Applied {
		t.Fatalf("put: not applied, no error")
	}
	got, ok, err := tr.Get(ctx, key)
	if err != nil || !ok || !bytes.Equal(got, val) {
		t.Fatalf("an acknowledged put (Applied, nil error) is not readable: get = %d bytes, found %v, err %v", len(got), ok, err)
	}
}

// TestReview6ScanByteBoundHiPastMaxKey: a page that the byte bound ends
// early reports Hi = last key + 0x00. With a last key of MaxKey bytes that
// is MaxKey+1 bytes, and the next page (From = Hi, as client.Tree.Scan and
// EtcdKV.Range continue) is refused with ErrKey. Before MaxScanBytes, only
// a page full at its limit ended that way, and both callers stop there.
func TestReview6ScanByteBoundHiPastMaxKey(t *testing.T) {
	ctx := context.Background()
	tr, _, _ := newMemTree(t, Config{MaxScanBytes: 8 << 10})
	val := bytes.Repeat([]byte("x"), 5000) // in a chunk of its own
	var want [][]byte
	for i := 0; i < 4; i++ {
		k := bytes.Repeat([]byte{byte('a' + i)}, MaxKey)
		if _, err := tr.Put(ctx, k, val, Cond{}); err != nil {
			t.Fatal(err)
		}
		want = append(want, k)
	}
	// Iterate as client.Tree.Scan does (limit 0).
	var got [][]byte
	from := []byte(nil)
	for pages := 0; ; pages++ {
		pg, err := tr.Scan(ctx, Span{From: from}, 0, false)
		if err != nil {
			t.Fatalf("page %d (from a %d-byte key): %v", pages, len(from), err)
		}
		got = append(got, pg.Keys...)
		if !pg.More {
			break
		}
		from = pg.Hi
	}
	if len(got) != len(want) {
		t.Fatalf("scan returned %d keys, want %d", len(got), len(want))
	}
}

// starveStore is a MemStore whose every every-th value read (the first
// of each page attempt, with every = pageExt) is preceded by one overwrite
// of key from another goroutine: a single writer that updates one key of
// the range once per read attempt. The writer overwrites at once unless a
// lock the reader holds stops it (then it lands after).
type starveStore struct {
	*MemStore
	tr      *Tree
	key     []byte
	val     func() []byte
	every   int64
	reads   atomic.Int64
	writing atomic.Bool
}

func (s *starveStore) ReadValue(ctx context.Context, r ValueRef) ([]byte, error) {
	if s.tr != nil && s.reads.Add(1)%s.every == min(1, s.every-1) && s.writing.CompareAndSwap(false, true) {
		done := make(chan struct{})
		go func() {
			defer close(done)
			defer s.writing.Store(false)
			_, _ = s.tr.Put(context.WithoutCancel(ctx), s.key, s.val(), Cond{})
		}()
		// The overwrite lands first unless a lock the reader holds stops
		// it. The wait is long enough for an overwrite that is not
		// stopped to land even on a loaded CI machine (a short one let it
		// land after the read there: too few restarts).
		select {
		case <-done:
		case <-time.After(500 * time.Millisecond):
		}
	}
	return s.MemStore.ReadValue(ctx, r)
}

const pageExt = 8

// newStarveTree is a tree of n keys 'a'.. with 3000-byte values (each in
// a chunk of its own) whose store overwrites the last one before every
// every-th value read from then on.
func newStarveTree(t *testing.T, n int, every int64) (*Tree, *starveStore) {
	t.Helper()
	ctx := context.Background()
	ms, id := NewMemStore(nil)
	st := &starveStore{MemStore: ms, every: every}
	tr, err := New(st, id, Config{})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		if _, err := tr.Put(ctx, []byte{byte('a' + i)}, bytes.Repeat([]byte("y"), 3000), Cond{}); err != nil {
			t.Fatal(err)
		}
	}
	var next atomic.Int64
	st.tr, st.key = tr, []byte{byte('a' + n - 1)}
	st.val = func() []byte { return bytes.Repeat([]byte{byte('a' + next.Add(1)%26)}, 3000) }
	return tr, st
}

// TestReview6ScanStarvedByOneWriter: resolve reads a page's values one by
// one after the page's locks are released, and a single chunk freed
// meanwhile restarts the whole page. One overwrite per page attempt, of
// any key of the page not read yet, starves the scan: it fails after
// maxRestarts attempts, having read maxRestarts pages of values. Get of
// the same keys, each alone, would succeed.
func TestReview6ScanStarvedByOneWriter(t *testing.T) {
	tr, _ := newStarveTree(t, pageExt, pageExt)
	_, err := tr.Scan(context.Background(), Span{}, 0, false)
	if err != nil {
		t.Fatalf("a scan of %d keys failed after %d restarts (one overwrite per attempt): %v", pageExt, tr.Stats.Restarts.Load(), err)
	}
}

// TestReview6StatWalkFailsUnderOneOverwrite: Service.Stat walks the live
// tree through the server's store (Walk over a TreeStore), and Walk now
// reads every value chunk: it reads the whole data set, and one overwrite
// or delete while it runs frees a chunk it has yet to read, failing the
// Stat (before, a live walk met freed nodes only past their grace). Stat
// now walks without reading values.
func TestReview6StatWalkFailsUnderOneOverwrite(t *testing.T) {
	_, st := newStarveTree(t, pageExt, pageExt)
	sh, err := WalkStructure(context.Background(), st, false)
	if err != nil {
		t.Fatalf("a walk of a live tree (Service.Stat) failed after one concurrent overwrite: %v", err)
	}
	if sh.Values != pageExt {
		t.Fatalf("the walk counted %d values in chunks, want %d", sh.Values, pageExt)
	}
}

// slowDurable is a MemStore whose armed Durable reports the op's deadline
// (the commit is in the log and becomes durable moments later, as a
// TreeStore's Log.Flush(ctx) that outlives OpTimeout does).
type slowDurable struct {
	*MemStore
	armed atomic.Bool
}

func (s *slowDurable) Durable(ctx context.Context, lsn uint64) error {
	if s.armed.CompareAndSwap(true, false) {
		return context.DeadlineExceeded
	}
	return s.MemStore.Durable(ctx, lsn)
}

// TestReview6DeadlineInDurableLeaksForever: an overwrite whose Durable
// outlives the op's deadline is reported with an unknown outcome, and its
// old value chunk stays allocated for good, although the change commits
// (nothing ever settles it later, and no pass reclaims unnamed value
// chunks: a drop frees only those the leaves name).
func TestReview6DeadlineInDurableLeaksForever(t *testing.T) {
	ctx := context.Background()
	ms, id := NewMemStore(nil)
	st := &slowDurable{MemStore: ms}
	tr, err := New(st, id, Config{})
	if err != nil {
		t.Fatal(err)
	}
	big := func(c byte) []byte { return bytes.Repeat([]byte{c}, 3000) }
	if _, err := tr.Put(ctx, []byte("k"), big('1'), Cond{}); err != nil {
		t.Fatal(err)
	}
	st.armed.Store(true)
	if _, err := tr.Put(ctx, []byte("k"), big('2'), Cond{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("put: %v", err)
	}
	// The change did commit: the tree holds the new value.
	if v, ok, err := tr.Get(ctx, []byte("k")); err != nil || !ok || v[0] != '2' {
		t.Fatalf("get: %v %v", ok, err)
	}
	// Later operations on the key settle nothing of the old one.
	if _, err := tr.Put(ctx, []byte("k"), big('3'), Cond{}); err != nil {
		t.Fatal(err)
	}
	sh, err := Walk(ctx, ms, true)
	if err != nil {
		t.Fatal(err)
	}
	for h := range ms.Chunks() {
		if !sh.Chunks[h] {
			t.Fatalf("value chunk %v is allocated, named by no leaf, and nothing will ever free it (ValueLeaks %d)", h, tr.Stats.ValueLeaks.Load())
		}
	}
}

// TestGetNotStarvedByOverwrites: a get whose value chunk every overwrite
// frees under it reads it under the leaf's lock after two tries, and
// returns a value that was current during the call.
func TestGetNotStarvedByOverwrites(t *testing.T) {
	tr, _ := newStarveTree(t, 1, 1)
	v, ok, err := tr.Get(context.Background(), []byte("a"))
	if err != nil || !ok || len(v) != 3000 {
		t.Fatalf("get under overwrites: %d bytes, %v, %v (restarts %d)", len(v), ok, err, tr.Stats.Restarts.Load())
	}
	if r := tr.Stats.Restarts.Load(); r < 2 {
		t.Fatalf("%d restarts: the overwrites did not reach the get", r)
	}
}
