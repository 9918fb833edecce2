package txn

// Outside review 63 of f6112b4/cd00592: an appender's need is recomputed
// on every wake, so a wake that lands while a failing checkpoint runs
// moves its need past that checkpoint.

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

// slowFailCkpt: every write-back fails after 100 ms (an unreachable chunk
// store, an RPC timing out).
type slowFailCkpt struct{}

func (slowFailCkpt) WriteBack(ctx context.Context, _ LSN) error {
	select {
	case <-time.After(100 * time.Millisecond):
	case <-ctx.Done():
	}
	return errors.New("the chunk store timed out")
}

func review63Run(t *testing.T, noise int) (time.Duration, error) {
	ctx := context.Background()
	l, err := Open(ctx, Config{Device: &lockedDev{d: newRevDev(16)}, Fence: tok(1), Applier: newRevStore(), Checkpointer: slowFailCkpt{}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)
	img := bytes.Repeat([]byte("I"), 3000)
	for i := 0; ; i++ { // fill the log
		err := commitImage(ctx, l, 50*time.Millisecond, img)
		if errors.Is(err, ErrLogFull) {
			break
		} else if err != nil || i > 1000 {
			t.Fatalf("setup: %v", err)
		}
	}
	// Other clients with short deadlines, waiting for room too: each that
	// gives up broadcasts l.mu.space (its context.AfterFunc).
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < noise; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				c, cancel := context.WithTimeout(ctx, 5*time.Millisecond)
				l.Begin().Update(c, []byte("n"), 0, img, nil)
				cancel()
			}
		}()
	}
	defer func() { close(stop); wg.Wait() }()
	c, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	start := time.Now()
	_, err = l.Begin().Update(c, []byte("w"), 0, img, nil)
	return time.Since(start), err
}

// TestReview63WakesPostponeTheFailure: every checkpoint fails; an
// appender with a 3 s deadline should hear so (ErrLogFull with the
// write-back's error) after about one checkpoint and one backoff, as it
// does alone. With other clients giving up meanwhile, each wake during a
// running checkpoint moves its need to the next one, and it sleeps until
// its context ends.
func TestReview63WakesPostponeTheFailure(t *testing.T) {
	for _, noise := range []int{0, 2} {
		el, err := review63Run(t, noise)
		t.Logf("%d other clients: after %v: %v", noise, el.Round(time.Millisecond), err)
		if !errors.Is(err, ErrLogFull) || !strings.Contains(err.Error(), "timed out") || el > time.Second {
			t.Errorf("%d other clients: the appender heard after %v: %v; want the write-back's error within 1 s", noise, el.Round(time.Millisecond), err)
		}
	}
}
