package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/grovestore/grove/internal/meta"
	"github.com/grovestore/grove/internal/rldev"
	"github.com/grovestore/grove/internal/txn"
)

// LogOptions size `grove bench log`.
type LogOptions struct {
	Committers []int         // concurrent committers per cell
	For        time.Duration // per round and cell
	Rounds     int           // medians are reported
	Record     int           // bytes of the update each transaction logs
	Fio        bool          // run fio's cells too
}

// LogCell is one cell's medians over rounds.
type LogCell struct {
	Committers int
	PerSec     float64       // commits per second
	P50, P99   time.Duration // commit latency
	PerFlush   float64       // commits per device write (what group commit buys)
	FioPerSec  float64       // fio: 4 KiB writes each followed by fdatasync, numjobs = committers
}

type discardApplier struct{}

func (discardApplier) Apply(context.Context, []byte, uint64, []byte, txn.LSN, *rldev.Fence) error {
	return nil
}

// LogBench runs two store nodes in this process (disks in files under
// dir), a log on an RLDev replicated over both, and measures transactions
// of one update each, committed with flush-on-commit by N committers at
// once; next to it, fio writing 4 KiB with fdatasync after each, with N
// jobs, on a raw file in the same directory.
func LogBench(ctx context.Context, dir string, o LogOptions, progress io.Writer) ([]LogCell, error) {
	c, err := StartCluster(dir, 2, ClusterOptions{Store: true, DiskSize: 512 << 20})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	mc := meta.NewClient(c.Members())
	defer mc.Close()
	rl := rldev.NewClerk(mc)
	defer rl.Close()
	for i := 0; ; i++ {
		if _, err = txn.CreateLog(ctx, mc, rl, "bench", 64<<20); err == nil {
			break
		}
		if i == 100 || ctx.Err() != nil {
			return nil, err
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := c.WaitLockMaster(ctx); err != nil {
		return nil, err
	}
	// The checkpointer has nothing to write back (no pages): it lets the
	// log reuse its ring as a real client's would after writing back.
	var l *txn.Log
	l, err = txn.OpenNamed(ctx, txn.NamedConfig{Meta: mc, RLDev: rl, Lock: txn.ClerkLocker(c.Nodes[0].Locks().DefaultClerk()), Name: "bench",
		Config: txn.Config{Applier: discardApplier{}, Checkpointer: nopCheckpointer{}}})
	if err != nil {
		return nil, err
	}
	defer l.Close(ctx)
	target := []byte("bench")
	redo, undo := make([]byte, o.Record), make([]byte, o.Record)
	var cells []LogCell
	for _, n := range o.Committers {
		var perSec, perFlush []float64
		var p50s, p99s []time.Duration
		for r := 0; r < o.Rounds; r++ {
			before := l.Stats()
			lats := make([][]time.Duration, n)
			var wg sync.WaitGroup
			var mu sync.Mutex
			var first error
			start := time.Now()
			deadline := start.Add(o.For)
			for w := 0; w < n; w++ {
				wg.Add(1)
				go func(w int) {
					defer wg.Done()
					for time.Now().Before(deadline) && ctx.Err() == nil {
						t0 := time.Now()
						tx := l.Begin()
						_, err := tx.Update(ctx, target, 0, redo, undo)
						if err == nil {
							_, err = tx.Commit(ctx, true)
						}
						if err != nil {
							mu.Lock()
							if first == nil {
								first = err
							}
							mu.Unlock()
							return
						}
						lats[w] = append(lats[w], time.Since(t0))
					}
				}(w)
			}
			wg.Wait()
			el := time.Since(start)
			if first != nil {
				return nil, first
			}
			var all []time.Duration
			for _, x := range lats {
				all = append(all, x...)
			}
			sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
			after := l.Stats()
			flushes := after.Flushes - before.Flushes
			perSec = append(perSec, float64(len(all))/el.Seconds())
			perFlush = append(perFlush, float64(len(all))/float64(max(flushes, 1)))
			p50s, p99s = append(p50s, Percentile(all, 50)), append(p99s, Percentile(all, 99))
			if progress != nil {
				fmt.Fprintf(progress, "log: %d committers, round %d: %.0f commits/s, p50 %v, %.1f commits per flush\n",
					n, r+1, perSec[len(perSec)-1], p50s[len(p50s)-1].Round(time.Microsecond), perFlush[len(perFlush)-1])
			}
		}
		cells = append(cells, LogCell{Committers: n, PerSec: medianF(perSec), PerFlush: medianF(perFlush), P50: medianD(p50s), P99: medianD(p99s)})
	}
	if o.Fio {
		file := filepath.Join(dir, "fio.raw")
		if err := PrepareFile(file, 64<<20); err != nil {
			return nil, err
		}
		defer os.Remove(file)
		for i, n := range o.Committers {
			var perSec []float64
			for r := 0; r < o.Rounds; r++ {
				res, err := RunFio(ctx, FioLoad{File: file, Size: 4096, QD: n, Write: true, Seq: true, Span: 64 << 20, For: o.For})
				if err != nil {
					return nil, err
				}
				perSec = append(perSec, float64(res.Ops)/res.Elapsed.Seconds())
				if progress != nil {
					fmt.Fprintf(progress, "fio: %d jobs, round %d: %.0f fdatasyncs/s\n", n, r+1, perSec[len(perSec)-1])
				}
			}
			cells[i].FioPerSec = medianF(perSec)
		}
	}
	return cells, nil
}

type nopCheckpointer struct{}

func (nopCheckpointer) WriteBack(context.Context, txn.LSN) error { return nil }

func medianF(x []float64) float64 {
	s := append([]float64(nil), x...)
	sort.Float64s(s)
	return s[len(s)/2]
}

func medianD(x []time.Duration) time.Duration {
	s := append([]time.Duration(nil), x...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}
