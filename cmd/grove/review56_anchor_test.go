package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/btree"
	"github.com/grovestore/grove/internal/cli"
)

// r56Store is one tree's key under its anchor: made again (remake) it gets
// a new anchor and no records, as a tree dropped and created by name.
type r56Store struct {
	mu      sync.Mutex
	anchor  uint64
	val     []byte
	recs    map[string]*pb.TreePutResponse
	tokens  []*pb.TreeWriteToken
	applied int
	lookups int
}

func (s *r56Store) remake() {
	s.anchor++
	s.val, s.recs = nil, map[string]*pb.TreePutResponse{}
}

// r56Node is a stand-in node with Lookup and the anchor check.
// fail: "cut" drops its connections after the put took effect and makes
// the tree again; "remakeAfterLookup" makes the tree again after its
// first lookup answered.
type r56Node struct {
	pb.UnimplementedTreeServiceServer
	st   *r56Store
	fail string
	standInConns
}

func (n *r56Node) Lookup(ctx context.Context, r *pb.TreeLookupRequest) (*pb.TreeLookupResponse, error) {
	n.st.mu.Lock()
	defer n.st.mu.Unlock()
	n.st.lookups++
	a := n.st.anchor
	if n.fail == "remakeAfterLookup" && n.st.lookups == 1 {
		n.st.remake()
	}
	return &pb.TreeLookupResponse{Tree: &pb.TreeInfo{Name: r.Name, AnchorCm: 1, AnchorId: a}}, nil
}

func (n *r56Node) PutOnce(ctx context.Context, r *pb.TreePutRequest) (*pb.TreePutResponse, error) {
	n.st.mu.Lock()
	n.st.tokens = append(n.st.tokens, proto.Clone(r.Token).(*pb.TreeWriteToken))
	if r.Token.TreeId != n.st.anchor || r.Token.TreeCm != 1 {
		n.st.mu.Unlock()
		return nil, btree.ReasonError(codes.FailedPrecondition, "made again", btree.TreeChanged)
	}
	id := fmt.Sprintf("%x/%d", r.Token.Client, r.Token.Seq)
	res, ok := n.st.recs[id]
	if ok {
		res = &pb.TreePutResponse{Applied: res.Applied, Found: res.Found, Repeat: true}
	} else {
		n.st.val, n.st.applied = r.Value, n.st.applied+1
		res = &pb.TreePutResponse{Applied: true}
		n.st.recs[id] = res
	}
	cut := n.fail == "cut"
	if cut {
		n.st.remake()
		n.fail = ""
	}
	n.st.mu.Unlock()
	if cut {
		n.cut()
		<-ctx.Done()
		return nil, status.Error(codes.Unknown, "unreachable")
	}
	return res, nil
}

// TestReview56CLIAnchor (outside review 56): `grove tree put` looks the
// tree up before its token's first send and keeps the anchor in every
// attempt: an attempt whose answer was lost, the tree made again, then a
// resend elsewhere refused TREE_CHANGED: exit 8 (unknown), applied once,
// one anchor; a first attempt refused TREE_CHANGED (the tree made again
// after the lookup): a new token, the tree looked up again, applied once
// in the new tree.
func TestReview56CLIAnchor(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	put := func(eps ...string) error {
		cmd := treePutCmd()
		list := eps[0]
		for _, e := range eps[1:] {
			list += "," + e
		}
		cmd.SetArgs([]string{"t", "k", "new", "--endpoints", list, "--command-timeout", "3s"})
		cmd.SilenceUsage, cmd.SilenceErrors = true, true
		return cmd.ExecuteContext(ctx)
	}
	serve := func(n *r56Node) string { return serveStandIn(t, n, &n.standInConns) }

	st := &r56Store{anchor: 5, recs: map[string]*pb.TreePutResponse{}}
	err := put(serve(&r56Node{st: st, fail: "cut"}), serve(&r56Node{st: st}))
	var ce *cli.Error
	if !errors.As(err, &ce) || ce.Code != cli.ExitUnknown {
		t.Fatalf("applied, answer lost, tree made again, resend refused: %v, want exit %d", err, cli.ExitUnknown)
	}
	if st.applied != 1 || len(st.tokens) != 2 || st.lookups != 1 {
		t.Fatalf("applied %d times over %d attempts, %d lookups; want 1, 2, 1", st.applied, len(st.tokens), st.lookups)
	}
	if a, b := st.tokens[0], st.tokens[1]; a.TreeId != 5 || b.TreeId != 5 || !bytes.Equal(a.Client, b.Client) || b.Attempt != 2 {
		t.Fatalf("tokens %+v then %+v: want one token, anchor 5 in both", a, b)
	}

	st = &r56Store{anchor: 5, recs: map[string]*pb.TreePutResponse{}}
	if err := put(serve(&r56Node{st: st, fail: "remakeAfterLookup"})); err != nil {
		t.Fatalf("first attempt refused TREE_CHANGED: %v, want success under a new token", err)
	}
	if st.applied != 1 || len(st.tokens) != 2 || st.lookups != 2 || string(st.val) != "new" {
		t.Fatalf("applied %d over %d attempts, %d lookups, value %q; want 1, 2, 2, new", st.applied, len(st.tokens), st.lookups, st.val)
	}
	if a, b := st.tokens[0], st.tokens[1]; a.TreeId != 5 || b.TreeId != 6 || bytes.Equal(a.Client, b.Client) || b.Attempt != 1 {
		t.Fatalf("tokens %+v then %+v: want anchors 5 then 6, a new token at attempt 1", a, b)
	}
}
