package btree_test

import (
	"bytes"
	"context"
	"math"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/grovestore/grove/api/etcdpb"
	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/btree"
)

// TestReview55OddRequests (a regression test; passes): malformed or odd
// requests from the network to the TreeService and the etcd endpoint are
// refused as InvalidArgument (or answered), never a panic, and a refused
// write is never reported with a code a client would take as "unknown".
func TestReview55OddRequests(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tc := startCluster(t, ctx)
	tc.server(t, ctx, 0)
	tcs := review55Trees(t, tc)
	ts := tcs[0]
	const name = "odd"
	if _, err := ts.Create(ctx, &pb.TreeCreateRequest{Name: name}); err != nil {
		t.Fatal(err)
	}
	if _, err := ts.Put(ctx, &pb.TreePutRequest{Tree: name, Key: []byte("m"), Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	tok := func() *pb.TreeWriteToken {
		return &pb.TreeWriteToken{Client: bytes.Repeat([]byte{7}, 16), Seq: 9, Attempt: 1, Stamp: time.Now().UnixNano()}
	}
	bad := []struct {
		what string
		call func() error
	}{
		{"get, empty key", func() error { _, err := ts.Get(ctx, &pb.TreeGetRequest{Tree: name}); return err }},
		{"get, key too long", func() error {
			_, err := ts.Get(ctx, &pb.TreeGetRequest{Tree: name, Key: make([]byte, btree.MaxKey+1)})
			return err
		}},
		{"scan, from > to", func() error {
			_, err := ts.Scan(ctx, &pb.TreeScanRequest{Tree: name, From: []byte("z"), To: []byte("a"), HasTo: true, Reverse: true})
			return err
		}},
		{"count, from > to", func() error {
			_, err := ts.Count(ctx, &pb.TreeCountRequest{Tree: name, From: []byte("z"), To: []byte("a"), HasTo: true})
			return err
		}},
		{"put, unknown condition", func() error {
			_, err := ts.Put(ctx, &pb.TreePutRequest{Tree: name, Key: []byte("k"), Cond: 99})
			return err
		}},
		{"delete, if-absent", func() error {
			_, err := ts.Delete(ctx, &pb.TreeDeleteRequest{Tree: name, Key: []byte("k"), Cond: pb.TreeCond_TREE_COND_IF_ABSENT})
			return err
		}},
		{"put once, short client id", func() error {
			tk := tok()
			tk.Client = tk.Client[:15]
			_, err := ts.PutOnce(ctx, &pb.TreePutRequest{Tree: name, Key: []byte("k"), Token: tk})
			return err
		}},
		{"put once, floor above seq", func() error {
			tk := tok()
			tk.Floor = 10
			_, err := ts.PutOnce(ctx, &pb.TreePutRequest{Tree: name, Key: []byte("k"), Token: tk})
			return err
		}},
		{"put once, negative stamp", func() error {
			tk := tok()
			tk.Stamp = math.MinInt64
			_, err := ts.PutOnce(ctx, &pb.TreePutRequest{Tree: name, Key: []byte("k"), Token: tk})
			return err
		}},
		{"put, token sent to Put", func() error {
			_, err := ts.Put(ctx, &pb.TreePutRequest{Tree: name, Key: []byte("k"), Token: tok()})
			return err
		}},
		{"create, bad name", func() error {
			_, err := ts.Create(ctx, &pb.TreeCreateRequest{Name: "a/b"})
			return err
		}},
		{"create, node size huge", func() error {
			_, err := ts.Create(ctx, &pb.TreeCreateRequest{Name: "odd2", NodeSize: math.MaxUint32})
			return err
		}},
	}
	for _, b := range bad {
		err := b.call()
		if code := status.Code(err); code != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", b.what, err)
		}
	}
	kv := btree.NewEtcdKV(tc.c.Nodes[0].BTree(), "oddetcd", false)
	defer kv.Close()
	if _, err := kv.Put(ctx, &etcdpb.PutRequest{Key: []byte("a"), Value: []byte("1")}); err != nil {
		t.Fatal(err)
	}
	r, err := kv.Range(ctx, &etcdpb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}, Limit: math.MaxInt64, SortOrder: etcdpb.RangeRequest_DESCEND})
	if err != nil || len(r.Kvs) != 1 {
		t.Errorf("range of everything, limit MaxInt64: %v %v", r, err)
	}
	if _, err := kv.DeleteRange(ctx, &etcdpb.DeleteRangeRequest{Key: []byte("z"), RangeEnd: []byte("a")}); err != nil {
		t.Errorf("delete of an empty range: %v", err)
	}
	if _, err := kv.Range(ctx, &etcdpb.RangeRequest{Key: []byte("a"), RangeEnd: make([]byte, btree.MaxKey+1)}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("range end too long: %v", err)
	}
	if _, err := kv.Put(ctx, &etcdpb.PutRequest{Key: make([]byte, btree.MaxKey+1)}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("etcd put, key too long: %v", err)
	}
}
