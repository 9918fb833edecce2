package btree

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/chunk"
	"github.com/grovestore/grove/internal/lock"
	"github.com/grovestore/grove/internal/meta"
	"github.com/grovestore/grove/internal/metrics"
	"github.com/grovestore/grove/internal/rldev"
	"github.com/grovestore/grove/internal/treecall"
)

// Service is a node's B-tree role: in each incarnation of the node it runs
// the node's B-tree server and answers the TreeService's calls with it. The
// server starts when the incarnation starts if any tree exists (so that it
// is there to run recoveries), or at the first call otherwise.
type Service struct {
	pb.UnimplementedTreeServiceServer
	cfg ServiceConfig
	log *slog.Logger
	// book is the registered nodes (a watch on the membership; nil
	// without a config service), for each tree's home: its repairer
	// (ServerConfig.Repairer).
	book      *meta.AddressBook
	closeBook sync.Once
	// served counts the tree operations (Put, Get, Delete, Scan, Count)
	// this node's server carried out.
	served atomic.Uint64
	// runs counts the incarnations' run loops: Close waits for them, so
	// that a server that finished starting as the node closed is closed
	// before the process exits.
	runs sync.WaitGroup
	// testAfterStart, testLateStop: tests' hooks (a server started, before
	// run looks whether its incarnation is still on; run stopped a server
	// that finished starting after its incarnation ended, cleanly or not).
	testAfterStart atomic.Pointer[func(*Server)]
	testLateStop   atomic.Pointer[func(clean bool, err error)]
	mu             struct {
		sync.Mutex
		inc     uint64
		ctx     context.Context // the incarnation's: ends with it
		cancel  context.CancelFunc
		started bool          // the incarnation's server is starting or running
		srv     *Server       // once running
		ready   chan struct{} // closed once srv is set
		gone    chan struct{} // closed when the incarnation's server stops (stopLocked)
		// startErr is why the incarnation's server's last start failed
		// (it retries): calls that give up waiting say it.
		startErr error
		closed   bool
		// closing ends the clean close of the incarnation's server in
		// progress (Close), if any: a fence of that incarnation calls
		// it, since a fenced server's leases are gone and nothing it
		// still writes back can be accepted (its log is replayed by
		// another server), so the close would only wait out its
		// deadline for peers that may be gone too (a whole cluster
		// stopping at once).
		closing context.CancelFunc
		// closeCtx is Close's context (nil before Close): the clean close
		// of a server that finishes starting during it runs under it, so
		// that it has Close's deadline and a fence ends it too.
		closeCtx context.Context
		// lastResign is when the node last gave an incarnation up for
		// its B-tree server's failure.
		lastResign time.Time
	}
}

// ServiceConfig wires a node's B-tree role.
type ServiceConfig struct {
	Node   uint64
	Meta   *meta.Client
	Locks  *lock.Service
	Chunks *chunk.Clerk
	RLDev  *rldev.Clerk
	Log    *slog.Logger
	// Server is the rest of each incarnation's server's configuration.
	Server ServerConfig
	// Silent, if set, reports whether node has been silent past the
	// failure detector's grace period (a hint, not a verdict): a tree whose
	// home is silent is repaired by its next home meanwhile.
	Silent func(node uint64) bool
	// OnFail is called (once per incarnation) when the incarnation's
	// server fails while its leases still stand: its log failed, or a
	// write-back was fenced out. The server can neither go on nor give
	// its leases back (its dirty nodes are only in its log), so the node
	// gives incarnation inc up (fd.Driver.Resign): the lock service then
	// recovers the log on another server, and the next incarnation starts
	// a new server.
	OnFail func(inc uint64, err error)
	// TokensOn, if set, replaces the check that every registered node
	// keeps completion records (FeatureDone) and reads floors
	// (FeatureFloors), for tests.
	TokensOn func() bool
}

// NewService returns the role; Start runs it in an incarnation.
func NewService(cfg ServiceConfig) *Service {
	s := &Service{cfg: cfg, log: cfg.Log}
	if s.log == nil {
		s.log = slog.Default()
	}
	if cfg.Meta != nil {
		s.book = meta.NewAddressBook(cfg.Meta)
	}
	s.registerMetrics(cfg.Server.Metrics)
	return s
}

