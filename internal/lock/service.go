package lock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/meta"
	"github.com/grovestore/grove/internal/metrics"
	"github.com/grovestore/grove/internal/ratelog"
	"github.com/grovestore/grove/internal/transport"
)

// Detector is the failure-detector service as the lock service uses it:
// which node incarnations are dead (a majority of observers say so; final).
type Detector interface {
	Dead(ctx context.Context, subjects []Subject) ([]bool, error)
}

// Liveness is the node's own view of itself (the self-fence), per
// incarnation: leases are bound to the incarnation that acquired them.
type Liveness interface {
	// AliveAs reports whether inc is the node's running incarnation and
	// alive now.
	AliveAs(inc uint64) bool
	// Deadline returns the local time until which inc is guaranteed alive
	// (no dead verdict on it can come earlier), if AliveAs(inc).
	Deadline(inc uint64) (time.Time, bool)
}

// Recovery is one recovery run's assignment.
type Recovery struct {
	Dead  ClerkID  // the dead clerk whose state is to be recovered
	Names []string // the leases it held (empty if All)
	// All: its leases are unknown: recover everything of its kind that
	// lies in the dead clerk's scope (the master grants no name in that
	// scope until the run is done; a run must touch no other name)...
	All bool
	// ...except these names, which live clerks hold (the dead clerk cannot
	// have held them in a conflicting mode; touching them would overwrite a
	// live holder's work, and the run's newer token would fence it out).
	Exclude []string
	// Token fences the run's writes: storage must accept them over the
	// dead clerk's and refuse them once a later grant's writes landed.
	Token Token
	// Renew, if set, asks the master for a newer token for this run (the
	// run's writes carry it from then on). A run calls it when one of its
	// writes may still land later under the token it has (the write's
	// answer was lost and it was sent again): only a newer token, admitted
	// where that write would land before the run ends, makes storage refuse
	// it once the dead clerk's names are granted again. Without it the run
	// would have to fail, and every new run of a large recovery may meet a
	// lost answer again. A session break while the renewal is out does
	// not fail it: it is sent again on the next session of the same
	// master (the call waits, as long as ctx lets it). An error means the
	// run must fail (the master refused, a newer master took over, the
	// run was cancelled, or ctx ended); the engine then reports the run's
	// end as a failure whatever the function returns.
	Renew func(ctx context.Context) (Token, error)
}

// Covers says whether the run may touch what lock name protects (as
// Recover.Covers): a recovery function must leave everything else alone.
func (r Recovery) Covers(name string) bool { return covers(r.All, r.Names, r.Exclude, name) }

// RecoveryFunc recovers the state a dead clerk of the same kind left behind
// (for example, replays its write-ahead log). It must be idempotent (it may
// run again for one dead clerk), carry r.Token on its writes, and stop when
// ctx ends (the run was cancelled: the node fenced itself, or a newer master
// took over). The master starts no other run for the same dead clerk until
// this one has returned and its end reached the master (or its clerk's
// incarnation was declared dead: then its late writes are fenced by the
// next run's newer token).
type RecoveryFunc func(ctx context.Context, r Recovery) error

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
	// Metrics counts grants, revocations, recoveries and sessions (nil:
	// none).
	Metrics *metrics.Node
}

// SessionQueue bounds the messages waiting to go out on one session. A full
// queue breaks the session: the next Hello carries the whole state, so
// nothing is lost but time.
const SessionQueue = 4096

// Service is a node's lock service: the thin driver of one Engine per node
// incarnation. It carries out the engine's effects (gRPC streams, config
// service calls, failure-detector queries, recovery runs) and feeds it
// their completions, ticks and the watched lock namespace. All decisions
// are the engine's; the simulator drives the same engine.
// It implements pb.LockServiceServer.
type Service struct {
	pb.UnimplementedLockServiceServer
	cfg   ServiceConfig
	log   *slog.Logger
	conns connCache
	ctx   context.Context
	stop  context.CancelFunc
	wg    sync.WaitGroup
	mu    struct {
		sync.Mutex
		eng    *Engine // the current incarnation's (nil between a fence and the next start)
		inc    uint64
		hint   *State
		def    *ClerkRT
		clerks map[ClerkID]*ClerkRT
		waits  map[*Waiter]chan struct{}
		out    map[uint64]*clerkSession  // clerk sessions, by engine session id
		acc    map[uint64]*masterSession // sessions accepted by the master
		nextAc uint64
		runs   map[runKey]context.CancelFunc
		renews map[runKey]chan RecoveryRenewal // a run's renewal, waiting for its answer
	}
	started sync.Once
	quiet   *ratelog.Limiter // "session ended" lines and the engines' notes
}

