package btree

import (
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

// strayChunks is a recovering server's view of the chunks on a network that
// loses answers: the first attempt of every third write goes unanswered,
// the clerk's retry gets through, and the first attempt stays in flight —
// the test lands it when it likes (land). Its writes report
// errWrittenEarlierMayLand, as chunkStore.Write does.
type strayChunks struct {
	*simChunkClerk
	mu     sync.Mutex
	n      int
	strays []stray
	// unsafeDone: report such a write as done (the teeth: a replay that
	// does not know an attempt may land late).
	unsafeDone bool
}

type stray struct {
	h     Handle
	data  []byte
	fence rldev.Fence
}

func (c *strayChunks) Write(ctx context.Context, h Handle, data []byte, f *rldev.Fence) error {
	if err := c.simChunkClerk.Write(ctx, h, data, f); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n++
	if c.n%3 != 0 {
		return nil
	}
	c.strays = append(c.strays, stray{h, append([]byte(nil), data...), *f})
	if c.unsafeDone {
		return nil
	}
	return fmt.Errorf("writing chunk %v: %w", h, errWrittenEarlierMayLand)
}

// land delivers every stray attempt now; it returns how many were admitted.
func (c *strayChunks) land() int {
	c.mu.Lock()
	strays := append([]stray(nil), c.strays...)
	c.mu.Unlock()
	return landStrays(c.s, strays)
}

// landStrays delivers strays to the store in order; it returns how many
// were admitted.
func landStrays(s *simChunks, strays []stray) (admitted int) {
	for _, x := range strays {
		if s.apply(x.h, x.data, &x.fence, true) == nil {
			admitted++
		}
	}
	return admitted
}

// rewriteEveryNode is the next server (node 3) writing every node of the
// tree again, a newer image, under its own fence with token tok: the
// dead server's nodes' locks have moved on. It returns the images.
func rewriteEveryNode(t *testing.T, store *simChunks, tree uint64, tok lock.Token) map[Handle][]byte {
	t.Helper()
	newer := map[Handle][]byte{}
	store.mu.Lock()
	for h, d := range store.data {
		if n, err := Decode(d, tree, h); err == nil {
			n.Version++
			newer[h] = n.Encode(nil)
		}
	}
	store.mu.Unlock()
	f := &rldev.Fence{Name: FenceLock(3), Token: tok}
	for h, img := range newer {
		if err := store.apply(h, img, f, false); err != nil {
			t.Fatal(err)
		}
	}
	return newer
}

// countOverwritten counts the chunks that no longer hold the image newer gave
// them.
func countOverwritten(store *simChunks, newer map[Handle][]byte) (n int) {
	store.mu.Lock()
	defer store.mu.Unlock()
	for h, img := range newer {
		if string(store.data[h][:len(img)]) != string(img) {
			n++
		}
	}
	return n
}

// A recovery run whose node writes lose their answers renews its token and
// writes again, instead of failing (before, the run failed on the first
// such write, and every new run of a large replay met another: a dead
// server's replay succeeded with probability (1 − p)^N). And the attempts
// it left in flight are refused when they land after the nodes' locks
// moved on and another server wrote them.
func TestReplayRenewsAfterLostAnswers(t *testing.T) {
	t.Run("renews", func(t *testing.T) { replayRenewCase(t, false) })
	// The oracle's teeth: a replay that takes such a write as done lets
	// its stray attempt overwrite the next server's image.
	t.Run("teeth", func(t *testing.T) { replayRenewCase(t, true) })
}

func replayRenewCase(t *testing.T, unsafeTakeAsDone bool) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const keys = 60
	store, dev, ah := deadServerLog(t, ctx, 1, keys)
	nop := func(context.Context) error { return nil }
	// Server 1 dies now, every node it changed dirty in its cache (its
	// log holds them). Server 2 replays the log under a recovery run's
	// token, through a network that loses answers.
	lossy := &strayChunks{simChunkClerk: store.clerk(2, nop)}
	tok := lock.Token{Epoch: 2, Seq: 1}
	renewals := 0
	rec := lock.Recovery{Dead: lock.ClerkID{Node: 1}, All: true, Token: tok,
		Renew: func(context.Context) (lock.Token, error) {
			renewals++
			tok.Seq++
			return tok, nil
		}}
	if unsafeTakeAsDone {
		rec.Renew = nil
		lossy.unsafeDone = true
	}
	rep, err := ReplayDead(ctx, dev, rec, lossy)
	if err != nil {
		t.Fatalf("the replay failed (%d renewals): %v", renewals, err)
	}
	t.Logf("replayed %d records; %d writes left an attempt in flight; %d renewals", rep.Redone, len(lossy.strays), renewals)
	if len(lossy.strays) == 0 {
		t.Fatal("no write lost its answer: the test tests nothing")
	}
	// At least one renewal; not one per stray: the run writes several
	// nodes at once, and a write whose answer was lost after another
	// write renewed the token goes again under that newer token without
	// a renewal of its own (what matters is checked below: no stray
	// attempt is admitted once the next server wrote the nodes).
	if !unsafeTakeAsDone && renewals == 0 {
		t.Fatalf("%d writes may land late, and the run never renewed its token", len(lossy.strays))
	}
	w := &simWorld{chunks: store, anchor: ah}
	sh, err := Walk(ctx, simChunkReader{w}, false)
	if err != nil {
		t.Fatalf("after the replay: %v", err)
	}
	if len(sh.Keys) != keys {
		t.Fatalf("after the replay the chunks hold %d keys, want %d", len(sh.Keys), keys)
	}
	// The run is over: the nodes' locks go to server 3, which writes every
	// node again (a newer image) under its own fence. Then the stray
	// attempts land.
	newer := rewriteEveryNode(t, store, ah.ID, lock.Token{Epoch: 2, Seq: 1000})
	admitted := lossy.land()
	overwritten := countOverwritten(store, newer)
	t.Logf("%d stray attempts landed after the next server's writes, %d admitted, %d nodes overwritten", len(lossy.strays), admitted, overwritten)
	if overwritten > 0 || admitted > 0 {
		if unsafeTakeAsDone {
			return // caught
		}
		t.Fatalf("%d of the replay's stray attempts overwrote the next server's images", admitted)
	}
	if unsafeTakeAsDone {
		t.Fatal("the teeth variant was not caught: no stray attempt overwrote a newer image")
	}
}

