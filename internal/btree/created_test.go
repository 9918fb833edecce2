package btree

import (
	"context"
	"errors"
	"math/rand"
	"sync/atomic"
	"testing"
	"time"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/chunk"
	"github.com/grovestore/grove/internal/lock"
)

// memDirectory is the tree directory as the config service keeps it: one
// namespace, each decree computed from it and applied at once (as
// meta.Client.Update's conditional decrees are, one at a time).
type memDirectory struct {
	ns                      *pb.Namespace
	failRetire, failNamed   error
	retires, namedReads     int
	retiredBeforeFirstNamed bool
}

func applyOps(ns *pb.Namespace, ops []*pb.Op) {
	for _, op := range ops {
		i := 0
		for ; i < len(ns.Entries) && ns.Entries[i].Key != op.Key; i++ {
		}
		switch op.Kind {
		case pb.Op_KIND_PUT:
			if i < len(ns.Entries) {
				ns.Entries[i].Value = op.Value
			} else {
				ns.Entries = append(ns.Entries, &pb.Entry{Key: op.Key, Value: op.Value})
			}
		case pb.Op_KIND_DELETE:
			if i < len(ns.Entries) {
				ns.Entries = append(ns.Entries[:i], ns.Entries[i+1:]...)
			}
		}
	}
}

func (d *memDirectory) RetireCreators(ctx context.Context, log uint64, below lock.Token) error {
	if d.failRetire != nil {
		return d.failRetire
	}
	d.retires++
	applyOps(d.ns, retireCreatorsOps(d.ns, log, below))
	return nil
}

func (d *memDirectory) Named(ctx context.Context) (map[Handle]bool, error) {
	if d.failNamed != nil {
		return nil, d.failNamed
	}
	if d.namedReads == 0 {
		d.retiredBeforeFirstNamed = d.retires > 0
	}
	d.namedReads++
	return namedChunks(d.ns)
}

// nsCreate applies CreateTree's decree to ns.
func nsCreate(ns *pb.Namespace, e TreeEntry, root Handle, owner chunk.Owner) (*TreeEntry, error) {
	ops, existing, err := createTreeOps(ns, e, root, owner)
	if err != nil || existing != nil {
		return existing, err
	}
	applyOps(ns, ops)
	return nil, nil
}

// nsRecordDrop is a drop's decree on ns, as MetaDirectory.RecordDrop
// makes it.
func nsRecordDrop(ns *pb.Namespace, e TreeEntry, marked time.Time) error {
	ops, applied, err := dropTreeOps(ns, e, marked)
	if err != nil {
		return err
	}
	if !applied {
		return droppedDrop(ns, e)
	}
	applyOps(ns, ops)
	return nil
}

func (d *memDirectory) RecordDrop(ctx context.Context, e TreeEntry, marked time.Time) error {
	return nsRecordDrop(d.ns, e, marked)
}

func (d *memDirectory) Drops(ctx context.Context) ([]pendingDrop, error) {
	return pendingDrops(d.ns), nil
}

func (d *memDirectory) Dropped(ctx context.Context, e TreeEntry) error {
	applyOps(d.ns, droppedOps(d.ns, e.Anchor))
	return nil
}

func (d *memDirectory) Trees(ctx context.Context) (map[string]TreeEntry, error) { return Trees(d.ns) }

func (d *memDirectory) Lookup(ctx context.Context, name string) (TreeEntry, error) {
	return lookupIn(d.ns, name)
}

func (d *memDirectory) Create(ctx context.Context, e TreeEntry, root Handle, owner chunk.Owner) (*TreeEntry, error) {
	return nsCreate(d.ns, e, root, owner)
}

// create is CreateTree's decree.
func (d *memDirectory) create(name string, anchor, root Handle, owner chunk.Owner) error {
	existing, err := d.Create(context.Background(), TreeEntry{Name: name, Anchor: anchor, NodeSize: MinNodeSize, MaxFanout: 6}, root, owner)
	if err == nil && existing != nil {
		err = ErrTreeExists
	}
	return err
}