type clerkSession struct {
	out    chan *pb.SessionRequest
	cancel context.CancelFunc
	hungUp bool
}

type masterSession struct {
	out    chan *pb.SessionResponse
	closed bool
}

// NewService returns a stopped service; Start begins each incarnation.
func NewService(cfg ServiceConfig) *Service {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Tick == 0 {
		cfg.Tick = 250 * time.Millisecond
	}
	s := &Service{cfg: cfg, log: cfg.Log.With("layer", "lock"), quiet: ratelog.New(5 * time.Second)}
	s.ctx, s.stop = context.WithCancel(context.Background())
	s.mu.clerks = map[ClerkID]*ClerkRT{}
	s.mu.waits = map[*Waiter]chan struct{}{}
	s.mu.out = map[uint64]*clerkSession{}
	s.mu.acc = map[uint64]*masterSession{}
	s.mu.runs = map[runKey]context.CancelFunc{}
	s.mu.renews = map[runKey]chan RecoveryRenewal{}
	s.registerGauges()
	return s
}

// registerGauges exposes the master's epoch and the session queues at
// scrape time.
func (s *Service) registerGauges() {
	m := s.cfg.Metrics
	if m == nil {
		return
	}
	m.GaugeFunc("grove_lock_master_epoch", "Epoch of the lock master running on this node (0: none here).", nil, func() float64 {
		s.mu.Lock()
		defer s.mu.Unlock()
		if e := s.mu.eng; e != nil {
			if mr, rec := e.Master(); mr != nil {
				return float64(rec.Epoch)
			}
		}
		return 0
	})
	m.GaugeFunc("grove_lock_queued_messages", "Messages waiting on this node's lock sessions (clerk and master sides).", nil, func() float64 {
		s.mu.Lock()
		defer s.mu.Unlock()
		n := 0
		for _, cs := range s.mu.out {
			n += len(cs.out)
		}
		for _, ms := range s.mu.acc {
			if !ms.closed {
				n += len(ms.out)
			}
		}
		return float64(n)
	})
	m.GaugeFunc("grove_lock_clerks", "Clerks of this node's running incarnation.", nil, func() float64 {
		s.mu.Lock()
		defer s.mu.Unlock()
		return float64(len(s.mu.clerks))
	})
}

// envLocked is the engine's view of now: the time and whether its
// incarnation is alive.
func (s *Service) env(e *Engine) Env {
	return Env{Now: time.Now(), Alive: s.cfg.Live.AliveAs(e.Incarnation())}
}

// do runs fn on engine e under the lock and carries out its effects.
func (s *Service) do(e *Engine, fn func(Env) []any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.execLocked(e, fn(s.env(e)))
}

// Start begins incarnation inc of the node: a new engine with a fresh
// default clerk (a restarted node holds nothing and registers afresh) and,
// on candidates, a standby.
func (s *Service) Start(inc uint64) {
	s.started.Do(func() {
		s.wg.Add(2)
		go s.watch()
		go s.ticker()
	})
	s.mu.Lock()
	if inc <= s.mu.inc {
		s.mu.Unlock()
		return
	}
	if old := s.mu.eng; old != nil {
		s.execLocked(old, old.Fence(s.env(old), ErrFenced)) // a missed fence: the old incarnation is over
	}
	e := NewEngine(EngineConfig{Node: s.cfg.Node, Inc: inc, Addr: s.cfg.GRPCAddr, Candidate: s.cfg.Candidate, Tick: s.cfg.Tick})
	s.mu.eng, s.mu.inc = e, inc
	if s.mu.hint != nil {
		s.execLocked(e, e.LockNamespace(s.env(e), s.mu.hint))
	}
	def, err := s.newClerkLocked(e, "", nil)
	if err != nil {
		s.log.Error("default clerk", "err", err)
	}
	s.mu.def = def
	s.mu.Unlock()
}

// Fence ends incarnation inc: every clerk drops its leases and fails its
// waiters, and a master stops granting. Called synchronously by the node's
// self-fence, before the next incarnation starts.
func (s *Service) Fence(inc uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.mu.eng
	if e == nil || e.Incarnation() != inc {
		return
	}
	s.execLocked(e, e.Fence(s.env(e), ErrFenced))
	s.mu.eng, s.mu.def = nil, nil
	s.log.Warn("lock service fenced", "incarnation", inc)
}

