package rldev_test

import (
	"context"
	"encoding/binary"
	"errors"
	"math/rand"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/bench"
	"github.com/grovestore/grove/internal/meta"
	"github.com/grovestore/grove/internal/rldev"
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
	seed := time.Now().UnixNano() % 1_000_000
	if s, err := strconv.ParseInt(os.Getenv("GROVE_SEED"), 10, 64); err == nil {
		seed = s
	}
	t.Logf("seed %d", seed)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := bench.StartCluster(t.TempDir(), 2, bench.ClusterOptions{Store: true, DiskSize: 128 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	mc := meta.NewClient(c.Members())
	defer mc.Close()
	cl := rldev.NewClerk(mc)
	defer cl.Close()
	const size = 16 << 20
	id := createServed(t, ctx, cl, size)
	pattern := func(off uint64, b []byte) {
		for i := 0; i < len(b); i += 8 {
			binary.LittleEndian.PutUint64(b[i:], off+uint64(i))
		}
	}
	chunk := make([]byte, 1<<20)
	for off := uint64(0); off < size; off += 1 << 20 {
		pattern(off, chunk)
		if err := cl.Write(ctx, id, off, chunk, rldev.WriteOptions{}); err != nil {
			t.Fatal(err)
		}
	}

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
				for j := 0; j < len(got); j += 8 {
					if v := binary.LittleEndian.Uint64(got[j:]); v != off+uint64(j) {
						mu.Lock()
						bad = append(bad, "read of "+strconv.FormatUint(n, 10)+" bytes at "+strconv.FormatUint(off, 10)+
							" from replica "+strconv.Itoa(replica)+": word at "+strconv.Itoa(j)+" names offset "+strconv.FormatUint(v, 10))
						mu.Unlock()
						break
					}
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
