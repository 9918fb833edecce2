package btree_test

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/grovestore/grove/api/etcdpb"
	"github.com/grovestore/grove/internal/btree"
	"github.com/grovestore/grove/internal/transport"
)

// TestReview55EtcdRangeUnbounded: an etcd Range without a limit gathers the
// whole range into one answer in memory, page after page (each page is
// bounded, 4 MiB; their sum is not), before anything checks its size: a
// range over a tree larger than a message (transport.MaxMessage, 33 MiB)
// is read whole, held whole, and only then refused by gRPC's send limit
// (or, forwarded, by forwardAnswerMax at the home). One `etcdctl get ""
// --prefix` on a tree of gigabytes makes the answering node hold up to
// everything it can read in OpTimeout (30 s), per call: unbounded memory
// from one client request. The endpoint should stop once the answer
// passes what can be sent, and answer ResourceExhausted (etcd's own
// server answers a range over its limit with an error too).
func TestReview55EtcdRangeUnbounded(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tc := startCluster(t, ctx)
	svc := tc.c.Nodes[0].BTree()
	tc.server(t, ctx, 0)
	kv := btree.NewEtcdKV(svc, "r55etcd", false) // served here (no forwarding)
	defer kv.Close()
	val := bytes.Repeat([]byte{'v'}, 1<<20)
	const n = 36 // 36 MiB of values: more than one message
	for i := 0; i < n; i++ {
		for {
			_, err := kv.Put(ctx, &etcdpb.PutRequest{Key: []byte(fmt.Sprintf("big/%03d", i)), Value: val})
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("put %d: %v", i, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	r, err := kv.Range(ctx, &etcdpb.RangeRequest{Key: []byte("big/"), RangeEnd: []byte("big0")})
	runtime.ReadMemStats(&after)
	alloc := after.TotalAlloc - before.TotalAlloc
	if err != nil {
		if status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("range: %v", err)
		}
		t.Logf("refused: %v (allocated %d MiB)", err, alloc>>20)
		// A limit, or keys alone, is served.
		if r, err := kv.Range(ctx, &etcdpb.RangeRequest{Key: []byte("big/"), RangeEnd: []byte("big0"), Limit: 4}); err != nil || len(r.Kvs) != 4 || !r.More || r.Count != n {
			t.Fatalf("range with a limit: %v, %v", r, err)
		}
		if r, err := kv.Range(ctx, &etcdpb.RangeRequest{Key: []byte("big/"), RangeEnd: []byte("big0"), KeysOnly: true}); err != nil || len(r.Kvs) != n {
			t.Fatalf("range of keys: %v", err)
		}
		// A delete of the range with its previous values stops once they
		// pass a message, and says how many keys it deleted; the rest stay.
		_, derr := kv.DeleteRange(ctx, &etcdpb.DeleteRangeRequest{Key: []byte("big/"), RangeEnd: []byte("big0"), PrevKv: true})
		if status.Code(derr) != codes.Unknown || !strings.Contains(derr.Error(), "stopped after deleting") {
			t.Fatalf("delete range with previous values: %v", derr)
		}
		left, err := kv.Range(ctx, &etcdpb.RangeRequest{Key: []byte("big/"), RangeEnd: []byte("big0"), CountOnly: true})
		if err != nil || left.Count == 0 || left.Count >= n {
			t.Fatalf("after the stopped delete: %v keys left (%v), want some of %d", left.GetCount(), err, n)
		}
		t.Logf("the delete with previous values: %v; %d keys left", derr, left.Count)
		return
	}
	size := proto.Size(r)
	if size > transport.MaxMessage {
		t.Fatalf("an unlimited etcd Range built an answer of %d MiB (%d keys; %d MiB allocated by the call), more than any message may carry (%d MiB): "+
			"the whole range was read into memory before its size was checked (gRPC then refuses to send it)",
			size>>20, len(r.Kvs), alloc>>20, transport.MaxMessage>>20)
	}
}
