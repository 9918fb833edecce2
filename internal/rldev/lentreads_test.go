package rldev_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand"
	"sync"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/bench"
	"github.com/grovestore/grove/internal/meta"
	"github.com/grovestore/grove/internal/rldev"
	"github.com/grovestore/grove/internal/sim"
)

// Buffers are recycled on both ends of a read: a node lends a client read
// the buffer its blocks are read into and takes it back once the reply
// frame is written (Service.lend, physBufs), and ReadInto reads a reply
// straight into its caller's buffer, used again. A buffer given back too
// early, or written after its call returned, shows as one read's blocks in
// another's answer. Here readers on both replicas read ranges of random
// size from one RLDev whose every 8-byte word names its own offset, into
// buffers they use again or fresh ones, and give up one read in six after
// a random few hundred microseconds (mid-flight: before the request is
// sent, while the node reads, while the reply arrives); every answer is
// checked word by word. Seeded by GROVE_SEED (the interleavings are the
// scheduler's).
func TestLentReadBuffersRandomized(t *testing.T) {
	seed := sim.RandomSeed(t, "the readers' choices")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const size = 16 << 20
	cl, id := offsetRLDev(t, ctx, t.TempDir(), 128<<20, size)

	const readers, perReader = 6, 400
	var mu sync.Mutex
	var bad []string
	reads, given := 0, 0
	var wg sync.WaitGroup
	for w := 0; w < readers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			r := rand.New(rand.NewSource(seed*31 + int64(w)))
			own := make([]byte, 1<<20)
			for i := 0; i < perReader && ctx.Err() == nil; i++ {
				n := uint64(1+r.Intn(64)) * rldev.BlockSize
				if r.Intn(4) == 0 {
					n = uint64(1+r.Intn(256)) * rldev.BlockSize
				}
				off := uint64(r.Int63n(int64((size-n)/rldev.BlockSize))) * rldev.BlockSize
				replica := 1 + w%2
				rctx, rcancel := ctx, context.CancelFunc(func() {})
				giveUp := r.Intn(6) == 0
				if giveUp {
					rctx, rcancel = context.WithTimeout(ctx, time.Duration(50+r.Intn(800))*time.Microsecond)
				}
				var got []byte
				var err error
				switch r.Intn(3) {
				case 0:
					got, err = cl.Read(rctx, id, off, n, replica)
				default:
					got = own[:n]
					err = cl.ReadInto(rctx, id, off, got, replica)
				}
				rcancel()
				if err != nil {
					if giveUp && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, rldev.ErrConnLost)) {
						mu.Lock()
						given++
						mu.Unlock()
						continue
					}
					mu.Lock()
					bad = append(bad, "read: "+err.Error())
					mu.Unlock()
					return
				}
				if j, v := wrongOffset(got, off); j >= 0 {
					mu.Lock()
					bad = append(bad, fmt.Sprintf("read of %d bytes at %d from replica %d: word at %d names offset %d", n, off, replica, j, v))
					mu.Unlock()
				}
				mu.Lock()
				reads++
				mu.Unlock()
			}
		}(w)
	}
	wg.Wait()
	t.Logf("%d reads checked, %d given up mid-flight", reads, given)
	for _, b := range bad {
		t.Error(b)
	}
	if reads < readers*perReader/2 {
		t.Errorf("only %d reads of %d checked", reads, readers*perReader)
	}
}

// offsetRLDev starts two store nodes in dir (disks of diskSize bytes) and
// a clerk, all closed when the test ends, and makes an RLDev of size bytes
// whose every 8-byte word names its own offset (wrongOffset checks a read
// of it).
func offsetRLDev(t *testing.T, ctx context.Context, dir string, diskSize int64, size uint64) (*rldev.Clerk, uint64) {
	t.Helper()
	c, err := bench.StartCluster(dir, 2, bench.ClusterOptions{Store: true, DiskSize: diskSize})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	mc := meta.NewClient(c.Members())
	t.Cleanup(func() { mc.Close() })
	cl := rldev.NewClerk(mc)
	t.Cleanup(func() { cl.Close() })
	id := createServed(t, ctx, cl, size)
	chunk := make([]byte, 1<<20)
	for off := uint64(0); off < size; off += uint64(len(chunk)) {
		for i := 0; i < len(chunk); i += 8 {
			binary.LittleEndian.PutUint64(chunk[i:], off+uint64(i))
		}
		if err := cl.Write(ctx, id, off, chunk, rldev.WriteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return cl, id
}

// wrongOffset returns the first word of got, read at off of an
// offsetRLDev, that does not name its offset, and what it names; -1 if
// none.
func wrongOffset(got []byte, off uint64) (int, uint64) {
	for j := 0; j+8 <= len(got); j += 8 {
		if v := binary.LittleEndian.Uint64(got[j:]); v != off+uint64(j) {
			return j, v
		}
	}
	return -1, 0
}
