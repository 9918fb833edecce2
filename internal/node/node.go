package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/grovestore/grove/api/etcdpb"
	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/btree"
	"github.com/grovestore/grove/internal/chunk"
	"github.com/grovestore/grove/internal/ddstable"
	"github.com/grovestore/grove/internal/disk"
	"github.com/grovestore/grove/internal/fd"
	"github.com/grovestore/grove/internal/lock"
	"github.com/grovestore/grove/internal/logging"
	"github.com/grovestore/grove/internal/meta"
	"github.com/grovestore/grove/internal/metrics"
	"github.com/grovestore/grove/internal/ratelog"
	"github.com/grovestore/grove/internal/rldev"
	"github.com/grovestore/grove/internal/transport"
)

// Node is one running Grove server.
type Node struct {
	cfg    *Config
	log    *slog.Logger
	lock   *os.File
	grpc   *grpc.Server
	guard  *transport.Guarded
	meta   *meta.Server // nil unless RoleMeta
	client *meta.Client
	fd     *fd.Driver
	fdp    atomic.Pointer[fd.Driver] // for Alive, readable before Start returns
	locks  *lock.Service
	rldev  *rldev.Service    // nil unless RoleStore
	chunk  *chunk.Service    // nil unless RoleStore
	btree  *btree.Service    // every node's B-tree role
	etcd   *btree.EtcdKV     // its etcd-compatible endpoint
	tables *ddstable.Service // every node's DDS brick
	btc    *chunk.Clerk      // the B-tree role's chunk clerk
	btrl   *rldev.Clerk      // the B-tree role's RLDev clerk
	rlc    *rldev.Clerk      // the chunk managers' RLDev clerk
	devs   []disk.Device     // the store's disks
	status *StatusService
	fence  *Fence
	mx     *metrics.Node
	web    *http.Server // metrics (nil if off)
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// Options tune a node beyond its config file.
type Options struct {
	// Logger is the node's log (default: slog.Default()); hashicorp/raft's
	// lines go into it too.
	Logger *slog.Logger
	// RaftLog, if set, receives raft's lines as text instead (tests).
	RaftLog    io.Writer
	MetaTiming meta.Timing
	// Bootstrap creates a brand-new config service if this node is a
	// member without raft state (`grove up` sets it when it creates a
	// cluster; `grove server --bootstrap`). A member without state and
	// without it is a replacement: it starts only once the other members
	// confirm it is not a voter any more, and waits to be added.
	Bootstrap bool
	// BootstrapIfNew bootstraps like Bootstrap, but only once every other
	// member has answered and none reports a cluster that has run (for
	// deployments that start every member with one command line, such as
	// deploy/compose.yaml); it waits for silent members without limit. A
	// member that finds a cluster that has run joins it empty if every
	// other member vouches that it never counted this member's raft
	// answers (a late start), and is a replacement otherwise; see
	// clusterIsNew.
	BootstrapIfNew bool
	// Context, if set, ends the waits of a member without state
	// (--bootstrap-if-new asks without limit): Start then returns an error
	// wrapping ErrStopped (a signal while it decides is a clean stop).
	Context context.Context
	// JoinTimeout bounds how long a member without state waits for another
	// member to confirm it may join (default 30 s).
	JoinTimeout time.Duration
}

// Start brings a node up: lock the data directory, open the config-service
// replica (if a member), serve gRPC, take a new incarnation (persisted before
// use), start the failure detector and register the incarnation.
func Start(cfg *Config, opt Options) (_ *Node, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := opt.Logger
	if log == nil {
		log = slog.Default()
	}
	n := &Node{cfg: cfg, log: log.With("node", cfg.ID), fence: &Fence{}, mx: metrics.New(cfg.ID)}
	n.ctx, n.cancel = context.WithCancel(context.Background())
	defer func() {
		if err != nil {
			n.Close()
		}
	}()
	if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
		return nil, err
	}
	if n.lock, err = lockDir(cfg.DataDir); err != nil {
		return nil, err
	}
	// Sockets first, so that a taken port fails fast with a clear message.
	lis, err := transport.Listen(cfg.GRPCAddr)
	if err != nil {
		return nil, fmt.Errorf("node %d: gRPC address: %w", cfg.ID, err)
	}
	garbage := ratelog.New(5 * time.Second)
	n.guard = transport.Guard(lis, func(from net.Addr, reason string) {
		n.mx.Garbage.WithLabelValues("grpc", reason).Inc()
		if ok, k := garbage.Allow(reason); ok {
			n.log.Warn("gRPC port: connection dropped", "from", from, "reason", reason, "suppressed", k)
		}
	})
	udp, err := net.ListenPacket("udp", cfg.BeaconAddr)
	if err != nil {
		return nil, fmt.Errorf("node %d: beacon address: %w", cfg.ID, err)
	}
	if cfg.MetricsAddr != "" {
		ml, err := net.Listen("tcp", cfg.MetricsAddr)
		if err != nil {
			udp.Close()
			return nil, fmt.Errorf("node %d: metrics address: %w", cfg.ID, err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", n.mx.Handler())
		n.web = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go n.web.Serve(ml)
	}
	var members []meta.Member
	for _, m := range cfg.Members {
		members = append(members, meta.Member{ID: m.ID, RaftAddr: m.Raft, GRPCAddr: m.GRPC})
	}
	// A clerk's Hello can carry MaxCachedLeases names of up to 1 KiB.
	n.grpc = grpc.NewServer(transport.ServerOptions()...)
	replacement := false
	if cfg.Has(RoleMeta) {
		dir := filepath.Join(cfg.DataDir, "meta")
		has, err := meta.HasState(dir)
		if err != nil {
			udp.Close()
			return nil, fmt.Errorf("node %d: config-service state in %s: %w", cfg.ID, dir, err)
		}
		bootstrap, joinNew, why := opt.Bootstrap, false, ""
		ctx := opt.Context
		if ctx == nil {
			ctx = context.Background()
		}
		if !has && !bootstrap && opt.BootstrapIfNew {
			// While it decides, it answers the other members' probes
			// ("no raft state"): a new cluster's members wait for each
			// other's answers before they bootstrap.
			deciding := serveDeciding(n.guard, cfg.ID)
			var mode startMode
			mode, why, err = clusterIsNew(ctx, cfg, members, n.log)
			deciding.Stop()
			if err == nil && ctx.Err() != nil {
				// Told to stop once decided: no bootstrap or join after
				// that (outside review 119).
				err = stopped(ctx)
			}
			if err != nil {
				udp.Close()
				return nil, err
			}
			bootstrap, joinNew = mode == startBootstrap, mode == startJoinNew
		}
		if !has && !bootstrap {
			if !joinNew {
				if err := confirmNotVoter(ctx, cfg, members, opt.JoinTimeout); err != nil {
					udp.Close()
					if ctx.Err() != nil {
						return nil, stopped(ctx)
					}
					if why != "" {
						// Say why it did not join as a new member: "did
						// not answer" is not "lost its data".
						err = fmt.Errorf("%w (--bootstrap-if-new did not join it as a new member: %s)", err, why)
					}
					return nil, err
				}
			}
			// A member joining empty is a replacement to the failure
			// detector too: it cannot know the verdicts of incarnations
			// registered before it started (its observer may have run in
			// a life whose raft answers nobody counted).
			replacement = true
		}
		// raft logs one line per bad connection on its port: rate-limit
		// them, and count garbage. Its lines go into the node's log
		// (warnings and errors; everything at debug level).
		raftLevel := hclog.Warn
		if n.log.Enabled(context.Background(), slog.LevelDebug) {
			raftLevel = hclog.Debug
		}
		raftLogger := logging.HCLog(n.log, "raft", raftLevel, ratelog.New(5*time.Second), func(msg string) {
			if strings.Contains(msg, "failed to decode incoming command") {
				n.mx.Garbage.WithLabelValues("raft", "undecodable command").Inc()
			}
		})
		if opt.RaftLog != nil { // tests: raft's lines as text to a writer of their own
			raftLogger = hclog.New(&hclog.LoggerOptions{Name: "raft", Level: hclog.Warn, Output: ratelog.Writer(opt.RaftLog, ratelog.New(5*time.Second), nil)})
		}
		n.meta, err = meta.Open(meta.Config{ID: cfg.ID, Dir: dir, Members: members, Bootstrap: bootstrap,
			Timing: metaTiming(cfg, opt), Logger: n.log, RaftLogger: raftLogger, Metrics: n.mx})
		if err != nil {
			udp.Close()
			return nil, err
		}
		n.meta.RegisterGRPC(n.grpc)
	}
	n.client = meta.NewClient(members)
	n.status = NewStatusService(n.client, cfg.Members)
	n.locks = lock.NewService(lock.ServiceConfig{Node: cfg.ID, GRPCAddr: cfg.GRPCAddr, Candidate: cfg.Has(RoleLock),
		Meta: n.client, Detector: n.status, Live: n, Log: n.log, Metrics: n.mx})
	n.fence.OnFence(func(inc fd.Incarnation) { n.locks.Fence(uint64(inc)) })
	pb.RegisterObserverServiceServer(n.grpc, &observerService{n: n})
	pb.RegisterClusterServiceServer(n.grpc, n.status)
	lock.Register(n.grpc, n.locks)
	if cfg.Has(RoleStore) {
		disks, err := n.openDisks()
		if err != nil {
			udp.Close()
			return nil, err
		}
		ecfg := rldev.Config{CopyRate: int64(cfg.RLDev.CopyRate), DiskTimeout: time.Duration(cfg.RLDev.DiskTimeout)}
		if r := cfg.RLDev.ScrubRate; r != nil {
			ecfg.ScrubRate = int64(*r)
			if ecfg.ScrubRate == 0 {
				ecfg.ScrubRate = -1
			}
		}
		n.rldev = rldev.NewService(rldev.ServiceConfig{Node: cfg.ID, Disks: disks, Meta: n.client, Detector: rldevDetector{n.status},
			Live: n, Log: n.log, Engine: ecfg, DataPath: cfg.RLDev.DataPath, Metrics: n.mx})
		n.guard.Handle(rldev.WireMagic, n.rldev.ServeConn)
		n.fence.OnFence(func(inc fd.Incarnation) { n.rldev.Fence(uint64(inc)) })
		pb.RegisterRLDevServiceServer(n.grpc, n.rldev)
		n.rlc = rldev.NewClerk(n.client)
		n.chunk = chunk.NewService(chunk.ServiceConfig{Node: cfg.ID, Meta: n.client, Locks: n.locks, RLDev: n.rlc,
			Local: n.rldev, Detector: n.status, Live: n, Log: n.log, Manager: chunk.Config{ResvLife: time.Duration(cfg.Chunk.ReservationLife)}, Metrics: n.mx})
		n.fence.OnFence(func(inc fd.Incarnation) { n.chunk.Fence(uint64(inc)) })
		pb.RegisterChunkServiceServer(n.grpc, n.chunk)
	}
	// Every node runs a B-tree server (it starts when a tree exists, or at
	// the first tree call).
	n.btc = chunk.NewClerk(n.client)
	n.btrl = rldev.NewClerk(n.client)
	n.btree = btree.NewService(btree.ServiceConfig{Node: cfg.ID, Meta: n.client, Locks: n.locks, Chunks: n.btc, RLDev: n.btrl, Log: n.log,
		Server: btree.ServerConfig{RepairEvery: time.Duration(cfg.BTree.RepairEvery), CacheNodes: cfg.BTree.CacheNodes, Metrics: n.mx},
		Silent: n.silent,
		OnFail: func(inc uint64, err error) {
			if d := n.fdp.Load(); d != nil {
				d.Resign(fd.Incarnation(inc), "its B-tree server failed: "+err.Error())
			}
		}})
	n.fence.OnFence(func(inc fd.Incarnation) { n.btree.Fence(uint64(inc)) })
	pb.RegisterTreeServiceServer(n.grpc, n.btree)
	// Every node runs a DDS brick (it holds replicas once a table's groups
	// list the node's incarnation).
	splitBytes := int(cfg.Tables.SplitBytes)
	if cfg.Tables.NoAutoSplit {
		splitBytes = -1
	}
	rebalance := time.Duration(0) // the default
	if cfg.Tables.NoAutoRebalance {
		rebalance = -1
	}
	n.tables = ddstable.NewService(ddstable.ServiceConfig{Node: cfg.ID, Meta: n.client, Detector: n.status, Live: n, Log: n.log, SplitBytes: splitBytes,
		Dir: filepath.Join(cfg.DataDir, "dds"), RebalanceEvery: rebalance})
	n.fence.OnFence(func(inc fd.Incarnation) { n.tables.Fence(uint64(inc)) })
	pb.RegisterTableServiceServer(n.grpc, n.tables)
	n.etcd = btree.NewEtcdKV(n.btree, cfg.BTree.EtcdTree, !cfg.BTree.EtcdLocal)
	etcdpb.RegisterKVServer(n.grpc, n.etcd)
	etcdpb.RegisterGroveForwardServer(n.grpc, n.etcd)
	go n.grpc.Serve(n.guard)

	keys, err := cfg.Keyring()
	if err != nil {
		udp.Close()
		return nil, err
	}
	n.fd, err = fd.StartDriver(fd.DriverConfig{
		Engine: fd.EngineConfig{Config: cfg.FDConfig(), Self: fd.NodeID(cfg.ID), Observe: cfg.Has(RoleObserver), Keys: keys,
			Replacement: replacement},
		ObserverAddrs: observerAddrs(cfg), Conn: udp, Log: n.log, Disk: disk.OS{}, Metrics: n.mx,
		IncarnationFile: filepath.Join(cfg.DataDir, "incarnation"),
		TombstoneFile:   filepath.Join(cfg.DataDir, "fd-tombstones.json"),
		Registered:      n.registered,
		Register:        n.register,
		OnFence:         n.fence.trip,
		OnIncarnation: func(inc fd.Incarnation) {
			n.log.Info("registered", "incarnation", inc)
			n.locks.Start(uint64(inc))
			if n.rldev != nil {
				n.rldev.Start(uint64(inc))
			}
			if n.chunk != nil {
				n.chunk.Start(uint64(inc))
			}
			n.btree.Start(uint64(inc))
			n.tables.Start(uint64(inc))
		},
		OnDriver: func(d *fd.Driver) { n.fdp.Store(d) },
	})
	if err != nil {
		udp.Close()
		return nil, err
	}
	n.wg.Add(1)
	go n.watchMembership()
	return n, nil
}

// openDisks opens (creating, if disk_size says so) the store's disks and
// reads or writes their headers.
func (n *Node) openDisks() ([]rldev.ServiceDisk, error) {
	var out []rldev.ServiceDisk
	for i, p := range n.cfg.Disks {
		path := p
		if !filepath.IsAbs(path) {
			path = filepath.Join(n.cfg.DataDir, path)
		}
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) && n.cfg.DiskSize == 0 {
			return nil, fmt.Errorf("node %d: disk %s does not exist (create it, or set disk_size to have the node create it)", n.cfg.ID, path)
		}
		dev, err := disk.OpenFileWith(path, int64(n.cfg.DiskSize), disk.FileOptions{DirectWrites: n.cfg.RLDev.DirectWrites})
		if err != nil {
			return nil, fmt.Errorf("node %d: %w", n.cfg.ID, err)
		}
		if n.cfg.RLDev.DirectWrites && !dev.Direct() {
			n.log.Warn("rldev direct_writes is on, but this disk takes buffered writes only (a block device, or a file system without direct I/O)", "disk", path)
		}
		n.devs = append(n.devs, dev)
		h, fresh, err := rldev.OpenDisk(dev, n.cfg.ID, uint32(i))
		if err != nil {
			return nil, fmt.Errorf("node %d: disk %s: %w", n.cfg.ID, path, err)
		}
		if fresh {
			n.log.Info("disk formatted", "disk", i, "path", path, "size", dev.Size(), "uuid", h.UUID)
		}
		out = append(out, rldev.ServiceDisk{Index: uint32(i), Path: p, Dev: dev, UUID: h.UUID})
	}
	return out, nil
}

// rldevDetector is the failure-detector service as the RLDev engine asks it.
type rldevDetector struct{ s *StatusService }

func (d rldevDetector) Dead(ctx context.Context, subjects []rldev.Subject) ([]bool, error) {
	subs := make([]lock.Subject, len(subjects))
	for i, s := range subjects {
		subs[i] = lock.Subject{Node: s.Node, Inc: s.Inc}
	}
	return d.s.Dead(ctx, subs)
}

// RLDev is the node's RLDev service (nil unless it is a store).
func (n *Node) RLDev() *rldev.Service { return n.rldev }

// Chunk is the node's chunk-manager service (nil unless it is a store).
func (n *Node) Chunk() *chunk.Service { return n.chunk }

// DirectDisks counts the node's RLDev disks, and those of them that take
// small writes past the page cache ([rldev] direct_writes where the disk
// allows it). Not after Close (which drops the disks).
func (n *Node) DirectDisks() (direct, disks int) {
	for _, d := range n.devs {
		if f, ok := d.(interface{ Direct() bool }); ok && f.Direct() {
			direct++
		}
	}
	return direct, len(n.devs)
}

// metaTiming: the options' timing (tests) over the config file's.
func metaTiming(cfg *Config, opt Options) meta.Timing {
	if opt.MetaTiming != (meta.Timing{}) {
		return opt.MetaTiming
	}
	return cfg.Raft.Timing()
}

// startMode is what --bootstrap-if-new decided for a member without raft
// state (clusterIsNew).
type startMode int

const (
	// startReplacement: the ordinary rule for a member without state
	// (confirmNotVoter: the cluster must not list it as a voter).
	startReplacement startMode = iota
	// startBootstrap: a new cluster; bootstrap from the member list.
	startBootstrap
	// startJoinNew: a cluster that has run, whose every other member
	// vouches that it never counted this member's vote or acknowledgement:
	// it never had state that mattered, and joins empty as the voter the
	// configuration lists; the leader catches it up.
	startJoinNew
)

// probeAnswer is one member's answer to clusterIsNew's probe.
type probeAnswer struct {
	id         uint64
	answered   bool
	commit     uint64
	term       uint64
	state      bool     // it has a configuration (raft state)
	known      bool     // it keeps the record of whom it counted (meta/counted.go)
	countedMe  bool     // ... and that record lists the member asking
	config     []uint64 // the members of its latest configuration
	configAddr map[uint64]string
}

// clusterIsNew decides --bootstrap-if-new for a member without raft state.
//
// The cluster is new only if every other member of the config file answers
// and none answers with a configuration and a commit index past the
// bootstrap entry (index 1: some leader has committed something) or a term
// past the bootstrap's (1: an election began, which with pre-vote on takes
// a live majority). A member that answers without state (it is deciding
// too: serveDeciding), or that bootstrapped moments ago and has not yet
// elected a leader, counts as new; then every member bootstraps the same
// configuration. A member that does not answer may be the one that holds
// what this member lost, so the member asks until it does, however long
// that takes (outside review 117: with a 10 s limit, a member that lost its
// data bootstrapped anew when the only member answering had never heard
// from the cluster after its bootstrap, term 1 and commit 0, while the
// member that had the cluster's decrees was down). The term matters after
// a whole cluster restarts: hashicorp/raft keeps no commit index on disk,
// so a member that has run answers commit 0 until a leader is elected
// (outside review 116).
//
// A cluster that has run is joined empty (startJoinNew) only if every other
// member of its configuration answers that it keeps a record of the peers
// whose raft answers it counted and that this member is not among them
// (meta/counted.go): a member that started late (a compose container a
// second behind the others) never voted or acknowledged anything that
// counted, so it has nothing to forget. A member that some other member
// counted has lost its state, and takes the ordinary path (startReplacement:
// `grove member remove`, start, `grove member add`). Until every member has
// answered (up to joinWait), it asks again.
//
// What the rule cannot see: members that the configuration gained but the
// config file does not list are not asked before one answers; and when
// every member that kept its state never heard from the cluster after the
// bootstrap, the decrees lived only on members that lost their data, and
// this one bootstraps anew. Two members without state that each found a
// cluster that has run cannot vouch for each other: both wait joinWait and
// take the ordinary path. A member that lost its data and came back
// through `grove member remove`/`add` vouches from a record begun then.
// Use it only where volumes are lost all together (a compose project's
// `down -v`).
func clusterIsNew(ctx context.Context, cfg *Config, members []meta.Member, log *slog.Logger) (startMode, string, error) {
	addrs := map[uint64]string{}
	for _, m := range members {
		if m.ID != cfg.ID {
			addrs[m.ID] = m.GRPCAddr
		}
	}
	log.Info("no raft state (--bootstrap-if-new): asking the other members whether their cluster has run; it bootstraps only once every member has answered")
	nextWarn := time.Now().Add(waitLogEvery)
	sawState := false // some member answered with raft state, in any round
	for {
		answers := probeMembers(ctx, cfg.ID, addrs)
		if ctx.Err() != nil {
			// The round's probes were cut short: no answers to read.
			return startReplacement, "", stopped(ctx)
		}
		if !sawState {
			for _, a := range answers {
				sawState = sawState || a.state
			}
		}
		ran, silent := newClusterRound(answers)
		if ran != nil {
			log.Info("another member's cluster has run: asking whether any member counted this one's vote or acknowledgement", "member", ran.id, "commit_index", ran.commit, "term", ran.term)
			return joinOrReplace(ctx, cfg.ID, addrs, answers, log)
		}
		if len(silent) == 0 {
			break
		}
		if time.Now().After(nextWarn) {
			log.Warn(waitingMessage(sawState), "silent", silent, "answers", describeAnswers(answers))
			nextWarn = time.Now().Add(waitLogEvery)
		}
		if err := pause(ctx, 500*time.Millisecond); err != nil {
			return startReplacement, "", err
		}
	}
	log.Info("bootstrapping a new config service (--bootstrap-if-new): every other member answered, and none has a cluster that has run")
	return startBootstrap, "", nil
}

// ErrStopped: the node was told to stop while a member without state
// waited for the other members (Options.Context).
var ErrStopped = errors.New("stopped while deciding whether to bootstrap or join")

// pause sleeps for d, or returns ErrStopped once ctx ends.
func pause(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return stopped(ctx)
	}
}

