package txn

// Outside review 68 (of b48d04c, the padAllowance fix of review 67).
//
// The fix's claim: with F the free stream bytes and R = l.mu.reserved,
// D = R - F stays below one Payload at all times, so every record
// appended from a reservation (a compensation, an UpdateReserved record,
// the end record of a transaction that set something aside) finds room,
// however many flushes fall between records. This test drives a Manual
// log (ErrLogFull at once, never a wait) with random transactions that
// mix undo-carrying and redo-only updates, Reserve + UpdateReserved,
// lazy commits, aborts whose undo callback flushes between compensations,
// FlushNow after almost anything, and direct checkpoints, over rings of
// 8 to 40 blocks, and checks after every step:
//
//   - D < Payload, and R equals the sum of the open transactions' reserves;
//   - no record appended from a reservation fails (Abort, UpdateReserved
//     within its reserve, Commit of a transaction holding a reserve);
//   - an empty transaction's Abort (nothing set aside) succeeds and leaves
//     nothing in l.mu.active.
//
// It passes on b48d04c (no counterexample found); with padAllowance = 0
// it fails (the review 67 hole).
//
//	go test -count=1 -run TestReview68 ./internal/txn

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
)

type r68Txn struct {
	t       *Txn
	planned [][]byte // images a Reserve set aside room for (UpdateReserved)
}

func r68Check(l *Log, open []*r68Txn) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	headSeq, _ := SeqOf(l.mu.head)
	bufSeq, _ := SeqOf(l.mu.bufLSN)
	f := int(l.ring-(bufSeq-headSeq))*Payload - len(l.mu.buf)
	if f < 0 {
		return fmt.Errorf("free bytes %d < 0", f)
	}
	if d := l.mu.reserved - f; d >= Payload {
		return fmt.Errorf("D = R - F = %d - %d = %d >= Payload", l.mu.reserved, f, d)
	}
	sum := 0
	for _, o := range open {
		sum += o.t.reserved
	}
	if sum != l.mu.reserved {
		return fmt.Errorf("open transactions reserve %d, the log counts %d", sum, l.mu.reserved)
	}
	return nil
}

func TestReview68ReservedAppendsAlwaysFit(t *testing.T) {
	seeds := 150
	if testing.Short() {
		seeds = 30
	}
	for seed := 1; seed <= seeds; seed++ {
		if err := r68Run(uint64(seed)); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
	}
}

func r68Run(seed uint64) error {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 68))
	ring := uint64(8 + rng.IntN(33))
	l, err := Open(ctx, Config{Device: newRevDev(HeaderBlocks + ring), Fence: tok(1), Applier: newRevStore(),
		Checkpointer: allCkpt{}, Manual: true})
	if err != nil {
		return err
	}
	defer l.Close(ctx)
	var open []*r68Txn
	flushSome := func() error {
		if rng.IntN(2) == 0 {
			return l.FlushNow(ctx)
		}
		return nil
	}
	img := func() []byte {
		n := 1 + rng.IntN(40)
		if rng.IntN(4) == 0 {
			n = 1 + rng.IntN(3000)
		}
		return bytes.Repeat([]byte{byte('a' + rng.IntN(26))}, n)
	}
	drop := func(i int) { open = append(open[:i], open[i+1:]...) }
	abort := func(i int) error {
		o := open[i]
		empty := o.t.reserved == 0
		id := o.t.id
		if err := o.t.Abort(ctx, func(Record) error { return flushSome() }); err != nil {
			return fmt.Errorf("abort of txn %d (empty %v): %w", id, empty, err)
		}
		if empty {
			l.mu.Lock()
			_, act := l.mu.active[id]
			l.mu.Unlock()
			if act {
				return fmt.Errorf("empty txn %d left in active", id)
			}
		}
		drop(i)
		return nil
	}
	for step := 0; step < 400; step++ {
		var err error
		x := rng.IntN(100)
		switch {
		case x < 10 && len(open) < 6:
			open = append(open, &r68Txn{t: l.Begin()})
		case x < 40 && len(open) > 0:
			o := open[rng.IntN(len(open))]
			redo := img()
			var undo []byte
			if rng.IntN(2) == 0 {
				undo = bytes.Repeat([]byte{'u'}, len(redo))
			}
			_, err = o.t.Update(ctx, []byte(fmt.Sprintf("t%d", rng.IntN(5))), uint64(rng.IntN(1000)), redo, undo)
			if errors.Is(err, ErrLogFull) {
				err = nil // admitted appends may be refused
			}
		case x < 48 && len(open) > 0:
			o := open[rng.IntN(len(open))]
			var imgs [][]byte
			n := 0
			for range 1 + rng.IntN(3) {
				im := img()
				imgs = append(imgs, im)
				n += RedoOnlySize([]byte("r"), im)
			}
			if uint64(n) > l.ring*Payload/4 {
				break
			}
			err = o.t.Reserve(ctx, n)
			if err == nil {
				o.planned = append(o.planned, imgs...)
			} else if errors.Is(err, ErrLogFull) {
				err = nil
			}
		case x < 58 && len(open) > 0:
			o := open[rng.IntN(len(open))]
			if len(o.planned) == 0 {
				break
			}
			im := o.planned[0]
			o.planned = o.planned[1:]
			if _, err = o.t.UpdateReserved([]byte("r"), uint64(rng.IntN(100)), im); err != nil {
				err = fmt.Errorf("UpdateReserved within its reserve: %w", err)
				break
			}
			err = flushSome()
		case x < 68 && len(open) > 0:
			i := rng.IntN(len(open))
			o := open[i]
			had := o.t.reserved
			_, err = o.t.Commit(ctx, false)
			if err == nil {
				drop(i)
			} else if had == 0 && errors.Is(err, ErrLogFull) {
				err = nil // an empty commit is admitted as an update is
			} else {
				err = fmt.Errorf("commit holding a reserve of %d: %w", had, err)
			}
		case x < 78 && len(open) > 0:
			err = abort(rng.IntN(len(open)))
		case x < 93:
			err = l.FlushNow(ctx)
		default:
			err = l.Checkpoint(ctx)
		}
		if err != nil {
			return fmt.Errorf("ring %d, step %d: %w", ring, step, err)
		}
		if err := r68Check(l, open); err != nil {
			return fmt.Errorf("ring %d, step %d: %w", ring, step, err)
		}
	}
	for len(open) > 0 {
		if err := abort(len(open) - 1); err != nil {
			return fmt.Errorf("ring %d, final: %w", ring, err)
		}
		if err := r68Check(l, open); err != nil {
			return fmt.Errorf("ring %d, final: %w", ring, err)
		}
	}
	return nil
}
