package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/btree"
	"github.com/grovestore/grove/internal/cli"
)

// review35Store is one key's value, shared by stand-in nodes (as the
// cluster's nodes share a tree), and what was sent to it and applied.
type review35Store struct {
	mu      sync.Mutex
	val     []byte
	sends   int
	applied int
}

// review35Node is a stand-in node's TreeService. Its Put applies a
// compare-and-swap to the shared store; then, as fail says: "" answers,
// "cut" drops the node's connections before answering (a node that dies or
// is cut off after the write took effect: the client sees Unavailable),
// "refuse" answers NOT_APPLIED without applying anything.
type review35Node struct {
	pb.UnimplementedTreeServiceServer
	st   *review35Store
	fail string
	standInConns
}

func (n *review35Node) Put(ctx context.Context, r *pb.TreePutRequest) (*pb.TreePutResponse, error) {
	n.st.mu.Lock()
	n.st.sends++
	if n.fail == "refuse" {
		n.st.mu.Unlock()
		return nil, btree.NotAppliedError(codes.Unavailable, "this node's B-tree server is stopping")
	}
	cur := n.st.val
	res := &pb.TreePutResponse{Found: cur != nil, Prev: cur}
	if r.Cond != pb.TreeCond_TREE_COND_IF_EQUALS || bytes.Equal(cur, r.Expect) {
		n.st.val, res.Applied = r.Value, true
		n.st.applied++
	}
	n.st.mu.Unlock()
	if n.fail == "cut" {
		n.cut()
		<-ctx.Done()
		return nil, status.Error(codes.Unknown, "unreachable")
	}
	return res, nil
}

func review35Serve(t *testing.T, n *review35Node) string { return serveStandIn(t, n, &n.standInConns) }

// standInConns keeps a stand-in node's accepted connections, so that it
// can drop them (a node that dies or is cut off after applying a write:
// its client sees the call fail, its outcome unknown).
type standInConns struct {
	mu    sync.Mutex
	conns []net.Conn
}

func (c *standInConns) cut() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cn := range c.conns {
		cn.Close()
	}
}

type standInListener struct {
	net.Listener
	c *standInConns
}

func (l standInListener) Accept() (net.Conn, error) {
	cn, err := l.Listener.Accept()
	if err == nil {
		l.c.mu.Lock()
		l.c.conns = append(l.c.conns, cn)
		l.c.mu.Unlock()
	}
	return cn, err
}

// serveStandIn serves a stand-in tree service on a loopback port, its
// connections kept in c.
func serveStandIn(t *testing.T, srv pb.TreeServiceServer, c *standInConns) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	pb.RegisterTreeServiceServer(s, srv)
	go s.Serve(standInListener{Listener: lis, c: c})
	t.Cleanup(s.Stop)
	return lis.Addr().String()
}

// TestReview35CLIWriteNotSentTwice (review 35): `grove tree put` (and del,
// create, drop) passed over an endpoint on any Unavailable answer, also one
// that says nothing of the write's outcome (the connection broke after the
// node applied it), and sent the write again to the next endpoint: a
// compare-and-swap that took effect at the first node was re-sent, found
// its own new value, and the command reported "condition does not hold";
// a plain put went in twice (undoing another client's put in between). Now
// such a write exits ExitUnknown after one send; a NOT_APPLIED answer
// still moves on to the next endpoint, where the write goes in once.
func TestReview35CLIWriteNotSentTwice(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	put := func(a, b string) error {
		cmd := treePutCmd()
		cmd.SetArgs([]string{"t", "k", "new", "--if-equals", "old", "--endpoints", a + "," + b, "--command-timeout", "5s"})
		cmd.SilenceUsage, cmd.SilenceErrors = true, true
		return cmd.ExecuteContext(ctx)
	}

	st := &review35Store{val: []byte("old")}
	err := put(review35Serve(t, &review35Node{st: st, fail: "cut"}), review35Serve(t, &review35Node{st: st}))
	var ce *cli.Error
	if !errors.As(err, &ce) || ce.Code != cli.ExitUnknown {
		t.Fatalf("a put whose answer was lost: %v, want exit %d (outcome unknown)", err, cli.ExitUnknown)
	}
	if st.sends != 1 || st.applied != 1 {
		t.Fatalf("a put whose answer was lost was sent %d times, applied %d (value %q); want once", st.sends, st.applied, st.val)
	}
	t.Logf("answer lost: %v", err)

	st = &review35Store{val: []byte("old")}
	if err := put(review35Serve(t, &review35Node{st: st, fail: "refuse"}), review35Serve(t, &review35Node{st: st})); err != nil {
		t.Fatalf("a put the first node refused (NOT_APPLIED): %v, want it done at the second", err)
	}
	if st.sends != 2 || st.applied != 1 || string(st.val) != "new" {
		t.Fatalf("a put the first node refused: sent %d times, applied %d, value %q; want 2, 1, new", st.sends, st.applied, st.val)
	}
}
