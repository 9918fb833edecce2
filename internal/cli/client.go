package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/transport"
)

// DefaultEndpoint is the gateway `grove up` serves with its default
// --base-port: what every client command talks to when told nothing else.
const DefaultEndpoint = "127.0.0.1:7400"

// EndpointsEnv names the environment variable read when neither
// --endpoints nor --addr is given (comma-separated HOST:PORT list).
const EndpointsEnv = "GROVE_ENDPOINTS"

// Default timeouts (etcdctl's model: a short bound on reaching an endpoint,
// a longer one on the whole command).
const (
	DefaultDialTimeout    = 2 * time.Second
	DefaultCommandTimeout = 10 * time.Second
)

// Client is the connection settings of a command that talks to the
// cluster: the endpoints to try, in order, and the two timeouts. Register
// adds its flags to a command; Do runs a call.
type Client struct {
	Endpoints      []string
	DialTimeout    time.Duration
	CommandTimeout time.Duration // 0: none (long-running commands such as lock acquire)
	// TimeoutHelp replaces --command-timeout's help text, for a command
	// where it bounds something more specific (the wait for a lock grant).
	TimeoutHelp string

	endpoints []string
	addr      string
}

// Register adds --endpoints, --addr (an alias kept for scripts that use
// it), --dial-timeout and --command-timeout to cmd. commandTimeout is the
// default of --command-timeout (0 for commands that wait for as long as
// they are asked to, such as a lock acquisition).
func (c *Client) Register(cmd *cobra.Command, commandTimeout time.Duration) {
	f := cmd.Flags()
	f.StringSliceVar(&c.endpoints, "endpoints", nil, "try these nodes or grove up gateways in order, `HOST:PORT,...` (default $"+EndpointsEnv+", else "+DefaultEndpoint+")")
	f.StringVar(&c.addr, "addr", "", "talk to the node or gateway at `HOST:PORT` (--endpoints with one address)")
	f.DurationVar(&c.DialTimeout, "dial-timeout", DefaultDialTimeout, "give one endpoint `DURATION` to accept and answer")
	help := "give the whole command `DURATION` (0: no bound)"
	if commandTimeout == 0 {
		help = "give up if not done within `DURATION` (default: wait until done or interrupted)"
	}
	if c.TimeoutHelp != "" {
		help = c.TimeoutHelp
	}
	f.DurationVar(&c.CommandTimeout, "command-timeout", commandTimeout, help)
}

// Resolve fills Endpoints from the flags, then $GROVE_ENDPOINTS, then the
// default, and checks them. Do calls it; commands that need the list
// before calling anything call it themselves.
func (c *Client) Resolve() error {
	if c.DialTimeout <= 0 {
		return Usagef("--dial-timeout %v: want a positive duration", c.DialTimeout)
	}
	if c.CommandTimeout < 0 {
		return Usagef("--command-timeout %v: want a positive duration (or 0 for none)", c.CommandTimeout)
	}
	var list []string
	source := "--endpoints"
	switch {
	case len(c.endpoints) > 0 && c.addr != "":
		return Usagef("give --endpoints or --addr, not both")
	case len(c.endpoints) > 0:
		list = c.endpoints
	case c.addr != "":
		list, source = []string{c.addr}, "--addr"
	case os.Getenv(EndpointsEnv) != "":
		list, source = strings.Split(os.Getenv(EndpointsEnv), ","), "$"+EndpointsEnv
	case len(c.Endpoints) > 0:
		list = c.Endpoints // set by the program (tests, grove up's own calls)
	default:
		list = []string{DefaultEndpoint}
	}
	var out []string
	for _, e := range list {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		if err := CheckHostPort(e); err != nil {
			return Usagef("%s: endpoint %q: %v", source, e, err)
		}
		out = append(out, e)
	}
	if len(out) == 0 {
		return Usagef("no endpoint given (--endpoints HOST:PORT,...)")
	}
	c.Endpoints = out
	return nil
}

