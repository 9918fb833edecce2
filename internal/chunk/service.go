package chunk

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/status"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/lock"
	"github.com/grovestore/grove/internal/meta"
	"github.com/grovestore/grove/internal/metrics"
	"github.com/grovestore/grove/internal/rldev"
	"github.com/grovestore/grove/internal/transport"
)

// Detector is the failure-detector service as the chunk managers ask it:
// which node incarnations are dead (final verdicts).
type Detector interface {
	Dead(ctx context.Context, subjects []lock.Subject) ([]bool, error)
}

// Liveness is the node's view of itself, per incarnation.
type Liveness interface {
	// Deadline is the local time until which inc is guaranteed alive, if
	// inc is running and alive.
	Deadline(inc uint64) (time.Time, bool)
}

// ServiceConfig wires the chunk managers into a node.
type ServiceConfig struct {
	Node  uint64
	Meta  *meta.Client
	Locks *lock.Service
	RLDev *rldev.Clerk // the map's and the chunks' I/O
	// Local, if set, is this node's RLDev service: a chunk read is served
	// from the node's own replica of the RLDev when it has one that may
	// serve (both nodes of a pair hold a segment of each of its RLDevs),
	// without a network hop; otherwise, or if it refuses, through RLDev.
	Local    LocalRLDev
	Detector Detector
	Live     Liveness
	Log      *slog.Logger
	// Manager tunes the managers (Node, Inc and CM are filled in).
	Manager Config
	// Tick is how often the managers are ticked (default 50 ms).
	Tick time.Duration
	// IOTimeout bounds one RLDev read or write (default 10 s): the
	// manager's quarantine (30 s) must outlast a write it was told failed.
	IOTimeout time.Duration
	// Metrics, if set, counts the requests this node answers
	// (grove_chunk_requests_total).
	Metrics *metrics.Node
}

// LocalRLDev is a node's RLDev service as the chunk managers read through
// it (rldev.Service).
type LocalRLDev interface {
	Read(ctx context.Context, r *pb.RLDevServiceReadRequest) (*pb.RLDevServiceReadResponse, error)
}

// MaxIO bounds one client read or write of a chunk (the clerk splits
// larger ones).
const MaxIO = rldev.MaxIO

// Service is a node's chunk-manager runtime: the thin driver of one
// Manager per chunk manager pair that includes the node, per node
// incarnation. It carries out the managers' effects (map and zeroing I/O
// through the RLDev clerk, the map lock through the node's lock clerk,
// peer messages, decrees, failure-detector questions, table reads) and
// feeds them their completions, the watched pair table and ticks; it
// serves chunk reads and writes on the extents the managers admit. All
// decisions are the managers'; the simulator drives the same code. It
// implements pb.ChunkServiceServer.
type Service struct {
	pb.UnimplementedChunkServiceServer
	cfg   ServiceConfig
	log   *slog.Logger
	ctx   context.Context
	stop  context.CancelFunc
	wg    sync.WaitGroup
	conns transport.Pool
	book  *meta.AddressBook // the peers' addresses
	// Writes of one chunk through this node are serialized (a partial
	// block's read-modify-write, chunkio.go): a stripe of mutexes.
	wmu [256]sync.Mutex
	mu  struct {
		sync.Mutex
		gen     *generation          // nil between a fence and the next start
		want    uint64               // the incarnation to run (the latest Start)
		fenced  uint64               // the latest incarnation fenced
		table   *Table               // the latest table seen
		reqs    map[ReqID]chan Reply // allocations and frees waiting for their replies
		nextReq ReqID
	}
	started sync.Once
}

// generation is one incarnation's managers, their lock clerk and the
// goroutines they started (ended by ctx).
type generation struct {
	inc    uint64
	ctx    context.Context
	cancel context.CancelFunc
	clerk  *lock.ClerkRT
	mgs    map[uint32]*managed
	out    map[NodeID]chan *pb.ChunkServicePeerRequest
}

// managed is one pair's manager and what the runtime keeps for it.
type managed struct {
	m            *Manager
	cm           uint32
	pair         *Pair                       // the latest record (its RLDevs)
	pairVer      uint64                      // the namespace version it was read at
	held         *lock.Held                  // the map lock's hold
	acqs         map[OpID]context.CancelFunc // acquisitions in flight
	refreshing   bool
	refreshAsked int // Refresh effects asked (a read answers those asked before it began)
}

// NewService returns a stopped service; Start begins each incarnation.
func NewService(cfg ServiceConfig) *Service {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Tick == 0 {
		cfg.Tick = 50 * time.Millisecond
	}
	if cfg.IOTimeout == 0 {
		cfg.IOTimeout = 10 * time.Second
	}
	s := &Service{cfg: cfg, log: cfg.Log.With("layer", "chunk"), book: meta.NewAddressBook(cfg.Meta)}
	s.ctx, s.stop = context.WithCancel(context.Background())
	s.mu.reqs = map[ReqID]chan Reply{}
	return s
}

