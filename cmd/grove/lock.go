package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
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
		Use:   "lock [flags] [NAME -- COMMAND [ARGS...]]",
		Short: "Run a command while holding a lock, or operate the lock service (Boxwood §3.3)",
		Long: `grove lock NAME -- COMMAND [ARGS...] acquires lock NAME through a node's clerk,
runs COMMAND while holding it, releases it when COMMAND exits, and exits with
COMMAND's status. COMMAND gets GROVE_LOCK_NAME, GROVE_LOCK_MODE and
GROVE_LOCK_TOKEN (the grant's fencing token, epoch.seq: pass it with writes to
storage that checks tokens). COMMAND runs in a process group of its own (in
the terminal's foreground when there is one): if the lease is lost while it runs
(its node fenced itself, or the connection to it broke), the group gets SIGTERM
(SIGKILL 10 s later) and grove exits 7; a signal sent to grove is passed on to
the group, and anything of the group left when COMMAND is stopped is killed.

A lock named like a subcommand (acquire, list) cannot be used this way.`,
		Example: `  grove lock db -- sh -c 'echo "holding db, token $GROVE_LOCK_TOKEN"'   # exclusive by default
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
	cmd.Flags().StringVar(&modeName, "mode", "exclusive", "take the lock in `shared|exclusive` mode")
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
		return nil, 0, cli.Usagef("lock name %q: %s", name, strings.TrimPrefix(err.Error(), "lock: "))
	}
	if hold < 0 {
		return nil, 0, cli.Usagef("--hold %v: want a positive duration (or 0: until interrupted)", hold)
	}
	// Fresh: the node gives back a lease it caches for the lock before it
	// asks, so that this grant's token is newer than any earlier holder's
	// through the same node (one caller's late write, with its token,
	// stays refusable by storage that checks tokens). Not if another
	// caller of that node holds or waits for the lock meanwhile: its
	// lease is in use, and the two share the token.
	return &pb.HoldRequest{Name: []byte(name), Mode: pb.LockMode(mode), HoldMillis: uint64(hold.Milliseconds()), Fresh: true}, mode, nil
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
	grantCtx, cancel, err := c.Begin(ctx)
	defer cancel()
	if err != nil {
		return nil, err
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
// grant: a lost lease (Aborted: the node fenced itself, or was declared
// dead) or a connection to the clerk's node that broke, after which nothing
// vouches for the lease (the node releases the hold when it sees its end
// of the connection end, which may be before this end does).
func lostError(name, endpoint string, err error) error {
	if st, ok := status.FromError(err); ok && st.Code() == codes.Aborted {
		return &cli.Error{Code: cli.ExitLeaseLost, Op: "lock " + name, Msg: st.Message()}
	}
	return &cli.Error{Code: cli.ExitLeaseLost, Op: "lock " + name,
		Msg: fmt.Sprintf("lease on %q can no longer be vouched for: the connection to %s broke (the node, or the gateway, went away)", name, endpoint)}
}

// HoldEvent is one line of `grove lock acquire -o json` (JSON Lines: an
// object per event, as the hold goes on).
type HoldEvent struct {
	Event    string  `json:"event"` // granted, released
	Lock     string  `json:"lock"`
	Mode     string  `json:"mode,omitempty"`
	Clerk    string  `json:"clerk,omitempty"`
	Token    string  `json:"token,omitempty"`
	WaitedMS float64 `json:"waited_ms,omitempty"`
}

func lockAcquireCmd() *cobra.Command {
	var c cli.Client
	var out cli.Output
	var modeName string
	var hold time.Duration
	cmd := &cobra.Command{
		Use:   "acquire NAME",
		Short: "Acquire a lock through a node's clerk and hold it (until Ctrl-C, or for --hold)",
		Long: `Acquire lock NAME through a node's clerk (the first endpoint that takes the