// registerMetrics exports the running server's cache counters, read at
// scrape time (they start again from zero with each server the node runs:
// a counter reset, to Prometheus).
func (s *Service) registerMetrics(m *metrics.Node) {
	if m == nil {
		return
	}
	for _, c := range []struct {
		event string
		get   func(CacheStats) uint64
	}{
		{"hit", func(st CacheStats) uint64 { return st.Hits }},
		{"miss", func(st CacheStats) uint64 { return st.Misses }},
		{"load", func(st CacheStats) uint64 { return st.Loads }},
		{"write_back", func(st CacheStats) uint64 { return st.WriteBacks }},
		{"revocation", func(st CacheStats) uint64 { return st.Revocations }},
		{"eviction", func(st CacheStats) uint64 { return st.Evictions }},
		{"delta", func(st CacheStats) uint64 { return st.Deltas }},
		{"race_image", func(st CacheStats) uint64 { return st.RaceImages }},
	} {
		m.CounterFunc("grove_btree_cache_events_total", "Events of this node's B-tree server's node cache, by kind: hits and misses of lookups, loads of nodes from chunks, write-backs, leases revoked, evictions, node changes logged as deltas, whole images logged after a delta a write-back snapshot raced.",
			map[string]string{"event": c.event}, s.ofServer(func(srv *Server) uint64 { return c.get(srv.cache.Stats()) }))
	}
	for _, c := range []struct {
		event string
		get   func(*TokenCounters) uint64
	}{
		{"repeat", func(tc *TokenCounters) uint64 { return tc.Repeats.Load() }},
		{"refused_old", func(tc *TokenCounters) uint64 { return tc.RefusedOld.Load() }},
		{"refused_future", func(tc *TokenCounters) uint64 { return tc.RefusedFuture.Load() }},
		{"refused_horizon", func(tc *TokenCounters) uint64 { return tc.RefusedHorizon.Load() }},
		{"refused_floor", func(tc *TokenCounters) uint64 { return tc.RefusedFloor.Load() }},
		{"record_aged", func(tc *TokenCounters) uint64 { return tc.RecordsDropped.Load() }},
		{"record_evicted", func(tc *TokenCounters) uint64 { return tc.RecordsEvicted.Load() }},
		{"record_floored", func(tc *TokenCounters) uint64 { return tc.RecordsFloored.Load() }},
	} {
		m.CounterFunc("grove_btree_token_events_total", "Events of tokened writes (completion records) in this node's B-tree server's trees, by kind: answers from a record (a resend of a write that took effect), attempts refused past the token window, stamped in the future, at or below a leaf's horizon (records evicted for room) or below their client's floor, records dropped for age, evicted for room (a resend of such a write then ends with an unknown outcome), dropped below a floor.",
			map[string]string{"event": c.event}, s.ofServer(func(srv *Server) uint64 { return c.get(&srv.tokens) }))
	}
}

// ofServer is a metric read from the incarnation's server at scrape time
// (0 while none runs).
func (s *Service) ofServer(get func(*Server) uint64) func() float64 {
	return func() float64 {
		s.mu.Lock()
		srv := s.mu.srv
		s.mu.Unlock()
		if srv == nil {
			return 0
		}
		return float64(get(srv))
	}
}

// repairer reports whether this node is tree name's home over the nodes
// registered now, so its repairer (ServerConfig.Repairer); or, while the
// home is silent (ServiceConfig.Silent), its next home: the home over the
// other nodes. A tree no server has open would otherwise wait for its home
// to come back (the other servers' backstop walks only the trees they have
// open). Two nodes that disagree about the home's silence both repair:
// harmless (Repair takes the node locks), only extra reads. With no node
// known yet, every server is a repairer.
func (s *Service) repairer(name string) bool {
	nodes := s.book.Nodes()
	if len(nodes) == 0 {
		return true
	}
	ids := make([]uint64, 0, len(nodes))
	for id := range nodes {
		ids = append(ids, id)
	}
	return repairerOf(name, ids, s.cfg.Node, s.cfg.Silent)
}

// repairerOf: whether self repairs tree name among nodes (Service.repairer).
func repairerOf(name string, nodes []uint64, self uint64, silent func(uint64) bool) bool {
	home := Home(name, nodes)
	if home == self {
		return true
	}
	if silent == nil || !silent(home) {
		return false
	}
	rest := make([]uint64, 0, len(nodes))
	for _, id := range nodes {
		if id != home {
			rest = append(rest, id)
		}
	}
	return Home(name, rest) == self
}

// Start runs the role in incarnation inc.
func (s *Service) Start(inc uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.closed || s.mu.inc == inc {
		return
	}
	s.stopLocked()
	s.mu.inc = inc
	s.mu.ctx, s.mu.cancel = context.WithCancel(context.Background())
	s.mu.ready, s.mu.gone, s.mu.started, s.mu.startErr = make(chan struct{}), make(chan struct{}), false, nil
	ctx, ready := s.mu.ctx, s.mu.ready
	go func() {
		// Start at once if there are trees: this server may have to
		// recover a dead one's log. Otherwise start as soon as the first
		// tree appears (or at the first call, whichever is first), so
		// that the first calls through this node do not wait for its log
		// to be made. The directory is watched, not polled: an idle
		// cluster without trees costs the config service nothing.
		wctx, stop := context.WithCancel(ctx)
		defer stop()
		watch := s.cfg.Meta.Watch(wctx, Namespace, 0)
		for {
			select {
			case <-ready:
				return // started by a call
			case ns, ok := <-watch:
				if !ok {
					return // the incarnation ended
				}
				if ts, terr := Trees(ns); terr != nil || len(ts) > 0 || len(pendingDrops(ns)) > 0 {
					s.launch(inc)
					return
				}
			}
		}
	}()
}

