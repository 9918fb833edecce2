package btree

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/lock"
	"github.com/grovestore/grove/internal/rldev"
	"github.com/grovestore/grove/internal/txn"
)

// writeCounter counts the writes of each chunk.
type writeCounter struct {
	Chunks
	mu     sync.Mutex
	writes map[Handle]int
}

func (w *writeCounter) Write(ctx context.Context, h Handle, data []byte, f *rldev.Fence) error {
	w.mu.Lock()
	w.writes[h]++
	w.mu.Unlock()
	return w.Chunks.Write(ctx, h, data, f)
}

// A recovery run writes each node of the dead server's log once, its last
// committed image (replayChains), however many records the node has: the
// log of 200 puts into a tree of fanout 6 holds several images of most
// leaves, and the replay leaves every key in place. Writing every image,
// as before, wrote a hot leaf once per put since its last write-back.
func TestReplayWritesEachNodeOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const keys = 200
	store, dev, ah := deadServerLog(t, ctx, 1, keys)
	held := deadServerHolds(store, ah)
	wc := &writeCounter{Chunks: store.clerk(2, func(context.Context) error { return nil }), writes: map[Handle]int{}}
	run := lock.Recovery{Dead: lock.ClerkID{Node: 1, Inc: 1, Seq: 2}, Names: held, Token: lock.Token{Epoch: 2, Seq: 12}}
	rep, err := replayDead(ctx, dev, run, wc, nil, replayUnsafe{}, nil, simLog, nil)
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for h, n := range wc.writes {
		if n > 1 {
			t.Errorf("chunk %v written %d times by one replay", h, n)
		}
		total += n
	}
	if total == 0 || rep.Records < 2*total {
		t.Fatalf("the log holds %d records and the replay wrote %d chunks: the scenario has too few images of the same nodes to tell", rep.Records, total)
	}
	sh, err := Walk(ctx, simChunkReader{&simWorld{chunks: store, anchor: ah}}, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(sh.Keys) != keys {
		t.Fatalf("the tree holds %d keys after the replay, want %d", len(sh.Keys), keys)
	}
	t.Logf("%d records, %d redone, %d chunks written once each", rep.Records, rep.Redone, total)
}

// tearingChunks tears each chunk of tear the first time it is read, in
// the store itself: its first half flipped, the rest as it was — a
// write-back cut off by a power loss, on every node whose write-back could
// have been in flight (wholeImaged).
type tearingChunks struct {
	Chunks
	store *simChunks
	tear  map[Handle]bool
	mu    sync.Mutex
	torn  map[Handle]bool
}

func (c *tearingChunks) Read(ctx context.Context, h Handle, n uint64) ([]byte, error) {
	c.mu.Lock()
	if c.tear[h] && !c.torn[h] {
		c.torn[h] = true
		c.store.mu.Lock()
		b := c.store.data[h]
		for i := 0; i < len(b)/2; i++ {
			b[i] ^= 0x5a
		}
		c.store.mu.Unlock()
	}
	c.mu.Unlock()
	return c.Chunks.Read(ctx, h, n)
}

