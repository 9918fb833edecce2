package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/grovestore/grove/internal/rldev"
	"github.com/grovestore/grove/internal/transport"
	"github.com/grovestore/grove/internal/txn"
)

// logApplier keeps what a recovery replays, by target.
type logApplier struct {
	mu    sync.Mutex
	pages map[string][]byte
}

func (a *logApplier) Apply(ctx context.Context, target []byte, off uint64, data []byte, lsn txn.LSN, f *rldev.Fence) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	p := a.pages[string(target)]
	if need := int(off) + len(data); len(p) < need {
		p = append(p, make([]byte, need-len(p))...)
	}
	copy(p[off:], data)
	a.pages[string(target)] = p
	return nil
}

// TestEndToEndLogSIGKILL: a log on `grove up --processes`, owned by this
// test process through a lock held on the node that holds no replica of the
// log's RLDev. Four committers commit transactions of two updates each with
// flush-on-commit while the node of the RLDev's primary segment is
// SIGKILLed under them (commits go on once the RLDev is degraded); that
// node restarts; then the owner's lock node is SIGKILLed: the lease is
// lost and the log refuses everything. A new owner, holding the lock
// through the third node, recovers the log: every acknowledged commit is
// there with both its updates, no transaction is there in part.
func TestEndToEndLogSIGKILL(t *testing.T) {
	_, u, ctx := startCluster(t, 9700)
	mc := upMeta(t, ctx, u)
	rl := rldev.NewClerk(mc)
	defer rl.Close()
	var e txn.Entry
	var err error
	for ctx.Err() == nil {
		if e, err = txn.CreateLog(ctx, mc, rl, "e2e", 4<<20); err == nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	tab, err := rl.Table(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	rec := tab.RLDevs[e.RLDev]
	primary, secondary := rec.Segs[rec.Primary].Node, rec.Segs[1-rec.Primary].Node
	var lockNode uint64
	for id := range u.Nodes {
		if id != primary && id != secondary {
			lockNode = id
		}
	}
	t.Logf("log on RLDev %d: primary segment on node %d, secondary on %d; the owner's lock through node %d", e.RLDev, primary, secondary, lockNode)
	dial := func(id uint64) *grpc.ClientConn {
		t.Helper()
		cc, err := grpc.NewClient(u.Nodes[id].GRPC, transport.DialOptions()...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return cc
	}
	open := func(id uint64, ap txn.Applier) *txn.Log {
		t.Helper()
		octx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		l, err := txn.OpenNamed(octx, txn.NamedConfig{Meta: mc, RLDev: rl, Lock: txn.RemoteLocker(dial(id)), Name: "e2e",
			Config: txn.Config{Applier: ap}})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	l1 := open(lockNode, &logApplier{pages: map[string][]byte{}})

	// Each transaction writes its number to two targets of its own.
	var mu sync.Mutex
	acked := map[int]bool{}
	tried := map[int]bool{}
	var lastErr error
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := w; ; i += 4 {
				select {
				case <-stop:
					return
				default:
				}
				val := []byte(fmt.Sprintf("txn-%06d", i))
				tx := l1.Begin()
				mu.Lock()
				tried[i] = true
				mu.Unlock()
				var err error
				for _, k := range []string{"a", "b"} {
					if err == nil {
						_, err = tx.Update(ctx, []byte(fmt.Sprintf("%s-%d", k, i)), 0, val, make([]byte, len(val)))
					}
				}
				if err == nil {
					cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
					_, err = tx.Commit(cctx, true)
					cancel()
				}
				mu.Lock()
				if err == nil {
					acked[i] = true
				} else {
					lastErr = err
				}
				mu.Unlock()
				if err != nil {
					return
				}
			}
		}(w)
	}
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(acked)
	}
	waitMore := func(n int, what string) {
		t.Helper()
		start := time.Now()
		for count() < n {
			if time.Since(start) > 60*time.Second {
				mu.Lock()
				defer mu.Unlock()
				t.Fatalf("%s: %d commits acknowledged, want %d (last error: %v)", what, len(acked), n, lastErr)
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Logf("%s: %d commits after %v", what, count(), time.Since(start).Round(time.Millisecond))
	}
	waitMore(200, "before any kill")
	if err := u.Kill(primary); err != nil {
		t.Fatal(err)
	}
	t.Logf("SIGKILL node %d (the log's primary segment)", primary)
	waitMore(count()+200, "degraded")
	if err := u.Restart(primary); err != nil {
		t.Fatal(err)
	}
	waitMore(count()+100, "node restarted")
	// Node 1 must be back among the observers before a second node goes:
	// with two of three observers gone, node 2 would fence itself.
	if err := u.WaitAllHeard(ctx); err != nil {
		t.Fatal(err)
	}
	if err := u.Kill(lockNode); err != nil {
		t.Fatal(err)
	}
	t.Logf("SIGKILL node %d (the owner's lock)", lockNode)
	// The owner learns it lost its lease (the stream broke): the log fails.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if errors.Is(l1.Err(), txn.ErrFenced) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the owner's log after its lock node died: %v", l1.Err())
		}
	}
	close(stop)
	wg.Wait()
	if _, err := l1.Begin().Update(ctx, []byte("late"), 0, []byte("x"), []byte{0}); err == nil {
		t.Fatal("a fenced log took an update")
	}

	ap := &logApplier{pages: map[string][]byte{}}
	start := time.Now()
	l2 := open(secondary, ap)
	defer l2.Close(ctx)
	rep := l2.Recovered()
	t.Logf("recovered through node %d in %v: %d records, %d committed, %d losers, replicas read %v, %d repaired, %d rewritten",
		secondary, time.Since(start).Round(time.Millisecond), rep.Records, len(rep.Committed), len(rep.Losers), rep.Replicas, rep.Repaired, rep.Rewritten)
	mu.Lock()
	defer mu.Unlock()
	for i := range tried {
		val := []byte(fmt.Sprintf("txn-%06d", i))
		a, b := ap.pages[fmt.Sprintf("a-%d", i)], ap.pages[fmt.Sprintf("b-%d", i)]
		okA, okB := bytes.Equal(a, val), bytes.Equal(b, val)
		switch {
		case acked[i] && !(okA && okB):
			t.Fatalf("transaction %d was acknowledged; after recovery a=%q b=%q", i, a, b)
		case okA != okB:
			t.Fatalf("transaction %d is there in part: a=%q b=%q", i, a, b)
		}
	}
	if len(rep.Committed) < len(acked) {
		t.Fatalf("%d committed in the log, %d acknowledged", len(rep.Committed), len(acked))
	}
	t.Logf("%d acknowledged commits all recovered; %d tried", len(acked), len(tried))
}