// Start begins incarnation inc: its managers start once the node's lock
// clerk of inc exists. It returns at once.
func (s *Service) Start(inc uint64) {
	s.started.Do(func() {
		s.wg.Add(2)
		go s.watchTable()
		go s.ticker()
	})
	s.mu.Lock()
	if inc <= s.mu.want || inc <= s.mu.fenced {
		s.mu.Unlock()
		return
	}
	s.mu.want = inc
	if s.mu.gen != nil {
		s.fenceLocked("a new incarnation started") // a missed fence
	}
	s.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		// The managers' map lock is held by the node's default clerk (no
		// recovery kind: a dead holder's locks are free at its verdict,
		// the fencing tokens on the map's writes doing what recovery
		// would).
		var clerk *lock.ClerkRT
		for clerk == nil {
			if c := s.cfg.Locks.DefaultClerk(); c != nil && c.ID().Inc == inc {
				clerk = c
				break
			}
			s.mu.Lock()
			gone := s.mu.want != inc || inc <= s.mu.fenced
			s.mu.Unlock()
			if gone {
				return
			}
			select {
			case <-s.ctx.Done():
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.mu.want != inc || inc <= s.mu.fenced || s.ctx.Err() != nil {
			return
		}
		g := &generation{inc: inc, clerk: clerk, mgs: map[uint32]*managed{}, out: map[NodeID]chan *pb.ChunkServicePeerRequest{}}
		g.ctx, g.cancel = context.WithCancel(s.ctx)
		s.mu.gen = g
		s.log.Info("chunk managers started", "incarnation", inc)
		s.setTableLocked(g, s.mu.table)
	}()
}

// Fence ends incarnation inc: its managers stop; requests in progress fail
// (an allocation or free among them may have taken effect). Called
// synchronously by the node's self-fence.
func (s *Service) Fence(inc uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mu.fenced = max(s.mu.fenced, inc)
	if g := s.mu.gen; g != nil && g.inc == inc {
		s.fenceLocked("the node fenced itself")
	}
}

func (s *Service) fenceLocked(why string) {
	g := s.mu.gen
	s.mu.gen = nil
	g.cancel()
	for id, ch := range s.mu.reqs {
		// Every request waiting is an allocation or a free: it may be in
		// the map's log already.
		delete(s.mu.reqs, id)
		ch <- Reply{Req: id, Err: fmt.Errorf("%w: node %d: %s (%w)", ErrNotServing, s.cfg.Node, why, ErrMaybeDone)}
	}
	s.log.Warn("chunk managers stopped", "incarnation", g.inc, "why", why)
}

// Close stops the service.
func (s *Service) Close() {
	s.mu.Lock()
	s.mu.fenced = max(s.mu.fenced, s.mu.want)
	if s.mu.gen != nil {
		s.fenceLocked("shutting down")
	}
	s.mu.Unlock()
	s.stop()
	s.wg.Wait()
	s.book.Close()
	s.conns.Close()
}

// env is the managers' view of now.
func (s *Service) env(g *generation) Env {
	env := Env{Now: time.Now()}
	if d, ok := s.cfg.Live.Deadline(g.inc); ok {
		env.Deadline = d
	}
	return env
}

// current is pair cm's manager of the running generation g, or nil.
func (s *Service) currentLocked(g *generation, cm uint32) *managed {
	if s.mu.gen != g || g == nil {
		return nil
	}
	return g.mgs[cm]
}

// do runs fn on pair cm's manager of generation g, if it is still
// running, and carries out its effects.
func (s *Service) do(g *generation, cm uint32, fn func(mg *managed, env Env) []any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if mg := s.currentLocked(g, cm); mg != nil {
		s.execLocked(g, mg, fn(mg, s.env(g)))
	}
}

// execLocked carries out a manager's effects.
func (s *Service) execLocked(g *generation, mg *managed, out []any) {
	for _, o := range out {
		switch x := o.(type) {
		case MapRead:
			rl := mg.pair.MapRLDev
			s.async(g, func(ctx context.Context) func(*managed, Env) []any {
				data, err := s.readBlocks(ctx, rl, x.Block, x.Blocks)
				return func(mg *managed, env Env) []any { return mg.m.Done(env, x.Op, data, err) }
			}, mg.cm)
		case MapWrite:
			rl := x.RLDev
			if rl == 0 {
				rl = mg.pair.MapRLDev
			}
			fence := &rldev.Fence{Name: MapLock(mg.cm), Token: x.Token}
			s.async(g, func(ctx context.Context) func(*managed, Env) []any {
				maybe, err := s.writeBlocksReport(ctx, rl, x.Block, x.Data, fence)
				if err == nil && maybe {
					err = ErrEarlierMayLand // the manager takes the map lock again (review 36)
				}
				return func(mg *managed, env Env) []any { return mg.m.Done(env, x.Op, nil, err) }
			}, mg.cm)
		case ZeroWrite:
			fence := &rldev.Fence{Name: MapLock(mg.cm), Token: x.Token}
			s.async(g, func(ctx context.Context) func(*managed, Env) []any {
				err := s.zero(ctx, x.RLDev, x.Block, x.Blocks, fence)
				return func(mg *managed, env Env) []any { return mg.m.Done(env, x.Op, nil, err) }
			}, mg.cm)
		case Acquire:
			s.acquireLocked(g, mg, x)
		case CancelAcquire:
			if cancel := mg.acqs[x.Op]; cancel != nil {
				delete(mg.acqs, x.Op)
				cancel()
			}
		case Release:
			if mg.held != nil {
				mg.held.Release()
				mg.held = nil
			}
			if x.Drop {
				g.clerk.Drop(MapLock(mg.cm))
			}
		case Send:
			s.sendLocked(g, x.To, EncodePeer(s.cfg.Node, g.inc, x.Msg))
		case Reply:
			if ch := s.mu.reqs[x.Req]; ch != nil {
				delete(s.mu.reqs, x.Req)
				ch <- x
			}
		case AskDead:
			sub := x.Subject
			s.async(g, func(ctx context.Context) func(*managed, Env) []any {
				inc := sub.Inc
				var err error
				if inc == 0 {
					// The node's registered incarnation, read
					// linearizably after the question was asked: at least
					// every incarnation of it that joined before (the
					// watched membership may lag behind a restart, and a
					// verdict on the incarnation before would be taken
					// for one on the secondary that joined since).
					inc, err = s.registered(ctx, sub.Node)
				}
				var dead []bool
				if inc != 0 && err == nil {
					dead, err = s.cfg.Detector.Dead(ctx, []lock.Subject{{Node: sub.Node, Inc: inc}})
				}
				return func(mg *managed, env Env) []any {
					if inc == 0 || err != nil || len(dead) != 1 {
						return mg.m.Verdict(env, sub, 0, false) // asked again at the next poll
					}
					return mg.m.Verdict(env, sub, inc, dead[0])
				}
			}, mg.cm)
		case Propose:
			s.async(g, func(ctx context.Context) func(*managed, Env) []any {
				ver, err := s.cfg.Meta.Propose(ctx, &pb.Decree{Namespace: Namespace, ExpectedVersion: x.Version,
					Ops: []*pb.Op{x.Pair.PutOp()}, Origin: fmt.Sprintf("chunk manager %d on node %d: %s", mg.cm, s.cfg.Node, x.What)})
				return func(mg *managed, env Env) []any { return mg.m.Decided(env, x.Op, ver, err) }
			}, mg.cm)
		case Refresh:
			s.refreshLocked(g, mg)
		case Log:
			lvl := []slog.Level{slog.LevelDebug, slog.LevelInfo, slog.LevelWarn, slog.LevelError}[min(max(x.Level, 0), 3)]
			s.log.Log(context.Background(), lvl, x.Msg, append([]any{"incarnation", g.inc}, x.Args...)...)
		default:
			panic(fmt.Sprintf("chunk: unknown effect %T", o))
		}
	}
}

// async runs io off the lock, bounded by the I/O timeout; its completion
// goes to pair cm's manager of generation g, if still running.
func (s *Service) async(g *generation, io func(ctx context.Context) func(*managed, Env) []any, cm uint32) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		ctx, cancel := context.WithTimeout(g.ctx, s.cfg.IOTimeout)
		k := io(ctx)
		cancel()
		s.do(g, cm, k)
	}()
}

