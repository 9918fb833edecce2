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

func benchTreeCmd() *cobra.Command {
	var clients []int
	var shapes []string
	var ops, rounds int
	var etcd, figures bool
	var out cli.Output
	cmd := &cobra.Command{
		Use:   "tree",
		Short: "B-link trees: Boxwood Figures 6 and 7 (insert, lookup, delete throughput by clients)",
		Long: `Re-runs Boxwood's Figures 6 and 7 (§4.4) on this machine: three nodes in this
process (loopback, disks in sparse files under a temporary directory, all on
this machine's cores and one disk), each a B-tree server; client i works
through node i mod 3. Figure 6: a private tree per client; Figure 7: one
shared tree, each client on its own key range. Every client inserts --ops
keys, looks each up with cold caches (every server writes back and gives up
its cache first, as Boxwood evicted its caches) and again warm, then deletes
each; one operation at a time per client, each durable when it returns.
Shapes: "paper" is Boxwood's (10-byte keys and values, fanout 6), "big"
16-byte keys and 256-byte values in the default 8 KiB nodes, "large" (not
run by default) 16-byte keys and 64 KiB values, each in a chunk of its own.
Figures are
operations per second, all clients together, medians over --rounds.

--etcd (on by default when the etcd binary is installed: apt-get install
etcd-server) adds the peer comparison (figure 0): a 3-member etcd cluster on
this machine and Grove's etcd-compatible endpoint, driven by the same etcd v3
gRPC load at the same client counts and shapes: each client puts --ops keys
one at a time, then reads each back with a linearizable range. Both
acknowledge a put once it is on two disks.`,
		Example: "  grove bench tree\n  grove bench tree --clients 1,2 --ops 200 --shapes paper -o json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.Resolve(); err != nil {
				return err
			}
			if len(clients) == 0 || ops < 1 || rounds < 1 {
				return cli.Usagef("--clients, --ops and --rounds must be positive")
			}
			for _, c := range clients {
				if c < 1 || c > 64 {
					return cli.Usagef("--clients: %d: want 1..64", c)
				}
			}
			for _, s := range shapes {
				if s != "paper" && s != "big" && s != "large" {
					return cli.Usagef("--shapes: %q: want paper, big or large", s)
				}
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), time.Hour)
			defer cancel()
			dir, err := os.MkdirTemp("", "grove-bench-tree-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(dir)
			fmt.Fprintf(os.Stderr, "%d rounds of %d keys per client; medians\n", rounds, ops)
			if etcd {
				if _, err := exec.LookPath("etcd"); err != nil {
					if cmd.Flags().Changed("etcd") {
						return cli.Usagef("--etcd: etcd is not installed (apt-get install etcd-server)")
					}
					fmt.Fprintln(os.Stderr, "(etcd is not installed: no etcd comparison; apt-get install etcd-server)")
					etcd = false
				}
			}
			r, err := bench.TreeBench(ctx, dir, bench.TreeOptions{Clients: clients, Ops: ops, Rounds: rounds, Shapes: shapes, Etcd: etcd, NoFigures: !figures}, os.Stderr)
			if err != nil {
				return cli.Failf("bench tree", "%v", err)
			}
			d := &cli.Doc{}
			t := d.Table("cells", "FIGURE", "SHAPE", "CLIENTS", "PHASE", "OPS-PER-S", "P50")
			for _, c := range r.Cells {
				p50 := "-"
				if c.P50 > 0 {
					p50 = c.P50.Round(time.Microsecond).String()
				}
				t.Row(c.Figure, c.Shape, c.Clients, c.Phase, float64(int(c.OpsPerS)), p50)
			}
			return out.Print(os.Stdout, d)
		},
	}
	cmd.Flags().IntSliceVar(&clients, "clients", []int{1, 2, 4, 8}, "client counts, `N,...`")
	cmd.Flags().StringSliceVar(&shapes, "shapes", []string{"paper", "big"}, "key/value shapes, `paper,big,large`")
	cmd.Flags().IntVar(&ops, "ops", 500, "keys per client, `N`")
	cmd.Flags().IntVar(&rounds, "rounds", 3, "rounds per cell, `N` (median)")
	cmd.Flags().BoolVar(&figures, "figures", true, "run Figures 6 and 7 (--figures=false: the etcd comparison alone)")
	cmd.Flags().BoolVar(&etcd, "etcd", true, "compare with etcd (3 members on this machine) through Grove's etcd-compatible endpoint")
	out.Register(cmd)
	return cmd
}
