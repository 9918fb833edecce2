package btree

import (
	"context"
	"errors"
	"testing"
	"time"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/chunk"
)

// Review 30 (outside review of 7a92633: a drop's steps over the tree
// Directory).

// review30Rig is a B-tree server's cache (node 1) on simulated chunks, with
// a log (a drop's mark is a commit) and its owner set (creations tag).
func review30Rig(t *testing.T, ctx context.Context) (*simChunks, *simChunkClerk, *Cache, func(context.Context, Handle, []byte) error) {
	t.Helper()
	store, chunks, solo, _ := newLoggedSolo(t, ctx, 30, nil)
	write := func(ctx context.Context, h Handle, img []byte) error {
		return writeFenced(ctx, chunks, solo.fence, h, img)
	}
	return store, chunks, solo.cache, write
}

func review30Allocated(store *simChunks, h Handle) bool {
	store.mu.Lock()
	defer store.mu.Unlock()
	return store.data[h] != nil
}

// review30RerunDir is memDirectory whose Create commits its first attempt,
// loses the answer, and lets rerun happen before meta.Client.Update runs
// createTreeOps again (the resend found stale: more than
// meta.RecentDecreeIDs decrees on the namespace since).
type review30RerunDir struct {
	*memDirectory
	rerun func()
}

func (d *review30RerunDir) Create(ctx context.Context, e TreeEntry, root Handle, owner chunk.Owner) (*TreeEntry, error) {
	if existing, err := d.memDirectory.Create(ctx, e, root, owner); err != nil || existing != nil {
		return existing, err
	}
	d.rerun()
	return d.memDirectory.Create(ctx, e, root, owner)
}

// A creation's decree run again by meta.Client.Update after the tree was
// dropped and the drop finished (drop/ and root/ deleted) names the freed
// anchor again: the directory lists a tree whose drop was acknowledged,
// over freed chunks (review 30). The bound on creations' decrees (within
// OpTimeout, a drop finished only DropWait after its mark:
// TestReview30CreateAndDropBounded) rules that schedule out; this test
// plays it all the same (the finish here does not wait DropWait) and
// checks that the name does not then stay stuck: DropTree of it records
// the drop of the gone anchor, and the finish removes it (before the fix
// it answered ErrNoTree and left the name listed, and CreateTree answered
// ErrTreeExists).
func TestReview30CreateRerunAfterFinishedDrop(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store, chunks, c, write := review30Rig(t, ctx)
	mem := &memDirectory{ns: &pb.Namespace{Name: Namespace}}
	var dropped TreeEntry
	var dropErr, finishErr error
	dir := &review30RerunDir{memDirectory: mem, rerun: func() {
		// Another client drops the tree (it is listed), and a dropper
		// finishes the drop at once.
		dropped, _, dropErr = beginDrop(ctx, c, mem, "t", nil)
		finishDrops(ctx, c, mem, chunks.Free, 0, func(_ TreeEntry, err error) {
			if err != nil {
				finishErr = err
			}
		})
	}}
	e, err := createTree(ctx, c, dir, write, "t", Config{NodeSize: MinNodeSize, MaxFanout: 6}, nil)
	if err != nil {
		t.Fatalf("createTree: %v", err)
	}
	if dropErr != nil || finishErr != nil || dropped.Anchor != e.Anchor {
		t.Fatalf("the drop: %v, the finish: %v (dropped %v, created %v)", dropErr, finishErr, dropped.Anchor, e.Anchor)
	}
	if review30Allocated(store, e.Anchor) {
		t.Fatalf("the finished drop left anchor %v allocated", e.Anchor)
	}
	x, err := lookupIn(mem.ns, "t")
	if err != nil {
		t.Fatalf("the schedule did not list the freed anchor again (%v): the test no longer plays what it means to", err)
	}
	t.Logf("tree t listed again over its freed anchor %v (allocated %v), as review 30 found", x.Anchor, review30Allocated(store, x.Anchor))
	// DropTree of the name records the drop although the anchor is gone.
	if _, unsettled, err := beginDrop(ctx, c, mem, "t", nil); err != nil || unsettled {
		t.Fatalf("DropTree of listed tree t over a freed anchor: %v (unsettled %v)", err, unsettled)
	}
	if _, err := lookupIn(mem.ns, "t"); err == nil {
		t.Fatalf("tree t still listed after its drop")
	}
	finishDrops(ctx, c, mem, chunks.Free, 0, func(_ TreeEntry, err error) {
		if err != nil {
			t.Errorf("finishing the drop of a gone anchor: %v", err)
		}
	})
	if ds := pendingDrops(mem.ns); len(ds) > 0 {
		t.Fatalf("drops left: %v", ds)
	}
	named, err := namedChunks(mem.ns)
	if err != nil || len(named) > 0 {
		t.Fatalf("the directory still names %v (%v)", named, err)
	}
	if _, err := createTree(ctx, c, mem, write, "t", Config{NodeSize: MinNodeSize, MaxFanout: 6}, nil); err != nil {
		t.Fatalf("creating t again: %v", err)
	}
}