// launch starts incarnation inc's server unless it is starting or running.
func (s *Service) launch(inc uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.inc != inc || s.mu.started || s.mu.cancel == nil {
		return
	}
	s.mu.started = true
	s.runs.Add(1)
	go s.run(s.mu.ctx, inc, s.mu.ready)
}

func (s *Service) run(ctx context.Context, inc uint64, ready chan struct{}) {
	defer s.runs.Done()
	cfg := s.cfg.Server
	cfg.Node, cfg.Meta, cfg.Locks, cfg.Chunks, cfg.RLDev, cfg.Log = s.cfg.Node, s.cfg.Meta, s.cfg.Locks, s.cfg.Chunks, s.cfg.RLDev, s.log
	if s.book != nil && cfg.Repairer == nil {
		cfg.Repairer = s.repairer
	}
	for attempt := 0; ctx.Err() == nil; attempt++ {
		srv, err := StartServer(ctx, cfg)
		if err == nil {
			if f := s.testAfterStart.Load(); f != nil {
				(*f)(srv)
			}
			s.mu.Lock()
			if s.mu.inc != inc || s.mu.closed || ctx.Err() != nil {
				s.stopLate(srv, s.mu.closed && s.mu.inc == inc, s.mu.closeCtx)
				return
			}
			s.mu.srv = srv
			close(ready)
			s.mu.Unlock()
			s.watch(ctx, inc, srv)
			return
		}
		if ctx.Err() == nil {
			s.mu.Lock()
			if s.mu.inc == inc {
				s.mu.startErr = err
			}
			s.mu.Unlock()
			s.log.Warn("starting the B-tree server failed; retrying", "err", err, "attempt", attempt)
			select {
			case <-ctx.Done():
			case <-time.After(min(time.Duration(attempt+1)*500*time.Millisecond, 5*time.Second)):
			}
		}
	}
}

// stopLate stops srv, a server that finished starting after its
// incarnation ended (s.mu held; it unlocks). After Close of a live
// incarnation (closing, with closeCtx), srv closes cleanly under Close's
// context: Close waits for it (runs), its deadline bounds it, and a fence
// of the incarnation ends it (closing). Otherwise the incarnation was
// fenced, replaced, or crashed: srv's leases are gone (or must not be
// given back, after Crash), and it stops as stopLocked stops a running
// server, leaving its log to a recovery.
func (s *Service) stopLate(srv *Server, closing bool, closeCtx context.Context) {
	s.mu.Unlock()
	clean := closing && closeCtx != nil
	var err error
	if clean {
		s.log.Info("closing the B-tree server that finished starting as the node closed")
		if err = srv.Close(closeCtx); err != nil {
			s.log.Warn("closing the B-tree server that finished starting as the node closed", "err", err)
		}
	} else {
		srv.cache.Close()
		srv.stop()
	}
	if f := s.testLateStop.Load(); f != nil {
		(*f)(clean, err)
	}
}

// watch waits for the incarnation's end or its server's failure; a failure
// with the leases still standing gives the incarnation up (OnFail).
func (s *Service) watch(ctx context.Context, inc uint64, srv *Server) {
	tk := time.NewTicker(250 * time.Millisecond)
	defer tk.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tk.C:
		}
		err := srv.Err()
		// ctx ends before the server closes (stopLocked, Close), and a
		// cache whose leases are lost is on a node that fences itself.
		if err == nil || ctx.Err() != nil || srv.cache.lost() {
			continue
		}
		// A fault that outlives incarnations would take the node down
		// again and again (every role restarts with it): at most one
		// resignation a minute.
		s.mu.Lock()
		wait := time.Until(s.mu.lastResign.Add(time.Minute))
		s.mu.Unlock()
		if wait > 0 {
			s.log.Error("the B-tree server failed again within a minute of the last resignation: waiting before giving this incarnation up", "incarnation", inc, "wait", wait.Round(time.Second), "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
		}
		s.log.Error("the B-tree server failed with its leases standing: the node gives its incarnation up, so that another server recovers its log", "incarnation", inc, "err", err)
		s.mu.Lock()
		s.mu.lastResign = time.Now()
		s.mu.Unlock()
		if s.cfg.OnFail != nil {
			s.cfg.OnFail(inc, err)
		}
		return
	}
}

// Fence ends incarnation inc: its server's leases are gone (its cache
// stopped serving when they were lost).
func (s *Service) Fence(inc uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.inc == inc {
		s.stopLocked()
		if s.mu.closing != nil {
			s.mu.closing()
		}
	}
}

