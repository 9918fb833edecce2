package txn

import (
	"context"
	"testing"
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
