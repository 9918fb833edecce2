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
	"github.com/grovestore/grove/internal/lock"
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
	p := createPair(t, ctx, mc)
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

	// The primary (node 1) stops: node 2 takes over. A write meanwhile
	// meets node 1's connection down: those attempts sent nothing, so
	// they cannot land later, and the write does not report that an
	// earlier attempt may (a B-tree server would renew its fence and write
	// again for each such report).
	//
	// Owned allocations count those that may have left a chunk no handle
	// names (MaybeStrays): one whose caller gave up while it was sent
	// counts; one whose attempts found the old primary's connection down
	// (below) does not.
	owner := chunk.Owner{Log: 5, Token: lock.Token{Epoch: 1, Seq: 1}}
	for i := 1; cl.MaybeStrays() == 0; i++ {
		if i > 200 {
			t.Fatalf("200 owned allocations cut off by their deadlines, none counted as a maybe-stray")
		}
		actx, acancel := context.WithTimeout(ctx, time.Duration(i%5)*time.Millisecond)
		_, _ = cl.AllocateOwned(actx, 4096, 0, owner)
		acancel()
	}
	t.Logf("an owned allocation cut off by its deadline counted as a maybe-stray (%d)", cl.MaybeStrays())
	c.Stop(0)
	time.Sleep(200 * time.Millisecond) // the connection notices
	if earlier, err := cl.WriteFencedReport(ctx, hs[0], 0, []byte{8}, nil); err != nil || earlier {
		t.Fatalf("a write during the takeover: earlier attempt may land %v, err %v (want false, nil)", earlier, err)
	}
	want[hs[0]][0] = 8
	strays := cl.MaybeStrays()
	if _, err := cl.AllocateOwned(ctx, 4096, 0, owner); err != nil {
		t.Fatal(err)
	}
	if got := cl.MaybeStrays(); got != strays {
		t.Fatalf("an owned allocation during the takeover counted %d maybe-strays; its attempts found the connection down", got-strays)
	}
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

// Allocation batching through the runtime: a batcher hands out chunks of
// reservations of 10; a chunk freed before its commit never becomes one;
// a read of a chunk not yet sent commits first; another batcher's clerk
// goes away with its reservation open: after the reservation's life every
// chunk it handed out is allocated and zeroed, and no id was handed out
// twice.
func TestServiceBatcher(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	c, err := bench.StartCluster(t.TempDir(), 3, bench.ClusterOptions{Store: true, DiskSize: 128 << 20, Log: testLog(), ResvLife: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	mc := meta.NewClient(c.Members())
	defer mc.Close()
	p := createPair(t, ctx, mc)
	cl := chunk.NewClerk(mc)
	defer cl.Close()
	b, err := cl.NewBatcher(8192, chunk.BatcherOptions{CM: p.ID, Count: 10, FlushEvery: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[chunk.Handle]bool{}
	var hs []chunk.Handle
	for i := 0; i < 25; i++ {
		h, err := b.Allocate(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if seen[h] {
			t.Fatalf("%s handed out twice", h)
		}
		seen[h] = true
		hs = append(hs, h)
	}
	// hs[20:25] are in the open reservation: two freed before the commit.
	for _, h := range hs[21:23] {
		if err := b.Free(ctx, h); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cl.Read(ctx, hs[24], 0, 1); !errors.Is(err, chunk.ErrUnallocated) {
		t.Fatalf("a chunk not yet sent, read through another clerk: %v (want unallocated)", err)
	}
	data := random(8192)
	if err := b.Write(ctx, hs[24], 0, data); err != nil { // commits first
		t.Fatal(err)
	}
	if got, err := cl.Read(ctx, hs[24], 0, 8192); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back: %v", err)
	}
	for i, h := range hs {
		got, err := cl.Read(ctx, h, 0, 8192)
		switch {
		case i == 21 || i == 22:
			if !errors.Is(err, chunk.ErrUnallocated) {
				t.Fatalf("chunk %s, freed before its commit: %v (want unallocated)", h, err)
			}
		case i == 24:
		case err != nil:
			t.Fatalf("chunk %s: %v", h, err)
		case !bytes.Equal(got, make([]byte, 8192)):
			t.Fatalf("chunk %s not zeroed", h)
		}
	}
	if st := b.Stats(); st.Reservations != 3 || st.Commits != 3 || st.Cancelled != 2 || st.Allocations != 25 {
		t.Fatalf("stats %+v", st)
	}
	// A clerk that goes away with its reservation open (no commit ever).
	gone, err := cl.NewBatcher(4096, chunk.BatcherOptions{CM: p.ID, Count: 8, FlushEvery: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	var orphans []chunk.Handle
	for i := 0; i < 5; i++ {
		h, err := gone.Allocate(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if seen[h] {
			t.Fatalf("%s handed out twice", h)
		}
		seen[h] = true
		orphans = append(orphans, h)
	}
	start := time.Now()
	for _, h := range orphans {
		for {
			got, err := cl.Read(ctx, h, 0, 4096)
			if err == nil {
				if !bytes.Equal(got, make([]byte, 4096)) {
					t.Fatalf("orphan %s not zeroed", h)
				}
				break
			}
			if !errors.Is(err, chunk.ErrUnallocated) || time.Since(start) > 30*time.Second {
				t.Fatalf("orphan %s after %v: %v", h, time.Since(start), err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	t.Logf("a reservation left open was kept whole after %v", time.Since(start).Round(100*time.Millisecond))
	// A new allocation is above every id handed out.
	h, err := cl.Allocate(ctx, 100, p.ID)
	if err != nil {
		t.Fatal(err)
	}
	for x := range seen {
		if x.ID >= h.ID {
			t.Fatalf("a new allocation %s at or below %s, handed out before", h, x)
		}
	}
	if err := b.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// createPair makes a pair on nodes 1 and 2 (a 1 MiB map, 16 MiB of data),
// trying again while the nodes register their disks.
func createPair(t *testing.T, ctx context.Context, mc *meta.Client) *chunk.Pair {
	t.Helper()
	for {
		p, err := chunk.CreatePair(ctx, mc, [2]uint64{1, 2}, 1<<20, 16<<20)
		if err == nil {
			return p
		}
		if ctx.Err() != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