// blockingDir is a tree directory that answers nothing until its caller
// gives up.
type blockingDir struct{ *memDirectory }

func (blockingDir) Lookup(ctx context.Context, name string) (TreeEntry, error) {
	<-ctx.Done()
	return TreeEntry{}, ctx.Err()
}

// Server.CreateTree and BeginDrop end within OpTimeout whatever their
// caller's context, so that no attempt of their decrees runs after
// DropWait (drop.go).
func TestReview30CreateAndDropBounded(t *testing.T) {
	s := &Server{}
	s.cfg.OpTimeout = 50 * time.Millisecond
	s.testDirectory = blockingDir{}
	for _, op := range []struct {
		name string
		run  func(context.Context) error
	}{
		{"CreateTree", func(ctx context.Context) error { _, err := s.CreateTree(ctx, "t", Config{}); return err }},
		{"BeginDrop", func(ctx context.Context) error { _, err := s.BeginDrop(ctx, "t"); return err }},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		start := time.Now()
		err := op.run(ctx)
		took := time.Since(start)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) || took > time.Second {
			t.Errorf("%s with a 3 s context and a directory that never answers: %v after %v (want the OpTimeout's end)", op.name, err, took)
		}
	}
}

// A drop's decree and settleDrop on a name that now names a new tree (the
// old one dropped and its drop recorded by another server meanwhile) leave
// the new tree listed. When review 30 wrote it the simulator ran creations
// and drops one at a time and took neither path; since drops run beside
// creations it catches a drop's decree that does not check the anchor
// ("root records … name no listed tree"), but still not a settleDrop that
// does not check that the anchor is dropped (150 seeds): this test does.
func TestReview30StaleDropLeavesNewTree(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, _, c, write := review30Rig(t, ctx)
	mem := &memDirectory{ns: &pb.Namespace{Name: Namespace}}
	cfg := Config{NodeSize: MinNodeSize, MaxFanout: 6}
	old, err := createTree(ctx, c, mem, write, "t", cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := beginDrop(ctx, c, mem, "t", nil); err != nil {
		t.Fatal(err)
	}
	nu, err := createTree(ctx, c, mem, write, "t", cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	// A stale drop of the old tree (its lookup before the other drop; its
	// mark found the anchor marked already): its decree.
	if err := mem.RecordDrop(ctx, old, time.Now()); err != nil {
		t.Errorf("the old tree's drop decree again: %v (want nil: its drop is recorded)", err)
	}
	if x, err := lookupIn(mem.ns, "t"); err != nil || x.Anchor != nu.Anchor {
		t.Fatalf("a stale drop of the old tree %v removed the new tree %v's name: %+v, %v", old.Anchor, nu.Anchor, x, err)
	}
	// An operation that found the old anchor dropped settles the name: the
	// name is the new, live tree's.
	settled, err := settleDrop(ctx, c, mem, "t")
	if err != nil || settled {
		t.Errorf("settleDrop of a live tree: settled %v, %v", settled, err)
	}
	if x, err := lookupIn(mem.ns, "t"); err != nil || x.Anchor != nu.Anchor {
		t.Fatalf("settleDrop removed live tree %v's name: %+v, %v", nu.Anchor, x, err)
	}
}

// settleListed (every dropper pass) settles a drop whose server died
// between the anchor's mark and the decree (review 30: the name stayed
// listed, and the tree's chunks allocated, until someone touched it), and
// leaves live trees, and trees whose mark is not in their chunk yet, alone.
func TestSettleListedSettlesADeadServersDrop(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, _, c, write := review30Rig(t, ctx)
	mem := &memDirectory{ns: &pb.Namespace{Name: Namespace}}
	cfg := Config{NodeSize: MinNodeSize, MaxFanout: 6}
	live, err := createTree(ctx, c, mem, write, "live", cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	cut, err := createTree(ctx, c, mem, write, "cut", cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The drop's first step only (its server "dies" before the decree).
	if err := markDropped(ctx, c.Store(cut.Anchor, cut.NodeSize, nil)); err != nil {
		t.Fatal(err)
	}
	// The mark is in the log and the cache, not in the chunk yet: left
	// to the server that made it.
	if n, _, err := settleListed(ctx, c, mem, nil, time.Second); err != nil || n != 0 {
		t.Fatalf("settleListed before the write-back: %d, %v (want 0, nil)", n, err)
	}
	if err := c.FlushAll(ctx); err != nil {
		t.Fatal(err)
	}
	if n, _, err := settleListed(ctx, c, mem, nil, time.Second); err != nil || n != 1 {
		t.Fatalf("settleListed: %d, %v (want 1, nil)", n, err)
	}
	if _, err := lookupIn(mem.ns, "cut"); !errors.Is(err, ErrNoTree) {
		t.Fatalf("the cut drop's tree is still listed: %v", err)
	}
	if x, err := lookupIn(mem.ns, "live"); err != nil || x.Anchor != live.Anchor {
		t.Fatalf("the live tree: %+v, %v", x, err)
	}
	if ds := pendingDrops(mem.ns); len(ds) != 1 || ds[0].Anchor != cut.Anchor {
		t.Fatalf("drops recorded: %+v (want the cut tree's)", ds)
	}
	if n, _, err := settleListed(ctx, c, mem, nil, time.Second); err != nil || n != 0 {
		t.Fatalf("settleListed again: %d, %v (want 0, nil)", n, err)
	}
}

// CreateTree of a name whose drop was cut off between the anchor's mark
// and the decree settles that drop and makes the new tree (it answered
// "exists" until a dropper pass settled the drop); a live tree, or one
// whose anchor is freed, still holds its name.
func TestCreateSettlesACutDrop(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store, chunks, c, write := review30Rig(t, ctx)
	mem := &memDirectory{ns: &pb.Namespace{Name: Namespace}}
	cfg := Config{NodeSize: MinNodeSize, MaxFanout: 6}
	old, err := createTree(ctx, c, mem, write, "t", cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := createTree(ctx, c, mem, write, "t", cfg, nil); !errors.Is(err, ErrTreeExists) {
		t.Fatalf("creating live tree t again: %v (want ErrTreeExists)", err)
	}
	if err := markDropped(ctx, c.Store(old.Anchor, old.NodeSize, nil)); err != nil {
		t.Fatal(err)
	}
	nu, err := createTree(ctx, c, mem, write, "t", cfg, nil)
	if err != nil {
		t.Fatalf("creating t over its cut drop: %v", err)
	}
	if x, err := lookupIn(mem.ns, "t"); err != nil || x.Anchor != nu.Anchor || nu.Anchor == old.Anchor {
		t.Fatalf("t lists %+v (%v); the new tree is %v, the old %v", x, err, nu.Anchor, old.Anchor)
	}
	if ds := pendingDrops(mem.ns); len(ds) != 1 || ds[0].Anchor != old.Anchor {
		t.Fatalf("drops recorded: %+v (want the old tree's)", ds)
	}
	// A listed tree whose anchor is freed (a defect) keeps its name.
	if err := chunks.Free(ctx, nu.Anchor); err != nil {
		t.Fatal(err)
	}
	c.Drop(nu.Anchor)
	if review30Allocated(store, nu.Anchor) {
		t.Fatal("the anchor was not freed")
	}
	if _, err := createTree(ctx, c, mem, write, "t", cfg, nil); !errors.Is(err, ErrTreeExists) {
		t.Fatalf("creating t over a freed anchor: %v (want ErrTreeExists)", err)
	}
}
