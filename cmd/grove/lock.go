package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/cli"
	"github.com/grovestore/grove/internal/lock"
)

const lockTimeoutHelp = "give up if the lock is not granted within `DURATION` (default: wait until granted or interrupted)"

func lockCmd() *cobra.Command {
	var c cli.Client
	var modeName string
	cmd := &cobra.Command{
		Use:   "lock [NAME -- COMMAND [ARGS...]]",
		Short: "Run a command while holding a lock, or operate the lock service (Boxwood §3.3)",
		Long: `grove lock NAME -- COMMAND [ARGS...] acquires lock NAME through a node's clerk,
runs COMMAND while holding it, releases it when COMMAND exits, and exits with
COMMAND's status. COMMAND gets GROVE_LOCK_NAME, GROVE_LOCK_MODE and
GROVE_LOCK_TOKEN (the grant's fencing token, epoch.seq: pass it with writes to
storage that checks tokens). If the lease is lost while COMMAND runs (its node
fenced itself), COMMAND gets SIGTERM (SIGKILL 10 s later) and grove exits 7.

A lock named like a subcommand (acquire, list) cannot be used this way.`,
		Example: `  grove lock db -- ./migrate.sh --to v7       # exclusive by default
  grove lock reports --mode shared -- make report
  grove lock acquire db --hold 30s
  grove lock list`,
		Args: func(cmd *cobra.Command, args []string) error {
			dash := cmd.ArgsLenAtDash()
			switch {
			case len(args) == 0:
				return nil
			case dash < 0:
				err := groupArgs(cmd, args).(*cli.Error)
				err.Msg += fmt.Sprintf("; to run a command under lock %q: grove lock %s -- COMMAND", args[0], args[0])
				return err
			case dash != 1:
				return cli.Usagef("want grove lock NAME -- COMMAND [ARGS...]")
			case len(args) == 1:
				return cli.Usagef("missing COMMAND after --")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return cmd.Help()
			}
			return runUnderLock(cmd.Context(), &c, args[0], modeName, args[1:])
		},
	}
	c.TimeoutHelp = lockTimeoutHelp
	c.Register(cmd, 0)
	cmd.Flags().StringVar(&modeName, "mode", "exclusive", "lock mode: `shared|exclusive`")
	cmd.AddCommand(lockAcquireCmd(), lockListCmd())
	return cmd
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

// holdRequest checks a lock request's arguments.
func holdRequest(name, modeName string, hold time.Duration) (*pb.HoldRequest, lock.Mode, error) {
	mode, err := lock.ParseMode(modeName)
	if err != nil {
		return nil, 0, cli.Usagef("--mode %q: want shared or exclusive", modeName)
	}
	if err := lock.ValidName(name); err != nil {
		return nil, 0, cli.Usagef("lock name: %v", err)
	}
	if hold < 0 {
		return nil, 0, cli.Usagef("--hold %v: want a positive duration (or 0: until interrupted)", hold)
	}
	return &pb.HoldRequest{Name: []byte(name), Mode: pb.LockMode(mode), HoldMillis: uint64(hold.Milliseconds())}, mode, nil
}

// holding is a granted hold: the stream that keeps it, its grant, and how
// to give it up (cancelling the stream releases the lease's hold on the
// node, and a request not yet granted is withdrawn from the master).
type holding struct {
	stream   grpc.ServerStreamingClient[pb.HoldResponse]
	grant    *pb.HoldResponse
	endpoint string
	waited   time.Duration
	release  func()
}

// acquireHold asks the endpoints in order to hold lock req.Name and
// returns once it is granted. An endpoint that cannot take the request (not
// reachable, or Unavailable: its node is fenced or starting) is passed
// over. --command-timeout bounds the wait for the grant.
func acquireHold(ctx context.Context, c *cli.Client, req *pb.HoldRequest) (*holding, error) {
	op := fmt.Sprintf("lock %s", req.Name)
	if err := c.Resolve(); err != nil {
		return nil, err
	}
	grantCtx := ctx
	if c.CommandTimeout > 0 {
		var cancel context.CancelFunc
		grantCtx, cancel = context.WithTimeout(ctx, c.CommandTimeout)
		defer cancel()
	}
	start := time.Now()
	var fails []string
	var lastCode = cli.ExitUnavailable
	for _, ep := range c.Endpoints {
		conn, err := c.Connect(grantCtx, ep)
		if err != nil {
			fails = append(fails, err.Error())
			lastCode = cli.Code(err)
			if ctx.Err() != nil || grantCtx.Err() != nil {
				break
			}
			continue
		}
		// The stream lives on after the grant, beyond grantCtx: it is
		// cancelled by release, or when ctx ends (a signal).
		sctx, scancel := context.WithCancel(ctx)
		stop := context.AfterFunc(grantCtx, func() {
			if grantCtx.Err() == context.DeadlineExceeded {
				scancel()
			}
		})
		stream, err := pb.NewLockServiceClient(conn).Hold(sctx, req)
		var first *pb.HoldResponse
		if err == nil {
			first, err = stream.Recv()
		}
		stop()
		if err == nil && first.Kind == pb.HoldResponse_KIND_GRANTED {
			return &holding{stream: stream, grant: first, endpoint: ep, waited: time.Since(start),
				release: func() { scancel(); conn.Close() }}, nil
		}
		scancel()
		conn.Close()
		switch {
		case ctx.Err() != nil:
			return nil, &cli.Error{Code: cli.ExitInterrupted, Op: op, Msg: "interrupted before it was granted; the request was withdrawn"}
		case grantCtx.Err() != nil:
			return nil, &cli.Error{Code: cli.ExitTimeout, Op: op, Endpoint: ep,
				Msg: fmt.Sprintf("was not granted within %v (--command-timeout); the request was withdrawn", c.CommandTimeout)}
		case err == nil:
			return nil, cli.Failf(op, "%s answered %v before a grant", ep, first.Kind)
		case status.Code(err) == codes.Unavailable:
			fails = append(fails, fmt.Sprintf("%s cannot serve: %s", ep, status.Convert(err).Message()))
			lastCode = cli.ExitUnavailable
			continue
		}
		return nil, cli.FromRPC(op, ep, c.CommandTimeout, err)
	}
	if ctx.Err() != nil {
		return nil, &cli.Error{Code: cli.ExitInterrupted, Op: op, Msg: "interrupted before it was granted"}
	}
	if len(fails) == 1 {
		return nil, &cli.Error{Code: lastCode, Op: op, Msg: fails[0]}
	}
	return nil, &cli.Error{Code: cli.ExitUnavailable, Op: op, Msg: "no endpoint could take the request: " + strings.Join(fails, "; "),
		Hint: "is the cluster running? (grove up)"}
}

// lostError is the error of a hold whose stream ended with err after the
// grant: a lost lease (Aborted, the node fenced itself) or a broken stream.
func lostError(name string, err error) error {
	if st, ok := status.FromError(err); ok && st.Code() == codes.Aborted {
		return &cli.Error{Code: cli.ExitLeaseLost, Op: "lock " + name, Msg: st.Message()}
	}
	// The stream to the clerk's node broke: the node may have died, and
	// with it the lease (the lock service frees it once the node is
	// declared dead). Nothing guarantees the lease any more.
	return &cli.Error{Code: cli.ExitLeaseLost, Op: "lock " + name,
		Msg: fmt.Sprintf("lease on %q can no longer be vouched for: the connection to the clerk's node broke (%s)", name, status.Convert(err).Message())}
}

func lockAcquireCmd() *cobra.Command {
	var c cli.Client
	var modeName string
	var hold time.Duration
	cmd := &cobra.Command{
		Use:   "acquire NAME",
		Short: "Acquire a lock through a node's clerk and hold it (until Ctrl-C, or for --hold)",
		Long: `Acquire lock NAME through a node's clerk (the first endpoint that takes the
request) and hold it until interrupted or until --hold elapses. Ctrl-C before
the grant withdraws the request. Exits 0 after --hold, 130 when interrupted,
7 if the lease is lost (the node fenced itself).`,
		Example: `  grove lock acquire orders                       # hold until Ctrl-C
  grove lock acquire orders --mode shared --hold 10s
  grove lock acquire orders --endpoints 127.0.0.1:7430 --command-timeout 5s`,
		Args: exactArgs("NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			req, mode, err := holdRequest(args[0], modeName, hold)
			if err != nil {
				return err
			}
			h, err := acquireHold(cmd.Context(), &c, req)
			if err != nil {
				return err
			}
			defer h.release()
			fmt.Printf("granted %s mode=%s clerk=%s token=%s waited=%v\n", args[0], mode, clerkString(h.grant.Clerk),
				lock.TokenFromPB(h.grant.Token), h.waited.Round(time.Millisecond))
			for {
				ev, err := h.stream.Recv()
				switch {
				case cmd.Context().Err() != nil:
					fmt.Printf("released %s (interrupted)\n", args[0])
					return cli.Interrupted{Signal: "interrupt"}
				case err == io.EOF:
					return nil
				case err != nil:
					return lostError(args[0], err)
				case ev.Kind == pb.HoldResponse_KIND_RELEASED:
					fmt.Printf("released %s\n", args[0])
				}
			}
		},
	}
	c.TimeoutHelp = lockTimeoutHelp
	c.Register(cmd, 0)
	cmd.Flags().StringVar(&modeName, "mode", "exclusive", "lock mode: `shared|exclusive`")
	cmd.Flags().DurationVar(&hold, "hold", 0, "release after `DURATION` (0: hold until interrupted)")
	return cmd
}

// runUnderLock is `grove lock NAME -- COMMAND...`.
func runUnderLock(ctx context.Context, c *cli.Client, name, modeName string, argv []string) error {
	req, mode, err := holdRequest(name, modeName, 0)
	if err != nil {
		return err
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return &cli.Error{Code: 127, Op: "lock " + name, Msg: fmt.Sprintf("command %q not found", argv[0])}
	}
	h, err := acquireHold(ctx, c, req)
	if err != nil {
		return err
	}
	defer h.release()
	child := exec.Command(path, argv[1:]...)
	child.Stdin, child.Stdout, child.Stderr = os.Stdin, os.Stdout, os.Stderr
	child.Env = append(os.Environ(), "GROVE_LOCK_NAME="+name, "GROVE_LOCK_MODE="+mode.String(),
		"GROVE_LOCK_TOKEN="+lock.TokenFromPB(h.grant.Token).String())
	if err := child.Start(); err != nil {
		return cli.Failf("lock "+name, "starting %s: %v", argv[0], err)
	}
	exited := make(chan error, 1)
	go func() { exited <- child.Wait() }()
	lost := make(chan error, 1)
	go func() {
		for {
			ev, err := h.stream.Recv()
			if err != nil || ev == nil {
				lost <- err
				return
			}
		}
	}()
	select {
	case err := <-exited:
		h.release()
		return childStatus(err)
	case err := <-lost:
		if ctx.Err() == nil && err != nil && err != io.EOF {
			lerr := lostError(name, err)
			fmt.Fprintf(os.Stderr, "grove: %v; stopping %s\n", lerr, argv[0])
			stopChild(child, exited, syscall.SIGTERM)
			return lerr
		}
		// The stream ended because we were interrupted: as below.
		<-ctx.Done()
	case <-ctx.Done():
	}
	// Interrupted. A Ctrl-C at the terminal reached the command too (same
	// process group); a signal sent to grove alone is passed on to it.
	select {
	case err := <-exited:
		return childStatus(err)
	case <-time.After(200 * time.Millisecond):
	}
	return childStatus(stopChild(child, exited, syscall.SIGTERM))
}

// stopChild signals the command and waits for it, killing it if it is
// still running 10 s later; it returns the command's Wait error.
func stopChild(child *exec.Cmd, exited chan error, sig syscall.Signal) error {
	child.Process.Signal(sig)
	select {
	case err := <-exited:
		return err
	case <-time.After(10 * time.Second):
		child.Process.Kill()
		return <-exited
	}
}

// childStatus turns a command's Wait error into grove's exit status: the
// command's own code, or 128+signal if a signal ended it.
func childStatus(err error) error {
	if err == nil {
		return nil
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return cli.ExitStatus(128 + int(ws.Signal()))
		}
		return cli.ExitStatus(ee.ExitCode())
	}
	return cli.Failf("lock", "%v", err)
}

