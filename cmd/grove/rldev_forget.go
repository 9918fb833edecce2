package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/grovestore/grove/internal/cli"
	"github.com/grovestore/grove/internal/rldev"
)

func rldevForgetCmd() *cobra.Command {
	var c cli.Client
	var out cli.Output
	var gone, replace bool
	cmd := &cobra.Command{
		Use:   "forget-node NODE [--re-place] --gone-for-good",
		Short: "Forget a node lost for good: no RLDev is placed on its disks again",
		Long: `A node lost for good still has its disks in the RLDev table: new RLDevs and
moves go on being placed there (an RLDev created on it starts degraded), and
the old extents retiring on it, which only it could wipe and free, stay
listed (an RLDev with four of them can no longer be moved). Once each of its
segments has been re-placed (grove rldev move ID --segment ... --to NODE,
copied whole from the other copy), forget it: its disks are marked forgotten
and every extent retiring on them is dropped, in one decree. What they hold
is given up.

--re-place does that first: each RLDev's segment on the node is re-placed on
the live node without its other copy that has the most room, a move's target
there given up, one decree per RLDev (the copies run in the background:
grove rldev list shows them); the RLDevs must be degraded already (exit 3
until the failure detector's verdict on the node has reached them).

The command refuses while the node is alive to the failure detector, or
still holds a segment or a move's target (it names them). If the node ever
runs again with a forgotten disk, that disk is not used (its log says so);
a wiped or new disk is. Without --gone-for-good it says what it would do and
exits 2.`,
		Example: `  grove rldev list                       # the node's RLDevs: degraded
  grove rldev move 4 --segment secondary --to 2
  grove rldev forget-node 3              # what would be given up
  grove rldev forget-node 3 --gone-for-good
  grove rldev forget-node 3 --re-place --gone-for-good   # all in one`,
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
			// --re-place: every RLDev's segment there re-placed on the
			// live node without its other copy that has the most room.
			var cands []uint64
			for _, n := range st.Nodes {
				if n.Alive && n.Id != node {
					cands = append(cands, n.Id)
				}
			}
			var replaced []string
			if replace {
				if replaced, err = t.EvacuateAll(node, cands); err != nil {
					return forgetErr(op, &c, err)
				}
			}
			plan, err := t.Forget(node)
			if len(replaced) > 0 && errors.Is(err, rldev.ErrForget) {
				err = nil // once re-placed
			}
			if err != nil {
				return forgetErr(op, &c, err)
			}
			if !gone {
				what := ""
				if plan != nil {
					what = plan.Describe()
				} else {
					what = "forgetting it then marks its disks forgotten (nothing is placed there again) and drops the extents retiring there, giving up what they hold"
				}
				if len(replaced) > 0 {
					what = strings.Join(replaced, "; ") + "; " + what
				}
				return &cli.Error{Code: cli.ExitUsage, Op: op, Msg: fmt.Sprintf("node %d: %s", node, what),
					Hint: "run again with --gone-for-good to forget it"}
			}
			if replace {
				plan, err = s.clerk.ForgetReplacing(ctx, node, cands, func(id uint64, what string) {
					fmt.Fprintf(os.Stderr, "rldev %d: %s\n", id, what)
				})
			} else {
				plan, err = s.clerk.Forget(ctx, node)
			}
			if err != nil {
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
			d.FieldText("retiring_dropped", dropped, plan.DroppedText())
			return out.Print(os.Stdout, d)
		},
	}
	cmd.Flags().BoolVar(&gone, "gone-for-good", false, "forget the node, giving up what its disks hold")
	cmd.Flags().BoolVar(&replace, "re-place", false, "first re-place every RLDev's segment on the node (and give up its move targets there)")
	c.Register(cmd, cli.DefaultCommandTimeout)
	out.Register(cmd)
	return cmd
}

func forgetErr(op string, c *cli.Client, err error) error {
	if errors.Is(err, rldev.ErrForgetWait) {
		return &cli.Error{Code: cli.ExitUnavailable, Op: op, Msg: err.Error(), Hint: "run again in a few seconds (grove rldev list shows the RLDev degraded once it is)", Err: err}
	}
	if errors.Is(err, rldev.ErrForget) {
		return &cli.Error{Code: cli.ExitFailed, Op: op, Msg: err.Error(), Hint: "grove rldev list shows the RLDevs and where they are", Err: err}
	}
	return rldevErr(op, c, err)
}
