package txn

// Outside review 67: can Txn.Abort have to wait for log room?
//
// The accounting: with F the ring's free stream bytes,
// (ring - (bufSeq - headSeq))·Payload - len(buf), and R = l.mu.reserved,
// an admitted update or Reserve leaves F >= R. Compensations,
// UpdateReserved and end records take from R what they add to the stream
// (so F - R stays put or grows), but every flush that ends in a partial
// block takes its padding from F and nothing from R. Each transaction
// sets aside one Payload for padding (abortReserve), which covers one
// such flush; nothing bounds the number of flushes that may fall between
// a transaction's last admitted append and its abort record when the
// records in between are compensations (or UpdateReserved records):
// one flush each. And an Abort of a transaction that set nothing aside
// (its first Update failed: t.reserved == 0) appends its abort record
// with grow == 0, so it takes the updates' path (room for it and all of
// R) rather than the grow < 0 one.
//
// Each test below failed before the fix (the Abort got ErrLogFull, or
// waited for room until its context ended). The fix (log.go,
// padAllowance) sets aside a Payload with each record appended from a
// reservation, so a transaction admits fewer updates into the same room:
// the schedules below were made for the sizes before it, and now leave
// the ring more room (r67FillCommitted's blocks) or compute the sizes
// with the allowance.

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"
)

// r67Slack is F - R: what an admission may still take.
func r67Slack(l *Log) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	headSeq, _ := SeqOf(l.mu.head)
	bufSeq, _ := SeqOf(l.mu.bufLSN)
	return int(l.ring-(bufSeq-headSeq))*Payload - len(l.mu.buf) - l.mu.reserved
}

