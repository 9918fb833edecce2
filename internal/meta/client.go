package meta

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
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
		// failed: members whose last call failed (timed out, refused,
		// out of contact) and when. While the leader is unknown they are
		// passed over for AvoidFailed.
		failed map[string]time.Time
	}
}

// AvoidFailed is how long a member whose call failed is passed over, while
// the leader is unknown and another member has not failed: a leader cut
// off silently costs one attempt (attemptTimeout), not one per pass over
// the members; they elect a new leader within about two raft heartbeat
// timeouts.
const AvoidFailed = 2 * time.Second

// NewClient returns a client for the given members (only GRPCAddr is used).
func NewClient(members []Member) *Client {
	c := &Client{members: members}
	c.mu.hints = map[string]*pb.Namespace{}
	c.mu.failed = map[string]time.Time{}
	return c
}

// Close drops every connection.
func (c *Client) Close() { c.conns.Close() }

func (c *Client) conn(addr string) (pb.ConfigServiceClient, *grpc.ClientConn, error) {
	cc, err := c.conns.Get(addr)
	if err != nil {
		return nil, nil, err
	}
	return pb.NewConfigServiceClient(cc), cc, nil
}

// target picks where to send the next call: the cached leader, else the
// next member in turn that has not failed recently (any member if all
// have).
func (c *Client) target() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mu.leader != "" {
		return c.mu.leader
	}
	now := time.Now()
	for range c.members {
		m := c.members[c.mu.next%len(c.members)]
		c.mu.next++
		if !c.failedLocked(m.GRPCAddr, now) {
			return m.GRPCAddr
		}
	}
	m := c.members[c.mu.next%len(c.members)]
	c.mu.next++
	return m.GRPCAddr
}

func (c *Client) failedLocked(addr string, now time.Time) bool {
	at, ok := c.mu.failed[addr]
	if ok && now.Sub(at) >= AvoidFailed {
		delete(c.mu.failed, addr)
		return false
	}
	return ok
}

// redirect records a leader hint (or forgets the leader if there is none).
// Hints are followed even to a member that failed recently: a member names
// a leader only while it hears from it (Server.KnownLeader), so a hint to a
// failed member means it is back (a healed partition).
func (c *Client) redirect(addr string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.mu.leader = addr
}

// failed records that a call to addr failed, and forgets it as leader.
// It reports whether addr had failed already within AvoidFailed.
func (c *Client) failed(addr string) (again bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	again = c.failedLocked(addr, now)
	c.mu.failed[addr] = now
	if c.mu.leader == addr {
		c.mu.leader = ""
	}
	return again
}

// succeeded clears addr's failure.
func (c *Client) succeeded(addr string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.mu.failed, addr)
}

