package txn

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A log opened with OpenNamed gives its lock up when it closes cleanly,
// unless its owner asked it to keep the lock (KeepLock: the owner's own
// close failed, so the log may hold the only copy of committed changes and
// the recovery of the owner's leases must cover it).
func TestCloseKeepsTheLockWhenAsked(t *testing.T) {
	ctx := context.Background()
	for _, keep := range []bool{false, true} {
		l := openRev(t, newRevDev(64), tok(1), newRevStore())
		released := false
		l.release = func() { released = true }
		if keep {
			l.KeepLock()
		}
		if err := l.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if released == keep {
			t.Fatalf("KeepLock %v: the lock released %v", keep, released)
		}
	}
}

// A Flush after Close fails at once with ErrClosed (outside review 25):
// before, it queued a waiter that no flusher would ever serve, and a
// B-tree revocation writing a node back after a failed close waited
// forever, holding the node's latch.
func TestFlushAfterCloseFails(t *testing.T) {
	ctx := context.Background()
	l, err := Open(ctx, Config{Device: newRevDev(64), Fence: tok(1), Applier: newRevStore()})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := l.Flush(fctx, l.Durable()+1); !errors.Is(err, ErrClosed) {
		t.Fatalf("Flush after Close: %v, want ErrClosed at once", err)
	}
}