// A creation's decree is refused once its owner's log has a newer holder,
// unless it is the owner's own earlier attempt; a newer holder's is not.
// The mark only rises. What the directory names: trees' and drops'
// anchors, and the first roots of those only.
func TestCreateTreeOpsRetiredCreator(t *testing.T) {
	d := &memDirectory{ns: &pb.Namespace{Name: Namespace}}
	old := chunk.Owner{Log: 1, Token: lock.Token{Epoch: 2, Seq: 9}}
	newer := chunk.Owner{Log: 1, Token: lock.Token{Epoch: 3, Seq: 1}}
	other := chunk.Owner{Log: 2, Token: lock.Token{Epoch: 1, Seq: 1}}
	a1, r1 := Handle{CM: 1, ID: 10}, Handle{CM: 1, ID: 11}
	if err := d.create("one", a1, r1, old); err != nil {
		t.Fatal(err)
	}
	if err := d.RetireCreators(context.Background(), 1, newer.Token); err != nil {
		t.Fatal(err)
	}
	if err := d.RetireCreators(context.Background(), 1, old.Token); err != nil {
		t.Fatal(err)
	}
	if mark, err := retiredBelow(d.ns, 1); err != nil || mark != newer.Token {
		t.Fatalf("a lower mark replaced a higher one: %v, %v", mark, err)
	}
	if err := d.create("one", a1, r1, old); err != nil {
		t.Fatalf("the retired owner's own earlier attempt, run again: %v (want success)", err)
	}
	if err := d.create("two", Handle{CM: 1, ID: 20}, Handle{CM: 1, ID: 21}, old); !errors.Is(err, ErrCreatorRetired) {
		t.Fatalf("a retired owner's creation: %v, want ErrCreatorRetired", err)
	}
	if err := d.create("two", Handle{CM: 1, ID: 30}, Handle{CM: 1, ID: 31}, newer); err != nil {
		t.Fatalf("the newer holder's creation: %v", err)
	}
	if err := d.create("three", Handle{CM: 1, ID: 40}, Handle{CM: 1, ID: 41}, other); err != nil {
		t.Fatalf("another log's creation: %v", err)
	}
	if err := d.create("four", Handle{CM: 1, ID: 50}, Handle{}, chunk.Owner{}); err != nil {
		t.Fatalf("an untagged creation: %v", err)
	}
	// "two"'s drop under way; a root record whose anchor nothing lists.
	applyOps(d.ns, []*pb.Op{{Kind: pb.Op_KIND_DELETE, Key: treeKey("two")},
		{Kind: pb.Op_KIND_PUT, Key: dropKey(Handle{CM: 1, ID: 30}), Value: encodeDrop(pendingDrop{TreeEntry: TreeEntry{Name: "two", Anchor: Handle{CM: 1, ID: 30}, NodeSize: MinNodeSize, MaxFanout: 6}, Marked: time.Now()})},
		{Kind: pb.Op_KIND_PUT, Key: rootKey(Handle{CM: 1, ID: 60}), Value: make([]byte, rootRecordLen)}})
	named, err := namedChunks(d.ns)
	if err != nil {
		t.Fatal(err)
	}
	want := []uint64{10, 11, 30, 31, 40, 41, 50}
	if len(named) != len(want) {
		t.Fatalf("named %v, want ids %v", named, want)
	}
	for _, id := range want {
		if !named[Handle{CM: 1, ID: id}] {
			t.Fatalf("named %v, want ids %v", named, want)
		}
	}
	if ts, err := Trees(d.ns); err != nil || len(ts) != 3 {
		t.Fatalf("Trees with the new keys: %v, %v (want the three trees)", ts, err)
	}
	applyOps(d.ns, []*pb.Op{{Kind: pb.Op_KIND_PUT, Key: rootKey(Handle{CM: 1, ID: 60}), Value: []byte{1}}})
	if _, err := namedChunks(d.ns); err != nil {
		t.Fatalf("a malformed root record of no listed anchor stopped the read: %v", err)
	}
	applyOps(d.ns, []*pb.Op{{Kind: pb.Op_KIND_PUT, Key: rootKey(a1), Value: []byte{1}}})
	if _, err := namedChunks(d.ns); err == nil {
		t.Fatal("a malformed root record was taken")
	}
	// A mark that does not decode refuses creations (it fails closed),
	// and the next retirement replaces it.
	applyOps(d.ns, []*pb.Op{{Kind: pb.Op_KIND_PUT, Key: retiredKey(1), Value: []byte{1, 2}}})
	if err := d.create("five", Handle{CM: 1, ID: 70}, Handle{CM: 1, ID: 71}, newer); err == nil {
		t.Fatal("a creation under a mark that does not decode was let through")
	}
	if err := d.RetireCreators(context.Background(), 1, newer.Token); err != nil {
		t.Fatal(err)
	}
	if err := d.create("five", Handle{CM: 1, ID: 70}, Handle{CM: 1, ID: 71}, newer); err != nil {
		t.Fatalf("after the retirement replaced the bad mark: %v", err)
	}
}

