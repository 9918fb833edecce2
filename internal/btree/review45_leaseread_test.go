package btree

import (
	"context"
	"errors"
	"math/rand"
	"testing"
	"time"
)

// Review 45 (CI, stop 37: a simulation seed under load panicked in
// lockRun: "leaf 1:2 (held) links to 1:3, which ... starts at "k12", not
// "k11""). A cache miss takes the pin, then reads the image from the
// store; nothing bounded that read by the leases' time. A server paused
// (or slowed) between the two past its leases' time is declared dead;
// another server replays its log and changes the nodes it held (here: a
// leaf and its right sibling rebalanced); the read then returns the new
// image of one node while the cache still serves the old image of the
// other: a scan's run of leaves that no state of the tree ever had. The
// rule now: an image read, or a value chunk read, that ends past the
// leases' time is not served (ErrLeaseExpired, as for a cached image).

// pausingChunks pauses the server during one read of h: the clerk is cut
// off the lock service and the read outlives its leases.
type pausingChunks struct {
	*simChunkClerk
	locks *simLocks
	clerk *simClerk
	h     Handle
	armed bool
}

func (c *pausingChunks) Read(ctx context.Context, h Handle, n uint64) ([]byte, error) {
	if c.armed && h == c.h {
		c.armed = false
		c.locks.setCut(c.clerk, true, false)
		time.Sleep(2 * (c.locks.lease + c.locks.grace))
	}
	return c.simChunkClerk.Read(ctx, h, n)
}

func TestReview45ReadPastLeasesNotServed(t *testing.T) {
	for _, what := range []string{"node image", "value chunk"} {
		t.Run(what, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			r := rand.New(rand.NewSource(45))
			locks := newSimLocks(ctx, r)
			store := newSimChunks(r)
			chunks := store.clerk(1, func(context.Context) error { return nil })
			solo := newSoloServer(t, ctx, locks, chunks)
			_, _, _, ah, rh := ownedLog(t, ctx, solo, chunks)
			pc := &pausingChunks{simChunkClerk: chunks, locks: locks, clerk: solo.clerk}
			solo.cache.cfg.Chunks = pc
			cfg := Config{NodeSize: MinNodeSize}
			if what == "value chunk" {
				cfg.MaxInline = 4 // "k1" and "v1" with their lengths: in a chunk of its own
			}
			tr, err := New(solo.cache.Store(ah, MinNodeSize, nil), ah.ID, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tr.Put(ctx, []byte("k1"), []byte("v1"), Cond{}); err != nil {
				t.Fatal(err)
			}
			if err := solo.cache.FlushAll(ctx); err != nil {
				t.Fatal(err)
			}
			if what == "node image" {
				solo.cache.Drop(rh) // the next read of the leaf misses
				pc.h = rh
			} else {
				leaf, err := store.clerk(0, func(context.Context) error { return nil }).Read(ctx, rh, MinNodeSize)
				if err != nil {
					t.Fatal(err)
				}
				n, err := Decode(leaf, ah.ID, rh)
				if err != nil {
					t.Fatal(err)
				}
				refs := n.Refs()
				if len(refs) != 1 {
					t.Fatalf("the leaf holds %d value references, not 1", len(refs))
				}
				pc.h = refs[0].Chunk
			}
			pc.armed = true
			v, ok, err := tr.Get(ctx, []byte("k1"))
			if pc.armed {
				t.Fatal("the read to pause never came")
			}
			if !errors.Is(err, ErrLeaseExpired) {
				t.Fatalf("a %s read that outlived the leases was served: %q %v %v (want ErrLeaseExpired)", what, v, ok, err)
			}
		})
	}
}
