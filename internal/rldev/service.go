package rldev

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/disk"
	"github.com/grovestore/grove/internal/meta"
	"github.com/grovestore/grove/internal/metrics"
	"github.com/grovestore/grove/internal/ratelog"
	"github.com/grovestore/grove/internal/transport"
)

// Detector is the failure-detector service as the RLDev engine uses it:
// which node incarnations are dead (final verdicts).
type Detector interface {
	Dead(ctx context.Context, subjects []Subject) ([]bool, error)
}

// Liveness is the node's view of itself, per incarnation.
type Liveness interface {
	// Deadline is the local time until which inc is guaranteed alive (no
	// dead verdict on it can come earlier), if inc is running and alive.
	Deadline(inc uint64) (time.Time, bool)
}

// ServiceDisk is one of the node's disks, opened (OpenDisk has read or
// written its header).
type ServiceDisk struct {
	Index uint32
	Path  string
	Dev   disk.Device
	UUID  string
}

// ServiceConfig wires the RLDev runtime into a node.
type ServiceConfig struct {
	Node     uint64
	Disks    []ServiceDisk
	Meta     *meta.Client
	Detector Detector
	Live     Liveness
	Log      *slog.Logger
	// Engine tunes the engines (Node, Inc and Disks are filled in).
	Engine Config
	// Tick is how often the engine is ticked (default 50 ms).
	Tick time.Duration
	// DiskWorkers is how many I/Os run at once per disk (default 16).
	DiskWorkers int
	// LinkQueue bounds the bytes waiting on one peer link (default 64
	// MiB); a full queue breaks the link (what matters is resent).
	LinkQueue int64
	// DataPath is how this node's peer links carry their messages:
	// DataPathTCP (the default, frames.go) or DataPathGRPC (a gRPC stream).
	// A node accepts both.
	DataPath string
	// Metrics, if set, exports the engine's counters
	// (grove_rldev_events_total).
	Metrics *metrics.Node
}

// The data paths (frames.go).
const (
	DataPathTCP  = "tcp"
	DataPathGRPC = "grpc"
)

// MaxIO bounds one client read or write.
const MaxIO = 8 << 20

// Service is a node's RLDev runtime: the thin driver of one Engine per
// node incarnation. It carries out the engine's effects (disk I/O on
// worker goroutines, peer links, decrees, failure-detector questions,
// table reads) and feeds it their completions, the watched table and
// membership, and ticks. All decisions are the engine's; the simulator
// drives the same engine. It implements pb.RLDevServiceServer.
//
// Peer links: a node dials one link to each node it sends to (one per
// direction of a pair: each carries its dialer's messages in order). A
// link is bound to the two engines' incarnations by its hellos; a new
// engine here closes every link, so no message of an earlier life is
// delivered to a later one, nor sent by one. An outgoing link's state is
// the engine's PeerUp/PeerDown.
type Service struct {
	pb.UnimplementedRLDevServiceServer
	cfg   ServiceConfig
	log   *slog.Logger
	ctx   context.Context
	stop  context.CancelFunc
	wg    sync.WaitGroup
	conns transport.Pool
	disks map[uint32]*diskQueue
	mu    struct {
		sync.Mutex
		eng     *Engine // nil between a fence and the next start
		gen     *generation
		want    uint64 // the incarnation to run (the latest Start)
		fenced  uint64 // the latest incarnation fenced
		table   *Table // the latest table seen (a hint until read linearizably)
		nodes   map[NodeID]uint64
		addrs   map[NodeID]string
		reqs    map[ReqID]*waiter
		nextReq ReqID
		// loans are the buffers lent to client reads (DiskRead.Lend), by
		// request, from the read's completion to its reply: the reply
		// gives its buffer back once sent, if its data is that buffer.
		loans   map[ReqID][]byte
		out     map[NodeID]*outLink
		in      map[NodeID]*inLink
		refresh bool // a linearizable table read is in flight
		// The clerks' sequenced data connections (admitClerkConn), by
		// clerk identity.
		clerks       map[uint64]*clerkConns
		clerksPruned time.Time
	}
	started sync.Once
	// The data path (dataconn.go): a slot per connection served, and the
	// limiter of its warnings.
	dataConns chan struct{}
	warned    *ratelog.Limiter
}

// generation is one engine's life: its links end with ctx, and its disk
// operations are counted so that the next engine starts only after they
// have all landed (a write of a past life landing under a new one could
// undo the new one's recovery).
type generation struct {
	e      *Engine
	ctx    context.Context
	cancel context.CancelFunc
	ops    sync.WaitGroup

	// What the engine sent its own node (a move to another of its
	// disks), delivered in order by one goroutine at a time; under s.mu.
	selfQ    []any
	selfBusy bool
}

type waiter struct {
	ch chan Reply
	// fn, instead of ch, runs under the service's lock and must not
	// block; back, if not nil, gives the reply's data back to physBufs
	// and is to be called once nothing holds the data any more (or never).
	fn    func(r Reply, back func())
	write bool
	id    uint64
	// inc is the incarnation of the engine the request was begun on, set
	// by begin: the one whose reply (or fence) answers it.
	inc uint64
}

func (w *waiter) reply(r Reply) { w.replyLent(r, nil) }

