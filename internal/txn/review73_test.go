package txn

// Outside review 73 (a helper's): continuations and carried-over state in
// the transaction log. Each test replays one defect and fails on the code
// it was written against (main at b0531de).

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"
)

// A Close that finds the log closed already returns nil at once
// (log.go, Close: `if l.mu.closed { return nil }`), whatever the first
// Close did. Close's contract is "flushes what is buffered (lazy commits
// included) and stops the log", so nil tells its caller the lazy commits
// are durable. Schedule:
//
//  1. a transaction commits lazily (its records buffered, nothing flushed);
//  2. Close(ctx) with ctx already ended: the loop never runs, the
//     flushers stop, Close returns ctx's error (the lock is kept: right);
//  3. Close(background) again, as a caller retries a failed close: it
//     returns nil at once, the closed flag from step 2 deciding, though
//     nothing was flushed: Durable is below the commit's end, and the
//     next owner's recovery rolls the transaction back.
func TestReview73SecondCloseAfterFailedCloseReportsFlushed(t *testing.T) {
	ctx := context.Background()
	d, st := newRevDev(HeaderBlocks+64), newRevStore()
	l := openRev(t, d, tok(1), st)
	tx := l.Begin()
	if _, err := tx.Update(ctx, []byte("p"), 0, []byte("LAZYCOMT"), zero8); err != nil {
		t.Fatal(err)
	}
	end, err := tx.Commit(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	gone, cancel := context.WithCancel(ctx)
	cancel()
	if err := l.Close(gone); err == nil {
		t.Fatal("setup: a Close whose context had ended returned nil")
	}
	err = l.Close(ctx)
	durable := l.Durable()
	if err == nil && durable < end {
		t.Errorf("the second Close returned nil (\"flushed and stopped\") with the lazy commit ending at %d not durable (durable %d)", end, durable)
	}
	if err == nil {
		openRev(t, d, tok(2), st)
		if got := st.get("p", 0, 8); !bytes.Equal(got, []byte("LAZYCOMT")) {
			t.Errorf("after a Close that returned nil, recovery lost the lazy commit: store holds %q", got)
		}
	}
}

// Two Closes at once: the second returns nil at once while the first is
// still waiting out the flight that carries a commit; that flight then
// fails, the first Close fails, and the commit is lost, though the second
// Close said everything was flushed. Schedule:
//
//  1. a background log (Flushes 2) on a device that holds writes; a
//     synced commit's flight is held;
//  2. Close A starts: the flight is in flight, so it sleeps and looks
//     again (review 57's wait);
//  3. Close B: finds closed set and returns nil at once;
//  4. the held flight fails: the commit fails, the log fails, A returns
//     the error. B's nil acknowledged a record never durable.
func TestReview73ConcurrentCloseReturnsBeforeFlush(t *testing.T) {
	hd := &holdDev{lockedDev: &lockedDev{d: newRevDev(HeaderBlocks + 256)}, pending: make(chan *heldWrite, 4)}
	l, err := Open(context.Background(), Config{Device: hd, Fence: tok(1), Applier: newRevStore(), Flushes: 2, LazyInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	hd.setHold(true)
	a := commitAsync(l, "a", []byte("AAAAAAAA"))
	first := nextHeld(t, hd)
	l.mu.Lock()
	end := l.mu.bufLSN + LSN(len(l.mu.buf)) // every record appended so far ends below
	l.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	closeA := make(chan error, 1)
	go func() { closeA <- l.Close(ctx) }()
	time.Sleep(50 * time.Millisecond) // A is in its loop, the flight held
	type res struct {
		err     error
		durable LSN
	}
	closeB := make(chan res, 1)
	go func() {
		err := l.Close(ctx)
		closeB <- res{err, l.Durable()}
	}()
	var b res
	gotB := false
	select {
	case b = <-closeB:
		gotB = true
	case <-time.After(200 * time.Millisecond):
	}
	hd.setHold(false)
	first.release <- errors.New("test: the flight's write failed")
	if err := <-a; err == nil {
		t.Fatal("setup: the commit whose flight failed was acknowledged")
	}
	if err := <-closeA; err == nil {
		t.Fatal("setup: the first Close returned nil after its flight failed")
	}
	if !gotB {
		b = <-closeB
	}
	if b.err == nil && b.durable < end {
		t.Errorf("a Close concurrent with another returned nil (\"flushed\") with durable %d below %d, the end of the records appended before it; the flight then failed and the commit was lost", b.durable, end)
	}
}