// Close stops everything (graceful shutdown: leases are not released; the
// failure detector will declare the node dead and the master resolves them).
func (s *Service) Close() {
	s.mu.Lock()
	if e := s.mu.eng; e != nil {
		s.execLocked(e, e.Fence(s.env(e), ErrShutdown))
		s.mu.eng, s.mu.def = nil, nil
	}
	s.mu.Unlock()
	s.stop()
	s.wg.Wait()
	s.conns.close()
}

// NewClerk creates a clerk of a kind for the current incarnation and
// registers it in the config service. recover is required when kind != "".
// It fails with ErrFenced between a fence and the next incarnation: a clerk
// belongs to exactly one incarnation. scope is the name prefixes the clerk
// may lock (see Engine.NewClerk).
func (s *Service) NewClerk(kind string, recover RecoveryFunc, scope ...string) (*ClerkRT, error) {
	if (kind == "") != (recover == nil) {
		return nil, errors.New("lock: a clerk has a recovery function exactly when it has a kind")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.eng == nil {
		return nil, ErrFenced
	}
	return s.newClerkLocked(s.mu.eng, kind, recover, scope...)
}

func (s *Service) newClerkLocked(e *Engine, kind string, recover RecoveryFunc, scope ...string) (*ClerkRT, error) {
	id, out, err := e.NewClerk(s.env(e), kind, scope...)
	if err != nil {
		return nil, err
	}
	c := &ClerkRT{s: s, e: e, id: id, recover: recover, lost: make(chan struct{}), closed: make(chan struct{})}
	s.mu.clerks[id] = c
	s.execLocked(e, out)
	return c, nil
}

// DefaultClerk is the current incarnation's clerk without a recovery kind
// (nil between a fence and the next incarnation).
func (s *Service) DefaultClerk() *ClerkRT {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.def
}

// watch keeps the engines' hint of the lock namespace current.
func (s *Service) watch() {
	defer s.wg.Done()
	for ns := range s.cfg.Meta.Watch(s.ctx, Namespace, 0) {
		st, err := DecodeState(ns)
		if err != nil {
			s.log.Warn("lock namespace does not decode", "err", err)
			continue
		}
		s.mu.Lock()
		if s.mu.hint == nil || st.Version > s.mu.hint.Version {
			s.mu.hint = st
		}
		if e := s.mu.eng; e != nil {
			s.execLocked(e, e.LockNamespace(s.env(e), st))
		}
		s.mu.Unlock()
	}
}

func (s *Service) ticker() {
	defer s.wg.Done()
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		s.mu.Lock()
		if e := s.mu.eng; e != nil {
			s.execLocked(e, e.Tick(s.env(e)))
		}
		s.mu.Unlock()
	}
}

// async runs io off the lock; its completion goes to engine e.
func (s *Service) async(e *Engine, timeout time.Duration, io func(ctx context.Context) func(Env) []any) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		ctx, cancel := context.WithTimeout(s.ctx, timeout)
		k := io(ctx)
		cancel()
		if s.ctx.Err() == nil {
			s.do(e, k)
		}
	}()
}