// replyLent is reply with a way to give r.Data back (waiter.fn).
func (w *waiter) replyLent(r Reply, back func()) {
	if w.fn != nil {
		w.fn(r, back)
		return
	}
	w.ch <- r // gRPC may hold a message after sending it: nothing goes back
}

type diskQueue struct {
	dev  disk.Device
	jobs chan func()
}

type outLink struct {
	to     NodeID
	gen    *generation
	q      chan *pb.RLDevServicePeerRequest
	bytes  atomic.Int64
	up     bool
	cancel context.CancelFunc // of the current stream
}

type inLink struct {
	inc    uint64
	cancel context.CancelFunc
}

// NewService returns a stopped service with its disks' workers running;
// Start begins each incarnation.
func NewService(cfg ServiceConfig) *Service {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Tick == 0 {
		cfg.Tick = 50 * time.Millisecond
	}
	if cfg.DiskWorkers == 0 {
		cfg.DiskWorkers = 16
	}
	if cfg.LinkQueue == 0 {
		cfg.LinkQueue = 64 << 20
	}
	s := &Service{cfg: cfg, log: cfg.Log.With("layer", "rldev"), disks: map[uint32]*diskQueue{},
		dataConns: make(chan struct{}, maxDataConns), warned: ratelog.New(5 * time.Second)}
	s.ctx, s.stop = context.WithCancel(context.Background())
	s.mu.nodes, s.mu.addrs = map[NodeID]uint64{}, map[NodeID]string{}
	s.mu.reqs = map[ReqID]*waiter{}
	s.mu.loans = map[ReqID][]byte{}
	s.mu.out, s.mu.in = map[NodeID]*outLink{}, map[NodeID]*inLink{}
	s.registerMetrics(cfg.Metrics)
	for _, d := range cfg.Disks {
		q := &diskQueue{dev: d.Dev, jobs: make(chan func(), 1024)}
		s.disks[d.Index] = q
		for i := 0; i < cfg.DiskWorkers; i++ {
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				for {
					select {
					case job := <-q.jobs:
						job()
					case <-s.ctx.Done():
						return
					}
				}
			}()
		}
	}
	return s
}

// registerMetrics exports the running engine's counters, read at scrape
// time (from zero again with each engine: each incarnation of the node).
func (s *Service) registerMetrics(m *metrics.Node) {
	if m == nil {
		return
	}
	for _, c := range []struct {
		event string
		get   func(Stats) uint64
	}{
		{"write", func(st Stats) uint64 { return st.Writes }},
		{"read", func(st Stats) uint64 { return st.Reads }},
		{"forward", func(st Stats) uint64 { return st.Forwards }},
		{"repair", func(st Stats) uint64 { return st.Repairs }},
		{"copied_block", func(st Stats) uint64 { return st.CopiedBlocks }},
		{"pulled_block", func(st Stats) uint64 { return st.PulledBlocks }},
		{"degraded_write", func(st Stats) uint64 { return st.DegradedWrites }},
		{"corrupt_found", func(st Stats) uint64 { return st.CorruptFound }},
		{"scrubbed_block", func(st Stats) uint64 { return st.ScrubbedBlocks }},
		{"scrub_repair", func(st Stats) uint64 { return st.ScrubRepairs }},
		{"disk_hang", func(st Stats) uint64 { return st.DiskHangs }},
		{"forward_resent", func(st Stats) uint64 { return st.Resends }},
		{"forward_duplicate", func(st Stats) uint64 { return st.Duplicates }},
		{"landed_before", func(st Stats) uint64 { return st.LandedBefore }},
		{"landed_forgotten", func(st Stats) uint64 { return st.LandedForgotten }},
		{"landed_stale", func(st Stats) uint64 { return st.LandedStale }},
	} {
		m.CounterFunc("grove_rldev_events_total", "Events of this node's RLDev engine, by kind: client writes and reads served, writes forwarded to a mirror, blocks repaired from the peer, blocks copied by resyncs and moves and pulled by targets, writes logged in degraded mode, corrupt blocks found, blocks scrubbed and repaired by the scrubber, disks found hung (their segments failed), forwards sent again unanswered and forwards received again while being written (a slow peer), client writes not applied again as an earlier attempt had landed, times a copy forgot the writes that landed on it (another copy's blocks landed), and writes that had landed but found their blocks older or corrupt (applied again).",
			map[string]string{"event": c.event}, func() float64 {
				s.mu.Lock()
				defer s.mu.Unlock()
				if s.mu.eng == nil {
					return 0
				}
				return float64(c.get(s.mu.eng.Stats()))
			})
	}
}

