package txn

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"
)

// TestCheckpointAskedWhileOneRuns (outside review 57): an appender that
// finds no room asks for a checkpoint; one is running already, whose
// target predates the transactions that ended since, so it moves the head
// no further and broadcasts nothing. The appender must not sleep until
// its context ends: one more checkpoint runs after the first, and makes
// the room. Here the running checkpoint is a pretend one (the flag set
// from the start), ended by hand once the appender waits.
func TestCheckpointAskedWhileOneRuns(t *testing.T) {
	ctx := context.Background()
	d, st := newRevDev(16), newRevStore()
	l, err := Open(ctx, Config{Device: d, Fence: tok(1), Applier: st, Checkpointer: allCkpt{}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)
	l.mu.Lock()
	l.mu.ckpt = true // a checkpoint is running (and moves nothing)
	l.mu.Unlock()
	img := bytes.Repeat([]byte("I"), 3000)
	filled := 0
	for {
		c, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		o := l.Begin()
		_, err := o.Update(c, []byte("o"), 0, img, nil)
		if err == nil {
			_, err = o.Commit(c, true)
		}
		cancel()
		if errors.Is(err, ErrLogFull) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		filled++
	}
	if filled == 0 {
		t.Fatal("setup: nothing fitted")
	}
	// The threshold trigger (completeLocked, as a flight lands) asks for
	// no second checkpoint: that would chain checkpoints, each forcing a
	// flush, while a long transaction pins the head (review 61).
	l.mu.Lock()
	l.mu.ckptAgain = false
	l.checkpointSoonLocked()
	again := l.mu.ckptAgain
	l.mu.Unlock()
	if again {
		t.Fatal("the threshold trigger asked for another checkpoint after the running one")
	}
	done := make(chan error, 1)
	go func() {
		c, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := l.Begin().Update(c, []byte("w"), 0, img, nil)
		done <- err
	}()
	time.Sleep(200 * time.Millisecond) // it waits for room, having asked
	select {
	case err := <-done:
		t.Fatalf("the appender did not wait for room: %v", err)
	default:
	}
	start := time.Now()
	l.mu.Lock()
	l.checkpointDoneLocked() // the running checkpoint ends, having moved nothing
	l.mu.Unlock()
	if err := <-done; err != nil {
		t.Fatalf("after %v the appender that asked during a checkpoint: %v (%d transactions filled the log)", time.Since(start), err, filled)
	}
	t.Logf("%d transactions filled the log; the appender got room %v after the running checkpoint ended", filled, time.Since(start).Round(time.Millisecond))
}