func (s *Service) acquireLocked(g *generation, mg *managed, x Acquire) {
	ctx, cancel := context.WithCancel(g.ctx)
	mg.acqs[x.Op] = cancel
	cm := mg.cm
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		held, err := g.clerk.Acquire(ctx, MapLock(cm), x.Mode)
		s.mu.Lock()
		defer s.mu.Unlock()
		cur := s.currentLocked(g, cm)
		if cur == nil || cur.acqs[x.Op] == nil {
			// Given up (or the generation ended) meanwhile.
			if held != nil {
				held.Release()
			}
			cancel()
			return
		}
		delete(cur.acqs, x.Op)
		cancel()
		var tok lock.Token
		if err == nil {
			if cur.held != nil {
				cur.held.Release() // never two holds: the manager asks for one at a time
			}
			cur.held, tok = held, held.Token()
		}
		s.execLocked(g, cur, cur.m.Granted(s.env(g), x.Op, tok, err))
	}()
}

// ------------------------------------------------------------------ RLDev I/O

// readBlocks reads blocks blocks of RLDev rl from block, in requests of at
// most rldev.MaxIO.
func (s *Service) readBlocks(ctx context.Context, rl, block, blocks uint64) ([]byte, error) {
	out := make([]byte, 0, blocks*BlockSize)
	for blocks > 0 {
		n := min(blocks, rldev.MaxIO/BlockSize)
		b, err := s.cfg.RLDev.Read(ctx, rl, block*BlockSize, n*BlockSize, 0)
		if err != nil {
			return nil, err
		}
		out = append(out, b...)
		block, blocks = block+n, blocks-n
	}
	return out, nil
}

