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

// tokStore is one key's value and its writes' completion records, shared by
// stand-in nodes that take tokened puts as a cluster does (a record answers
// any later attempt of its write).
type tokStore struct {
	mu      sync.Mutex
	val     []byte
	recs    map[string]*pb.TreePutResponse
	tokens  []*pb.TreeWriteToken // every attempt's, in order
	applied int
}

// tokNode is a stand-in node: as review35Node, with PutOnce. fail "cut"
// drops its connections after the put took effect, "refuse" answers
// NOT_APPLIED, "off" answers TOKENS_OFF (and takes untokened puts).
type tokNode struct {
	pb.UnimplementedTreeServiceServer
	st   *tokStore
	fail string
	standInConns
}

func (n *tokNode) apply(r *pb.TreePutRequest) *pb.TreePutResponse {
	cur := n.st.val
	res := &pb.TreePutResponse{Found: cur != nil, Prev: cur}
	if r.Cond != pb.TreeCond_TREE_COND_IF_EQUALS || bytes.Equal(cur, r.Expect) {
		n.st.val, res.Applied = r.Value, true
		n.st.applied++
	}
	return res
}

func (n *tokNode) PutOnce(ctx context.Context, r *pb.TreePutRequest) (*pb.TreePutResponse, error) {
	switch n.fail {
	case "refuse":
		return nil, btree.NotAppliedError(codes.Unavailable, "this node's B-tree server is stopping")
	case "off":
		return nil, btree.ReasonError(codes.FailedPrecondition, "tokens off", btree.TokensOff)
	}
	n.st.mu.Lock()
	n.st.tokens = append(n.st.tokens, proto.Clone(r.Token).(*pb.TreeWriteToken))
	id := fmt.Sprintf("%x/%d", r.Token.Client, r.Token.Seq)
	res, ok := n.st.recs[id]
	if ok {
		res = &pb.TreePutResponse{Applied: res.Applied, Found: res.Found, Repeat: true}
	} else {
		res = n.apply(r)
		n.st.recs[id] = res
	}
	n.st.mu.Unlock()
	if n.fail == "cut" {
		n.cut()
		<-ctx.Done()
		return nil, status.Error(codes.Unknown, "unreachable")
	}
	return res, nil
}

func (n *tokNode) Put(ctx context.Context, r *pb.TreePutRequest) (*pb.TreePutResponse, error) {
	n.st.mu.Lock()
	defer n.st.mu.Unlock()
	n.st.tokens = append(n.st.tokens, nil)
	return n.apply(r), nil
}

func tokServe(t *testing.T, n *tokNode) string { return serveStandIn(t, n, &n.standInConns) }

// TestCLIPutUnderToken: `grove tree put` sends its write under a token and,
// after an attempt whose answer was lost, sends it again to the next
// endpoint: a compare-and-swap that took effect at the first node is
// answered from its record at the second (success, applied once), where
// untokened it exits ExitUnknown (TestReview35CLIWriteNotSentTwice). A
// cluster with tokens off gets the put untokened; a refusal before any
// change moves on under attempt number 1.
func TestCLIPutUnderToken(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	put := func(eps ...string) error {
		cmd := treePutCmd()
		list := eps[0]
		for _, e := range eps[1:] {
			list += "," + e
		}
		cmd.SetArgs([]string{"t", "k", "new", "--if-equals", "old", "--endpoints", list, "--command-timeout", "3s"})
		cmd.SilenceUsage, cmd.SilenceErrors = true, true
		return cmd.ExecuteContext(ctx)
	}
	newStore := func() *tokStore { return &tokStore{val: []byte("old"), recs: map[string]*pb.TreePutResponse{}} }

	// The answer lost after the put took effect: resent, answered from
	// the record.
	st := newStore()
	if err := put(tokServe(t, &tokNode{st: st, fail: "cut"}), tokServe(t, &tokNode{st: st})); err != nil {
		t.Fatalf("a tokened put whose answer was lost, resent under its token: %v, want success", err)
	}
	if st.applied != 1 || string(st.val) != "new" || len(st.tokens) != 2 {
		t.Fatalf("applied %d times, value %q, %d attempts; want once, new, 2", st.applied, st.val, len(st.tokens))
	}
	a, b := st.tokens[0], st.tokens[1]
	if !bytes.Equal(a.Client, b.Client) || a.Seq != b.Seq || a.Stamp != b.Stamp || a.Attempt != 1 || b.Attempt != 2 {
		t.Fatalf("the resend's token %+v, the first's %+v: want the same write, attempts 1 and 2", b, a)
	}

	// Only one endpoint, which loses the answer every time: the command
	// ends with its outcome unknown, having resent it to that endpoint.
	st = newStore()
	err := put(tokServe(t, &tokNode{st: st, fail: "cut"}))
	var ce *cli.Error
	if !errors.As(err, &ce) || ce.Code != cli.ExitUnknown {
		t.Fatalf("every answer lost: %v, want exit %d (outcome unknown)", err, cli.ExitUnknown)
	}
	if st.applied != 1 || len(st.tokens) < 2 {
		t.Fatalf("every answer lost: applied %d times over %d attempts; want once over several", st.applied, len(st.tokens))
	}
	t.Logf("every answer lost: %v (%d attempts)", err, len(st.tokens))

	// Refused before any change: the next endpoint, attempt 1 still.
	st = newStore()
	if err := put(tokServe(t, &tokNode{st: st, fail: "refuse"}), tokServe(t, &tokNode{st: st})); err != nil {
		t.Fatalf("a put the first node refused: %v", err)
	}
	if st.applied != 1 || len(st.tokens) != 1 || st.tokens[0].Attempt != 1 {
		t.Fatalf("a put the first node refused: applied %d, attempts %d; want 1 and 1 (attempt number 1)", st.applied, len(st.tokens))
	}

	// Tokens off: the same put untokened, at the same node.
	st = newStore()
	if err := put(tokServe(t, &tokNode{st: st, fail: "off"})); err != nil {
		t.Fatalf("a put to a cluster with tokens off: %v", err)
	}
	if st.applied != 1 || len(st.tokens) != 1 || st.tokens[0] != nil {
		t.Fatalf("tokens off: applied %d, attempts %v; want one untokened put", st.applied, st.tokens)
	}

	// A condition that does not hold, answered from the record: exit 1.
	st = newStore()
	st.val = []byte("other")
	err = put(tokServe(t, &tokNode{st: st, fail: "cut"}), tokServe(t, &tokNode{st: st}))
	if !errors.As(err, &ce) || ce.Code != cli.ExitFailed {
		t.Fatalf("a failed condition answered from the record: %v, want exit %d", err, cli.ExitFailed)
	}
	if st.applied != 0 {
		t.Fatalf("a failed condition applied %d times", st.applied)
	}
	t.Logf("a failed condition answered from the record: %v", err)
}
