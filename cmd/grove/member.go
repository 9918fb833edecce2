package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/meta"
	"github.com/grovestore/grove/internal/transport"
)

func memberCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "member",
		Short: "List, add or remove config-service members (one change at a time)",
		Long: `The config service is a raft group of the nodes listed as [[members]] in the
node configs. A member that lost its data directory must not vote again with
a blank memory: remove it, start it again (it waits, without raft state), and
add it back; it catches up from the leader.

  grove member list
  grove member remove 3
  grove server --config node-3/grove.toml     # on node 3's machine
  grove member add 3`,
	}
	cmd.AddCommand(memberListCmd(), memberChangeCmd(true), memberChangeCmd(false))
	return cmd
}

// membersVia asks a node (or the gateway) for the cluster's members.
func membersVia(ctx context.Context, addr string) (*pb.StatusResponse, error) {
	cc, err := grpc.NewClient(addr, transport.DialOptions()...)
	if err != nil {
		return nil, err
	}
	defer cc.Close()
	r, err := pb.NewClusterServiceClient(cc).Status(ctx, &pb.StatusRequest{})
	if err != nil {
		return nil, fmt.Errorf("status from %s: %w (is the cluster running? use --addr for another node)", addr, err)
	}
	return r, nil
}

func memberListCmd() *cobra.Command {
	var addr string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the config-service members and the leader",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			r, err := membersVia(ctx, addr)
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(os.Stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(toJSON(r).Members)
			}
			w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "MEMBER\tRAFT\tGRPC\tVOTER\tLEADER")
			for _, m := range r.Members {
				fmt.Fprintf(w, "%d\t%s\t%s\t%v\t%v\n", m.Id, m.RaftAddr, m.GrpcAddr, m.Voter, m.Id == r.Leader)
			}
			return w.Flush()
		},
	}
	cmd.Flags().StringVar(&addr, "addr", DefaultAddr, "gRPC address of any node, or of `grove up`'s gateway")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON: [{id, raft, grpc, voter}]")
	return cmd
}

func memberChangeCmd(add bool) *cobra.Command {
	var addr, raftAddr string
	use, short := "remove ID", "Remove a member from the config service"
	if add {
		use, short = "add ID", "Add a member (back) to the config service; it must be running, without raft state"
	}
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := strconv.ParseUint(args[0], 10, 64)
			if err != nil || id == 0 {
				return fmt.Errorf("member id %q: want a positive integer", args[0])
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			r, err := membersVia(ctx, addr)
			if err != nil {
				return err
			}
			var ms []meta.Member
			for _, m := range r.Members {
				if m.GrpcAddr != "" {
					ms = append(ms, meta.Member{ID: m.Id, RaftAddr: m.RaftAddr, GRPCAddr: m.GrpcAddr})
				}
			}
			c := meta.NewClient(ms)
			defer c.Close()
			idx, err := c.ChangeMembers(ctx, add, id, raftAddr)
			if err != nil {
				return err
			}
			verb := "removed"
			if add {
				verb = "added"
			}
			fmt.Printf("member %d %s (raft index %d)\n", id, verb, idx)
			return nil
		},
	}
	cmd.Flags().StringVar(&addr, "addr", DefaultAddr, "gRPC address of any node, or of `grove up`'s gateway")
	if add {
		cmd.Flags().StringVar(&raftAddr, "raft", "", "the new member's raft address (default: the one in the members' configs)")
	}
	return cmd
}