// writeBlocks writes data (whole blocks) at block of RLDev rl, in requests
// of at most rldev.MaxIO, each durable on both replicas before the next.
func (s *Service) writeBlocks(ctx context.Context, rl, block uint64, data []byte, fence *rldev.Fence) error {
	_, err := s.writeBlocksReport(ctx, rl, block, data, fence)
	return err
}

// writeBlocksReport is writeBlocks that also reports whether an earlier,
// unanswered attempt of one of its RLDev writes may still land.
func (s *Service) writeBlocksReport(ctx context.Context, rl, block uint64, data []byte, fence *rldev.Fence) (bool, error) {
	maybe := false
	for len(data) > 0 {
		n := min(len(data), rldev.MaxIO)
		m, err := s.cfg.RLDev.WriteReport(ctx, rl, block*BlockSize, data[:n], rldev.WriteOptions{Fence: fence})
		maybe = maybe || m
		if err != nil {
			return maybe, err
		}
		block, data = block+uint64(n/BlockSize), data[n:]
	}
	return maybe, nil
}

var zeros = make([]byte, rldev.MaxIO)

func (s *Service) zero(ctx context.Context, rl, block, blocks uint64, fence *rldev.Fence) error {
	for blocks > 0 {
		n := min(blocks, rldev.MaxIO/BlockSize)
		maybe, err := s.cfg.RLDev.WriteReport(ctx, rl, block*BlockSize, zeros[:n*BlockSize], rldev.WriteOptions{Fence: fence})
		if err == nil && maybe {
			err = ErrEarlierMayLand // the zeroing fails, and the manager takes the map lock again (review 36)
		}
		if err != nil {
			return err
		}
		block, blocks = block+n, blocks-n
	}
	return nil
}

// syncIO is chunkio's blockIO over the RLDev clerk, synchronous: its
// callbacks run before it returns, on the request's goroutine.
type syncIO struct {
	s     *Service
	ctx   context.Context
	fence *rldev.Fence // the client's, on its chunk writes
	maybe *bool        // set if an earlier attempt of a write may still land
}

func (x syncIO) readBlocks(rl, block, blocks uint64, done func([]byte, error)) {
	if l := x.s.cfg.Local; l != nil && blocks*BlockSize <= rldev.MaxIO {
		r, err := l.Read(x.ctx, &pb.RLDevServiceReadRequest{Rldev: rl, Offset: block * BlockSize, Length: blocks * BlockSize})
		if err == nil && rldev.ResultError(r.Result) == nil && uint64(len(r.Data)) == blocks*BlockSize {
			done(r.Data, nil)
			return
		}
	}
	done(x.s.readBlocks(x.ctx, rl, block, blocks))
}

func (x syncIO) writeBlocks(rl, block uint64, data []byte, done func(error)) {
	m, err := x.s.writeBlocksReport(x.ctx, rl, block, data, x.fence)
	if m && x.maybe != nil {
		*x.maybe = true
	}
	done(err)
}

// ------------------------------------------------------------------ table

func (s *Service) setTableLocked(g *generation, t *Table) {
	if g == nil || t == nil {
		return
	}
	env := s.env(g)
	for _, id := range t.IDs() {
		p := t.Pairs[id]
		if !p.Has(s.cfg.Node) {
			continue
		}
		mg := g.mgs[id]
		if mg == nil {
			cfg := s.cfg.Manager
			cfg.Node, cfg.Inc, cfg.CM = s.cfg.Node, g.inc, id
			mg = &managed{m: NewManager(cfg), cm: id, acqs: map[OpID]context.CancelFunc{}}
			g.mgs[id] = mg
			s.log.Info("chunk manager started", "cm", id, "incarnation", g.inc, "nodes", fmt.Sprint(p.Nodes))
		}
		if t.Version >= mg.pairVer {
			mg.pair, mg.pairVer = p, t.Version
		}
		s.execLocked(g, mg, mg.m.SetPair(env, p, t.Version, false))
	}
	for id, mg := range g.mgs {
		if p := t.Pairs[id]; p == nil || !p.Has(s.cfg.Node) {
			s.execLocked(g, mg, mg.m.SetPair(env, nil, t.Version, false))
		}
	}
}

