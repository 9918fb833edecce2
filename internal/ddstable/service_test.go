package ddstable_test

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

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/bench"
	"github.com/grovestore/grove/internal/ddstable"
	"github.com/grovestore/grove/internal/meta"
)

func testLog() *slog.Logger {
	if os.Getenv("GROVE_LOG") == "" {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// The runtime end to end, in one process: three nodes, a table of four
// partitions with three replicas each; puts, removes and gets from two
// libraries at once; one node crashes, the failure detector declares it
// dead and its brick is decreed out of every group; writes and reads go
// on with the two survivors; every acknowledged write is read back from
// each survivor alone.
func TestServiceTableFailover(t *testing.T) {
	ctx, c, mc := startTables(t, 3*time.Minute)
	m, err := ddstable.CreateTable(ctx, mc, "users", 4, 3)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ddstable.CreateTable(ctx, mc, "users", 4, 3); err == nil {
		t.Fatal("a second table of the same name was created")
	}
	t.Logf("table: %d partitions, groups %v", m.DP.Len(), m.RG)

	libs := []*ddstable.Library{ddstable.NewLibrary(ddstable.LibraryConfig{Meta: mc}), ddstable.NewLibrary(ddstable.LibraryConfig{Meta: mc})}
	defer libs[0].Close()
	defer libs[1].Close()

	var mu sync.Mutex
	want := map[uint64][]byte{} // acknowledged writes; each key written by one library
	load := func(lib *ddstable.Library, from, to uint64, round int) error {
		for k := from; k < to; k++ {
			cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			var err error
			var v []byte
			if k%7 == 3 && round > 0 {
				err = lib.Remove(cctx, "users", k)
			} else {
				v = []byte(fmt.Sprintf("value %d round %d", k, round))
				err = lib.Put(cctx, "users", k, v)
			}
			cancel()
			if err != nil {
				return fmt.Errorf("key %d round %d: %w", k, round, err)
			}
			mu.Lock()
			if v == nil {
				delete(want, k)
			} else {
				want[k] = v
			}
			mu.Unlock()
		}
		return nil
	}
	check := func(lib *ddstable.Library, what string) {
		t.Helper()
		mu.Lock()
		defer mu.Unlock()
		for k := uint64(0); k < 200; k++ {
			got, found, err := lib.Get(ctx, "users", k)
			if err != nil {
				t.Fatalf("%s: get %d: %v", what, k, err)
			}
			w, ok := want[k]
			if found != ok || !bytes.Equal(got, w) {
				t.Fatalf("%s: key %d: got %q (found %v), want %q (found %v)", what, k, got, found, w, ok)
			}
		}
	}
	parallel := func(round int) {
		t.Helper()
		errs := make(chan error, 2)
		go func() { errs <- load(libs[0], 0, 100, round) }()
		go func() { errs <- load(libs[1], 100, 200, round) }()
		for range 2 {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
	}
	parallel(0)
	check(libs[0], "before the crash")

	c.Crash(2)
	start := time.Now()
	parallel(1) // waits, then goes on once the dead brick is decreed out
	t.Logf("writes during and after the failover took %v", time.Since(start))
	check(libs[1], "after the crash")

	// The maps no longer list node 3, and each survivor's replicas hold
	// every key: read each key from each survivor alone.
	ms, err := ddstable.ListTables(ctx, mc)
	if err != nil {
		t.Fatal(err)
	}
	for p, g := range ms[0].RG {
		for _, b := range g {
			if b.Node == 3 {
				t.Fatalf("partition %v still lists the dead node: %v", p, g)
			}
		}
		if len(g) != 2 {
			t.Fatalf("partition %v: group %v", p, g)
		}
	}
	if ms[0].Epoch < 2 {
		t.Fatalf("epoch %d after a removal", ms[0].Epoch)
	}
	for _, i := range []int{0, 1} {
		st, err := c.Nodes[i].Tables().Status(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		keys := uint64(0)
		for _, r := range st.Replicas {
			keys += r.Keys
			if r.InDoubt != 0 {
				t.Errorf("node %d: %d in doubt in %v", i+1, r.InDoubt, r.Partition)
			}
		}
		mu.Lock()
		if keys != uint64(len(want)) {
			t.Errorf("node %d holds %d keys, want %d", i+1, keys, len(want))
		}
		mu.Unlock()
	}
}

// The crashed node comes back: a new incarnation, which recovers into
// every group (DDS §4.3: a write lease, a copy of the whole partition, the
// join), so that each partition has three replicas again, node 3's as
// full as the others; writes go on through it.
func TestServiceTableRecovery(t *testing.T) {
	ctx, c, mc := startTables(t, 3*time.Minute)
	if _, err := ddstable.CreateTable(ctx, mc, "users", 4, 3); err != nil {
		t.Fatal(err)
	}
	lib := ddstable.NewLibrary(ddstable.LibraryConfig{Meta: mc})
	defer lib.Close()
	want := map[uint64]string{}
	put := func(from, to uint64, round int) {
		t.Helper()
		for k := from; k < to; k++ {
			v := fmt.Sprintf("%d/%d", k, round)
			if err := lib.Put(ctx, "users", k, []byte(v)); err != nil {
				t.Fatalf("put %d: %v", k, err)
			}
			want[k] = v
		}
	}
	put(0, 300, 0)
	c.Crash(2)
	put(0, 100, 1) // waits for the removal, then goes on with two replicas
	if err := c.Start(2); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for {
		ms, err := ddstable.ListTables(ctx, mc)
		if err == nil && len(ms) == 1 {
			full := true
			for _, g := range ms[0].RG {
				full = full && len(g) == 3
			}
			if full && len(ms[0].Joining) == 0 {
				t.Logf("every group has three replicas again %v after the restart (epoch %d)", time.Since(start).Round(time.Millisecond), ms[0].Epoch)
				break
			}
		}
		if !bench.SleepCtx(ctx, 200*time.Millisecond) {
			t.Fatal("the groups never got their third replica back")
		}
	}
	put(100, 200, 2) // through every replica, node 3's recovered ones too
	// Every replica of every partition holds the same number of keys.
	keys := map[string][]uint64{}
	for i := range 3 {
		var st *pb.TableBrickStatus
		for {
			var err error
			st, err = c.Nodes[i].Tables().Status(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if len(st.Replicas) == 4 {
				break
			}
			if !bench.SleepCtx(ctx, 100*time.Millisecond) {
				t.Fatalf("node %d serves %d replicas", i+1, len(st.Replicas))
			}
		}
		for _, r := range st.Replicas {
			p := fmt.Sprintf("%d/%d", r.Partition.Bits, r.Partition.Depth)
			keys[p] = append(keys[p], r.Keys)
		}
	}
	total := uint64(0)
	for p, ks := range keys {
		if len(ks) != 3 || ks[0] != ks[1] || ks[1] != ks[2] {
			t.Fatalf("partition %s: replicas hold %v keys", p, ks)
		}
		total += ks[0]
	}
	if total != uint64(len(want)) {
		t.Fatalf("%d keys in the replicas, %d written", total, len(want))
	}
	// Node 1 crashes too: every key reads back from the other two.
	c.Crash(0)
	for k, v := range want {
		got, found, err := lib.Get(ctx, "users", k)
		if err != nil || !found || string(got) != v {
			t.Fatalf("get %d: %q %v %v, want %q", k, got, found, err, v)
		}
	}
}

// Review 121, findings 2 and 3: a table dropped and created again (same
// name, same layout) is another table: its bricks serve it (empty), a
// library that knew the old one writes to the new one, and a library's
// write to a dropped table ends "no such table", not at its deadline.
func TestServiceTableDropCreate(t *testing.T) {
	ctx, c, mc := startTables(t, 2*time.Minute)
	if _, err := ddstable.CreateTable(ctx, mc, "t", 2, 3); err != nil {
		t.Fatal(err)
	}
	lib := ddstable.NewLibrary(ddstable.LibraryConfig{Meta: mc})
	defer lib.Close()
	if err := lib.Put(ctx, "t", 5, []byte("old table")); err != nil {
		t.Fatal(err)
	}
	if err := ddstable.DropTable(ctx, mc, "t"); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	err := lib.Put(wctx, "t", 6, []byte("x"))
	wcancel()
	if !errors.Is(err, ddstable.ErrNoTable) {
		t.Fatalf("a write to a dropped table: %v", err)
	}
	if _, err := ddstable.CreateTable(ctx, mc, "t", 2, 3); err != nil {
		t.Fatal(err)
	}
	if err := lib.Put(ctx, "t", 7, []byte("new table")); err != nil {
		t.Fatalf("the library that knew the dropped table, writing to the new one: %v", err)
	}
	for _, k := range []uint64{5, 7} {
		v, found, err := lib.Get(ctx, "t", k)
		if err != nil || found != (k == 7) || (k == 7 && string(v) != "new table") {
			t.Fatalf("key %d in the new table: %q %v %v", k, v, found, err)
		}
	}
	for i := range 3 {
		st, err := c.Nodes[i].Tables().Status(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		keys := uint64(0)
		for _, r := range st.Replicas {
			keys += r.Keys
		}
		if len(st.Replicas) != 2 || keys != 1 {
			t.Fatalf("node %d: %d replicas, %d keys", i+1, len(st.Replicas), keys)
		}
	}
}

// startTables starts three nodes in this process and waits until each
// has registered (and so runs a brick); everything stops with the test.
func startTables(t *testing.T, limit time.Duration) (context.Context, *bench.InProcessCluster, *meta.Client) {
	return startTablesWith(t, limit, bench.ClusterOptions{})
}

func startTablesWith(t *testing.T, limit time.Duration, o bench.ClusterOptions) (context.Context, *bench.InProcessCluster, *meta.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	t.Cleanup(cancel)
	o.Log = testLog()
	c, err := bench.StartCluster(t.TempDir(), 3, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	mc := meta.NewClient(c.Members())
	t.Cleanup(mc.Close)
	waitRegistered(t, ctx, mc, 3)
	return ctx, c, mc
}

func waitRegistered(t *testing.T, ctx context.Context, mc *meta.Client, n int) {
	t.Helper()
	for {
		ns, err := mc.Read(ctx, meta.NodesNamespace)
		if err == nil {
			if b, err := ddstable.Bricks(ns); err == nil && len(b) >= n {
				return
			}
		}
		if !bench.SleepCtx(ctx, 100*time.Millisecond) {
			t.Fatal("nodes did not register")
		}
	}
}
