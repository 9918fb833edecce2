package rldev_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/bench"
	"github.com/grovestore/grove/internal/lock"
	"github.com/grovestore/grove/internal/meta"
	"github.com/grovestore/grove/internal/rldev"
	"github.com/grovestore/grove/internal/txn"
)

// TestReview40LogReplicaRepairReportDropped (review 40): txn.RLDevDevice
// .WriteReplica, the log recovery's repair of a replica (recover.go:
// "Make the other replica hold the same log"), calls Clerk.Write, which
// drops WriteReport's "an earlier attempt may still land". On the gRPC
// data path, a repair whose first attempt was held in the network and
// whose retry was answered succeeds silently; Open then appends under the
// same token, and every flush rewrites the tail block (which the repair
// wrote: the last block of the log it recovered). The held attempt then
// lands on that replica, under the unchanged token, over the flush's
// acknowledged block: the replica's log is rewound (DRL off: nothing
// reconciles it until the next recovery, which stops short of committed
// records if the other replica cannot be read then). RLDevDevice.Write
// reports the same situation as ErrEarlierMayLand; WriteReplica should too.
func TestReview40LogReplicaRepairReportDropped(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := bench.StartCluster(t.TempDir(), 2, bench.ClusterOptions{Store: true, DiskSize: 256 << 20, DataPath: "grpc"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	mc := meta.NewClient(c.Members())
	defer mc.Close()
	cl := rldev.NewClerkWith(mc, rldev.ClerkOptions{DataPath: rldev.DataPathGRPC})
	defer cl.Close()
	deliver := rldev.HoldFirstWriteAttempt(cl)
	var recs []*rldev.Record
	for i := 0; i < 100; i++ {
		if recs, err = cl.Create(ctx, 16<<20, 1, true); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	id := recs[0].ID
	for ctx.Err() == nil {
		tb, err := cl.Table(ctx, true)
		if err == nil && tb.RLDevs[id].Inc[0] != 0 && tb.RLDevs[id].Inc[1] != 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	dev := &txn.RLDevDevice{Clerk: cl, ID: id, Size: 4096}
	fence := rldev.Fence{Name: "log-x", Token: lock.Token{Epoch: 1, Seq: 7}}
	const blk = 40
	repair := bytes.Repeat([]byte{0xaa}, txn.BlockSize)  // the recovered tail, as the repair writes it
	flushed := bytes.Repeat([]byte{0xbb}, txn.BlockSize) // the tail with more records, after Open

	// The recovery's repair of replica 1 (segment 1): its first attempt is
	// held in the network, the retry answered.
	werr := dev.WriteReplica(ctx, 1, blk, repair, &fence)
	t.Logf("WriteReplica: %v", werr)
	// The log, opened under the same token, flushes the tail block.
	if err := dev.Write(ctx, blk, flushed, &fence); err != nil {
		t.Fatalf("the flush: %v", err)
	}
	// The held attempt arrives.
	if err := deliver(ctx); err != nil {
		t.Logf("the held attempt: %v", err)
	}
	got, err := dev.ReadReplica(ctx, 1, blk, 1)
	if err != nil {
		t.Fatalf("reading replica 1: %v", err)
	}
	rewound := !bytes.Equal(got, flushed)
	if werr == nil || !errors.Is(werr, txn.ErrEarlierMayLand) {
		t.Errorf("WriteReplica succeeded (%v) while its first attempt could still land; then the acknowledged flush of block %d "+
			"was overwritten on replica 1 by it: %v (replica 1 holds %#x..., the flush wrote %#x...)", werr, blk, rewound, got[0], flushed[0])
	}
}
