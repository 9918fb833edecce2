package btree

import (
	"errors"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/chunk"
)

// Review 44 (outside review of the day's changes, 2026-11-29): `grove
// tree create x --fanout 65538` (TreeCreateRequest.fanout is a uint32)
// passed Config.fill (no upper bound), so CreateTree decreed an entry whose
// fanout encodeEntry stored as a u16 (2). A stricter decodeEntry, briefly
// on main, refused such an entry, and Trees with it the whole directory:
// every other tree was lost to lookups, creations, drops and repair. Now
// creation refuses a fanout the entry cannot hold, and the directory
// decodes an entry an earlier build truncated (that tree alone fails to
// open, as before).
func TestReview44FanoutTruncationWedgesDirectory(t *testing.T) {
	cfg := Config{NodeSize: MinNodeSize, MaxFanout: 1<<16 + 2}
	err := cfg.fill()
	if err == nil {
		t.Fatalf("a fanout of %d (stored in 16 bits) accepted for a creation", cfg.MaxFanout)
	}
	// Refused as a bad argument (grove tree create exits 2), not as a
	// failure of unknown outcome.
	if !errors.Is(err, ErrBadConfig) || status.Code(rpcError(err)) != codes.InvalidArgument {
		t.Fatalf("the refusal %v travels as %v", err, status.Code(rpcError(err)))
	}
	users := TreeEntry{Name: "users", Anchor: Handle{CM: 1, ID: 7}, NodeSize: MinNodeSize}
	n := &pb.Namespace{Name: Namespace, Entries: []*pb.Entry{{Key: treeKey(users.Name), Value: encodeEntry(users)}}}
	// What an earlier build decreed for it.
	e := TreeEntry{Name: "x", Anchor: Handle{CM: 1, ID: 9}, NodeSize: MinNodeSize, MaxFanout: 1<<16 + 2}
	ops, existing, err := createTreeOps(n, e, Handle{CM: 1, ID: 10}, chunk.Owner{})
	if err != nil || existing != nil {
		t.Fatalf("createTreeOps: %v %v", existing, err)
	}
	for _, op := range ops {
		n.Entries = append(n.Entries, &pb.Entry{Key: op.Key, Value: op.Value})
	}
	if _, err := lookupIn(n, "users"); err != nil {
		t.Fatalf("with an entry of a truncated fanout in the directory, tree \"users\" no longer resolves: %v", err)
	}
	x, err := lookupIn(n, "x")
	if err != nil {
		t.Fatal(err)
	}
	if c := (Config{NodeSize: x.NodeSize, MaxFanout: x.MaxFanout}); c.fill() == nil {
		t.Fatalf("the truncated entry (fanout %d) would open", x.MaxFanout)
	}
}

// A directory entry that does not decode (a torn or foreign value) stops
// the collections that must see every anchor (Trees fails), but not the
// other trees' operations: a lookup reads its own entry alone.
func TestLookupReadsItsOwnEntryAlone(t *testing.T) {
	users := TreeEntry{Name: "users", Anchor: Handle{CM: 1, ID: 7}, NodeSize: MinNodeSize}
	n := &pb.Namespace{Name: Namespace, Entries: []*pb.Entry{
		{Key: treeKey("bad"), Value: []byte{1, 2, 3}},
		{Key: treeKey(users.Name), Value: encodeEntry(users)},
		{Key: treeKey("misfiled"), Value: encodeEntry(TreeEntry{Name: "other", Anchor: Handle{CM: 1, ID: 9}, NodeSize: MinNodeSize})},
	}}
	if _, err := Trees(n); err == nil {
		t.Fatal("Trees decoded a directory with an entry that does not decode")
	}
	if e, err := lookupIn(n, "users"); err != nil || e != users {
		t.Fatalf("lookup of users beside a bad entry: %+v, %v", e, err)
	}
	if _, err := lookupIn(n, "bad"); err == nil || errors.Is(err, ErrNoTree) {
		t.Fatalf("lookup of the bad entry: %v, want its decoding error", err)
	}
	if _, err := lookupIn(n, "misfiled"); err == nil || errors.Is(err, ErrNoTree) {
		t.Fatalf("lookup of a misfiled entry: %v, want an error", err)
	}
	if _, err := lookupIn(n, "absent"); !errors.Is(err, ErrNoTree) {
		t.Fatalf("lookup of an absent tree: %v, want ErrNoTree", err)
	}
}
