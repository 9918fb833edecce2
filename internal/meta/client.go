package meta

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/transport"
)

// Client talks to the config service from any node or tool. It finds the
// leader by following "not leader" hints, caches what it reads as hints
// (Hint), and retries across members until its context ends.
// Safe for concurrent use.
type Client struct {
	members []Member
	conns   transport.Pool
	mu      struct {
		sync.Mutex
		leader string // cached leader gRPC address ("" if unknown)
		next   int    // round-robin position when the leader is unknown
		hints  map[string]*pb.Namespace
	}
}

// NewClient returns a client for the given members (only GRPCAddr is used).
func NewClient(members []Member) *Client {
	c := &Client{members: members}
	c.mu.hints = map[string]*pb.Namespace{}
	return c
}

// Close drops every connection.
func (c *Client) Close() { c.conns.Close() }

func (c *Client) conn(addr string) (pb.ConfigServiceClient, error) {
	cc, err := c.conns.Get(addr)
	if err != nil {
		return nil, err
	}
	return pb.NewConfigServiceClient(cc), nil
}

// target picks where to send the next call: the cached leader, else the
// next member in turn.
func (c *Client) target() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mu.leader != "" {
		return c.mu.leader
	}
	m := c.members[c.mu.next%len(c.members)]
	c.mu.next++
	return m.GRPCAddr
}

// redirect records a leader hint (or forgets the leader if there is none).
func (c *Client) redirect(addr string) {
	c.mu.Lock()
	c.mu.leader = addr
	c.mu.Unlock()
}

