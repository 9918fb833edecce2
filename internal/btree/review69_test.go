package btree

import (
	"context"
	"errors"
	"testing"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/chunk"
)

// TestReview69DropMarkNotDurableAnswered (outside review 69): the read
// side of TestDropMarkRetryWaitsForDurability. A drop's mark whose commit
// was published but whose flush failed (the log failed: a restart of this
// server takes the mark back) is still taken for a drop by everything that
// reads the anchor under its lock: a Get answers ErrNoTree (NotFound to the
// client; the Service's done then settles the drop), and settleDrop
// records the drop in the directory (the name goes), though the mark is
// not durable. Each should wait until the anchor's image it read is durable
// (Durable(a.LSN)), as markDropped now does and as every leaf read does.
func TestReview69DropMarkNotDurableAnswered(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := newFailingLogServer(t, ctx)
	dir := &memDirectory{ns: &pb.Namespace{Name: Namespace}}
	e := TreeEntry{Name: "t", Anchor: f.anchor, NodeSize: MinNodeSize, MaxFanout: 6}
	if ex, err := dir.Create(ctx, e, f.root, chunk.Owner{}); err != nil || ex != nil {
		t.Fatal(ex, err)
	}
	st := f.cache.Store(f.anchor, MinNodeSize, nil)
	tr, err := New(st, f.anchor.ID, Config{NodeSize: MinNodeSize})
	if err != nil {
		t.Fatal(err)
	}

	f.dev.failing.Store(true)
	if err := markDropped(ctx, st); err == nil {
		t.Fatal("the mark's flush failed, and markDropped said marked")
	}
	if _, _, err := tr.Get(ctx, []byte("k")); errors.Is(err, ErrNoTree) {
		t.Errorf("a Get answered ErrNoTree from a drop mark that is not durable (the log failed): %v", err)
	}
	settled, err := settleDrop(ctx, f.cache, dir, "t")
	if settled {
		t.Errorf("settleDrop recorded the drop from a mark that is not durable (the log failed; a restart takes the mark back)")
	}
	if _, lerr := dir.Lookup(ctx, "t"); errors.Is(lerr, ErrNoTree) {
		t.Errorf("the name is gone from the directory (settleDrop: %v, %v) while the anchor's mark is not durable", settled, err)
	}
}