func (s *Service) stopLocked() {
	if s.mu.cancel != nil {
		s.mu.cancel()
		s.mu.cancel = nil
		close(s.mu.gone) // callers waiting for this incarnation's server look again
	}
	if srv := s.mu.srv; srv != nil {
		srv.cache.Close()
		srv.stop()
	}
	s.mu.srv = nil
}

// Close stops the role, closing the server cleanly (its dirty nodes
// written back and its leases given back).
func (s *Service) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s.mu.Lock()
	s.mu.closed = true
	srv := s.mu.srv
	s.mu.srv = nil
	s.mu.closing = cancel
	if s.mu.cancel != nil {
		s.mu.cancel()
		s.mu.cancel = nil
		close(s.mu.gone)
		// Only a live incarnation's late server closes cleanly: after a
		// Crash or a fence (cancel already nil) it stops as fenced
		// (stopLate).
		s.mu.closeCtx = ctx
	}
	s.mu.Unlock()
	if srv != nil {
		if err := srv.Close(ctx); err != nil {
			if errors.Is(ctx.Err(), context.Canceled) {
				err = fmt.Errorf("the node fenced itself while its B-tree server closed (its leases are gone; its log is replayed elsewhere): %w", err)
			}
			s.log.Warn("closing the B-tree server", "err", err)
		}
	}
	// A server still starting is closed by its run loop (stopLate), under
	// ctx: wait for it, as long as ctx lasts.
	runs := make(chan struct{})
	go func() {
		s.runs.Wait()
		close(runs)
	}()
	select {
	case <-runs:
	case <-ctx.Done():
		s.log.Warn("a B-tree server still starting or closing when the node's close ended", "err", ctx.Err())
	}
	if s.book != nil {
		s.closeBook.Do(s.book.Close)
	}
}

// Crash stops the role as a crash would: the server's cache stops at once,
// nothing is written back, no lease is given back (tests that kill a node
// in-process; recovery replays the log once the node is declared dead).
func (s *Service) Crash() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mu.closed = true
	s.stopLocked()
}

// Reasons of the service's errors (ErrorInfo, domain "grove"): the rules
// clients go on by are package treecall's, and these its names.
const (
	// NotApplied: the call changed nothing; it was refused before it
	// started (the node's B-tree server is not running). A client may
	// retry a write that failed so elsewhere; any other failure of a
	// write leaves its outcome unknown.
	NotApplied = treecall.NotApplied
	// TokensOff: not every registered node's build keeps completion
	// records (FeatureDone) yet: the client sends the write untokened.
	TokensOff = treecall.TokensOff
	// TokenExpired: ErrTokenExpired (the attempt came too late, or its
	// record was evicted: it did nothing; the write did nothing if no
	// other attempt of it was sent).
	TokenExpired = treecall.TokenExpired
	// TreeChanged: the token's tree is not the one under its name now
	// (ErrTreeChanged).
	TreeChanged = treecall.TreeChanged
)

func notApplied(code codes.Code, msg string) error { return NotAppliedError(code, msg) }

// FeatureDone, in a node's membership record, says that its build keeps
// completion records (format version 2 leaves): tokened writes are served
// only once every registered node says it, since a build from before
// reads no version 2 leaf. A node of such a build must not join after.
const FeatureDone = "btree.completion-records"

// FeatureFloors, in a node's membership record, says that its build reads
// floors in leaves (completion.go): a token's floor is applied only once
// every registered node says it (a build from before refuses a leaf with
// one as undecodable), and ignored before. A node of such a build must not
// join after.
const FeatureFloors = "btree.completion-floors"

// ReasonError is a gRPC error of code carrying reason.
func ReasonError(code codes.Code, msg, reason string) error {
	return treecall.ReasonError(code, msg, reason)
}

// HasReason reports whether st carries reason.
func HasReason(st *status.Status, reason string) bool { return treecall.HasReason(st, reason) }

// NotAppliedError is a gRPC error of code that carries the NotApplied
// reason.
func NotAppliedError(code codes.Code, msg string) error { return treecall.NotAppliedError(code, msg) }

// IsNotApplied reports whether st carries the NotApplied reason.
func IsNotApplied(st *status.Status) bool { return treecall.IsNotApplied(st) }