// retry runs call against members until it reports done, the error is
// final, or ctx ends.
func (c *Client) retry(ctx context.Context, call func(ctx context.Context, cl pb.ConfigServiceClient) (leaderHint string, done bool, err error)) error {
	if len(c.members) == 0 {
		return errors.New("meta: no config-service members configured")
	}
	var last error
	for attempt := 0; ; attempt++ {
		addr := c.target()
		cl, err := c.conn(addr)
		if err == nil {
			cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			var hint string
			var done bool
			hint, done, err = call(cctx, cl)
			cancel()
			if done {
				return err
			}
			if err == nil { // not the leader
				c.redirect(hint)
				if attempt%len(c.members) != len(c.members)-1 {
					continue // follow the hint, or try the next member, at once
				}
			} else {
				if s, ok := status.FromError(err); ok && s.Code() == codes.InvalidArgument {
					return fmt.Errorf("%w: %s", ErrBadDecree, s.Message())
				}
				last = err
				c.redirect("")
			}
		}
		select {
		case <-ctx.Done():
			if last != nil {
				return fmt.Errorf("meta: config service unavailable: %w (last error: %v)", ctx.Err(), last)
			}
			return fmt.Errorf("meta: config service has no leader: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Propose passes a decree. It returns the new namespace version, or
// ErrStaleVersion (wrapped, with the current version) if the namespace moved.
func (c *Client) Propose(ctx context.Context, d *pb.Decree) (uint64, error) {
	if err := ValidateDecree(d); err != nil {
		return 0, err
	}
	var version uint64
	err := c.retry(ctx, func(ctx context.Context, cl pb.ConfigServiceClient) (string, bool, error) {
		r, err := cl.Propose(ctx, &pb.ProposeRequest{Decree: d})
		switch {
		case err != nil:
			return "", false, err
		case r.NotLeader:
			return r.LeaderAddr, false, nil
		case r.Stale:
			version = r.CurrentVersion
			return "", true, fmt.Errorf("%w (namespace %q is at version %d, decree expected %d)", ErrStaleVersion, d.Namespace, r.CurrentVersion, d.ExpectedVersion)
		}
		version = r.Version
		return "", true, nil
	})
	if errors.Is(err, ErrStaleVersion) {
		c.forget(d.Namespace)
	}
	return version, err
}

// Read returns a namespace linearizably and caches it as a hint.
func (c *Client) Read(ctx context.Context, name string) (*pb.Namespace, error) {
	var ns *pb.Namespace
	err := c.retry(ctx, func(ctx context.Context, cl pb.ConfigServiceClient) (string, bool, error) {
		r, err := cl.Read(ctx, &pb.ReadRequest{Namespace: name})
		switch {
		case err != nil:
			return "", false, err
		case r.NotLeader:
			return r.LeaderAddr, false, nil
		}
		ns = r.Namespace
		return "", true, nil
	})
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.mu.hints[name] = ns
	c.mu.Unlock()
	return ns, nil
}

// Hint returns the last cached copy of a namespace (nil if never read). It
// may be stale: callers refresh with Read when a server says so.
func (c *Client) Hint(name string) *pb.Namespace {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mu.hints[name]
}

func (c *Client) forget(name string) {
	c.mu.Lock()
	delete(c.mu.hints, name)
	c.mu.Unlock()
}

// Update is the read-modify-decree loop: it reads the namespace, lets fn
// compute the ops from it, and proposes them conditional on that version,
// re-reading and retrying when it loses a race. fn returning no ops ends the
// loop with nothing proposed.
func (c *Client) Update(ctx context.Context, name, origin string, fn func(*pb.Namespace) ([]*pb.Op, error)) (uint64, error) {
	for {
		ns, err := c.Read(ctx, name)
		if err != nil {
			return 0, err
		}
		ops, err := fn(ns)
		if err != nil || len(ops) == 0 {
			return ns.Version, err
		}
		v, err := c.Propose(ctx, &pb.Decree{Namespace: name, ExpectedVersion: ns.Version, Ops: ops, Origin: origin})
		if !errors.Is(err, ErrStaleVersion) {
			return v, err
		}
	}
}

// Members asks the group for its membership and leader.
func (c *Client) Members(ctx context.Context) (*pb.MembersResponse, error) {
	var out *pb.MembersResponse
	err := c.retry(ctx, func(ctx context.Context, cl pb.ConfigServiceClient) (string, bool, error) {
		r, err := cl.Members(ctx, &pb.MembersRequest{})
		if err != nil {
			return "", false, err
		}
		out = r
		return "", true, nil
	})
	return out, err
}

// ChangeMembers adds (add) or removes a config-service member, following
// the leader. It returns the raft index of the change.
func (c *Client) ChangeMembers(ctx context.Context, add bool, id uint64, raftAddr string) (uint64, error) {
	var idx uint64
	err := c.retry(ctx, func(ctx context.Context, cl pb.ConfigServiceClient) (string, bool, error) {
		r, err := cl.ChangeMembers(ctx, &pb.ChangeMembersRequest{Add: add, Remove: !add, Id: id, RaftAddr: raftAddr})
		if s, ok := status.FromError(err); ok && s.Code() == codes.FailedPrecondition {
			return "", true, fmt.Errorf("%w: %s", ErrMembership, s.Message())
		}
		switch {
		case err != nil:
			return "", false, err
		case r.NotLeader:
			return r.LeaderAddr, false, nil
		}
		idx = r.Index
		return "", true, nil
	})
	return idx, err
}

// Watch streams a namespace whenever its version grows past after, until
// ctx ends. It reconnects to another member when a stream breaks; versions
// delivered never go backwards.
func (c *Client) Watch(ctx context.Context, name string, after uint64) <-chan *pb.Namespace {
	out := make(chan *pb.Namespace, 1)
	go func() {
		defer close(out)
		wait := time.Duration(0)
		for ctx.Err() == nil {
			addr := c.target()
			cl, err := c.conn(addr)
			healthy := false // the stream delivered something before it broke
			if err == nil {
				var st grpc.ServerStreamingClient[pb.WatchResponse]
				st, err = cl.Watch(ctx, &pb.WatchRequest{Namespace: name, AfterVersion: after})
				for err == nil {
					var r *pb.WatchResponse
					if r, err = st.Recv(); err == nil && r.Namespace.GetVersion() > after {
						healthy = true
						after = r.Namespace.Version
						c.mu.Lock()
						c.mu.hints[name] = r.Namespace
						c.mu.Unlock()
						select {
						case out <- r.Namespace:
						case <-ctx.Done():
							return
						}
					}
				}
			}
			c.redirect("")
			// A stream that worked and broke (its member died or was cut
			// off) moves to the next member at once; members that fail to
			// serve are retried with a growing pause.
			switch {
			case healthy:
				wait = 0
			case wait == 0:
				wait = 20 * time.Millisecond
			default:
				wait = min(2*wait, time.Second)
			}
			select {
			case <-ctx.Done():
			case <-time.After(wait):
			}
		}
	}()
	return out
}
