package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/grovestore/grove/internal/bench"
	"github.com/grovestore/grove/internal/cli"
)

// Boxwood's Table 2 (§4.3): amortized latency of an 8 KiB allocation by
// batch size, on its 2003 hardware; and a free's latency.
var boxwoodTable2 = map[int]float64{1: 24, 10: 3.3, 100: 1.0, 1000: 1.0}

const boxwoodFreeMs = 5.3

func benchChunkCmd() *cobra.Command {
	var batches []int
	var ops, rounds int
	var out cli.Output
	cmd := &cobra.Command{
		Use:   "chunk",
		Short: "Chunk store: Boxwood Table 2 (allocations by batch size), frees, and the chunk data path next to the RLDev's",
		Long: `Re-runs Boxwood's Table 2 on this machine: two store nodes in this process
(loopback, disks in sparse files under a temporary directory), one chunk
manager pair. An 8 KiB allocation's amortized latency with batches of N
formed at the clerk, as in Boxwood (a Batcher reserves N zeroed chunks in one
request, hands them out itself and commits them in one more; N = 1 is a plain
allocation), and, for comparison, with N plain allocations in flight at once
(the primary group-commits them: one frame of the map's log); a free's
latency; and 64 KiB chunk writes and reads at queue depth 1 next to the same
RLDev's own. Figures are medians over --rounds.`,
		Example: "  grove bench chunk\n  grove bench chunk --batches 1,10,100 --ops 500 --rounds 3 -o json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.Resolve(); err != nil {
				return err
			}
			if len(batches) == 0 || ops < 1 || rounds < 1 {
				return cli.Usagef("--batches, --ops and --rounds must be positive")
			}
			for _, b := range batches {
				if b < 1 || b > 10000 {
					return cli.Usagef("--batches: %d: want 1..10000", b)
				}
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Minute)
			defer cancel()
			dir, err := os.MkdirTemp("", "grove-bench-chunk-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(dir)
			fmt.Fprintf(os.Stderr, "%d rounds of %d operations per cell; medians\n", rounds, ops)
			r, err := bench.ChunkBench(ctx, dir, bench.ChunkOptions{Batches: batches, Ops: ops, Rounds: rounds}, os.Stderr)
			if err != nil {
				return cli.Failf("bench chunk", "%v", err)
			}
			ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
			d := &cli.Doc{}
			t2 := d.Table("table2", "BATCH", "GROVE-MS", "IN-FLIGHT-MS", "BOXWOOD-MS")
			for _, b := range batches {
				var bw any
				if v, ok := boxwoodTable2[b]; ok {
					bw = v
				}
				t2.Row(b, ms(r.Batched[b]), ms(r.Alloc[b]), bw)
			}
			d.FieldText("free_ms", ms(r.Free), fmt.Sprintf("%.3f ms (Boxwood: %.1f ms)", ms(r.Free), boxwoodFreeMs))
			dp := d.Table("data_path", "OP", "CHUNK-MS", "RLDEV-MS", "RATIO")
			dp.Row("write64k", ms(r.ChunkWrite), ms(r.RLDevWrite), float64(int(1000*float64(r.RLDevWrite)/float64(r.ChunkWrite)))/1000)
			dp.Row("read64k", ms(r.ChunkRead), ms(r.RLDevRead), float64(int(1000*float64(r.RLDevRead)/float64(r.ChunkRead)))/1000)
			return out.Print(os.Stdout, d)
		},
	}
	cmd.Flags().IntSliceVar(&batches, "batches", []int{1, 10, 100, 1000}, "allocations in flight at once, `N,...`")
	cmd.Flags().IntVar(&ops, "ops", 2000, "`N` operations per cell")
	cmd.Flags().IntVar(&rounds, "rounds", 3, "`N` rounds per cell (medians are reported)")
	out.Register(cmd)
	return cmd
}
