// Package transport is how Grove processes reach each other: a pool of gRPC
// client connections, one per address, shared by the layers of a process,
// and the connection settings every client and server of the cluster uses.
// (Listening stays with the node; the simulator replaces this layer with its
// own sessions and datagrams.)
package transport

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
)

// ConnectParams bound how long a connection to a restarted peer stays in
// reconnect backoff. gRPC's default grows to 120 s; between cluster nodes
// that would, for example, keep a restarted observer's answers out of
// failure-detector verdicts long after it is back (measured: verdicts
// delayed by 1-3 s under `grove bench fd`). Retrying at most every second
// costs a SYN per second to a peer that is really down.
// MinConnectTimeout also bounds one connection attempt: a SYN dropped by a
// partition is not left in the kernel's exponential SYN retransmission
// (1, 3, 7, 15 s...), so a healed peer is reached within about a second.
var ConnectParams = grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
	MinConnectTimeout: time.Second,
}

// Dead-peer detection. A silent partition (packets dropped, no RST) leaves
// a TCP connection open for as long as nothing is sent on it, and one with
// unacknowledged data in exponential retransmission for up to ~15 minutes;
// a stream on it (a lock session, a config watch) would wait for the whole
// partition and then for the retransmission timer after the heal. So every
// cluster connection (1) sends kernel keepalive probes after KeepAliveIdle
// of silence, and (2) is closed by the kernel when sent data or probes stay
// unacknowledged for UserTimeout (TCP_USER_TIMEOUT, which also governs the
// keepalive's verdict). gRPC then fails the streams on it with Unavailable
// and reconnects (ConnectParams). gRPC's own client pings cannot go below
// 10 s, hence the kernel's. UserTimeout is 5 s, not less: at 30 % packet
// loss 2.5 s closed healthy connections (a client's `lock acquire` stream
// with them) several times a minute in the fault suite, while nothing that
// must react within seconds waits for it (calls time out and redial on
// their own, watches have their own 1.2 s watchdog, lock sessions follow
// the master record, the master finds a cut-off holder through its
// outstanding revocations).
const (
	KeepAliveIdle     = time.Second
	KeepAliveInterval = time.Second
	UserTimeout       = 5 * time.Second
)

// MaxMessage is the largest message a cluster node receives (a clerk's
// Hello, a recovery's exclusions): 33 MiB. Servers set the same limit.
const MaxMessage = 33 << 20

// dialer opens TCP connections with the dead-peer detection above.
var dialer = &net.Dialer{
	KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: KeepAliveIdle, Interval: KeepAliveInterval, Count: 2},
	Control:         func(_, _ string, c syscall.RawConn) error { return setUserTimeout(c) },
}

func setUserTimeout(c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(UserTimeout/time.Millisecond))
	})
	if err != nil {
		return err
	}
	return serr
}

// DialContext opens a TCP connection with the cluster's dead-peer
// detection (for callers that wrap the dialer, such as the CLI, which
// records why a connection failed).
func DialContext(ctx context.Context, addr string) (net.Conn, error) {
	return dialer.DialContext(ctx, "tcp", addr)
}

// WindowSize is the HTTP/2 flow-control window of every stream and
// connection, BufferSize the gRPC read and write buffers.
const (
	WindowSize = 16 << 20
	BufferSize = 256 << 10
)

// DialOptions are the options of every gRPC client connection between
// cluster nodes and from tools to nodes.
func DialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(ConnectParams),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return dialer.DialContext(ctx, "tcp", addr)
		}),
		// gRPC pings too (its floor is 10 s): a peer whose kernel answers
		// but whose process is stopped (SIGSTOP) is caught by these.
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: UserTimeout, PermitWithoutStream: true}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMessage)),
		// No call is ever resent by gRPC after it may have reached the
		// server: a resent write could apply twice, or undo a later write
		// of another client (the B-tree's clients and the CLI resend only
		// what a node proved it did not apply, btree.NotApplied). A service
		// config (which the dns resolver would take from a TXT record) could
		// turn on a retry policy; neither is used. gRPC's transparent
		// retries stay: they resend only a call the server never received
		// or never processed.
		grpc.WithDisableServiceConfig(),
		grpc.WithDisableRetry(),
		// RLDev blocks travel in messages of up to 8 MiB: larger windows
		// and buffers than gRPC's defaults (64 KiB, 32 KiB) save flow
		// control round trips and syscalls on every one.
		grpc.WithInitialWindowSize(WindowSize),
		grpc.WithInitialConnWindowSize(WindowSize),
		grpc.WithReadBufferSize(BufferSize),
		grpc.WithWriteBufferSize(BufferSize),
	}
}

