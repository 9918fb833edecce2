// Package client is Grove's Go client for B-link trees: named, ordered maps
// of byte-string keys to byte-string values that every node of a cluster
// serves at once (Boxwood §3.7); and for DDS hash tables (tables.go).
//
//	c, err := client.Dial(ctx, "127.0.0.1:7401", "127.0.0.1:7402")
//	...
//	defer c.Close()
//	users := c.Tree("users")
//	err = users.Put(ctx, []byte("alice"), []byte(`{"age": 31}`))
//	v, err := users.Get(ctx, []byte("alice"))        // ErrNotFound if absent
//	for kv, err := range users.Scan(ctx, client.Range{From: []byte("a")}) { ... }
//
// Every operation is atomic, linearizable, and durable once it returns nil
// (in the answering node's log, on two disks).
//
// # Retries
//
// A call goes to one endpoint at a time, the last one that answered first.
// Reads (Get, Scan, Count, Trees, Stat) are retried at the next endpoint on
// any failure that is not an answer (an unreachable node, a node that is
// starting or stopping) until the call's context ends.
//
// Puts and deletes (and their conditional forms) carry a write token: a
// random id of the client, a sequence number, and the time of the first
// send. A node keeps the outcome of a tokened write (applied, or its
// condition failed) in the same leaf image as the change, so the client
// sends the write again, to the next endpoint, after any failure that
// leaves its outcome unknown (the node died mid-call, the connection
// broke, an attempt's deadline, Options.AttemptTimeout, passed): an
// attempt of a write that already took effect is answered with that
// outcome and changes nothing, and an earlier attempt that arrives late
// finds the record and does nothing either. One write is never applied
// twice. Attempts go on until the call's context ends, within the token
// window (60 s from the first send, on the nodes' clocks). A write still
// fails with an error that wraps ErrUnknownOutcome when its context ends
// after an attempt of unknown outcome, or when its record is gone: it aged
// past the window, or a leaf taking very many tokened writes evicted it
// for room (see the README's "Idempotency tokens"). Each attempt also
// carries the client's floor, the lowest number of its writes still
// waiting for an answer: nodes drop the records of its writes below it,
// so that a client that keeps writing leaves few records to evict. The
// token also names the tree, by its anchor, looked up once per tree name
// (and again after a refusal): an attempt that reaches a tree made again
// under the name since is refused and did nothing, and the write then
// ends ErrUnknownOutcome if an earlier attempt's outcome was unknown, or
// goes on under a new token (records live in their tree: without the
// anchor a resend to the new tree would apply afresh). The answer of a
// repeated attempt does not know the previous value (CompareAndSwap's cur
// is nil then).
//
// Writes go untokened, as with Options.NoTokens, while the cluster refuses
// tokens (a node of an older build is registered, which could not read the
// records): they are then retried only when the answer proves the write
// was not applied (the node refused it before starting it), and any other
// failure wraps ErrUnknownOutcome. CreateTree and DropTree are always
// such writes. A caller that retries such a write itself should use a
// conditional form (PutIfAbsent, CompareAndSwap) or values it can
// recognise.
//
// # Routing
//
// A tree's calls (Get, Put, Delete, Scan, Count, Stat and their forms) go
// first to the tree's home node: the node rendezvous hashing of the
// tree's name over the registered nodes picks, as the nodes themselves
// (and their etcd endpoint's forwarding) pick it. The client asks an
// endpoint for the registered nodes in the background, every 10 s (and
// 1 s after a call to a home failed), and connects to the home even if it
// is not among the endpoints. One server then holds the tree's node
// leases, so clients dialed to different endpoints share its cache and its
// log's group commits instead of passing leases from server to server
// (each pass a write-back). Until the home's connection is up, and for
// 10 s after a call to it failed (see Retries), calls go to the endpoints
// as before: any node serves any tree (coherent through the locks).
// Options.NoRouting turns routing off.
//
// # Limits
//
// Keys are 1 to 1024 bytes; a key and its value together must fit in a
// node (about 2.6 KiB with the default 8 KiB nodes; trees made with a
// larger node size take larger values). Larger entries are refused with
// ErrInvalid.
package client

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"iter"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/btree"
	"github.com/grovestore/grove/internal/ddstable"
	"github.com/grovestore/grove/internal/meta"
	"github.com/grovestore/grove/internal/transport"
	"github.com/grovestore/grove/internal/treecall"
)

// Limits of a tree's entries: keys of 1 to MaxKey bytes, values of up to
// MaxValue bytes (a value too large for its leaf is kept in a chunk of its
// own, transparently). Larger ones fail with ErrInvalid.
const (
	MaxKey   = btree.MaxKey
	MaxValue = btree.MaxValue
)