// Server returns the running server, starting it if need be, waiting for
// it until ctx ends. A wait whose incarnation ends looks again: it goes on
// with the next incarnation's server if that incarnation has begun, and
// otherwise fails at once, not applied (the node is out of the cluster,
// perhaps for long: the caller moves on to another node).
func (s *Service) Server(ctx context.Context) (*Server, error) {
	// The wait for a starting server is bounded by one operation's time,
	// whatever the caller's deadline (review 55: a call with none, as an
	// etcd client's context.Background(), waited for as long as a start
	// that kept failing).
	ctx, cancel := context.WithTimeout(ctx, s.opTimeout())
	defer cancel()
	for {
		s.mu.Lock()
		if s.mu.closed {
			s.mu.Unlock()
			return nil, notApplied(codes.Unavailable, "btree: this node is shutting down")
		}
		if srv := s.mu.srv; srv != nil {
			s.mu.Unlock()
			return srv, nil
		}
		inc, ready, gone, live := s.mu.inc, s.mu.ready, s.mu.gone, s.mu.cancel != nil
		s.mu.Unlock()
		if !live {
			return nil, notApplied(codes.Unavailable, "btree: this node is not in the cluster now (joining, or between incarnations)")
		}
		s.launch(inc)
		select {
		case <-ready:
		case <-gone:
			// The incarnation ended before its server was ready: look
			// again (a next incarnation may be starting its own).
			select {
			case <-ctx.Done():
				return nil, notApplied(codes.Unavailable, "btree: this node's B-tree server stopped before it was ready (the node left its incarnation)")
			case <-time.After(50 * time.Millisecond):
			}
			continue
		case <-ctx.Done():
			s.mu.Lock()
			serr := s.mu.startErr
			s.mu.Unlock()
			if serr != nil {
				return nil, notApplied(codes.Unavailable, "btree: this node's B-tree server cannot start (it keeps trying): "+serr.Error())
			}
			return nil, notApplied(codes.Unavailable, "btree: this node's B-tree server is still starting (making or recovering its log, or waiting for a dead server's recovery)")
		}
		s.mu.Lock()
		srv := s.mu.srv
		s.mu.Unlock()
		if srv == nil {
			continue // stopped since (the incarnation ended): look again
		}
		return srv, nil
	}
}

// rpcError maps the tree's errors to gRPC codes. Only a status made in
// this package passes as it is: a lower layer's status wrapped in an error
// (a chunk clerk's last attempt) is not an answer to this call, and its
// code says nothing of this call's outcome.
func rpcError(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := err.(interface{ GRPCStatus() *status.Status }); ok {
		return err
	}
	switch {
	case errors.Is(err, ErrNoTree):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, ErrTreeExists):
		return status.Error(codes.AlreadyExists, err.Error())
	case errors.Is(err, ErrKey), errors.Is(err, ErrTooLarge), errors.Is(err, ErrBadRange), errors.Is(err, ErrBadName), errors.Is(err, ErrBadConfig):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, ErrRangeTooLarge):
		return status.Error(codes.OutOfRange, err.Error())
	case errors.Is(err, ErrTokenReused):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, ErrTokenExpired):
		return ReasonError(codes.FailedPrecondition, err.Error(), TokenExpired)
	case errors.Is(err, ErrTreeChanged):
		return ReasonError(codes.FailedPrecondition, err.Error(), TreeChanged)
	}
	// Anything else failed mid-way: its outcome is unknown (Unknown, not
	// Unavailable, which a client may retry elsewhere as "not done"),
	// unless it is marked as refused before any change.
	code, msg := codes.Unknown, err.Error()
	switch {
	case errors.Is(err, chunk.ErrFull) || errors.Is(err, chunk.ErrMapFull):
		// A split found no room for its new node (the allocation comes
		// before the split's commit: marked).
		code, msg = codes.ResourceExhausted, "btree: the chunk store is full: "+msg
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	case errors.Is(err, ErrNotApplied), errors.Is(err, ErrLeaseExpired):
		code = codes.Unavailable
	}
	if errors.Is(err, ErrNotApplied) {
		return notApplied(code, msg)
	}
	return status.Error(code, msg)
}

func treeInfo(e TreeEntry) *pb.TreeInfo {
	return &pb.TreeInfo{Name: e.Name, AnchorCm: e.Anchor.CM, AnchorId: e.Anchor.ID, NodeSize: uint32(e.NodeSize), Fanout: uint32(e.MaxFanout)}
}

// open finds the server and tree of a call.
func (s *Service) open(ctx context.Context, name string) (*Server, *Tree, error) {
	srv, err := s.Server(ctx)
	if err != nil {
		return nil, nil, err
	}
	octx, cancel := srv.OpContext(ctx) // (the directory's read, if the tree is not open)
	defer cancel()
	t, err := srv.Open(octx, name)
	if err != nil {
		if errors.Is(err, ErrNoTree) || errors.Is(err, ErrBadName) {
			return nil, nil, rpcError(err)
		}
		// Opening only reads the tree directory: nothing changed.
		return nil, nil, notApplied(codes.Unavailable, err.Error())
	}
	return srv, t, nil
}

// done maps an operation's error, forgetting a tree found dropped (and
// settling a drop cut off between its steps: the directory may still list
// it).
func done(srv *Server, name string, err error) error {
	if errors.Is(err, ErrNoTree) {
		srv.Forget(name)
		if _, busy := srv.settling.LoadOrStore(name, true); !busy {
			go func() {
				defer srv.settling.Delete(name)
				ctx, cancel := context.WithTimeout(srv.ctx, 30*time.Second)
				defer cancel()
				_ = srv.SettleDrop(ctx, name) // (if it fails, the next touch tries again)
			}()
		}
	}
	return rpcError(err)
}