// The stray collection's directory read (namedAfterRetiring) retires the
// log's earlier holders first, once; a failed retirement reads nothing.
func TestNamedAfterRetiring(t *testing.T) {
	ctx := context.Background()
	d := &memDirectory{ns: &pb.Namespace{Name: Namespace}}
	owner := chunk.Owner{Log: 1, Token: lock.Token{Epoch: 2, Seq: 3}}
	var retired atomic.Bool
	d.failRetire = errors.New("no config service")
	if _, err := namedAfterRetiring(ctx, d, owner, &retired); err == nil || d.namedReads != 0 || retired.Load() {
		t.Fatalf("a failed retirement: %v, %d reads, retired %v (want an error, no read)", err, d.namedReads, retired.Load())
	}
	d.failRetire = nil
	if _, err := namedAfterRetiring(ctx, d, owner, &retired); err != nil || !d.retiredBeforeFirstNamed || !retired.Load() {
		t.Fatalf("%v; retired before the read %v", err, d.retiredBeforeFirstNamed)
	}
	if mark, _ := retiredBelow(d.ns, 1); mark != owner.Token {
		t.Fatalf("mark %v, want %v", mark, owner.Token)
	}
	if _, err := namedAfterRetiring(ctx, d, owner, &retired); err != nil || d.retires != 1 || d.namedReads != 2 {
		t.Fatalf("the second read: %v, %d retirements, %d reads (want 1, 2)", err, d.retires, d.namedReads)
	}
}

