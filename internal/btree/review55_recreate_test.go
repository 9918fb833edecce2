package btree_test

import (
	"context"
	"crypto/rand"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/transport"
	"github.com/grovestore/grove/internal/treecall"
)

// review55Trees dials every node's TreeService.
func review55Trees(t *testing.T, tc *testCluster) []pb.TreeServiceClient {
	t.Helper()
	var out []pb.TreeServiceClient
	for i := range tc.c.Nodes {
		cc, err := grpc.NewClient(tc.c.Configs[i].GRPCAddr, transport.DialOptions()...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		out = append(out, pb.NewTreeServiceClient(cc))
	}
	return out
}

// TestReview55ResendAfterDropRecreate: a tokened write's first attempt
// applies in tree "r55" and its answer is lost (here: ignored); a reader
// sees its effect; the tree is then dropped and made again under the same
// name (a "truncate", within the client's 30 s call). The client resends
// under the same token, attempt 2 (treecall: the earlier attempt's
// outcome is unknown). The new tree has no record of the token, so the
// resend is evaluated afresh: a delete that removed the key answers
// found=false, applied=false, with no error — the Go client returns
// (found=false, nil), though the delete took effect and a reader saw it
// (not linearizable: put acknowledged, get "absent", yet the only delete
// found nothing). The README promises such a resend either the record's
// answer or a refusal that the client reports as ErrUnknownOutcome.
//
// The fix: the client looks the tree up (TreeService.Lookup) before a
// token's first attempt and sends its anchor in the token, the same in
// every attempt; a node refuses an attempt whose tree under the name has
// another anchor (TREE_CHANGED, nothing done). Without the anchor (a
// client of an older build) the resend still applies afresh, as the
// second half shows.
func TestReview55ResendAfterDropRecreate(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tc := startCluster(t, ctx)
	for i := range tc.c.Nodes {
		tc.server(t, ctx, i)
	}
	tcs := review55Trees(t, tc)
	const name = "r55"
	if _, err := tcs[0].Create(ctx, &pb.TreeCreateRequest{Name: name}); err != nil {
		t.Fatal(err)
	}
	key := []byte("k")
	if _, err := tcs[0].Put(ctx, &pb.TreePutRequest{Tree: name, Key: key, Value: []byte("a")}); err != nil {
		t.Fatal(err)
	}
	lk, err := tcs[1].Lookup(ctx, &pb.TreeLookupRequest{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	tok := &pb.TreeWriteToken{Client: make([]byte, 16), Seq: 1, Attempt: 1, Stamp: time.Now().UnixNano(), Floor: 1,
		TreeCm: lk.Tree.AnchorCm, TreeId: lk.Tree.AnchorId}
	rand.Read(tok.Client)
	req := &pb.TreeDeleteRequest{Tree: name, Key: key, Cond: pb.TreeCond_TREE_COND_ALWAYS, Token: tok}
	// Attempt 1, on node 1: it applies; its answer is "lost".
	var r1 *pb.TreeDeleteResponse
	for {
		var err error
		if r1, err = tcs[0].DeleteOnce(ctx, req); err == nil {
			break
		}
		if st := status.Convert(err); !treecall.HasReason(st, treecall.NotApplied) || ctx.Err() != nil {
			t.Fatalf("attempt 1: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !r1.Applied || !r1.Found {
		t.Fatalf("attempt 1: %+v", r1)
	}
	// A reader sees the delete's effect.
	if g, err := tcs[2].Get(ctx, &pb.TreeGetRequest{Tree: name, Key: key}); err != nil || g.Found {
		t.Fatalf("get after the delete: %+v %v", g, err)
	}
	// Drop and make the tree again (another client's truncate).
	if _, err := tcs[2].Drop(ctx, &pb.TreeDropRequest{Name: name}); err != nil {
		t.Fatal(err)
	}
	if _, err := tcs[2].Create(ctx, &pb.TreeCreateRequest{Name: name}); err != nil {
		t.Fatal(err)
	}
	// The client resends, attempt 2, to the next endpoint.
	tok.Attempt = 2
	r2, err := tcs[1].DeleteOnce(ctx, req)
	if err == nil {
		t.Fatalf("a resend (attempt 2) of a delete that took effect in the tree's former incarnation was answered as the write's outcome: applied %v, found %v, repeat %v: "+
			"the client reports found=false for a delete that removed the key (a reader saw it gone); want a refusal the client reports as an unknown outcome",
			r2.Applied, r2.Found, r2.Repeat)
	}
	if !treecall.HasReason(status.Convert(err), treecall.TreeChanged) {
		t.Fatalf("resend refused with %v, want TREE_CHANGED", err)
	}
	d := (&treecall.Call{Kind: treecall.Write, Tokened: true, Ambiguous: 1}).Failed(status.Convert(err), false)
	if d.Step != treecall.Unknown {
		t.Fatalf("resend refused with %v: the client's step is %v, want unknown", err, d.Step)
	}
	// Had attempt 1 been the only one, the client takes a new token and
	// looks the tree up again: that write applies in the new tree.
	if d := (&treecall.Call{Kind: treecall.Write, Tokened: true}).Failed(status.Convert(err), false); d.Step != treecall.Again || !d.NewToken {
		t.Fatalf("a first attempt refused TREE_CHANGED: step %v, new token %v; want again under a new token", d.Step, d.NewToken)
	}
	if _, err := tcs[1].Put(ctx, &pb.TreePutRequest{Tree: name, Key: key, Value: []byte("b")}); err != nil {
		t.Fatal(err)
	}
	lk2, err := tcs[0].Lookup(ctx, &pb.TreeLookupRequest{Name: name})
	if err != nil || lk2.Tree.AnchorId == lk.Tree.AnchorId && lk2.Tree.AnchorCm == lk.Tree.AnchorCm {
		t.Fatalf("lookup of the new tree: %v, %v", lk2, err)
	}
	tok2 := &pb.TreeWriteToken{Client: tok.Client, Seq: 2, Attempt: 1, Stamp: time.Now().UnixNano(), Floor: 2, TreeCm: lk2.Tree.AnchorCm, TreeId: lk2.Tree.AnchorId}
	// Through node 2, whose server had the dropped tree open until the
	// refusal above (and node 1's still may): the new tree's token passes.
	for i, tc := range tcs[:2] {
		tok2.Seq, tok2.Floor = uint64(2+i), uint64(2+i)
		r, err := tc.DeleteOnce(ctx, &pb.TreeDeleteRequest{Tree: name, Key: key, Cond: pb.TreeCond_TREE_COND_ALWAYS, Token: tok2})
		if err != nil {
			t.Fatalf("node %d: a delete under the new tree's anchor: %v", i+1, err)
		}
		if i == 0 && (!r.Applied || !r.Found) {
			t.Fatalf("node 1: the delete in the new tree: %+v", r)
		}
	}
	// A token without an anchor (a client of an older build) is not
	// checked: its resend applies afresh, as before the fix.
	old := &pb.TreeWriteToken{Client: tok.Client, Seq: 9, Attempt: 2, Stamp: time.Now().UnixNano(), Floor: 9}
	if _, err := tcs[2].PutOnce(ctx, &pb.TreePutRequest{Tree: name, Key: key, Value: []byte("c"), Token: old}); err != nil {
		t.Fatalf("a token without its tree's anchor: %v", err)
	}
	// An unknown tree's lookup is NotFound.
	if _, err := tcs[0].Lookup(ctx, &pb.TreeLookupRequest{Name: "r55-none"}); status.Code(err) != codes.NotFound {
		t.Fatalf("lookup of an unknown tree: %v", err)
	}
}