// Errors. Test them with errors.Is.
var (
	// ErrNotFound: the key (or the tree) does not exist.
	ErrNotFound = errors.New("grove: not found")
	// ErrExists: a tree of that name exists.
	ErrExists = errors.New("grove: already exists")
	// ErrInvalid: the request is malformed (an empty or oversized key, an
	// entry too large for the tree's nodes, a bad range or tree name).
	ErrInvalid = errors.New("grove: invalid request")
	// ErrUnknownOutcome: a write failed in a way that does not say whether
	// it took effect.
	ErrUnknownOutcome = errors.New("grove: the write's outcome is unknown (it may or may not have taken effect)")
	// ErrNoSpace: the chunk store had no room for a node the write needed
	// (a split's); the tree is unchanged. Free space (drop a tree, delete
	// keys: compression frees merged nodes) or grow the store (grove chunk
	// grow) before retrying.
	ErrNoSpace = errors.New("grove: no space left in the chunk store")
	// ErrUnavailable: no endpoint could serve the call before its context
	// ended, and nothing was changed.
	ErrUnavailable = errors.New("grove: no node could serve the call")
)

// Options tune a Client. The zero value is usable.
type Options struct {
	// CallTimeout bounds each call whose context has no deadline (default
	// 30 s).
	CallTimeout time.Duration
	// Backoff is the pause after every endpoint failed once, doubled up to
	// a second (default 50 ms).
	Backoff time.Duration
	// NoRouting sends every call to the endpoint that answered last. By
	// default a tree's calls go first to the tree's home node (see Routing
	// in the package comment).
	NoRouting bool
	// NoTokens sends puts and deletes without write tokens: a failure
	// that leaves a write's outcome unknown is returned, not retried (see
	// Retries in the package comment).
	NoTokens bool
	// AttemptTimeout bounds one attempt of a tokened write (default a
	// third of CallTimeout): an attempt that hangs is given up and the
	// write sent again elsewhere.
	AttemptTimeout time.Duration
}

// Client is a connection to a cluster. It is safe for concurrent use.
type Client struct {
	opts  Options
	eps   []string
	conns []*grpc.ClientConn
	tcs   []pb.TreeServiceClient
	cur   atomic.Int64 // the endpoint that answered last
	route router
	// id is the client's in write tokens; pend numbers its writes and
	// knows which wait for an answer (their floor).
	id   [16]byte
	pend treecall.Pending
	// untokened: until when (Unix ns) writes go without tokens (the
	// cluster refused them: tokensOffFor).
	untokened atomic.Int64
	stats     struct{ resent, repeats, unknown, treeChanged atomic.Uint64 }
	// anchors: each tree's anchor as last looked up (name -> btree.Handle),
	// sent in write tokens (a node refuses an attempt that reaches another
	// tree under the name: TREE_CHANGED).
	anchors sync.Map
	// tables: the hash tables' DDS library (tables.go), made at the first
	// table call.
	tables struct {
		sync.Mutex
		lib    *ddstable.Library
		meta   *meta.Client
		closed bool
	}
}

// Stats count a client's tokened writes' retries (see Retries).
type Stats struct {
	// Resent counts the attempts sent after an attempt of unknown outcome.
	Resent uint64
	// Repeats counts the writes answered from their completion record (an
	// earlier attempt had taken effect, or failed its condition).
	Repeats uint64
	// Unknown counts the writes that ended with ErrUnknownOutcome.
	Unknown uint64
	// TreeChanged counts the attempts refused because their tree was
	// dropped and made again under its name since the client looked it up
	// (each did nothing; the write went on under a new token, or ended
	// ErrUnknownOutcome if an earlier attempt's outcome was unknown).
	TreeChanged uint64
}

// Stats returns the client's counts since Dial.
func (c *Client) Stats() Stats {
	return Stats{Resent: c.stats.resent.Load(), Repeats: c.stats.repeats.Load(), Unknown: c.stats.unknown.Load(), TreeChanged: c.stats.treeChanged.Load()}
}

// tokensOffFor is how long a client sends writes untokened after the
// cluster refused a token (a node of an older build is registered).
const tokensOffFor = 30 * time.Second

