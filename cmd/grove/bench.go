package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/grovestore/grove/internal/bench"
	"github.com/grovestore/grove/internal/fd"
)

func benchCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "bench", Short: "Benchmarks that re-run the papers' experiments next to peers"}
	cmd.AddCommand(benchDecreeCmd(), benchFDCmd(), benchLockCmd())
	return cmd
}

func benchDecreeCmd() *cobra.Command {
	var conc []int
	var ops, rounds int
	var withEtcd bool
	cmd := &cobra.Command{
		Use:   "decree",
		Short: "Config-service decree commit latency and throughput, next to etcd puts (3 members on loopback each)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
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
			fmt.Printf("%d rounds of %d ops per concurrency; 64-byte values; figures are medians over rounds\n", rounds, ops)
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
				fmt.Println(gm)
				if e != nil {
					em := medianResult(er)
					fmt.Println(em)
					fmt.Printf("ratio grove/etcd conc=%d: throughput %.2f, p50 %.2f, p99 %.2f\n", c,
						gm.PerSec()/em.PerSec(), float64(gm.P50)/float64(em.P50), float64(gm.P99)/float64(em.P99))
				}
			}
			return nil
		},
	}
	cmd.Flags().IntSliceVar(&conc, "concurrency", []int{1, 16}, "client concurrency levels")
	cmd.Flags().IntVar(&ops, "ops", 2000, "operations per round")
	cmd.Flags().IntVar(&rounds, "rounds", 3, "rounds per concurrency (medians are reported)")
	cmd.Flags().BoolVar(&withEtcd, "etcd", true, "also run etcd (needs the etcd binary: apt-get install etcd-server)")
	return cmd
}

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
	cmd := &cobra.Command{
		Use:   "fd",
		Short: "Time from SIGKILL to a dead verdict and from restart to alive, on a real `grove up --processes` cluster",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
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
			fmt.Printf("SIGKILL→dead: median %v, max %v (target GracePeriod+2ΔT = %v)\n", bench.Median(dead).Round(time.Millisecond), maxDur(dead).Round(time.Millisecond), target)
			fmt.Printf("restart→alive: median %v, max %v\n", bench.Median(alive).Round(time.Millisecond), maxDur(alive).Round(time.Millisecond))
			return nil
		},
	}
	cmd.Flags().IntVar(&trials, "trials", 5, "kill/restart trials")
	cmd.Flags().IntVar(&port, "base-port", 7700, "base port for the benchmark's cluster")
	return cmd
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
	cmd := &cobra.Command{
		Use:   "lock",
		Short: "Lock service: uncontended acquire+release RTTs to a remote master, cached re-acquires, exclusive hand-off latency, SIGKILL-to-grant",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
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
			fmt.Printf("clerk on a node that is not the master; %d rounds, medians:\n", rounds)
			fmt.Printf("uncontended acquire+release (2 messages, 1 round trip): %v\n", medianResult(un))
			fmt.Printf("cached re-acquire (no RPC):                             %v\n", medianResult(ca))
			fmt.Printf("exclusive hand-off between two nodes:                   %v\n", medianResult(ho))
			if trials == 0 {
				return nil
			}
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
			var d []time.Duration
			for _, t := range ts {
				d = append(d, t.ToGrant)
			}
			fmt.Printf("holder SIGKILL → waiter granted: median %v, max %v over %d trials (GracePeriod %v)\n",
				bench.Median(d).Round(time.Millisecond), maxDur(d).Round(time.Millisecond), len(d), fd.DefaultGracePeriod)
			return nil
		},
	}
	cmd.Flags().IntVar(&ops, "ops", 2000, "operations per measurement")
	cmd.Flags().IntVar(&rounds, "rounds", 3, "rounds (medians are reported)")
	cmd.Flags().IntVar(&trials, "trials", 5, "SIGKILL trials on a real `grove up --processes` cluster (0: skip)")
	cmd.Flags().IntVar(&port, "base-port", 7700, "base port for the SIGKILL trials' cluster")
	return cmd
}
