package client_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/client"
	"github.com/grovestore/grove/internal/btree"
)

// review56Node is a stand-in node that answers Lookup with the tree's
// current anchor and refuses a tokened put whose anchor is another
// (TREE_CHANGED), as btree.Service does. Hooks, if set, run in the calls
// (the lookup's with the anchor it read first, as a lookup in flight
// across a re-create answers it).
type review56Node struct {
	pb.UnimplementedTreeServiceServer
	mu          sync.Mutex
	cur         btree.Handle
	toks        []*pb.TreeWriteToken
	lookupDelay time.Duration
	putDelay    time.Duration
	onLookup    func(n int)
	onPut       func(tok *pb.TreeWriteToken)
	lookups     int
}

func (f *review56Node) anchor() btree.Handle {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cur
}

func (f *review56Node) set(h btree.Handle) {
	f.mu.Lock()
	f.cur = h
	f.mu.Unlock()
}

func (f *review56Node) Lookup(ctx context.Context, r *pb.TreeLookupRequest) (*pb.TreeLookupResponse, error) {
	f.mu.Lock()
	f.lookups++
	n, a := f.lookups, f.cur
	f.mu.Unlock()
	if f.onLookup != nil {
		f.onLookup(n)
	}
	select {
	case <-time.After(f.lookupDelay):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return &pb.TreeLookupResponse{Tree: &pb.TreeInfo{Name: r.Name, AnchorCm: a.CM, AnchorId: a.ID}}, nil
}

func (f *review56Node) PutOnce(ctx context.Context, r *pb.TreePutRequest) (*pb.TreePutResponse, error) {
	f.mu.Lock()
	f.toks = append(f.toks, proto.Clone(r.Token).(*pb.TreeWriteToken))
	f.mu.Unlock()
	if f.onPut != nil {
		f.onPut(r.Token)
	}
	select {
	case <-time.After(f.putDelay):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	a := btree.Handle{CM: r.Token.TreeCm, ID: r.Token.TreeId}
	if cur := f.anchor(); !a.IsZero() && a != cur {
		return nil, btree.ReasonError(codes.FailedPrecondition, "the tree was made again", btree.TreeChanged)
	}
	return &pb.TreePutResponse{Applied: true}, nil
}

func (f *review56Node) tokens() []*pb.TreeWriteToken {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*pb.TreeWriteToken(nil), f.toks...)
}

// TestReview56LookupEatsAttempt (outside review 56): the client looks the
// tree up within the first attempt's AttemptTimeout (client.go write:
// actx serves the lookup and then the put). A lookup that takes most of
// it (a config service electing a leader: its read waits for a barrier)
// leaves the put too little: the first attempt times out, and counts as
// of unknown outcome (a resend; after a re-create of the tree, the write
// would end ErrUnknownOutcome), though each call alone fits its time.
func TestReview56LookupEatsAttempt(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n := &review56Node{cur: btree.Handle{CM: 1, ID: 10}, lookupDelay: 800 * time.Millisecond, putDelay: 300 * time.Millisecond}
	c, err := client.DialOptions(ctx, client.Options{NoRouting: true, AttemptTimeout: time.Second, CallTimeout: 10 * time.Second}, serveTrees(t, n))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Tree("t").Put(ctx, []byte("k"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	toks := n.tokens()
	if st := c.Stats(); st.Resent != 0 || len(toks) != 1 {
		t.Fatalf("a put whose lookup took 0.8 s and whose put takes 0.3 s, with a 1 s attempt timeout: %d attempts, %d resent; "+
			"want one attempt: the lookup shares the first attempt's deadline (the put was sent with 0.2 s left, timed out, and counted as of unknown outcome)",
			len(toks), st.Resent)
	}
}

// TestReview56StaleLookupOverwrites (outside review 56): a lookup in
// flight across a drop and re-create answers the dropped tree's anchor;
// the client stores it over the new one, which another write had already
// learned (client.go anchor: anchors.Store, unconditionally). A write
// started after the client knew the new anchor is then sent with the
// dropped tree's and refused (TREE_CHANGED): a wasted attempt, and, had
// its answer been lost, ErrUnknownOutcome for a write that could not have
// applied anywhere. (Safe: the anchor never changes within a token.)
func TestReview56StaleLookupOverwrites(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	old, cur := btree.Handle{CM: 1, ID: 10}, btree.Handle{CM: 1, ID: 20}
	lookupStarted, releaseLookup := make(chan struct{}), make(chan struct{})
	putHeld, releasePut := make(chan struct{}), make(chan struct{})
	var held atomic.Bool
	n := &review56Node{cur: old}
	n.onLookup = func(i int) {
		if i == 1 { // B's lookup: read the old anchor, answers late
			close(lookupStarted)
			<-releaseLookup
		}
	}
	n.onPut = func(tok *pb.TreeWriteToken) {
		if (btree.Handle{CM: tok.TreeCm, ID: tok.TreeId}) == old {
			if held.CompareAndSwap(false, true) { // B's put under the stale anchor
				close(putHeld)
				<-releasePut
			}
		}
	}
	c, err := client.DialOptions(ctx, client.Options{NoRouting: true}, serveTrees(t, n))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tr := c.Tree("t")
	bDone := make(chan error, 1)
	go func() { bDone <- tr.Put(ctx, []byte("b"), []byte("v")) }()
	<-lookupStarted
	n.set(cur)                                                    // dropped and made again meanwhile
	if err := tr.Put(ctx, []byte("a"), []byte("v")); err != nil { // A: looks up, learns cur
		t.Fatal(err)
	}
	close(releaseLookup) // B's lookup answers old: stored over cur
	<-putHeld
	before := len(n.tokens())
	if err := tr.Put(ctx, []byte("c"), []byte("v")); err != nil { // C: after A learned cur
		t.Fatal(err)
	}
	close(releasePut)
	if err := <-bDone; err != nil {
		t.Fatal(err)
	}
	first := n.tokens()[before]
	if got := (btree.Handle{CM: first.TreeCm, ID: first.TreeId}); got != cur {
		t.Fatalf("write C, started after the client had learned the new tree's anchor %v, was sent with %v (%d attempts refused TREE_CHANGED in all): "+
			"a lookup that answered late overwrote the newer anchor in the client's cache", cur, got, c.Stats().TreeChanged)
	}
}

// TestReview56RenewalsSpent (outside review 56): a write refused
// TREE_CHANGED past treecall.MaxRenewals (the tree made again under it
// each time) ends with the bare gRPC status, none of the client's errors
// (TOKEN_EXPIRED's is ErrUnavailable): a caller testing errors.Is cannot
// tell that nothing was done.
func TestReview56RenewalsSpent(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n := &review56Node{cur: btree.Handle{CM: 1, ID: 10}}
	next := uint64(10)
	n.onPut = func(*pb.TreeWriteToken) { // made again after every lookup
		next++
		n.set(btree.Handle{CM: 1, ID: next})
	}
	c, err := client.DialOptions(ctx, client.Options{NoRouting: true}, serveTrees(t, n))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	err = c.Tree("t").Put(ctx, []byte("k"), []byte("v"))
	t.Logf("after %d refusals: %v", c.Stats().TreeChanged, err)
	if err == nil {
		t.Fatal("a put refused every time succeeded")
	}
	for _, e := range []error{client.ErrUnavailable, client.ErrUnknownOutcome, client.ErrNotFound, client.ErrInvalid, client.ErrExists, client.ErrNoSpace} {
		if errors.Is(err, e) {
			return
		}
	}
	t.Fatalf("a put refused TREE_CHANGED %d times ends %v (code %v): none of the client's errors", c.Stats().TreeChanged, err, status.Code(err))
}

// review56Old is a node of a build from before Lookup that refuses every
// tokened put before any change (a starting server).
type review56Old struct {
	pb.UnimplementedTreeServiceServer
}

func (review56Old) PutOnce(context.Context, *pb.TreePutRequest) (*pb.TreePutResponse, error) {
	return nil, btree.NotAppliedError(codes.Unavailable, "starting")
}

// TestReview56AmbiguousThenChanged: an attempt of unknown outcome, the
// tree made again, the resend refused TREE_CHANGED: ErrUnknownOutcome,
// both attempts under one token naming the first tree.
func TestReview56AmbiguousThenChanged(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m := &review56Node{cur: btree.Handle{CM: 1, ID: 10}}
	// Endpoint 1 answers Unknown after "applying" (the tree is then made
	// again); endpoint 2 checks the anchor against the new tree.
	unk := &review56Unknown{after: func() { m.set(btree.Handle{CM: 1, ID: 11}) }}
	c, err := client.DialOptions(ctx, client.Options{NoRouting: true}, serveTrees(t, &review56Pair{review56Unknown: unk, Node: m}), serveTrees(t, m))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	err = c.Tree("t").Put(ctx, []byte("k"), []byte("v"))
	if !errors.Is(err, client.ErrUnknownOutcome) {
		t.Fatalf("ambiguous, tree made again, resend refused TREE_CHANGED: %v, want ErrUnknownOutcome", err)
	}
	toks := append(unk.tokens(), m.tokens()...)
	if len(toks) != 2 || toks[0].Seq != toks[1].Seq || toks[0].TreeId != 10 || toks[1].TreeId != 10 || toks[1].Attempt != 2 {
		t.Fatalf("tokens %v: want one token, anchor 10 in both, attempts 1 and 2", toks)
	}
}

// review56Unknown answers every tokened put Unknown after recording it.
type review56Unknown struct {
	mu    sync.Mutex
	toks  []*pb.TreeWriteToken
	after func()
}

func (u *review56Unknown) tokens() []*pb.TreeWriteToken {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]*pb.TreeWriteToken(nil), u.toks...)
}

// review56Pair: Lookup from Node, PutOnce from Unknown.
type review56Pair struct {
	pb.UnimplementedTreeServiceServer
	*review56Unknown
	Node *review56Node
}

func (p *review56Pair) Lookup(ctx context.Context, r *pb.TreeLookupRequest) (*pb.TreeLookupResponse, error) {
	return p.Node.Lookup(ctx, r)
}

func (p *review56Pair) PutOnce(ctx context.Context, r *pb.TreePutRequest) (*pb.TreePutResponse, error) {
	u := p.review56Unknown
	u.mu.Lock()
	u.toks = append(u.toks, proto.Clone(r.Token).(*pb.TreeWriteToken))
	u.mu.Unlock()
	u.after()
	return nil, status.Error(codes.Unknown, "died mid-call")
}

// TestReview56OldNodeUnanchors (outside review 56): one node of a build
// from before Lookup (its lookup Unimplemented) makes the client send
// every token, to every node and for every tree, without an anchor for
// 30 s (noLookup is the client's, not the node's): a new node then takes
// them unchecked, and a resend after a re-create applies afresh again.
func TestReview56OldNodeUnanchors(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n := &review56Node{cur: btree.Handle{CM: 1, ID: 10}}
	c, err := client.DialOptions(ctx, client.Options{NoRouting: true}, serveTrees(t, review56Old{}), serveTrees(t, n))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, tree := range []string{"t", "u"} {
		if err := c.Tree(tree).Put(ctx, []byte("k"), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	for i, tok := range n.tokens() {
		if tok.TreeCm == 0 && tok.TreeId == 0 {
			t.Fatalf("attempt %d at the new node (of %d) carries no anchor: the old node's Unimplemented lookup turned anchors off client-wide", i+1, len(n.tokens()))
		}
	}
}