// execLocked carries out engine e's effects, in order. Holds s.mu; nothing
// here blocks (I/O runs on goroutines).
func (s *Service) execLocked(e *Engine, out []any) {
	for _, o := range out {
		switch x := o.(type) {
		case Note:
			if n := s.noteQuiet(x); n >= 0 {
				args := append([]any{"incarnation", e.Incarnation()}, x.Args...)
				if n > 0 {
					args = append(args, "suppressed", n)
				}
				s.log.Log(context.Background(), slog.Level(x.Level), x.Msg, args...)
			}
		case Wake:
			for _, w := range x.Waiters {
				if ch := s.mu.waits[w]; ch != nil {
					delete(s.mu.waits, w)
					close(ch)
				}
			}
		case RevokeNotice:
			if c := s.mu.clerks[x.Clerk]; c != nil && c.onRevoke != nil {
				go c.onRevoke(x.Name) // never under s.mu: the handler takes and releases holds
			}
		case LeasesLost:
			if c := s.mu.clerks[x.Clerk]; c != nil {
				c.loseOnce.Do(func() { c.reason = x.Reason; close(c.lost) })
				if x.Reason == ErrFenced || x.Reason == ErrShutdown {
					delete(s.mu.clerks, x.Clerk)
				}
			}
		case ClerkClosed:
			if c := s.mu.clerks[x.Clerk]; c != nil {
				close(c.closed)
				delete(s.mu.clerks, x.Clerk)
				if s.mu.def == c {
					s.mu.def = nil
				}
			}
		case ReadLock:
			s.async(e, 5*time.Second, func(ctx context.Context) func(Env) []any {
				st, err := s.read(ctx)
				return func(env Env) []any { return e.LockRead(env, x.ID, st, err) }
			})
		case Propose:
			s.async(e, 5*time.Second, func(ctx context.Context) func(Env) []any {
				v, err := s.cfg.Meta.Propose(ctx, x.Decree)
				return func(env Env) []any { return e.Proposed(env, x.ID, v, err) }
			})
		case Update:
			s.async(e, 10*time.Second, func(ctx context.Context) func(Env) []any {
				v, err := s.cfg.Meta.Update(ctx, Namespace, x.Origin, x.Build)
				return func(env Env) []any { return e.Updated(env, x.ID, v, err) }
			})
		case QueryFD:
			s.async(e, 2*time.Second, func(ctx context.Context) func(Env) []any {
				dead, err := s.cfg.Detector.Dead(ctx, x.Subjects)
				return func(env Env) []any { return e.FDAnswer(env, x.ID, dead, err) }
			})
		case Dial:
			s.dialLocked(e, x)
		case SessionSend:
			cs := s.mu.out[x.Session]
			if cs == nil || cs.hungUp {
				continue
			}
			select {
			case cs.out <- EncodeClerkMessage(x.Msg):
			default:
				cs.cancel() // the queue is full: break the session (the next Hello carries the state)
			}
		case HangUp:
			if cs := s.mu.out[x.Session]; cs != nil {
				cs.hungUp = true
				cs.cancel()
				delete(s.mu.out, x.Session)
			}
		case ClerkSend:
			ms := s.mu.acc[x.Session]
			if ms == nil || ms.closed {
				continue
			}
			if m := s.cfg.Metrics; m != nil {
				switch x.Msg.(type) {
				case Grant:
					m.LockGrants.Inc()
				case Revoke:
					m.LockRevocations.Inc()
				}
			}
			select {
			case ms.out <- EncodeMasterMessage(x.Msg):
			default:
				// Full: close it, and tell the engine (the clerk reconnects
				// with a Hello; meanwhile it is a suspect like any clerk
				// without a session).
				ms.closed = true
				close(ms.out)
				s.execLocked(e, e.MasterClosed(s.env(e), x.Session))
			}
		case ClerkClose:
			if ms := s.mu.acc[x.Session]; ms != nil && !ms.closed {
				ms.closed = true
				close(ms.out)
			}
		case StartRecovery:
			c := s.mu.clerks[x.Clerk]
			if c == nil || c.recover == nil {
				s.async(e, time.Second, func(context.Context) func(Env) []any {
					return func(env Env) []any {
						return e.RecoveryFinished(env, x.Run, errors.New("lock: this clerk has no recovery function"))
					}
				})
				continue
			}
			ctx, cancel := context.WithTimeout(s.ctx, 10*time.Minute)
			key := runKey{e.Incarnation(), x.Run}
			s.mu.runs[key] = cancel
			s.count(func(m *metrics.Node) { m.LockRecoveries.WithLabelValues("started").Inc() })
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				log := s.log.With("clerk", x.Clerk, "dead", x.Req.Dead, "token", x.Req.Token)
				log.Info("running recovery", "all", x.Req.All, "names", len(x.Req.Names))
				err := c.recover(ctx, Recovery{Dead: x.Req.Dead, Names: x.Req.Names, All: x.Req.All, Exclude: x.Req.Exclude, Token: x.Req.Token,
					Renew: func(ctx context.Context) (Token, error) { return s.renewRun(ctx, e, x.Run) }})
				if err != nil {
					log.Warn("recovery failed or was cancelled; the master decides again", "err", err)
					s.count(func(m *metrics.Node) { m.LockRecoveries.WithLabelValues("failed").Inc() })
				} else {
					log.Info("recovery done")
					s.count(func(m *metrics.Node) { m.LockRecoveries.WithLabelValues("done").Inc() })
				}
				s.mu.Lock()
				delete(s.mu.runs, key)
				cancel()
				s.execLocked(e, e.RecoveryFinished(s.env(e), x.Run, err))
				s.mu.Unlock()
			}()
		case CancelRecovery:
			if cancel := s.mu.runs[runKey{e.Incarnation(), x.Run}]; cancel != nil {
				cancel()
			}
		case RecoveryRenewal:
			if key := (runKey{e.Incarnation(), x.Run}); s.mu.renews[key] != nil {
				ch := s.mu.renews[key]
				delete(s.mu.renews, key)
				ch <- x // buffered: the waiter may be gone
			}
		}
	}
}

