package btree

import (
	"context"
	"errors"
	"testing"
	"time"
)

// fakeClosingLog records what closeSequence asks of the server's log.
type fakeClosingLog struct {
	calls []string
}

func (l *fakeClosingLog) KeepLock() { l.calls = append(l.calls, "KeepLock") }
func (l *fakeClosingLog) Close(context.Context) error {
	l.calls = append(l.calls, "Close")
	return nil
}

// Outside review 24: a clean close whose cache failed for a reason of its
// own (not the close's deadline: a broken fence renewal, say) still closed
// the log, which then gave its lock up, since the log itself closed
// cleanly; the node's dirty-node leases stayed held. Once the node was
// declared dead the recovery of those leases did not cover the log's lock,
// so ReplayDead left the log alone, and the committed changes only the
// log had were lost. closeSequence now keeps the log's lock when the
// cache's shutdown fails (txn.Log.KeepLock before Close), and gives up
// neither the fence nor the clerk.
func TestCloseSequenceKeepsTheLogLockAfterAFailedShutdown(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, solo, tr, _, _, _ := r23Rig(t, ctx)
	if _, err := tr.Put(ctx, []byte("k2"), []byte("v2"), Cond{}); err != nil {
		t.Fatal(err)
	}
	if solo.cache.Dirty() == 0 {
		t.Fatal("nothing is dirty: the test would prove nothing")
	}
	// A fence renewal is owed (a node write of unknown outcome gave up)
	// and cannot be made: the write-back fails at once, long before the
	// close's deadline, with the log itself healthy.
	injected := errors.New("injected: the fence lock cannot be taken again")
	solo.cache.cfg.Renew = func(context.Context) error { return injected }
	solo.cache.mu.Lock()
	solo.cache.mu.owed = solo.cache.mu.paid + 1
	solo.cache.mu.Unlock()
	wal := &fakeClosingLog{}
	var fence fenceHolder
	clerkClosed := false
	err := closeSequence(ctx, solo.cache, wal, func() { t.Error("the log's lock was released after a failed close") }, &fence,
		func(context.Context) error { clerkClosed = true; return nil })
	if !errors.Is(err, injected) {
		t.Fatalf("closeSequence: %v, want the cache's failure", err)
	}
	if len(wal.calls) != 2 || wal.calls[0] != "KeepLock" || wal.calls[1] != "Close" {
		t.Fatalf("the log was asked %v, want [KeepLock Close]: a log that closes cleanly gives its lock up unless told to keep it", wal.calls)
	}
	if fence.released || clerkClosed {
		t.Fatalf("after a failed close: fence released %v, clerk closed %v; want neither (the leases wait for a recovery)", fence.released, clerkClosed)
	}
}
