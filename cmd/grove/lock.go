package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/lock"
	"github.com/grovestore/grove/internal/transport"
)

func lockCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "lock", Short: "Operate the lock service (Boxwood §3.3)"}
	cmd.AddCommand(lockAcquireCmd(), lockListCmd())
	return cmd
}

func dialLock(addr string) (pb.LockServiceClient, func(), error) {
	cc, err := grpc.NewClient(addr, transport.DialOptions()...)
	if err != nil {
		return nil, nil, err
	}
	return pb.NewLockServiceClient(cc), func() { cc.Close() }, nil
}

func clerkString(c *pb.ClerkId) string {
	return fmt.Sprintf("%d.%d.%d", c.GetNode(), c.GetIncarnation(), c.GetSeq())
}

func modeString(m pb.LockMode) string {
	switch m {
	case pb.LockMode_LOCK_MODE_SHARED:
		return "shared"
	case pb.LockMode_LOCK_MODE_EXCLUSIVE:
		return "exclusive"
	}
	return "none"
}

func lockAcquireCmd() *cobra.Command {
	var addr, modeName string
	var hold time.Duration
	cmd := &cobra.Command{
		Use:   "acquire NAME",
		Short: "Acquire a lock through a node's clerk and hold it (until Ctrl-C, or for --hold)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			mode, err := lock.ParseMode(modeName)
			if err != nil {
				return err
			}
			if err := lock.ValidName(args[0]); err != nil {
				return err
			}
			cl, done, err := dialLock(addr)
			if err != nil {
				return err
			}
			defer done()
			ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
			defer cancel()
			start := time.Now()
			stream, err := cl.Hold(ctx, &pb.HoldRequest{Name: []byte(args[0]), Mode: pb.LockMode(mode), HoldMillis: uint64(hold.Milliseconds())})
			if err != nil {
				return err
			}
			for {
				ev, err := stream.Recv()
				if err == io.EOF {
					return nil
				}
				if err != nil {
					if ctx.Err() != nil {
						fmt.Printf("released %s (interrupted)\n", args[0])
						return nil
					}
					if st, ok := status.FromError(err); ok && st.Code() == codes.Aborted {
						// The node fenced itself (or was declared dead): say so.
						return fmt.Errorf("%s", st.Message())
					}
					return fmt.Errorf("lock %s: %w", args[0], err)
				}
				switch ev.Kind {
				case pb.HoldResponse_KIND_GRANTED:
					fmt.Printf("granted %s mode=%s clerk=%s token=%s waited=%v\n", args[0], mode, clerkString(ev.Clerk), lock.TokenFromPB(ev.Token), time.Since(start).Round(time.Millisecond))
				case pb.HoldResponse_KIND_RELEASED:
					fmt.Printf("released %s\n", args[0])
				}
			}
		},
	}
	cmd.Flags().StringVar(&addr, "addr", DefaultAddr, "gRPC address of the node whose clerk holds the lock (default: `grove up`'s gateway, which picks a node)")
	cmd.Flags().StringVar(&modeName, "mode", "exclusive", "shared or exclusive")
	cmd.Flags().DurationVar(&hold, "hold", 0, "release after this long (0: hold until interrupted)")
	return cmd
}

// LockListJSON is the output of `grove lock list --json`.
type LockListJSON struct {
	Master     uint64         `json:"master"`
	Epoch      uint64         `json:"epoch"`
	Serving    bool           `json:"serving"`
	Locks      []LockJSON     `json:"locks"`
	Clerks     []ClerkJSON    `json:"clerks"`
	Recoveries []RecoveryJSON `json:"recoveries"`
}

type LockJSON struct {
	Name    string            `json:"name"`
	Holders map[string]string `json:"holders"` // clerk → mode
	Tokens  map[string]string `json:"tokens"`  // clerk → fencing token (epoch.seq)
	Waiters []string          `json:"waiters"`
	order   []string          // holders in clerk order, for the table
}