// stopped is ErrStopped, with the cause.
func stopped(ctx context.Context) error {
	return fmt.Errorf("node: %w (%v)", ErrStopped, context.Cause(ctx))
}

// waitingMessage is what a member waiting for silent members logs. Where a
// member answered with raft state (in any round: it may be silent now),
// the cluster may not be new: --bootstrap is then right only if no leader
// was ever elected (outside reviews 118 and 119: the advice alone could
// lead an operator to bootstrap a member that lost its data beside one
// that never heard from the cluster).
func waitingMessage(sawState bool) string {
	msg := "waiting for every member to answer before bootstrapping a new config service (--bootstrap-if-new): a member that does not answer may hold the cluster this member lost; start it"
	if sawState {
		return msg + ". A member answered with raft state, so this may not be a new cluster: never start this member with --bootstrap unless you know no leader was ever elected (if this member lost its data, it is replaced once the silent members are back: grove member remove, start, grove member add)"
	}
	return msg + ", or if this is a new cluster and that member will not start, start the members that did with --bootstrap instead"
}

// describeAnswers lists each member's answer for the log, in id order:
// "2: silent, 3: raft state, term 1, commit 0".
func describeAnswers(answers map[uint64]probeAnswer) string {
	ids := slices.Sorted(maps.Keys(answers))
	var b strings.Builder
	for i, id := range ids {
		if i > 0 {
			b.WriteString(", ")
		}
		a := answers[id]
		switch {
		case !a.answered:
			fmt.Fprintf(&b, "%d: silent", id)
		case !a.state:
			fmt.Fprintf(&b, "%d: no raft state", id)
		default:
			fmt.Fprintf(&b, "%d: raft state, term %d, commit %d", id, a.term, a.commit)
		}
	}
	return b.String()
}

