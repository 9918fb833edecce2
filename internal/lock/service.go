package lock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/meta"
	"github.com/grovestore/grove/internal/transport"
)

// Namespace is the lock service's namespace in the config service:
//
//	master            LockMasterRecord: who is master, in which epoch
//	clerk/<id>        LockClerkRecord: the clerk list
//	recovery/<id>     LockRecoveryRecord: pending recovery obligations
const Namespace = "lock"

// Detector is the failure-detector service as the lock service uses it:
// whether a node incarnation is dead (a majority of observers say so; final).
type Detector interface {
	Dead(ctx context.Context, node, inc uint64) (bool, error)
}

// Liveness is the node's own view of itself (the self-fence): every
// lease-protected action checks it against the clock first.
type Liveness interface{ Alive() bool }

// RecoveryFunc recovers the state a dead clerk of the same kind left behind
// (for example, replays its write-ahead log). It must be idempotent: it may
// run more than once for one dead clerk. all means the dead clerk's leases
// are unknown (names is then empty).
type RecoveryFunc func(ctx context.Context, dead ClerkID, names []string, all bool) error

// ServiceConfig wires the lock service into a node.
type ServiceConfig struct {
	Node      uint64
	GRPCAddr  string
	Candidate bool // runs a master or standby (role "lock")
	Meta      *meta.Client
	Detector  Detector
	Live      Liveness
	Log       *slog.Logger
	// Tick is how often the master asks about suspects and standbys check
	// the master (default 250 ms).
	Tick time.Duration
}

// Service is a node's lock service: its clerks and, on candidates, the
// master or standby. It implements pb.LockServiceServer.
type Service struct {
	pb.UnimplementedLockServiceServer
	cfg   ServiceConfig
	log   *slog.Logger
	conns connCache
	ctx   context.Context
	stop  context.CancelFunc
	mu    struct {
		sync.Mutex
		inc     uint64
		clerks  []*ClerkRT
		nextSeq uint32
		master  *masterRT
		def     *ClerkRT // the default clerk (kind ""), used by Hold
		// hint is the lock namespace as last seen through a watch (served by
		// any config-service member from its local copy): standbys and
		// clerks use it without loading the leader, and refresh it with a
		// linearizable read when it proves stale.
		hint   *state
		hintCh chan struct{} // closed and replaced when hint changes
	}
	watchOnce sync.Once
	wg        sync.WaitGroup
}

// NewService returns a stopped service; Start begins each incarnation.
func NewService(cfg ServiceConfig) *Service {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Tick == 0 {
		cfg.Tick = 250 * time.Millisecond
	}
	s := &Service{cfg: cfg, log: cfg.Log.With("layer", "lock")}
	s.ctx, s.stop = context.WithCancel(context.Background())
	s.mu.hintCh = make(chan struct{})
	return s
}

// watch keeps the hint of the lock namespace current.
func (s *Service) watch() {
	defer s.wg.Done()
	for ns := range s.cfg.Meta.Watch(s.ctx, Namespace, 0) {
		st, err := decodeState(ns)
		if err != nil {
			s.log.Warn("lock namespace does not decode", "err", err)
			continue
		}
		s.setHint(st)
	}
}

func (s *Service) setHint(st *state) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.hint != nil && s.mu.hint.version >= st.version {
		return
	}
	s.mu.hint = st
	close(s.mu.hintCh)
	s.mu.hintCh = make(chan struct{})
}

// hint returns the cached lock namespace (nil before the first) and a
// channel closed at its next change.
func (s *Service) hint() (*state, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.hint, s.mu.hintCh
}

// Start begins incarnation inc of the node: a fresh default clerk (a
// restarted node holds nothing and registers afresh) and, on candidates, the
// standby loop.
func (s *Service) Start(inc uint64) {
	s.mu.Lock()
	if inc <= s.mu.inc {
		s.mu.Unlock()
		return
	}
	s.mu.inc, s.mu.nextSeq = inc, 0
	s.mu.Unlock()
	s.watchOnce.Do(func() {
		s.wg.Add(1)
		go s.watch()
	})
	def, err := s.NewClerk("", nil)
	if err != nil {
		s.log.Error("default clerk", "err", err)
		return
	}
	s.mu.Lock()
	s.mu.def = def
	s.mu.Unlock()
	if s.cfg.Candidate {
		s.wg.Add(1)
		go s.standby(inc)
	}
}

