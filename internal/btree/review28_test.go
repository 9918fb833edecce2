package btree

import (
	"errors"
	"testing"
	"time"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/chunk"
	"github.com/grovestore/grove/internal/lock"
)

// Review 28. createTreeOps recognises "our own earlier attempt committed"
// only by a tree entry of the same name and anchor. Run again by
// meta.Client.Update after its first attempt committed with its answer lost
// and the resend came back stale (more than meta.RecentDecreeIDs decrees
// later), it may find the tree already dropped: no tree/<name>, but
// drop/<anchor> and root/<anchor> still name its anchor and first root.
//   - creator retired meanwhile: ErrCreatorRetired, and CreateTree's undo
//     frees the anchor and root the pending drop names; freeDropped then
//     finds the anchor gone and records the drop done, leaking every other
//     node of the tree;
//   - creator not retired: it puts tree/<name> again over an anchor a drop
//     is freeing (a listed tree whose chunks are then freed).
//
// Either way the directory names e.Anchor (root/ or drop/ key), which only
// this call's own decree can have put (anchors are never reused): that is
// the earlier attempt's success, not a fresh creation. Fixed so:
// createTreeOps answers success, with nothing to put.
func TestReview28CreateRerunAfterDrop(t *testing.T) {
	a, r := Handle{CM: 1, ID: 10}, Handle{CM: 1, ID: 11}
	e := TreeEntry{Name: "t", Anchor: a, NodeSize: MinNodeSize, MaxFanout: 6}
	creator := chunk.Owner{Log: 1, Token: lock.Token{Epoch: 1, Seq: 5}}
	ns := &pb.Namespace{Name: Namespace}
	// The first attempt committed.
	ops, _, err := createTreeOps(ns, e, r, creator)
	if err != nil {
		t.Fatal(err)
	}
	applyOps(ns, ops)
	// Another server dropped the tree (recordDrop's decree).
	applyOps(ns, []*pb.Op{{Kind: pb.Op_KIND_DELETE, Key: treeKey("t")},
		{Kind: pb.Op_KIND_PUT, Key: dropKey(a), Value: encodeDrop(pendingDrop{TreeEntry: e, Marked: time.Now()})}})
	named, err := namedChunks(ns)
	if err != nil || !named[a] || !named[r] {
		t.Fatalf("the pending drop does not name the anchor and root: %v %v", named, err)
	}

	// Not retired: the rerun must not list the dropped anchor again.
	ops, existing, err := createTreeOps(ns, e, r, creator)
	if err != nil || existing != nil || len(ops) != 0 {
		t.Errorf("rerun after the tree's drop: ops %v, existing %v, err %v (want no ops: the directory names this anchor, the earlier attempt committed)", ops, existing, err)
	}

	// Retired (a collection of the creator's log ran meanwhile).
	applyOps(ns, retireCreatorsOps(ns, 1, lock.Token{Epoch: 1, Seq: 6}))
	_, _, err = createTreeOps(ns, e, r, creator)
	if errors.Is(err, ErrCreatorRetired) {
		t.Errorf("rerun after the drop by a retired creator: %v — CreateTree's undo then frees anchor %v and root %v, which the pending drop names", err, a, r)
	}
}