// Start begins incarnation inc: a new engine, once every disk operation
// of the previous one has landed. It returns at once.
func (s *Service) Start(inc uint64) {
	s.started.Do(func() {
		s.wg.Add(3)
		go s.watchTable()
		go s.watchNodes()
		go s.ticker()
	})
	s.mu.Lock()
	if inc <= s.mu.want || inc <= s.mu.fenced {
		s.mu.Unlock()
		return
	}
	s.mu.want = inc
	if s.mu.eng != nil {
		s.fenceLocked("a new incarnation started") // a missed fence
	}
	old := s.mu.gen
	s.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if old != nil {
			old.ops.Wait()
		}
		var disks []LocalDisk
		for _, d := range s.cfg.Disks {
			// Suspect, always: an earlier engine of this process may
			// have been fenced while a sync failed (its failure went to
			// no one), and an earlier process may have died after one
			// (Linux reports it once, to that process), leaving the lost
			// pages cached. Each replica's first load drops its
			// segment's pages (a sync, fadvise, cachestat), so reads
			// after a restart start from the disk.
			disks = append(disks, LocalDisk{Index: d.Index, Size: d.Dev.Size(), Path: d.Path, UUID: d.UUID, Suspect: true})
		}
		cfg := s.cfg.Engine
		cfg.Node, cfg.Inc, cfg.Disks = s.cfg.Node, inc, disks
		e := NewEngine(cfg)
		g := &generation{e: e}
		g.ctx, g.cancel = context.WithCancel(s.ctx)
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.mu.want != inc || inc <= s.mu.fenced || s.mu.gen != old || s.ctx.Err() != nil {
			return // fenced before it began, or a later incarnation asked for
		}
		s.mu.eng, s.mu.gen = e, g
		s.log.Info("rldev engine started", "incarnation", inc)
		if t := s.mu.table; t != nil {
			s.execLocked(g, e.SetTable(s.env(e), t, false, s.mu.nodes))
		}
		s.ensureLinksLocked(g)
		s.refreshLocked(g)
	}()
}

// Fence ends incarnation inc: its engine stops, requests in progress fail
// (a write among them may have landed), its links close. Called
// synchronously by the node's self-fence.
func (s *Service) Fence(inc uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mu.fenced = max(s.mu.fenced, inc) // an engine of inc not started yet never will be
	if e := s.mu.eng; e != nil && e.Incarnation() == inc {
		s.fenceLocked("the node fenced itself")
	}
}

func (s *Service) fenceLocked(why string) {
	g := s.mu.gen
	inc := s.mu.eng.Incarnation()
	s.mu.eng = nil
	g.cancel()
	clear(s.mu.loans)
	for id, w := range s.mu.reqs {
		delete(s.mu.reqs, id)
		err := fmt.Errorf("%w: node %d: %s", ErrNotServing, s.cfg.Node, why)
		if w.write {
			err = fmt.Errorf("%w (%w)", err, ErrMaybeWritten)
		}
		w.reply(Reply{Req: id, Err: err})
	}
	for n, l := range s.mu.in {
		l.cancel()
		delete(s.mu.in, n)
	}
	for n := range s.mu.out {
		delete(s.mu.out, n)
	}
	s.log.Warn("rldev engine stopped", "incarnation", inc, "why", why)
}

// Close stops the service (the engine stops as if fenced; its disk
// operations in flight land before Close returns).
func (s *Service) Close() {
	s.mu.Lock()
	s.mu.fenced = max(s.mu.fenced, s.mu.want) // no engine starts from now on
	g := s.mu.gen
	if s.mu.eng != nil {
		s.fenceLocked("shutting down")
	}
	s.mu.Unlock()
	if g != nil {
		g.ops.Wait()
	}
	s.stop()
	s.wg.Wait()
	s.conns.Close()
}

// env is the engine's view of now.
func (s *Service) env(e *Engine) Env {
	env := Env{Now: time.Now()}
	if d, ok := s.cfg.Live.Deadline(e.Incarnation()); ok {
		env.Deadline = d
	}
	return env
}

// do runs fn on generation g's engine, if it is still the current one, and
// carries out its effects.
func (s *Service) do(g *generation, fn func(Env) []any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.gen != g || s.mu.eng == nil {
		return
	}
	s.execLocked(g, fn(s.env(g.e)))
}