// CheckHostPort checks a HOST:PORT address (port 1..65535).
func CheckHostPort(a string) error {
	h, p, err := net.SplitHostPort(a)
	if err != nil {
		return errors.New("want HOST:PORT")
	}
	if h == "" {
		return errors.New("want HOST:PORT (the host is missing)")
	}
	n, err := strconv.Atoi(p)
	if err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("port %q is not a number in 1..65535", p)
	}
	return nil
}

// Conn is a connection to one endpoint that answered.
type Conn struct {
	*grpc.ClientConn
	Endpoint string
}

// Do runs call against the endpoints in order: it connects to one (within
// --dial-timeout), runs call on it, and moves on to the next endpoint if
// the endpoint cannot be reached or answers Unavailable (a node cut off
// from the config service may still accept connections). It stops at the
// first other answer. The whole command is bounded by --command-timeout.
// The error names op and the endpoints that failed, with an exit code.
func (c *Client) Do(ctx context.Context, op string, call func(ctx context.Context, conn *Conn) error) error {
	return c.do(ctx, op, nil, call)
}

// DoWrite is Do for a call that changes something and must not change it
// twice. It moves on to the next endpoint only if this one could not be
// reached (nothing was sent), or if notApplied says its error proves the
// call changed nothing (a B-tree server's NOT_APPLIED). Any other
// Unavailable answer (the connection lost mid-call, the node stopping
// under it) leaves the outcome unknown: the command fails at once with
// ExitUnknown and sends the call nowhere else, since a resend could apply
// it twice, or undo another client's write that came after it. A write
// that times out says so too (ExitTimeout).
func (c *Client) DoWrite(ctx context.Context, op string, notApplied func(error) bool, call func(ctx context.Context, conn *Conn) error) error {
	if notApplied == nil {
		notApplied = func(error) bool { return false }
	}
	return c.do(ctx, op, notApplied, call)
}

// Begin starts a command: it resolves the endpoints and bounds ctx by
// the command timeout, if any. The caller calls cancel when done.
func (c *Client) Begin(ctx context.Context) (_ context.Context, cancel context.CancelFunc, err error) {
	if err := c.Resolve(); err != nil {
		return ctx, func() {}, err
	}
	if c.CommandTimeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, c.CommandTimeout)
		return ctx, cancel, nil
	}
	return ctx, func() {}, nil
}

// do is Do, or DoWrite if notApplied is not nil.
func (c *Client) do(ctx context.Context, op string, notApplied func(error) bool, call func(ctx context.Context, conn *Conn) error) error {
	ctx, cancel, err := c.Begin(ctx)
	defer cancel()
	if err != nil {
		return err
	}
	var fails []*Error
	endpoints := slices.Clone(c.Endpoints)
	for i := 0; i < len(endpoints); i++ {
		ep := endpoints[i]
		if ctx.Err() != nil {
			break
		}
		conn, err := c.Connect(ctx, ep)
		if err != nil {
			fails = append(fails, err.(*Error))
			continue
		}
		err = call(ctx, conn)
		if UnknownService(err) && !isCLIError(err) {
			// A grove up gateway serves the cluster's status and locks,
			// not every node's services (trees): the call goes on to the
			// nodes it lists that the list lacks, next, and to the rest
			// of the list. Unimplemented changed nothing, so a write may
			// go on too. (Only missing addresses are added: the list
			// ends, whatever each endpoint lists.)
			if missing, ok := GatewayNodes(ctx, conn, endpoints); ok {
				conn.Close()
				endpoints = slices.Insert(endpoints, i+1, missing...)
				continue
			}
		}
		conn.Close()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil && errors.Is(ctx.Err(), context.Canceled) {
			return Interrupted{Signal: "interrupt"}
		}
		if status.Code(err) == codes.Unavailable && !isCLIError(err) {
			if notApplied != nil && !notApplied(err) {
				return &Error{Code: ExitUnknown, Op: op,
					Msg:  fmt.Sprintf("the call to %s lost its answer (%s): the write may or may not have been applied, and was not sent again", ep, status.Convert(err).Message()),
					Hint: "read it back before trying again"}
			}
			fails = append(fails, FromRPC("", ep, c.CommandTimeout, err).(*Error))
			continue
		}
		ferr := FromRPC(op, ep, c.CommandTimeout, err)
		var te *Error
		if notApplied != nil && !isCLIError(err) && errors.As(ferr, &te) && te.Code == ExitTimeout {
			e := *te
			e.Msg += " (the write may or may not have been applied)"
			ferr = &e
		}
		var fe *Error
		if len(fails) > 0 && errors.As(ferr, &fe) {
			e := *fe
			var before []string
			for _, f := range fails {
				f2 := *f
				f2.Op, f2.Hint = "", ""
				before = append(before, f2.Error())
			}
			e.Msg += " (endpoints tried before it: " + strings.Join(before, "; ") + ")"
			return &e
		}
		return ferr
	}
	if errors.Is(ctx.Err(), context.Canceled) {
		return Interrupted{Signal: "interrupt"}
	}
	return combine(op, fails, ctx.Err() != nil, c.CommandTimeout)
}

