package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/transport"
)

// DefaultAddr is where `grove up` serves the cluster gateway and where the
// operator tools look when given no --addr.
const DefaultAddr = "127.0.0.1:7400"

// StatusJSON is the stable output of `grove status --json`.
type StatusJSON struct {
	Leader  uint64       `json:"leader"`
	Members []MemberJSON `json:"members"`
	Nodes   []NodeJSON   `json:"nodes"`
}

type MemberJSON struct {
	ID    uint64 `json:"id"`
	Raft  string `json:"raft"`
	GRPC  string `json:"grpc"`
	Voter bool   `json:"voter"`
}

type NodeJSON struct {
	ID                uint64   `json:"id"`
	Alive             bool     `json:"alive"`
	Incarnation       uint64   `json:"incarnation"`
	Roles             []string `json:"roles"`
	GRPC              string   `json:"grpc"`
	Beacon            string   `json:"beacon"`
	ObserversDead     uint32   `json:"observers_dead"`
	ObserversAnswered uint32   `json:"observers_answered"`
	ObserversHeard    uint32   `json:"observers_heard"`
}

func toJSON(r *pb.StatusResponse) StatusJSON {
	out := StatusJSON{Leader: r.Leader, Members: []MemberJSON{}, Nodes: []NodeJSON{}}
	for _, m := range r.Members {
		out.Members = append(out.Members, MemberJSON{ID: m.Id, Raft: m.RaftAddr, GRPC: m.GrpcAddr, Voter: m.Voter})
	}
	for _, n := range r.Nodes {
		roles := n.Roles
		if roles == nil {
			roles = []string{}
		}
		out.Nodes = append(out.Nodes, NodeJSON{ID: n.Id, Alive: n.Alive, Incarnation: n.Incarnation, Roles: roles, GRPC: n.GrpcAddr,
			Beacon: n.BeaconAddr, ObserversDead: n.ObserversDead, ObserversAnswered: n.ObserversAnswered, ObserversHeard: n.ObserversHeard})
	}
	return out
}

func statusCmd() *cobra.Command {
	var addr string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show config-service members and leader, and every node's incarnation, liveness and roles",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cc, err := grpc.NewClient(addr, transport.DialOptions()...)
			if err != nil {
				return err
			}
			defer cc.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			r, err := pb.NewClusterServiceClient(cc).Status(ctx, &pb.StatusRequest{})
			if err != nil {
				return fmt.Errorf("status from %s: %w (is `grove up` running? use --addr for another node)", addr, err)
			}
			if asJSON {
				enc := json.NewEncoder(os.Stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(toJSON(r))
			}
			fmt.Printf("config service: leader %d\n", r.Leader)
			w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "MEMBER\tRAFT\tGRPC\tVOTER")
			for _, m := range r.Members {
				fmt.Fprintf(w, "%d\t%s\t%s\t%v\n", m.Id, m.RaftAddr, m.GrpcAddr, m.Voter)
			}
			w.Flush()
			fmt.Println()
			w = tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "NODE\tSTATE\tINCARNATION\tHEARD-BY\tDEAD-VOTES\tGRPC\tBEACON\tROLES")
			for _, n := range r.Nodes {
				state := "alive"
				switch {
				case !n.Alive:
					state = "dead"
				case int(n.ObserversHeard) <= len(r.Members)/2:
					state = "joining" // not declared dead, not acknowledged by a majority either
				}
				fmt.Fprintf(w, "%d\t%s\t%d\t%d/%d\t%d/%d\t%s\t%s\t%s\n", n.Id, state, n.Incarnation, n.ObserversHeard, len(r.Members), n.ObserversDead, n.ObserversAnswered, n.GrpcAddr, n.BeaconAddr, strings.Join(n.Roles, ","))
			}
			return w.Flush()
		},
	}
	cmd.Flags().StringVar(&addr, "addr", DefaultAddr, "gRPC address of any node, or of `grove up`'s gateway")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON: {leader, members[], nodes[{id, alive, incarnation, roles, ...}]}")
	return cmd
}
