package txn

import (
	"bytes"
	"context"
	"errors"
	"testing"
)

// Room set aside by Reserve is there for UpdateReserved when the log is
// otherwise full (a Manual log says ErrLogFull instead of waiting): the
// reserved update goes in without waiting, one larger than what is left
// of the reserve is refused, a reserve larger than a quarter of the ring
// is refused at once, and the transaction's end gives the room back (a
// new transaction can use it). Teeth: without the reserve, the same
// update finds the log full.
func TestReserveKeepsRoomForUpdateReserved(t *testing.T) {
	ctx := context.Background()
	d, st := newRevDev(16), newRevStore()
	l := openRev(t, d, tok(1), st)
	defer l.Close(ctx)
	img := bytes.Repeat([]byte("I"), 3000)
	size := RedoOnlySize([]byte("n"), img)
	tx := l.Begin()
	if _, err := tx.Update(ctx, []byte("n"), deltaOffForTest, []byte("small delta"), nil); err != nil {
		t.Fatal(err)
	}
	if err := tx.Reserve(ctx, 1<<20); err == nil {
		t.Fatal("a reserve of 1 MiB in a 13-block ring was taken")
	}
	if err := tx.Reserve(ctx, size); err != nil {
		t.Fatal(err)
	}
	// Other transactions fill the log.
	filled := 0
	for {
		o := l.Begin()
		if _, err := o.Update(ctx, []byte("o"), 0, img, nil); err != nil {
			if !errors.Is(err, ErrLogFull) {
				t.Fatal(err)
			}
			break
		}
		filled++
	}
	if filled == 0 {
		t.Fatal("no other transaction found room: the log is too small for the test")
	}
	// Teeth: a transaction without a reserve finds no room for the image.
	if _, err := l.Begin().Update(ctx, []byte("n"), 0, img, nil); !errors.Is(err, ErrLogFull) {
		t.Fatalf("an update without a reserve in a full log: %v", err)
	}
	if _, err := tx.UpdateReserved([]byte("n"), 0, append(img, 'x')); err == nil {
		t.Fatal("an update larger than the reserve was taken")
	}
	if _, err := tx.UpdateReserved([]byte("n"), 0, img); err != nil {
		t.Fatalf("the reserved update in a full log: %v", err)
	}
	if _, err := tx.UpdateReserved([]byte("n"), 0, []byte("again")); err == nil {
		t.Fatal("an update from a used-up reserve was taken")
	}
	if _, err := tx.Commit(ctx, true); err != nil {
		t.Fatal(err)
	}
	l.mu.Lock()
	reserved := l.mu.reserved
	l.mu.Unlock()
	if reserved != filled*abortReserve {
		t.Fatalf("after the commit %d bytes stay reserved, want the %d open transactions' %d each", reserved, filled, abortReserve)
	}
	t.Logf("%d other transactions filled the log; reserved after the commit: %d bytes (theirs)", filled, reserved)
}

const deltaOffForTest = 1
