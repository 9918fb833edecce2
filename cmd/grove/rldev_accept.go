package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/cli"
	"github.com/grovestore/grove/internal/rldev"
)

func rldevAcceptCmd() *cobra.Command {
	var c cli.Client
	var out cli.Output
	var lose bool
	cmd := &cobra.Command{
		Use:   "accept-stale ID --lose-writes",
		Short: "Make an RLDev's stale copy the up-to-date one when the other is gone for good",
		Long: `When the only up-to-date copy of an RLDev is gone -- its disk lost, or its node
dead, while the other copy was stale (down, or being resynced) -- the RLDev
serves nothing: a stale copy never serves, since it may have missed writes.
If that copy is not coming back, accept the stale one: it becomes the primary
and serves what it holds; every write it missed is given up (a block may read
as it was before writes acknowledged since), and the other copy, if its node
returns, is copied whole from it.

The command refuses unless the up-to-date copy's node is dead to the failure
detector or reports its copy lost (its disk replaced); and unless the stale copy's node is up with its
segment loaded and not incomplete (a copy formatted blank and never copied
whole holds nothing). Without --lose-writes it says what it would do and
exits 2.`,
		Example: `  grove rldev list                       # NOTE: "the only up-to-date copy (node 1) is down"
  grove rldev accept-stale 3             # what would be given up
  grove rldev accept-stale 3 --lose-writes`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			const op = "rldev accept-stale"
			if err := out.Resolve(); err != nil {
				return err
			}
			id, err := parseID(args[0])
			if err != nil {
				return err
			}
			ctx, cancel := commandCtx(cmd.Context(), &c)
			defer cancel()
			st, _, err := fetchStatus(ctx, &c, op)
			if err != nil {
				return err
			}
			s, err := openRLDev(ctx, &c, op)
			if err != nil {
				return err
			}
			defer s.Close()
			t, err := s.clerk.Table(ctx, true)
			if err != nil {
				return rldevErr(op, &c, err)
			}
			rec := t.RLDevs[id]
			if rec == nil {
				return rldevErr(op, &c, fmt.Errorf("rldev %d: %w", id, rldev.ErrUnknown))
			}
			refuse := func(format string, a ...any) error {
				return &cli.Error{Code: cli.ExitFailed, Op: op, Msg: fmt.Sprintf("rldev %d: ", id) + fmt.Sprintf(format, a...), Hint: "grove rldev list shows the RLDev's state"}
			}
			switch {
			case rec.State == rldev.Normal:
				return refuse("normal: both copies are up to date, nothing to accept")
			case rec.Move != nil:
				return refuse("a segment move is in progress: cancel it first (grove rldev move %d --cancel)", id)
			}
			stale, up := rec.Secondary(), rec.Primary
			sNode, uNode := rec.Segs[stale].Node, rec.Segs[up].Node
			nst := nodeStatuses(ctx, s, t)
			// The stale copy must be there to serve, and hold something.
			rs := replicaStatus(nst, sNode, id)
			switch {
			case rs == nil:
				return &cli.Error{Code: cli.ExitUnavailable, Op: op, Msg: fmt.Sprintf("rldev %d: node %d, which holds the stale copy, does not answer or has not loaded its segment: it must be up to take over", id, sNode)}
			case rs.Lost || rs.Incomplete:
				return refuse("node %d's copy is incomplete (formatted blank after its disk was replaced, never copied whole): it holds nothing to accept; the RLDev's data is lost with the other copy", sNode)
			case rs.State == "failed":
				return refuse("node %d's copy failed (%s): it must load again first", sNode, rs.Error)
			}
			// The up-to-date copy must be gone.
			gone := ""
			var ns *pb.NodeStatus
			for _, n := range st.Nodes {
				if n.Id == uNode {
					ns = n
				}
			}
			us := replicaStatus(nst, uNode, id)
			switch {
			case ns == nil:
				gone = fmt.Sprintf("node %d is not registered", uNode)
			case !ns.Alive:
				gone = fmt.Sprintf("node %d is dead to the failure detector", uNode)
			case us != nil && (us.Lost || us.Incomplete):
				gone = fmt.Sprintf("node %d reports its copy lost (its disk was replaced)", uNode)
			case us != nil && us.State == "failed":
				// It loads again every few seconds (a disk error may be
				// transient) and may serve again.
				return refuse("node %d reports its copy failed (%s); it loads again now and then and may serve again. If its disk is dead, stop node %d (it is then dead to the failure detector) and run this again", uNode, us.Error, uNode)
			default:
				// (A node back with a new incarnation whose copy is not
				// named yet is here too: its copy, loaded, will serve.)
				return refuse("node %d's copy is up to date and its node is alive: it may serve again, and accepting node %d's stale copy would give up the writes only it holds. It is accepted only once node %d is dead to the failure detector or reports its copy lost", uNode, sNode, uNode)
			}
			what := fmt.Sprintf("%s; node %d's copy has been stale since it missed a write (epoch %d now): accepting it gives up every write it missed, and node %d's copy, if it returns, is copied whole from it", gone, sNode, rec.Epoch, uNode)
			if !lose {
				return &cli.Error{Code: cli.ExitUsage, Op: op, Msg: fmt.Sprintf("rldev %d: %s", id, what), Hint: "run again with --lose-writes to accept it"}
			}
			nr, err := s.clerk.AcceptStale(ctx, id, rec.Epoch)
			if err != nil {
				return rldevErr(op, &c, err)
			}
			d := &cli.Doc{}
			d.Field("rldev", id)
			d.FieldText("accepted", map[string]any{"node": sNode, "segment": stale}, fmt.Sprintf("node %d's copy (segment %d): the primary now, serving alone", sNode, stale))
			d.FieldText("given_up", map[string]any{"node": uNode, "segment": up, "why": gone}, fmt.Sprintf("node %d's copy: stale, to be copied whole when it returns (%s)", uNode, gone))
			d.Field("epoch", nr.Epoch)
			return out.Print(os.Stdout, d)
		},
	}
	cmd.Flags().BoolVar(&lose, "lose-writes", false, "accept the stale copy, giving up the writes it missed")
	c.Register(cmd, cli.DefaultCommandTimeout)
	out.Register(cmd)
	return cmd
}