// refreshLocked reads pair mg's record linearizably (one read at a time).
func (s *Service) refreshLocked(g *generation, mg *managed) {
	mg.refreshAsked++
	if mg.refreshing {
		return // the read in flight may have begun before this was asked: read again after it (below)
	}
	mg.refreshing = true
	cm := mg.cm
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for wait := 100 * time.Millisecond; ; wait = min(2*wait, 2*time.Second) {
			s.mu.Lock()
			asked := mg.refreshAsked // what this read answers: the Refreshes asked before it began
			s.mu.Unlock()
			ctx, cancel := context.WithTimeout(g.ctx, 5*time.Second)
			ns, err := s.cfg.Meta.Read(ctx, Namespace)
			cancel()
			var t *Table
			if err == nil {
				if t, err = DecodeTable(ns); err != nil {
					s.log.Error("chunk table does not decode", "err", err)
				}
			}
			if err == nil {
				s.do(g, cm, func(mg *managed, env Env) []any {
					// s.mu.table is left to the watch: were it set here,
					// the watch's delivery of this version would be taken
					// as old, and the other managers would miss it.
					mg.refreshing = false
					fresh := mg.refreshAsked == asked
					if !fresh {
						s.refreshLocked(g, mg) // a Refresh came meanwhile: this read may predate it
						mg.refreshAsked--      // (not a new question)
					}
					p := t.Pairs[cm]
					if p != nil && p.Has(s.cfg.Node) {
						if t.Version >= mg.pairVer {
							mg.pair, mg.pairVer = p, t.Version
						}
					} else {
						p = nil
					}
					return mg.m.SetPair(env, p, t.Version, fresh)
				})
				return
			}
			select {
			case <-g.ctx.Done():
				return
			case <-time.After(wait):
			}
		}
	}()
}

// watchTable keeps the managers' pair records current.
func (s *Service) watchTable() {
	defer s.wg.Done()
	for ns := range s.cfg.Meta.Watch(s.ctx, Namespace, 0) {
		t, err := DecodeTable(ns)
		if err != nil {
			s.log.Error("chunk table does not decode", "err", err)
			continue
		}
		s.mu.Lock()
		if s.mu.table == nil || t.Version > s.mu.table.Version {
			s.mu.table = t
			s.setTableLocked(s.mu.gen, t)
		}
		s.mu.Unlock()
	}
}

// registered reads node's registered incarnation linearizably (0: not
// registered).
func (s *Service) registered(ctx context.Context, node NodeID) (uint64, error) {
	ns, err := s.cfg.Meta.Read(ctx, meta.NodesNamespace)
	if err != nil {
		return 0, err
	}
	nodes, err := meta.DecodeNodes(ns)
	if err != nil {
		return 0, err
	}
	for _, n := range nodes {
		if n.Id == node {
			return n.Incarnation, nil
		}
	}
	return 0, nil
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
		if g := s.mu.gen; g != nil {
			env := s.env(g)
			for _, mg := range g.mgs {
				s.execLocked(g, mg, mg.m.Tick(env))
			}
		}
		s.mu.Unlock()
	}
}

// ------------------------------------------------------------------ peers

// sendLocked queues a peer message to node to: one sender per peer, in
// order; a full queue or a failed call drops the message (the managers
// send again what matters).
func (s *Service) sendLocked(g *generation, to NodeID, m *pb.ChunkServicePeerRequest) {
	q := g.out[to]
	if q == nil {
		q = make(chan *pb.ChunkServicePeerRequest, 1024)
		g.out[to] = q
		s.wg.Add(1)
		go s.sender(g, to, q)
	}
	select {
	case q <- m:
	default:
	}
}

func (s *Service) sender(g *generation, to NodeID, q chan *pb.ChunkServicePeerRequest) {
	defer s.wg.Done()
	for {
		var m *pb.ChunkServicePeerRequest
		select {
		case <-g.ctx.Done():
			return
		case m = <-q:
		}
		addr := s.book.Lookup(to)
		if addr == "" {
			continue
		}
		cc, err := s.conns.Get(addr)
		if err != nil {
			continue
		}
		ctx, cancel := context.WithTimeout(g.ctx, 5*time.Second)
		_, err = pb.NewChunkServiceClient(cc).Peer(ctx, m)
		cancel()
		if err != nil && g.ctx.Err() == nil {
			s.log.Debug("chunk peer message not delivered", "to", to, "err", err)
		}
	}
}