// renewRun asks engine e's master for a newer token for run (Recovery.Renew).
func (s *Service) renewRun(ctx context.Context, e *Engine, run uint64) (Token, error) {
	key := runKey{e.Incarnation(), run}
	ch := make(chan RecoveryRenewal, 1)
	s.mu.Lock()
	if s.mu.renews[key] != nil {
		s.mu.Unlock()
		return Token{}, fmt.Errorf("%w: a renewal is already out", ErrRenewRefused)
	}
	s.mu.renews[key] = ch
	s.execLocked(e, e.RenewRun(s.env(e), run))
	s.mu.Unlock()
	select {
	case r := <-ch:
		return r.Token, r.Err
	case <-ctx.Done():
		s.mu.Lock()
		if s.mu.renews[key] == ch {
			delete(s.mu.renews, key)
		}
		// A late answer must not renew a run that gave up on it, and an
		// answer that came as ctx ended (select picked ctx) must not let
		// the run end well under a token its writes may not carry.
		e.AbandonRenewal(run)
		s.mu.Unlock()
		return Token{}, ctx.Err()
	}
}

// runKey names a recovery run: engines number their runs from 1 in each
// incarnation, and an old incarnation's run may still be winding down.
type runKey struct{ inc, run uint64 }

// dialLocked opens a clerk's session: a gRPC stream to the master. The send
// queue exists at once, so that the Hello (the next effect) goes first.
func (s *Service) dialLocked(e *Engine, d Dial) {
	s.count(func(m *metrics.Node) { m.LockSessions.WithLabelValues("dialed").Inc() })
	ctx, cancel := context.WithCancel(s.ctx)
	cs := &clerkSession{out: make(chan *pb.SessionRequest, SessionQueue), cancel: cancel}
	s.mu.out[d.Session] = cs
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer cancel()
		err := s.runClerkSession(ctx, e, d, cs)
		s.mu.Lock()
		hungUp := cs.hungUp
		delete(s.mu.out, d.Session)
		if !hungUp {
			s.execLocked(e, e.SessionClosed(s.env(e), d.Session))
		}
		s.mu.Unlock()
		if err != nil && !hungUp && s.ctx.Err() == nil {
			s.count(func(m *metrics.Node) { m.LockSessions.WithLabelValues("broken").Inc() })
			s.logSessionEnd(d, err)
		}
	}()
}