// Fence ends incarnation inc: every clerk drops its leases and fails its
// waiters, and a master stops granting. Called synchronously by the node's
// self-fence, before the next incarnation starts.
func (s *Service) Fence(inc uint64) {
	s.stopIncarnation()
	s.log.Warn("lock service fenced", "incarnation", inc)
}

// stopIncarnation drops the current incarnation's clerks and master.
func (s *Service) stopIncarnation() {
	s.mu.Lock()
	clerks, m := s.mu.clerks, s.mu.master
	s.mu.clerks, s.mu.master, s.mu.def = nil, nil, nil
	s.mu.Unlock()
	for _, c := range clerks {
		c.fence()
	}
	if m != nil {
		m.halt("node fenced itself or stopped")
	}
}

// Close stops everything (graceful shutdown: leases are not released; the
// failure detector will declare the node dead and the master resolves them).
func (s *Service) Close() {
	s.stop()
	s.stopIncarnation()
	s.wg.Wait()
	s.conns.close()
}

// NewClerk creates a clerk of a kind for the current incarnation and
// registers it in the config service. recover is required when kind != "".
func (s *Service) NewClerk(kind string, recover RecoveryFunc) (*ClerkRT, error) {
	if (kind == "") != (recover == nil) || len(kind) > MaxKindLen {
		return nil, errors.New("lock: a clerk has a recovery function exactly when it has a kind")
	}
	s.mu.Lock()
	s.mu.nextSeq++
	id := ClerkID{Node: s.cfg.Node, Inc: s.mu.inc, Seq: s.mu.nextSeq}
	c := &ClerkRT{s: s, core: NewClerk(id, kind), recover: recover, waits: map[*Waiter]chan struct{}{}}
	c.ctx, c.cancel = context.WithCancel(s.ctx)
	s.mu.clerks = append(s.mu.clerks, c)
	s.mu.Unlock()
	s.wg.Add(1)
	go c.run()
	return c, nil
}

// DefaultClerk is the node's clerk without a recovery kind.
func (s *Service) DefaultClerk() *ClerkRT {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.def
}

func clerkKey(id ClerkID) string    { return "clerk/" + id.String() }
func recoveryKey(id ClerkID) string { return "recovery/" + id.String() }

// state is the lock namespace decoded.
type state struct {
	version uint64
	master  *pb.LockMasterRecord
	clerks  []ClerkInfo
	records []RecoveryRecord
}

func decodeState(ns *pb.Namespace) (*state, error) {
	st := &state{version: ns.Version}
	for _, e := range ns.Entries {
		switch {
		case e.Key == "master":
			m := &pb.LockMasterRecord{}
			if err := proto.Unmarshal(e.Value, m); err != nil {
				return nil, fmt.Errorf("lock: master record: %w", err)
			}
			st.master = m
		case strings.HasPrefix(e.Key, "clerk/"):
			r := &pb.LockClerkRecord{}
			if err := proto.Unmarshal(e.Value, r); err != nil {
				return nil, fmt.Errorf("lock: clerk record %s: %w", e.Key, err)
			}
			id, err := ClerkIDFromPB(r.Id)
			if err != nil {
				return nil, err
			}
			st.clerks = append(st.clerks, ClerkInfo{ID: id, Kind: r.Kind})
		case strings.HasPrefix(e.Key, "recovery/"):
			r := &pb.LockRecoveryRecord{}
			if err := proto.Unmarshal(e.Value, r); err != nil {
				return nil, fmt.Errorf("lock: recovery record %s: %w", e.Key, err)
			}
			id, err := ClerkIDFromPB(r.Dead)
			if err != nil {
				return nil, err
			}
			rec := RecoveryRecord{Dead: id, Kind: r.Kind, All: r.All}
			for _, n := range r.Names {
				rec.Names = append(rec.Names, string(n))
			}
			st.records = append(st.records, rec)
		}
	}
	sort.Slice(st.clerks, func(i, j int) bool { return st.clerks[i].ID.Less(st.clerks[j].ID) })
	return st, nil
}

