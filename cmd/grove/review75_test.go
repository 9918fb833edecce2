package main

import (
	"context"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/btree"
)

// Review 75: treeWriteOnce's gateway handling (68d4acc, ca9a511).

// r75LookupRefused is a stand-in node whose B-tree server is restarting:
// its Lookup (the token's anchor, before any send) answers NOT_APPLIED.
type r75LookupRefused struct {
	pb.UnimplementedTreeServiceServer
	standInConns
}

func (n *r75LookupRefused) Lookup(context.Context, *pb.TreeLookupRequest) (*pb.TreeLookupResponse, error) {
	return nil, btree.NotAppliedError(codes.Unavailable, "this node's B-tree server is starting")
}

// r75Anchored is a tokNode (tokened puts, records) whose Lookup answers
// the tree's anchor, as every current node does.
type r75Anchored struct{ tokNode }

func (n *r75Anchored) Lookup(context.Context, *pb.TreeLookupRequest) (*pb.TreeLookupResponse, error) {
	return &pb.TreeLookupResponse{Tree: &pb.TreeInfo{AnchorCm: 3, AnchorId: 9}}, nil
}

// The token is made at the first attempt that finds tok nil, wherever
// that is: when the first node's lookup was refused (NOT_APPLIED, nothing
// sent: firstEndpoint becomes false), the next endpoint, a gateway, makes
// it. The gateway serves no trees: its Lookup is Unimplemented, which
// LookupAnchor takes for an old node's ("no anchor"), so the token names
// no tree (TreeCm 0, TreeId 0). The gateway's PutOnce is Unimplemented
// and its nodes are inserted, but the token is kept ("if firstEndpoint"):
// the write goes to N2 under a token whose tree check is off
// (completion.go: tok.Tree.IsZero() passes anything), so an attempt of
// unknown outcome resent after the tree was dropped and made again
// applies to the new tree (TREE_CHANGED never said). Before 68d4acc the
// gateway was expanded only as the first endpoint to answer, with the
// token reset there.
//
// Schedule: --endpoints N1,GW; N1's Lookup answers NOT_APPLIED; GW lists
// N2; N2 answers Lookup with anchor (3, 9) and takes the put.
func TestReview75GatewayAfterRefusedLookupSendsAnchorlessToken(t *testing.T) {
	n1 := &r75LookupRefused{}
	ep1 := serveStandIn(t, n1, &n1.standInConns)
	st := &tokStore{val: []byte("old"), recs: map[string]*pb.TreePutResponse{}}
	n2 := &r75Anchored{tokNode{st: st}}
	ep2 := serveStandIn(t, n2, &n2.standInConns)
	gw := r74ServeGateway(t, ep2)
	err := r74Put(t, ep1, gw)
	if err != nil || st.applied != 1 || len(st.tokens) == 0 || st.tokens[0] == nil {
		t.Fatalf("setup: put through N1,GW: %v; applied %d, attempts %v", err, st.applied, st.tokens)
	}
	if tk := st.tokens[0]; tk.TreeCm != 3 || tk.TreeId != 9 {
		t.Fatalf("DEFECT: N2 got the put under a token naming tree (%d, %d), made at the gateway (whose Unimplemented lookup reads as an old node's), not N2's anchor (3, 9): the token's tree check is off for this write", tk.TreeCm, tk.TreeId)
	}
}

// r75OldNode is a node of a build from before write tokens: it serves
// untokened puts, answers Lookup and PutOnce Unimplemented, and, as
// every node does (node.go registers the ClusterService), its cluster
// status, which lists the nodes with their gRPC addresses (itself too).
type r75OldNode struct {
	pb.UnimplementedTreeServiceServer
	pb.UnimplementedClusterServiceServer
	st    *tokStore
	nodes []string
}

func (n *r75OldNode) Put(ctx context.Context, r *pb.TreePutRequest) (*pb.TreePutResponse, error) {
	n.st.mu.Lock()
	defer n.st.mu.Unlock()
	n.st.tokens = append(n.st.tokens, nil)
	return (&tokNode{st: n.st}).apply(r), nil
}

func (n *r75OldNode) Status(context.Context, *pb.StatusRequest) (*pb.StatusResponse, error) {
	r := &pb.StatusResponse{}
	for i, a := range n.nodes {
		r.Nodes = append(r.Nodes, &pb.NodeStatus{Id: uint64(i + 1), Alive: true, GrpcAddr: a})
	}
	return r, nil
}

// treeWriteOnce's contract (its comment; treecall.Call.failed): "a node
// of a build from before them: Unimplemented ... gets the write
// untokened". Every Unimplemented is now first offered to GatewayNodes,
// and an endpoint is a gateway whenever its status lists a node with an
// address (ok, even with nothing missing: ca9a511) -- which a node's
// status does too. So an old node is taken for a gateway, passed over
// for good, and the put is never sent untokened anywhere: a cluster of
// old nodes (or the one old node named) fails every tokened write.
// Before 68d4acc the expansion happened once, for the first endpoint,
// and only if it listed addresses the list lacked; a single old node
// got the put untokened.
//
// Schedule: --endpoints OLD; OLD's Lookup and PutOnce are Unimplemented,
// its status lists itself, its Put applies.
func TestReview75OldBuildNodeTakenForGateway(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	st := &tokStore{val: []byte("old"), recs: map[string]*pb.TreePutResponse{}}
	n := &r75OldNode{st: st, nodes: []string{lis.Addr().String()}}
	s := grpc.NewServer()
	pb.RegisterTreeServiceServer(s, n)
	pb.RegisterClusterServiceServer(s, n)
	go s.Serve(lis)
	t.Cleanup(s.Stop)
	err = r74Put(t, lis.Addr().String())
	t.Logf("put through one old-build node: %v; applied %d, attempts %v", err, st.applied, st.tokens)
	if err != nil || st.applied != 1 {
		t.Fatalf("DEFECT: a put to a node of a build from before tokens (its status listing itself) was not sent untokened: %v, applied %d", err, st.applied)
	}
}
