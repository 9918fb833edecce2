package btree

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"testing"
	"time"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/chunk"
	"github.com/grovestore/grove/internal/lock"
)

// Review 29: two paths of createTree that the simulator never takes (its
// names are unique per seed, and its directory stand-in applies every
// decree before it answers): a name taken between the lookup and the
// decree (the undo), and a decree whose caller gave up before it landed.

// review29Dir is memDirectory whose Lookup finds nothing and whose Create
// runs before (a racing creator) or is held back (lost, landing later).
type review29Dir struct {
	*memDirectory
	before func()
	hold   bool
	held   func() (*TreeEntry, error)
}

func (d *review29Dir) Lookup(ctx context.Context, name string) (TreeEntry, error) {
	return TreeEntry{}, fmt.Errorf("%w: %q", ErrNoTree, name) // the racer's decree is after this read
}

func (d *review29Dir) Create(ctx context.Context, e TreeEntry, root Handle, owner chunk.Owner) (*TreeEntry, error) {
	if d.before != nil {
		d.before()
	}
	if d.hold {
		// Update's ctx ended with the proposal still in flight: it is
		// applied later, conditional on the namespace it read (a stale
		// version sends it round again: createTreeOps on the namespace
		// then).
		d.held = func() (*TreeEntry, error) { return d.memDirectory.Create(ctx, e, root, owner) }
		return nil, fmt.Errorf("meta: config service unavailable: %w", context.DeadlineExceeded)
	}
	return d.memDirectory.Create(ctx, e, root, owner)
}

func review29Rig(t *testing.T, ctx context.Context) (*simChunks, *Cache, chunk.Owner, func(context.Context, Handle, []byte) error) {
	store := newSimChunks(rand.New(rand.NewSource(29)))
	cl := store.clerk(1, func(context.Context) error { return nil })
	owner := chunk.Owner{Log: OwnerLog(1), Token: lock.Token{Epoch: 1, Seq: 5}}
	c := newSoloServer(t, ctx, newSimLocks(ctx, rand.New(rand.NewSource(30))), cl).cache
	c.setOwner(owner)
	write := func(ctx context.Context, h Handle, img []byte) error {
		store.mu.Lock()
		defer store.mu.Unlock()
		if store.data[h] == nil {
			return chunk.ErrUnallocated
		}
		copy(store.data[h], img)
		return nil
	}
	return store, c, owner, write
}

func review29State(store *simChunks, h Handle) (allocated, tagged bool) {
	store.mu.Lock()
	defer store.mu.Unlock()
	_, tagged = store.tag[h]
	return store.data[h] != nil, tagged
}

// A name taken after the lookup: ErrTreeExists with the racer's entry,
// and this creation's anchor and root freed (the simulator never takes
// this path: TestSimTree passes with the undo removed).
func TestReview29CreateClashUndoes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	store, c, _, write := review29Rig(t, ctx)
	dir := &review29Dir{memDirectory: &memDirectory{ns: &pb.Namespace{Name: Namespace}}}
	racer := TreeEntry{Name: "t", Anchor: Handle{CM: 9, ID: 1}, NodeSize: MinNodeSize, MaxFanout: 4}
	dir.before = func() {
		if _, err := nsCreate(dir.ns, racer, Handle{CM: 9, ID: 2}, chunk.Owner{}); err != nil {
			t.Fatal(err)
		}
	}
	next := store.next
	e, err := createTree(ctx, c, dir, write, "t", Config{NodeSize: MinNodeSize, MaxFanout: 4}, nil)
	if !errors.Is(err, ErrTreeExists) || e.Anchor != racer.Anchor {
		t.Fatalf("createTree: %+v, %v (want ErrTreeExists and the racer's entry)", e, err)
	}
	for id := next + 1; id <= store.next; id++ {
		if alloc, _ := review29State(store, Handle{CM: 1, ID: id}); alloc {
			t.Errorf("chunk 1:%d, made by the losing creation, is still allocated (leaked)", id)
		}
	}
}

// A decree whose caller gave up lands later: createTree must have left
// the chunks alone (tagged, known), and the log's next holder disowns
// them. Landing only after that holder retired the creator: refused, and
// the holder freed them.
func TestReview29CreateDecreeLandsLate(t *testing.T) {
	for _, afterCollection := range []bool{false, true} {
		t.Run(fmt.Sprintf("afterCollection=%v", afterCollection), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			store, c, owner, write := review29Rig(t, ctx)
			dir := &review29Dir{memDirectory: &memDirectory{ns: &pb.Namespace{Name: Namespace}}, hold: true}
			var ah, rh Handle
			_, err := createTree(ctx, c, dir, write, "t", Config{NodeSize: MinNodeSize, MaxFanout: 4}, func(stage string, a, r Handle) bool {
				ah, rh = a, r
				return false
			})
			if err == nil || errors.Is(err, ErrNotApplied) {
				t.Fatalf("createTree with its decree in flight: %v (want an error of unknown outcome)", err)
			}
			for _, h := range []Handle{ah, rh} {
				if alloc, tagged := review29State(store, h); !alloc || !tagged {
					t.Fatalf("chunk %v after a decree of unknown outcome: allocated %v, tagged %v (want both)", h, alloc, tagged)
				}
			}
			cl := store.clerk(2, func(context.Context) error { return nil })
			nextHolder := lock.Token{Epoch: owner.Token.Epoch, Seq: owner.Token.Seq + 1}
			if !afterCollection {
				if _, err := dir.held(); err != nil {
					t.Fatal(err)
				}
			}
			collectOrphans(ctx, cl, dir, owner.Log, nextHolder, simLog, "review29")
			if afterCollection {
				if _, err := dir.held(); !errors.Is(err, ErrCreatorRetired) {
					t.Fatalf("the late decree after the retirement: %v (want ErrCreatorRetired)", err)
				}
			}
			ts, _ := Trees(dir.ns)
			_, listed := ts["t"]
			for _, h := range []Handle{ah, rh} {
				alloc, tagged := review29State(store, h)
				if listed != alloc || tagged {
					t.Fatalf("listed %v; chunk %v allocated %v, tagged %v", listed, h, alloc, tagged)
				}
			}
			if listed == afterCollection {
				t.Fatalf("listed %v", listed)
			}
		})
	}
}
