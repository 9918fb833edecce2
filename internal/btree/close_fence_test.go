package btree_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/btree"
)

// A clean close that cannot finish because the rest of the cluster is
// going away (every node stopped at once: the chunk managers that must take
// its write-back are gone) ends as soon as the node fences itself, rather
// than at the close's 10 s deadline: a fenced server's leases are gone and
// its log is replayed elsewhere, so nothing it still writes back could be
// accepted. (The fault suite stops every node at once and requires each to
// exit within 10 s of SIGTERM; one closing node took all of it.)
func TestCloseEndsWhenTheNodeFences(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tc := startCluster(t, ctx)
	s1 := tc.server(t, ctx, 0)
	if _, err := s1.CreateTree(ctx, "fenced-close", btree.Config{MaxFanout: 6}); err != nil {
		t.Fatal(err)
	}
	tr, err := s1.Open(ctx, "fenced-close")
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 100; i++ {
		if _, err := tr.Put(ctx, []byte(fmt.Sprintf("k%03d", i)), []byte("v"), btree.Cond{}); err != nil {
			t.Fatal(err)
		}
	}
	if s1.Cache().Dirty() == 0 {
		t.Fatal("nothing is dirty: the close would have nothing to write back, and the test would prove nothing")
	}
	// Nodes 2 and 3 (the chunk pair's, and two of the three observers)
	// go; node 1 then fences within the failure detector's grace period.
	tc.c.Crash(1)
	tc.c.Crash(2)
	start := time.Now()
	tc.closeServer(0)
	took := time.Since(start)
	t.Logf("node 1's close took %v", took.Round(time.Millisecond))
	if took > 6*time.Second {
		t.Fatalf("node 1's close took %v: it waited out its deadline after the node fenced (the fence ends it at once; the deadline is 10 s)", took)
	}
	// Nothing the cut-off close left unwritten is lost: it kept its log's
	// lock, so the whole cluster's restart replays the log before any
	// lease is granted, and every key is there.
	tc.c.Crash(0)
	for i := 0; i < 3; i++ {
		if err := tc.c.Start(i); err != nil {
			t.Fatal(err)
		}
	}
	s2 := tc.server(t, ctx, 1)
	tr2, err := s2.Open(ctx, "fenced-close")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for i := 0; i < 100; i++ {
		k := fmt.Sprintf("k%03d", i)
		want[k] = "v"
		v, ok, err := tr2.Get(ctx, []byte(k))
		if err != nil || !ok || string(v) != "v" {
			t.Fatalf("after the restart, %s = %q %v %v: the cut-off close lost it", k, v, ok, err)
		}
	}
	tc.closeServer(1)
	sh := walkChunks(t, ctx, tc, "fenced-close", want)
	t.Logf("after the whole cluster's restart: %d keys, height %d, %d nodes", len(sh.Keys), sh.Height, sh.Nodes)
}