// execLocked carries out the effects, in order. Nothing here blocks.
func (s *Service) execLocked(g *generation, out []any) {
	e := g.e
	for _, o := range out {
		switch x := o.(type) {
		case DiskRead:
			if x.Run != nil {
				s.diskJob(g, x.Disk, func(dev disk.Device) func(Env) []any {
					read := ReadRun
					if x.Lend != 0 {
						read = ReadRunLent
					}
					res, err := read(dev, x.Off, *x.Run)
					return func(env Env) []any {
						if x.Lend != 0 && err == nil && len(res.Data) > 0 && s.mu.reqs[x.Lend] != nil {
							s.mu.loans[x.Lend] = res.Data
						}
						return e.RunDone(env, x.Op, res, err)
					}
				})
				continue
			}
			s.diskOp(g, x.Disk, x.Op, func(dev disk.Device) ([]byte, error) {
				buf := make([]byte, x.Len)
				_, err := dev.ReadAt(buf, x.Off)
				return buf, err
			})
		case DiskWrite:
			s.diskOp(g, x.Disk, x.Op, func(dev disk.Device) ([]byte, error) { return nil, DoWrite(dev, x) })
		case DiskSync:
			s.diskOp(g, x.Disk, x.Op, func(dev disk.Device) ([]byte, error) { return nil, dev.Sync() })
		case DiskDrop:
			s.diskOp(g, x.Disk, x.Op, func(dev disk.Device) ([]byte, error) { return nil, dev.DropCache(x.Off, x.Len) })
		case Send:
			if x.To == s.cfg.Node {
				s.sendSelfLocked(g, x.Msg)
			} else {
				s.sendLocked(g, x.To, x.Msg)
			}
		case Reply:
			loan := s.mu.loans[x.Req]
			delete(s.mu.loans, x.Req)
			if w := s.mu.reqs[x.Req]; w != nil {
				delete(s.mu.reqs, x.Req)
				var back func()
				if len(loan) > 0 && len(x.Data) > 0 && &x.Data[0] == &loan[0] {
					back = func() { putPhys(loan) }
				}
				w.replyLent(x, back)
			}
		case Propose:
			s.async(g, 10*time.Second, func(ctx context.Context) func(Env) []any {
				_, err := s.cfg.Meta.Propose(ctx, &pb.Decree{Namespace: Namespace, ExpectedVersion: x.Version, Ops: x.Ops,
					Origin: fmt.Sprintf("rldev node %d: %s", s.cfg.Node, x.What)})
				return func(env Env) []any { return e.Decided(env, x.ID, err) }
			})
		case AskDead:
			s.async(g, 2*time.Second, func(ctx context.Context) func(Env) []any {
				dead, err := s.cfg.Detector.Dead(ctx, x.Subjects)
				return func(env Env) []any {
					if err != nil || len(dead) != len(x.Subjects) {
						return nil // asked again at the next poll
					}
					var out []any
					for i, sub := range x.Subjects {
						out = append(out, e.Verdict(env, sub, dead[i])...)
					}
					return out
				}
			})
		case Refresh:
			s.refreshLocked(g)
		case Log:
			lvl := []slog.Level{slog.LevelDebug, slog.LevelInfo, slog.LevelWarn, slog.LevelError}[min(max(x.Level, 0), 3)]
			s.log.Log(context.Background(), lvl, x.Msg, append([]any{"incarnation", e.Incarnation()}, x.Args...)...)
		default:
			panic(fmt.Sprintf("rldev: unknown effect %T", o))
		}
	}
}

// diskOp runs io on disk idx's workers; its completion goes to the engine.
func (s *Service) diskOp(g *generation, idx uint32, op OpID, io func(disk.Device) ([]byte, error)) {
	s.diskJob(g, idx, func(dev disk.Device) func(Env) []any {
		data, err := io(dev)
		return func(env Env) []any { return g.e.DiskDone(env, op, data, err) }
	})
}

// diskJob runs io on disk idx's workers, then what it returns on the
// engine.
func (s *Service) diskJob(g *generation, idx uint32, io func(disk.Device) func(Env) []any) {
	q := s.disks[idx]
	if q == nil {
		panic(fmt.Sprintf("rldev: the engine used disk %d, which the node does not have", idx))
	}
	g.ops.Add(1)
	job := func() {
		k := io(q.dev)
		g.ops.Done()
		s.do(g, k)
	}
	select {
	case q.jobs <- job:
	default:
		go func() { // the queue is full: wait for room off the lock
			select {
			case q.jobs <- job:
			case <-s.ctx.Done():
				g.ops.Done()
			}
		}()
	}
}

// async runs io off the lock; its completion goes to generation g.
func (s *Service) async(g *generation, timeout time.Duration, io func(ctx context.Context) func(Env) []any) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		ctx, cancel := context.WithTimeout(g.ctx, timeout)
		k := io(ctx)
		cancel()
		s.do(g, k)
	}()
}

// sendSelfLocked delivers a message the engine sent its own node, after
// the effects being carried out now and in the order sent (a session to
// itself). A forward's data is copied: the engine's write may end, and its
// buffer go back to its client, before the target has written it.
func (s *Service) sendSelfLocked(g *generation, msg any) {
	if f, ok := msg.(Forward); ok {
		f.Data = bytes.Clone(f.Data)
		msg = f
	}
	g.selfQ = append(g.selfQ, msg)
	if g.selfBusy {
		return
	}
	g.selfBusy = true
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.mu.Lock()
		defer s.mu.Unlock()
		for len(g.selfQ) > 0 && s.mu.gen == g && s.mu.eng != nil {
			q := g.selfQ
			g.selfQ = nil
			for _, m := range q {
				s.execLocked(g, g.e.Deliver(s.env(g.e), s.cfg.Node, m))
			}
		}
		g.selfQ, g.selfBusy = nil, false
	}()
}

// refreshLocked reads the table linearizably (one read at a time).
func (s *Service) refreshLocked(g *generation) {
	if s.mu.refresh {
		return
	}
	s.mu.refresh = true
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for wait := 100 * time.Millisecond; ; wait = min(2*wait, 2*time.Second) {
			ctx, cancel := context.WithTimeout(g.ctx, 5*time.Second)
			ns, err := s.cfg.Meta.Read(ctx, Namespace)
			cancel()
			var t *Table
			if err == nil {
				if t, err = DecodeTable(ns); err != nil {
					s.log.Error("rldev table does not decode", "err", err)
				}
			}
			if err == nil {
				s.mu.Lock()
				s.mu.refresh = false
				if s.mu.table == nil || t.Version >= s.mu.table.Version {
					s.mu.table = t
				}
				if s.mu.gen == g && s.mu.eng != nil {
					s.execLocked(g, g.e.SetTable(s.env(g.e), t, true, s.mu.nodes))
					s.ensureLinksLocked(g)
				}
				s.mu.Unlock()
				return
			}
			select {
			case <-g.ctx.Done():
				s.mu.Lock()
				s.mu.refresh = false
				s.mu.Unlock()
				return
			case <-time.After(wait):
			}
		}
	}()
}

