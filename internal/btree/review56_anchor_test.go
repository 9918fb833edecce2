package btree_test

import (
	"context"
	"crypto/rand"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/treecall"
)

// TestReview56AnchorRefusals (outside review 56): a tokened attempt is
// applied only in the tree its anchor names, whatever the serving node
// has open under the name:
//   - a node that served the first attempt in the old tree (and so has
//     it open) gets the resend after a drop and re-create: refused
//     TREE_CHANGED, the new tree's key untouched;
//   - two re-creations in a row: a token of the middle tree, resent
//     through the node that has the middle tree open, and one of the
//     first tree: both refused;
//   - another tree's anchor, and a half-zero anchor: refused;
//   - a drop without re-create: NotFound (unknown after an ambiguous
//     attempt, by the rules).
func TestReview56AnchorRefusals(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tc := startCluster(t, ctx)
	for i := range tc.c.Nodes {
		tc.server(t, ctx, i)
	}
	tcs := review55Trees(t, tc)
	const name, other = "r56", "r56-other"
	key := []byte("k")
	lookup := func(n string) (uint32, uint64) {
		t.Helper()
		lk, err := tcs[2].Lookup(ctx, &pb.TreeLookupRequest{Name: n})
		if err != nil {
			t.Fatal(err)
		}
		return lk.Tree.AnchorCm, lk.Tree.AnchorId
	}
	create := func(n string) {
		t.Helper()
		if _, err := tcs[2].Create(ctx, &pb.TreeCreateRequest{Name: n}); err != nil {
			t.Fatal(err)
		}
	}
	recreate := func() {
		t.Helper()
		if _, err := tcs[2].Drop(ctx, &pb.TreeDropRequest{Name: name}); err != nil {
			t.Fatal(err)
		}
		create(name)
		// The new tree holds the key: a resend applied there would
		// delete it.
		if _, err := tcs[2].Put(ctx, &pb.TreePutRequest{Tree: name, Key: key, Value: []byte("new")}); err != nil {
			t.Fatal(err)
		}
	}
	intact := func(what string) {
		t.Helper()
		for i := range tcs {
			g, err := tcs[i].Get(ctx, &pb.TreeGetRequest{Tree: name, Key: key})
			if err != nil || !g.Found || string(g.Value) != "new" {
				t.Fatalf("%s: node %d reads the new tree's key as %+v, %v: the attempt was applied in the new tree", what, i+1, g, err)
			}
		}
	}
	client := make([]byte, 16)
	rand.Read(client)
	seq := uint64(0)
	token := func(cm uint32, id uint64) *pb.TreeWriteToken {
		seq++
		return &pb.TreeWriteToken{Client: client, Seq: seq, Attempt: 1, Stamp: time.Now().UnixNano(), Floor: seq, TreeCm: cm, TreeId: id}
	}
	del := func(node int, tok *pb.TreeWriteToken) (*pb.TreeDeleteResponse, error) {
		for {
			r, err := tcs[node].DeleteOnce(ctx, &pb.TreeDeleteRequest{Tree: name, Key: key, Token: tok})
			if err == nil || !treecall.HasReason(status.Convert(err), treecall.NotApplied) || ctx.Err() != nil {
				return r, err
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	refused := func(what string, r *pb.TreeDeleteResponse, err error) {
		t.Helper()
		if err == nil {
			t.Fatalf("%s: answered %+v, want TREE_CHANGED", what, r)
		}
		st := status.Convert(err)
		if !treecall.HasReason(st, treecall.TreeChanged) || treecall.IsNotApplied(st) || st.Code() != codes.FailedPrecondition {
			t.Fatalf("%s: %v, want FailedPrecondition TREE_CHANGED (not NOT_APPLIED)", what, err)
		}
		if d := (&treecall.Call{Kind: treecall.Write, Tokened: true, Ambiguous: 1}).Failed(st, false); d.Step != treecall.Unknown {
			t.Fatalf("%s: after an ambiguous attempt the client's step is %v, want unknown", what, d.Step)
		}
	}

	create(name)
	if _, err := tcs[0].Put(ctx, &pb.TreePutRequest{Tree: name, Key: key, Value: []byte("a")}); err != nil {
		t.Fatal(err)
	}
	// 1. Attempt 1 applies through node 1 (which has the tree open); its
	// answer is lost; the tree is dropped and made again through node 3;
	// the resend goes to node 1 again.
	ocm, oid := lookup(name)
	tok := token(ocm, oid)
	if r, err := del(0, tok); err != nil || !r.Applied || !r.Found {
		t.Fatalf("attempt 1: %+v %v", r, err)
	}
	recreate()
	tok.Attempt = 2
	r, err := del(0, tok)
	refused("a resend through the node that had the dropped tree open", r, err)
	intact("the resend through node 1")
	// And through node 2, which never opened the old tree.
	r, err = del(1, tok)
	refused("a resend through another node", r, err)
	intact("the resend through node 2")

	// 2. Two re-creations: a token of the middle tree applies through
	// node 2, which then has it open; made again; resent through node 2.
	mcm, mid := lookup(name)
	tok2 := token(mcm, mid)
	if r, err := del(1, tok2); err != nil || !r.Applied {
		t.Fatalf("the middle tree's attempt 1: %+v %v", r, err)
	}
	recreate()
	tok2.Attempt = 2
	r, err = del(1, tok2)
	refused("a resend of the middle tree's token through the node that had it open", r, err)
	tok.Attempt = 3
	r, err = del(1, tok)
	refused("a resend of the first tree's token, two re-creations later", r, err)
	intact("after two re-creations")

	// 3. Another tree's anchor, and a half-zero one.
	create(other)
	xcm, xid := lookup(other)
	r, err = del(2, token(xcm, xid))
	refused("another tree's anchor", r, err)
	ncm, nid := lookup(name)
	r, err = del(2, token(0, nid))
	refused("an anchor with its chunk manager zero", r, err)
	r, err = del(2, token(ncm, 0))
	refused("an anchor with its id zero", r, err)
	intact("after foreign anchors")

	// 4. Dropped, not made again: NotFound, which after an ambiguous
	// attempt is unknown.
	if _, err := tcs[2].Drop(ctx, &pb.TreeDropRequest{Name: name}); err != nil {
		t.Fatal(err)
	}
	tok3 := token(ncm, nid)
	tok3.Attempt = 2
	_, err = del(0, tok3)
	if status.Code(err) != codes.NotFound {
		t.Fatalf("a resend after the drop: %v, want NotFound", err)
	}
	if d := (&treecall.Call{Kind: treecall.Write, Tokened: true, Ambiguous: 1}).Failed(status.Convert(err), false); d.Step != treecall.Unknown {
		t.Fatalf("a resend after the drop: step %v, want unknown", d.Step)
	}
}
