package btree_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/grovestore/grove/api/etcdpb"
	"github.com/grovestore/grove/internal/btree"
	"github.com/grovestore/grove/internal/transport"
)

// TestEtcdHomeStarting: while the tree's home node's B-tree server is
// starting (after a restart it makes or recovers its log first, which can
// take seconds), a call forwarded to it is refused there within
// forwardedStartWait, before any change (NOT_APPLIED, Unavailable), and
// the node that forwarded it serves it itself: the caller gets its answer
// instead of an error after the home's operation timeout.
func TestEtcdHomeStarting(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tc := startCluster(t, ctx)
	for i := range tc.c.Nodes {
		tc.server(t, ctx, i)
	}
	home := btree.Home(btree.DefaultEtcdTree, []uint64{1, 2, 3})
	other := int(home % 3) // a node that is not the home
	cc, err := grpc.NewClient(tc.c.Configs[other].GRPCAddr, transport.DialOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	kv := etcdpb.NewKVClient(cc)
	// Until the node's stream to the home is up it serves calls itself:
	// put until one was forwarded.
	for {
		out0, _ := tc.c.Nodes[other].Etcd().ForwardStats()
		if _, err := kv.Put(ctx, &etcdpb.PutRequest{Key: []byte("warm"), Value: []byte("x")}); err != nil && ctx.Err() != nil {
			t.Fatal(err)
		}
		if out1, _ := tc.c.Nodes[other].Etcd().ForwardStats(); out1 > out0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	undo := tc.c.Nodes[home-1].BTree().PretendStartingForTest()
	defer undo()
	_, served0 := tc.c.Nodes[home-1].Etcd().ForwardStats()
	call, done := context.WithTimeout(ctx, 5*time.Second)
	defer done()
	start := time.Now()
	if _, err := kv.Put(call, &etcdpb.PutRequest{Key: []byte("k"), Value: []byte("v1")}); err != nil {
		t.Fatalf("a put through node %d while its home (node %d) starts: %v after %v", other+1, home, err, time.Since(start))
	}
	if _, err := kv.DeleteRange(call, &etcdpb.DeleteRangeRequest{Key: []byte("warm")}); err != nil {
		t.Fatalf("a delete through node %d while its home starts: %v", other+1, err)
	}
	r, err := kv.Range(call, &etcdpb.RangeRequest{Key: []byte("k")})
	if err != nil || len(r.Kvs) != 1 || !bytes.Equal(r.Kvs[0].Value, []byte("v1")) {
		t.Fatalf("a get through node %d while its home starts: %v, %v", other+1, r, err)
	}
	if _, served1 := tc.c.Nodes[home-1].Etcd().ForwardStats(); served1 == served0 {
		t.Fatal("no call was forwarded to the starting home (the test did not test it)")
	}
	t.Logf("three calls while the home starts: %v", time.Since(start))
	undo()
	hc, err := grpc.NewClient(tc.c.Configs[home-1].GRPCAddr, transport.DialOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer hc.Close()
	r, err = etcdpb.NewKVClient(hc).Range(ctx, &etcdpb.RangeRequest{Key: []byte("warm"), RangeEnd: []byte("warn")})
	if err != nil || len(r.Kvs) != 0 {
		t.Fatalf("the delete served by node %d, read at the home: %v, %v", other+1, r, err)
	}
}