// newClusterRound is clusterIsNew's reading of one round of answers: a
// member whose cluster has run (ran), or else the members that did not
// answer (silent, in order); neither means every member answered and the
// cluster is new.
func newClusterRound(answers map[uint64]probeAnswer) (ran *probeAnswer, silent []uint64) {
	ids := slices.Sorted(maps.Keys(answers))
	for _, id := range ids {
		a := answers[id]
		if hasRun(a) {
			return &a, nil
		}
		if !a.answered {
			silent = append(silent, id)
		}
	}
	return nil, silent
}

// hasRun reports whether an answer shows a cluster that has run: a
// configuration, and a commit index past the bootstrap entry or a term
// past the bootstrap's (clusterIsNew).
func hasRun(a probeAnswer) bool {
	return a.state && (a.commit > 1 || a.term > 1)
}

// waitLogEvery is how often a member without state that waits for the
// other members' answers says so in its log.
const waitLogEvery = 10 * time.Second

// joinWait bounds how long a member that found a cluster that has run asks
// for every other member's answer before it takes the ordinary path.
const joinWait = 15 * time.Second

// joinOrReplace asks until vouched gives a final answer or joinWait ends;
// it returns the mode and, for a replacement, why.
func joinOrReplace(ctx context.Context, self uint64, addrs map[uint64]string, answers map[uint64]probeAnswer, log *slog.Logger) (startMode, string, error) {
	deadline := time.Now().Add(joinWait)
	for {
		mode, why, final := vouched(self, answers)
		if mode == startJoinNew {
			log.Info("joining a cluster that has run as a new member (--bootstrap-if-new): every other member answers that it never counted this member's vote or acknowledgement; the leader will catch it up")
			return mode, "", nil
		}
		if final || time.Now().After(deadline) {
			log.Info("not joining as a new member", "why", why)
			return mode, why, nil
		}
		if err := pause(ctx, 500*time.Millisecond); err != nil {
			return startReplacement, "", err
		}
		for _, a := range answers {
			for id, addr := range a.configAddr {
				if _, ok := addrs[id]; !ok && id != self && addr != "" {
					addrs[id] = addr
				}
			}
		}
		answers = probeMembers(ctx, self, addrs)
		if ctx.Err() != nil {
			// Cut short: a round without answers would read as "not
			// listed" (outside review 119).
			return startReplacement, "", stopped(ctx)
		}
	}
}