// read is a linearizable read of the lock namespace; it refreshes the hint.
func (s *Service) read(ctx context.Context) (*state, error) {
	ns, err := s.cfg.Meta.Read(ctx, Namespace)
	if err != nil {
		return nil, err
	}
	st, err := decodeState(ns)
	if err == nil {
		s.setHint(st)
	}
	return st, err
}

func put(key string, m proto.Message) *pb.Op {
	b, err := proto.Marshal(m)
	if err != nil {
		panic(err)
	}
	return &pb.Op{Kind: pb.Op_KIND_PUT, Key: key, Value: b}
}

func sleep(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// connCache hands out lock-service clients over a shared connection pool.
type connCache struct{ pool transport.Pool }

func (c *connCache) get(addr string) (pb.LockServiceClient, error) {
	cc, err := c.pool.Get(addr)
	if err != nil {
		return nil, err
	}
	return pb.NewLockServiceClient(cc), nil
}

func (c *connCache) close() { c.pool.Close() }

// Session implements the master side of a clerk's session.
func (s *Service) Session(stream grpc.BidiStreamingServer[pb.SessionRequest, pb.SessionResponse]) error {
	s.mu.Lock()
	m := s.mu.master
	s.mu.Unlock()
	if m == nil {
		return status.Error(codes.Unavailable, "lock: this node is not the lock master")
	}
	return m.serve(stream)
}

// List implements pb.LockServiceServer: the master answers; other nodes
// forward to it.
func (s *Service) List(ctx context.Context, _ *pb.ListRequest) (*pb.ListResponse, error) {
	s.mu.Lock()
	m := s.mu.master
	s.mu.Unlock()
	if m != nil {
		return m.list(), nil
	}
	return ListFromMaster(ctx, s.cfg.Meta, &s.conns)
}

// ListFromMaster finds the master through the config service and asks it.
func ListFromMaster(ctx context.Context, mc *meta.Client, conns *connCache) (*pb.ListResponse, error) {
	ns, err := mc.Read(ctx, Namespace)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "config service: %v", err)
	}
	st, err := decodeState(ns)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if st.master == nil {
		return nil, status.Error(codes.Unavailable, "lock: no master yet")
	}
	cl, err := conns.get(st.master.GrpcAddr)
	if err != nil {
		return nil, err
	}
	r, err := cl.List(ctx, &pb.ListRequest{})
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "lock master on node %d (%s): %v", st.master.Node, st.master.GrpcAddr, err)
	}
	return r, nil
}

// Hold implements pb.LockServiceServer through this node's default clerk.
func (s *Service) Hold(req *pb.HoldRequest, stream grpc.ServerStreamingServer[pb.HoldResponse]) error {
	if err := ValidName(string(req.Name)); err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	mode, err := modeFromPB(req.Mode, false)
	if err != nil {
		return status.Error(codes.InvalidArgument, ErrBadMode.Error())
	}
	c := s.DefaultClerk()
	if c == nil {
		return status.Error(codes.Unavailable, "lock: this node has no clerk (fenced or starting)")
	}
	start := time.Now()
	h, err := c.Acquire(stream.Context(), string(req.Name), mode)
	if err != nil {
		return status.Error(codes.Unavailable, err.Error())
	}
	defer h.Release()
	if err := stream.Send(&pb.HoldResponse{Kind: pb.HoldResponse_KIND_GRANTED, Clerk: ClerkIDToPB(c.ID()), WaitedMicros: uint64(time.Since(start).Microseconds())}); err != nil {
		return err
	}
	var timer <-chan time.Time
	if req.HoldMillis > 0 {
		timer = time.After(time.Duration(req.HoldMillis) * time.Millisecond)
	}
	select {
	case <-stream.Context().Done():
	case <-timer:
	case <-h.Lost():
		return status.Error(codes.Aborted, "lock: lease lost: this node fenced itself or is shutting down")
	}
	h.Release()
	return stream.Send(&pb.HoldResponse{Kind: pb.HoldResponse_KIND_RELEASED, Clerk: ClerkIDToPB(c.ID())})
}

// Register exposes the service on a gRPC server.
func Register(gs *grpc.Server, s *Service) { pb.RegisterLockServiceServer(gs, s) }
