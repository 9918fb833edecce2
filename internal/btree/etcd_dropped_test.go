package btree_test

import (
	"context"
	"testing"
	"time"

	"github.com/grovestore/grove/api/etcdpb"
	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/btree"
)

// TestEtcdAfterDrop: the etcd endpoint's tree dropped under it (grove tree
// drop), its next calls are served by the tree it makes again, as at its
// first use: before, each kind of call answered NotFound once (the server
// had the dropped tree open), which etcd never answers (review 55's last
// note).
func TestEtcdAfterDrop(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tc := startCluster(t, ctx)
	svc := tc.c.Nodes[0].BTree()
	tc.server(t, ctx, 0)
	tc.server(t, ctx, 1)
	other := tc.c.Nodes[1].BTree() // drops the tree: this node's server still has it open
	const tree = "etcd-drop"
	kv := btree.NewEtcdKV(svc, tree, false) // served here (no forwarding)
	defer kv.Close()
	for {
		_, err := kv.Put(ctx, &etcdpb.PutRequest{Key: []byte("a"), Value: []byte("1")})
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, call := range []struct {
		name string
		do   func() error
	}{
		{"put", func() error {
			_, err := kv.Put(ctx, &etcdpb.PutRequest{Key: []byte("b"), Value: []byte("2")})
			return err
		}},
		{"range", func() error {
			_, err := kv.Range(ctx, &etcdpb.RangeRequest{Key: []byte("a"), RangeEnd: []byte("z")})
			return err
		}},
		{"get", func() error {
			_, err := kv.Range(ctx, &etcdpb.RangeRequest{Key: []byte("a")})
			return err
		}},
		{"delete", func() error {
			_, err := kv.DeleteRange(ctx, &etcdpb.DeleteRangeRequest{Key: []byte("b")})
			return err
		}},
		{"delete range", func() error {
			_, err := kv.DeleteRange(ctx, &etcdpb.DeleteRangeRequest{Key: []byte("a"), RangeEnd: []byte("z")})
			return err
		}},
	} {
		if _, err := other.Drop(ctx, &pb.TreeDropRequest{Name: tree}); err != nil {
			t.Fatalf("drop before the %s: %v", call.name, err)
		}
		if err := call.do(); err != nil {
			t.Fatalf("the %s after the endpoint's tree was dropped: %v", call.name, err)
		}
	}
	// The tree the endpoint made last holds what was put since.
	if _, err := kv.Put(ctx, &etcdpb.PutRequest{Key: []byte("c"), Value: []byte("3")}); err != nil {
		t.Fatal(err)
	}
	r, err := kv.Range(ctx, &etcdpb.RangeRequest{Key: []byte("c")})
	if err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "3" {
		t.Fatalf("get after it all: %v, %v", r, err)
	}
}