// UnknownService reports whether err says the endpoint serves no such
// service at all (gRPC's "unknown service": a grove up gateway serves
// no trees), not merely no such method (a node of an older build).
func UnknownService(err error) bool {
	st, ok := status.FromError(err)
	return ok && st.Code() == codes.Unimplemented && strings.HasPrefix(st.Message(), "unknown service")
}

// GatewayNodes asks the endpoint of conn, which did not serve a call
// (Unimplemented: a grove up gateway, say), for the nodes it lists in its
// cluster status: ok if it lists any, and missing, those of their gRPC
// addresses have lacks (alive nodes first), where the call goes on.
func GatewayNodes(ctx context.Context, conn *Conn, have []string) (missing []string, ok bool) {
	ctx, cancel := context.WithTimeout(ctx, DefaultDialTimeout)
	defer cancel()
	r, err := pb.NewClusterServiceClient(conn).Status(ctx, &pb.StatusRequest{})
	if err != nil {
		return nil, false
	}
	ns := slices.Clone(r.Nodes)
	slices.SortStableFunc(ns, func(a, b *pb.NodeStatus) int {
		switch {
		case a.Alive == b.Alive:
			return cmp.Compare(a.Id, b.Id)
		case a.Alive:
			return -1
		}
		return 1
	})
	for _, n := range ns {
		a := n.GetGrpcAddr()
		if a == "" {
			continue
		}
		ok = true
		if !slices.Contains(have, a) && !slices.Contains(missing, a) {
			missing = append(missing, a)
		}
	}
	return missing, ok
}

func isCLIError(err error) bool {
	var ce *Error
	return errors.As(err, &ce)
}

// combine reports every endpoint's failure in one error.
func combine(op string, fails []*Error, timedOut bool, timeout time.Duration) error {
	if len(fails) == 0 {
		return &Error{Code: ExitTimeout, Op: op, Msg: fmt.Sprintf("did not finish within %v", timeout), Hint: "raise --command-timeout"}
	}
	if len(fails) == 1 && !timedOut {
		f := *fails[0]
		f.Op = op
		return &f
	}
	code := ExitTimeout
	var parts []string
	hint := ""
	for _, f := range fails {
		if f.Code != ExitTimeout {
			code = ExitUnavailable
		}
		f2 := *f
		f2.Op, f2.Hint = "", ""
		parts = append(parts, f2.Error())
		if hint == "" {
			hint = f.Hint
		}
	}
	msg := "no endpoint could serve: " + strings.Join(parts, "; ")
	if timedOut {
		code = ExitTimeout
		msg += fmt.Sprintf("; gave up after %v (--command-timeout)", timeout)
	}
	return &Error{Code: code, Op: op, Msg: msg, Hint: hint}
}

