package btree

import (
	"context"
	"math/rand"
	"testing"

	"github.com/grovestore/grove/internal/chunk"
	"github.com/grovestore/grove/internal/lock"
	"github.com/grovestore/grove/internal/rldev"
	"github.com/grovestore/grove/internal/txn"
)

// Review 34 (outside review of 18c65ad, da72a6b: node deltas).
//
// replayApplier.Apply's orphan path ("a delta whose base the log no longer
// holds: the chunk must hold that base") can never accept a chunk written
// by Cache.writeBack: commit logs n.Encode before it sets n.LSN = end, and
// writeBack encodes a copy with that LSN and cp.Token = the pin's token,
// so the chunk's image of the base version never has the logged base's
// bytes, and applyDelta's base check (length, version, CRC at bytes 8..12)
// refused it. The run failed on errBaseless although the chunk held
// exactly the delta's base version: the documented fallback was dead.
// Fixed: against a chunk, applyDelta checks the base's version and
// length, and the rebuilt image's CRC checks its body (exact false).
func TestReview34OrphanDeltaOverWrittenBackBase(t *testing.T) {
	ctx := context.Background()
	r := rand.New(rand.NewSource(34))
	store := newSimChunks(r)
	chunks := store.clerk(1, func(context.Context) error { return nil })
	h, err := chunks.Allocate(ctx, MinNodeSize, chunk.Owner{})
	if err != nil {
		t.Fatal(err)
	}
	// Version 5 as commit logged it: the clone carries the LSN of the
	// previous commit (n.LSN = end is set after the encoding).
	base := deltaLeaf(r, 20, 64, 5)
	base.Self, base.LSN = h, 1000
	logged := base.Encode(nil)
	next := base.Clone()
	next.Version = 6
	next.Vals[7] = []byte("the put that the delta carries")
	d, ok := makeDelta(logged, next.Encode(nil))
	if !ok {
		t.Fatal("no delta")
	}
	// Version 5 as Cache.writeBack writes it: e.node.LSN = the commit's
	// end, and the pin's token.
	wb := *base
	wb.LSN, wb.Token = 1100, lock.Token{Epoch: 1, Seq: 7}
	if err := chunks.Write(ctx, h, wb.Encode(nil), &rldev.Fence{Name: FenceLock(1), Token: lock.Token{Epoch: 1, Seq: 7}}); err != nil {
		t.Fatal(err)
	}
	a := replayApplier{chunks: chunks, fence: func() *rldev.Fence {
		return &rldev.Fence{Name: FenceLock(1), Token: lock.Token{Epoch: 2, Seq: 1}}
	}}
	if err := a.Apply(ctx, txn.ChunkTarget(h), deltaOff, d, 0, nil); err != nil {
		t.Fatalf("an orphan delta of version 5→6 over a chunk holding version 5 (as written back): %v", err)
	}
	b, err := chunks.Read(ctx, h, MinNodeSize)
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := imageVersion(b); v != 6 {
		t.Fatalf("the chunk holds version %d, want 6", v)
	}
}
