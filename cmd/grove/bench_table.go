package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"time"

	"github.com/spf13/cobra"

	"github.com/grovestore/grove/internal/bench"
	"github.com/grovestore/grove/internal/cli"
	"github.com/grovestore/grove/internal/units"
)

func benchTableCmd() *cobra.Command {
	var o bench.TableOptions
	var redis bool
	var out cli.Output
	cmd := &cobra.Command{
		Use:   "table",
		Short: "DDS hash tables: put and get throughput by operations in flight (DDS Figure 4), next to redis",
		Long: `Re-runs the throughput experiment of DDS (§5.1, Figure 4) on this machine: three
nodes in this process (loopback; every node a brick; all on this machine's
cores), a table of --partitions partitions with --replicas replicas each,
--clients libraries keeping the cell's operations in flight between them on
random keys of a preloaded key space, --value-size-byte values (DDS: 150, 2
replicas, 100 operations in flight per service instance). A put is a
two-phase commit across its partition's replicas; a get reads one replica.
Figures are operations per second (all clients) and median latencies,
medians over --rounds of --duration each. DDS's figure scales bricks over
machines; here every brick shares two cores, so this is the per-machine cost,
not the scaling.

--redis (on by default when redis-server and redis-benchmark are installed:
apt-get install redis-server redis-tools) adds the peer: one redis-server on
loopback without persistence (DDS's replicas are in memory too, but redis
keeps one copy), driven by redis-benchmark's SET and GET with as many
connections as the cell has operations in flight.

--value-sizes adds DDS's Figure 7 (throughput against value size): after the
cells above and the maintenance timings, the table's keys are written again
with each size and read at the largest --outstanding (redis's keys SET with
the size, then GET). DDS found reads flat from 50 to 1 000 bytes, then falling
as per-byte costs (its 100 Mb/s network) took over; on loopback the limit is
CPU and copying.

--recovery-keys adds DDS's Figure 8 (availability and recovery): a table of
one partition with three replicas, read at the largest --outstanding and
written one operation at a time, for 20 s; node 3 crashes at 5 s and starts
again at 10 s, and its new brick recovers into the group (write lease, whole
copy, join). Reads and writes completed per second, with the events.`,
		Example: "  grove bench table\n  grove bench table --outstanding 1,16 --duration 2s -o json\n  grove bench table --outstanding 100 --value-sizes 50,1000,8000,32000\n  grove bench table --outstanding 100 --recovery-keys 100000",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.Resolve(); err != nil {
				return err
			}
			if len(o.Outstanding) == 0 || o.Clients < 1 || o.Rounds < 1 || o.Keys < 1 || o.Duration <= 0 || o.ValueSize < 0 || o.ValueSize > 1<<20 {
				return cli.Usagef("--outstanding, --clients, --rounds, --keys and --duration must be positive; --value-size 0 to 1 MiB")
			}
			for _, n := range o.Outstanding {
				if n < 1 || n > 1000 {
					return cli.Usagef("--outstanding: %d: want 1..1000", n)
				}
			}
			o.Redis = redis
			if redis {
				_, e1 := exec.LookPath("redis-server")
				_, e2 := exec.LookPath("redis-benchmark")
				if e1 != nil || e2 != nil {
					if cmd.Flags().Changed("redis") {
						return cli.Usagef("--redis: redis-server or redis-benchmark is not installed (apt-get install redis-server redis-tools)")
					}
					fmt.Fprintln(os.Stderr, "(redis is not installed: no redis comparison; apt-get install redis-server redis-tools)")
					o.Redis = false
				}
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), time.Hour)
			defer cancel()
			dir, err := os.MkdirTemp("", "grove-bench-table-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(dir)
			r, err := bench.TableBench(ctx, dir, o, os.Stderr)
			if err != nil {
				return cli.Failf("bench table", "%v", err)
			}
			d := &cli.Doc{}
			t := d.Table("cells", "SYSTEM", "OP", "IN-FLIGHT", "VALUE-BYTES", "OPS-PER-S", "MB-PER-S", "P50")
			for _, c := range r.Cells {
				t.Row(c.System, c.Op, c.Outstanding, c.ValueSize, float64(int(c.OpsPerS)), float64(int(c.OpsPerS*float64(c.ValueSize)/1e4))/100, c.P50.Round(time.Microsecond).String())
			}
			d.Field("checkpoint", fmt.Sprintf("%v, %s written (every replica, synced; writes wait)", r.Checkpoint.Round(time.Millisecond), units.FormatSize(r.CheckpointBytes)))
			d.Field("split", r.Split.Round(time.Millisecond).String())
			d.Field("merge", r.Merge.Round(time.Millisecond).String())
			if r.Move > 0 {
				d.Field("move", fmt.Sprintf("%v, %s of values (copy, hand-off, swap)", r.Move.Round(time.Millisecond), units.FormatSize(r.MoveBytes)))
			}
			if len(r.Timeline) > 0 {
				tl := d.Table("timeline", "SECOND", "READS", "WRITES", "EVENT")
				for _, s := range r.Timeline {
					tl.Row(s.Second, s.Reads, s.Writes, s.Event)
				}
			}
			if r.RedisSave > 0 {
				d.Field("redis_save", fmt.Sprintf("%v, %s (dump.rdb, fsynced)", r.RedisSave.Round(time.Millisecond), units.FormatSize(r.RedisSaveBytes)))
			}
			return out.Print(os.Stdout, d)
		},
	}
	cmd.Flags().IntSliceVar(&o.Outstanding, "outstanding", []int{1, 16, 100}, "operations in flight, all clients together, `N,...`")
	cmd.Flags().IntVar(&o.Clients, "clients", 4, "libraries, `N`")
	cmd.Flags().IntVar(&o.Partitions, "partitions", 8, "the table's partitions, `N` (a power of two)")
	cmd.Flags().IntVar(&o.Replicas, "replicas", 2, "replicas per partition, `N` (DDS: 2)")
	cmd.Flags().IntVar(&o.ValueSize, "value-size", 150, "value `BYTES` (DDS: 150)")
	cmd.Flags().IntVar(&o.RecoveryKeys, "recovery-keys", 0, "add DDS Figure 8 (availability and recovery) on a one-partition table of three replicas and `N` keys: reads and writes per second for 20 s, node 3 crashed at 5 s and started again at 10 s")
	cmd.Flags().IntSliceVar(&o.ValueSizes, "value-sizes", nil, "add DDS Figure 7: gets at the largest --outstanding with values of each size, `BYTES,...` (e.g. 50,100,250,500,1000,2000,4000,8000,16000,32000)")
	cmd.Flags().IntVar(&o.Keys, "keys", 10000, "key space, `N` keys loaded first")
	cmd.Flags().DurationVar(&o.Duration, "duration", 5*time.Second, "each round's `DURATION`")
	cmd.Flags().IntVar(&o.Rounds, "rounds", 3, "rounds per cell, `N` (median)")
	cmd.Flags().BoolVar(&redis, "redis", true, "compare with redis-server and redis-benchmark on this machine")
	out.Register(cmd)
	return cmd
}