// attemptTimeout bounds one call to one member in the round-th pass over the
// members: short at first, so that a leader that went silent (its host cut
// off, its process stopped) costs half a second before the next member is
// asked and names the new leader; longer in later passes, so that a leader
// that is merely slow (a Barrier after an election, a slow disk) is still
// waited for.
func attemptTimeout(round int) time.Duration {
	d := 500 * time.Millisecond
	for i := 0; i < round && d < 4*time.Second; i++ {
		d *= 2
	}
	return min(d, 4*time.Second)
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
		cl, cc, err := c.conn(addr)
		if err == nil {
			cctx, cancel := context.WithTimeout(ctx, attemptTimeout(attempt/len(c.members)))
			var hint string
			var done bool
			hint, done, err = call(cctx, cl)
			cancel()
			if done {
				c.succeeded(addr)
				return err
			}
			if err == nil { // not the leader
				c.succeeded(addr)
				c.redirect(hint)
				if attempt%len(c.members) != len(c.members)-1 {
					continue // follow the hint, or try the next member, at once
				}
			} else {
				if s, ok := status.FromError(err); ok && s.Code() == codes.InvalidArgument {
					return fmt.Errorf("%w: %s", ErrBadDecree, s.Message())
				}
				last = err
				again := c.failed(addr)
				if again && status.Code(err) == codes.DeadlineExceeded && ctx.Err() == nil {
					// Silent twice in a row: the connection may be
					// stuck in TCP retransmission backoff (a healed
					// partition); the next attempt to addr dials
					// afresh. Not at the first timeout: on a lossy
					// link a new connection (a SYN, and no RTT
					// estimate yet) is slower than the old one
					// (measured at 20-30 % loss: half the decrees).
					c.conns.Reset(addr, cc)
				}
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
	if len(d.Id) == 0 {
		// An id makes the resends below idempotent: one that finds the
		// decree applied already (its first answer lost) is answered so,
		// not "stale" (which would send the caller's Update loop round
		// again, to decide afresh on a namespace its own decree changed).
		id := make([]byte, 16)
		if _, err := rand.Read(id); err != nil {
			return 0, err
		}
		d = &pb.Decree{Namespace: d.Namespace, ExpectedVersion: d.ExpectedVersion, Ops: d.Ops, Origin: d.Origin, Id: id}
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

// ConfirmedMembers asks the leader for the committed configuration
// (MembersRequest.confirmed), following the leader; an answer that is not
// confirmed (a member of an earlier build, which ignores the request's
// field) counts as none.
func (c *Client) ConfirmedMembers(ctx context.Context) (*pb.MembersResponse, error) {
	var out *pb.MembersResponse
	err := c.retry(ctx, func(ctx context.Context, cl pb.ConfigServiceClient) (string, bool, error) {
		r, err := confirmedMembers(ctx, cl)
		if err != nil || r == nil {
			return "", false, err
		}
		if r.NotLeader {
			return r.LeaderAddr, false, nil
		}
		out = r
		return "", true, nil
	})
	return out, err
}

// confirmedMembers asks one member for a confirmed answer: nil, nil if it
// could not give one and names no leader.
func confirmedMembers(ctx context.Context, cl pb.ConfigServiceClient) (*pb.MembersResponse, error) {
	r, err := cl.Members(ctx, &pb.MembersRequest{Confirmed: true})
	switch {
	case err != nil:
		return nil, err
	case r.NotLeader:
		return r, nil
	case !r.Confirmed:
		return nil, errors.New("meta: a member of an earlier build cannot confirm the configuration")
	}
	return r, nil
}

// ChangeMembers adds (add) or removes a config-service member, following
// the leader. It returns the raft index of the change (after an attempt
// whose answer was lost, the commit index at which the change was found
// made).
func (c *Client) ChangeMembers(ctx context.Context, add bool, id uint64, raftAddr string) (uint64, error) {
	var idx uint64
	// maybe: an earlier attempt failed without an answer (lost, or its
	// leader lost the lead mid-change): it may have committed, and this
	// attempt's "already in / not in the configuration" may be about it.
	maybe := false
	err := c.retry(ctx, func(ctx context.Context, cl pb.ConfigServiceClient) (string, bool, error) {
		r, err := cl.ChangeMembers(ctx, &pb.ChangeMembersRequest{Add: add, Remove: !add, Id: id, RaftAddr: raftAddr})
		if s, ok := status.FromError(err); ok && s.Code() == codes.FailedPrecondition {
			if maybe {
				// Only a confirmed answer: the configuration another
				// member holds may not be committed (review 112).
				m, merr := confirmedMembers(ctx, cl)
				switch {
				case merr != nil || m == nil:
					return "", false, merr // no confirmed answer yet (a change committing): ask again
				case m.NotLeader:
					return m.LeaderAddr, false, nil
				case hasMember(m, id) == add:
					idx = m.CommitIndex
					return "", true, nil // the earlier attempt made it
				}
			}
			// The server's message already names ErrMembership.
			return "", true, fmt.Errorf("%w: %s", ErrMembership, strings.TrimPrefix(s.Message(), ErrMembership.Error()+": "))
		}
		switch {
		case err != nil:
			maybe = true
			return "", false, err
		case r.NotLeader:
			return r.LeaderAddr, false, nil
		}
		idx = r.Index
		return "", true, nil
	})
	return idx, err
}

// hasMember reports whether m lists member id in the raft configuration.
func hasMember(m *pb.MembersResponse, id uint64) bool {
	for _, x := range m.GetMembers() {
		if x.Id == id {
			return true
		}
	}
	return false
}

// Watch streams a namespace whenever its version grows past after, until
// ctx ends. It reconnects to another member when a stream breaks, is
// refused (a replica out of contact with the leader), or stays silent for
// WatchTimeout (its host was cut off silently, or its process stopped);
// versions delivered never go backwards. The server sends the whole
// namespace once and then each decree's ops, which the watch applies to
// its own copy.
func (c *Client) Watch(ctx context.Context, name string, after uint64) <-chan *pb.Namespace {
	out := make(chan *pb.Namespace, 1)
	go func() {
		defer close(out)
		var cur map[string][]byte // the namespace at version have (nil: not known)
		var have uint64
		wait := time.Duration(0)
		for ctx.Err() == nil {
			addr := c.target()
			healthy := false // the stream delivered something before it broke
			err := func() error {
				cl, cc, err := c.conn(addr)
				if err != nil {
					return err
				}
				sctx, cancel := context.WithCancel(ctx)
				defer cancel()
				st, err := cl.Watch(sctx, &pb.WatchRequest{Namespace: name, AfterVersion: have})
				if err != nil {
					return err
				}
				// A watchdog ends a stream silent for WatchTimeout (time
				// spent handing a namespace to a slow consumer does not
				// count: the stream is not silent then).
				heard := make(chan struct{}, 1)
				var delivering atomic.Bool
				go func() {
					t := time.NewTimer(WatchTimeout)
					defer t.Stop()
					for {
						select {
						case <-heard:
							t.Reset(WatchTimeout)
						case <-t.C:
							if delivering.Load() {
								t.Reset(WatchTimeout)
								continue
							}
							// Silent: the connection may be stuck
							// (see retry); the next stream dials afresh.
							cancel()
							c.conns.Reset(addr, cc)
							return
						case <-sctx.Done():
							return
						}
					}
				}()
				for {
					r, err := st.Recv()
					if err != nil {
						return err
					}
					select {
					case heard <- struct{}{}:
					default:
					}
					healthy = true
					var ns *pb.Namespace
					switch {
					case r.Progress:
						continue
					case r.Namespace != nil && r.Namespace.Version > have:
						cur = map[string][]byte{}
						for _, e := range r.Namespace.Entries {
							cur[e.Key] = e.Value
						}
						ns = r.Namespace
					case r.Namespace == nil && cur != nil && r.BaseVersion == have && r.Version > have:
						for _, op := range r.Ops {
							if op.Kind == pb.Op_KIND_PUT {
								cur[op.Key] = op.Value
							} else {
								delete(cur, op.Key)
							}
						}
						ns = materialize(name, r.Version, cur)
					default:
						// Not on top of what we have (cannot happen with a
						// correct server): start over with the whole namespace.
						cur, have = nil, 0
						return errors.New("meta: watch message does not apply")
					}
					have = ns.Version
					if have <= after {
						continue // a replica behind the one we came from
					}
					after = have
					c.mu.Lock()
					c.mu.hints[name] = ns
					c.mu.Unlock()
					delivering.Store(true)
					select {
					case out <- ns:
					case <-ctx.Done():
						return ctx.Err()
					}
					delivering.Store(false)
					select {
					case heard <- struct{}{}:
					default:
					}
				}
			}()
			if ctx.Err() != nil {
				return
			}
			if status.Code(err) == codes.FailedPrecondition {
				c.redirect("") // refused: out of contact, but it answers
			} else {
				c.failed(addr) // broken or silent
			}
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

// materialize builds a namespace message from a watcher's copy, entries
// in key order as the server sends them.
func materialize(name string, version uint64, entries map[string][]byte) *pb.Namespace {
	ns := &pb.Namespace{Name: name, Version: version, Entries: make([]*pb.Entry, 0, len(entries))}
	keys := make([]string, 0, len(entries))
	for k := range entries {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		ns.Entries = append(ns.Entries, &pb.Entry{Key: k, Value: entries[k]})
	}
	return ns
}