// deadServerLog makes a B-tree server (node 1) with a simulated chunk store
// and log device, puts keys keys into a new tree of fanout 6 (splits: many
// nodes), and leaves it as a server that died then: every node it changed
// is dirty in its cache, only in its log (nothing was written back). It
// returns the store, the log's device and the tree's anchor.
func deadServerLog(t *testing.T, ctx context.Context, seed int64, keys int) (*simChunks, *simDevice, Handle) {
	t.Helper()
	st := newSoloTree(t, ctx, seed, 6, nil)
	for i := 0; i < keys; i++ {
		if _, err := st.tree.Put(ctx, []byte(fmt.Sprintf("k%03d", i)), []byte("v"), Cond{}); err != nil {
			t.Fatal(err)
		}
	}
	// Dead: nothing of its own goes on in the background (a checkpoint
	// that writes nodes back and moves the log's head) while a test
	// reads its log and chunks.
	st.kill()
	return st.store, st.dev, st.anchor
}

// soloTree is a B-tree server (node 1) with a simulated chunk store and
// log device, and a new tree of MinNodeSize nodes on it.
type soloTree struct {
	store        *simChunks
	dev          *simDevice
	cache        *Cache
	wal          *txn.Log
	anchor, root Handle
	tree         *Tree
	dead         atomic.Bool
}

// errSoloDead is what a killed soloTree's chunk and log writes get.
var errSoloDead = errors.New("solo server: dead")

// kill stops the server as a crash would: from now on its calls on the
// chunk store and its log's device fail before they are sent.
func (st *soloTree) kill() { st.dead.Store(true) }

// newSoloTree makes a soloTree whose tree has the fanout given; set, if
// not nil, sees the cache before the log opens.
func newSoloTree(t *testing.T, ctx context.Context, seed int64, fanout int, set func(*Cache)) *soloTree {
	t.Helper()
	r := rand.New(rand.NewSource(seed))
	// Leases of a second: the tests of a server alone build a scenario
	// (a log, a race) and must not lose it to a lease that lapsed while
	// the machine was busy (the suite runs packages side by side); no
	// other server waits for them.
	locks := newSimLocksLease(ctx, r, time.Second, 200*time.Millisecond)
	store := newSimChunks(r)
	st := &soloTree{store: store}
	gate := func(context.Context) error {
		if st.dead.Load() {
			return errSoloDead
		}
		return nil
	}
	chunks := store.clerk(1, gate)
	solo := newSoloServer(t, ctx, locks, chunks)
	cache, fence := solo.cache, solo.fence
	if set != nil {
		set(cache)
	}
	dev := newSimDevice(txn.HeaderBlocks + 256)
	wal, err := txn.Open(ctx, txn.Config{Device: gatedDevice{dev, gate}, Fence: solo.logFence,
		Applier: replayApplier{chunks: chunks, fence: fence}, Checkpointer: cache, LazyInterval: time.Hour, Log: simLog})
	if err != nil {
		t.Fatal(err)
	}
	cache.cfg.Log = wal
	ah, root := emptyTree(t, ctx, chunks, fence, MinNodeSize)
	tr, err := New(cache.Store(ah, MinNodeSize, nil), ah.ID, Config{NodeSize: MinNodeSize, MaxFanout: fanout})
	if err != nil {
		t.Fatal(err)
	}
	st.dev, st.cache, st.wal, st.anchor, st.root, st.tree = dev, cache, wal, ah, root, tr
	return st
}

// deadServerHolds is what the dead server of deadServerLog held: its fence
// and log locks, and every node's lock but the anchor's (a recovery run's
// names).
func deadServerHolds(store *simChunks, ah Handle) []string {
	held := []string{FenceLock(1), txn.LockName(LogName(1))}
	store.mu.Lock()
	defer store.mu.Unlock()
	for h := range store.data {
		if h != ah {
			held = append(held, LockName(h))
		}
	}
	return held
}

// emptyTree makes an empty tree's anchor and root on chunks, as
// CreateTree does, and returns the anchor and the root.
func emptyTree(t *testing.T, ctx context.Context, chunks Chunks, fence func() *rldev.Fence, nodeSize int) (anchor, root Handle) {
	t.Helper()
	ah, err := chunks.Allocate(ctx, AnchorSize, chunk.Owner{})
	if err != nil {
		t.Fatal(err)
	}
	rh, err := chunks.Allocate(ctx, uint64(nodeSize), chunk.Owner{})
	if err != nil {
		t.Fatal(err)
	}
	a, r := Init(ah, rh)
	if err := chunks.Write(ctx, rh, r.Encode(nil), fence()); err != nil {
		t.Fatal(err)
	}
	if err := chunks.Write(ctx, ah, a.Encode(nil), fence()); err != nil {
		t.Fatal(err)
	}
	return ah, rh
}
