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
)

func benchLogCmd() *cobra.Command {
	var committers []int
	var dur time.Duration
	var rounds, record int
	var noFio bool
	var out cli.Output
	cmd := &cobra.Command{
		Use:   "log",
		Short: "Transaction log: commits per second and commit latency with flush-on-commit, next to fio's fdatasync",
		Long: `Measures the transaction log (internal/txn) on this machine: two store nodes
in this process (loopback, disks in sparse files under a temporary
directory), a log on an RLDev replicated over both. N committers at once
each run transactions of one update record (--record bytes) committed with
flush-on-commit: concurrent commits share a device write (group commit), so
commits per second grow with N while one committer waits for each write.
Next to it, fio writes 4 KiB with fdatasync after each write, with N jobs, on
a raw file in the same directory (one local disk, no replication, no
network: the floor under any durable commit here). Figures are medians
over --rounds.`,
		Example: "  grove bench log\n  grove bench log --committers 1,16 --for 2s --rounds 1 -o json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.Resolve(); err != nil {
				return err
			}
			if len(committers) == 0 || rounds < 1 || dur <= 0 {
				return cli.Usagef("--committers, --for and --rounds must be positive")
			}
			for _, n := range committers {
				if n < 1 || n > 1024 {
					return cli.Usagef("--committers: %d: want 1..1024", n)
				}
			}
			if record < 1 || record > 1<<20 {
				return cli.Usagef("--record: %d: want 1..1048576", record)
			}
			fio := !noFio
			if _, err := exec.LookPath("fio"); fio && err != nil {
				return cli.Failf("bench log", "fio is not installed (apt-get install fio), or pass --no-fio")
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Minute)
			defer cancel()
			dir, err := os.MkdirTemp("", "grove-bench-log-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(dir)
			fmt.Fprintf(os.Stderr, "%d rounds of %v per cell; medians\n", rounds, dur)
			cells, err := bench.LogBench(ctx, dir, bench.LogOptions{Committers: committers, For: dur, Rounds: rounds, Record: record, Fio: fio}, os.Stderr)
			if err != nil {
				return cli.Failf("bench log", "%v", err)
			}
			ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
			d := &cli.Doc{}
			t := d.Table("commits", "COMMITTERS", "COMMITS-PER-S", "P50-MS", "P99-MS", "PER-FLUSH", "FIO-PER-S", "RATIO")
			for _, c := range cells {
				var fioPS, ratio any
				if fio {
					fioPS = float64(int(c.FioPerSec))
					ratio = float64(int(1000*c.PerSec/c.FioPerSec)) / 1000
				}
				t.Row(c.Committers, float64(int(c.PerSec)), ms(c.P50), ms(c.P99), float64(int(10*c.PerFlush))/10, fioPS, ratio)
			}
			return out.Print(os.Stdout, d)
		},
	}
	cmd.Flags().IntSliceVar(&committers, "committers", []int{1, 16, 64}, "concurrent committers, `N,...`")
	cmd.Flags().DurationVar(&dur, "for", 5*time.Second, "`DURATION` of each round of each cell")
	cmd.Flags().IntVar(&rounds, "rounds", 3, "`N` rounds per cell (medians are reported)")
	cmd.Flags().IntVar(&record, "record", 128, "`BYTES` of the update record each transaction logs")
	cmd.Flags().BoolVar(&noFio, "no-fio", false, "skip fio's cells")
	out.Register(cmd)
	return cmd
}
