package btree

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// pausedLocks is a clerk whose leases' guaranteed time the test sets.
type pausedLocks struct {
	*simClerk
	until atomic.Pointer[time.Time]
}

func (p *pausedLocks) ValidUntil() time.Time { return *p.until.Load() }

// A server paused past its leases' guaranteed time (its node has not yet
// noticed and fenced itself) must not answer from its cache: another
// server may hold the node's lease by then. Before the check, a cached
// read was served on the pin alone (an outside review's finding).
func TestCacheRefusesReadsPastLeaseTime(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	soon := time.Now().Add(300 * time.Millisecond) // the guarantee the last renewal gave
	var clerk *pausedLocks
	tr := newOneServerTree(t, ctx, nil, func(c *simClerk) Locks {
		clerk = &pausedLocks{simClerk: c}
		clerk.until.Store(&soon)
		return clerk
	}, Config{NodeSize: MinNodeSize})
	if _, err := tr.Put(ctx, []byte("a"), []byte("1"), Cond{}); err != nil {
		t.Fatal(err)
	}
	if v, ok, err := tr.Get(ctx, []byte("a")); err != nil || !ok || string(v) != "1" {
		t.Fatalf("get: %q %v %v", v, ok, err)
	}
	// The server pauses past the guarantee; its node has not renewed it
	// (deadlines only move forward, and this one did not).
	time.Sleep(time.Until(soon) + 10*time.Millisecond)
	if _, _, err := tr.Get(ctx, []byte("a")); !errors.Is(err, ErrLeaseExpired) {
		t.Fatalf("a cached read past the leases' time: %v, want ErrLeaseExpired", err)
	}
	if _, err := tr.Scan(ctx, Span{}, 0, false); !errors.Is(err, ErrLeaseExpired) {
		t.Fatalf("a cached scan past the leases' time: %v, want ErrLeaseExpired", err)
	}
	future := time.Now().Add(time.Hour)
	clerk.until.Store(&future) // the node renewed its lease
	if v, ok, err := tr.Get(ctx, []byte("a")); err != nil || !ok || string(v) != "1" {
		t.Fatalf("get after the renewal: %q %v %v", v, ok, err)
	}
}