// Peer delivers a peer manager's message.
func (s *Service) Peer(ctx context.Context, r *pb.ChunkServicePeerRequest) (*pb.ChunkServicePeerResponse, error) {
	msg, err := DecodePeer(r)
	if err != nil {
		s.log.Warn("undecodable chunk peer message", "from", r.FromNode, "err", err)
		return &pb.ChunkServicePeerResponse{}, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.mu.gen
	if mg := s.currentLocked(g, r.Cm); mg != nil {
		s.execLocked(g, mg, mg.m.Deliver(s.env(g), r.FromNode, msg))
	}
	return &pb.ChunkServicePeerResponse{}, nil
}

// ------------------------------------------------------------------ clients

// request starts a client's allocation or free on pair cm's manager and
// waits for its reply.
func (s *Service) request(ctx context.Context, cm uint32, start func(m *Manager, env Env, req ReqID) []any) (Handle, error) {
	ch := make(chan Reply, 1)
	s.mu.Lock()
	g := s.mu.gen
	mg := s.currentLocked(g, cm)
	if mg == nil {
		s.mu.Unlock()
		return Handle{}, s.notHere(cm)
	}
	s.mu.nextReq++
	req := s.mu.nextReq
	s.mu.reqs[req] = ch
	s.execLocked(g, mg, start(mg.m, s.env(g), req))
	s.mu.Unlock()
	select {
	case r := <-ch:
		return r.Handle, r.Err
	case <-ctx.Done():
		s.mu.Lock()
		delete(s.mu.reqs, req)
		s.mu.Unlock()
		return Handle{}, ctx.Err()
	}
}

// notHere explains why this node has no manager of pair cm.
func (s *Service) notHere(cm uint32) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.gen == nil {
		return fmt.Errorf("%w: node %d has no chunk managers running (fenced itself, or starting)", ErrNotServing, s.cfg.Node)
	}
	if t := s.mu.table; t != nil && t.Pairs[cm] == nil {
		return fmt.Errorf("%w: %d", ErrUnknownManager, cm)
	}
	return fmt.Errorf("%w: node %d runs no manager of pair %d", ErrNotServing, s.cfg.Node, cm)
}

// admit admits I/O on a chunk at its manager here.
func (s *Service) admit(h Handle, off, n uint64) (*generation, *managed, Extent, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.mu.gen
	mg := s.currentLocked(g, h.CM)
	if mg == nil {
		return nil, nil, Extent{}, nil // the caller says why (notHere)
	}
	ext, err := mg.m.Admit(s.env(g), h.ID, off, n)
	return g, mg, ext, err
}

// finished ends I/O admitted on chunk id at mg.
func (s *Service) finished(g *generation, mg *managed, id uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := mg.m.Finished(s.env(g), id) // the manager counts its I/O even when stopped
	if s.currentLocked(g, mg.cm) == mg {
		s.execLocked(g, mg, out)
	}
}

// ioCtx bounds a client's I/O by the I/O timeout and by generation g: once
// its incarnation is fenced, no further attempt of the I/O is sent (the
// pair may free the chunk as soon as the incarnation is declared dead,
// and its quarantine must outlast what was sent before).
func (s *Service) ioCtx(ctx context.Context, g *generation) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.IOTimeout)
	stop := context.AfterFunc(g.ctx, cancel)
	return ctx, func() { stop(); cancel() }
}

// handleOf checks a request's handle.
func handleOf(cm uint32, id uint64) (Handle, error) {
	if cm == 0 || id == 0 {
		return Handle{}, fmt.Errorf("%w: %d:%d", ErrBadHandle, cm, id)
	}
	return Handle{CM: cm, ID: id}, nil
}

// ioRange checks a client read's or write's range.
func ioRange(off, n uint64) error {
	switch {
	case n > MaxIO:
		return fmt.Errorf("%w: %d bytes: at most %d per request", ErrBadRequest, n, MaxIO)
	case off > MaxChunk:
		return fmt.Errorf("%w: %d bytes at %d: past any chunk's end", ErrOutOfRange, n, off)
	}
	return nil
}

// rpcErr turns a cancelled request into the gRPC error for it.
func rpcErr(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil && errors.Is(err, cerr) {
		return status.FromContextError(cerr).Err()
	}
	return nil
}

// served counts a request this node answered, by operation and result.
func (s *Service) served(op string, code pb.ChunkResult) {
	s.cfg.Metrics.ChunkRequest(op, strings.ToLower(strings.TrimPrefix(code.String(), "CHUNK_RESULT_")))
}

// Allocate serves an allocation (at the pair's primary).
func (s *Service) Allocate(ctx context.Context, r *pb.ChunkServiceAllocateRequest) (*pb.ChunkServiceAllocateResponse, error) {
	owner := Owner{Log: r.OwnerLog, Token: tokenOf(r.OwnerToken)}
	var h Handle
	var err error
	if !owner.IsZero() && owner.Token.IsZero() {
		err = fmt.Errorf("%w: an owner (log %d) without a token", ErrBadRequest, owner.Log)
	} else {
		h, err = s.request(ctx, r.Cm, func(m *Manager, env Env, req ReqID) []any { return m.AllocateOwned(env, req, r.Size, owner) })
	}
	if e := rpcErr(ctx, err); e != nil {
		return nil, e
	}
	code, text := resultOf(err)
	s.served("allocate", code)
	return &pb.ChunkServiceAllocateResponse{Result: code, Error: text, Id: h.ID}, nil
}

