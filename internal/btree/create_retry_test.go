package btree

import (
	"testing"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/chunk"
)

// CreateTree's decree runs again when the config service's answer to an
// attempt that committed was lost (the CI run of 2026-11-26 whose
// TestDropResumes failed with "a tree of that name exists" on a new name).
// The name is then taken by this call's own entry: success, with nothing to
// put — before, CreateTree reported a clash and freed the anchor and root
// the directory names. Another call's entry is still a clash.
func TestCreateTreeDecreeRetried(t *testing.T) {
	mine := TreeEntry{Name: "t", Anchor: Handle{CM: 1, ID: 7}, NodeSize: MinNodeSize, MaxFanout: 6}
	other := TreeEntry{Name: "t", Anchor: Handle{CM: 1, ID: 9}, NodeSize: MinNodeSize, MaxFanout: 6}
	ns := func(entries ...TreeEntry) *pb.Namespace {
		n := &pb.Namespace{Name: Namespace}
		for _, e := range entries {
			n.Entries = append(n.Entries, &pb.Entry{Key: treeKey(e.Name), Value: encodeEntry(e)})
		}
		return n
	}
	ops, existing, err := createTreeOps(ns(), mine, Handle{}, chunk.Owner{})
	if err != nil || existing != nil || len(ops) != 1 || ops[0].Key != treeKey("t") {
		t.Fatalf("a free name: %v %v %v", ops, existing, err)
	}
	ops, existing, err = createTreeOps(ns(mine), mine, Handle{}, chunk.Owner{})
	if err != nil || existing != nil || len(ops) != 0 {
		t.Fatalf("the decree run again after its own attempt committed: ops %v, existing %+v, %v (want success, nothing to put)", ops, existing, err)
	}
	ops, existing, err = createTreeOps(ns(other), mine, Handle{}, chunk.Owner{})
	if err != nil || existing == nil || existing.Anchor != other.Anchor || len(ops) != 0 {
		t.Fatalf("a name another call took: ops %v, existing %+v, %v (want the clash)", ops, existing, err)
	}
}