// Connect opens a connection to one endpoint and waits, at most
// --dial-timeout, until it is ready to carry calls: a closed port fails at
// once, and a listener that accepts but never speaks gRPC (not a grove
// node, or a stopped process) fails when the timeout elapses rather than
// hanging the command. The error is an *Error naming the endpoint.
func (c *Client) Connect(ctx context.Context, ep string) (*Conn, error) {
	var mu sync.Mutex
	var dialErr error
	connected := false // TCP connected at least once
	opts := append(transport.DialOptions(), grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		conn, err := transport.DialContext(ctx, addr)
		mu.Lock()
		dialErr = err
		connected = connected || err == nil
		mu.Unlock()
		return conn, err
	}))
	// passthrough: the dialer above resolves the name, so that a name that
	// does not resolve is reported as such (gRPC's own resolver would only
	// leave the connection waiting).
	cc, err := grpc.NewClient("passthrough:///"+ep, opts...)
	if err != nil {
		return nil, &Error{Code: ExitUsage, Endpoint: ep, Msg: "is not a usable address: " + err.Error(), Err: err}
	}
	wait := c.DialTimeout
	if d, ok := ctx.Deadline(); ok && time.Until(d) < wait {
		wait = time.Until(d) // the command's own bound comes first
	}
	dctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	start := time.Now()
	cc.Connect()
	for {
		s := cc.GetState()
		if s == connectivity.Ready {
			return &Conn{ClientConn: cc, Endpoint: ep}, nil
		}
		mu.Lock()
		derr := dialErr
		mu.Unlock()
		if s == connectivity.TransientFailure && derr != nil && refusedOrUnreachable(derr) {
			cc.Close()
			return nil, dialFailure(ep, derr, false, c.DialTimeout)
		}
		if !cc.WaitForStateChange(dctx, s) {
			cc.Close()
			if errors.Is(ctx.Err(), context.Canceled) {
				return nil, &Error{Code: ExitInterrupted, Endpoint: ep, Msg: "interrupted", Err: ctx.Err()}
			}
			mu.Lock()
			derr, conn := dialErr, connected
			mu.Unlock()
			if ctx.Err() != nil { // the command's bound, not the dial's
				return nil, &Error{Code: ExitTimeout, Endpoint: ep, Err: ctx.Err(),
					Msg: fmt.Sprintf("was still connecting after %v when --command-timeout elapsed", time.Since(start).Round(time.Millisecond))}
			}
			return nil, dialFailure(ep, derr, conn, c.DialTimeout)
		}
	}
}

func refusedOrUnreachable(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH) ||
		isDNS(err)
}

func isDNS(err error) bool {
	var de *net.DNSError
	return errors.As(err, &de)
}

// dialFailure says, in words, why an endpoint could not be reached:
// err is the last connection attempt's error (nil if none failed), and
// connected whether a TCP connection was made at all.
func dialFailure(ep string, err error, connected bool, timeout time.Duration) *Error {
	e := &Error{Code: ExitUnavailable, Endpoint: ep, Err: err}
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		e.Msg = "refused the connection"
		e.Hint = "is the cluster running? (grove up)"
	case isDNS(err):
		e.Msg = "cannot be resolved (" + dnsReason(err) + ")"
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		e.Msg = "is unreachable (no route)"
	case connected && (err == nil || isTimeout(err) || errors.Is(err, context.DeadlineExceeded)):
		// TCP connected, but no gRPC answer (HTTP/2 settings) came back.
		e.Code = ExitTimeout
		e.Msg = fmt.Sprintf("accepted the connection but did not answer within %v", timeout)
		e.Hint = "is it a grove node's gRPC port, and is the node running (not stopped)? (--dial-timeout to wait longer)"
	case err == nil || errors.Is(err, context.DeadlineExceeded) || isTimeout(err):
		e.Code = ExitTimeout
		e.Msg = fmt.Sprintf("did not accept a connection within %v", timeout)
		e.Hint = "is the address right and the host up? (--dial-timeout to wait longer)"
	default:
		e.Msg = "cannot be reached: " + err.Error()
	}
	return e
}

func dnsReason(err error) string {
	var de *net.DNSError
	if errors.As(err, &de) {
		if de.IsNotFound {
			return "no such host"
		}
		return de.Err
	}
	return err.Error()
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// Combine is the error of a command whose every endpoint failed (fails,
// one per endpoint tried), as Do reports it: timedOut says that the
// command's time ran out.
func Combine(op string, fails []*Error, timedOut bool, timeout time.Duration) error {
	return combine(op, fails, timedOut, timeout)
}