// vouched is joinOrReplace's decision on one round of answers: startJoinNew,
// or startReplacement with the reason and whether asking again could
// change it.
func vouched(self uint64, answers map[uint64]probeAnswer) (mode startMode, why string, final bool) {
	need := map[uint64]bool{}
	listed := false
	for id, a := range answers {
		need[id] = true
		if !a.state {
			continue
		}
		for _, m := range a.config {
			listed = listed || m == self
			need[m] = true
		}
	}
	delete(need, self)
	stateful := false
	for _, a := range answers {
		stateful = stateful || a.state
	}
	if !stateful {
		// Nobody with raft state answered this round (restarting, cut
		// off): no configuration to read; ask again (outside review 119).
		return startReplacement, "no member with raft state answered", false
	}
	if !listed {
		return startReplacement, "no answering member's configuration lists this member (it is added with grove member add)", true
	}
	ids := slices.Sorted(maps.Keys(need))
	for _, id := range ids {
		a, ok := answers[id]
		switch {
		case ok && a.answered && a.countedMe:
			return startReplacement, fmt.Sprintf("member %d counted this member's vote or acknowledgement: this member lost its raft state", id), true
		case ok && a.answered && a.state && !a.known:
			// (A member without state, deciding too, keeps no record
			// either: it is asked again below, not final.)
			return startReplacement, fmt.Sprintf("member %d keeps no record of whom it counted (it had state before it kept one): it cannot vouch", id), true
		}
	}
	for _, id := range ids {
		a, ok := answers[id]
		switch {
		case !ok || !a.answered:
			return startReplacement, fmt.Sprintf("member %d did not answer", id), false
		case !a.state:
			// A member with no raft state started from an empty
			// directory too: its record is as new as it is, and it may
			// itself have lost one that counted this member. It vouches
			// once the leader has caught it up (its record then covers
			// the life that began with a vouched join).
			return startReplacement, fmt.Sprintf("member %d has no raft state yet: it cannot vouch", id), false
		}
	}
	return startJoinNew, "", true
}