func (s *Service) runClerkSession(ctx context.Context, e *Engine, d Dial, cs *clerkSession) error {
	cl, err := s.conns.get(d.Master.Addr)
	if err != nil {
		return err
	}
	stream, err := cl.Session(ctx)
	if err != nil {
		return err
	}
	go func() { // the one goroutine that writes on the stream
		for {
			select {
			case m := <-cs.out:
				if stream.Send(m) != nil {
					cs.cancel()
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	for {
		m, err := stream.Recv()
		if err != nil {
			return err
		}
		msg, err := DecodeMasterMessage(m)
		if err != nil {
			s.count(func(m *metrics.Node) { m.LockMalformed.Inc() })
			s.log.Warn("clerk dropped a malformed message from the master; closing the session", "clerk", d.Clerk, "err", err)
			return err
		}
		s.do(e, func(env Env) []any { return e.SessionRecv(env, d.Session, msg) })
	}
}

// Session implements the master side of a clerk's session.
func (s *Service) Session(stream grpc.BidiStreamingServer[pb.SessionRequest, pb.SessionResponse]) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	msg, err := DecodeClerkMessage(first)
	if err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	h, ok := msg.(Hello)
	if !ok {
		return status.Error(codes.InvalidArgument, "lock: a session starts with a hello")
	}
	s.mu.Lock()
	e := s.mu.eng
	if e == nil {
		s.mu.Unlock()
		return status.Error(codes.Unavailable, "lock: this node is not the lock master")
	}
	s.mu.nextAc++
	id := s.mu.nextAc
	ms := &masterSession{out: make(chan *pb.SessionResponse, SessionQueue)}
	s.mu.acc[id] = ms
	s.execLocked(e, e.Accept(s.env(e), id, h))
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.mu.acc, id)
		if !ms.closed {
			ms.closed = true
			s.execLocked(e, e.MasterClosed(s.env(e), id))
		}
		s.mu.Unlock()
	}()
	recvErr := make(chan error, 1)
	go func() {
		for {
			req, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			msg, err := DecodeClerkMessage(req)
			if err != nil {
				s.count(func(m *metrics.Node) { m.LockMalformed.Inc() })
				s.log.Warn("lock master dropped a malformed message; closing the session", "clerk", h.Clerk, "err", err)
				recvErr <- status.Error(codes.InvalidArgument, err.Error())
				return
			}
			s.do(e, func(env Env) []any { return e.MasterRecv(env, id, msg) })
		}
	}()
	for {
		select {
		case r, ok := <-ms.out:
			if !ok {
				return status.Error(codes.Unavailable, "lock: session closed by the master")
			}
			if err := stream.Send(r); err != nil {
				return err
			}
		case err := <-recvErr:
			return err
		case <-stream.Context().Done():
			return status.Error(codes.Unavailable, "lock: session closed")
		}
	}
}

// noteQuiet rate-limits the engine's notes below error level: one line per
// message every 5 s (a config service that is down makes every retry fail
// the same way). It returns -1 to drop the note, else how many were dropped
// since the last one logged.
func (s *Service) noteQuiet(x Note) int {
	if slog.Level(x.Level) >= slog.LevelError {
		return 0
	}
	if ok, n := s.quiet.Allow("note:" + x.Msg); ok {
		return n
	}
	return -1
}

// count updates the metrics, if any.
func (s *Service) count(f func(*metrics.Node)) {
	if s.cfg.Metrics != nil {
		f(s.cfg.Metrics)
	}
}

// logSessionEnd reports a clerk session that broke: at info level, at most
// once every 5 s per master address (a master failover breaks every
// clerk's session at once), with the number suppressed.
func (s *Service) logSessionEnd(d Dial, err error) {
	if ok, n := s.quiet.Allow("session:" + d.Master.Addr); ok {
		s.log.Info("clerk session to the lock master ended; reconnecting", "clerk", d.Clerk, "master", d.Master.Addr, "epoch", d.Master.Epoch,
			"err", err, "suppressed", n)
	}
}

// read is a linearizable read of the lock namespace.
func (s *Service) read(ctx context.Context) (*State, error) {
	ns, err := s.cfg.Meta.Read(ctx, Namespace)
	if err != nil {
		return nil, err
	}
	return DecodeState(ns)
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

// List implements pb.LockServiceServer: the master answers; other nodes
// forward to it.
func (s *Service) List(ctx context.Context, _ *pb.ListRequest) (*pb.ListResponse, error) {
	s.mu.Lock()
	var r *pb.ListResponse
	if e := s.mu.eng; e != nil {
		if m, rec := e.Master(); m != nil {
			r = listView(m, rec)
		}
	}
	s.mu.Unlock()
	if r != nil {
		return r, nil
	}
	return ListFromMaster(ctx, s.cfg.Meta, &s.conns, s.cfg.GRPCAddr)
}

// ListReadTimeout bounds ListFromMaster's read of the master record.
const ListReadTimeout = 2 * time.Second

// ListFromMaster finds the master through the config service and asks it.
// self is the caller's own address: a record naming it while the caller
// runs no master is answered "unavailable", not forwarded to itself.
func ListFromMaster(ctx context.Context, mc *meta.Client, conns *connCache, self string) (*pb.ListResponse, error) {
	// Bounded well inside a client's default timeout: without a quorum the
	// answer is "unavailable" in seconds, not a client's timeout.
	rctx, cancel := context.WithTimeout(ctx, ListReadTimeout)
	ns, err := mc.Read(rctx, Namespace)
	cancel()
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "the config service did not answer within %v (no quorum?), so the lock master cannot be found", ListReadTimeout)
	}
	st, err := DecodeState(ns)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if st.Master == nil {
		return nil, status.Error(codes.Unavailable, "lock: no master yet")
	}
	if st.Master.Addr == self {
		return nil, status.Errorf(codes.Unavailable, "lock: the master of epoch %d (this node) is not running; a standby will take over", st.Master.Epoch)
	}
	cl, err := conns.get(st.Master.Addr)
	if err != nil {
		return nil, err
	}
	r, err := cl.List(ctx, &pb.ListRequest{})
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "lock master on node %d (%s): %s", st.Master.Node, st.Master.Addr, transport.Describe(err))
	}
	return r, nil
}

