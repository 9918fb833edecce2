package btree

import (
	"context"
	"testing"
	"time"
)

// readGate blocks the first Read after it is armed until released: an
// operation that holds a node's lease while its image loads.
type readGate struct {
	*simChunkClerk
	armed            bool
	entered, release chan struct{}
}

func (c *readGate) Read(ctx context.Context, h Handle, n uint64) ([]byte, error) {
	if c.armed {
		c.armed = false
		close(c.entered)
		<-c.release
	}
	return c.simChunkClerk.Read(ctx, h, n)
}

// TestShutdownReleasesLeasesOfOperationsInFlight: a clean close while an
// operation still holds a node's lease (a lookup loading its image).
// Shutdown's ReleaseAll gives up only unused pins; the operation's pin came
// back to the cache after it, and stayed: the clerk's close then refused
// (lock.ErrStillHeld), and the clean close left its leases to a recovery,
// as a crash does (the B-tree simulator's clean closes met it: 3 in 20
// seeds). Shutdown now gives those pins up as their operations end.
func TestShutdownReleasesLeasesOfOperationsInFlight(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var chunks *readGate
	_, solo, tr, wal, _, _ := closeRig(t, ctx, func(c *simChunkClerk) Chunks {
		chunks = &readGate{simChunkClerk: c, entered: make(chan struct{}), release: make(chan struct{})}
		return chunks
	})
	cache := solo.cache
	cache.ReleaseAll() // every image dropped: the next lookup loads under its lease
	chunks.armed = true
	got := make(chan error, 1)
	go func() {
		_, _, err := tr.Get(ctx, []byte("k1"))
		got <- err
	}()
	<-chunks.entered
	shut := make(chan error, 1)
	go func() { shut <- cache.Shutdown(ctx) }()
	time.Sleep(20 * time.Millisecond) // Shutdown's ReleaseAll has passed the lookup's pin
	close(chunks.release)
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	t.Logf("the lookup in flight: %v", <-got)
	if err := wal.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if hs := nodeHolds(solo.clerk.s, solo.clerk); len(hs) != 0 {
		t.Errorf("after a clean Shutdown, %v still held: the clerk's close is refused (lock.ErrStillHeld) and the leases wait for a recovery", hs)
	}
}
