package chunk_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"google.golang.org/grpc"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/bench"
	"github.com/grovestore/grove/internal/chunk"
	"github.com/grovestore/grove/internal/meta"
	"github.com/grovestore/grove/internal/transport"
)

func testLog() *slog.Logger {
	if os.Getenv("GROVE_LOG") == "" {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

func random(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

// The runtime end to end, in one process: three store nodes, a pair on
// nodes 1 and 2; allocations, writes, reads through either manager, frees;
// the primary's node stops, the secondary takes over (its chunks are all
// there, new ids are above the old), the node comes back as secondary.
func TestServicePairFailover(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := bench.StartCluster(t.TempDir(), 3, bench.ClusterOptions{Store: true, DiskSize: 128 << 20, Log: testLog()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	mc := meta.NewClient(c.Members())
	defer mc.Close()
	var p *chunk.Pair
	for ctx.Err() == nil { // the nodes register their disks first
		if p, err = chunk.CreatePair(ctx, mc, [2]uint64{1, 2}, 1<<20, 16<<20); err == nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	cl := chunk.NewClerk(mc)
	defer cl.Close()

	want := map[chunk.Handle][]byte{}
	alloc := func(size int) chunk.Handle {
		t.Helper()
		h, err := cl.Allocate(ctx, uint64(size), 0)
		if err != nil {
			t.Fatal(err)
		}
		if h.CM != p.ID {
			t.Fatalf("handle %s from pair %d", h, h.CM)
		}
		got, err := cl.Read(ctx, h, 0, uint64(size))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, make([]byte, size)) {
			t.Fatalf("chunk %s not zeroed", h)
		}
		want[h] = make([]byte, size)
		return h
	}
	write := func(h chunk.Handle, off int, d []byte) {
		t.Helper()
		if err := cl.Write(ctx, h, uint64(off), d); err != nil {
			t.Fatal(err)
		}
		copy(want[h][off:], d)
	}
	// Reads through the clerk, and at each manager of the pair directly
	// (both serve reads).
	check := func(direct ...int) {
		t.Helper()
		for h, w := range want {
			got, err := cl.Read(ctx, h, 0, uint64(len(w)))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, w) {
				t.Fatalf("chunk %s: the data read back differs", h)
			}
			for _, i := range direct {
				var r *pb.ChunkServiceReadResponse
				for ctx.Err() == nil {
					cc, err := grpc.NewClient(c.Members()[i].GRPCAddr, transport.DialOptions()...)
					if err != nil {
						t.Fatal(err)
					}
					r, err = pb.NewChunkServiceClient(cc).Read(ctx, &pb.ChunkServiceReadRequest{Cm: h.CM, Id: h.ID, Length: uint64(len(w))})
					cc.Close()
					if err == nil && r.Result != pb.ChunkResult_CHUNK_RESULT_NOT_SERVING {
						break
					}
					time.Sleep(50 * time.Millisecond) // a secondary still joining
				}
				if err := chunk.ResultError(r.Result, r.Error); err != nil {
					t.Fatalf("chunk %s at node %d: %v", h, i+1, err)
				}
				if !bytes.Equal(r.Data, w) {
					t.Fatalf("chunk %s at node %d: the data read back differs", h, i+1)
				}
			}
		}
	}
	var hs []chunk.Handle
	for _, size := range []int{1, 4096, 5000, 100 << 10} {
		hs = append(hs, alloc(size))
	}
	write(hs[0], 0, []byte{7})
	write(hs[2], 100, random(4500)) // across a block boundary, ending inside the chunk's last block
	write(hs[3], 8190, random(20000))
	check(0, 1)
	// Past the end, freed, malformed: clear errors, no data.
	if err := cl.Write(ctx, hs[1], 4000, random(200)); !errors.Is(err, chunk.ErrOutOfRange) {
		t.Fatalf("a write past the end: %v", err)
	}
	if err := cl.Free(ctx, hs[1]); err != nil {
		t.Fatal(err)
	}
	delete(want, hs[1])
	if _, err := cl.Read(ctx, hs[1], 0, 1); !errors.Is(err, chunk.ErrUnallocated) {
		t.Fatalf("a read of a freed chunk: %v", err)
	}
	if err := cl.Free(ctx, hs[1]); !errors.Is(err, chunk.ErrUnallocated) {
		t.Fatalf("freeing a freed chunk: %v", err)
	}
	if _, err := cl.Read(ctx, chunk.Handle{CM: p.ID, ID: 1 << 40}, 0, 1); !errors.Is(err, chunk.ErrUnallocated) {
		t.Fatalf("a read of a never-allocated chunk: %v", err)
	}
	if _, err := cl.Read(ctx, chunk.Handle{CM: 99, ID: 1}, 0, 1); !errors.Is(err, chunk.ErrUnknownManager) {
		t.Fatalf("a read of another pair's chunk: %v", err)
	}

	// The primary (node 1) stops: node 2 takes over.
	c.Stop(0)
	h := alloc(8192)
	if h.ID <= hs[len(hs)-1].ID {
		t.Fatalf("id %d after takeover, not above %d", h.ID, hs[len(hs)-1].ID)
	}
	write(h, 0, random(8192))
	check()
	tb, err := cl.Table(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	if n := tb.Pairs[p.ID].PrimaryNode(); n != 2 {
		t.Fatalf("primary after node 1 stopped: node %d", n)
	}
	if err := c.Start(0); err != nil {
		t.Fatal(err)
	}
	// Node 1 rejoins as secondary; reads through it (every other attempt
	// of the clerk) see everything.
	for i := 0; i < 3; i++ {
		hs = append(hs, alloc(3000))
		write(hs[len(hs)-1], 10, random(100))
	}
	check(0, 1)
	for _, h := range hs[len(hs)-3:] {
		if err := cl.Free(ctx, h); err != nil {
			t.Fatal(err)
		}
		delete(want, h)
	}
	check(0, 1)
	for _, h := range hs[len(hs)-3:] {
		if _, err := cl.Read(ctx, h, 0, 1); !errors.Is(err, chunk.ErrUnallocated) {
			t.Fatalf("a read of freed chunk %s: %v", h, err)
		}
	}
}
