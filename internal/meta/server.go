package meta

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/grovestore/grove/api/grovepb"
)

// Member is one replica of the config service.
type Member struct {
	ID       uint64
	RaftAddr string
	GRPCAddr string
}

// Timing holds raft's timeouts. Loopback clusters can use short ones.
type Timing struct {
	Heartbeat   time.Duration
	Election    time.Duration
	LeaderLease time.Duration
}

// DefaultTiming suits a LAN: elections within a second or two of a loss.
var DefaultTiming = Timing{Heartbeat: 500 * time.Millisecond, Election: 500 * time.Millisecond, LeaderLease: 250 * time.Millisecond}

// Config configures one replica.
type Config struct {
	ID      uint64
	Dir     string   // durable log, stable store and snapshots live here
	Members []Member // the whole group, this replica included (2k+1 of them)
	Timing  Timing
	// Transport overrides the TCP transport (tests use raft's in-memory one).
	Transport raft.Transport
	Logger    *slog.Logger
	// RaftLog receives hashicorp/raft's own log lines (io.Discard to drop).
	RaftLog io.Writer
	// Bootstrap creates a brand-new config service from Members if this
	// replica has no raft state. Never set it for a replica of a cluster
	// that exists: a replica that lost its state must be removed and added
	// again (a voter that forgot its vote can elect a second leader).
	Bootstrap bool
}

// Validate rejects configurations that cannot work.
func (c *Config) Validate() error {
	if c.ID == 0 {
		return errors.New("meta: replica id must be non-zero")
	}
	if c.Dir == "" {
		return errors.New("meta: no data directory")
	}
	if len(c.Members)%2 == 0 {
		return fmt.Errorf("meta: %d members: use an odd number (2k+1) so that a majority survives k failures", len(c.Members))
	}
	self := false
	seen := map[uint64]bool{}
	for _, m := range c.Members {
		if m.ID == 0 || seen[m.ID] {
			return fmt.Errorf("meta: member id %d is zero or repeated", m.ID)
		}
		seen[m.ID] = true
		self = self || m.ID == c.ID
	}
	if !self {
		return fmt.Errorf("meta: replica %d is not in the member list", c.ID)
	}
	return nil
}

// Server is one replica: raft, the FSM, and the gRPC service.
type Server struct {
	cfg         Config
	log         *slog.Logger
	raft        *raft.Raft
	fsm         *FSM
	trans       raft.Transport
	store       *raftboltdb.BoltStore
	barrierTerm atomic.Uint64 // term in which this leader's Barrier completed
}

// HasState reports whether a replica directory holds raft state (a log,
// a stable store or a snapshot).
func HasState(dir string) (bool, error) {
	if _, err := os.Stat(filepath.Join(dir, "raft.db")); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return false, nil
		}
		return false, err
	}
	store, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(dir, "raft.db"), BoltOptions: nil})
	if err != nil {
		return false, err
	}
	defer store.Close()
	snaps, err := raft.NewFileSnapshotStoreWithLogger(filepath.Join(dir, "snapshots"), 2, hclog.NewNullLogger())
	if err != nil {
		return false, err
	}
	return raft.HasExistingState(store, store, snaps)
}

