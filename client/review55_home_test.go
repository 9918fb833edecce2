package client_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/client"
	"github.com/grovestore/grove/internal/btree"
)

// review55Node is a stand-in node: it lists the registered nodes (for the
// client's routing) and answers Get, or — starting, as a node whose B-tree
// server is making or recovering its log or keeps failing to start —
// holds each call until its deadline and then answers NOT_APPLIED, as
// btree.Service.Server does ("still starting": it waits for the server
// until the call's context ends).
type review55Node struct {
	pb.UnimplementedTreeServiceServer
	nodes    []*pb.TreeNode
	starting bool
	gets     atomic.Int64
}

func (f *review55Node) Nodes(context.Context, *pb.TreeNodesRequest) (*pb.TreeNodesResponse, error) {
	return &pb.TreeNodesResponse{Nodes: f.nodes}, nil
}

func (f *review55Node) Get(ctx context.Context, r *pb.TreeGetRequest) (*pb.TreeGetResponse, error) {
	f.gets.Add(1)
	if f.starting {
		<-ctx.Done()
		return nil, btree.NotAppliedError(codes.Unavailable, "btree: this node's B-tree server is still starting")
	}
	return &pb.TreeGetResponse{Found: true, Value: []byte("v")}, nil
}

// TestReview55StartingHomeStarvesReads: a tree's home node is up (its
// connection Ready) but its B-tree server is starting (or keeps failing to
// start). With routing (the default) every call on the tree goes to the
// home first; the home holds it until the call's deadline (Service.Server
// waits for its server as long as the call's context lasts), so the call
// fails ErrUnavailable with no time left for the endpoints, which would
// have served it. rerouteSoon only asks for the nodes again, which name
// the same home: every later call does the same, for as long as the
// server is starting. The package comment says that after a call to the
// home failed in a way that allows a retry, calls go to the endpoints.
func TestReview55StartingHomeStarvesReads(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	home := &review55Node{starting: true}
	good := &review55Node{}
	homeAddr, goodAddr := serveTrees(t, home), serveTrees(t, good)
	nodes := []*pb.TreeNode{{Id: 1, Addr: homeAddr}, {Id: 2, Addr: goodAddr}}
	home.nodes, good.nodes = nodes, nodes
	name := ""
	for i := 0; ; i++ {
		if name = fmt.Sprintf("t%d", i); btree.Home(name, []uint64{1, 2}) == 1 {
			break
		}
	}
	cl, err := client.Dial(ctx, goodAddr) // the home is not an endpoint: the client learns it
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	tr := cl.Tree(name)
	// Until the client knows the nodes and its connection to the home is
	// up, calls go to the endpoint.
	for home.gets.Load() == 0 && ctx.Err() == nil {
		cctx, ccancel := context.WithTimeout(ctx, time.Second)
		tr.Get(cctx, []byte("k"))
		ccancel()
		time.Sleep(20 * time.Millisecond)
	}
	var fails int
	for i := 0; i < 5; i++ {
		cctx, ccancel := context.WithTimeout(ctx, time.Second)
		_, err := tr.Get(cctx, []byte("k"))
		ccancel()
		if err != nil {
			if !errors.Is(err, client.ErrUnavailable) {
				t.Fatalf("get %d: %v", i, err)
			}
			fails++
		}
	}
	t.Logf("the starting home held %d gets; the endpoint served %d", home.gets.Load(), good.gets.Load())
	if fails > 1 {
		t.Fatalf("%d of 5 gets failed (ErrUnavailable), each held at the home whose B-tree server is starting until its deadline, though the endpoint answers at once", fails)
	}
}