// probeMembers asks each member (id to gRPC address) for its configuration,
// commit index and record of counted peers (does it list self?), for up
// to 3 s.
func probeMembers(ctx context.Context, self uint64, addrs map[uint64]string) map[uint64]probeAnswer {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	var p transport.Pool
	defer p.Close()
	ch := make(chan probeAnswer, len(addrs))
	for id, addr := range addrs {
		go func() {
			a := probeAnswer{id: id}
			defer func() { ch <- a }()
			cc, err := p.Get(addr)
			if err != nil {
				return
			}
			r, err := pb.NewConfigServiceClient(cc).Members(ctx, &pb.MembersRequest{VouchFor: self})
			if err != nil {
				return
			}
			a.answered, a.commit, a.term, a.state, a.known = true, r.CommitIndex, r.Term, len(r.Members) > 0, r.CountedKnown
			a.configAddr = map[uint64]string{}
			for _, m := range r.Members {
				a.config = append(a.config, m.Id)
				a.configAddr[m.Id] = m.GrpcAddr
			}
			for _, c := range r.Counted {
				a.countedMe = a.countedMe || c == self
			}
		}()
	}
	out := map[uint64]probeAnswer{}
	for range addrs {
		a := <-ch
		out[a.id] = a
	}
	return out
}

// confirmNotVoter is the rule that keeps a config-service member that lost
// its raft state from voting again in the cluster it was part of (a voter
// that forgot its vote can help elect a second leader in a term): before it
// starts, another member must confirm that the current configuration does
// not list it. The operator removes it first (`grove member remove`), starts
// it, and adds it back (`grove member add`).
func confirmNotVoter(parent context.Context, cfg *Config, members []meta.Member, timeout time.Duration) error {
	if timeout == 0 {
		timeout = 30 * time.Second
	}
	var others []meta.Member
	for _, m := range members {
		if m.ID != cfg.ID {
			others = append(others, m)
		}
	}
	if len(others) == 0 {
		return fmt.Errorf("node %d: the only config-service member has no raft state; start it with --bootstrap to create a new cluster", cfg.ID)
	}
	c := meta.NewClient(others)
	defer c.Close()
	ctx, cancel := context.WithTimeout(parent, timeout)
	defer cancel()
	// A removal just made may not have reached the member that answers:
	// look again for a few seconds before refusing. Only the leader's
	// committed configuration counts (ConfirmedMembers): another member's
	// latest one, or a removal appended but not committed, may be undone,
	// and this member's vote would then count again in the configuration
	// that still lists it (outside review 112: a committed decree lost).
	listed := time.Time{}
	for {
		r, err := c.ConfirmedMembers(ctx)
		if err != nil {
			return fmt.Errorf("node %d: this config-service member has no raft state and no other member answered to confirm it may join (%v); "+
				"if this is a brand-new cluster, start every member with --bootstrap (grove up does)", cfg.ID, err)
		}
		found := false
		for _, m := range r.Members {
			found = found || m.Id == cfg.ID
		}
		if !found {
			return nil
		}
		if listed.IsZero() {
			listed = time.Now()
		}
		if time.Since(listed) > 5*time.Second {
			return fmt.Errorf("node %d: this config-service member has no raft state, but the cluster still lists it as a voter (it lost its data?). "+
				"A voter that forgot its vote could elect a second leader, so it will not start: run `grove member remove %d` against the cluster, "+
				"start this node again, then `grove member add %d`", cfg.ID, cfg.ID, cfg.ID)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("node %d: the cluster still lists this member without raft state: %w", cfg.ID, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func observerAddrs(cfg *Config) map[fd.NodeID]string {
	m := map[fd.NodeID]string{}
	for _, mc := range cfg.Members {
		m[fd.NodeID(mc.ID)] = mc.Beacon
	}
	return m
}

// registered reads, linearizably, the incarnation the config service has
// registered for this node: a new incarnation is taken above it, so that a
// node whose data directory was lost never reuses one (nor a clerk id).
func (n *Node) registered(ctx context.Context) (fd.Incarnation, error) {
	ns, err := n.client.Read(ctx, meta.NodesNamespace)
	if err != nil {
		return 0, err
	}
	r, err := meta.Registered(ns, n.cfg.ID)
	if err != nil || r == nil {
		return 0, err
	}
	return fd.Incarnation(r.Incarnation), nil
}

// register records incarnation inc in the membership namespace. The failure
// detector calls it before the incarnation beacons: observers echo only
// registered incarnations.
func (n *Node) register(ctx context.Context, inc fd.Incarnation) error {
	rec := &pb.Node{Id: n.cfg.ID, GrpcAddr: n.cfg.GRPCAddr, BeaconAddr: n.cfg.BeaconAddr, RaftAddr: n.cfg.RaftAddr,
		Roles: n.cfg.Roles, Disks: n.cfg.Disks, Incarnation: uint64(inc), Features: []string{rldev.FeatureSeqConns, btree.FeatureDone, btree.FeatureFloors}}
	err := meta.RegisterNode(ctx, n.client, rec)
	if errors.Is(err, meta.ErrOldIncarnation) {
		return errors.Join(fd.ErrIncarnationTaken, err)
	}
	return err
}

// watchMembership feeds the failure detector the registered nodes.
func (n *Node) watchMembership() {
	defer n.wg.Done()
	feedMembership(n.ctx, n.client.Read, n.client.Watch, n.fd.SetMembership, n.log)
}

// feedMembership gives set the membership namespace: first as read
// linearizably, after the failure detector started, then every newer
// version the watch brings. The first membership must not be older than
// the detector's start: a replacement observer takes every incarnation
// registered in it as one whose verdict it cannot know (fd's
// preexisting), and a watch may be served by a replica that lags
// (outside review 110: an incarnation the lost observer had condemned,
// missing from a stale first snapshot, would have been echoed). Until the
// read answers the observer echoes nobody.
func feedMembership(ctx context.Context, read func(context.Context, string) (*pb.Namespace, error),
	watch func(context.Context, string, uint64) <-chan *pb.Namespace, set func(uint64, map[fd.NodeID]fd.Registration), log *slog.Logger) {
	apply := func(ns *pb.Namespace) {
		nodes, err := meta.DecodeNodes(ns)
		if err != nil {
			log.Warn("membership does not decode", "err", err)
			return
		}
		regs := map[fd.NodeID]fd.Registration{}
		for _, r := range nodes {
			regs[fd.NodeID(r.Id)] = fd.Registration{Incarnation: fd.Incarnation(r.Incarnation), BeaconAddr: r.BeaconAddr}
		}
		set(ns.Version, regs)
	}
	var ns *pb.Namespace
	for ns == nil {
		var err error
		if ns, err = read(ctx, meta.NodesNamespace); err != nil {
			if ctx.Err() != nil {
				return
			}
			log.Warn("membership read failed; trying again", "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(500 * time.Millisecond):
			}
		}
	}
	apply(ns)
	for ns := range watch(ctx, meta.NodesNamespace, ns.Version) {
		apply(ns)
	}
}

// ID and Fence expose the node's identity and self-fence to the roles of
// later layers.
func (n *Node) ID() uint64    { return n.cfg.ID }
func (n *Node) Fence() *Fence { return n.fence }

// Alive is the node's own liveness (the self-fence): false before the
// failure detector runs, while joining, and once fenced.
func (n *Node) Alive() bool {
	d := n.fdp.Load()
	return d != nil && d.Alive()
}

// silent reports whether this node's failure detector, as an observer,
// has heard nothing from node id for longer than the grace period (a node
// the detector may declare dead). False when this node observes nothing,
// or has not heard of id: a hint for work another node can take over (the
// B-tree's repair pass), never a verdict.
func (n *Node) silent(id uint64) bool {
	d := n.fdp.Load()
	if d == nil {
		return false
	}
	for _, v := range d.Views() {
		if uint64(v.Node) == id {
			return v.Silence > time.Duration(n.cfg.FD.GracePeriod)
		}
	}
	return false
}

// AliveAs reports whether inc is the node's running incarnation and alive
// now (lock.Liveness): leases are bound to their incarnation.
func (n *Node) AliveAs(inc uint64) bool {
	d := n.fdp.Load()
	return d != nil && d.AliveAs(fd.Incarnation(inc))
}

// Deadline is the local time until which incarnation inc is guaranteed
// alive, if it is running and alive now (lock.Liveness).
func (n *Node) Deadline(inc uint64) (time.Time, bool) {
	d := n.fdp.Load()
	if d == nil {
		return time.Time{}, false
	}
	return d.Deadline(fd.Incarnation(inc))
}

// Metrics is the node's metrics, for the layers to come.
func (n *Node) Metrics() *metrics.Node { return n.mx }

// Locks is the node's lock service.
func (n *Node) Locks() *lock.Service { return n.locks }

// BTree is the node's B-tree role.
func (n *Node) BTree() *btree.Service { return n.btree }

// Etcd is the node's etcd-compatible endpoint (nil without a B-tree role).
func (n *Node) Etcd() *btree.EtcdKV { return n.etcd }

// Crash stops the node as a crash would, as far as a process can in
// itself: the B-tree role stops without writing anything back, then every
// other role stops (tests that kill a node in-process).
func (n *Node) Crash() {
	if n.btree != nil {
		n.btree.Crash()
	}
	n.Close()
}

// Close stops every role, in reverse order of start. Safe to call twice.
func (n *Node) Close() {
	n.cancel()
	if n.tables != nil {
		n.tables.Close()
	}
	if n.btree != nil {
		n.btree.Close() // its dirty nodes go to their chunks first
		n.btc.Close()
		n.btrl.Close()
	}
	if n.chunk != nil {
		n.chunk.Close()
		n.rlc.Close()
	}
	if n.locks != nil {
		n.locks.Close()
	}
	if n.rldev != nil {
		n.rldev.Close() // its disk writes in flight land first
	}
	for _, d := range n.devs {
		d.Close()
	}
	n.devs = nil
	if n.fd != nil {
		n.fd.Close()
	}
	if n.grpc != nil {
		n.grpc.Stop()
	}
	if n.guard != nil {
		// Stop closed it if it served; a Start that failed before serving
		// (a refused member without state) must free the port too.
		n.guard.Close()
	}
	if n.etcd != nil {
		n.etcd.Close() // (after the gRPC server: no call forwards any more)
	}
	if n.web != nil {
		n.web.Close()
	}
	if n.meta != nil {
		if err := n.meta.Close(); err != nil {
			n.log.Warn("closing config-service replica", "err", err)
		}
	}
	if n.client != nil {
		n.client.Close()
	}
	if n.status != nil {
		n.status.Close()
	}
	n.wg.Wait()
	if n.lock != nil {
		n.lock.Close()
		n.lock = nil
	}
}

// lockDir takes an exclusive lock on the data directory, so that two
// processes never run one node, and writes this process's pid into the
// lock file (`grove down` reads it, and trusts it only while the lock is
// held: a stale pid of a process long gone is never signalled).
func lockDir(dir string) (*os.File, error) {
	f, err := LockFile(filepath.Join(dir, "LOCK"))
	if err != nil {
		return nil, fmt.Errorf("data directory %s is in use by another grove process: %w", dir, err)
	}
	return f, nil
}

// ErrLocked is LockFile's error when another process holds the lock.
var ErrLocked = errors.New("locked by another process")

// LockFile takes an exclusive flock on path (created if missing) and
// writes this process's pid into it. The lock lasts until the file is
// closed or the process exits.
func LockFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if pid, _ := readPID(path); pid > 0 {
			return nil, fmt.Errorf("%w (pid %d)", ErrLocked, pid)
		}
		return nil, ErrLocked
	}
	if err := f.Truncate(0); err == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}

// LockHolder reports the pid of the process holding the lock file at path,
// or 0 if no process holds it (the file may be missing, or left by a
// process that is gone). It never takes the lock for longer than the test.
func LockHolder(path string) (int, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err == nil {
		syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		return 0, nil // nobody holds it
	}
	// The holder writes its pid just after it takes the lock (LockFile
	// truncates, then writes): a process that is starting may be between
	// the two. Give it a moment.
	var pid int
	for try := 0; try < 20; try++ {
		if pid, err = readPID(path); err == nil && pid > 0 {
			return pid, nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return 0, fmt.Errorf("%s is locked but names no pid", path)
}

func readPID(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// Fence is the node's self-fence: lease-protected services register a stop
// function, and check Valid before acting. The failure detector trips it
// when the node considers itself dead.
type Fence struct {
	mu    sync.Mutex
	stops []func(fd.Incarnation)
}

// OnFence registers fn to run (synchronously, before a new incarnation
// starts) whenever the node fences itself.
func (f *Fence) OnFence(fn func(fd.Incarnation)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stops = append(f.stops, fn)
}

func (f *Fence) trip(inc fd.Incarnation) {
	f.mu.Lock()
	stops := append([]func(fd.Incarnation){}, f.stops...)
	f.mu.Unlock()
	for _, s := range stops {
		s(inc)
	}
}

type observerService struct {
	pb.UnimplementedObserverServiceServer
	n *Node
}

// MaxQuerySubjects bounds one observer query.
const MaxQuerySubjects = 4096

func (o *observerService) Query(ctx context.Context, req *pb.QueryRequest) (*pb.QueryResponse, error) {
	if len(req.Subjects) > MaxQuerySubjects {
		return nil, status.Errorf(codes.InvalidArgument, "%d subjects > %d", len(req.Subjects), MaxQuerySubjects)
	}
	qs := make([]fd.Question, len(req.Subjects))
	for i, s := range req.Subjects {
		qs[i] = fd.Question{Node: fd.NodeID(s.Node), Inc: fd.Incarnation(s.Incarnation)}
	}
	dead, heard, err := o.n.fd.Query(ctx, qs)
	switch {
	case errors.Is(err, fd.ErrNotObserver):
		return nil, status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, fd.ErrNoMajority), errors.Is(err, fd.ErrVerdictNotDurable), errors.Is(err, fd.ErrClockUntrusted):
		return nil, status.Error(codes.Unavailable, err.Error())
	case err != nil:
		return nil, status.FromContextError(err).Err()
	}
	return &pb.QueryResponse{Observer: o.n.cfg.ID, Dead: dead, Heard: heard}, nil
}

// Tables is the node's DDS brick.
func (n *Node) Tables() *ddstable.Service { return n.tables }