// watchTable keeps the engine's table current.
func (s *Service) watchTable() {
	defer s.wg.Done()
	for ns := range s.cfg.Meta.Watch(s.ctx, Namespace, 0) {
		t, err := DecodeTable(ns)
		if err != nil {
			s.log.Error("rldev table does not decode", "err", err)
			continue
		}
		s.mu.Lock()
		if s.mu.table == nil || t.Version > s.mu.table.Version {
			s.mu.table = t
		}
		if g := s.mu.gen; g != nil && s.mu.eng != nil {
			s.execLocked(g, g.e.SetTable(s.env(g.e), t, false, s.mu.nodes))
			s.ensureLinksLocked(g)
		}
		s.mu.Unlock()
	}
}

// watchNodes keeps the nodes' incarnations and addresses current.
func (s *Service) watchNodes() {
	defer s.wg.Done()
	for ns := range s.cfg.Meta.Watch(s.ctx, meta.NodesNamespace, 0) {
		nodes, err := meta.DecodeNodes(ns)
		if err != nil {
			s.log.Warn("membership does not decode", "err", err)
			continue
		}
		incs, addrs := map[NodeID]uint64{}, map[NodeID]string{}
		for _, n := range nodes {
			incs[n.Id], addrs[n.Id] = n.Incarnation, n.GrpcAddr
		}
		s.mu.Lock()
		s.mu.nodes, s.mu.addrs = incs, addrs
		if g := s.mu.gen; g != nil && s.mu.eng != nil && s.mu.table != nil {
			s.execLocked(g, g.e.SetTable(s.env(g.e), s.mu.table, false, incs))
		}
		s.mu.Unlock()
	}
}

func (s *Service) ticker() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.Tick)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		s.mu.Lock()
		if g := s.mu.gen; g != nil && s.mu.eng != nil {
			s.execLocked(g, g.e.Tick(s.env(g.e)))
		}
		s.mu.Unlock()
	}
}

// ------------------------------------------------------------------ links

// ensureLinksLocked dials a link to every node that holds the other
// segment of an RLDev this node holds, and to a move's target or source
// (the engine learns its peers are up from these).
func (s *Service) ensureLinksLocked(g *generation) {
	t := s.mu.table
	if t == nil {
		return
	}
	link := func(to NodeID) {
		if to != s.cfg.Node { // what a node sends itself is delivered in place (sendLocked)
			s.linkLocked(g, to)
		}
	}
	for _, rec := range t.RLDevs {
		if seg := rec.SegmentOf(s.cfg.Node); seg >= 0 {
			link(rec.Segs[1-seg].Node)
			if rec.Move != nil { // the primary copies and forwards to the target
				link(rec.Move.To.Node)
			}
		}
		if m := rec.Move; m != nil && m.To.Node == s.cfg.Node {
			link(rec.Segs[rec.Primary].Node) // a move's target hears from the primary (and answers it)
		}
	}
}

func (s *Service) linkLocked(g *generation, to NodeID) *outLink {
	if l := s.mu.out[to]; l != nil && l.gen == g {
		return l
	}
	l := &outLink{to: to, gen: g, q: make(chan *pb.RLDevServicePeerRequest, 4096)}
	s.mu.out[to] = l
	s.wg.Add(1)
	go s.runLink(l)
	return l
}

// sendLocked queues msg on the link to node to; a message for a link that
// is not up is dropped (the engine sends it again once it is).
func (s *Service) sendLocked(g *generation, to NodeID, msg any) {
	l := s.linkLocked(g, to)
	if !l.up {
		return
	}
	f := EncodePeer(msg)
	size := int64(proto.Size(f))
	if l.bytes.Add(size) > s.cfg.LinkQueue {
		l.bytes.Add(-size)
		l.cancel() // too far behind: break the link (what matters is resent)
		return
	}
	select {
	case l.q <- f:
	default:
		l.bytes.Add(-size)
		l.cancel()
	}
}

// runLink keeps the link to l.to up while its generation lasts.
func (s *Service) runLink(l *outLink) {
	defer s.wg.Done()
	g := l.gen
	for wait := 50 * time.Millisecond; g.ctx.Err() == nil; wait = min(2*wait, time.Second) {
		if s.linkOnce(l) {
			wait = 50 * time.Millisecond
		}
		select {
		case <-g.ctx.Done():
		case <-time.After(wait):
		}
	}
}

// peerOut is the sending end of a link, whichever transport carries it.
type peerOut interface {
	// send queues a message; flush sends what is queued; ping tells the
	// peer this end is alive (the link has been idle).
	send(f *pb.RLDevServicePeerRequest) error
	flush() error
	ping() error
}

