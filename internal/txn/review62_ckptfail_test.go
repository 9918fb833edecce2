package txn

// Outside review 62 of f6112b4 (a failed background checkpoint tells the
// appenders waiting for room).

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// gateCkpt: its first write-back blocks until gate closes, then fails
// (a transient fault); every later one succeeds, taking 20 ms (chunk
// writes made durable on two replicas take milliseconds).
type gateCkpt struct {
	calls   *atomic.Int32
	entered chan struct{}
	gate    chan struct{}
}

func (c gateCkpt) WriteBack(context.Context, LSN) error {
	if c.calls.Add(1) == 1 {
		close(c.entered)
		<-c.gate
		return errors.New("transient write-back fault")
	}
	time.Sleep(20 * time.Millisecond)
	return nil
}

// review62Setup: a checkpoint (the threshold trigger's) blocked in its
// write-back, and an appender waiting for room behind it, having asked
// for another (ckptAgain). It returns the appender's result.
func review62Setup(t *testing.T, ck gateCkpt) (*Log, chan error) {
	t.Helper()
	ctx := context.Background()
	l, err := Open(ctx, Config{Device: &lockedDev{d: newRevDev(16)}, Fence: tok(1), Applier: newRevStore(), Checkpointer: ck})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close(ctx) })
	img := bytes.Repeat([]byte("I"), 3000)
	done := make(chan error, 1)
	waited := new(atomic.Bool)
	go func() {
		for i := 0; i < 1000; i++ {
			err := commitImage(ctx, l, 10*time.Second, img)
			if err != nil || waited.Load() {
				done <- err // (the operation that waited for room)
				return
			}
		}
		done <- errors.New("setup: the log never filled")
	}()
	deadline := time.Now().Add(5 * time.Second)
	for {
		l.mu.Lock()
		again := l.mu.ckptAgain
		l.mu.Unlock()
		if again {
			waited.Store(true)
			break
		}
		select {
		case err := <-done:
			t.Fatalf("setup: the appender ended before waiting: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("setup: no appender waited behind the running checkpoint")
		}
		time.Sleep(time.Millisecond)
	}
	return l, done
}

// TestReview62EarlierCheckpointFailureFailsAppender: the checkpoint that
// fails is one that was running before the appender needed room (the
// threshold trigger's); the appender asked for one more (ckptAgain),
// which starts as the first ends and succeeds. The appender should get
// that room; it gets ErrLogFull carrying the earlier checkpoint's error.
func TestReview62EarlierCheckpointFailureFailsAppender(t *testing.T) {
	ck := gateCkpt{calls: new(atomic.Int32), entered: make(chan struct{}), gate: make(chan struct{})}
	l, done := review62Setup(t, ck)
	close(ck.gate) // the running checkpoint fails; the one asked for runs next
	err := <-done
	deadline := time.Now().Add(2 * time.Second)
	for l.Stats().Checkpoints == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	st := l.Stats()
	t.Logf("checkpoints that succeeded: %d; write-backs: %d; head %d, durable %d", st.Checkpoints, ck.calls.Load(), st.Head, st.Durable)
	if err != nil {
		t.Fatalf("the appender waiting behind a failing checkpoint, whose own (ckptAgain) then succeeded: %v", err)
	}
}

// TestReview62FailedLogReportedAsFull: the log fails (a flush fenced, say)
// while the running checkpoint's write-back fails too. The appender
// waiting for room should hear the log's sticky error; if the checkpoint
// goroutine takes l.mu before it, it hears ErrLogFull with the
// write-back's error instead, which does not wrap the log's error.
func TestReview62FailedLogReportedAsFull(t *testing.T) {
	ck := gateCkpt{calls: new(atomic.Int32), entered: make(chan struct{}), gate: make(chan struct{})}
	l, done := review62Setup(t, ck)
	sticky := errors.New("the log's flush was fenced")
	l.mu.Lock()
	close(ck.gate)                    // the write-back fails ...
	time.Sleep(20 * time.Millisecond) // ... and its goroutine queues on l.mu
	l.failLocked(sticky)              // the log fails: the appender wakes, queues behind it
	time.Sleep(5 * time.Millisecond)
	l.mu.Unlock()
	err := <-done
	if !errors.Is(err, sticky) {
		t.Fatalf("the appender waiting when the log failed: %v (errors.Is ErrLogFull %v), want the log's error", err, errors.Is(err, ErrLogFull))
	}
}