// router knows the registered nodes, to send each tree's calls to its home.
type router struct {
	mu       sync.Mutex
	nodes    map[uint64]string // id -> gRPC address
	ids      []uint64
	next     time.Time // when to ask for the nodes again
	fetching bool
	extra    map[string]*grpc.ClientConn // connections to nodes that are not endpoints
	// shunned: homes a call failed at (their address, and until when):
	// calls go to the endpoints meanwhile (review 55: a home whose B-tree
	// server was starting held every call until its deadline, call after
	// call, while the endpoints would have served them).
	shunned map[string]time.Time
	closed  bool
}

// shunFor is how long calls avoid a home a call failed at.
const shunFor = routeRefresh

// routeRefresh is how often the client asks for the registered nodes;
// routeRetry how soon after a failed ask, or after a call to a home failed.
const (
	routeRefresh = 10 * time.Second
	routeRetry   = time.Second
)

// Dial connects to a cluster through endpoints (nodes' gRPC addresses,
// host:port). Connections are made lazily: Dial fails only on malformed
// addresses.
func Dial(ctx context.Context, endpoints ...string) (*Client, error) {
	return DialOptions(ctx, Options{}, endpoints...)
}

// DialOptions is Dial with options.
func DialOptions(_ context.Context, opts Options, endpoints ...string) (*Client, error) {
	if len(endpoints) == 0 {
		return nil, fmt.Errorf("%w: no endpoints", ErrInvalid)
	}
	if opts.CallTimeout <= 0 {
		opts.CallTimeout = 30 * time.Second
	}
	if opts.Backoff <= 0 {
		opts.Backoff = 50 * time.Millisecond
	}
	if opts.AttemptTimeout <= 0 {
		opts.AttemptTimeout = opts.CallTimeout / 3
	}
	c := &Client{opts: opts, eps: endpoints}
	if _, err := rand.Read(c.id[:]); err != nil {
		return nil, fmt.Errorf("grove: a client id: %w", err)
	}
	c.route.extra = map[string]*grpc.ClientConn{}
	for _, ep := range endpoints {
		cc, err := grpc.NewClient(ep, transport.DialOptions()...)
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("grove: endpoint %q: %w", ep, err)
		}
		c.conns = append(c.conns, cc)
		c.tcs = append(c.tcs, pb.NewTreeServiceClient(cc))
	}
	return c, nil
}

// Close closes the connections.
func (c *Client) Close() error {
	c.closeTables()
	var err error
	for _, cc := range c.conns {
		err = errors.Join(err, cc.Close())
	}
	c.route.mu.Lock()
	c.route.closed = true
	for _, cc := range c.route.extra {
		err = errors.Join(err, cc.Close())
	}
	c.route.extra = nil
	c.route.mu.Unlock()
	return err
}

// home returns tree's home node's connection if it is up (nothing
// otherwise: the call goes to the endpoints as usual), and asks for the
// registered nodes in the background when it is time.
func (c *Client) home(tree string) (pb.TreeServiceClient, bool) {
	if c.opts.NoRouting || tree == "" {
		return nil, false
	}
	r := &c.route
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, false
	}
	if !r.fetching && !time.Now().Before(r.next) {
		r.fetching = true
		go c.fetchNodes()
	}
	if len(r.ids) == 0 {
		return nil, false
	}
	addr := r.nodes[btree.Home(tree, r.ids)]
	if addr == "" {
		return nil, false
	}
	if until, ok := r.shunned[addr]; ok {
		if time.Now().Before(until) {
			return nil, false
		}
		delete(r.shunned, addr)
	}
	var cc *grpc.ClientConn
	for i, ep := range c.eps {
		if ep == addr {
			cc = c.conns[i]
			break
		}
	}
	if cc == nil {
		if cc = r.extra[addr]; cc == nil {
			var err error
			if cc, err = grpc.NewClient(addr, transport.DialOptions()...); err != nil {
				return nil, false
			}
			r.extra[addr] = cc
		}
	}
	switch cc.GetState() {
	case connectivity.Ready:
		return pb.NewTreeServiceClient(cc), true
	case connectivity.Idle:
		cc.Connect() // for a later call
	}
	return nil, false
}

