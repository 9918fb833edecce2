package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/grovestore/grove/internal/cli"
	"github.com/grovestore/grove/internal/meta"
)

func memberCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "member",
		Short: "List, add or remove config-service members (one change at a time)",
		Long: `The config service is a raft group of the nodes listed as [[members]] in the
node configs. A member that lost its data directory must not vote again with
a blank memory: remove it, start it again (it waits, without raft state), and
add it back; it catches up from the leader.`,
		Example: `  grove member list
  grove member remove 3
  grove server --config node-3/grove.toml     # on node 3's machine
  grove member add 3`,
	}
	cmd.AddCommand(memberListCmd(), memberChangeCmd(true), memberChangeCmd(false))
	return cmd
}

func memberListCmd() *cobra.Command {
	var c cli.Client
	var out cli.Output
	cmd := &cobra.Command{
		Use:     "list",
		Short:   "List the config-service members and the leader",
		Example: "  grove member list\n  grove member list -o json --endpoints 10.0.0.1:7410",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.Resolve(); err != nil {
				return err
			}
			r, _, err := fetchStatus(cmd.Context(), &c, "member list")
			if err != nil {
				return err
			}
			d := &cli.Doc{}
			t := d.Table("members", "MEMBER", "RAFT", "GRPC", "VOTER", "LEADER")
			for _, m := range r.Members {
				t.Row(m.Id, m.RaftAddr, m.GrpcAddr, m.Voter, m.Id == r.Leader)
			}
			if err := out.Print(os.Stdout, d); err != nil {
				return err
			}
			if r.Leader == 0 {
				msg := "the config service has no leader: the list may be stale"
				if r.LastLeader != 0 {
					msg += fmt.Sprintf(" (last known leader: %d)", r.LastLeader)
				}
				return &cli.Error{Code: cli.ExitDegraded, Op: "member list", Msg: msg}
			}
			return nil
		},
	}
	c.Register(cmd, cli.DefaultCommandTimeout)
	out.Register(cmd)
	return cmd
}

func memberChangeCmd(add bool) *cobra.Command {
	var c cli.Client
	var out cli.Output
	var raftAddr string
	use, short, op := "remove ID", "Remove a member from the config service", "member remove"
	example := "  grove member remove 3"
	if add {
		use, short, op = "add ID", "Add a member (back) to the config service; it must be running, without raft state", "member add"
		example = "  grove member add 3\n  grove member add 4 --raft 10.0.0.4:7411"
	}
	cmd := &cobra.Command{
		Use:     use,
		Short:   short,
		Example: example,
		Args:    exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := strconv.ParseUint(args[0], 10, 64)
			if err != nil || id == 0 {
				return cli.Usagef("member id %q: want a positive integer", args[0])
			}
			if raftAddr != "" {
				if err := cli.CheckHostPort(raftAddr); err != nil {
					return cli.Usagef("--raft %q: %v", raftAddr, err)
				}
			}
			if err := out.Resolve(); err != nil {
				return err
			}
			// One bound for the whole command: the status read and the
			// change (raft commits it, and an add first waits for the
			// member to answer).
			ctx := cmd.Context()
			if c.CommandTimeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, c.CommandTimeout)
				defer cancel()
			}
			r, _, err := fetchStatus(ctx, &c, op)
			if err != nil {
				return err
			}
			var ms []meta.Member
			listed := false
			for _, m := range r.Members {
				listed = listed || m.Id == id
				if m.GrpcAddr != "" {
					ms = append(ms, meta.Member{ID: m.Id, RaftAddr: m.RaftAddr, GRPCAddr: m.GrpcAddr})
				}
			}
			switch {
			case !add && !listed:
				return &cli.Error{Code: cli.ExitNotFound, Op: op, Msg: fmt.Sprintf("member %d is not in the configuration", id), Hint: "grove member list shows the members"}
			case add && listed:
				return cli.Failf(op, "member %d is already in the configuration (remove it first if it lost its state)", id)
			case len(ms) == 0:
				return &cli.Error{Code: cli.ExitUnavailable, Op: op, Msg: "no config-service member is known", Hint: "is the cluster running?"}
			}
			mc := meta.NewClient(ms)
			defer mc.Close()
			idx, err := mc.ChangeMembers(ctx, add, id, raftAddr)
			if err != nil {
				return cli.FromRPC(op, "", c.CommandTimeout, err)
			}
			verb := "removed"
			if add {
				verb = "added"
			}
			d := &cli.Doc{}
			d.FieldText("member", id, fmt.Sprintf("%d %s (raft index %d)", id, verb, idx))
			d.Field("change", verb)
			d.Field("raft_index", idx)
			if out.JSON() {
				return out.Print(os.Stdout, d)
			}
			_, err = fmt.Printf("member %d %s (raft index %d)\n", id, verb, idx)
			return err
		},
	}
	c.Register(cmd, 30*time.Second)
	out.Register(cmd)
	if add {
		cmd.Flags().StringVar(&raftAddr, "raft", "", "the new member's raft address, `HOST:PORT` (default: the one in the members' configs)")
	}
	return cmd
}
