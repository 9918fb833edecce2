package btree_test

import (
	"context"
	"crypto/rand"
	"os"
	"testing"
	"time"

	"google.golang.org/grpc"
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
// OPEN DEFECT (issue 11; README "Known limits"): this test fails on the
// current build. It is skipped unless GROVE_KNOWN_DEFECTS=1, so that the
// next change to tokens can run it.
func TestReview55ResendAfterDropRecreate(t *testing.T) {
	if os.Getenv("GROVE_KNOWN_DEFECTS") == "" {
		t.Skip("open defect (review 55, finding 1): a resend after its tree was dropped and made again applies afresh; GROVE_KNOWN_DEFECTS=1 runs it")
	}
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
	tok := &pb.TreeWriteToken{Client: make([]byte, 16), Seq: 1, Attempt: 1, Stamp: time.Now().UnixNano(), Floor: 1}
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
	d := (&treecall.Call{Kind: treecall.Write, Tokened: true, Ambiguous: 1}).Failed(status.Convert(err), false)
	if d.Step != treecall.Unknown {
		t.Fatalf("resend refused with %v: the client's step is %v, want unknown", err, d.Step)
	}
}