// linkOnce dials, says hello, reports the peer up and pumps the queue until
// the link ends; then reports it down. It reports whether the link came
// up.
func (s *Service) linkOnce(l *outLink) bool {
	g := l.gen
	s.mu.Lock()
	addr := s.mu.addrs[l.to]
	s.mu.Unlock()
	if addr == "" {
		return false
	}
	ctx, cancel := context.WithCancel(g.ctx)
	defer cancel()
	hello := &pb.RLDevHello{Node: s.cfg.Node, Incarnation: g.e.Incarnation(), ToNode: l.to}
	dial := s.dialPeerTCP
	if s.cfg.DataPath == DataPathGRPC {
		dial = s.dialPeerGRPC
	}
	out, h, err := dial(ctx, cancel, addr, hello)
	if err != nil {
		return false
	}
	if h == nil || h.Node != l.to {
		s.log.Warn("rldev link: the answer is not from the node dialed", "to", l.to, "addr", addr)
		return false
	}
	s.mu.Lock()
	if s.mu.gen != g || s.mu.out[l.to] != l {
		s.mu.Unlock()
		return false
	}
	l.up, l.cancel = true, cancel
	s.execLocked(g, g.e.PeerUp(s.env(g.e), l.to))
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		l.up = false
		for len(l.q) > 0 {
			<-l.q
		}
		l.bytes.Store(0)
		if s.mu.gen == g && s.mu.eng != nil {
			s.execLocked(g, g.e.PeerDown(s.env(g.e), l.to))
		}
		s.mu.Unlock()
	}()
	tick := time.NewTicker(pingEvery)
	defer tick.Stop()
	sent := false
	for {
		select {
		case f := <-l.q:
			// Everything queued goes out in one flush; nothing once the
			// link has ended (a message dropped since must not be
			// followed by later ones on this link).
			for f != nil {
				if ctx.Err() != nil {
					return true
				}
				l.bytes.Add(-int64(proto.Size(f)))
				if err := out.send(f); err != nil {
					return true
				}
				select {
				case f = <-l.q:
				default:
					f = nil
				}
			}
			if err := out.flush(); err != nil {
				return true
			}
			sent = true
		case <-tick.C:
			if !sent {
				if err := out.ping(); err != nil {
					return true
				}
			}
			sent = false
		case <-ctx.Done():
			return true
		}
	}
}

// dialPeerGRPC opens a link as a gRPC stream and exchanges hellos. The
// link ends (cancel) when the stream does.
func (s *Service) dialPeerGRPC(ctx context.Context, cancel context.CancelFunc, addr string, hello *pb.RLDevHello) (peerOut, *pb.RLDevHello, error) {
	cc, err := s.conns.Get(addr)
	if err != nil {
		return nil, nil, err
	}
	st, err := pb.NewRLDevServiceClient(cc).Peer(ctx)
	if err != nil {
		return nil, nil, err
	}
	if err := st.Send(&pb.RLDevServicePeerRequest{Msg: &pb.RLDevServicePeerRequest_Hello{Hello: hello}}); err != nil {
		return nil, nil, err
	}
	got := make(chan *pb.RLDevHello, 1)
	go func() {
		// The acceptor's hello, then nothing until the stream ends.
		r, err := st.Recv()
		if err != nil {
			cancel()
			return
		}
		got <- r.Hello
		for {
			if _, err := st.Recv(); err != nil {
				cancel()
				return
			}
		}
	}()
	select {
	case h := <-got:
		return grpcPeerOut{st}, h, nil
	case <-time.After(5 * time.Second):
		return nil, nil, errors.New("rldev link: no hello in 5 s")
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	}
}

type grpcPeerOut struct {
	st pb.RLDevService_PeerClient
}

func (o grpcPeerOut) send(f *pb.RLDevServicePeerRequest) error { return o.st.Send(f) }
func (o grpcPeerOut) flush() error                             { return nil }
func (o grpcPeerOut) ping() error                              { return nil } // HTTP/2 pings

// Peer accepts a link from another node's engine (gRPC; the framed data
// path's links are servePeerConn).
func (s *Service) Peer(st pb.RLDevService_PeerServer) error {
	f, err := st.Recv()
	if err != nil {
		return err
	}
	h := f.GetHello()
	if h == nil {
		return status.Error(codes.InvalidArgument, "rldev link: the first frame must be a hello")
	}
	in, err := s.acceptPeer(st.Context(), h)
	if err != nil {
		return err
	}
	defer in.close()
	if err := st.Send(&pb.RLDevServicePeerResponse{Hello: in.hello}); err != nil {
		return err
	}
	frames := make(chan *pb.RLDevServicePeerRequest)
	errc := make(chan error, 1)
	go func() {
		for {
			f, err := st.Recv()
			if err != nil {
				errc <- err
				return
			}
			select {
			case frames <- f:
			case <-in.ctx.Done():
				return
			}
		}
	}()
	for {
		select {
		case <-in.ctx.Done():
			return status.Error(codes.Aborted, "rldev link closed (a new engine or a newer link)")
		case err := <-errc:
			return err
		case f := <-frames:
			if err := in.deliver(f); err != nil {
				return err
			}
		}
	}
}

// peerIn is an accepted link from another node's engine, bound to this
// node's current engine and to the sender's incarnation.
type peerIn struct {
	s      *Service
	g      *generation
	il     *inLink
	from   NodeID
	ctx    context.Context // ends with the link (a newer one, a new engine here)
	cancel context.CancelFunc
	stop   func() bool
	hello  *pb.RLDevHello // this end's answer
}