// collectOrphans frees what a dead holder of the log left (a tree's chunks
// whose decree it never made among them), disowns the anchor and first
// root of the tree it made, and retires it in the directory before it
// reads it, so that its creation still in flight is refused; it frees
// nothing when the directory cannot be marked or read. Without the
// directory, the made tree's chunks are freed (what the directory is for).
func TestCollectOrphansKeepsCreatedTrees(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store := newSimChunks(rand.New(rand.NewSource(1)))
	cl := store.clerk(1, func(context.Context) error { return nil })
	dead := chunk.Owner{Log: OwnerLog(1), Token: lock.Token{Epoch: 1, Seq: 5}}
	next := lock.Token{Epoch: 1, Seq: 6}
	alloc := func(o chunk.Owner) Handle {
		h, err := cl.Allocate(ctx, MinNodeSize, o)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	allocated := func(h Handle) bool {
		store.mu.Lock()
		defer store.mu.Unlock()
		return store.data[h] != nil
	}
	tagged := func(h Handle) bool {
		store.mu.Lock()
		defer store.mu.Unlock()
		_, ok := store.tag[h]
		return ok
	}
	dir := &memDirectory{ns: &pb.Namespace{Name: Namespace}}
	madeA, madeR := alloc(dead), alloc(dead)
	if err := dir.create("made", madeA, madeR, dead); err != nil {
		t.Fatal(err)
	}
	lateA, lateR, orphan := alloc(dead), alloc(dead), alloc(dead)

	// The directory cannot be marked, then cannot be read: nothing freed.
	dir.failRetire = errors.New("no config service")
	if n := collectOrphans(ctx, cl, dir, dead.Log, next, simLog, "test"); n != 0 || !allocated(orphan) || !tagged(madeA) {
		t.Fatalf("with the directory unmarked: freed %d", n)
	}
	dir.failRetire, dir.failNamed = nil, errors.New("no config service")
	if n := collectOrphans(ctx, cl, dir, dead.Log, next, simLog, "test"); n != 0 || !allocated(orphan) || !tagged(madeA) {
		t.Fatalf("with the directory unread: freed %d", n)
	}
	dir.failNamed = nil
	if n := collectOrphans(ctx, cl, dir, dead.Log, next, simLog, "test"); n != 3 {
		t.Fatalf("freed %d, want 3 (the unrecorded tree's two chunks and the orphan)", n)
	}
	if !dir.retiredBeforeFirstNamed {
		t.Fatal("the directory was read before the dead holder was retired in it")
	}
	for _, h := range []Handle{lateA, lateR, orphan} {
		if allocated(h) {
			t.Fatalf("chunk %v, which the directory does not name, is still allocated", h)
		}
	}
	for _, h := range []Handle{madeA, madeR} {
		if !allocated(h) || tagged(h) {
			t.Fatalf("the made tree's chunk %v: allocated %v, tagged %v (want allocated, disowned)", h, allocated(h), tagged(h))
		}
	}
	if err := dir.create("late", lateA, lateR, dead); !errors.Is(err, ErrCreatorRetired) {
		t.Fatalf("the dead holder's creation landing after the collection: %v, want ErrCreatorRetired", err)
	}

	// Teeth: without the directory, a made tree's chunks are orphans.
	a2, r2 := alloc(chunk.Owner{Log: dead.Log, Token: next}), alloc(chunk.Owner{Log: dead.Log, Token: next})
	if err := dir.create("made2", a2, r2, chunk.Owner{Log: dead.Log, Token: next}); err != nil {
		t.Fatal(err)
	}
	store.mu.Lock()
	store.tag[a2], store.tag[r2] = dead, dead
	store.mu.Unlock()
	if n := collectOrphans(ctx, cl, nil, dead.Log, lock.Token{Epoch: 1, Seq: 7}, simLog, "test"); n != 2 || allocated(a2) {
		t.Fatalf("without the directory: freed %d (want the made tree's 2 chunks: the teeth)", n)
	}
}

// A live server's stray collection leaves alone what the directory names
// (a tree an earlier holder of its log made and did not disown), and frees
// nothing when the directory cannot be read. Without it, it frees such an
// anchor (the teeth).
func TestCollectStraysLeavesNamed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g := newStrayRig(t, ctx, 30)
	older := g.owner
	if older.Token.Seq > 0 {
		older.Token.Seq--
	} else {
		older.Token.Epoch--
	}
	x, err := g.store.clerk(1, func(context.Context) error { return nil }).Allocate(ctx, AnchorSize, older)
	if err != nil {
		t.Fatal(err)
	}
	allocated := func(h Handle) bool {
		g.store.mu.Lock()
		defer g.store.mu.Unlock()
		return g.store.data[h] != nil
	}
	g.cache.cfg.Named = func(context.Context) (map[Handle]bool, error) { return nil, errors.New("no config service") }
	s := g.stray(t, ctx)
	if n, err := g.cache.CollectStrays(ctx); err == nil || n != 0 || !allocated(s) || !allocated(x) {
		t.Fatalf("with the directory unread: freed %d, %v", n, err)
	}
	g.cache.cfg.Named = func(context.Context) (map[Handle]bool, error) { return map[Handle]bool{x: true}, nil }
	if n, err := g.cache.CollectStrays(ctx); err != nil || n != 1 || allocated(s) || !allocated(x) {
		t.Fatalf("freed %d, %v; stray allocated %v, named anchor allocated %v (want the stray freed, the anchor kept)", n, err, allocated(s), allocated(x))
	}
	g.cache.cfg.Named = nil
	g.stray(t, ctx)
	if n, err := g.cache.CollectStrays(ctx); err != nil || n != 2 || allocated(x) {
		t.Fatalf("without the directory: freed %d, %v (want the stray and the named anchor: the teeth)", n, err)
	}
}
