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
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	wal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/disk"
	"github.com/grovestore/grove/internal/metrics"
	"github.com/grovestore/grove/internal/transport"
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

// Validate rejects timings raft would refuse or that cannot work.
func (t Timing) Validate() error {
	switch {
	case t.Heartbeat < 5*time.Millisecond || t.Election < 5*time.Millisecond || t.LeaderLease < 5*time.Millisecond:
		return fmt.Errorf("meta: raft timeouts must be at least 5ms (heartbeat %v, election %v, leader lease %v)", t.Heartbeat, t.Election, t.LeaderLease)
	case t.LeaderLease > t.Heartbeat:
		return fmt.Errorf("meta: leader lease %v must not exceed the heartbeat timeout %v", t.LeaderLease, t.Heartbeat)
	case t.Heartbeat > time.Minute || t.Election > time.Minute:
		return fmt.Errorf("meta: raft timeouts over a minute (heartbeat %v, election %v)", t.Heartbeat, t.Election)
	}
	return nil
}

// DefaultTiming suits a LAN: elections within a second or two of a loss.
var DefaultTiming = Timing{Heartbeat: 400 * time.Millisecond, Election: 400 * time.Millisecond, LeaderLease: 400 * time.Millisecond}

// Config configures one replica.
type Config struct {
	ID      uint64
	Dir     string   // durable log, stable store and snapshots live here
	Members []Member // the whole group, this replica included (2k+1 of them)
	Timing  Timing
	// Transport overrides the TCP transport (tests use raft's in-memory one).
	Transport raft.Transport
	Logger    *slog.Logger
	// RaftLogger receives hashicorp/raft's own log lines (the node routes
	// them into its log: logging.HCLog). If nil, RaftLog is used.
	RaftLogger hclog.Logger
	// RaftLog receives hashicorp/raft's lines as text when RaftLogger is
	// nil (io.Discard to drop; nil: standard error).
	RaftLog io.Writer
	// Metrics counts decrees, watches and refusals (nil: none).
	Metrics *metrics.Node
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
	store       logStore
	counted     *counted      // nil: this replica vouches for nobody (counted.go)
	barrierTerm atomic.Uint64 // term in which this leader's Barrier completed
	// testStall, set only by tests before use, runs at a named point of
	// Read ("read": the read index taken, the lead not yet confirmed)
	// and of a confirmed Members ("members": the lead confirmed, the
	// configuration not yet read), to stall there.
	testStall func(point string)
}

