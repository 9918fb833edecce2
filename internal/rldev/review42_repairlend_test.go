package rldev_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/rldev"
)

// Review 42: lent read buffers through read repair. A client read that
// finds corrupt blocks repairs them from the peer and reads again (a
// second lent read for the same request: s.mu.loans[req] is replaced).
// Readers with reused buffers (ReadInto) read the replica whose blocks are
// being corrupted under them; every successful answer is checked word by
// word.
func TestReview42LentReadsThroughRepair(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	const size = 4 << 20
	cl, id := offsetRLDev(t, ctx, dir, 64<<20, size)
	tab, err := cl.Table(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	seg := tab.RLDevs[id].Segs[0]
	f, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf("node-%d", seg.Node), "disk0.img"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	stop := make(chan struct{})
	var corrupted atomic.Int64
	go func() { // corrupts random blocks of segment 0 (the data part: CRC fails)
		r := rand.New(rand.NewSource(1))
		junk := make([]byte, 64)
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Duration(200+r.Intn(800)) * time.Microsecond):
			}
			b := r.Int63n(size / rldev.BlockSize)
			r.Read(junk)
			f.WriteAt(junk, seg.Offset+rldev.MetaSize+b*rldev.PhysBlockSize+rldev.HeaderSize+int64(r.Intn(rldev.BlockSize-64)))
			corrupted.Add(1)
		}
	}()

	var mu sync.Mutex
	var bad []string
	var reads, corrupt, other atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			r := rand.New(rand.NewSource(int64(w)))
			own := make([]byte, 1<<20)
			for i := 0; i < 300 && ctx.Err() == nil; i++ {
				n := uint64(1+r.Intn(64)) * rldev.BlockSize
				off := uint64(r.Int63n(int64((size-n)/rldev.BlockSize))) * rldev.BlockSize
				got := own[:n]
				err := cl.ReadInto(ctx, id, off, got, 1)
				if err != nil {
					if errors.Is(err, rldev.ErrCorrupt) {
						corrupt.Add(1)
					} else {
						other.Add(1)
					}
					continue
				}
				reads.Add(1)
				if j, v := wrongOffset(got, off); j >= 0 {
					mu.Lock()
					bad = append(bad, fmt.Sprintf("read of %d at %d: word at %d names %d", n, off, j, v))
					mu.Unlock()
				}
			}
		}(w)
	}
	wg.Wait()
	close(stop)
	t.Logf("%d reads checked, %d ErrCorrupt, %d other errors, %d corruptions injected", reads.Load(), corrupt.Load(), other.Load(), corrupted.Load())
	for _, b := range bad {
		t.Error(b)
	}
}
