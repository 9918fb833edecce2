package btree_test

import (
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
	"github.com/grovestore/grove/internal/btree"
	"github.com/grovestore/grove/internal/chunk"
	"github.com/grovestore/grove/internal/meta"
	"github.com/grovestore/grove/internal/rldev"
)

func testLog() *slog.Logger {
	if os.Getenv("GROVE_LOG") == "" {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type testCluster struct {
	c   *bench.InProcessCluster
	mc  *meta.Client
	rl  *rldev.Clerk
	cls []*chunk.Clerk
}

func startCluster(t testing.TB, ctx context.Context) *testCluster {
	return startClusterWith(t, ctx, bench.ClusterOptions{})
}

// startClusterWith starts the cluster with o (Store, DiskSize and Log are
// set here).
func startClusterWith(t testing.TB, ctx context.Context, o bench.ClusterOptions) *testCluster {
	t.Helper()
	o.Store, o.DiskSize, o.Log = true, 512<<20, testLog() // three 64 MiB logs (two replicas each) beside the chunk pair: 256 MiB disks could leave no room for the third log
	c, err := bench.StartCluster(t.TempDir(), 3, o)
	if err != nil {
		t.Fatal(err)
	}
	tc := &testCluster{c: c, mc: meta.NewClient(c.Members())}
	tc.rl = rldev.NewClerk(tc.mc)
	t.Cleanup(func() {
		for _, cl := range tc.cls {
			cl.Close()
		}
		tc.rl.Close()
		tc.mc.Close()
		c.Close()
	})
	if _, err := c.WaitLockMaster(ctx); err != nil {
		t.Fatal(err)
	}
	last := ""
	for ctx.Err() == nil { // every node registers its disk first
		if _, err = chunk.CreatePair(ctx, tc.mc, [2]uint64{2, 3}, 4<<20, 64<<20); err == nil {
			break
		}
		if err.Error() != last { // (a CI run once spent 3 minutes here: say why)
			last = err.Error()
			t.Logf("creating the chunk manager pair: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	return tc
}

// server is node i's own B-tree server (its role starts it at the first
// call).
func (tc *testCluster) server(t testing.TB, ctx context.Context, i int) *btree.Server {
	t.Helper()
	for {
		s, err := tc.c.Nodes[i].BTree().Server(ctx)
		if err == nil {
			return s
		}
		if ctx.Err() != nil {
			t.Fatalf("node %d's B-tree server: %v", i+1, err)
		}
		time.Sleep(100 * time.Millisecond) // the node is still joining
	}
}

// closeServer closes node i's B-tree role cleanly (dirty nodes written
// back, leases given back).
func (tc *testCluster) closeServer(i int) { tc.c.Nodes[i].BTree().Close() }

// The periodic Repair pass reads every node of a tree, so one server per
// tree runs it every RepairEvery: the tree's home, which opens the tree
// from the directory though no call reached it; the other servers, which
// have the tree open, run it only every RepairBackstop-th period.
func TestRepairPassOnHomeOnly(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const every = 100 * time.Millisecond
	tc := startClusterWith(t, ctx, bench.ClusterOptions{RepairEvery: every})
	const name = "repaired"
	home := int(btree.Home(name, []uint64{1, 2, 3})) - 1
	others := []int{(home + 1) % 3, (home + 2) % 3}
	s1, s2 := tc.server(t, ctx, others[0]), tc.server(t, ctx, others[1])
	if _, err := s1.CreateTree(ctx, name, btree.Config{MaxFanout: 6}); err != nil {
		t.Fatal(err)
	}
	var trees []*btree.Tree
	for _, s := range []*btree.Server{s1, s2} {
		tr, err := s.Open(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		trees = append(trees, tr)
	}
	for i := 0; i < 60; i++ {
		if _, err := trees[i%2].Put(ctx, []byte(fmt.Sprintf("k%03d", i)), []byte("v"), btree.Cond{}); err != nil {
			t.Fatal(err)
		}
	}
	// The home's server starts once the directory lists a tree; it is
	// asked for here only to read its counters.
	hs := tc.server(t, ctx, home)
	before := [2]uint64{trees[0].Stats.Passes.Load(), trees[1].Stats.Passes.Load()}
	start := time.Now()
	var ht *btree.Tree
	for ctx.Err() == nil {
		time.Sleep(every)
		var err error
		if ht, err = hs.Open(ctx, name); err != nil {
			t.Fatal(err)
		}
		if ht.Stats.Passes.Load() >= 20 {
			break
		}
	}
	if ctx.Err() != nil {
		t.Fatalf("the home (node %d) ran %d passes", home+1, ht.Stats.Passes.Load())
	}
	periods := uint64(time.Since(start)/every) + 1
	for i, tr := range trees {
		n := tr.Stats.Passes.Load() - before[i]
		t.Logf("node %d: %d passes in about %d periods (home node %d: %d)", others[i]+1, n, periods, home+1, ht.Stats.Passes.Load())
		if n > periods/btree.RepairBackstop+2 {
			t.Errorf("node %d, not the home, ran %d passes in about %d periods", others[i]+1, n, periods)
		}
	}

	// The home dies. Once the failure detector has heard nothing from it
	// for its grace period, the next home (the home over the other two
	// nodes) repairs the tree every period; the third node goes on with
	// its backstop only.
	next := int(btree.Home(name, []uint64{uint64(others[0] + 1), uint64(others[1] + 1)})) - 1
	third := others[0] + others[1] - next
	nt, tt := trees[0], trees[1]
	if others[1] == next {
		nt, tt = trees[1], trees[0]
	}
	tc.c.Crash(home)
	b0 := [2]uint64{nt.Stats.Passes.Load(), tt.Stats.Passes.Load()}
	for ctx.Err() == nil && nt.Stats.Passes.Load()-b0[0] < 40 {
		time.Sleep(every)
	}
	np, tp := nt.Stats.Passes.Load()-b0[0], tt.Stats.Passes.Load()-b0[1]
	t.Logf("home node %d crashed: the next home, node %d, ran %d passes; node %d ran %d", home+1, next+1, np, third+1, tp)
	if ctx.Err() != nil || np < 3*tp+10 {
		t.Errorf("with its home down, the tree is not repaired by its next home every period: node %d ran %d passes, node %d %d", next+1, np, third+1, tp)
	}
}

// Two B-tree servers on two nodes work on one tree at once: each inserts
// its own keys and reads the other's; every read sees every write that
// was acknowledged before it began (the caches stay coherent through the
// locks), and the tree's structure is sound when walked from the chunks.
func TestServersShareATree(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tc := startCluster(t, ctx)
	s1, s2 := tc.server(t, ctx, 0), tc.server(t, ctx, 1)
	if _, err := s1.CreateTree(ctx, "shared", btree.Config{MaxFanout: 6}); err != nil {
		t.Fatal(err)
	}
	t1, err := s1.Open(ctx, "shared")
	if err != nil {
		t.Fatal(err)
	}
	t2, err := s2.Open(ctx, "shared")
	if err != nil {
		t.Fatal(err)
	}
	const n = 150
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for w, tr := range []*btree.Tree{t1, t2} {
		wg.Add(1)
		go func(w int, tr *btree.Tree) {
			defer wg.Done()
			for i := 0; i < n; i++ {
				k := []byte(fmt.Sprintf("%03d.%d", i, w))
				if _, err := tr.Put(ctx, k, []byte(fmt.Sprint(i)), btree.Cond{}); err != nil {
					errs <- fmt.Errorf("server %d put %s: %w", w+1, k, err)
					return
				}
				// Ours reads back at once from the other server.
				other := []*btree.Tree{t2, t1}[w]
				if v, ok, err := other.Get(ctx, k); err != nil || !ok || string(v) != fmt.Sprint(i) {
					errs <- fmt.Errorf("server %d put %s, the other server reads %q %v %v", w+1, k, v, ok, err)
					return
				}
			}
		}(w, tr)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// Each server reads every key, including the other's.
	for w, tr := range []*btree.Tree{t1, t2} {
		for i := 0; i < n; i++ {
			for o := 0; o < 2; o++ {
				k := []byte(fmt.Sprintf("%03d.%d", i, o))
				v, ok, err := tr.Get(ctx, k)
				if err != nil || !ok || string(v) != fmt.Sprint(i) {
					t.Fatalf("server %d get %s = %q %v %v", w+1, k, v, ok, err)
				}
			}
		}
		c, err := tr.Count(ctx, btree.Span{})
		if err != nil || c != 2*n {
			t.Fatalf("server %d count = %d %v", w+1, c, err)
		}
	}
	// Deletes on one server are seen by the other at once.
	for i := 0; i < n; i += 2 {
		if r, err := t2.Delete(ctx, []byte(fmt.Sprintf("%03d.0", i)), btree.Cond{}); err != nil || !r.Applied {
			t.Fatalf("delete: %+v %v", r, err)
		}
		if _, ok, err := t1.Get(ctx, []byte(fmt.Sprintf("%03d.0", i))); err != nil || ok {
			t.Fatalf("server 1 still sees a key server 2 deleted: %v %v", ok, err)
		}
	}
	st := s1.Cache().Stats()
	t.Logf("server 1 cache: %+v", st)
	t.Logf("server 2 cache: %+v", s2.Cache().Stats())
	tc.closeServer(0)
	tc.closeServer(1)
}

// walkChunks walks tree name from its chunks (no cache) and checks its
// keys against want.
func walkChunks(t *testing.T, ctx context.Context, tc *testCluster, name string, want map[string]string) btree.Shape {
	t.Helper()
	e, err := btree.LookupTree(ctx, tc.mc, name)
	if err != nil {
		t.Fatal(err)
	}
	cl := chunk.NewClerk(tc.mc)
	defer cl.Close()
	sh, err := btree.Walk(ctx, btree.ChunkReader{Chunks: cl, Entry: e}, false)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for i, k := range sh.Keys {
		got[string(k)] = string(sh.Vals[i])
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("key %q: the chunks hold %q, want %q", k, got[k], v)
		}
	}
	if len(got) != len(want) {
		t.Fatalf("the chunks hold %d keys, want %d", len(got), len(want))
	}
	return sh
}

// A B-tree server dies with every change in its cache and its log only
// (nothing written back): the lock service keeps its leases, runs the
// recovery function on the other server, which replays the dead server's
// log, and only then lets the other server read the nodes. Every
// acknowledged put is there; the node's next server opens its log (already
// replayed) and reads them too.
func TestServerCrashRecovery(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	tc := startCluster(t, ctx)
	s1, s2 := tc.server(t, ctx, 0), tc.server(t, ctx, 1)
	if _, err := s1.CreateTree(ctx, "crash", btree.Config{MaxFanout: 6}); err != nil {
		t.Fatal(err)
	}
	t1, err := s1.Open(ctx, "crash")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for i := 0; i < 200; i++ {
		k, v := fmt.Sprintf("k%04d", (i*37)%1000), fmt.Sprint(i)
		if _, err := t1.Put(ctx, []byte(k), []byte(v), btree.Cond{}); err != nil {
			t.Fatal(err)
		}
		want[k] = v
	}
	if d := s1.Cache().Dirty(); d == 0 {
		t.Fatal("nothing is dirty: the test would prove nothing")
	} else {
		t.Logf("server 1 dies with %d dirty nodes", d)
	}
	start := time.Now()
	tc.c.Crash(0) // node 1 dies: its leases stay held until recovery
	t2, err := s2.Open(ctx, "crash")
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range want {
		got, ok, err := t2.Get(ctx, []byte(k))
		if err != nil || !ok || string(got) != v {
			t.Fatalf("after recovery, %s = %q %v %v, want %q", k, got, ok, err, v)
		}
	}
	t.Logf("server 2 read every key %v after server 1 stopped", time.Since(start).Round(time.Millisecond))
	// The recovery run left the collection of server 1's orphans to
	// server 2's background (Server.recoverDead's later), which ran it
	// after the run: the run's end, and the leases' release, did not
	// wait for it.
	for deadline := time.Now().Add(30 * time.Second); s2.LateCollectionsForTest() == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("server 2's recovery run left no collection of server 1's orphans to its background")
		}
	}
	// More changes on server 2, then node 1 comes back with a new server.
	for i := 0; i < 50; i++ {
		k := fmt.Sprintf("k%04d", i)
		if _, err := t2.Put(ctx, []byte(k), []byte("two"), btree.Cond{}); err != nil {
			t.Fatal(err)
		}
		want[k] = "two"
	}
	if err := tc.c.Start(0); err != nil {
		t.Fatal(err)
	}
	s1b := tc.server(t, ctx, 0)
	t1b, err := s1b.Open(ctx, "crash")
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range want {
		got, ok, err := t1b.Get(ctx, []byte(k))
		if err != nil || !ok || string(got) != v {
			t.Fatalf("node 1's new server: %s = %q %v %v, want %q", k, got, ok, err, v)
		}
	}
	tc.closeServer(1)
	tc.closeServer(0)
	sh := walkChunks(t, ctx, tc, "crash", want)
	t.Logf("tree: height %d, %d nodes, %d keys, %d downlinks missing", sh.Height, sh.Nodes, len(sh.Keys), sh.Missing)
}

// A drop cut off half-way (its server freed some leaves, then stopped) is
// finished by another server's next repair pass: every chunk of the tree
// is freed, the drop record goes, and the name is free for a new tree.
// Before the drop record, such a tree's chunks leaked under no name.
func TestDropResumes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tc := startCluster(t, ctx)
	s1, s2 := tc.server(t, ctx, 0), tc.server(t, ctx, 1)
	e, err := s1.CreateTree(ctx, "gone", btree.Config{MaxFanout: 6})
	if err != nil {
		t.Fatal(err)
	}
	t1, err := s1.Open(ctx, "gone")
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 300; i++ {
		if _, err := t1.Put(ctx, []byte(fmt.Sprintf("k%04d", (i*37)%1000)), []byte("v"), btree.Cond{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s1.Cache().FlushAll(ctx); err != nil {
		t.Fatal(err)
	}
	sh, err := btree.Walk(ctx, s1.Cache().Store(e.Anchor, e.NodeSize, nil), false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s1.BeginDrop(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	// Server 1 frees some leaves (the first ones a drop frees), then stops.
	cl := chunk.NewClerk(tc.mc)
	tc.cls = append(tc.cls, cl)
	freed := 0
	for h := range sh.Chunks {
		if h == e.Anchor || freed == 10 {
			continue
		}
		if n, err := btree.Decode(mustRead(t, ctx, cl, h, e.NodeSize), e.Anchor.ID, h); err == nil && n.Leaf() {
			if err := cl.Free(ctx, h); err != nil {
				t.Fatal(err)
			}
			freed++
		}
	}
	if ts, _, err := btree.ListTrees(ctx, tc.mc); err != nil || len(ts) != 0 {
		t.Fatalf("a dropped tree is listed: %v %v", ts, err)
	}
	// Before DropWait nothing is freed (an operation that began before the
	// drop may still be running).
	s2.FinishDrops(ctx, time.Hour)
	if _, err := cl.Read(ctx, e.Anchor, 0, 8); err != nil {
		t.Fatalf("the anchor was freed before the drop's wait: %v", err)
	}
	s2.FinishDrops(ctx, 0)
	for h := range sh.Chunks {
		if _, err := cl.Read(ctx, h, 0, 8); !errors.Is(err, chunk.ErrUnallocated) {
			t.Fatalf("chunk %v of the dropped tree is still allocated (%v) after the drop was finished", h, err)
		}
	}
	if _, err := s2.CreateTree(ctx, "gone", btree.Config{}); err != nil {
		t.Fatalf("the name of a dropped tree: %v", err)
	}
	s2.FinishDrops(ctx, 0) // nothing left to do
	t.Logf("%d chunks, %d freed before the cut; the rest freed by another server", len(sh.Chunks), freed)
}

func mustRead(t *testing.T, ctx context.Context, cl *chunk.Clerk, h btree.Handle, n int) []byte {
	t.Helper()
	b, err := cl.Read(ctx, h, 0, uint64(n))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A server that fails with its leases standing (its log failed) cannot go
// on: its node gives the incarnation up, the lock service recovers its log
// on another server, and the node's next incarnation starts a new server.
// Before, the node kept the failed server (every call through it failed)
// and its leases. (The failure is the cache's sticky error: its durable
// dirty nodes still go back on revocation, so server 2's reads do not
// show the replay; TestServerCrashRecovery and TestCrashPoints do.)
func TestFailedServerResigns(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tc := startCluster(t, ctx)
	s1, s2 := tc.server(t, ctx, 0), tc.server(t, ctx, 1)
	if _, err := s1.CreateTree(ctx, "fail", btree.Config{MaxFanout: 6}); err != nil {
		t.Fatal(err)
	}
	t1, err := s1.Open(ctx, "fail")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for i := 0; i < 150; i++ {
		k, v := fmt.Sprintf("k%04d", (i*37)%1000), fmt.Sprint(i)
		if _, err := t1.Put(ctx, []byte(k), []byte(v), btree.Cond{}); err != nil {
			t.Fatal(err)
		}
		want[k] = v
	}
	dirty := s1.Cache().Dirty()
	if dirty == 0 {
		t.Fatal("nothing is dirty: the test would prove nothing")
	}
	start := time.Now()
	s1.FailForTest(errors.New("test: the log failed"))
	t2, err := s2.Open(ctx, "fail")
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range want {
		got, ok, err := t2.Get(ctx, []byte(k))
		if err != nil || !ok || string(got) != v {
			t.Fatalf("after server 1 failed, %s = %q %v %v, want %q", k, got, ok, err, v)
		}
	}
	t.Logf("server 1 failed with %d dirty nodes; server 2 read every key %v later", dirty, time.Since(start).Round(time.Millisecond))
	for {
		s, err := tc.c.Nodes[0].BTree().Server(ctx)
		if err == nil && s != s1 {
			t1, err = s.Open(ctx, "fail")
			if err != nil {
				t.Fatal(err)
			}
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("node 1 has no new B-tree server: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for k, v := range want {
		if got, ok, err := t1.Get(ctx, []byte(k)); err != nil || !ok || string(got) != v {
			t.Fatalf("node 1's next server: %s = %q %v %v", k, got, ok, err)
		}
	}
}

// TestDropSettledAfterFailedDecree: a drop whose mark was made but whose
// decree failed is settled by the dropper's next pass: the name leaves the
// directory and the drop is recorded, without anyone touching the tree.
// Before, the name stayed listed until an operation or another drop
// found the anchor dropped.
func TestDropSettledAfterFailedDecree(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tc := startCluster(t, ctx)
	s1 := tc.server(t, ctx, 0)
	e, err := s1.CreateTree(ctx, "half", btree.Config{})
	if err != nil {
		t.Fatal(err)
	}
	s1.FailDropDecreesForTest(errors.New("test: the config service did not answer"))
	if _, err := s1.BeginDrop(ctx, "half"); err == nil {
		t.Fatal("the drop succeeded with its decree failing")
	}
	s1.FailDropDecreesForTest(nil)
	if ts, _, err := btree.ListTrees(ctx, tc.mc); err != nil || len(ts) != 1 {
		t.Fatalf("before the pass: %v %v (want the half-dropped tree listed)", ts, err)
	}
	s1.DropPassForTest(ctx)
	if ts, _, err := btree.ListTrees(ctx, tc.mc); err != nil || len(ts) != 0 {
		t.Fatalf("after the dropper's pass the half-dropped tree is still listed: %v %v", ts, err)
	}
	// Recorded: a pass with no wait frees its chunks.
	s1.FinishDrops(ctx, 0)
	cl := chunk.NewClerk(tc.mc)
	tc.cls = append(tc.cls, cl)
	if _, err := cl.Read(ctx, e.Anchor, 0, 8); !errors.Is(err, chunk.ErrUnallocated) {
		t.Fatalf("the anchor of the settled drop is still allocated: %v", err)
	}
}