// HasState reports whether a replica directory holds raft state (a log,
// a stable store or a snapshot).
func HasState(dir string) (bool, error) {
	_, errW := os.Stat(filepath.Join(dir, walDir))
	_, errB := os.Stat(filepath.Join(dir, boltFile))
	if errors.Is(errW, os.ErrNotExist) && errors.Is(errB, os.ErrNotExist) {
		return false, nil
	}
	store, err := openLogStore(dir, hclog.NewNullLogger())
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

// The raft log and stable store. New replicas use hashicorp/raft-wal (one
// fsync per append: measured 1.6-1.9x the decree rate of the bolt store at
// one proposer, whose commits take two fsyncs each); a replica created by
// an older version keeps its bolt file (raft.db) until it is replaced.
const (
	walDir         = "wal"
	boltFile       = "raft.db"
	walSegmentSize = 16 << 20 // preallocated per segment; decrees are small
)

type logStore interface {
	raft.LogStore
	raft.StableStore
	Close() error
}

func openLogStore(dir string, hl hclog.Logger) (logStore, error) {
	if _, err := os.Stat(filepath.Join(dir, boltFile)); err == nil {
		if _, err := os.Stat(filepath.Join(dir, walDir)); errors.Is(err, os.ErrNotExist) {
			return raftboltdb.NewBoltStore(filepath.Join(dir, boltFile))
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, walDir), 0o755); err != nil {
		return nil, err
	}
	// raft-wal v0.4.0's Close left its meta database open (and its file
	// locked, so a reopen in the same process blocked): own it and close it
	// (v0.4.2 closes it too; a second close is a no-op).
	mdb := &metadb.BoltMetaDB{}
	w, err := wal.Open(filepath.Join(dir, walDir), wal.WithSegmentSize(walSegmentSize), wal.WithLogger(hl), wal.WithMetaStore(mdb))
	if err != nil {
		mdb.Close()
		return nil, err
	}
	return &walStore{WAL: w, meta: mdb}, nil
}

// ErrLogDamaged: the replica's raft log has an entry it cannot read.
// raft.NewRaft would panic on it (it reads every entry after the last
// snapshot at start); checkLog reports it first, with the way back.
var ErrLogDamaged = errors.New("its raft log is damaged")

// checkLog reads every entry of the replica's log (at most about two
// snapshot intervals: TrailingLogs plus SnapshotThreshold) and reports the
// first it cannot read. The damage known to happen: raft-wal before v0.4.2
// (Grove before 2026-11-29) left a log whose tail a follower had truncated
// unreadable (hashicorp/raft-wal#31). The replica's state is then lost; the
// other replicas have it.
func checkLog(store raft.LogStore) error {
	first, err := store.FirstIndex()
	if err != nil {
		return fmt.Errorf("%w: its first index: %v", ErrLogDamaged, err)
	}
	last, err := store.LastIndex()
	if err != nil {
		return fmt.Errorf("%w: its last index: %v", ErrLogDamaged, err)
	}
	if first == 0 {
		return nil // empty
	}
	var l raft.Log
	for i := first; i <= last; i++ {
		if err := store.GetLog(i, &l); err != nil {
			return fmt.Errorf("%w: entry %d of %d..%d cannot be read (%v). Its state is lost; the other replicas have it: "+
				"remove this member (grove member remove ID), move its data directory aside, start it again and add it back (grove member add ID)",
				ErrLogDamaged, i, first, last, err)
		}
	}
	return nil
}

type walStore struct {
	*wal.WAL
	meta *metadb.BoltMetaDB
}

func (w *walStore) Close() error {
	return errors.Join(w.WAL.Close(), w.meta.Close())
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
	if err := cfg.Timing.Validate(); err != nil {
		return nil, err
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
	hl := cfg.RaftLogger
	if hl == nil {
		hl = hclog.New(&hclog.LoggerOptions{Name: "raft-" + strconv.FormatUint(cfg.ID, 10), Level: hclog.Warn, Output: cfg.RaftLog})
	}
	rc := raft.DefaultConfig()
	rc.LocalID = serverID(cfg.ID)
	rc.HeartbeatTimeout = cfg.Timing.Heartbeat
	rc.ElectionTimeout = cfg.Timing.Election
	rc.LeaderLeaseTimeout = cfg.Timing.LeaderLease
	rc.Logger = hl
	// Snapshot after 1024 decrees; keep a short tail for slow followers.
	rc.SnapshotThreshold = 1024
	rc.TrailingLogs = 1024

	store, err := openLogStore(cfg.Dir, hl)
	if err != nil {
		return nil, fmt.Errorf("meta: open raft log: %w", err)
	}
	if err := checkLog(store); err != nil {
		store.Close()
		return nil, fmt.Errorf("meta: replica %d: %w", cfg.ID, err)
	}
	snaps, err := raft.NewFileSnapshotStoreWithLogger(filepath.Join(cfg.Dir, "snapshots"), 2, hl)
	if err != nil {
		store.Close()
		return nil, fmt.Errorf("meta: open snapshots: %w", err)
	}
	trans := cfg.Transport
	started := false // raft runs: Server.Close owns the transport
	if trans == nil {
		addr, err := net.ResolveTCPAddr("tcp", self.RaftAddr)
		if err != nil {
			store.Close()
			return nil, fmt.Errorf("meta: raft address %q: %w", self.RaftAddr, err)
		}
		// MaxRPCsInFlight 1 turns off pipelined replication: in
		// hashicorp/raft v1.7.3 a pipeline whose follower answers
		// Success=false, or whose leader steps down with responses in
		// flight, can wedge (its sender parks on a full in-progress queue
		// while its decoder parks on an unread done queue): that follower
		// gets no more entries from this leader, and Shutdown waits
		// forever (hashicorp/raft#612; found by the fault suite at 30 %
		// loss: three nodes that never stopped on SIGTERM). Replication
		// is then one AppendEntries (of a batch) at a time per follower;
		// measured with `grove bench decree` (README).
		nt, err := raft.NewTCPTransportWithConfig(self.RaftAddr, addr, &raft.NetworkTransportConfig{
			MaxPool: 3, Timeout: 5 * time.Second, Logger: hl, MaxRPCsInFlight: 1})
		if err != nil {
			store.Close()
			return nil, fmt.Errorf("meta: listen for raft on %s: %w", self.RaftAddr, err)
		}
		t := &gatedTransport{NetworkTransport: nt}
		trans = t
		// A later step's failure closes the listener made here (a
		// Transport the caller gave stays the caller's).
		defer func() {
			if !started {
				t.Close()
			}
		}()
	}
	fsm := NewFSM(log)
	has, err := raft.HasExistingState(store, store, snaps)
	if err != nil {
		store.Close()
		return nil, err
	}
	// The record of counted peers, kept only where this package owns the
	// transport that feeds it: a replica on a caller's transport (tests)
	// vouches for nobody.
	var cnt *counted
	if g, ok := trans.(*gatedTransport); ok {
		if cnt, err = openCounted(disk.OS{}, cfg.Dir, has); err != nil {
			store.Close()
			return nil, fmt.Errorf("meta: replica %d: %w", cfg.ID, err)
		}
		g.counted = cnt
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
		log.Warn("config-service replica has no state: waiting for the leader to replicate to it (a member that joins a configuration listing it, or one being added with grove member add)", "id", cfg.ID)
	}
	r, err := raft.NewRaft(rc, fsm, store, store, snaps, trans)
	if err != nil {
		store.Close()
		return nil, fmt.Errorf("meta: start raft: %w", err)
	}
	started = true
	srv := &Server{cfg: cfg, log: log, raft: r, fsm: fsm, trans: trans, store: store, counted: cnt}
	srv.registerGauges()
	return srv, nil
}

// registerGauges exposes raft's state at scrape time.
func (s *Server) registerGauges() {
	m := s.cfg.Metrics
	if m == nil {
		return
	}
	m.GaugeFunc("grove_meta_raft_state", "This replica's raft state: 0 follower, 1 candidate, 2 leader, 3 shutdown.", nil,
		func() float64 { return float64(s.raft.State()) })
	m.GaugeFunc("grove_meta_raft_term", "This replica's raft term.", nil, func() float64 { return float64(s.raft.CurrentTerm()) })
	m.GaugeFunc("grove_meta_raft_commit_index", "This replica's raft commit index.", nil, func() float64 { return float64(s.raft.CommitIndex()) })
	m.GaugeFunc("grove_meta_raft_last_contact_seconds", "Seconds since this follower last heard from a leader (0 on the leader).", nil, func() float64 {
		if s.raft.State() == raft.Leader {
			return 0
		}
		return time.Since(s.raft.LastContact()).Seconds()
	})
}

func serverID(id uint64) raft.ServerID { return raft.ServerID(strconv.FormatUint(id, 10)) }

// Close stops the replica. Its state stays on disk for the next Open.
func (s *Server) Close() error {
	// Close the transport before waiting for raft's goroutines: one of
	// them may be in an RPC to a peer that does not answer (a partition),
	// which would otherwise hold the shutdown for the RPC's whole timeout.
	f := s.raft.Shutdown()
	if c, ok := s.trans.(io.Closer); ok {
		c.Close()
	}
	err := f.Error()
	// No heartbeat may touch the store once it is closed (gatedTransport).
	if g, ok := s.trans.(*gatedTransport); ok {
		g.fence()
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

// ErrOutOfContact is a watch refused by a replica that has not heard from a
// leader lately (cut off, or an election is going on): it would serve a
// namespace that no longer moves. The replica itself answers: the watcher
// tries another member, without counting this one as failed.
var ErrOutOfContact = errors.New("meta: this replica is out of contact with the config-service leader")

// WatchHeartbeat is how often a watch stream with nothing new says so.
// Watchers give up on a stream silent for WatchTimeout.
const (
	WatchHeartbeat = 250 * time.Millisecond
	WatchTimeout   = 1200 * time.Millisecond
)

// InContact reports whether this replica can be trusted to be current: it
// is the leader (raft steps a leader down when it loses contact with a
// majority for LeaderLease), or a follower that heard from a leader within
// twice the heartbeat timeout.
func (s *Server) InContact() bool {
	switch s.raft.State() {
	case raft.Leader:
		return true
	case raft.Follower:
		return time.Since(s.raft.LastContact()) < 2*s.cfg.Timing.Heartbeat
	}
	return false
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
	start := time.Now()
	f := s.raft.Apply(b, timeout)
	m := s.cfg.Metrics
	if err := f.Error(); err != nil {
		if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) {
			m.Decree("not_leader")
			return 0, fmt.Errorf("%w: %v", ErrNotLeader, err)
		}
		m.Decree("error")
		return 0, fmt.Errorf("meta: decree not committed: %w", err)
	}
	res := f.Response().(ApplyResult)
	switch {
	case res.Err == nil && res.Duplicate:
		// A resend of a decree that committed before (its answer was
		// lost): answered as it was then, nothing applied twice.
		m.Decree("duplicate")
		s.log.Info("resent decree answered as applied", "namespace", d.Namespace, "version", res.Version, "origin", d.Origin)
	case res.Err == nil:
		m.Decree("ok")
		m.DecreeLatency(time.Since(start))
	case errors.Is(res.Err, ErrStaleVersion):
		m.Decree("stale")
	default:
		m.Decree("bad")
	}
	return res.Version, res.Err
}

// Read returns a namespace linearizably: this replica confirms it is still
// the leader (VerifyLeader) after having applied everything committed before
// its term began (one Barrier per term), and answers once its FSM has
// applied every entry committed when the read began (a read index), so the
// read sees every decree that completed before it started, and every
// version a watch served by any replica delivered before it started.
// Without the read index a leader's FSM, which applies committed entries
// on its own goroutine, could answer a version older than one a follower's
// watch had already delivered (outside review 112).
func (s *Server) Read(ctx context.Context, name string) (*pb.Namespace, error) {
	if s.raft.State() != raft.Leader {
		return nil, ErrNotLeader
	}
	// The term first, then the read index, and the lead confirmed in
	// that same term: a leader that stalled after taking the index, lost
	// the lead and won it again could otherwise confirm its later lead
	// over an index of the earlier one, missing a decree another leader
	// committed in between (outside review 113).
	term := s.raft.CurrentTerm()
	ci := s.raft.CommitIndex()
	if s.barrierTerm.Load() != term {
		if err := s.raft.Barrier(5 * time.Second).Error(); err != nil {
			return nil, fmt.Errorf("%w: barrier: %v", ErrNotLeader, err)
		}
		if s.raft.CurrentTerm() == term {
			s.barrierTerm.Store(term)
		}
	}
	if s.testStall != nil {
		s.testStall("read")
	}
	if err := s.raft.VerifyLeader().Error(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNotLeader, err)
	}
	if s.raft.CurrentTerm() != term {
		return nil, fmt.Errorf("%w: the term moved during the read", ErrNotLeader)
	}
	if err := s.awaitApplied(ctx, ci); err != nil {
		return nil, err
	}
	ns, _ := s.fsm.Namespace(name)
	return ns, nil
}

// configCommitted reports an error unless no configuration entry lies
// past the commit index in this replica's log: the latest configuration
// is then committed.
func (s *Server) configCommitted() error {
	ci := s.raft.CommitIndex()
	last := s.raft.LastIndex()
	for idx := ci + 1; idx <= last; idx++ {
		var l raft.Log
		if err := s.store.GetLog(idx, &l); err != nil {
			return fmt.Errorf("meta: reading log entry %d: %v; ask again", idx, err)
		}
		if l.Type == raft.LogConfiguration {
			return fmt.Errorf("meta: a membership change (log entry %d) is being committed; ask again", idx)
		}
	}
	return nil
}

// awaitApplied waits until the FSM has applied every command entry up to
// index ci. Entries of other kinds (a term's no-op, barriers,
// configurations) change no namespace, so it waits for the last command
// entry at or before ci, found by walking the log back from ci down to
// what is applied; an entry no longer in the log was compacted into a
// snapshot, which this FSM took or restored, so it has it.
func (s *Server) awaitApplied(ctx context.Context, ci uint64) error {
	applied, restore, _ := s.fsm.Applied()
	if restore != 0 && s.raft.State() == raft.Leader {
		// A restored snapshot's index: raft records it as the last
		// snapshot once the FSM's Restore returns (at start, or when a
		// follower installs one; a leader installs none, so a leader
		// reads it after that). Learned for that restore only.
		if v, err := strconv.ParseUint(s.raft.Stats()["last_snapshot_index"], 10, 64); err == nil {
			s.fsm.appliedAtLeast(v, restore)
			applied, _, _ = s.fsm.Applied()
		}
	}
	need := uint64(0)
	for idx := ci; idx > applied; idx-- {
		var l raft.Log
		if err := s.store.GetLog(idx, &l); err != nil {
			if errors.Is(err, raft.ErrLogNotFound) {
				break // compacted into a snapshot
			}
			return fmt.Errorf("%w: reading log entry %d: %v", ErrNotLeader, idx, err)
		}
		if l.Type == raft.LogCommand {
			need = idx
			break
		}
	}
	for {
		applied, _, advanced := s.fsm.Applied()
		if applied >= need {
			return nil
		}
		select {
		case <-advanced:
		case <-ctx.Done():
			return fmt.Errorf("%w: waiting for this replica to apply entry %d (applied %d): %v", ErrNotLeader, need, applied, ctx.Err())
		}
	}
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
		return 0, fmt.Errorf("%w: member %d is not in the nodes' [[members]] list; give its raft address (grove member add %d --raft HOST:PORT)", ErrMembership, id, id)
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
	if err := s.waitingToJoin(id); err != nil {
		return 0, err
	}
	af := s.raft.AddVoter(serverID(id), raft.ServerAddress(raftAddr), f.Index(), 10*time.Second)
	if err := af.Error(); err != nil {
		return 0, fmt.Errorf("%w: %w", ErrMembership, err) // raft.ErrLeadershipLost: may have committed
	}
	return af.Index(), nil
}

// waitingToJoin checks, before a member is added, that it is running and
// waiting to be added: its replica answers with no raft configuration. A
// replica that lost its state confirms at start-up that the configuration
// does not list it (node.confirmNotVoter); an add that lands before that
// check would make it refuse to start, so the add waits for the node. A
// member outside this replica's member list (no gRPC address known) is not
// checked.
func (s *Server) waitingToJoin(id uint64) error {
	addr := s.member(id).GRPCAddr
	if addr == "" {
		return nil
	}
	var p transport.Pool
	defer p.Close()
	cc, err := p.Get(addr)
	if err != nil {
		return fmt.Errorf("%w: member %d at %s: %v", ErrMembership, id, addr, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	r, err := pb.NewConfigServiceClient(cc).Members(ctx, &pb.MembersRequest{})
	switch {
	case err != nil:
		return fmt.Errorf("%w: member %d does not answer at %s (start it first: it must be running, without raft state, "+
			"and waiting to be added): %v", ErrMembership, id, addr, status.Convert(err).Message())
	case len(r.Members) > 0:
		return fmt.Errorf("%w: member %d at %s has raft state of its own (configuration of %d members); "+
			"only a member without state is added", ErrMembership, id, addr, len(r.Members))
	}
	return nil
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
		return 0, fmt.Errorf("%w: %w", ErrMembership, err) // raft.ErrLeadershipLost: may have committed
	}
	return rf.Index(), nil
}

// RegisterGRPC exposes the service on a gRPC server.
func (s *Server) RegisterGRPC(g *grpc.Server) { pb.RegisterConfigServiceServer(g, &grpcService{s: s}) }

func (s *Server) leaderHint() (uint64, string) {
	id := s.KnownLeader()
	return id, s.member(id).GRPCAddr
}

// KnownLeader is the leader this replica can vouch for (0 if none): itself
// while it leads, or the leader of a follower that heard from it within half
// a heartbeat timeout (leaders send heartbeats ten times per timeout). A
// follower that has not noticed yet that its leader is gone (it waits a
// whole heartbeat timeout) would otherwise send every client to the lost
// leader, where each loses an attempt; `grove status` would name it.
func (s *Server) KnownLeader() uint64 {
	switch s.raft.State() {
	case raft.Leader:
		return s.cfg.ID
	case raft.Follower:
		if time.Since(s.raft.LastContact()) <= s.cfg.Timing.Heartbeat/2 {
			return s.Leader()
		}
	}
	return 0
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

// Watch streams a namespace's changes from this replica's state machine:
// the whole namespace first, then each decree's ops. While nothing changes
// it sends a progress message every WatchHeartbeat, but only while this
// replica is in contact with the leader (it leads, or heard from the leader
// recently): a replica cut off from the others ends the stream with
// Unavailable instead of serving a namespace that no longer moves, and a
// watcher that hears nothing for a few heartbeats (the replica's host is
// cut off silently, or its process stopped) moves to another member.
func (g *grpcService) Watch(req *pb.WatchRequest, stream grpc.ServerStreamingServer[pb.WatchResponse]) error {
	if req.GetNamespace() == "" || len(req.GetNamespace()) > MaxNamespaceLen {
		return status.Error(codes.InvalidArgument, "bad namespace name")
	}
	after := req.AfterVersion
	tick := time.NewTicker(WatchHeartbeat)
	defer tick.Stop()
	if m := g.s.cfg.Metrics; m != nil {
		metrics.Add(m.MetaWatches, 1)
		defer metrics.Add(m.MetaWatches, -1)
	}
	for {
		if !g.s.InContact() {
			if m := g.s.cfg.Metrics; m != nil {
				metrics.IncL(m.MetaRejected, "watch_out_of_contact")
			}
			return status.Error(codes.FailedPrecondition, ErrOutOfContact.Error())
		}
		version, delta, full, changed := g.s.fsm.Since(req.Namespace, after)
		var r *pb.WatchResponse
		switch {
		case full != nil:
			r = &pb.WatchResponse{Namespace: full, Version: full.Version}
		case version > after:
			r = &pb.WatchResponse{BaseVersion: after, Version: version, Ops: delta}
		}
		if r != nil {
			if err := stream.Send(r); err != nil {
				return err
			}
			after = version
			continue
		}
		select {
		case <-changed:
		case <-tick.C:
			// No progress from a replica behind the watcher (one that
			// came from a replica further ahead): its silence makes the
			// watcher move on rather than wait here for it to catch up.
			if g.s.InContact() && version >= after {
				if err := stream.Send(&pb.WatchResponse{Progress: true, Version: after}); err != nil {
					return err
				}
			}
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
	case errors.Is(err, ErrNotLeader), errors.Is(err, raft.ErrNotLeader):
		// (raft's: this replica lost the lead before the change entered
		// its log; nothing was proposed, so the client may go on to the
		// leader.)
		id, addr := g.s.leaderHint()
		return &pb.ChangeMembersResponse{NotLeader: true, LeaderId: id, LeaderAddr: addr}, nil
	case errors.Is(err, raft.ErrLeadershipLost):
		// The change may have committed under the next leader: not a
		// refusal. The client asks again, and takes "already done" for
		// done (Client.ChangeMembers).
		return nil, status.Error(codes.Unavailable, "meta: leadership lost during the membership change (it may have committed): "+err.Error())
	case errors.Is(err, ErrMembership):
		return nil, status.Error(codes.FailedPrecondition, err.Error())
	}
	return nil, status.Error(codes.Unavailable, err.Error())
}

func (g *grpcService) Members(ctx context.Context, req *pb.MembersRequest) (*pb.MembersResponse, error) {
	confirmed, confirmedTerm := false, uint64(0)
	if req.GetConfirmed() {
		// GetConfiguration is the latest configuration in this
		// replica's log, committed or not: only the leader, still
		// leading in the term it confirmed, with no configuration entry
		// past its commit index, may say it is the configuration
		// (outside review 112: a removal appended by a leader that then
		// lost the lead let a member that lost its disk vote again, and
		// a committed decree was lost; review 113: GetConfiguration's
		// Index is always 0 in hashicorp/raft 1.7, so the log is read).
		s := g.s
		term := s.raft.CurrentTerm()
		confirmedTerm = term
		if s.raft.State() != raft.Leader || s.raft.VerifyLeader().Error() != nil || s.raft.CurrentTerm() != term {
			r := &pb.MembersResponse{NotLeader: true, LeaderId: s.KnownLeader()}
			if id := r.LeaderId; id != 0 && id != s.cfg.ID {
				r.LeaderAddr = s.member(id).GRPCAddr
			}
			return r, nil
		}
		if err := s.configCommitted(); err != nil {
			return nil, status.Error(codes.Unavailable, err.Error())
		}
		if s.testStall != nil {
			s.testStall("members")
		}
		confirmed = true
	}
	f := g.s.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	if confirmed {
		// A change appended since configCommitted looked is past the
		// commit index read there: look again, in the same term.
		if err := g.s.configCommitted(); err != nil {
			return nil, status.Error(codes.Unavailable, err.Error())
		}
		if g.s.raft.CurrentTerm() != confirmedTerm {
			return nil, status.Error(codes.Unavailable, "meta: the term moved while the configuration was read; ask again")
		}
	}
	out := &pb.MembersResponse{LeaderId: g.s.KnownLeader(), Term: g.s.raft.CurrentTerm(), CommitIndex: g.s.raft.CommitIndex(),
		RaftState: strings.ToLower(g.s.raft.State().String()), Confirmed: confirmed}
	if out.RaftState == "follower" {
		if lc := g.s.raft.LastContact(); !lc.IsZero() {
			out.LastContactMs = uint64(time.Since(lc).Milliseconds())
		}
	}
	if c := g.s.counted; c != nil {
		out.CountedKnown, out.Counted = c.list(req.VouchFor)
	}
	for _, sv := range f.Configuration().Servers {
		id, _ := strconv.ParseUint(string(sv.ID), 10, 64)
		out.Members = append(out.Members, &pb.Member{Id: id, RaftAddr: string(sv.Address), GrpcAddr: g.s.member(id).GRPCAddr, Voter: sv.Suffrage == raft.Voter})
	}
	return out, nil
}
