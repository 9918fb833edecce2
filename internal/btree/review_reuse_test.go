package btree_test

import (
	"context"
	"testing"
	"time"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/btree"
)

// An outside review's finding (failed before the fix): a server keeps the
// trees it opened by name and does not read the directory again. While a
// drop was recorded but not finished (its server died after the decree),
// a node that had the tree open went on serving the dropped tree under the
// name, also after a new tree took the name: a put through it was
// acknowledged into the dropped tree. Now a drop first marks the anchor
// dropped, durably, under its lock (every server's cached anchor goes):
// no operation starts on the tree after that, and a server that finds its
// tree dropped looks the name up again.
func TestReview2NameReuseWhileDropPending(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tc := startCluster(t, ctx)
	s2 := tc.server(t, ctx, 1)
	tc.server(t, ctx, 0)
	svc1, svc2 := tc.c.Nodes[0].BTree(), tc.c.Nodes[1].BTree()
	if _, err := s2.CreateTree(ctx, "x", btree.Config{}); err != nil {
		t.Fatal(err)
	}
	if _, err := svc1.Put(ctx, &pb.TreePutRequest{Tree: "x", Key: []byte("a"), Value: []byte("old")}); err != nil {
		t.Fatal(err)
	}
	// Node 2 drops x and dies before freeing anything (only the decree).
	if _, err := s2.BeginDrop(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	// A new tree takes the name.
	if _, err := s2.CreateTree(ctx, "x", btree.Config{}); err != nil {
		t.Fatal(err)
	}
	// A client's put through node 1 is acknowledged...
	if _, err := svc1.Put(ctx, &pb.TreePutRequest{Tree: "x", Key: []byte("b"), Value: []byte("new")}); err != nil {
		t.Fatalf("put through node 1: %v", err)
	}
	// ...and must be in tree x, whichever node reads it.
	r, err := svc2.Get(ctx, &pb.TreeGetRequest{Tree: "x", Key: []byte("b")})
	if err != nil {
		t.Fatal(err)
	}
	stale, _ := svc1.Get(ctx, &pb.TreeGetRequest{Tree: "x", Key: []byte("a")})
	if !r.Found {
		t.Fatalf("an acknowledged put to tree x through node 1 is not in tree x through node 2 (node 1 still serves the dropped x: its get of the old tree's key a found=%v)", stale.GetFound())
	}
}