func lockListCmd() *cobra.Command {
	var c cli.Client
	var out cli.Output
	cmd := &cobra.Command{
		Use:   "list",
		Short: "Show every held lock with its holders and modes, the master, the clerks and pending recoveries",
		Example: `  grove lock list
  grove lock list -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.Resolve(); err != nil {
				return err
			}
			var r *pb.ListResponse
			err := c.Do(cmd.Context(), "lock list", func(ctx context.Context, conn *cli.Conn) error {
				var err error
				r, err = pb.NewLockServiceClient(conn).List(ctx, &pb.ListRequest{})
				return err
			})
			if err != nil {
				return err
			}
			return out.Print(os.Stdout, lockListDoc(r))
		},
	}
	c.Register(cmd, cli.DefaultCommandTimeout)
	out.Register(cmd)
	return cmd
}

// HolderJSON is one holder of a lock in `grove lock list -o json`.
type HolderJSON struct {
	Clerk string `json:"clerk"`
	Mode  string `json:"mode"`
	Token string `json:"token"`
}

func lockListDoc(r *pb.ListResponse) *cli.Doc {
	d := &cli.Doc{}
	d.Field("master", r.Master.GetNode())
	d.Field("epoch", r.Master.GetEpoch())
	d.Field("serving", r.Serving)
	locks := append([]*pb.LockEntry{}, r.Locks...)
	sort.Slice(locks, func(i, j int) bool { return string(locks[i].Name) < string(locks[j].Name) })
	lt := d.Table("locks", "LOCK", "HOLDERS", "WAITERS")
	for _, l := range locks {
		hs := []HolderJSON{}
		var texts []string
		for _, h := range l.Holders { // sorted by clerk id by the master
			j := HolderJSON{Clerk: clerkString(h.Clerk), Mode: modeString(h.Mode), Token: lock.TokenFromPB(h.Token).String()}
			hs = append(hs, j)
			texts = append(texts, j.Clerk+":"+j.Mode+"@"+j.Token)
		}
		ws := []string{}
		for _, w := range l.Waiters { // in queue order
			ws = append(ws, clerkString(w))
		}
		lt.Row(cli.C(fmt.Sprintf("%q", l.Name), string(l.Name)), cli.C(strings.Join(texts, " "), hs), cli.C(strings.Join(ws, " "), ws))
	}
	clerks := append([]*pb.ClerkEntry{}, r.Clerks...)
	sort.Slice(clerks, func(i, j int) bool { return lessClerk(clerks[i].Id, clerks[j].Id) })
	ct := d.Table("clerks", "CLERK", "KIND", "CONNECTED", "DEAD", "LEASES")
	for _, c := range clerks {
		ct.Row(clerkString(c.Id), c.Kind, c.Connected, c.Dead, c.Held)
	}
	recs := append([]*pb.LockRecoveryRecord{}, r.Recoveries...)
	sort.Slice(recs, func(i, j int) bool { return lessClerk(recs[i].Dead, recs[j].Dead) })
	rt := d.Table("recoveries", "DEAD", "KIND", "ALL", "NAMES")
	for _, rc := range recs {
		names := []string{}
		for _, n := range rc.Names {
			names = append(names, string(n))
		}
		for _, l := range rc.Leases {
			names = append(names, string(l.Name))
		}
		sort.Strings(names)
		rt.Row(clerkString(rc.Dead), rc.Kind, rc.All, cli.C(fmt.Sprintf("%q", names), names))
	}
	return d
}

func lessClerk(a, b *pb.ClerkId) bool {
	if a.GetNode() != b.GetNode() {
		return a.GetNode() < b.GetNode()
	}
	if a.GetIncarnation() != b.GetIncarnation() {
		return a.GetIncarnation() < b.GetIncarnation()
	}
	return a.GetSeq() < b.GetSeq()
}
