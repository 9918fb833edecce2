package main

import (
	"errors"
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
	var lose, mixed bool
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
detector (the incarnation the table names) or reports its copy lost (its disk
replaced); unless the stale copy's node is up with its segment loaded and not
incomplete (a copy formatted blank and never copied whole holds nothing); and
for a copy a full copy was being written onto (it holds part of each copy's
history; --mixed takes it anyway). Fencing tokens admitted only by the copy
given up are forgotten with it: a writer whose lock passed on while the stale
copy was away may be admitted once more. Without --lose-writes it says what
it would do and exits 2.`,
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
			s, err := openRLDev(ctx, &c, op)
			if err != nil {
				return err
			}
			defer s.Close()
			// The table first, then the cluster's status and the nodes':
			// an up-to-date copy that comes back after they were read
			// can only serve by a decree that changes the record's epoch,
			// on which the accept is conditional (outside review 77).
			t, err := s.clerk.Table(ctx, true)
			if err != nil {
				return rldevErr(op, &c, err)
			}
			rec := t.RLDevs[id]
			if rec == nil {
				return rldevErr(op, &c, fmt.Errorf("rldev %d: %w", id, rldev.ErrUnknown))
			}
			st, _, err := fetchStatus(ctx, &c, op)
			if err != nil {
				return err
			}
			stale, up := rec.Secondary(), rec.Primary
			sNode, uNode := rec.Segs[stale].Node, rec.Segs[up].Node
			nst := nodeStatuses(ctx, s, t)
			v := rldev.AcceptView{Stale: replicaView(replicaStatus(nst, sNode, id)), UpStatus: replicaView(replicaStatus(nst, uNode, id)),
				StatusCached: st.Stale, Mixed: mixed}
			for _, n := range st.Nodes {
				if n.Id == uNode {
					v.UpRegistered, v.UpAlive, v.UpInc = true, n.Alive, n.Incarnation
				}
			}
			gone, err := rldev.CheckAccept(rec, v)
			switch {
			case errors.Is(err, rldev.ErrAcceptWait):
				return &cli.Error{Code: cli.ExitUnavailable, Op: op, Msg: err.Error(), Hint: "grove rldev list shows the RLDev's state", Err: err}
			case err != nil:
				return &cli.Error{Code: cli.ExitFailed, Op: op, Msg: err.Error(), Hint: "grove rldev list shows the RLDev's state", Err: err}
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
	cmd.Flags().BoolVar(&mixed, "mixed", false, "accept a copy that a full copy was being written onto (it holds part of each copy's history)")
	c.Register(cmd, cli.DefaultCommandTimeout)
	out.Register(cmd)
	return cmd
}

// replicaView is a node's status of a replica as the rldev package reads
// it (nil for none).
func replicaView(r *pb.RLDevReplicaStatus) *rldev.ReplicaStatus {
	if r == nil {
		return nil
	}
	return &rldev.ReplicaStatus{RLDev: r.Rldev, Segment: int(r.Segment), State: r.State, Stale: r.Stale, Primary: r.Primary,
		Err: r.Error, Wait: r.Wait, Lost: r.Lost, Incomplete: r.Incomplete, Overwritten: r.Overwritten, MoveTarget: r.MoveTarget}
}
