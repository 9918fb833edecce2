package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/grovestore/grove/internal/bench"
	"github.com/grovestore/grove/internal/cli"
	"github.com/grovestore/grove/internal/fd"
)

func benchCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Benchmarks that re-run the papers' experiments next to peers",
		Long: `Benchmarks that re-run the papers' experiments next to a peer on this machine,
in the same run. Progress goes to standard error, results to standard output
(-o json for scripts). README "Benchmarks" quotes their figures.`,
		Example: `  grove bench decree --concurrency 1,16,64
  grove bench fd --trials 7
  grove bench lock --rounds 3 --trials 7 -o json`,
	}
	cmd.AddCommand(benchDecreeCmd(), benchFDCmd(), benchLockCmd(), benchRLDevCmd(), benchChunkCmd(), benchTreeCmd(), benchLogCmd(), benchTableCmd())
	cmd.PersistentPreRun = func(*cobra.Command, []string) {
		// The benchmarks' in-process clusters run with the garbage
		// collector's setting a grove server has (GOGC=400 unless set).
		serverGC()
		if addr := pprofAddr(0); addr != "" {
			fmt.Fprintf(os.Stderr, "Go profiles of this run: http://%s/debug/pprof/\n", addr)
		}
	}
	return cmd
}

func benchDecreeCmd() *cobra.Command {
	var conc []int
	var ops, rounds int
	var withEtcd bool
	var out cli.Output
	cmd := &cobra.Command{
		Use:     "decree",
		Short:   "Config-service decree commit latency and throughput, next to etcd puts (3 members on loopback each)",
		Example: "  grove bench decree\n  grove bench decree --concurrency 1,16,64 --ops 2000 --rounds 3 --etcd=false",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.Resolve(); err != nil {
				return err
			}
			if len(conc) == 0 || ops < 1 || rounds < 1 {
				return cli.Usagef("--concurrency, --ops and --rounds must be positive")
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Minute)
			defer cancel()
			dir, err := os.MkdirTemp("", "grove-bench-decree-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(dir)
			g, err := bench.StartGroveConfigService(dir+"/grove", 3)
			if err != nil {
				return err
			}
			defer g.Close()
			var e *bench.EtcdCluster
			if withEtcd {
				if e, err = bench.StartEtcd(dir, 3); err != nil {
					return err
				}
				defer e.Close()
			}
			fmt.Fprintf(os.Stderr, "%d rounds of %d ops per concurrency; 64-byte values; figures are medians over rounds\n", rounds, ops)
			d := &cli.Doc{}
			rt := d.Table("results", "SYSTEM", "CONCURRENCY", "OPS-PER-SEC", "P50-US", "P99-US")
			ratios := d.Table("ratios", "CONCURRENCY", "THROUGHPUT", "P50", "P99")
			for _, c := range conc {
				var gr, er []bench.Result
				for r := 0; r < rounds; r++ {
					res, err := bench.DecreeLoad(ctx, g, c, ops)
					if err != nil {
						return err
					}
					gr = append(gr, res)
					fmt.Fprintf(os.Stderr, "  round %d: %v\n", r+1, res)
					if e != nil {
						res, err := bench.EtcdPutLoad(ctx, e, c, ops)
						if err != nil {
							return err
						}
						er = append(er, res)
						fmt.Fprintf(os.Stderr, "  round %d: %v\n", r+1, res)
					}
				}
				gm := medianResult(gr)
				resultRow(rt, gm)
				if e != nil {
					em := medianResult(er)
					resultRow(rt, em)
					ratios.Row(c, ratio(gm.PerSec()/em.PerSec()), ratio(float64(gm.P50)/float64(em.P50)), ratio(float64(gm.P99)/float64(em.P99)))
				}
			}
			return out.Print(os.Stdout, d)
		},
	}
	cmd.Flags().IntSliceVar(&conc, "concurrency", []int{1, 16}, "run at each of these client concurrencies: `N,...`")
	cmd.Flags().IntVar(&ops, "ops", 2000, "run `N` operations per round")
	cmd.Flags().IntVar(&rounds, "rounds", 3, "run `N` rounds per concurrency and report medians")
	cmd.Flags().BoolVar(&withEtcd, "etcd", true, "also run etcd (needs the etcd binary: apt-get install etcd-server)")
	out.Register(cmd)
	return cmd
}

// resultRow adds a benchmark result to a results table.
func resultRow(t *cli.Table, r bench.Result) {
	t.Row(r.System, r.Concurrency, cli.C(fmt.Sprintf("%.0f", r.PerSec()), math.Round(r.PerSec())),
		cli.C(fmt.Sprint(r.P50.Microseconds()), r.P50.Microseconds()), cli.C(fmt.Sprint(r.P99.Microseconds()), r.P99.Microseconds()))
}

func ratio(x float64) cli.Cell { return cli.C(fmt.Sprintf("%.2f", x), math.Round(x*100)/100) }

// medianResult takes the round with the median throughput.
func medianResult(rs []bench.Result) bench.Result {
	best := rs[0]
	for _, r := range rs {
		n := 0
		for _, o := range rs {
			if o.PerSec() < r.PerSec() {
				n++
			}
		}
		if n == len(rs)/2 {
			best = r
		}
	}
	return best
}

