package ddstable_test

import (
	"testing"
	"time"

	"github.com/grovestore/grove/internal/bench"
	"github.com/grovestore/grove/internal/ddstable"
)

// A library that dies after its prepares leaves 1 000 writes in doubt at
// every replica: the bricks resolve them through the config service's
// outcome registers, their proposals batched into a few decrees (review
// 121 measured 24 s for 300 with one decree each) and their queries to
// each other batched too, one call in flight per peer (with a call per
// query, 300 resolved nothing in 2 min on nodes starved by three CPU
// hogs under the race detector; batched, 2.3 s), and every write is
// committed at every replica (every member voted yes).
func TestServiceTableBatchedTermination(t *testing.T) {
	// A grace period of 5 s, not 1: under the race detector beside other
	// packages (CI's race phase, 2026-12-03) the three in-process nodes
	// were starved long enough that each fenced itself, and a partition
	// whose every replica fenced is lost (DDS-F6), which is not what this
	// test is about. Reproduced with CPU hogs: 4 runs in 4 with 1 s, the
	// log saying "self-fence: no acknowledgement from a majority".
	ctx, c, mc := startTablesWith(t, 2*time.Minute, bench.ClusterOptions{GracePeriod: 5 * time.Second})
	m, err := ddstable.CreateTable(ctx, mc, "t", 1, 3)
	if err != nil {
		t.Fatal(err)
	}
	for { // every brick serves the table
		ready := 0
		for i := range 3 {
			if st, err := c.Nodes[i].Tables().Status(ctx, nil); err == nil && len(st.Replicas) == 1 {
				ready++
			}
		}
		if ready == 3 {
			break
		}
		if !bench.SleepCtx(ctx, 50*time.Millisecond) {
			t.Fatal("the bricks never served the table")
		}
	}
	co, err := ddstable.NewCoordinator(ddstable.DefaultCoordinatorConfig(0xdead), m)
	if err != nil {
		t.Fatal(err)
	}
	const n = 1000
	now := time.Now()
	for k := range uint64(n) {
		_, e, err := co.Begin(now, ddstable.Update{Key: k, Value: []byte("x")})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range e.Sends {
			v, err := c.Nodes[s.To.Node-1].Tables().Prepare(ctx, ddstable.PrepareRequest("t", s.To, s.Prepare))
			if err != nil || !v.Yes {
				t.Fatalf("prepare %d at %v: %v %v", k, s.To, v, err)
			}
		}
	}
	// The library is gone: no decision is ever sent.
	t.Logf("%d operations prepared at 3 replicas in %v", n, time.Since(now).Round(time.Millisecond))
	start := time.Now()
	for {
		doubt, keys := uint64(0), uint64(0)
		for i := range 3 {
			st, err := c.Nodes[i].Tables().Status(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range st.Replicas {
				doubt += r.InDoubt
				keys += r.Keys
			}
		}
		if doubt == 0 && keys == 3*n {
			break
		}
		if !bench.SleepCtx(ctx, 50*time.Millisecond) {
			t.Fatalf("%d still in doubt, %d keys (nodes still in their first life: %v)", doubt, keys, firstLives(c))
		}
	}
	took := time.Since(start)
	ns, err := mc.Read(ctx, ddstable.OutcomeNamespace)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d writes in doubt at 3 replicas resolved in %v (the prepare timeout is 2 s); %d outcome registers", n, took.Round(time.Millisecond), len(ns.GetEntries()))
	if len(ns.GetEntries()) != n {
		t.Fatalf("%d registers for %d operations", len(ns.GetEntries()), n)
	}
}

// firstLives says which nodes still run their first incarnation: a node
// that fenced itself takes no replica into its next life.
func firstLives(c *bench.InProcessCluster) []bool {
	var out []bool
	for _, n := range c.Nodes {
		out = append(out, n != nil && n.AliveAs(1))
	}
	return out
}
