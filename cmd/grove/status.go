package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/cli"
)

// fetchStatus asks the endpoints, in order, for the cluster's status.
func fetchStatus(ctx context.Context, c *cli.Client, op string) (*pb.StatusResponse, string, error) {
	var r *pb.StatusResponse
	var via string
	err := c.Do(ctx, op, func(ctx context.Context, conn *cli.Conn) error {
		var err error
		r, err = pb.NewClusterServiceClient(conn).Status(ctx, &pb.StatusRequest{})
		via = conn.Endpoint
		return err
	})
	if err != nil {
		return nil, "", err
	}
	sort.Slice(r.Nodes, func(i, j int) bool { return r.Nodes[i].Id < r.Nodes[j].Id })
	sort.Slice(r.Members, func(i, j int) bool { return r.Members[i].Id < r.Members[j].Id })
	return r, via, nil
}

// nodeState is a node's STATE: dead (a majority of all observers said so),
// forgotten (dead, and lost for good: grove rldev forget-node forgot it;
// not a problem), alive (a majority hears its registered incarnation), or
// joining (neither: just restarted, or cut off and not yet declared dead).
func nodeState(n *pb.NodeStatus, observers int) string {
	switch {
	case !n.Alive:
		if n.Forgotten {
			return "forgotten" // lost for good (grove rldev forget-node): not a problem
		}
		return "dead"
	case int(n.ObserversHeard) <= observers/2:
		return "joining"
	}
	return "alive"
}

// problems lists what keeps the cluster from being healthy; none means
// every node is alive and the config service has a leader that answers.
func problems(r *pb.StatusResponse) []string {
	var out []string
	if r.Leader == 0 {
		p := "the config service has no leader"
		if r.LastLeader != 0 {
			p += fmt.Sprintf(" (last known: member %d)", r.LastLeader)
		}
		out = append(out, p)
	}
	if r.Stale {
		out = append(out, "the node list is a cached copy: the config service could not be read ("+r.ConfigError+")")
	}
	asked := map[uint64]bool{}
	for _, h := range r.MemberHealth {
		asked[h.Id] = true
		if !h.Answered {
			out = append(out, fmt.Sprintf("member %d does not answer (%s)", h.Id, h.Error))
		}
	}
	for _, m := range r.Members {
		if !asked[m.Id] && len(r.MemberHealth) > 0 {
			// A voter added by hand that the node configs do not list
			// counts in every majority, but nothing watches it.
			out = append(out, fmt.Sprintf("member %d is a voter the nodes' [[members]] do not list: its state is unknown (majority: %d of %d voters)", m.Id, len(r.Members)/2+1, len(r.Members)))
		}
	}
	obs := len(r.MemberHealth)
	if obs == 0 {
		obs = len(r.Members)
	}
	for _, n := range r.Nodes {
		switch nodeState(n, obs) {
		case "dead":
			out = append(out, fmt.Sprintf("node %d is dead (incarnation %d)", n.Id, n.Incarnation))
		case "joining":
			out = append(out, fmt.Sprintf("node %d is joining: heard by %d of %d observers", n.Id, n.ObserversHeard, obs))
		}
	}
	return out
}

func statusDoc(r *pb.StatusResponse) *cli.Doc {
	d := &cli.Doc{}
	ps := problems(r)
	d.Field("healthy", len(ps) == 0)
	leaderText := fmt.Sprint(r.Leader)
	if r.Leader == 0 {
		leaderText = "none"
		if r.LastLeader != 0 {
			leaderText = fmt.Sprintf("none (last known: %d)", r.LastLeader)
		}
	}
	d.FieldText("leader", r.Leader, leaderText)
	d.Field("last_leader", r.LastLeader)
	d.Field("stale", r.Stale)
	obsN := len(r.MemberHealth)
	if obsN == 0 {
		obsN = len(r.Members)
	}
	d.Field("observers", obsN) // HEARD-BY's denominator

	health := map[uint64]*pb.MemberHealth{}
	for _, h := range r.MemberHealth {
		health[h.Id] = h
	}
	mt := d.Table("members", "MEMBER", "RAFT", "GRPC", "VOTER", "RAFT-STATE", "TERM", "COMMIT-INDEX")
	seen := map[uint64]bool{}
	for _, m := range r.Members {
		seen[m.Id] = true
		h := health[m.Id]
		state, term, commit := "unknown", uint64(0), uint64(0)
		if h != nil {
			state, term, commit = memberState(h), h.Term, h.CommitIndex
		}
		mt.Row(m.Id, m.RaftAddr, m.GrpcAddr, m.Voter, state, term, commit)
	}
	for _, h := range r.MemberHealth { // configured but not in the raft configuration (removed)
		if !seen[h.Id] {
			mt.Row(h.Id, "", "", false, memberState(h), h.Term, h.CommitIndex)
		}
	}
	obs := len(r.MemberHealth)
	if obs == 0 {
		obs = len(r.Members)
	}
	nt := d.Table("nodes", "NODE", "STATE", "INCARNATION", "HEARD-BY", "DEAD-VOTES", "ANSWERED", "GRPC", "BEACON", "ROLES")
	for _, n := range r.Nodes {
		roles := n.Roles
		if roles == nil {
			roles = []string{}
		}
		nt.Row(n.Id, nodeState(n, obs), n.Incarnation,
			cli.C(fmt.Sprintf("%d/%d", n.ObserversHeard, obs), n.ObserversHeard),
			cli.C(fmt.Sprintf("%d/%d", n.ObserversDead, n.ObserversAnswered), n.ObserversDead),
			n.ObserversAnswered, n.GrpcAddr, n.BeaconAddr, roles)
	}
	if ps == nil {
		ps = []string{}
	}
	d.FieldText("problems", ps, problemText(ps))
	return d
}

