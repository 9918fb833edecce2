package txn

// Pipelined group commit (Config.Flushes): two flushes in flight at once,
// the durable end moving in log order only.

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/rldev"
)

// heldWrite is a log write the test holds: it lands (or fails without
// landing) when the test sends on release.
type heldWrite struct {
	block   uint64
	release chan error
}

// holdDev holds every write after hold is set, until the test releases it.
type holdDev struct {
	*lockedDev
	mu      sync.Mutex
	hold    bool
	pending chan *heldWrite
	all     []*heldWrite
	// failCancelled: a held write, once released, fails if its context
	// was cancelled meanwhile (as a write through the RLDev clerk does
	// when its caller gives up).
	failCancelled bool
}

func (d *holdDev) Write(ctx context.Context, block uint64, data []byte, f *rldev.Fence) error {
	d.mu.Lock()
	hold := d.hold
	d.mu.Unlock()
	if hold {
		h := &heldWrite{block: block, release: make(chan error, 1)}
		d.mu.Lock()
		d.all = append(d.all, h)
		d.mu.Unlock()
		d.pending <- h
		if err := <-h.release; err != nil {
			return err
		}
		if err := ctx.Err(); err != nil && d.failCancelled {
			return err
		}
	}
	return d.lockedDev.Write(ctx, block, data, f)
}

func (d *holdDev) setHold(on bool) {
	d.mu.Lock()
	d.hold = on
	d.mu.Unlock()
}

// pipelined opens a log with background flushers (not Manual) on a holdDev.
func pipelined(t *testing.T, d *holdDev, f rldev.Fence, st *revStore) *Log {
	t.Helper()
	l, err := Open(context.Background(), Config{Device: d, Fence: f, Applier: st, Flushes: 2, LazyInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.setHold(false)
		d.mu.Lock()
		for _, h := range d.all { // a write a failed test left held
			select {
			case h.release <- nil:
			default:
			}
		}
		d.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = l.Close(ctx)
	})
	return l
}

// commitAsync runs one transaction of one update to target with a
// flush-on-commit, and reports its commit's outcome on the channel.
func commitAsync(l *Log, target string, val []byte) chan error {
	out := make(chan error, 1)
	go func() {
		tx := l.Begin()
		if _, err := tx.Update(context.Background(), []byte(target), 0, val, make([]byte, len(val))); err != nil {
			out <- err
			return
		}
		_, err := tx.Commit(context.Background(), true)
		out <- err
	}()
	return out
}

func nextHeld(t *testing.T, d *holdDev) *heldWrite {
	t.Helper()
	select {
	case h := <-d.pending:
		return h
	case <-time.After(5 * time.Second):
		t.Fatal("no second flush started while the first was in flight")
		return nil
	}
}

func notYet(t *testing.T, ch chan error, what string) {
	t.Helper()
	select {
	case err := <-ch:
		t.Fatalf("%s returned (%v) while a flush before its own was still in flight", what, err)
	case <-time.After(50 * time.Millisecond):
	}
}

// A later flush that lands first acknowledges nothing until the one before
// it has landed too.
func TestPipelinedFlushesAckInLogOrder(t *testing.T) {
	d := &holdDev{lockedDev: &lockedDev{d: newRevDev(HeaderBlocks + 256)}, pending: make(chan *heldWrite, 4)}
	l := pipelined(t, d, tok(1), newRevStore())
	d.setHold(true)
	a := commitAsync(l, "a", []byte("AAAAAAAA"))
	first := nextHeld(t, d)
	b := commitAsync(l, "b", []byte("BBBBBBBB"))
	second := nextHeld(t, d)
	if second.block <= first.block {
		t.Fatalf("second flight at block %d, first at %d", second.block, first.block)
	}
	durable := l.Durable()
	second.release <- nil
	notYet(t, b, "the second commit")
	if l.Durable() != durable {
		t.Fatalf("durable moved from %d to %d over a flush still in flight", durable, l.Durable())
	}
	first.release <- nil
	for _, ch := range []chan error{a, b} {
		if err := <-ch; err != nil {
			t.Fatal(err)
		}
	}
	if s := l.Stats(); s.Flushes != 2 || s.Durable <= durable {
		t.Fatalf("stats after both flights: %+v", s)
	}
}