// listView is the master's view for `grove lock list`.
func listView(m *Master, rec MasterRecord) *pb.ListResponse {
	out := &pb.ListResponse{Master: &pb.LockMasterRecord{Node: rec.Node, Incarnation: rec.Inc, Epoch: uint64(rec.Epoch), GrpcAddr: rec.Addr}, Serving: m.Serving()}
	for _, l := range m.Locks() {
		e := &pb.LockEntry{Name: []byte(l.Name)}
		var hs []ClerkID
		for h := range l.Holders {
			hs = append(hs, h)
		}
		sortIDs(hs)
		for _, h := range hs {
			e.Holders = append(e.Holders, &pb.LockHolder{Clerk: ClerkIDToPB(h), Mode: modeToPB(l.Holders[h]), Token: TokenToPB(l.Tokens[h])})
		}
		for _, w := range l.Waiters {
			e.Waiters = append(e.Waiters, ClerkIDToPB(w))
		}
		out.Locks = append(out.Locks, e)
	}
	for _, c := range m.Clerks() {
		out.Clerks = append(out.Clerks, &pb.ClerkEntry{Id: ClerkIDToPB(c.Info.ID), Kind: c.Info.Kind, Connected: c.Connected, Dead: c.Dead, Held: uint32(c.Held)})
	}
	for _, r := range m.Recoveries() {
		rr := &pb.LockRecoveryRecord{Dead: ClerkIDToPB(r.Dead), Kind: r.Kind, All: r.All, Started: r.Started}
		for _, n := range r.Names() {
			rr.Leases = append(rr.Leases, &pb.HeldLease{Name: []byte(n), Mode: modeToPB(r.Held[n])})
		}
		out.Recoveries = append(out.Recoveries, rr)
	}
	return out
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
	if req.Fresh {
		c.Drop(string(req.Name)) // a cached lease would grant its old token again
	}
	h, err := c.Acquire(stream.Context(), string(req.Name), mode)
	if err != nil {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return status.FromContextError(err).Err()
		}
		return status.Error(codes.Unavailable, err.Error())
	}
	defer h.Release()
	// The node's own record of a remote hold's span (the fault suite
	// checks holds by these lines: a remote caller learns of either end
	// later, by a network delay). Logged once granted: the line's time
	// follows the grant.
	s.log.Info("remote hold granted", "lock", string(req.Name), "token", h.Token().String(), "clerk", c.ID().String())
	if err := stream.Send(&pb.HoldResponse{Kind: pb.HoldResponse_KIND_GRANTED, Clerk: ClerkIDToPB(c.ID()),
		WaitedMicros: uint64(time.Since(start).Microseconds()), Token: TokenToPB(h.Token())}); err != nil {
		return err
	}
	var timer <-chan time.Time
	if req.HoldMillis > 0 {
		timer = time.After(time.Duration(req.HoldMillis) * time.Millisecond)
	}
	select {
	case <-stream.Context().Done():
		// The caller went away, or its connection broke: this node ends
		// the hold now, and the caller may learn it later (a broken
		// connection shows at either end first): a remote holder's
		// mutual exclusion ends here, not where it notices, and what it
		// writes must carry the grant's fencing token. Logged before the
		// release: the line's time precedes any grant of the lock that
		// this release lets the master make (the fault suite compares
		// the two lines' times).
		s.log.Info("remote hold ended: its caller's stream ended", "lock", string(req.Name), "token", h.Token().String(), "clerk", c.ID().String())
	case <-timer:
	case <-h.Lost():
		return status.Error(codes.Aborted, fmt.Sprintf("lease on %q lost: %v", req.Name, h.LostReason()))
	}
	h.Release()
	return stream.Send(&pb.HoldResponse{Kind: pb.HoldResponse_KIND_RELEASED, Clerk: ClerkIDToPB(c.ID())})
}

// Register exposes the service on a gRPC server.
func Register(gs *grpc.Server, s *Service) { pb.RegisterLockServiceServer(gs, s) }
