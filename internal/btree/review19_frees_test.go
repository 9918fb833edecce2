package btree

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/lock"
	"github.com/grovestore/grove/internal/txn"
)

// Outside review 19 (commit 1cbbe92: free records in the update's own
// change).

// r19Chunks fails Free for chosen chunks (their chunk manager pair does
// not answer, or answers with an error that does not go away).
type r19Chunks struct {
	*simChunkClerk
	mu   sync.Mutex
	fail map[Handle]bool
}

var errR19Free = errors.New("review19: the value chunk's chunk manager does not answer")

func (c *r19Chunks) Free(ctx context.Context, h Handle) error {
	c.mu.Lock()
	f := c.fail[h]
	c.mu.Unlock()
	if f {
		return errR19Free
	}
	return c.simChunkClerk.Free(ctx, h)
}

func (c *r19Chunks) setFail(h Handle, on bool) {
	c.mu.Lock()
	c.fail[h] = on
	c.mu.Unlock()
}

type r19World struct {
	store  *simChunks
	chunks *r19Chunks
	cache  *Cache
	wal    *txn.Log
	dev    *simDevice
	tr     *Tree
	ah, rh Handle
}

// r19Setup: one server (node 1) over a manual log of ring blocks, an empty
// tree whose values longer than a few bytes go to chunks of their own.
func r19Setup(t *testing.T, ctx context.Context, ring uint64) *r19World {
	t.Helper()
	r := rand.New(rand.NewSource(19))
	locks := newSimLocks(ctx, r)
	store := newSimChunks(r)
	chunks := &r19Chunks{simChunkClerk: store.clerk(1, func(context.Context) error { return nil }), fail: map[Handle]bool{}}
	solo := newSoloServer(t, ctx, locks, chunks)
	cache, fence := solo.cache, solo.fence
	dev := newSimDevice(txn.HeaderBlocks + ring)
	wal, err := txn.Open(ctx, txn.Config{Device: dev, Fence: solo.logFence,
		Applier: replayApplier{chunks: chunks, fence: fence}, Checkpointer: cache, Manual: true, LazyInterval: time.Hour, Log: simLog})
	if err != nil {
		t.Fatal(err)
	}
	cache.cfg.Log = wal
	ah, rh := emptyTree(t, ctx, chunks, fence, MinNodeSize)
	tr, err := New(cache.Store(ah, MinNodeSize, nil), ah.ID, Config{NodeSize: MinNodeSize, MaxInline: 13})
	if err != nil {
		t.Fatal(err)
	}
	return &r19World{store: store, chunks: chunks, cache: cache, wal: wal, dev: dev, tr: tr, ah: ah, rh: rh}
}

func (w *r19World) ref(t *testing.T, ctx context.Context, key string) Handle {
	t.Helper()
	_, ref, ok, err := w.tr.getRef(ctx, []byte(key))
	if err != nil || !ok || ref == nil {
		t.Fatalf("get %q: ok %v ref %v err %v", key, ok, ref, err)
	}
	return ref.Chunk
}

func (w *r19World) allocated(h Handle) bool {
	w.store.mu.Lock()
	defer w.store.mu.Unlock()
	_, ok := w.store.data[h]
	return ok
}