// fetchNodes asks the endpoint that answered last for the registered nodes.
func (c *Client) fetchNodes() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	i := int(c.cur.Load()) % len(c.tcs)
	resp, err := c.tcs[i].Nodes(ctx, &pb.TreeNodesRequest{})
	r := &c.route
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fetching = false
	if err != nil {
		r.next = time.Now().Add(routeRetry)
		if status.Code(err) == codes.Unimplemented {
			r.next = time.Now().Add(routeRefresh) // a node of an older build
		}
		return
	}
	r.next = time.Now().Add(routeRefresh)
	if len(resp.Nodes) == 0 {
		r.next = time.Now().Add(routeRetry) // a node whose membership watch has not delivered yet
	}
	r.nodes = map[uint64]string{}
	r.ids = r.ids[:0]
	for _, n := range resp.Nodes {
		if n.Id == 0 {
			continue
		}
		// Every node counts (the home is computed over them all, as the
		// nodes compute it), but one that gives an unspecified host
		// (0.0.0.0:7410, :7410) cannot be dialed from here: its trees'
		// calls go to the endpoints.
		r.ids = append(r.ids, n.Id)
		if host, _, err := net.SplitHostPort(n.Addr); err == nil && host != "" {
			if ip := net.ParseIP(host); ip == nil || !ip.IsUnspecified() {
				r.nodes[n.Id] = n.Addr
			}
		}
	}
}

// stopRouting sends calls to the endpoints until the next ask for the
// nodes.
func (c *Client) stopRouting() {
	c.route.mu.Lock()
	c.route.ids, c.route.nodes = nil, nil
	c.route.next = time.Now().Add(routeRefresh)
	c.route.mu.Unlock()
}

// rerouteSoon asks for the nodes again soon, and sends tree's calls to
// the endpoints for shunFor: a call to tree's home failed.
func (c *Client) rerouteSoon(tree string) {
	c.route.mu.Lock()
	defer c.route.mu.Unlock()
	r := &c.route
	if next := time.Now().Add(routeRetry); next.Before(r.next) {
		r.next = next
	}
	if len(r.ids) == 0 {
		return
	}
	if addr := r.nodes[btree.Home(tree, r.ids)]; addr != "" {
		if r.shunned == nil {
			r.shunned = map[string]time.Time{}
		}
		r.shunned[addr] = time.Now().Add(shunFor)
	}
}

// write and read say how a call may be retried (treecall.Kind).
type kind = treecall.Kind

const (
	read  = treecall.Read
	write = treecall.Write
)

// call runs f at one endpoint after another until it answers, as kind
// allows; a call on a tree goes first to the tree's home if its connection
// is up.
func (c *Client) call(ctx context.Context, k kind, tree string, f func(ctx context.Context, tc pb.TreeServiceClient) error) error {
	return c.run(ctx, &treecall.Call{Kind: k}, tree, f, nil)
}

// ended is a call's error when its context ended before an answer: nothing
// changed, unless an attempt of a tokened write may yet have.
func ended(call *treecall.Call, ctx context.Context, last error) error {
	if call.Ended() == treecall.Unknown {
		return fmt.Errorf("%w: %v (last: %v)", ErrUnknownOutcome, ctx.Err(), last)
	}
	return fmt.Errorf("%w: %v (last: %v)", ErrUnavailable, ctx.Err(), last)
}

// anchor is tree's anchor, for a token's attempt while none before it may
// have applied: as last looked up, or looked up through tc now. Zero (the
// token says nothing) when tc's node is of a build from before Lookup: the
// next attempt, if any, looks again (review 56: a client-wide switch let
// one old node turn anchors off for tokens sent to new ones). A failed
// lookup is marked not applied (nothing was sent) unless the tree does not
// exist (NotFound: the write's answer too). A lookup has a timeout of its
// own (review 56: within the attempt's, a slow one left the put too
// little time).
func (c *Client) anchor(ctx context.Context, tc pb.TreeServiceClient, tree string) (btree.Handle, error) {
	if a, ok := c.anchors.Load(tree); ok {
		return a.(btree.Handle), nil
	}
	lctx, cancel := context.WithTimeout(ctx, c.opts.AttemptTimeout)
	defer cancel()
	a, old, err := btree.LookupAnchor(lctx, tc, tree)
	if err != nil || old {
		return btree.Handle{}, err
	}
	// (A lookup that raced a refusal or another lookup leaves the entry
	// there: a stale one costs one more refusal, never a wrong write.)
	c.anchors.LoadOrStore(tree, a)
	return a, nil
}

// newToken numbers a tokened write; pend.End(tok.Seq) when its call ends.
func (c *Client) newToken() *pb.TreeWriteToken {
	return &pb.TreeWriteToken{Client: c.id[:], Seq: c.pend.Begin(), Attempt: 1, Stamp: time.Now().UnixNano()}
}

