package txn

import (
	"bytes"
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// TestReview63CloseRearmsTimer: Close stops ckptTimer, then its own flush
// lands (completeLocked's threshold trigger, which checks no closed flag)
// during a backoff and arms a new one, never stopped; it fires after
// Close returned and takes l.mu (finding the log closed: no checkpoint).
func TestReview63CloseRearmsTimer(t *testing.T) {
	ctx := context.Background()
	armed := new(atomic.Bool)
	l, err := Open(ctx, Config{Device: &lockedDev{d: newRevDev(16)}, Fence: tok(1), Applier: newRevStore(), Checkpointer: failCkpt{armed}, LazyInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	armed.Store(true)
	img := bytes.Repeat([]byte("I"), 3000)
	for i := 0; i < 8; i++ { // above the threshold, below full
		o := l.Begin()
		if _, err := o.Update(ctx, []byte("o"), 0, img, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := o.Commit(ctx, true); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("before: %+v", l.Stats())
	l.mu.Lock()
	l.mu.ckptRetryAt = time.Now().Add(time.Second) // a backoff
	l.mu.Unlock()
	o := l.Begin()
	if _, err := o.Update(ctx, []byte("o"), 0, []byte("x"), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := o.Commit(ctx, false); err != nil { // lazy: Close flushes it
		t.Fatal(err)
	}
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	l.mu.Lock()
	tm := l.mu.ckptTimer
	l.mu.Unlock()
	time.Sleep(1100 * time.Millisecond) // let it fire (-race: its access to l.mu)
	if tm != nil {
		t.Errorf("after Close a checkpoint timer is armed (Stats %+v)", l.Stats())
	}
}