// acceptPeer checks a link's hello and binds the link to the engines at
// both ends; a newer link from the same node ends the older one.
func (s *Service) acceptPeer(parent context.Context, h *pb.RLDevHello) (*peerIn, error) {
	from := h.Node
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.mu.gen
	switch {
	case h.ToNode != s.cfg.Node:
		return nil, status.Errorf(codes.FailedPrecondition, "rldev link: this is node %d, not %d", s.cfg.Node, h.ToNode)
	case g == nil || s.mu.eng == nil:
		return nil, status.Errorf(codes.Unavailable, "rldev link: node %d has no engine running (fenced or starting)", s.cfg.Node)
	case h.Incarnation < s.mu.nodes[from], s.mu.in[from] != nil && h.Incarnation < s.mu.in[from].inc:
		return nil, status.Errorf(codes.FailedPrecondition, "rldev link: node %d incarnation %d is a past one", from, h.Incarnation)
	}
	ctx, cancel := context.WithCancel(parent)
	in := &peerIn{s: s, g: g, from: from, ctx: ctx, cancel: cancel, stop: context.AfterFunc(g.ctx, cancel),
		hello: &pb.RLDevHello{Node: s.cfg.Node, Incarnation: g.e.Incarnation()}}
	if old := s.mu.in[from]; old != nil {
		old.cancel() // the peer dialed again: its earlier link is over
	}
	in.il = &inLink{inc: h.Incarnation, cancel: cancel}
	s.mu.in[from] = in.il
	return in, nil
}

func (in *peerIn) close() {
	in.stop()
	in.cancel()
	s := in.s
	s.mu.Lock()
	if s.mu.in[in.from] == in.il {
		delete(s.mu.in, in.from)
	}
	s.mu.Unlock()
}

// deliver gives the engine one message of the link; an error ends the
// link.
func (in *peerIn) deliver(fs ...*pb.RLDevServicePeerRequest) error {
	msgs := make([]any, len(fs))
	for i, f := range fs {
		msg, err := DecodePeer(f)
		if err != nil {
			in.s.log.Warn("rldev link: malformed frame: closing the link", "from", in.from, "err", err)
			return status.Error(codes.InvalidArgument, err.Error())
		}
		msgs[i] = msg
	}
	s, g := in.s, in.g
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.in[in.from] != in.il || s.mu.gen != g || s.mu.eng == nil {
		return status.Error(codes.Aborted, "rldev link closed")
	}
	for _, msg := range msgs {
		s.execLocked(g, g.e.Deliver(s.env(g.e), in.from, msg))
		if s.mu.gen != g || s.mu.eng == nil {
			return status.Error(codes.Aborted, "rldev link closed")
		}
	}
	return nil
}

// ------------------------------------------------------------------ clients

// request runs a client request on the current engine and waits for its
// reply (or ctx: the request is cancelled; a write may still land).
func (s *Service) request(ctx context.Context, id uint64, write bool, start func(e *Engine, env Env, req ReqID) []any) ([]byte, *pb.RLDevResult, error) {
	w := &waiter{ch: make(chan Reply, 1), write: write, id: id}
	g, req, err := s.begin(w, start, nil)
	if err != nil {
		return nil, ResultOf(err, 0, 0), err
	}
	select {
	case r := <-w.ch:
		res := ResultOf(r.Err, s.epoch(id), w.inc)
		res.LandedBefore = r.LandedBefore
		return r.Data, res, r.Err
	case <-ctx.Done():
		s.cancel(g, req, w)
		return nil, nil, ctx.Err()
	}
}

// begin starts a client request on the current engine; its reply goes to
// w.
func (s *Service) begin(w *waiter, start func(e *Engine, env Env, req ReqID) []any, cc *clientConn) (*generation, ReqID, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if cc != nil && cc.superseded {
		// Checked under the lock that admits the connection that
		// superseded this one: what this one starts, it starts before
		// anything of the newer one.
		return nil, 0, errSuperseded
	}
	g := s.mu.gen
	if g == nil || s.mu.eng == nil {
		return nil, 0, fmt.Errorf("%w: node %d has no engine running (fenced itself, or starting)", ErrNotServing, s.cfg.Node)
	}
	s.mu.nextReq++
	req := s.mu.nextReq
	w.inc = g.e.Incarnation()
	s.mu.reqs[req] = w
	s.execLocked(g, start(g.e, s.env(g.e), req))
	return g, req, nil
}

// cancel gives up a request that has not replied yet (a write may still
// land).
func (s *Service) cancel(g *generation, req ReqID, w *waiter) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.reqs[req] == w {
		delete(s.mu.reqs, req)
		delete(s.mu.loans, req)
		if s.mu.gen == g && s.mu.eng != nil {
			g.e.Cancel(req)
		}
	}
}

func (s *Service) epoch(id uint64) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.epochLocked(id)
}

func (s *Service) epochLocked(id uint64) uint64 {
	if s.mu.eng != nil {
		if rec := s.mu.eng.table.RLDevs[id]; rec != nil {
			return rec.Epoch
		}
	}
	return 0
}