type ClerkJSON struct {
	ID        string `json:"id"`
	Kind      string `json:"kind"`
	Connected bool   `json:"connected"`
	Dead      bool   `json:"dead"`
	Held      uint32 `json:"held"`
}

type RecoveryJSON struct {
	Dead  string   `json:"dead"`
	Kind  string   `json:"kind"`
	Names []string `json:"names"`
	All   bool     `json:"all"`
}

func lockListJSON(r *pb.ListResponse) LockListJSON {
	out := LockListJSON{Master: r.Master.GetNode(), Epoch: r.Master.GetEpoch(), Serving: r.Serving, Locks: []LockJSON{}, Clerks: []ClerkJSON{}, Recoveries: []RecoveryJSON{}}
	for _, l := range r.Locks {
		j := LockJSON{Name: string(l.Name), Holders: map[string]string{}, Tokens: map[string]string{}, Waiters: []string{}}
		for _, h := range l.Holders { // sorted by clerk id by the master
			c := clerkString(h.Clerk)
			j.Holders[c] = modeString(h.Mode)
			j.Tokens[c] = lock.TokenFromPB(h.Token).String()
			j.order = append(j.order, c)
		}
		for _, w := range l.Waiters {
			j.Waiters = append(j.Waiters, clerkString(w))
		}
		out.Locks = append(out.Locks, j)
	}
	for _, c := range r.Clerks {
		out.Clerks = append(out.Clerks, ClerkJSON{ID: clerkString(c.Id), Kind: c.Kind, Connected: c.Connected, Dead: c.Dead, Held: c.Held})
	}
	for _, rc := range r.Recoveries {
		j := RecoveryJSON{Dead: clerkString(rc.Dead), Kind: rc.Kind, All: rc.All, Names: []string{}}
		for _, n := range rc.Names {
			j.Names = append(j.Names, string(n))
		}
		for _, l := range rc.Leases {
			j.Names = append(j.Names, string(l.Name))
		}
		out.Recoveries = append(out.Recoveries, j)
	}
	return out
}

func lockListCmd() *cobra.Command {
	var addr string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list",
		Short: "Show every held lock with its holders and modes, the master, the clerks and pending recoveries",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, done, err := dialLock(addr)
			if err != nil {
				return err
			}
			defer done()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			r, err := cl.List(ctx, &pb.ListRequest{})
			if err != nil {
				return fmt.Errorf("lock list from %s: %w", addr, err)
			}
			j := lockListJSON(r)
			if asJSON {
				enc := json.NewEncoder(os.Stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(j)
			}
			state := "serving"
			if !j.Serving {
				state = "recovering lease state"
			}
			fmt.Printf("master: node %d (epoch %d), %s\n\n", j.Master, j.Epoch, state)
			w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "LOCK\tHOLDERS\tWAITERS")
			for _, l := range j.Locks {
				var hs []string
				for _, c := range l.order {
					hs = append(hs, c+":"+l.Holders[c]+"@"+l.Tokens[c])
				}
				fmt.Fprintf(w, "%q\t%s\t%s\n", l.Name, strings.Join(hs, " "), strings.Join(l.Waiters, " "))
			}
			w.Flush()
			fmt.Println()
			w = tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "CLERK\tKIND\tCONNECTED\tDEAD\tLEASES")
			for _, c := range j.Clerks {
				fmt.Fprintf(w, "%s\t%s\t%v\t%v\t%d\n", c.ID, c.Kind, c.Connected, c.Dead, c.Held)
			}
			w.Flush()
			for _, rc := range j.Recoveries {
				fmt.Printf("\npending recovery of %s (kind %s): all=%v names=%v\n", rc.Dead, rc.Kind, rc.All, rc.Names)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&addr, "addr", DefaultAddr, "gRPC address of any node or of `grove up`'s gateway")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON: {master, epoch, serving, locks[{name, holders{clerk: mode}, waiters}], clerks[], recoveries[]}")
	return cmd
}