// Listen opens a TCP listener whose accepted connections have the same
// dead-peer detection as dialed ones, so that a server (a lock master) also
// drops the streams of a client cut off from it.
func Listen(addr string) (net.Listener, error) {
	lc := net.ListenConfig{
		KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: KeepAliveIdle, Interval: KeepAliveInterval, Count: 2},
		Control:         func(_, _ string, c syscall.RawConn) error { return setUserTimeout(c) },
	}
	return lc.Listen(context.Background(), "tcp", addr)
}

// ServerOptions are the options of every node's gRPC server: the message
// limit, server pings every second of inactivity (they catch a client
// process that is stopped while its kernel still acknowledges), and a
// policy that admits the clients' 10 s pings.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(MaxMessage),
		grpc.InitialWindowSize(WindowSize),
		grpc.InitialConnWindowSize(WindowSize),
		grpc.ReadBufferSize(BufferSize),
		grpc.WriteBufferSize(BufferSize),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: time.Second, Timeout: UserTimeout}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		// Calls run on long-lived goroutines (gRPC starts a new one only
		// when every worker is busy): a fresh goroutine per call grew
		// its stack through the call's deep path each time, ≈12 % of a
		// node's CPU under the etcd endpoint's get load (copystack).
		grpc.NumStreamWorkers(StreamWorkers),
	}
}

// StreamWorkers is the gRPC server's worker goroutines (see ServerOptions).
const StreamWorkers = 32

// Ready reports whether cc is connected, connecting it (from idle) and
// waiting up to wait for it. A call that finds its connection not ready
// sends nothing: callers that must know whether a write may have reached
// its server (and may still land) tell "never sent" from "lost in flight"
// this way. A connection in transient failure is not waited for (gRPC
// retries it on its own backoff; a dead server is found at once).
func Ready(ctx context.Context, cc *grpc.ClientConn, wait time.Duration) bool {
	if cc.GetState() == connectivity.Ready {
		return true
	}
	cc.Connect()
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for {
		st := cc.GetState()
		switch st {
		case connectivity.Ready:
			return true
		case connectivity.TransientFailure, connectivity.Shutdown:
			return false
		}
		if !cc.WaitForStateChange(wctx, st) {
			return false
		}
	}
}

// Pool keeps one client connection per address. Safe for concurrent use.
// The zero value is ready to use.
type Pool struct {
	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
}

// Get returns the connection to addr, creating it on first use. gRPC
// connects lazily and reconnects by itself, so a cached connection to a node
// that restarted keeps working.
func (p *Pool) Get(addr string) (*grpc.ClientConn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c := p.conns[addr]; c != nil {
		return c, nil
	}
	c, err := grpc.NewClient(addr, DialOptions()...)
	if err != nil {
		return nil, err
	}
	if p.conns == nil {
		p.conns = map[string]*grpc.ClientConn{}
	}
	p.conns[addr] = c
	return c, nil
}

// Reset closes the connection to addr, if it is still c, so that the next
// Get dials afresh. For a call that timed out on a connection that may be
// stuck: after a silent partition heals, a TCP connection can sit in
// exponential retransmission backoff for seconds more (until the next
// retransmission, or TCP_USER_TIMEOUT), while a new one is up in a round
// trip. Calls and streams still on c fail and are retried by their owners.
func (p *Pool) Reset(addr string, c *grpc.ClientConn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if cur := p.conns[addr]; cur != nil && cur == c {
		delete(p.conns, addr)
		c.Close()
	}
}

// Close closes every connection; the pool may be used again afterwards.
func (p *Pool) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// Describe says in words why a call to a node failed, for operators (status
// output, errors that travel on to a CLI): not a raw gRPC status.
func Describe(err error) string {
	msg := err.Error()
	switch c := status.Code(err); {
	case strings.Contains(msg, "connection refused"):
		return "refused the connection"
	case strings.Contains(msg, "no route to host"), strings.Contains(msg, "network is unreachable"):
		return "unreachable"
	case strings.Contains(msg, "i/o timeout"):
		return "did not accept a connection in time"
	case c == codes.DeadlineExceeded || c == codes.Canceled || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled):
		return "no answer in time"
	case c == codes.Unavailable || c == codes.FailedPrecondition:
		return status.Convert(err).Message()
	}
	return msg
}