// Open starts a replica. With Bootstrap and no raft state it creates the
// group (every member of a new group bootstraps with the identical
// configuration, which raft allows); without, a replica with no state waits
// for the leader to add it (AddMember).
func Open(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Timing == (Timing{}) {
		cfg.Timing = DefaultTiming
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.RaftLog == nil {
		cfg.RaftLog = os.Stderr
	}
	log := cfg.Logger.With("layer", "meta", "replica", cfg.ID)
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, err
	}
	var self Member
	for _, m := range cfg.Members {
		if m.ID == cfg.ID {
			self = m
		}
	}
	hl := hclog.New(&hclog.LoggerOptions{Name: "raft-" + strconv.FormatUint(cfg.ID, 10), Level: hclog.Warn, Output: cfg.RaftLog})
	rc := raft.DefaultConfig()
	rc.LocalID = serverID(cfg.ID)
	rc.HeartbeatTimeout = cfg.Timing.Heartbeat
	rc.ElectionTimeout = cfg.Timing.Election
	rc.LeaderLeaseTimeout = cfg.Timing.LeaderLease
	rc.Logger = hl
	// Snapshot after 1024 decrees; keep a short tail for slow followers.
	rc.SnapshotThreshold = 1024
	rc.TrailingLogs = 1024

	store, err := raftboltdb.NewBoltStore(filepath.Join(cfg.Dir, "raft.db"))
	if err != nil {
		return nil, fmt.Errorf("meta: open raft log: %w", err)
	}
	snaps, err := raft.NewFileSnapshotStoreWithLogger(filepath.Join(cfg.Dir, "snapshots"), 2, hl)
	if err != nil {
		store.Close()
		return nil, fmt.Errorf("meta: open snapshots: %w", err)
	}
	trans := cfg.Transport
	if trans == nil {
		addr, err := net.ResolveTCPAddr("tcp", self.RaftAddr)
		if err != nil {
			store.Close()
			return nil, fmt.Errorf("meta: raft address %q: %w", self.RaftAddr, err)
		}
		t, err := raft.NewTCPTransportWithLogger(self.RaftAddr, addr, 3, 5*time.Second, hl)
		if err != nil {
			store.Close()
			return nil, fmt.Errorf("meta: listen for raft on %s: %w", self.RaftAddr, err)
		}
		trans = t
	}
	fsm := NewFSM(log)
	has, err := raft.HasExistingState(store, store, snaps)
	if err != nil {
		store.Close()
		return nil, err
	}
	if !has && cfg.Bootstrap {
		var servers []raft.Server
		for _, m := range cfg.Members {
			servers = append(servers, raft.Server{ID: serverID(m.ID), Address: raft.ServerAddress(m.RaftAddr), Suffrage: raft.Voter})
		}
		if err := raft.BootstrapCluster(rc, store, store, snaps, trans, raft.Configuration{Servers: servers}); err != nil {
			store.Close()
			return nil, fmt.Errorf("meta: bootstrap: %w", err)
		}
		log.Info("bootstrapped config service", "members", len(servers))
	}
	if !has && !cfg.Bootstrap {
		log.Warn("config-service replica has no state: waiting for the leader to add it (grove member add)", "id", cfg.ID)
	}
	r, err := raft.NewRaft(rc, fsm, store, store, snaps, trans)
	if err != nil {
		store.Close()
		return nil, fmt.Errorf("meta: start raft: %w", err)
	}
	return &Server{cfg: cfg, log: log, raft: r, fsm: fsm, trans: trans, store: store}, nil
}

func serverID(id uint64) raft.ServerID { return raft.ServerID(strconv.FormatUint(id, 10)) }

// Close stops the replica. Its state stays on disk for the next Open.
func (s *Server) Close() error {
	err := s.raft.Shutdown().Error()
	if c, ok := s.trans.(io.Closer); ok {
		c.Close()
	}
	if e := s.store.Close(); err == nil {
		err = e
	}
	return err
}

// FSM exposes the local state machine (stale reads, watches).
func (s *Server) FSM() *FSM { return s.fsm }

// Leader returns the current leader's id (0 if none is known).
func (s *Server) Leader() uint64 {
	_, id := s.raft.LeaderWithID()
	n, _ := strconv.ParseUint(string(id), 10, 64)
	return n
}

// IsLeader reports whether this replica believes it leads.
func (s *Server) IsLeader() bool { return s.raft.State() == raft.Leader }

func (s *Server) member(id uint64) Member {
	for _, m := range s.cfg.Members {
		if m.ID == id {
			return m
		}
	}
	return Member{}
}