// The first flight fails after the second has landed: neither commit is
// acknowledged, the log stops, and recovery does not take the second
// flight's commit for the log (its scan stops where the first is missing).
func TestPipelinedFirstFlushFailsSecondLanded(t *testing.T) {
	dev := newRevDev(HeaderBlocks + 256)
	d := &holdDev{lockedDev: &lockedDev{d: dev}, pending: make(chan *heldWrite, 4)}
	st := newRevStore()
	l := pipelined(t, d, tok(1), st)
	ok := commitAsync(l, "z", []byte("ZZZZZZZZ"))
	if err := <-ok; err != nil {
		t.Fatal(err)
	}
	d.setHold(true)
	a := commitAsync(l, "a", []byte("AAAAAAAA"))
	first := nextHeld(t, d)
	b := commitAsync(l, "b", []byte("BBBBBBBB"))
	second := nextHeld(t, d)
	second.release <- nil
	notYet(t, b, "the second commit")
	first.release <- errors.New("test: the first flight's write failed, nothing landed")
	for name, ch := range map[string]chan error{"a": a, "b": b} {
		if err := <-ch; err == nil {
			t.Errorf("commit %s acknowledged though the flush before or of it failed", name)
		}
	}
	if l.Err() == nil {
		t.Fatal("the log goes on after a failed flush")
	}
	d.setHold(false)
	l2, err := Open(context.Background(), Config{Device: d, Fence: tok(2), Applier: st, Manual: true})
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close(context.Background())
	rep := l2.Recovered()
	if len(rep.Committed) != 1 {
		t.Fatalf("recovery committed %v, want only the first transaction (scan: %s)", rep.Committed, rep.Why)
	}
	if got := st.get("b", 0, 8); !bytes.Equal(got, zero8) {
		t.Fatalf("the second flight's transaction was replayed: %q", got)
	}
	if got := st.get("z", 0, 8); !bytes.Equal(got, []byte("ZZZZZZZZ")) {
		t.Fatalf("the acknowledged transaction is lost: %q", got)
	}
}

// Under load a flush does not start beside one that carries a big group:
// the group grows instead (pipelineBelow).
func TestPipelineOnlyUnderLightLoad(t *testing.T) {
	d := &holdDev{lockedDev: &lockedDev{d: newRevDev(HeaderBlocks + 256)}, pending: make(chan *heldWrite, 4)}
	l := pipelined(t, d, tok(1), newRevStore())
	d.setHold(true)
	// A flight of 8 updates and their commits (more than pipelineBelow).
	var txs []*Txn
	for i := range 8 {
		tx := l.Begin()
		if _, err := tx.Update(context.Background(), []byte{byte('a' + i)}, 0, zero8, zero8); err != nil {
			t.Fatal(err)
		}
		txs = append(txs, tx)
	}
	var outs []chan error
	for _, tx := range txs {
		out := make(chan error, 1)
		go func() { _, err := tx.Commit(context.Background(), true); out <- err }()
		outs = append(outs, out)
	}
	first := nextHeld(t, d) // the updates and at least one commit record
	more := commitAsync(l, "m", zero8)
	select {
	case h := <-d.pending:
		h.release <- nil
		t.Fatalf("a second flight started at block %d beside one of at least 8 records (pipelineBelow %d)", h.block, pipelineBelow)
	case <-time.After(100 * time.Millisecond):
	}
	d.setHold(false)
	first.release <- nil
	for _, ch := range append(slices.Clone(outs), more) {
		if err := <-ch; err != nil {
			t.Fatal(err)
		}
	}
}