// write runs a put or delete: f sends it, under tok if not nil (PutOnce,
// DeleteOnce) and plainly otherwise. Its retries are treecall's rules.
func (c *Client) write(ctx context.Context, tree string, f func(ctx context.Context, tc pb.TreeServiceClient, tok *pb.TreeWriteToken) error) (err error) {
	call := &treecall.Call{Kind: treecall.Write}
	var tok *pb.TreeWriteToken
	if !c.opts.NoTokens && time.Now().UnixNano() >= c.untokened.Load() {
		call.Tokened, tok = true, c.newToken()
	}
	defer func() {
		if tok != nil {
			c.pend.End(tok.Seq)
		}
		if errors.Is(err, ErrUnknownOutcome) {
			c.stats.unknown.Add(1)
		}
	}()
	return c.run(ctx, call, tree, func(ctx context.Context, tc pb.TreeServiceClient) error {
		if !call.Tokened {
			return f(ctx, tc, nil)
		}
		// tok names its tree from the first attempt that may apply on:
		// while every attempt before was refused before any change
		// (call.Ambiguous 0), none applied, and the anchor may still be
		// set; after, never (a resend must name the tree the attempts of
		// unknown outcome were meant for, or none, as they did).
		if call.Ambiguous == 0 && tok.TreeCm == 0 && tok.TreeId == 0 {
			a, err := c.anchor(ctx, tc, tree)
			if err != nil {
				return err // (a lookup: nothing sent)
			}
			tok.TreeCm, tok.TreeId = a.CM, a.ID
		}
		actx, cancel := context.WithTimeout(ctx, c.opts.AttemptTimeout)
		defer cancel()
		// (The token's message is marshalled within the call: changing
		// it between attempts is safe.)
		tok.Attempt = call.Attempt()
		tok.Floor = c.pend.Floor()
		err := f(actx, tc, tok)
		if st, ok := status.FromError(err); ok && btree.HasReason(st, btree.TreeChanged) {
			// The next token looks it up again (unless another
			// goroutine's lookup stored a newer anchor meanwhile).
			c.anchors.CompareAndDelete(tree, btree.Handle{CM: tok.TreeCm, ID: tok.TreeId})
			c.stats.treeChanged.Add(1)
		}
		return err
	}, func(d treecall.Decision) {
		switch {
		case d.Untokened:
			// A build from before tokens, or a cluster with one: this
			// client's writes go untokened for a while.
			c.untokened.Store(time.Now().Add(tokensOffFor).UnixNano())
			c.pend.End(tok.Seq)
			tok = nil
		case d.NewToken:
			// The old token's attempt did nothing (the rules say so
			// only then): it is no longer waited for.
			c.pend.End(tok.Seq)
			tok = c.newToken()
		case d.Resend:
			c.stats.resent.Add(1)
		}
	})
}

// run is call: f is one attempt, and decided, if not nil, is told each
// decision after a failed one.
func (c *Client) run(ctx context.Context, call *treecall.Call, tree string, f func(ctx context.Context, tc pb.TreeServiceClient) error, decided func(treecall.Decision)) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.opts.CallTimeout)
		defer cancel()
	}
	backoff := c.opts.Backoff
	var last error
	tree0 := tree
	for tried := 0; ; tried++ {
		i := int(c.cur.Load()) % len(c.tcs)
		var err error
		home, atHome := c.home(tree0)
		tree0 = "" // the home is tried once; then the endpoints as usual
		if atHome {
			i = -1
			err = f(ctx, home)
			tried--
		} else if c.ready(ctx, i) {
			err = f(ctx, c.tcs[i])
		} else {
			// Not connected: nothing is sent, so even a write may go on to
			// the next endpoint.
			err = btree.NotAppliedError(codes.Unavailable, fmt.Sprintf("grove: endpoint %s is not reachable", c.eps[i]))
		}
		if err == nil {
			return nil
		}
		st, _ := status.FromError(err)
		if !call.Tokened && atHome && st.Code() == codes.Unimplemented {
			// Not a Grove node's tree service at that address (nothing
			// was done): the endpoints, and no routing for a while.
			c.stopRouting()
			tried, tree0 = -1, ""
			continue
		}
		d := call.Failed(st, ctx.Err() != nil)
		if decided != nil {
			decided(d)
		}
		switch d.Step {
		case treecall.Again:
			if !atHome {
				tried--
			} else {
				tree0 = tree
			}
			continue
		case treecall.Answer:
			switch {
			case btree.HasReason(st, btree.TokenExpired):
				return fmt.Errorf("%w: every new token was refused as too old (is this machine's clock far from the nodes'?): %s", ErrUnavailable, st.Message())
			case btree.HasReason(st, btree.TreeChanged):
				// (review 56: it came back as a bare FailedPrecondition.)
				return fmt.Errorf("%w: the write was refused, doing nothing, each time because the tree was dropped and made again under its name since it was looked up: %s", ErrUnavailable, st.Message())
			case st.Code() == codes.ResourceExhausted && call.Kind == read:
				return st.Err() // (a read over a limit, e.g. gRPC's message size)
			}
			return mapError(st)
		case treecall.Unknown:
			if st.Code() == codes.ResourceExhausted {
				// (gRPC's own size limit, past the node's checks: no
				// fault of the endpoint's.)
				return fmt.Errorf("%w: %s", ErrUnknownOutcome, st.Message())
			}
			// The next call tries the next endpoint first.
			if i >= 0 {
				c.cur.CompareAndSwap(int64(i), int64((i+1)%len(c.tcs)))
			}
			if atHome {
				c.rerouteSoon(tree)
			}
			return fmt.Errorf("%w: %v", ErrUnknownOutcome, err)
		}
		// Next, or Unavailable (the call's time ran out): the next
		// attempt, or the next call, goes to the next endpoint (a tokened
		// attempt's outcome, if it had one, is in the token's record).
		if atHome {
			c.rerouteSoon(tree)
		}
		last = err
		if i >= 0 {
			c.cur.CompareAndSwap(int64(i), int64((i+1)%len(c.tcs)))
		}
		if d.Step == treecall.Unavailable {
			return ended(call, ctx, last)
		}
		if !atHome && (tried+1)%len(c.tcs) == 0 {
			select {
			case <-ctx.Done():
				return ended(call, ctx, last)
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, time.Second)
		}
		if ctx.Err() != nil {
			return ended(call, ctx, last)
		}
	}
}

