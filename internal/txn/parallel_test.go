package txn

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/rldev"
)

// parStore is a revStore whose applier says its redo records are
// independent (ParallelApplier), keeps every committed update (Select),
// measures how many applies ran at once, and fails the target fail.
type parStore struct {
	*revStore
	n          int
	fail       string
	in, most   atomic.Int32
	mu         sync.Mutex
	applied    int
	failedOnce bool
}

func (p *parStore) Parallel() int { return p.n }

func (p *parStore) Select(pl Plan) (redo, undo []Record) {
	committed := map[uint64]bool{}
	for _, t := range pl.Committed {
		committed[t] = true
	}
	for _, r := range pl.Redo {
		if r.Kind == KindUpdate && committed[r.Txn] {
			redo = append(redo, r)
		}
	}
	return redo, nil
}

func (p *parStore) Apply(ctx context.Context, target []byte, off uint64, data []byte, lsn LSN, f *rldev.Fence) error {
	now := p.in.Add(1)
	defer p.in.Add(-1)
	for m := p.most.Load(); now > m && !p.most.CompareAndSwap(m, now); m = p.most.Load() {
	}
	time.Sleep(2 * time.Millisecond) // a replicated write's time, so that applies overlap
	if string(target) == p.fail {
		p.mu.Lock()
		p.failedOnce = true
		p.mu.Unlock()
		return errors.New("the target's disk failed")
	}
	p.mu.Lock()
	p.applied++
	p.mu.Unlock()
	return p.revStore.Apply(ctx, target, off, data, lsn, f)
}

// Recovery applies a ParallelApplier's redo records up to Parallel() at
// once, and every one of them; when one fails, recovery fails and writes
// no new header, so that the next recovery replays the same records.
func TestRecoverAppliesInParallel(t *testing.T) {
	ctx := context.Background()
	d, st := newRevDev(256), newRevStore()
	l := openRev(t, d, tok(1), st)
	const targets = 40
	for i := 0; i < targets; i++ {
		tx := l.Begin()
		if _, err := tx.Update(ctx, []byte(fmt.Sprintf("t%02d", i)), 0, []byte(fmt.Sprintf("value%03d", i)), nil); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Commit(ctx, true); err != nil {
			t.Fatal(err)
		}
	}
	// The owner dies. A recovery whose apply of one target fails.
	bad := &parStore{revStore: newRevStore(), n: 8, fail: "t17"}
	if _, err := Recover(ctx, d, tok(2), bad, Unsafe{}); err == nil || !bad.failedOnce {
		t.Fatalf("a recovery with a failing apply: %v (failed once %v)", err, bad.failedOnce)
	}
	// The next one, all well, applies every record, several at once.
	good := &parStore{revStore: st, n: 8}
	rep, err := Recover(ctx, d, tok(3), good, Unsafe{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Redone != targets || good.applied != targets {
		t.Fatalf("redone %d, applied %d, want %d (the failed recovery left a header that skipped records?)", rep.Redone, good.applied, targets)
	}
	if m := good.most.Load(); m < 2 || m > 8 {
		t.Fatalf("at most %d applies at once, want 2..8", m)
	}
	for i := 0; i < targets; i++ {
		if got := st.get(fmt.Sprintf("t%02d", i), 0, 8); !bytes.Equal(got, []byte(fmt.Sprintf("value%03d", i))) {
			t.Fatalf("target t%02d holds %q", i, got)
		}
	}
	t.Logf("%d records applied, at most %d at once", good.applied, good.most.Load())
}