// Disown serves Manager.Disown (at the pair's primary).
func (s *Service) Disown(ctx context.Context, r *pb.ChunkServiceDisownRequest) (*pb.ChunkServiceDisownResponse, error) {
	_, err := s.request(ctx, r.Cm, func(m *Manager, env Env, req ReqID) []any { return m.Disown(env, req, r.Ids) })
	if e := rpcErr(ctx, err); e != nil {
		return nil, e
	}
	code, text := resultOf(err)
	s.served("disown", code)
	return &pb.ChunkServiceDisownResponse{Result: code, Error: text}, nil
}

// Retire serves Manager.Retire (at the pair's primary).
func (s *Service) Retire(ctx context.Context, r *pb.ChunkServiceRetireRequest) (*pb.ChunkServiceRetireResponse, error) {
	_, err := s.request(ctx, r.Cm, func(m *Manager, env Env, req ReqID) []any { return m.Retire(env, req, r.Log, tokenOf(r.Below)) })
	if e := rpcErr(ctx, err); e != nil {
		return nil, e
	}
	code, text := resultOf(err)
	s.served("retire", code)
	return &pb.ChunkServiceRetireResponse{Result: code, Error: text}, nil
}

// MaxOwnedList bounds the ids of one Owned answer.
const MaxOwnedList = 10000

// Owned serves Manager.Owned (at the pair's primary).
func (s *Service) Owned(ctx context.Context, r *pb.ChunkServiceOwnedRequest) (*pb.ChunkServiceOwnedResponse, error) {
	limit := int(r.Limit)
	if limit == 0 || limit > MaxOwnedList {
		limit = MaxOwnedList
	}
	s.mu.Lock()
	g := s.mu.gen
	mg := s.currentLocked(g, r.Cm)
	var ids []uint64
	var more bool
	var err error
	if mg != nil {
		ids, more, err = mg.m.Owned(s.env(g), r.Log, tokenOf(r.Below), r.After, limit)
	}
	s.mu.Unlock()
	if mg == nil {
		err = s.notHere(r.Cm)
	}
	code, text := resultOf(err)
	return &pb.ChunkServiceOwnedResponse{Result: code, Error: text, Ids: ids, More: more}, nil
}

// Free serves a deallocation (at the pair's primary).
func (s *Service) Free(ctx context.Context, r *pb.ChunkServiceFreeRequest) (*pb.ChunkServiceFreeResponse, error) {
	_, err := handleOf(r.Cm, r.Id)
	if err == nil {
		_, err = s.request(ctx, r.Cm, func(m *Manager, env Env, req ReqID) []any { return m.Free(env, req, r.Id) })
	}
	if e := rpcErr(ctx, err); e != nil {
		return nil, e
	}
	code, text := resultOf(err)
	s.served("free", code)
	return &pb.ChunkServiceFreeResponse{Result: code, Error: text}, nil
}

// Reserve serves a reservation (at the pair's primary): Manager.Reserve.
func (s *Service) Reserve(ctx context.Context, r *pb.ChunkServiceReserveRequest) (*pb.ChunkServiceReserveResponse, error) {
	h, err := s.request(ctx, r.Cm, func(m *Manager, env Env, req ReqID) []any { return m.Reserve(env, req, r.Size, int(r.Count)) })
	if e := rpcErr(ctx, err); e != nil {
		return nil, e
	}
	code, text := resultOf(err)
	s.served("reserve", code)
	return &pb.ChunkServiceReserveResponse{Result: code, Error: text, Id: h.ID}, nil
}

// Commit serves the end of a reservation (at the pair's primary):
// Manager.Commit.
func (s *Service) Commit(ctx context.Context, r *pb.ChunkServiceCommitRequest) (*pb.ChunkServiceCommitResponse, error) {
	_, err := handleOf(r.Cm, r.Id)
	if err == nil && len(r.Live) > MaxReserve {
		err = fmt.Errorf("%w: a commit of %d chunks (a reservation has at most %d)", ErrBadRequest, len(r.Live), MaxReserve)
	}
	if err == nil {
		_, err = s.request(ctx, r.Cm, func(m *Manager, env Env, req ReqID) []any { return m.Commit(env, req, r.Id, r.Live) })
	}
	if e := rpcErr(ctx, err); e != nil {
		return nil, e
	}
	code, text := resultOf(err)
	s.served("commit", code)
	return &pb.ChunkServiceCommitResponse{Result: code, Error: text}, nil
}