func (s *Service) Create(ctx context.Context, r *pb.TreeCreateRequest) (*pb.TreeCreateResponse, error) {
	srv, err := s.Server(ctx)
	if err != nil {
		return nil, err
	}
	e, err := srv.CreateTree(ctx, r.Name, Config{NodeSize: int(r.NodeSize), MaxFanout: int(r.Fanout)})
	if err != nil {
		return nil, rpcError(err)
	}
	return &pb.TreeCreateResponse{Tree: treeInfo(e)}, nil
}

// Served counts the tree operations (Put, Get, Delete, Scan, Count) this
// node's server carried out, in every incarnation.
func (s *Service) Served() uint64 { return s.served.Load() }

// Nodes lists the registered nodes and their gRPC addresses, for clients
// that send each tree's calls to its home (client.Options.NoRouting).
func (s *Service) Nodes(ctx context.Context, r *pb.TreeNodesRequest) (*pb.TreeNodesResponse, error) {
	out := &pb.TreeNodesResponse{}
	if s.book == nil {
		return out, nil
	}
	for id, addr := range s.book.Nodes() {
		out.Nodes = append(out.Nodes, &pb.TreeNode{Id: id, Addr: addr})
	}
	sort.Slice(out.Nodes, func(i, j int) bool { return out.Nodes[i].Id < out.Nodes[j].Id })
	return out, nil
}

func (s *Service) List(ctx context.Context, r *pb.TreeListRequest) (*pb.TreeListResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opTimeout())
	defer cancel()
	ts, unreadable, err := ListTrees(ctx, s.cfg.Meta)
	if err != nil {
		return nil, rpcError(err)
	}
	out := &pb.TreeListResponse{Unreadable: unreadable}
	for _, e := range ts {
		out.Trees = append(out.Trees, treeInfo(e))
	}
	return out, nil
}

func (s *Service) Drop(ctx context.Context, r *pb.TreeDropRequest) (*pb.TreeDropResponse, error) {
	srv, err := s.Server(ctx)
	if err != nil {
		return nil, err
	}
	if err := srv.DropTree(ctx, r.Name); err != nil {
		return nil, rpcError(err)
	}
	return &pb.TreeDropResponse{}, nil
}

func cond(c pb.TreeCond, expect []byte) Cond {
	return Cond{Kind: CondKind(c), Value: expect}
}

// onTree runs op on tree name through this node's server. A tree known by
// its name but found dropped (ErrNoTree: checked before any change) is
// forgotten and looked up again, once: the name may be a new tree's.
func (s *Service) onTree(ctx context.Context, name string, op func(ctx context.Context, t *Tree) error) error {
	s.served.Add(1)
	for attempt := 0; ; attempt++ {
		srv, t, err := s.open(ctx, name)
		if err != nil {
			return err
		}
		octx, cancel := srv.OpContext(ctx)
		err = op(octx, t)
		cancel()
		if err == nil {
			return nil
		}
		if attempt == 0 && (errors.Is(err, ErrNoTree) || errors.Is(err, ErrTreeChanged)) {
			// (A token's tree other than the one open here: this
			// server's may be the one dropped; the directory says.)
			srv.Forget(name)
			continue
		}
		return done(srv, name, err)
	}
}

func (s *Service) Put(ctx context.Context, r *pb.TreePutRequest) (*pb.TreePutResponse, error) {
	if r.Token != nil {
		return nil, status.Error(codes.InvalidArgument, "btree: a tokened put goes to PutOnce")
	}
	return s.put(ctx, r, nil)
}

// PutOnce is Put with the request's write token (completion.go).
func (s *Service) PutOnce(ctx context.Context, r *pb.TreePutRequest) (*pb.TreePutResponse, error) {
	tok, err := s.writeToken(r.Token)
	if err != nil {
		return nil, err
	}
	return s.put(ctx, r, tok)
}