// blockRange checks a client's byte range: whole blocks, at most MaxIO.
func blockRange(off, n uint64) (uint64, uint64, error) {
	switch {
	case off%BlockSize != 0 || n%BlockSize != 0:
		return 0, 0, fmt.Errorf("%w: offset %d and length %d must be multiples of %d", ErrBadRequest, off, n, BlockSize)
	case n == 0:
		return 0, 0, fmt.Errorf("%w: an empty request", ErrBadRequest)
	case n > MaxIO:
		return 0, 0, fmt.Errorf("%w: %d bytes: at most %d per request", ErrBadRequest, n, MaxIO)
	}
	return off / BlockSize, n / BlockSize, nil
}

// readStart checks a client read and returns how to start it.
func readStart(r *pb.RLDevServiceReadRequest) (func(e *Engine, env Env, req ReqID) []any, error) {
	block, n, err := blockRange(r.Offset, r.Length)
	if err == nil && r.Replica > 2 {
		err = fmt.Errorf("%w: replica %d (0: any, 1 or 2: segment 0 or 1)", ErrBadRequest, r.Replica)
	}
	if err != nil {
		return nil, err
	}
	return func(e *Engine, env Env, req ReqID) []any {
		return e.Read(env, req, r.Rldev, block, n, int(r.Replica)-1)
	}, nil
}

// writeStart checks a client write and returns how to start it.
func writeStart(r *pb.RLDevServiceWriteRequest) (func(e *Engine, env Env, req ReqID) []any, error) {
	block, _, err := blockRange(r.Offset, uint64(len(r.Data)))
	var fence *Fence
	if err == nil {
		fence, err = fenceFromPB(r.Fence)
	}
	if err == nil && r.Replica > 2 {
		err = fmt.Errorf("%w: replica %d (0: the primary, 1 or 2: segment 0 or 1)", ErrBadRequest, r.Replica)
	}
	if err != nil && !errors.Is(err, ErrBadRequest) {
		err = fmt.Errorf("%w: %v", ErrBadRequest, err)
	}
	if err != nil {
		return nil, err
	}
	return func(e *Engine, env Env, req ReqID) []any {
		if r.Node != 0 && NodeID(r.Node) != e.cfg.Node {
			// Meant for another node, whose address reached this node's
			// process (a record that lags, an address taken over): never
			// applied here, so that the clerk may count it as an attempt
			// at the node it meant (WriteReport).
			return []any{Reply{Req: req, Err: fmt.Errorf("%w: a write meant for node %d reached node %d", ErrNotServing, r.Node, e.cfg.Node)}}
		}
		return e.WriteAs(env, req, WriteID{Writer: r.Writer, Seq: r.WriteSeq}, r.Rldev, block, r.Data, fence, int(r.Replica)-1)
	}, nil
}

// Read serves a client read.
func (s *Service) Read(ctx context.Context, r *pb.RLDevServiceReadRequest) (*pb.RLDevServiceReadResponse, error) {
	start, err := readStart(r)
	if err != nil {
		return &pb.RLDevServiceReadResponse{Result: ResultOf(err, 0, 0)}, nil
	}
	data, res, err := s.request(ctx, r.Rldev, false, start)
	if cerr := ctx.Err(); cerr != nil && errors.Is(err, cerr) {
		return nil, status.FromContextError(cerr).Err()
	}
	return &pb.RLDevServiceReadResponse{Result: res, Data: data}, nil
}

// Write serves a client write.
func (s *Service) Write(ctx context.Context, r *pb.RLDevServiceWriteRequest) (*pb.RLDevServiceWriteResponse, error) {
	start, err := writeStart(r)
	if err != nil {
		return &pb.RLDevServiceWriteResponse{Result: ResultOf(err, 0, 0)}, nil
	}
	_, res, err := s.request(ctx, r.Rldev, true, start)
	if cerr := ctx.Err(); cerr != nil && errors.Is(err, cerr) {
		return nil, status.FromContextError(cerr).Err()
	}
	return &pb.RLDevServiceWriteResponse{Result: res}, nil
}

// Status describes this node's replicas.
func (s *Service) Status(ctx context.Context, _ *pb.RLDevServiceStatusRequest) (*pb.RLDevServiceStatusResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	resp := &pb.RLDevServiceStatusResponse{Node: s.cfg.Node}
	e := s.mu.eng
	if e == nil {
		return resp, nil
	}
	resp.Incarnation = e.Incarnation()
	for _, r := range e.Status() {
		resp.Replicas = append(resp.Replicas, &pb.RLDevReplicaStatus{Rldev: r.RLDev, Segment: uint32(r.Segment), State: r.State,
			Stale: r.Stale, Primary: r.Primary, DirtyRegions: r.DirtyRegions, DegradedRegions: r.DegradedRegions,
			Recovering: uint64(r.Recovering), Owed: uint64(r.Owed), ResyncCopied: r.ResyncCopied, ResyncTotal: r.ResyncTotal,
			ScrubPasses: r.ScrubPasses, ScrubRepaired: r.ScrubRepaired, ScrubNext: r.ScrubNext, Error: r.Err, Wait: r.Wait, MoveTarget: r.MoveTarget,
			Lost: r.Lost, Incomplete: r.Incomplete, Overwritten: r.Overwritten})
	}
	return resp, nil
}