// A node image torn in its chunk (a write-back cut off by a power loss)
// is repaired by the replay, which writes the log's newest image of the
// node: a torn image does not decode (its CRC), so the replay never takes
// it for a newer one and writes it back as it is.
func TestReplayRepairsTornImages(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const keys = 200
	store, dev, ah := deadServerLog(t, ctx, 2, keys)
	held := deadServerHolds(store, ah)
	run := lock.Recovery{Dead: lock.ClerkID{Node: 1, Inc: 1, Seq: 2}, Names: held, Token: lock.Token{Epoch: 2, Seq: 12}}
	tc := &tearingChunks{Chunks: store.clerk(2, func(context.Context) error { return nil }), store: store,
		tear: wholeImaged(t, ctx, dev, run), torn: map[Handle]bool{}}
	rep, err := replayDead(ctx, dev, run, tc, nil, replayUnsafe{}, nil, simLog, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(tc.torn) == 0 {
		t.Fatal("the replay read no node: nothing was torn, and the test proves nothing")
	}
	sh, err := Walk(ctx, simChunkReader{&simWorld{chunks: store, anchor: ah}}, false)
	if err != nil {
		t.Fatalf("after the replay over %d torn nodes: %v", len(tc.torn), err)
	}
	if len(sh.Keys) != keys {
		t.Fatalf("after the replay over %d torn nodes the tree holds %d keys, want %d", len(tc.torn), len(sh.Keys), keys)
	}
	t.Logf("%d torn nodes repaired by a replay of %d records (%d writes)", len(tc.torn), rep.Records, rep.Redone)
}

// wholeImaged is the nodes of which a replay of run over dev writes a
// whole image the log holds (replayChains), found by a dry run over a copy
// of dev: the nodes whose write-back could have been in flight when the
// log's server died. The others' records are orphan deltas, whose node's
// chunk a write-back wrote whole before the log's head passed the node's
// last whole image; a write-back since would have been of a change logged
// whole (the full-page-write rule, Cache.commit), so tearing their chunks
// would make a crash that cannot happen (and a replay that must fail:
// errBaseless).
func wholeImaged(t *testing.T, ctx context.Context, dev *simDevice, run lock.Recovery) map[Handle]bool {
	t.Helper()
	names := map[string]bool{}
	for _, n := range run.Names {
		names[n] = true
	}
	dry := &dryReplay{replayApplier: replayApplier{keep: func(h Handle) bool { return names[LockName(h)] }, keepTags: true}, whole: map[Handle]bool{}}
	if _, err := txn.Recover(ctx, dev.clone(), rldev.Fence{Name: txn.LockName(LogName(1)), Token: run.Token}, dry, txn.Unsafe{}); err != nil {
		t.Fatal(err)
	}
	return dry.whole
}

// dryReplay selects as a recovery run does and applies nothing, noting the
// nodes it would write whole images of.
type dryReplay struct {
	replayApplier
	whole map[Handle]bool
}

func (d *dryReplay) Select(p txn.Plan) (redo, undo []txn.Record) {
	redo, undo = d.replayApplier.Select(p)
	for _, r := range redo {
		if h, err := txn.ParseChunkTarget(r.Target); err == nil && r.Off == 0 {
			d.whole[h] = true
		}
	}
	return redo, undo
}

func (d *dryReplay) Apply(context.Context, []byte, uint64, []byte, txn.LSN, *rldev.Fence) error {
	return nil
}

// A write torn the other way — the newer image's first part, with its
// header and newer version, over the older image's rest — does not pass
// for the newer image either: imageVersion decodes the whole image, and
// the CRC fails, so the replay writes the log's image over it. (A
// version read from the header alone would take it as current and write
// it back torn.)
func TestTornImageHasNoVersion(t *testing.T) {
	old := &Node{Self: Handle{CM: 1, ID: 7}, Tree: 3, Version: 5, HighInf: true}
	newer := &Node{Self: Handle{CM: 1, ID: 7}, Tree: 3, Version: 6, HighInf: true}
	for i := 0; i < 40; i++ {
		k := []byte(fmt.Sprintf("key%03d", i))
		old.Keys, old.Vals = append(old.Keys, k), append(old.Vals, []byte("old-value"))
		newer.Keys, newer.Vals = append(newer.Keys, k), append(newer.Vals, []byte("new-value"))
	}
	a, b := old.Encode(nil), newer.Encode(nil)
	if v, ok := imageVersion(b); !ok || v != 6 {
		t.Fatalf("the whole newer image: version %d, %v", v, ok)
	}
	for _, cut := range []int{16, 64, len(b) / 2, len(b) - 8} {
		torn := append(append([]byte(nil), b[:cut]...), a[cut:]...)
		if v, ok := imageVersion(torn); ok {
			t.Fatalf("newer image torn at byte %d of %d: taken for version %d", cut, len(b), v)
		}
	}
}