// r67FillCommitted fills k blocks of a 13-block ring with committed,
// flushed transactions (one block each) that the head does not pass (no
// checkpoint runs until the ring is at 95 %).
func r67FillCommitted(t *testing.T, l *Log, k int) {
	t.Helper()
	ctx := context.Background()
	img := bytes.Repeat([]byte("F"), 3000)
	for i := range k {
		o := l.Begin()
		if _, err := o.Update(ctx, []byte("f"), uint64(i)*3000, img, nil); err != nil {
			t.Fatalf("filler %d: %v", i, err)
		}
		if _, err := o.Commit(ctx, false); err != nil {
			t.Fatal(err)
		}
		if err := l.FlushNow(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if st := l.Stats(); st.RingBlocks != 13 || st.UsedBlocks != uint64(k) {
		t.Fatalf("setup: %d of %d blocks used, want %d of 13", st.UsedBlocks, st.RingBlocks, k)
	}
}

// The smallest schedule with compensations (Manual log: no checkpointer,
// ErrLogFull instead of a wait). Ring 13 blocks, 11 of them committed
// data: 2 blocks (8 112 bytes) free.
//
//  1. A logs two 1-byte updates (38 bytes each; set aside: two
//     compensations of 37, the abort record's 17, one Payload: 4 147).
//  2. A flush (any group commit, the lazy timer, a checkpoint) writes
//     A's updates: one block, padded. 1 block free.
//  3. A aborts: compensation 2 (37 bytes) is buffered.
//  4. A flush writes it: the last block, padded. 0 blocks free.
//  5. Compensation 1 (37 bytes) finds no room: ErrLogFull (with a
//     checkpointer: a wait, see below).
//
// A had set aside 4 147 bytes and its abort needs 37+37+17 = 91 of them,
// but two paddings (4 018 + 4 019 bytes) came out of the same room.
func TestReview67CompensationAfterTwoFlushes(t *testing.T) {
	ctx := context.Background()
	l := openRev(t, newRevDev(16), tok(1), newRevStore())
	defer l.Close(ctx)
	r67FillCommitted(t, l, 9)
	a := l.Begin()
	for i := 0; ; i++ { // as many as the log admits (a Manual log refuses at once)
		if _, err := a.Update(ctx, []byte("a"), uint64(i), []byte{'n'}, []byte{'o'}); err != nil {
			if !errors.Is(err, ErrLogFull) || i < 2 {
				t.Fatalf("A's update %d: %v", i, err)
			}
			break
		}
	}
	t.Logf("after A's updates: slack F-R = %d bytes, A set aside %d", r67Slack(l), a.reserved)
	if err := l.FlushNow(ctx); err != nil { // step 2
		t.Fatal(err)
	}
	err := a.Abort(ctx, func(Record) error {
		return l.FlushNow(ctx) // step 4: a flush between each two compensations
	})
	st := l.Stats()
	t.Logf("abort: %v; ring %d blocks, used %d, A still set aside %d", err, st.RingBlocks, st.UsedBlocks, a.reserved)
	if err != nil {
		t.Errorf("Abort after two flushes padded its room away: %v (errors.Is ErrLogFull: %v)", err, errors.Is(err, ErrLogFull))
	}
}

// The same hole where it hangs: A alone fills the ring (its first record
// is the head, so no checkpoint can make room), then aborts while a flush
// lands between each two of its compensations. The log has a checkpointer
// that always succeeds; Abort waits for room until its context ends
// (the B-tree server aborts with context.Background(): for ever).
func TestReview67AbortWaitsWithHeadPinned(t *testing.T) {
	ctx := context.Background()
	l, err := Open(ctx, Config{Device: &lockedDev{d: newRevDev(16)}, Fence: tok(1), Applier: newRevStore(),
		Checkpointer: allCkpt{}, CheckpointAt: 0.95, LazyInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)
	a := l.Begin()
	n := 0
	for ; ; n++ {
		r := Record{Kind: KindUpdate, Txn: a.id, Target: []byte("a"), Off: uint64(n), Redo: []byte{'n'}, Undo: []byte{'o'}}
		c := Record{Kind: KindCompensation, Txn: a.id, Target: []byte("a"), Off: uint64(n), Redo: []byte{'o'}}
		grow := c.Size() + padAllowance
		if n == 0 {
			grow += abortReserve
		}
		l.mu.Lock()
		fits := l.usedLocked(r.Size()+l.mu.reserved+grow) <= l.ring
		l.mu.Unlock()
		if !fits {
			break // (the next Update would wait: the ring is full)
		}
		if _, err := a.Update(ctx, r.Target, r.Off, r.Redo, r.Undo); err != nil {
			t.Fatalf("update %d: %v", n, err)
		}
		if n%40 == 39 { // group commits of others meanwhile
			if err := l.FlushNow(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Logf("A logged %d updates; slack F-R = %d; A set aside %d bytes", n, r67Slack(l), a.reserved)
	actx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	undone := 0
	err = a.Abort(actx, func(Record) error {
		undone++
		return l.FlushNow(ctx) // a flush lands between each two compensations
	})
	took := time.Since(start)
	head := l.Stats().Head
	ckErr := l.Checkpoint(ctx)
	st := l.Stats()
	t.Logf("abort after %d undos, %v: %v; a checkpoint then: %v, head %d -> %d (used %d of %d)",
		undone, took.Round(time.Millisecond), err, ckErr, head, st.Head, st.UsedBlocks, st.RingBlocks)
	if err != nil {
		t.Errorf("Abort waited %v for log room with its own first record at the head (%d of %d compensations logged): %v",
			took.Round(time.Millisecond), n-len(a.updates), n, err)
	}
}

// The abort of a transaction that set nothing aside: its first Update
// found the log full (ErrLogFull: "the transaction should abort"). Abort
// appends an abort record with grow == 0 (-t.reserved), so it needs room
// for the record and for everyone's reserve, as an update does. In the
// B-tree server (cache.go: abort(err) after a failed tx.Update, with
// context.Background()) this waits for a checkpoint; if that one fails
// too, Abort returns ErrLogFull and the server fails itself.
func TestReview67EmptyAbortNeedsRoom(t *testing.T) {
	img := func(l *Log) []byte {
		// B's first (redo-only) update leaves F - R == 0.
		base := RedoOnlySize([]byte("b"), []byte{0}) - padAllowance - 1
		n := r67Slack(l) - abortReserve - base
		return bytes.Repeat([]byte("B"), n)
	}
	t.Run("manual", func(t *testing.T) {
		ctx := context.Background()
		l := openRev(t, newRevDev(16), tok(1), newRevStore())
		defer l.Close(ctx)
		r67FillCommitted(t, l, 11)
		b := l.Begin() // open, holding its reserve
		if _, err := b.Update(ctx, []byte("b"), 0, img(l), nil); err != nil {
			t.Fatal(err)
		}
		c := l.Begin()
		_, uerr := c.Update(ctx, []byte("c"), 0, []byte("x"), nil)
		err := c.Abort(ctx, nil)
		t.Logf("slack %d; C's update: %v; C's abort (nothing logged, nothing set aside): %v", r67Slack(l), uerr, err)
		if err != nil {
			t.Errorf("Abort of a transaction with no records: %v", err)
		}
	})
	t.Run("failing checkpoint", func(t *testing.T) {
		ctx := context.Background()
		l, err := Open(ctx, Config{Device: &lockedDev{d: newRevDev(16)}, Fence: tok(1), Applier: newRevStore(),
			Checkpointer: r67FailCkpt{}, CheckpointAt: 0.95, LazyInterval: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close(ctx)
		r67FillCommitted(t, l, 11)
		b := l.Begin()
		if _, err := b.Update(ctx, []byte("b"), 0, img(l), nil); err != nil {
			t.Fatal(err)
		}
		c := l.Begin()
		uctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, uerr := c.Update(uctx, []byte("c"), 0, []byte("x"), nil)
		actx, cancel2 := context.WithTimeout(ctx, 5*time.Second) // (the B-tree: Background)
		defer cancel2()
		start := time.Now()
		err = c.Abort(actx, nil)
		t.Logf("C's update: %v; C's abort after %v: %v", uerr, time.Since(start).Round(time.Millisecond), err)
		if err != nil {
			t.Errorf("Abort of a transaction with no records, while checkpoints fail: %v (the B-tree server fails itself on this)", err)
		}
	})
}

type r67FailCkpt struct{}

func (r67FailCkpt) WriteBack(context.Context, LSN) error {
	return errors.New("chunk store unreachable")
}

// UpdateReserved records are the other neutral appends: two of them,
// each in a flush of its own, pad away the room of a redo-only
// transaction's abort (the B-tree's kind: it logs the race images with
// UpdateReserved under c.mu and aborts if that fails). UpdateReserved's
// "never waits, the room is there" fails first, then the Abort.
func TestReview67UpdateReservedFlushes(t *testing.T) {
	ctx := context.Background()
	l := openRev(t, newRevDev(16), tok(1), newRevStore())
	defer l.Close(ctx)
	r67FillCommitted(t, l, 8)
	x := l.Begin()
	if _, err := x.Update(ctx, []byte("x"), 0, []byte("d"), nil); err != nil {
		t.Fatal(err)
	}
	one := RedoOnlySize([]byte("x"), []byte("i"))
	if err := x.Reserve(ctx, 2*one); err != nil {
		t.Fatal(err)
	}
	// Another transaction, open, takes what is left: F - R == 0.
	b := l.Begin()
	base := RedoOnlySize([]byte("b"), []byte{0}) - padAllowance - 1
	if _, err := b.Update(ctx, []byte("b"), 0, bytes.Repeat([]byte("B"), r67Slack(l)-abortReserve-base), nil); err != nil {
		t.Fatal(err)
	}
	if s := r67Slack(l); s != 0 {
		t.Fatalf("setup: slack %d", s)
	}
	if err := l.FlushNow(ctx); err != nil {
		t.Fatal(err)
	}
	var urErr [2]error
	for i := range 2 {
		_, urErr[i] = x.UpdateReserved([]byte("x"), 0, []byte("i"))
		if err := l.FlushNow(ctx); err != nil {
			t.Fatal(err)
		}
	}
	err := x.Abort(ctx, nil)
	t.Logf("UpdateReserved: %v, %v; abort: %v", urErr[0], urErr[1], err)
	if urErr[1] != nil {
		t.Errorf("UpdateReserved from a reserve that holds room for it: %v", urErr[1])
	}
	if err != nil {
		t.Errorf("Abort of a redo-only transaction after its reserved updates were flushed one by one: %v", err)
	}
}