// Propose passes a decree and waits until it is committed and applied.
// ErrNotLeader means: ask Leader(). ErrStaleVersion means: re-read, retry.
func (s *Server) Propose(ctx context.Context, d *pb.Decree) (uint64, error) {
	if err := ValidateDecree(d); err != nil {
		return 0, err
	}
	if s.raft.State() != raft.Leader {
		return 0, ErrNotLeader
	}
	b, err := proto.Marshal(d)
	if err != nil {
		return 0, err
	}
	timeout := 10 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl)
	}
	f := s.raft.Apply(b, timeout)
	if err := f.Error(); err != nil {
		if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) {
			return 0, fmt.Errorf("%w: %v", ErrNotLeader, err)
		}
		return 0, fmt.Errorf("meta: decree not committed: %w", err)
	}
	res := f.Response().(ApplyResult)
	return res.Version, res.Err
}

// Read returns a namespace linearizably: this replica confirms it is still
// the leader (VerifyLeader) after having applied everything committed before
// its term began (one Barrier per term), so the read sees every decree that
// completed before it started.
func (s *Server) Read(ctx context.Context, name string) (*pb.Namespace, error) {
	if s.raft.State() != raft.Leader {
		return nil, ErrNotLeader
	}
	if term := s.raft.CurrentTerm(); s.barrierTerm.Load() != term {
		if err := s.raft.Barrier(5 * time.Second).Error(); err != nil {
			return nil, fmt.Errorf("%w: barrier: %v", ErrNotLeader, err)
		}
		if s.raft.CurrentTerm() == term {
			s.barrierTerm.Store(term)
		}
	}
	if err := s.raft.VerifyLeader().Error(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNotLeader, err)
	}
	ns, _ := s.fsm.Namespace(name)
	return ns, nil
}

// ErrMembership wraps a refused membership change.
var ErrMembership = errors.New("meta: membership change refused")

// AddMember adds a voter (one change at a time: raft refuses a second one
// until the first has committed). raftAddr defaults to the address in this
// replica's member list.
func (s *Server) AddMember(id uint64, raftAddr string) (uint64, error) {
	if s.raft.State() != raft.Leader {
		return 0, ErrNotLeader
	}
	if id == 0 {
		return 0, fmt.Errorf("%w: member id must be positive", ErrMembership)
	}
	if raftAddr == "" {
		raftAddr = s.member(id).RaftAddr
	}
	if raftAddr == "" {
		return 0, fmt.Errorf("%w: member %d is not in this cluster's member list; give its raft address", ErrMembership, id)
	}
	f := s.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return 0, err
	}
	for _, sv := range f.Configuration().Servers {
		if sv.ID == serverID(id) {
			return 0, fmt.Errorf("%w: member %d is already in the configuration (remove it first if it lost its state)", ErrMembership, id)
		}
	}
	af := s.raft.AddVoter(serverID(id), raft.ServerAddress(raftAddr), f.Index(), 10*time.Second)
	if err := af.Error(); err != nil {
		return 0, fmt.Errorf("%w: %v", ErrMembership, err)
	}
	return af.Index(), nil
}

// RemoveMember removes a member from the configuration.
func (s *Server) RemoveMember(id uint64) (uint64, error) {
	if s.raft.State() != raft.Leader {
		return 0, ErrNotLeader
	}
	f := s.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return 0, err
	}
	found := false
	for _, sv := range f.Configuration().Servers {
		found = found || sv.ID == serverID(id)
	}
	if !found {
		return 0, fmt.Errorf("%w: member %d is not in the configuration", ErrMembership, id)
	}
	if len(f.Configuration().Servers) <= 1 {
		return 0, fmt.Errorf("%w: cannot remove the last member", ErrMembership)
	}
	rf := s.raft.RemoveServer(serverID(id), f.Index(), 10*time.Second)
	if err := rf.Error(); err != nil {
		return 0, fmt.Errorf("%w: %v", ErrMembership, err)
	}
	return rf.Index(), nil
}

// RegisterGRPC exposes the service on a gRPC server.
func (s *Server) RegisterGRPC(g *grpc.Server) { pb.RegisterConfigServiceServer(g, &grpcService{s: s}) }

func (s *Server) leaderHint() (uint64, string) {
	id := s.Leader()
	return id, s.member(id).GRPCAddr
}

