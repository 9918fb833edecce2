package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/grovestore/grove/internal/cli"
	"github.com/grovestore/grove/internal/rldev"
)

func rldevForgetCmd() *cobra.Command {
	var c cli.Client
	var out cli.Output
	var gone bool
	cmd := &cobra.Command{
		Use:   "forget-node NODE --gone-for-good",
		Short: "Forget a node lost for good: no RLDev is placed on its disks again",
		Long: `A node lost for good still has its disks in the RLDev table: new RLDevs and
moves go on being placed there (an RLDev created on it starts degraded), and
the old extents retiring on it, which only it could wipe and free, stay
listed (an RLDev with four of them can no longer be moved). Once each of its
segments has been re-placed (grove rldev move ID --segment ... --to NODE,
copied whole from the other copy), forget it: its disks are marked forgotten
and every extent retiring on them is dropped, in one decree. What they hold
is given up.

The command refuses while the node is alive to the failure detector, or
still holds a segment or a move's target (it names them). If the node ever
runs again with a forgotten disk, that disk is not used (its log says so);
a wiped or new disk is. Without --gone-for-good it says what it would do and
exits 2.`,
		Example: `  grove rldev list                       # the node's RLDevs: degraded
  grove rldev move 4 --segment secondary --to 2
  grove rldev forget-node 3              # what would be given up
  grove rldev forget-node 3 --gone-for-good`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			const op = "rldev forget-node"
			if err := out.Resolve(); err != nil {
				return err
			}
			node, err := strconv.ParseUint(args[0], 10, 64)
			if err != nil || node == 0 {
				return cli.Usagef("%q is not a node id (a positive number: grove status)", args[0])
			}
			ctx, cancel := commandCtx(cmd.Context(), &c)
			defer cancel()
			s, err := openRLDev(ctx, &c, op)
			if err != nil {
				return err
			}
			defer s.Close()
			st, _, err := fetchStatus(ctx, &c, op)
			if err != nil {
				return err
			}
			if st.Stale {
				return &cli.Error{Code: cli.ExitUnavailable, Op: op, Msg: "the cluster's status is a cached copy (the config service has no quorum): whether the node is dead cannot be told",
					Hint: "grove status shows the config service"}
			}
			for _, n := range st.Nodes {
				if n.Id == node && n.Alive {
					return &cli.Error{Code: cli.ExitFailed, Op: op, Msg: fmt.Sprintf("node %d (incarnation %d) is alive: only a node the failure detector declared dead can be forgotten", node, n.Incarnation),
						Hint: "stop it for good first; grove status shows it"}
				}
			}
			t, err := s.clerk.Table(ctx, true)
			if err != nil {
				return rldevErr(op, &c, err)
			}
			plan, err := t.Forget(node)
			if err != nil {
				return forgetErr(op, &c, err)
			}
			if !gone {
				return &cli.Error{Code: cli.ExitUsage, Op: op, Msg: fmt.Sprintf("node %d: %s", node, plan.Describe()),
					Hint: "run again with --gone-for-good to forget it"}
			}
			if plan, err = s.clerk.Forget(ctx, node); err != nil {
				return forgetErr(op, &c, err)
			}
			d := &cli.Doc{}
			d.Field("node", node)
			var disks []any
			for _, k := range plan.Disks {
				disks = append(disks, k.Index)
			}
			d.FieldText("disks_forgotten", disks, fmt.Sprint(disks))
			dropped := map[string]any{}
			for id, sgs := range plan.Dropped {
				var ex []any
				for _, sg := range sgs {
					ex = append(ex, sg.String())
				}
				dropped[strconv.FormatUint(id, 10)] = ex
			}
			d.FieldText("retiring_dropped", dropped, fmt.Sprintf("%s of %s", rldev.Count(plan.DroppedCount(), "extent"), rldev.Count(len(plan.Dropped), "RLDev")))
			return out.Print(os.Stdout, d)
		},
	}
	cmd.Flags().BoolVar(&gone, "gone-for-good", false, "forget the node, giving up what its disks hold")
	c.Register(cmd, cli.DefaultCommandTimeout)
	out.Register(cmd)
	return cmd
}

func forgetErr(op string, c *cli.Client, err error) error {
	if errors.Is(err, rldev.ErrForget) {
		return &cli.Error{Code: cli.ExitFailed, Op: op, Msg: err.Error(), Hint: "grove rldev list shows the RLDevs and where they are", Err: err}
	}
	return rldevErr(op, c, err)
}
