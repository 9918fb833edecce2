package txn

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/lock"
)

// fakeLocks is a lock table of plain mutexes (every mode exclusive: the
// strictest case for deadlock), recording the order of events.
type fakeLocks struct {
	mu     sync.Mutex
	held   map[string]chan struct{}
	events []string
	fail   string // Acquire of this name fails
	seq    uint64
}

type fakeHold struct {
	f    *fakeLocks
	name string
	tok  lock.Token
}

func (h *fakeHold) Token() lock.Token { return h.tok }
func (h *fakeHold) Release() {
	h.f.mu.Lock()
	ch := h.f.held[h.name]
	delete(h.f.held, h.name)
	h.f.events = append(h.f.events, "release "+h.name)
	h.f.mu.Unlock()
	close(ch)
}

func (f *fakeLocks) Acquire(ctx context.Context, name string, mode lock.Mode) (*fakeHold, error) {
	if name == f.fail {
		return nil, errors.New("refused")
	}
	for {
		f.mu.Lock()
		ch, busy := f.held[name]
		if !busy {
			f.held[name] = make(chan struct{})
			f.seq++
			f.events = append(f.events, "acquire "+name)
			tok := lock.Token{Epoch: 1, Seq: f.seq}
			f.mu.Unlock()
			return &fakeHold{f: f, name: name, tok: tok}, nil
		}
		f.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func TestAcquireInOrder(t *testing.T) {
	f := &fakeLocks{held: map[string]chan struct{}{}}
	ctx := context.Background()
	s, err := AcquireInOrder(ctx, f.Acquire, map[string]lock.Mode{"tree/b": lock.Exclusive, "tree/a": lock.Shared, "chunk/9": lock.Exclusive, "tree/a0": lock.Exclusive})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"chunk/9", "tree/a", "tree/a0", "tree/b"}
	if got := s.Names(); !slices.Equal(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
	if fe := s.Fence("tree/a0"); fe == nil || fe.Name != "tree/a0" || fe.Token.Seq != 3 {
		t.Fatalf("fence %+v", fe)
	}
	if s.Fence("nope") != nil {
		t.Fatal("a fence for a lock not held")
	}
	s.Release()
	wantEv := []string{"acquire chunk/9", "acquire tree/a", "acquire tree/a0", "acquire tree/b",
		"release tree/b", "release tree/a0", "release tree/a", "release chunk/9"}
	if !slices.Equal(f.events, wantEv) {
		t.Fatalf("events %v, want %v", f.events, wantEv)
	}

	// A failure releases what was taken, latest first, and names the lock.
	f.events, f.fail = nil, "m"
	_, err = AcquireInOrder(ctx, f.Acquire, map[string]lock.Mode{"z": lock.Exclusive, "a": lock.Exclusive, "m": lock.Exclusive, "b": lock.Exclusive})
	if err == nil || len(f.held) != 0 {
		t.Fatalf("err %v, held %v", err, f.held)
	}
	if want := []string{"acquire a", "acquire b", "release b", "release a"}; !slices.Equal(f.events, want) {
		t.Fatalf("events %v, want %v", f.events, want)
	}
	if _, err := AcquireInOrder(ctx, f.Acquire, map[string]lock.Mode{"x": lock.None}); err == nil {
		t.Fatal("mode none accepted")
	}
}

// Callers that lock overlapping random sets never deadlock through the
// helper; the same sets taken in the callers' own orders do (the test's
// teeth: a lock order that is not one global order is caught).
func TestAcquireInOrderNoDeadlock(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("GROVE_TXN_SEED"); v != "" {
		seed, _ = strconv.ParseUint(v, 10, 64)
	}
	t.Logf("seed %d (replay: GROVE_TXN_SEED=%d)", seed, seed)
	run := func(sorted bool, patience time.Duration) error {
		f := &fakeLocks{held: map[string]chan struct{}{}}
		ctx, cancel := context.WithTimeout(context.Background(), patience)
		defer cancel()
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for g := 0; g < 8; g++ {
			wg.Add(1)
			go func(g int) {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(seed, uint64(g)))
				for i := 0; i < 200; i++ {
					names := []string{"a", "b", "c", "d", "e"}
					rng.Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
					names = names[:2+rng.IntN(3)]
					if sorted {
						want := map[string]lock.Mode{}
						for _, n := range names {
							want[n] = lock.Exclusive
						}
						s, err := AcquireInOrder(ctx, f.Acquire, want)
						if err != nil {
							errs <- err
							return
						}
						s.Release()
						continue
					}
					var hs []*fakeHold
					for _, n := range names {
						h, err := f.Acquire(ctx, n, lock.Exclusive)
						if err != nil {
							for _, h := range hs {
								h.Release()
							}
							errs <- fmt.Errorf("deadlock: %w", err)
							return
						}
						hs = append(hs, h)
						time.Sleep(10 * time.Microsecond)
					}
					for _, h := range hs {
						h.Release()
					}
				}
			}(g)
		}
		wg.Wait()
		close(errs)
		return <-errs
	}
	if err := run(true, 5*time.Second); err != nil {
		t.Fatalf("sorted acquisition (seed %d): %v", seed, err)
	}
	if err := run(false, 300*time.Millisecond); err == nil {
		t.Logf("unsorted acquisition did not deadlock this time (seed %d)", seed)
	} else {
		t.Logf("unsorted acquisition deadlocked, as it may: %v", err)
	}
}