// ready makes sure endpoint i is connected, waiting a little for it.
func (c *Client) ready(ctx context.Context, i int) bool {
	return transport.Ready(ctx, c.conns[i], connectWait)
}

// connectWait bounds the wait for an endpoint's connection.
const connectWait = 2 * time.Second

func mapError(st *status.Status) error {
	switch st.Code() {
	case codes.NotFound:
		return fmt.Errorf("%w: %s", ErrNotFound, st.Message())
	case codes.AlreadyExists:
		return fmt.Errorf("%w: %s", ErrExists, st.Message())
	case codes.InvalidArgument, codes.OutOfRange:
		return fmt.Errorf("%w: %s", ErrInvalid, st.Message())
	case codes.ResourceExhausted:
		return fmt.Errorf("%w: %s", ErrNoSpace, st.Message())
	}
	return st.Err()
}

// TreeOptions are a new tree's settings.
type TreeOptions struct {
	// NodeSize is the nodes' size in bytes, 8 KiB to 256 KiB (0: 8 KiB). It
	// bounds an entry: a key and its value together.
	NodeSize uint32
	// Fanout bounds a node's entries (0: as many as fit).
	Fanout uint32
}

// TreeInfo describes a tree.
type TreeInfo struct {
	Name     string
	NodeSize uint32
	Fanout   uint32
}

// CreateTree creates an empty tree (ErrExists if there is one).
func (c *Client) CreateTree(ctx context.Context, name string, o TreeOptions) error {
	defer c.anchors.Delete(name) // (a new tree under the name)
	return c.call(ctx, write, "", func(ctx context.Context, tc pb.TreeServiceClient) error {
		_, err := tc.Create(ctx, &pb.TreeCreateRequest{Name: name, NodeSize: o.NodeSize, Fanout: o.Fanout})
		return err
	})
}

// DropTree drops a tree and frees its chunks (ErrNotFound if there is none).
func (c *Client) DropTree(ctx context.Context, name string) error {
	defer c.anchors.Delete(name)
	return c.call(ctx, write, "", func(ctx context.Context, tc pb.TreeServiceClient) error {
		_, err := tc.Drop(ctx, &pb.TreeDropRequest{Name: name})
		return err
	})
}

// Trees lists the trees, by name. If some directory entries do not decode
// it returns the others with an *UnreadableTreesError.
func (c *Client) Trees(ctx context.Context) ([]TreeInfo, error) {
	var out []TreeInfo
	var unreadable []string
	err := c.call(ctx, read, "", func(ctx context.Context, tc pb.TreeServiceClient) error {
		r, err := tc.List(ctx, &pb.TreeListRequest{})
		if err != nil {
			return err
		}
		out = out[:0]
		for _, t := range r.Trees {
			out = append(out, TreeInfo{Name: t.Name, NodeSize: t.NodeSize, Fanout: t.Fanout})
		}
		unreadable = r.Unreadable
		return nil
	})
	if err == nil && len(unreadable) > 0 {
		err = &UnreadableTreesError{Entries: unreadable}
	}
	return out, err
}

