package bench

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"time"

	"github.com/grovestore/grove/internal/chunk"
	"github.com/grovestore/grove/internal/meta"
	"github.com/grovestore/grove/internal/rldev"
)

// ChunkOptions size `grove bench chunk`.
type ChunkOptions struct {
	Batches []int // allocations in flight at once (Table 2's batch sizes)
	Ops     int   // operations per batch size, free and data-path cell
	Rounds  int   // rounds of each; medians are reported
}

// ChunkResults are Boxwood Table 2's figures and its companions, medians
// over rounds.
type ChunkResults struct {
	// Batched: batch size -> amortized latency per allocation through a
	// Batcher reserving that many at a time (Table 2; size 1: a plain
	// Allocate, no batching); Alloc: with that many Allocates in flight
	// at once (the primary's group commit).
	Batched                 map[int]time.Duration
	Alloc                   map[int]time.Duration // batch size -> amortized latency per allocation
	Free                    time.Duration         // one free at a time
	ChunkWrite, RLDevWrite  time.Duration         // 64 KiB, queue depth 1
	ChunkRead, RLDevRead    time.Duration
	Allocations, Frees, IOs int
}

// ChunkBench runs two store nodes in this process (disks in files under
// dir) with one chunk manager pair, and measures: amortized 8 KiB
// allocation latency with N allocations in flight (the primary
// group-commits them), the latency of a free, and 64 KiB chunk writes and
// reads next to the same RLDev's own.
func ChunkBench(ctx context.Context, dir string, o ChunkOptions, progress io.Writer) (*ChunkResults, error) {
	total := len(o.Batches) * o.Ops * o.Rounds
	// Room for every allocation (freed space is quarantined for 30 s).
	data := max(uint64(256<<20), uint64(total+o.Ops*o.Rounds+16)*8192*2)
	c, err := StartCluster(dir, 2, ClusterOptions{Store: true, DiskSize: int64(data + 256<<20)})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	mc := meta.NewClient(c.Members())
	defer mc.Close()
	var p *chunk.Pair
	for i := 0; ; i++ {
		if p, err = chunk.CreatePair(ctx, mc, [2]uint64{1, 2}, max(1<<20, data/64/4096*4096), data); err == nil {
			break
		}
		if i == 100 || ctx.Err() != nil {
			return nil, err
		}
		time.Sleep(100 * time.Millisecond)
	}
	cl := chunk.NewClerk(mc)
	defer cl.Close()
	if _, err := cl.Allocate(ctx, 8192, p.ID); err != nil { // the pair serves
		return nil, err
	}
	res := &ChunkResults{Alloc: map[int]time.Duration{}, Batched: map[int]time.Duration{}}
	for _, batch := range o.Batches {
		var rounds []time.Duration
		for r := 0; r < o.Rounds; r++ {
			start := time.Now()
			if batch == 1 {
				for i := 0; i < o.Ops; i++ {
					if _, err := cl.Allocate(ctx, 8192, p.ID); err != nil {
						return nil, err
					}
				}
			} else {
				b, err := cl.NewBatcher(8192, chunk.BatcherOptions{CM: p.ID, Count: batch})
				if err != nil {
					return nil, err
				}
				for i := 0; i < o.Ops; i++ {
					if _, err := b.Allocate(ctx); err != nil {
						return nil, err
					}
				}
				if err := b.Close(ctx); err != nil { // the last commit counts
					return nil, err
				}
			}
			rounds = append(rounds, time.Since(start)/time.Duration(o.Ops))
			res.Allocations += o.Ops
		}
		res.Batched[batch] = Median(rounds)
		fmt.Fprintf(progress, "  allocations batched %d at the clerk: %v each (median of %d rounds)\n", batch, res.Batched[batch], o.Rounds)
	}
	for _, batch := range o.Batches {
		var rounds []time.Duration
		for r := 0; r < o.Rounds; r++ {
			start := time.Now()
			for done := 0; done < o.Ops; {
				n := min(batch, o.Ops-done)
				errs := make(chan error, n)
				for i := 0; i < n; i++ {
					go func() {
						_, err := cl.Allocate(ctx, 8192, p.ID)
						errs <- err
					}()
				}
				for i := 0; i < n; i++ {
					if err := <-errs; err != nil {
						return nil, err
					}
				}
				done += n
			}
			rounds = append(rounds, time.Since(start)/time.Duration(o.Ops))
			res.Allocations += o.Ops
		}
		res.Alloc[batch] = Median(rounds)
		fmt.Fprintf(progress, "  allocations %d at a time: %v each (median of %d rounds)\n", batch, res.Alloc[batch], o.Rounds)
	}
	var frees []time.Duration
	for r := 0; r < o.Rounds; r++ {
		hs := make([]chunk.Handle, o.Ops)
		for i := range hs {
			if hs[i], err = cl.Allocate(ctx, 8192, p.ID); err != nil {
				return nil, err
			}
		}
		start := time.Now()
		for _, h := range hs {
			if err := cl.Free(ctx, h); err != nil {
				return nil, err
			}
		}
		frees = append(frees, time.Since(start)/time.Duration(o.Ops))
		res.Frees += o.Ops
	}
	res.Free = Median(frees)
	fmt.Fprintf(progress, "  frees one at a time: %v each\n", res.Free)

	h, err := cl.Allocate(ctx, 8<<20, p.ID)
	if err != nil {
		return nil, err
	}
	buf := make([]byte, 64<<10)
	rand.Read(buf)
	rl := rldev.NewClerk(mc)
	defer rl.Close()
	dataRL := p.Data[0].ID
	rlOff := data - 16<<20 // an RLDev range no chunk takes (allocations fill from the start)
	cells := []struct {
		name string
		dst  *time.Duration
		op   func(off uint64) error
	}{
		{"chunk writes", &res.ChunkWrite, func(off uint64) error { return cl.Write(ctx, h, off, buf) }},
		{"RLDev writes", &res.RLDevWrite, func(off uint64) error { return rl.Write(ctx, dataRL, rlOff+off, buf, rldev.WriteOptions{}) }},
		{"chunk reads", &res.ChunkRead, func(off uint64) error { _, err := cl.Read(ctx, h, off, 64<<10); return err }},
		{"RLDev reads", &res.RLDevRead, func(off uint64) error { _, err := rl.Read(ctx, dataRL, rlOff+off, 64<<10, 0); return err }},
	}
	for _, x := range cells {
		var rounds []time.Duration
		for r := 0; r < o.Rounds; r++ {
			start := time.Now()
			for i := 0; i < o.Ops; i++ {
				if err := x.op(uint64(i%128) * (64 << 10)); err != nil {
					return nil, fmt.Errorf("%s: %w", x.name, err)
				}
			}
			rounds = append(rounds, time.Since(start)/time.Duration(o.Ops))
			res.IOs += o.Ops
		}
		*x.dst = Median(rounds)
		fmt.Fprintf(progress, "  64 KiB %s: %v each\n", x.name, *x.dst)
	}
	return res, nil
}
