package btree

import (
	"bytes"
	"strconv"
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