// UnreadableTreesError is Trees' error when directory entries do not
// decode (written by a newer build, or damaged): the other trees are
// listed beside it.
type UnreadableTreesError struct {
	Entries []string // each "key: error"
}

func (e *UnreadableTreesError) Error() string {
	return fmt.Sprintf("grove: %d tree directory entries do not decode: %s", len(e.Entries), strings.Join(e.Entries, "; "))
}

// Tree is a handle on a named tree; making one does no I/O.
type Tree struct {
	c    *Client
	name string
}

// Tree returns the handle of tree name.
func (c *Client) Tree(name string) *Tree { return &Tree{c: c, name: name} }

// Name is the tree's name.
func (t *Tree) Name() string { return t.name }

// Get returns key's value, or ErrNotFound.
func (t *Tree) Get(ctx context.Context, key []byte) ([]byte, error) {
	var v []byte
	err := t.c.call(ctx, read, t.name, func(ctx context.Context, tc pb.TreeServiceClient) error {
		r, err := tc.Get(ctx, &pb.TreeGetRequest{Tree: t.name, Key: key})
		if err != nil {
			return err
		}
		if !r.Found {
			return status.Error(codes.NotFound, "no such key")
		}
		v = r.Value
		if v == nil {
			v = []byte{}
		}
		return nil
	})
	return v, err
}

func (t *Tree) put(ctx context.Context, key, val []byte, cond pb.TreeCond, expect []byte) (applied bool, prev []byte, found bool, err error) {
	if err := checkEntry(key, val, expect); err != nil {
		return false, nil, false, err
	}
	err = t.c.write(ctx, t.name, func(ctx context.Context, tc pb.TreeServiceClient, tok *pb.TreeWriteToken) error {
		req := &pb.TreePutRequest{Tree: t.name, Key: key, Value: val, Cond: cond, Expect: expect, Token: tok}
		r, err := btree.SendPut(ctx, tc, req)
		if err != nil {
			return err
		}
		applied, prev, found = r.Applied, r.Prev, r.Found
		if r.Repeat {
			t.c.stats.repeats.Add(1)
		}
		return nil
	})
	return
}

// Put sets key to val.
func (t *Tree) Put(ctx context.Context, key, val []byte) error {
	_, _, _, err := t.put(ctx, key, val, pb.TreeCond_TREE_COND_ALWAYS, nil)
	return err
}

// PutIfAbsent sets key to val only if key is absent; applied says whether
// it did.
func (t *Tree) PutIfAbsent(ctx context.Context, key, val []byte) (applied bool, err error) {
	applied, _, _, err = t.put(ctx, key, val, pb.TreeCond_TREE_COND_IF_ABSENT, nil)
	return applied, err
}

// CompareAndSwap sets key to val only if its current value is old; applied
// says whether it did, and cur is the value it found (nil, found false, if
// absent). When the answer came from the write's completion record (an
// attempt sent again after one of unknown outcome: see Retries), found is
// known but cur is nil.
func (t *Tree) CompareAndSwap(ctx context.Context, key, old, val []byte) (applied bool, cur []byte, found bool, err error) {
	if old == nil {
		old = []byte{}
	}
	return t.put(ctx, key, val, pb.TreeCond_TREE_COND_IF_EQUALS, old)
}

func (t *Tree) del(ctx context.Context, key []byte, cond pb.TreeCond, expect []byte) (applied, found bool, err error) {
	if err := checkEntry(key, nil, expect); err != nil {
		return false, false, err
	}
	err = t.c.write(ctx, t.name, func(ctx context.Context, tc pb.TreeServiceClient, tok *pb.TreeWriteToken) error {
		req := &pb.TreeDeleteRequest{Tree: t.name, Key: key, Cond: cond, Expect: expect, Token: tok}
		r, err := btree.SendDelete(ctx, tc, req)
		if err != nil {
			return err
		}
		applied, found = r.Applied, r.Found
		if r.Repeat {
			t.c.stats.repeats.Add(1)
		}
		return nil
	})
	return
}

// checkEntry refuses, before sending, a write the nodes would refuse: so
// that a request over gRPC's own size limit (refused by gRPC before any
// handler, an answer that proves nothing to the retry rules) is never sent
// (review 53: a 5 MiB tokened put was resent to every endpoint until its
// time ended, then reported of unknown outcome).
func checkEntry(key, val, expect []byte) error {
	switch {
	case len(key) == 0 || len(key) > MaxKey:
		return fmt.Errorf("%w: a key is 1 to %d bytes (this one %d)", ErrInvalid, MaxKey, len(key))
	case len(val) > MaxValue:
		return fmt.Errorf("%w: a value is at most %d bytes (this one %d)", ErrInvalid, MaxValue, len(val))
	case len(expect) > MaxValue:
		return fmt.Errorf("%w: a compared value is at most %d bytes (this one %d)", ErrInvalid, MaxValue, len(expect))
	}
	return nil
}