request) and hold it until interrupted or until --hold elapses. Ctrl-C before
the grant withdraws the request. Exits 0 after --hold, 130 when interrupted,
7 if the lease is lost (the node fenced itself, or the connection to it
broke: the node releases the hold when it sees the break, maybe earlier).`,
		Example: `  grove lock acquire orders                       # hold until Ctrl-C
  grove lock acquire orders --mode shared --hold 10s
  grove lock acquire orders --endpoints 127.0.0.1:7430 --command-timeout 5s`,
		Args: exactArgs("NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := out.Resolve(); err != nil {
				return err
			}
			req, mode, err := holdRequest(args[0], modeName, hold)
			if err != nil {
				return err
			}
			h, err := acquireHold(cmd.Context(), &c, req)
			if err != nil {
				return err
			}
			defer h.release()
			event := func(e HoldEvent, text string) {
				if out.JSON() {
					b, _ := json.Marshal(e)
					fmt.Println(string(b))
				} else {
					fmt.Println(text)
				}
			}
			clerk, token := clerkString(h.grant.Clerk), lock.TokenFromPB(h.grant.Token).String()
			event(HoldEvent{Event: "granted", Lock: args[0], Mode: mode.String(), Clerk: clerk, Token: token, WaitedMS: float64(h.waited.Microseconds()) / 1000},
				fmt.Sprintf("granted %s mode=%s clerk=%s token=%s waited=%v", args[0], mode, clerk, token, h.waited.Round(time.Millisecond)))
			for {
				ev, err := h.stream.Recv()
				switch {
				case cmd.Context().Err() != nil:
					event(HoldEvent{Event: "released", Lock: args[0]}, fmt.Sprintf("released %s (interrupted)", args[0]))
					return cli.Interrupted{Signal: "interrupt"}
				case err == io.EOF:
					return nil
				case err != nil:
					return lostError(args[0], h.endpoint, err)
				case ev.Kind == pb.HoldResponse_KIND_RELEASED:
					event(HoldEvent{Event: "released", Lock: args[0]}, fmt.Sprintf("released %s", args[0]))
				}
			}
		},
	}
	c.TimeoutHelp = lockTimeoutHelp
	c.Register(cmd, 0)
	cmd.Flags().StringVar(&modeName, "mode", "exclusive", "take the lock in `shared|exclusive` mode")
	cmd.Flags().DurationVar(&hold, "hold", 0, "release after `DURATION` (0: hold until interrupted)")
	out.Register(cmd)
	return cmd
}

// runUnderLock is `grove lock NAME -- COMMAND...`.
//
// COMMAND runs in a process group of its own, so that everything it starts
// is stopped with it: a lost lease must not leave a grandchild working
// without the lock. At a terminal that group is put in the foreground, as
// a shell does (COMMAND reads the terminal, and Ctrl-C reaches it and not
// grove); grove takes the terminal back when COMMAND exits. A signal sent
// to grove itself is passed on to COMMAND's group.
func runUnderLock(ctx context.Context, c *cli.Client, name, modeName string, argv []string) error {
	op := "lock " + name
	req, mode, err := holdRequest(name, modeName, 0)
	if err != nil {
		return err
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return &cli.Error{Code: 127, Op: op, Msg: fmt.Sprintf("command %q not found", argv[0])}
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
	child.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if isTerminal(os.Stdin) {
		// Put COMMAND's group in the foreground; grove, in the background
		// meanwhile, must not be stopped for taking the terminal back.
		signal.Ignore(syscall.SIGTTOU, syscall.SIGTTIN)
		child.SysProcAttr.Foreground, child.SysProcAttr.Ctty = true, int(os.Stdin.Fd())
		defer unix.IoctlSetPointerInt(int(os.Stdin.Fd()), unix.TIOCSPGRP, syscall.Getpgrp())
	}
	if err := child.Start(); err != nil {
		return cli.Failf(op, "starting %s: %v", argv[0], err)
	}
	group := child.Process.Pid
	sigs.onForcedExit(func() { syscall.Kill(-group, syscall.SIGKILL) })
	defer sigs.onForcedExit(nil)
	exited := make(chan error, 1)
	go func() { exited <- child.Wait() }()
	// After the grant the hold's stream carries nothing until it ends: any
	// end, or event, while COMMAND runs means the lease is gone (Aborted:
	// the node fenced itself) or can no longer be vouched for.
	lost := make(chan error, 1)
	go func() {
		ev, err := h.stream.Recv()
		if err == nil {
			err = fmt.Errorf("the node ended the hold (%v)", ev.Kind)
		}
		lost <- err
	}()
	select {
	case err := <-exited:
		h.release()
		return childStatus(err)
	case err := <-lost:
		if ctx.Err() == nil {
			stopGroup(group, exited, syscall.SIGTERM)
			lerr := lostError(name, h.endpoint, err).(*cli.Error)
			lerr.Msg += fmt.Sprintf("; %s was stopped", argv[0])
			return lerr
		}
		// The stream ended because grove was interrupted: as below.
	case <-ctx.Done():
	}
	sig := syscall.SIGTERM
	if s, ok := sigs.first().(syscall.Signal); ok {
		sig = s
	}
	return childStatus(stopGroup(group, exited, sig))
}

// isTerminal reports whether f is a terminal.
func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// stopGroup signals COMMAND's process group and waits for COMMAND,
// killing the group if COMMAND is still running 10 s later; whatever of
// the group outlives COMMAND is killed too (it would go on without the
// lock). It returns COMMAND's Wait error.
func stopGroup(group int, exited chan error, sig syscall.Signal) error {
	syscall.Kill(-group, sig)
	var err error
	select {
	case err = <-exited:
	case <-time.After(10 * time.Second):
		syscall.Kill(-group, syscall.SIGKILL)
		err = <-exited
	}
	syscall.Kill(-group, syscall.SIGKILL)
	return err
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
	rt := d.Table("recoveries", "DEAD", "KIND", "ALL", "STARTED", "NAMES")
	for _, rc := range recs {
		names := []string{}
		for _, n := range rc.Names {
			names = append(names, string(n))
		}
		for _, l := range rc.Leases {
			names = append(names, string(l.Name))
		}
		sort.Strings(names)
		rt.Row(clerkString(rc.Dead), rc.Kind, rc.All, rc.Started, cli.C(fmt.Sprintf("%q", names), names))
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