func (s *Service) put(ctx context.Context, r *pb.TreePutRequest, tok *WriteToken) (*pb.TreePutResponse, error) {
	if r.Cond > pb.TreeCond_TREE_COND_IF_EXISTS {
		return nil, status.Errorf(codes.InvalidArgument, "btree: unknown condition %d", r.Cond)
	}
	var res Result
	err := s.onTree(ctx, r.Tree, func(ctx context.Context, t *Tree) (err error) {
		res, err = t.PutOnce(ctx, r.Key, r.Value, cond(r.Cond, r.Expect), tok)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &pb.TreePutResponse{Applied: res.Applied, Found: res.Found, Prev: res.Prev, Repeat: res.Repeat}, nil
}

// writeToken checks a tokened write's token, and that tokens are on.
func (s *Service) writeToken(t *pb.TreeWriteToken) (*WriteToken, error) {
	if t == nil || len(t.Client) != 16 || t.Seq == 0 || t.Attempt == 0 || t.Stamp <= 0 {
		return nil, status.Error(codes.InvalidArgument, "btree: a tokened write needs a token: a 16-byte client id, a sequence number, an attempt number and a stamp, none zero")
	}
	if !s.tokensOn() {
		return nil, ReasonError(codes.FailedPrecondition, "btree: tokened writes are off until every registered node runs a build that keeps their records", TokensOff)
	}
	if t.Floor > t.Seq {
		return nil, status.Errorf(codes.InvalidArgument, "%v (%d > %d)", ErrTokenFloor, t.Floor, t.Seq)
	}
	tok := &WriteToken{Seq: t.Seq, Attempt: t.Attempt, Stamp: t.Stamp, Tree: Handle{CM: t.TreeCm, ID: t.TreeId}}
	if s.floorsOn() {
		tok.Floor = t.Floor
	}
	copy(tok.Client[:], t.Client)
	return tok, nil
}

// Lookup answers one tree's directory entry: what a client sends in its
// write tokens (pb.TreeWriteToken.tree_cm, tree_id).
func (s *Service) Lookup(ctx context.Context, r *pb.TreeLookupRequest) (*pb.TreeLookupResponse, error) {
	if err := CheckTreeName(r.Name); err != nil {
		return nil, rpcError(err)
	}
	ctx, cancel := context.WithTimeout(ctx, s.opTimeout())
	defer cancel()
	e, err := LookupTree(ctx, s.cfg.Meta, r.Name)
	if err != nil {
		if errors.Is(err, ErrNoTree) {
			return nil, rpcError(err)
		}
		return nil, notApplied(codes.Unavailable, err.Error()) // (a read)
	}
	return &pb.TreeLookupResponse{Tree: treeInfo(e)}, nil
}

// LookupAnchor looks tree name up through tc, for a write token's first
// attempt (pb.TreeWriteToken.tree_cm, tree_id): the Go client's and the
// CLI's one way to. old says the node is of a build from before Lookup
// (the token then names no tree). A failure is the tree's absence
// (NotFound), a bad name, or a failure marked not applied: nothing was
// sent, the write may go to another node.
func LookupAnchor(ctx context.Context, tc pb.TreeServiceClient, name string) (a Handle, old bool, err error) {
	r, err := tc.Lookup(ctx, &pb.TreeLookupRequest{Name: name})
	if err != nil {
		st := status.Convert(err)
		switch {
		case st.Code() == codes.Unimplemented:
			return Handle{}, true, nil
		case st.Code() == codes.NotFound || st.Code() == codes.InvalidArgument || IsNotApplied(st):
			return Handle{}, false, err
		}
		return Handle{}, false, NotAppliedError(codes.Unavailable, "looking the tree up before the write: "+st.Message())
	}
	return Handle{CM: r.Tree.GetAnchorCm(), ID: r.Tree.GetAnchorId()}, false, nil
}

// opTimeout is the servers' operation timeout (ServerConfig.OpTimeout).
func (s *Service) opTimeout() time.Duration {
	if d := s.cfg.Server.OpTimeout; d > 0 {
		return d
	}
	return defaultOpTimeout
}

// floorsOn: every registered node reads floors (FeatureFloors).
func (s *Service) floorsOn() bool {
	if s.cfg.TokensOn != nil {
		return s.cfg.TokensOn()
	}
	return s.book != nil && s.book.All(FeatureFloors)
}

// SendPut sends req as PutOnce when it carries a write token, as Put
// otherwise (a build from before tokens answers PutOnce Unimplemented,
// and would ignore a token sent to Put): the Go client's and the CLI's
// one way to send a put.
func SendPut(ctx context.Context, tc pb.TreeServiceClient, req *pb.TreePutRequest) (*pb.TreePutResponse, error) {
	if req.Token != nil {
		return tc.PutOnce(ctx, req)
	}
	return tc.Put(ctx, req)
}

// SendDelete is SendPut's delete: DeleteOnce under a token, Delete
// otherwise.
func SendDelete(ctx context.Context, tc pb.TreeServiceClient, req *pb.TreeDeleteRequest) (*pb.TreeDeleteResponse, error) {
	if req.Token != nil {
		return tc.DeleteOnce(ctx, req)
	}
	return tc.Delete(ctx, req)
}

// tokensOn: every registered node keeps completion records (FeatureDone).
func (s *Service) tokensOn() bool {
	if s.cfg.TokensOn != nil {
		return s.cfg.TokensOn()
	}
	return s.book != nil && s.book.All(FeatureDone)
}

func (s *Service) Get(ctx context.Context, r *pb.TreeGetRequest) (*pb.TreeGetResponse, error) {
	var v []byte
	var ok bool
	err := s.onTree(ctx, r.Tree, func(ctx context.Context, t *Tree) (err error) {
		v, ok, err = t.Get(ctx, r.Key)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &pb.TreeGetResponse{Found: ok, Value: v}, nil
}

func (s *Service) Delete(ctx context.Context, r *pb.TreeDeleteRequest) (*pb.TreeDeleteResponse, error) {
	if r.Token != nil {
		return nil, status.Error(codes.InvalidArgument, "btree: a tokened delete goes to DeleteOnce")
	}
	return s.del(ctx, r, nil)
}

// DeleteOnce is Delete with the request's write token (completion.go).
func (s *Service) DeleteOnce(ctx context.Context, r *pb.TreeDeleteRequest) (*pb.TreeDeleteResponse, error) {
	tok, err := s.writeToken(r.Token)
	if err != nil {
		return nil, err
	}
	return s.del(ctx, r, tok)
}

func (s *Service) del(ctx context.Context, r *pb.TreeDeleteRequest, tok *WriteToken) (*pb.TreeDeleteResponse, error) {
	if r.Cond != pb.TreeCond_TREE_COND_ALWAYS && r.Cond != pb.TreeCond_TREE_COND_IF_EQUALS && r.Cond != pb.TreeCond_TREE_COND_IF_EXISTS {
		return nil, status.Error(codes.InvalidArgument, "btree: a delete's condition is always, if-equals or if-exists")
	}
	var res Result
	err := s.onTree(ctx, r.Tree, func(ctx context.Context, t *Tree) (err error) {
		res, err = t.DeleteOnce(ctx, r.Key, cond(r.Cond, r.Expect), tok)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &pb.TreeDeleteResponse{Applied: res.Applied, Found: res.Found, Prev: res.Prev, Repeat: res.Repeat}, nil
}

func span(from, to []byte, hasTo bool) Span {
	sp := Span{From: from}
	if hasTo {
		sp.To = to
		if sp.To == nil {
			sp.To = []byte{}
		}
	}
	return sp
}

func (s *Service) Scan(ctx context.Context, r *pb.TreeScanRequest) (*pb.TreeScanResponse, error) {
	var pg Page
	err := s.onTree(ctx, r.Tree, func(ctx context.Context, t *Tree) (err error) {
		if r.KeysOnly {
			pg, err = t.ScanKeys(ctx, span(r.From, r.To, r.HasTo), int(r.Limit), r.Reverse)
		} else {
			pg, err = t.Scan(ctx, span(r.From, r.To, r.HasTo), int(r.Limit), r.Reverse)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	out := &pb.TreeScanResponse{Keys: pg.Keys, Lo: pg.Lo, Hi: pg.Hi, HiUnbounded: pg.Hi == nil, More: pg.More}
	if !r.KeysOnly {
		out.Values = pg.Vals
	}
	return out, nil
}

func (s *Service) Count(ctx context.Context, r *pb.TreeCountRequest) (*pb.TreeCountResponse, error) {
	var n int
	err := s.onTree(ctx, r.Tree, func(ctx context.Context, t *Tree) (err error) {
		n, err = t.Count(ctx, span(r.From, r.To, r.HasTo))
		return err
	})
	if err != nil {
		return nil, err
	}
	return &pb.TreeCountResponse{Count: uint64(n)}, nil
}

func (s *Service) Stat(ctx context.Context, r *pb.TreeStatRequest) (*pb.TreeStatResponse, error) {
	// A walk of the whole tree: ten operations' time at most.
	ctx, cancel := context.WithTimeout(ctx, 10*s.opTimeout())
	defer cancel()
	srv, err := s.Server(ctx)
	if err != nil {
		return nil, err
	}
	e, err := LookupTree(ctx, s.cfg.Meta, r.Tree)
	if err != nil {
		return nil, rpcError(err)
	}
	if _, err := srv.Open(ctx, r.Tree); err != nil {
		return nil, rpcError(err)
	}
	// The walk reads node after node of a live tree, with the checks of a
	// quiescent one: a split, merge or rebalance between two of its reads
	// can make it see a key twice or a chain change under it. Such a walk
	// is tried again (a few times), not reported as the tree's fault.
	var sh Shape
	for attempt := 0; ; attempt++ {
		sh, err = WalkStructure(ctx, srv.cache.Store(e.Anchor, e.NodeSize, nil), false)
		if err == nil || attempt == 4 || ctx.Err() != nil || errors.Is(err, ErrNoTree) {
			break
		}
	}
	if err != nil {
		return nil, rpcError(err)
	}
	st := srv.cache.Stats()
	return &pb.TreeStatResponse{Tree: treeInfo(e), Height: uint32(sh.Height), Nodes: uint64(sh.Nodes), Keys: uint64(len(sh.Keys)),
		Removed: uint64(sh.Removed), MissingDownlinks: uint64(sh.Missing), ValueChunks: uint64(sh.Values), CacheHits: st.Hits, CacheMisses: st.Misses,
		WriteBacks: st.WriteBacks, Revocations: st.Revocations, Node: uint32(s.cfg.Node), PooledChunks: uint64(srv.cache.Pooled()),
		FenceRenewals: st.Renews, StrayChunks: st.Strays}, nil
}