// TestReview19UnfreeableValueStallsLog: one value chunk whose free keeps
// failing (its chunk manager pair down, or a lasting error). Review 19
// found that it failed every checkpoint of its server (so the log's head
// never moved and updates of unrelated keys failed with ErrLogFull) and
// the recovery run of that server's log (the dead server's leases stayed
// held). Now the checkpoint goes on without it and tries again at each
// later one (it succeeds once the chunk manager answers), and a replay
// tries a few times, then lets the chunk leak rather than fail the run.
func TestReview19UnfreeableValueStallsLog(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := r19Setup(t, ctx, 24)
	big := func(i int) []byte { return []byte(fmt.Sprintf("value-%04d-%s", i, strings.Repeat("x", 40))) }
	if _, err := w.tr.Put(ctx, []byte("k"), big(0), Cond{}); err != nil {
		t.Fatal(err)
	}
	v1 := w.ref(t, ctx, "k")
	w.chunks.setFail(v1, true)
	if _, err := w.tr.Put(ctx, []byte("k"), big(1), Cond{}); err != nil {
		t.Fatal(err)
	}
	if n := w.tr.Stats.ValueLeaks.Load(); n != 1 {
		t.Fatalf("the update's own free of %v: %d leaks counted, want 1", v1, n)
	}
	if err := w.wal.Checkpoint(ctx); err != nil {
		t.Fatalf("checkpoint with %v unfreeable: %v", v1, err)
	}
	// Unrelated keys, inline values, a checkpoint before each put (as the
	// log would start one): the head moves, nothing fills the log.
	head0 := w.wal.Stats().Head
	for i := 0; i < 200; i++ {
		if err := w.wal.Checkpoint(ctx); err != nil {
			t.Fatalf("checkpoint %d: %v", i, err)
		}
		if _, err := w.tr.Put(ctx, []byte(fmt.Sprintf("u%03d", i)), []byte("s"), Cond{}); err != nil {
			t.Fatalf("put %d of an unrelated key: %v", i, err)
		}
	}
	if head := w.wal.Stats().Head; head == head0 {
		t.Fatalf("the head never moved from %d", head0)
	}
	if st := w.cache.Stats(); st.FreeRetries < 2 || !w.allocated(v1) {
		t.Fatalf("%d failed tries of %v's free (allocated %v)", st.FreeRetries, v1, w.allocated(v1))
	}
	// The chunk manager answers again: the next checkpoint frees it.
	w.chunks.setFail(v1, false)
	if err := w.wal.Checkpoint(ctx); err != nil {
		t.Fatal(err)
	}
	if w.allocated(v1) || w.cache.Stats().LoggedFrees != 1 {
		t.Fatalf("%v: allocated %v after the chunk manager came back (%d logged frees)", v1, w.allocated(v1), w.cache.Stats().LoggedFrees)
	}

	// Another unfreeable value, and the server dies with its record in
	// the log: the recovery run succeeds (the chunk leaks, logged).
	if _, err := w.tr.Put(ctx, []byte("k2"), big(2), Cond{}); err != nil {
		t.Fatal(err)
	}
	v2 := w.ref(t, ctx, "k2")
	w.chunks.setFail(v2, true)
	if _, err := w.tr.Put(ctx, []byte("k2"), big(3), Cond{}); err != nil {
		t.Fatal(err)
	}
	rec := lock.Recovery{Dead: lock.ClerkID{Node: 1}, All: true, Token: lock.Token{Epoch: 2, Seq: 1}}
	if _, err := ReplayDead(ctx, w.dev, rec, w.chunks); err != nil {
		t.Fatalf("replay with %v unfreeable: %v (want it to go on, the chunk leaking)", v2, err)
	}
	if !w.allocated(v2) {
		t.Fatalf("%v freed though its free fails", v2)
	}
}

// TestReview19ReplayFreesOutsideKeep: the free record of a change whose
// leaf the dead server gave up (written back; the run does not keep it) is
// applied, and again by a second run: safe, the leaf's image names the new
// value, which stays readable. (A confirmation, not a defect.)
func TestReview19ReplayFreesOutsideKeep(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := r19Setup(t, ctx, 64)
	w.tr.logFreesOnly = true // the update never frees the old chunk itself
	v := func(i int) []byte { return []byte(fmt.Sprintf("value-%04d-%s", i, strings.Repeat("y", 40))) }
	if _, err := w.tr.Put(ctx, []byte("k"), v(0), Cond{}); err != nil {
		t.Fatal(err)
	}
	v1 := w.ref(t, ctx, "k")
	if _, err := w.tr.Put(ctx, []byte("k"), v(1), Cond{}); err != nil {
		t.Fatal(err)
	}
	v2 := w.ref(t, ctx, "k")
	// The leaf goes back to its chunk (as before giving its lease up); the
	// log keeps the records (no checkpoint).
	w.cache.mu.Lock()
	e := w.cache.mu.m[w.rh]
	w.cache.mu.Unlock()
	if err := w.cache.writeBack(ctx, e); err != nil {
		t.Fatal(err)
	}
	if !w.allocated(v1) {
		t.Fatalf("%v freed before the replay", v1)
	}
	for run := uint64(1); run <= 2; run++ {
		rec := lock.Recovery{Dead: lock.ClerkID{Node: 1}, Names: []string{txn.LockName(LogName(1))}, Token: lock.Token{Epoch: 2, Seq: run}}
		rep, err := ReplayDead(ctx, w.dev, rec, w.chunks)
		if err != nil {
			t.Fatalf("run %d: %v", run, err)
		}
		t.Logf("run %d: %d records, %d redone", run, rep.Records, rep.Redone)
	}
	if w.allocated(v1) {
		t.Fatalf("the replay did not free %v (its leaf not kept)", v1)
	}
	b, err := w.store.clerk(2, func(context.Context) error { return nil }).Read(ctx, w.rh, MinNodeSize)
	if err != nil {
		t.Fatal(err)
	}
	n, err := Decode(b, w.ah.ID, w.rh)
	if err != nil {
		t.Fatal(err)
	}
	i, ok := n.Search([]byte("k"))
	if !ok || !n.IsExt(i) {
		t.Fatalf("leaf lost k")
	}
	r, err := DecodeRef(n.Vals[i])
	if err != nil || r.Chunk != v2 || !w.allocated(v2) {
		t.Fatalf("leaf names %v (err %v), want %v allocated", r.Chunk, err, v2)
	}
	got, err := w.cache.Store(w.ah, MinNodeSize, nil).ReadValue(ctx, r)
	if err != nil || !bytes.Equal(got, v(1)) {
		t.Fatalf("k's value: %q %v", got, err)
	}
}