func benchFDCmd() *cobra.Command {
	var trials, port int
	var out cli.Output
	cmd := &cobra.Command{
		Use:     "fd",
		Short:   "Time from SIGKILL to a dead verdict and from restart to alive, on a real grove up --processes cluster",
		Example: "  grove bench fd --trials 7",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.Resolve(); err != nil {
				return err
			}
			if trials < 1 {
				return cli.Usagef("--trials %d: want at least 1", trials)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 10*time.Minute)
			defer cancel()
			bin, err := os.Executable()
			if err != nil {
				return err
			}
			dir, err := os.MkdirTemp("", "grove-bench-fd-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(dir)
			u, err := bench.StartUp(ctx, bin, dir, port, nil)
			if err != nil {
				return err
			}
			defer u.Close()
			ts, err := bench.FDFailover(ctx, u, trials, os.Stderr)
			if err != nil {
				return err
			}
			var dead, alive []time.Duration
			for _, t := range ts {
				dead, alive = append(dead, t.ToDead), append(alive, t.ToAlive)
			}
			target := fd.DefaultGracePeriod + 2*fd.DefaultInterval
			d := &cli.Doc{}
			t := d.Table("results", "MEASURE", "MEDIAN-MS", "MAX-MS", "TARGET-MS", "TRIALS")
			t.Row("sigkill_to_dead", ms(bench.Median(dead)), ms(maxDur(dead)), ms(target), len(dead))
			t.Row("restart_to_alive", ms(bench.Median(alive)), ms(maxDur(alive)), cli.C("-", nil), len(alive))
			return out.Print(os.Stdout, d)
		},
	}
	cmd.Flags().IntVar(&trials, "trials", 5, "run `N` kill/restart trials")
	cmd.Flags().IntVar(&port, "base-port", 7700, "start the benchmark's cluster at base `PORT`")
	out.Register(cmd)
	return cmd
}

// ms is a duration in milliseconds, to the microsecond.
func ms(d time.Duration) cli.Cell {
	v := float64(d.Microseconds()) / 1000
	return cli.C(fmt.Sprintf("%.1f", v), v)
}

func maxDur(d []time.Duration) time.Duration {
	var m time.Duration
	for _, x := range d {
		m = max(m, x)
	}
	return m
}

func benchLockCmd() *cobra.Command {
	var ops, trials, port, rounds int
	var out cli.Output
	cmd := &cobra.Command{
		Use:     "lock",
		Short:   "Lock service: uncontended acquire+release RTTs to a remote master, cached re-acquires, exclusive hand-off latency, SIGKILL-to-grant",
		Example: "  grove bench lock --ops 1000 --rounds 3 --trials 7",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.Resolve(); err != nil {
				return err
			}
			if ops < 1 || rounds < 1 || trials < 0 {
				return cli.Usagef("--ops and --rounds must be positive, --trials at least 0")
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 20*time.Minute)
			defer cancel()
			dir, err := os.MkdirTemp("", "grove-bench-lock-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(dir)
			c, err := bench.StartInProcess(dir+"/inproc", 3)
			if err != nil {
				return err
			}
			var un, ca, ho []bench.Result
			for r := 0; r < rounds; r++ {
				res, err := bench.LockBench(ctx, c, ops)
				if err != nil {
					c.Close()
					return err
				}
				fmt.Fprintf(os.Stderr, "  round %d:\n    %v\n    %v\n    %v\n", r+1, res.Uncontended, res.Cached, res.Handoff)
				un, ca, ho = append(un, res.Uncontended), append(ca, res.Cached), append(ho, res.Handoff)
			}
			c.Close()
			fmt.Fprintf(os.Stderr, "clerk on a node that is not the master; %d rounds, medians:\n", rounds)
			d := &cli.Doc{}
			t := d.Table("results", "SYSTEM", "CONCURRENCY", "OPS-PER-SEC", "P50-US", "P99-US")
			for _, x := range []struct {
				name string
				rs   []bench.Result
			}{{"uncontended", un}, {"cached", ca}, {"handoff", ho}} {
				m := medianResult(x.rs)
				m.System = x.name
				resultRow(t, m)
			}
			if trials > 0 {
				bin, err := os.Executable()
				if err != nil {
					return err
				}
				u, err := bench.StartUp(ctx, bin, dir+"/procs", port, nil)
				if err != nil {
					return err
				}
				defer u.Close()
				ts, err := bench.LockFailover(ctx, u, trials, os.Stderr)
				if err != nil {
					return err
				}
				var ds []time.Duration
				for _, t := range ts {
					ds = append(ds, t.ToGrant)
				}
				ft := d.Table("failover", "MEASURE", "MEDIAN-MS", "MAX-MS", "GRACE-PERIOD-MS", "TRIALS")
				ft.Row("sigkill_to_grant", ms(bench.Median(ds)), ms(maxDur(ds)), ms(fd.DefaultGracePeriod), len(ds))
			}
			return out.Print(os.Stdout, d)
		},
	}
	cmd.Flags().IntVar(&ops, "ops", 2000, "run `N` operations per measurement")
	cmd.Flags().IntVar(&rounds, "rounds", 3, "run `N` rounds and report medians")
	cmd.Flags().IntVar(&trials, "trials", 5, "run `N` SIGKILL trials on a real grove up --processes cluster (0: none)")
	cmd.Flags().IntVar(&port, "base-port", 7700, "start the SIGKILL trials' cluster at base `PORT`")
	out.Register(cmd)
	return cmd
}
