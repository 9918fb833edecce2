package btree

import (
	"bytes"
	"strconv"
	"strings"
	"testing"
	"time"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/lock"
	"github.com/grovestore/grove/internal/txn"
)

// FuzzDirectory: the tree directory's records (config-service entries
// under Namespace: tree/, drop/, root/, retired/) and the B-tree log's
// record targets (link, free, node image) are read back from outside this
// process (the config service; a dead server's log, at recovery). Any
// bytes either decode to a record that encodes back to them, or are
// refused; the namespace readers never panic, whatever the key.
func FuzzDirectory(f *testing.F) {
	f.Add("tree/zzz", []byte{0xff, 1, 2})
	anchor := Handle{CM: 1, ID: 7}
	good := encodeEntry(TreeEntry{Name: "users", Anchor: anchor, NodeSize: MinNodeSize})
	f.Add("tree/users", good)
	f.Add("drop/1-7", encodeDrop(pendingDrop{TreeEntry: TreeEntry{Name: "old", Anchor: anchor, NodeSize: 16 << 10, MaxFanout: 6}, Marked: time.Unix(5, 0)}))
	f.Add(rootKey(anchor), make([]byte, rootRecordLen))
	f.Add(retiredKey(3), encodeToken(lock.Token{Epoch: 2, Seq: 9}))
	f.Add("x", linkTarget(anchor))
	f.Add("x", freeTarget(anchor))
	f.Add("x", txn.ChunkTarget(anchor))
	f.Fuzz(func(t *testing.T, key string, b []byte) {
		if e, err := decodeEntry(b); err == nil {
			if !bytes.Equal(encodeEntry(e), b) {
				t.Fatalf("entry %+v re-encodes differently", e)
			}
			if err := CheckTreeName(e.Name); err != nil || e.Anchor.IsZero() {
				t.Fatalf("decoded an entry that is not one: %+v", e)
			}
		}
		if h, ok := parseLinkTarget(b); ok && (!bytes.Equal(linkTarget(h), b) || h.IsZero()) {
			t.Fatalf("link target %v re-encodes differently", h)
		}
		if h, ok := parseFreeTarget(b); ok && (!bytes.Equal(freeTarget(h), b) || h.IsZero()) {
			t.Fatalf("free target %v re-encodes differently", h)
		}
		if h, err := txn.ParseChunkTarget(b); err == nil && (!bytes.Equal(txn.ChunkTarget(h), b) || h.IsZero()) {
			t.Fatalf("chunk target %v re-encodes differently", h)
		}
		// The readers of a directory holding the record (beside a good
		// tree, whose root record key the fuzzer may hit).
		ns := &pb.Namespace{Version: 3, Entries: []*pb.Entry{{Key: "tree/users", Value: good}, {Key: key, Value: b}}}
		ts, terr := Trees(ns)
		if terr == nil {
			for name, e := range ts {
				if name != e.Name {
					t.Fatalf("tree %q listed as %q", e.Name, name)
				}
			}
		}
		// A listing shows every tree whose entry decodes, and names
		// the entries that do not, where Trees fails.
		trees, unreadable := listTrees(ns)
		if (terr != nil) != (len(unreadable) > 0) {
			t.Fatalf("Trees: %v, but the listing finds %d unreadable entries", terr, len(unreadable))
		}
		if len(trees) == 0 || trees[0].Name != "users" && (len(trees) < 2 || trees[1].Name != "users") {
			t.Fatalf("the listing lost the good tree: %+v", trees)
		}
		pendingDrops(ns)
		namedChunks(ns)
		if len(key) > len("retired/") {
			if log, err := strconv.ParseUint(key[len("retired/"):], 10, 64); err == nil {
				retiredBelow(ns, log)
			}
		}
		lookupIn(ns, "users")
	})
}

// TestListTreesSkipsUnreadable: `grove tree list` shows the trees whose
// directory entries decode and names the one that does not, where Trees
// (for the collections) refuses the whole directory.
func TestListTreesSkipsUnreadable(t *testing.T) {
	a := encodeEntry(TreeEntry{Name: "a", Anchor: Handle{CM: 1, ID: 7}, NodeSize: MinNodeSize})
	c := encodeEntry(TreeEntry{Name: "c", Anchor: Handle{CM: 1, ID: 9}, NodeSize: MinNodeSize})
	ns := &pb.Namespace{Version: 3, Entries: []*pb.Entry{
		{Key: "tree/c", Value: c}, {Key: "tree/b", Value: []byte{0xff, 0, 1}}, {Key: "tree/a", Value: a}, {Key: "drop/1-5", Value: []byte("x")},
	}}
	if _, err := Trees(ns); err == nil {
		t.Fatal("Trees accepted a directory with an entry that does not decode")
	}
	trees, unreadable := listTrees(ns)
	if len(trees) != 2 || trees[0].Name != "a" || trees[1].Name != "c" {
		t.Fatalf("listed %+v, want a and c", trees)
	}
	if len(unreadable) != 1 || !strings.HasPrefix(unreadable[0], `"tree/b": `) {
		t.Fatalf("unreadable %q, want tree/b's entry", unreadable)
	}
}