func memberState(h *pb.MemberHealth) string {
	if !h.Answered {
		return "unreachable"
	}
	return h.RaftState
}

func problemText(ps []string) string {
	if len(ps) == 0 {
		return "none"
	}
	return strings.Join(ps, "; ")
}

func statusCmd() *cobra.Command {
	var c cli.Client
	var out cli.Output
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show config-service members and leader, and every node's incarnation, liveness and roles",
		Long: `Show the config-service members (each asked directly: does it answer, its raft
state and term), the leader, and every registered node with its incarnation and
the failure detector's verdict. When the config service has no quorum, status
still shows what it can: which members answer, the last known leader, and the
last node list read (marked stale).

Exits 0 when the cluster is healthy, 6 when it answered but is degraded (a node
dead or joining, a member not answering, no leader), 3 when no endpoint could
be reached. A dead node that grove rldev forget-node forgot (lost for good) is
shown as forgotten and is not a problem.`,
		Example: `  grove status
  grove status -o json
  grove status --endpoints 10.0.0.1:7410,10.0.0.2:7410`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.Resolve(); err != nil {
				return err
			}
			r, _, err := fetchStatus(cmd.Context(), &c, "status")
			if err != nil {
				return err
			}
			if err := out.Print(os.Stdout, statusDoc(r)); err != nil {
				return err
			}
			if ps := problems(r); len(ps) > 0 {
				return &cli.Error{Code: cli.ExitDegraded, Op: "status", Msg: "the cluster is degraded: " + problemText(ps)}
			}
			return nil
		},
	}
	c.Register(cmd, cli.DefaultCommandTimeout)
	out.Register(cmd)
	return cmd
}

func healthCmd() *cobra.Command {
	var c cli.Client
	var out cli.Output
	cmd := &cobra.Command{
		Use:   "health",
		Short: "Exit 0 only if every node is alive (or forgotten) and the config service has a leader",
		Long: `Check the cluster's health for scripts and container health checks: exit 0 only
if the config service has a leader and every registered node is alive (heard by
a majority of observers), but for the dead ones grove rldev forget-node forgot
(lost for good); 6 if the cluster answered but is degraded, with the reasons; 3
if no endpoint could be reached; 4 on a timeout.`,
		Example: `  grove health && echo ok
  grove health --endpoints 10.0.0.1:7410 --command-timeout 3s
  grove health -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.Resolve(); err != nil {
				return err
			}
			r, via, err := fetchStatus(cmd.Context(), &c, "health")
			if err != nil {
				return err
			}
			ps := problems(r)
			alive, forgotten := 0, 0
			obs := len(r.MemberHealth)
			for _, n := range r.Nodes {
				switch nodeState(n, obs) {
				case "alive":
					alive++
				case "forgotten":
					forgotten++
				}
			}
			d := &cli.Doc{}
			text := fmt.Sprintf("%d/%d nodes alive, config-service leader %d (asked %s)", alive, len(r.Nodes), r.Leader, via)
			if forgotten > 0 {
				text = fmt.Sprintf("%d/%d nodes alive, %d forgotten (lost for good), config-service leader %d (asked %s)", alive, len(r.Nodes), forgotten, r.Leader, via)
			}
			if len(ps) > 0 {
				text = fmt.Sprintf("no: %s (asked %s)", problemText(ps), via)
			}
			d.FieldText("healthy", len(ps) == 0, text)
			if ps == nil {
				ps = []string{}
			}
			d.Field("leader", r.Leader)
			d.Field("nodes", len(r.Nodes))
			d.Field("alive", alive)
			d.Field("forgotten", forgotten)
			d.Field("endpoint", via)
			d.FieldText("problems", ps, problemText(ps))
			if err := out.Print(os.Stdout, d); err != nil {
				return err
			}
			if len(ps) > 0 {
				return cli.ExitStatus(cli.ExitDegraded) // the reasons are printed already
			}
			return nil
		},
	}
	c.Register(cmd, cli.DefaultCommandTimeout)
	out.Register(cmd)
	return cmd
}