// Delete removes key; found says whether it was there.
func (t *Tree) Delete(ctx context.Context, key []byte) (found bool, err error) {
	_, found, err = t.del(ctx, key, pb.TreeCond_TREE_COND_ALWAYS, nil)
	return found, err
}

// CompareAndDelete removes key only if its value is old; applied says
// whether it did.
func (t *Tree) CompareAndDelete(ctx context.Context, key, old []byte) (applied bool, err error) {
	if old == nil {
		old = []byte{}
	}
	applied, _, err = t.del(ctx, key, pb.TreeCond_TREE_COND_IF_EQUALS, old)
	return applied, err
}

// Range is a span of keys [From, To), To nil meaning no end, with scan
// options.
type Range struct {
	From, To []byte
	// Limit bounds the entries a scan returns (0: all).
	Limit int
	// Reverse scans in descending order.
	Reverse bool
	// KeysOnly leaves the values out.
	KeysOnly bool
}

// KV is one entry of a scan.
type KV struct {
	Key, Value []byte
}

// Count returns the number of keys in [r.From, r.To), counted atomically.
func (t *Tree) Count(ctx context.Context, r Range) (uint64, error) {
	var n uint64
	err := t.c.call(ctx, read, t.name, func(ctx context.Context, tc pb.TreeServiceClient) error {
		resp, err := tc.Count(ctx, &pb.TreeCountRequest{Tree: t.name, From: r.From, To: r.To, HasTo: r.To != nil})
		if err != nil {
			return err
		}
		n = resp.Count
		return nil
	})
	return n, err
}

// Scan iterates over the entries of r in key order (descending if
// r.Reverse). It reads them a page at a time; each page is atomic (exactly
// the tree's entries in its part of the range at one instant), the whole
// iteration is not a snapshot. An error ends the iteration (yielded with a
// zero KV).
func (t *Tree) Scan(ctx context.Context, r Range) iter.Seq2[KV, error] {
	return func(yield func(KV, error) bool) {
		from, to, hasTo := r.From, r.To, r.To != nil
		n := 0
		for {
			var resp *pb.TreeScanResponse
			left := 0
			if r.Limit > 0 {
				left = r.Limit - n
			}
			err := t.c.call(ctx, read, t.name, func(ctx context.Context, tc pb.TreeServiceClient) error {
				var err error
				resp, err = tc.Scan(ctx, &pb.TreeScanRequest{Tree: t.name, From: from, To: to, HasTo: hasTo, Limit: uint32(left), Reverse: r.Reverse, KeysOnly: r.KeysOnly})
				return err
			})
			if err != nil {
				yield(KV{}, err)
				return
			}
			for i, k := range resp.Keys {
				kv := KV{Key: k}
				if !r.KeysOnly && i < len(resp.Values) {
					kv.Value = resp.Values[i]
				}
				if !yield(kv, nil) {
					return
				}
				n++
			}
			if !resp.More || r.Limit > 0 && n >= r.Limit {
				return
			}
			if r.Reverse {
				to, hasTo = resp.Lo, true
				if to == nil {
					to = []byte{}
				}
			} else {
				from = resp.Hi
			}
		}
	}
}

// Stat describes a tree's shape, as one node sees it.
type Stat struct {
	TreeInfo
	Height, Nodes, Keys uint64
	// The answering node's cache: hits and misses of its node lookups.
	CacheHits, CacheMisses uint64
}

// Stat walks the tree (every node: slow on a large tree).
func (t *Tree) Stat(ctx context.Context) (Stat, error) {
	var s Stat
	err := t.c.call(ctx, read, t.name, func(ctx context.Context, tc pb.TreeServiceClient) error {
		r, err := tc.Stat(ctx, &pb.TreeStatRequest{Tree: t.name})
		if err != nil {
			return err
		}
		s = Stat{TreeInfo: TreeInfo{Name: r.Tree.GetName(), NodeSize: r.Tree.GetNodeSize(), Fanout: r.Tree.GetFanout()},
			Height: uint64(r.Height), Nodes: r.Nodes, Keys: r.Keys, CacheHits: r.CacheHits, CacheMisses: r.CacheMisses}
		return nil
	})
	return s, err
}