// Read serves a chunk read (at either manager of its pair).
func (s *Service) Read(ctx context.Context, r *pb.ChunkServiceReadRequest) (*pb.ChunkServiceReadResponse, error) {
	data, err := s.read(ctx, r)
	if e := rpcErr(ctx, err); e != nil {
		return nil, e
	}
	code, text := resultOf(err)
	s.served("read", code)
	return &pb.ChunkServiceReadResponse{Result: code, Error: text, Data: data}, nil
}

func (s *Service) read(ctx context.Context, r *pb.ChunkServiceReadRequest) ([]byte, error) {
	h, err := handleOf(r.Cm, r.Id)
	if err == nil {
		err = ioRange(r.Offset, r.Length)
	}
	if err != nil {
		return nil, err
	}
	g, mg, ext, err := s.admit(h, r.Offset, r.Length)
	if mg == nil {
		return nil, s.notHere(h.CM)
	}
	if err != nil {
		return nil, err
	}
	ctx, cancel := s.ioCtx(ctx, g)
	defer cancel()
	var data []byte
	readChunk(syncIO{s: s, ctx: ctx}, ext, r.Offset, r.Length, func(b []byte, e error) { data, err = b, e })
	s.finished(g, mg, h.ID)
	if err != nil {
		return nil, fmt.Errorf("%w: reading chunk %s: %v", ErrFailed, h, err)
	}
	if data == nil {
		data = []byte{}
	}
	return data, nil
}

// Write serves a chunk write (at either manager of its pair).
func (s *Service) Write(ctx context.Context, r *pb.ChunkServiceWriteRequest) (*pb.ChunkServiceWriteResponse, error) {
	var maybe bool
	err := s.write(ctx, r, &maybe)
	if e := rpcErr(ctx, err); e != nil {
		return nil, e
	}
	code, text := resultOf(err)
	s.served("write", code)
	return &pb.ChunkServiceWriteResponse{Result: code, Error: text, EarlierMayLand: maybe && err == nil}, nil
}

func (s *Service) write(ctx context.Context, r *pb.ChunkServiceWriteRequest, maybe *bool) error {
	h, err := handleOf(r.Cm, r.Id)
	if err == nil {
		err = ioRange(r.Offset, uint64(len(r.Data)))
	}
	if err != nil {
		return err
	}
	mu := &s.wmu[(uint64(h.CM)*0x9e3779b97f4a7c15^h.ID)%uint64(len(s.wmu))]
	mu.Lock()
	defer mu.Unlock()
	g, mg, ext, err := s.admit(h, r.Offset, uint64(len(r.Data)))
	if mg == nil {
		return s.notHere(h.CM)
	}
	if err != nil {
		return err
	}
	ctx, cancel := s.ioCtx(ctx, g)
	defer cancel()
	var fence *rldev.Fence
	if r.FenceName != "" {
		fence = &rldev.Fence{Name: r.FenceName, Token: tokenOf(r.FenceToken)}
	}
	writeChunk(syncIO{s, ctx, fence, maybe}, ext, r.Offset, r.Data, func(e error) { err = e })
	s.finished(g, mg, h.ID)
	if err != nil && fence != nil && (errors.Is(err, rldev.ErrStaleToken) || errors.Is(err, lock.ErrStaleToken)) {
		return fmt.Errorf("%w: writing chunk %s under %s %v: %v", ErrFenced, h, fence.Name, fence.Token, err)
	}
	if err != nil {
		// Some blocks may have landed (and may land later still).
		return fmt.Errorf("%w: writing chunk %s: %v", ErrMaybeDone, h, err)
	}
	return nil
}

// Stat reports this node's managers (and, with cm and id, a chunk's
// extent).
func (s *Service) Stat(ctx context.Context, r *pb.ChunkServiceStatRequest) (*pb.ChunkServiceStatResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	resp := &pb.ChunkServiceStatResponse{}
	g := s.mu.gen
	if g == nil {
		return resp, nil
	}
	for id, mg := range g.mgs {
		if r.Cm != 0 && id != r.Cm {
			continue
		}
		st := mg.m.Status()
		resp.Managers = append(resp.Managers, &pb.ChunkManagerStatus{Cm: id, Node: s.cfg.Node, Incarnation: g.inc, Role: st.Role,
			Error: st.Err, Chunks: st.Chunks, FreeBlocks: st.FreeBlocks, Largest: st.Largest, FreeRuns: uint64(st.FreeRuns),
			QuarantinedBlocks: st.QuarantinedBlocks, Lsn: st.LSN, HighWater: st.HighWater, LogUsed: st.LogUsed,
			LogBlocks: st.LogBlocks, Checkpoint: st.Checkpoint, MaxChunks: st.MaxChunks, Peer: st.Peer})
		if r.Cm != 0 && r.Id != 0 && mg.m.m != nil {
			if e := mg.m.m.chunks[r.Id]; e != nil {
				resp.Rldev, resp.Block, resp.Length = e.RLDev, e.Block, e.Len
			}
		}
	}
	return resp, nil
}
