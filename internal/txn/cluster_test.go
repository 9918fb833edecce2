package txn_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/bench"
	"github.com/grovestore/grove/internal/chunk"
	"github.com/grovestore/grove/internal/meta"
	"github.com/grovestore/grove/internal/rldev"
	"github.com/grovestore/grove/internal/txn"
)

func testLog() *slog.Logger {
	if os.Getenv("GROVE_LOG") == "" {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// memApplier keeps the replayed images by target.
type memApplier struct {
	mu    sync.Mutex
	pages map[string][]byte
}

func (a *memApplier) Apply(ctx context.Context, target []byte, off uint64, data []byte, lsn txn.LSN, f *rldev.Fence) error {
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

// A log on a real RLDev, found through the config service: node 1 opens it
// and commits, leaves a transaction open and a lazy commit unflushed, and
// stops; node 2 takes the log's lock, recovers it onto chunks of a pair on
// nodes 2 and 3 (the committed transactions redone, the open one undone,
// the unflushed lazy one gone whole), and the old owner, still holding its
// Log, can write nothing more.
func TestNamedLogFailover(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := bench.StartCluster(t.TempDir(), 3, bench.ClusterOptions{Store: true, DiskSize: 64 << 20, Log: testLog()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	mc := meta.NewClient(c.Members())
	defer mc.Close()
	rl := rldev.NewClerk(mc)
	defer rl.Close()
	var e txn.Entry
	for ctx.Err() == nil { // the nodes register their disks first
		if e, err = txn.CreateLog(ctx, mc, rl, "boxfs", 1<<20); err == nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("log %q on RLDev %d (%d blocks)", e.Name, e.RLDev, e.Blocks)
	if _, err := txn.CreateLog(ctx, mc, rl, "boxfs", 1<<20); !errors.Is(err, txn.ErrLogExists) {
		t.Fatalf("a second create: %v", err)
	}
	if _, err := txn.CreateLog(ctx, mc, rl, "no/slash", 1<<20); err == nil {
		t.Fatal("a bad name accepted")
	}
	if _, err := c.WaitLockMaster(ctx); err != nil {
		t.Fatal(err)
	}
	for ctx.Err() == nil { // every node registers its disk
		if _, err = chunk.CreatePair(ctx, mc, [2]uint64{2, 3}, 1<<20, 8<<20); err == nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	cl := chunk.NewClerk(mc)
	defer cl.Close()
	handles := map[string]chunk.Handle{}
	target := func(name string) []byte {
		t.Helper()
		h, ok := handles[name]
		if !ok {
			if h, err = cl.Allocate(ctx, 4096, 0); err != nil {
				t.Fatal(err)
			}
			handles[name] = h
		}
		return txn.ChunkTarget(h)
	}
	for i := 0; i < 10; i++ {
		for j := 0; j < 2; j++ {
			target(fmt.Sprintf("chunk-%d-%d", i, j))
		}
	}
	for _, n := range []string{"other", "lazy", "after"} {
		target(n)
	}
	// A chunk freed before recovery: its records are skipped.
	freed := target("freed")
	if err := cl.Free(ctx, handles["freed"]); err != nil {
		t.Fatal(err)
	}

	open := func(i int, ap txn.Applier) *txn.Log {
		t.Helper()
		l, err := txn.OpenNamed(ctx, txn.NamedConfig{Meta: mc, RLDev: rl, Lock: txn.ClerkLocker(c.Nodes[i].Locks().DefaultClerk()), Name: "boxfs",
			Config: txn.Config{Applier: ap, LazyInterval: time.Hour}})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	a1 := &memApplier{pages: map[string][]byte{}}
	l1 := open(0, a1)
	if !l1.Recovered().NewLog {
		t.Fatalf("a new log recovered as %+v", l1.Recovered())
	}
	// Ten committed transactions of two updates each, concurrently.
	want := map[string][]byte{}
	var wmu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, 10)
	for i := 0; i < 10; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			tx := l1.Begin()
			for j := 0; j < 2; j++ {
				name := fmt.Sprintf("chunk-%d-%d", i, j)
				val := bytes.Repeat([]byte{byte(i*2 + j + 1)}, 100+i)
				if _, err := tx.Update(ctx, txn.ChunkTarget(handles[name]), 10, val, make([]byte, len(val))); err != nil {
					errs <- err
					return
				}
				wmu.Lock()
				want[name] = append(make([]byte, 10), val...)
				wmu.Unlock()
			}
			if _, err := tx.Commit(ctx, true); err != nil {
				errs <- err
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	st := l1.Stats()
	t.Logf("node 1: %d commits in %d flushes (%d blocks)", st.Commits, st.Flushes, st.FlushBlocks)
	// An open transaction whose update is durable (a later sync commit
	// flushes it): recovery must undo it.
	open1 := l1.Begin()
	if _, err := open1.Update(ctx, target("chunk-0-0"), 10, bytes.Repeat([]byte{0xEE}, 100), want["chunk-0-0"][10:]); err != nil {
		t.Fatal(err)
	}
	tx := l1.Begin()
	if _, err := tx.Update(ctx, target("other"), 0, []byte("synced"), make([]byte, 6)); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Update(ctx, freed, 0, []byte("freed"), make([]byte, 5)); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Commit(ctx, true); err != nil {
		t.Fatal(err)
	}
	want["other"] = []byte("synced")
	// A lazy commit never flushed: lost whole.
	lazy := l1.Begin()
	if _, err := lazy.Update(ctx, target("lazy"), 0, []byte("gone"), make([]byte, 4)); err != nil {
		t.Fatal(err)
	}
	if _, err := lazy.Commit(ctx, false); err != nil {
		t.Fatal(err)
	}

	c.Stop(0) // node 1 goes; l1 lives on, a zombie owner
	start := time.Now()
	l2 := open(1, txn.ChunkApplier{Clerk: cl})
	rep := l2.Recovered()
	t.Logf("node 2 recovered in %v: %d records, %d committed, losers %v, %d redone, %d undone, replicas %v, %d repaired, %d rewritten",
		time.Since(start).Round(time.Millisecond), rep.Records, len(rep.Committed), rep.Losers, rep.Redone, rep.Undone, rep.Replicas, rep.Repaired, rep.Rewritten)
	if len(rep.Committed) != 11 || len(rep.Losers) != 1 || rep.Losers[0] != open1.ID() {
		t.Fatalf("recovered %+v", rep)
	}
	want["lazy"] = nil // an unflushed lazy commit is lost whole
	for name, w := range want {
		got, err := cl.Read(ctx, handles[name], 0, 4096)
		if err != nil {
			t.Fatal(err)
		}
		if w = append(w, make([]byte, 4096-len(w))...); !bytes.Equal(got, w) {
			t.Fatalf("chunk %s after recovery: %x..., want %x...", name, got[:32], w[:32])
		}
	}
	// The zombie: its lazy commit's flush is refused, and so is a page
	// write-back it fences with its token (the recovery's replay wrote the
	// chunks' RLDev under the newer one).
	if err := l1.FlushNow(ctx); !errors.Is(err, txn.ErrFenced) {
		t.Fatalf("the deposed owner's flush: %v (want ErrFenced)", err)
	}
	if err := cl.WriteFenced(ctx, handles["other"], 0, []byte("zombie"), l1.Fence()); !errors.Is(err, chunk.ErrFenced) {
		t.Fatalf("the deposed owner's fenced chunk write: %v (want chunk.ErrFenced)", err)
	}
	// The new owner goes on.
	tx = l2.Begin()
	if _, err := tx.Update(ctx, target("after"), 0, []byte("failover"), make([]byte, 8)); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Commit(ctx, true); err != nil {
		t.Fatal(err)
	}
	if err := l2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	// Reopened on node 3: the log holds the last commit (no checkpointer
	// ran), and node 2's lock was released by Close.
	a3 := &memApplier{pages: map[string][]byte{}}
	l3 := open(2, a3)
	defer l3.Close(ctx)
	if got := a3.pages[string(target("after"))]; !bytes.Equal(got, []byte("failover")) {
		t.Fatalf("after reopening: %q", got)
	}
}