type grpcService struct {
	pb.UnimplementedConfigServiceServer
	s *Server
}

func (g *grpcService) Propose(ctx context.Context, req *pb.ProposeRequest) (*pb.ProposeResponse, error) {
	if req.GetDecree() == nil {
		return nil, status.Error(codes.InvalidArgument, "no decree")
	}
	v, err := g.s.Propose(ctx, req.Decree)
	switch {
	case err == nil:
		return &pb.ProposeResponse{Version: v}, nil
	case errors.Is(err, ErrNotLeader):
		id, addr := g.s.leaderHint()
		return &pb.ProposeResponse{NotLeader: true, LeaderId: id, LeaderAddr: addr}, nil
	case errors.Is(err, ErrStaleVersion):
		return &pb.ProposeResponse{Stale: true, CurrentVersion: v}, nil
	case errors.Is(err, ErrBadDecree):
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	return nil, status.Error(codes.Unavailable, err.Error())
}

func (g *grpcService) Read(ctx context.Context, req *pb.ReadRequest) (*pb.ReadResponse, error) {
	if req.GetNamespace() == "" || len(req.GetNamespace()) > MaxNamespaceLen {
		return nil, status.Error(codes.InvalidArgument, "bad namespace name")
	}
	ns, err := g.s.Read(ctx, req.Namespace)
	if errors.Is(err, ErrNotLeader) {
		id, addr := g.s.leaderHint()
		return &pb.ReadResponse{NotLeader: true, LeaderId: id, LeaderAddr: addr}, nil
	}
	if err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	return &pb.ReadResponse{Namespace: ns}, nil
}

func (g *grpcService) Watch(req *pb.WatchRequest, stream grpc.ServerStreamingServer[pb.WatchResponse]) error {
	if req.GetNamespace() == "" || len(req.GetNamespace()) > MaxNamespaceLen {
		return status.Error(codes.InvalidArgument, "bad namespace name")
	}
	after := req.AfterVersion
	for {
		ns, changed := g.s.fsm.Namespace(req.Namespace)
		if ns.Version > after {
			if err := stream.Send(&pb.WatchResponse{Namespace: ns}); err != nil {
				return err
			}
			after = ns.Version
		}
		select {
		case <-changed:
		case <-stream.Context().Done():
			return nil
		}
	}
}

func (g *grpcService) ChangeMembers(ctx context.Context, req *pb.ChangeMembersRequest) (*pb.ChangeMembersResponse, error) {
	var idx uint64
	var err error
	switch {
	case req.GetAdd() && req.GetRemove(), !req.GetAdd() && !req.GetRemove():
		return nil, status.Error(codes.InvalidArgument, "exactly one of add and remove")
	case req.GetAdd():
		idx, err = g.s.AddMember(req.Id, req.RaftAddr)
	default:
		idx, err = g.s.RemoveMember(req.Id)
	}
	switch {
	case err == nil:
		return &pb.ChangeMembersResponse{Index: idx}, nil
	case errors.Is(err, ErrNotLeader):
		id, addr := g.s.leaderHint()
		return &pb.ChangeMembersResponse{NotLeader: true, LeaderId: id, LeaderAddr: addr}, nil
	case errors.Is(err, ErrMembership):
		return nil, status.Error(codes.FailedPrecondition, err.Error())
	}
	return nil, status.Error(codes.Unavailable, err.Error())
}

func (g *grpcService) Members(ctx context.Context, _ *pb.MembersRequest) (*pb.MembersResponse, error) {
	f := g.s.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	out := &pb.MembersResponse{LeaderId: g.s.Leader(), Term: g.s.raft.CurrentTerm(), CommitIndex: g.s.raft.CommitIndex()}
	for _, sv := range f.Configuration().Servers {
		id, _ := strconv.ParseUint(string(sv.ID), 10, 64)
		out.Members = append(out.Members, &pb.Member{Id: id, RaftAddr: string(sv.Address), GrpcAddr: g.s.member(id).GRPCAddr, Voter: sv.Suffrage == raft.Voter})
	}
	return out, nil
}
