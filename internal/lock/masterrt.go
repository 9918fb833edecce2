package lock

import (
	"context"
	"errors"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/grovestore/grove/api/grovepb"
)

// standby watches the master record and takes over, by a decree conditional
// on the version it read, when the failure detector declares the named
// master dead (or there is none). It runs for one node incarnation.
func (s *Service) standby(inc uint64) {
	defer s.wg.Done()
	for sleep(s.ctx, s.cfg.Tick) {
		s.mu.Lock()
		cur, m := s.mu.inc, s.mu.master
		s.mu.Unlock()
		if cur != inc {
			return // a newer incarnation runs its own standby
		}
		if m != nil || !s.cfg.Live.Alive() {
			continue
		}
		ctx, cancel := context.WithTimeout(s.ctx, 5*time.Second)
		if s.masterSuspect(ctx, inc) {
			if err := s.tryTakeover(ctx, inc); err != nil && !errors.Is(err, context.Canceled) {
				s.log.Debug("standby", "err", err)
			}
		}
		cancel()
	}
}

// masterSuspect checks the hinted master against the failure detector
// (no config-service load): true if there is none, it is dead, or it is
// this very incarnation without a running master.
func (s *Service) masterSuspect(ctx context.Context, inc uint64) bool {
	st, _ := s.hint()
	if st == nil || st.master == nil {
		return true
	}
	rec := st.master
	if rec.Node == s.cfg.Node && rec.Incarnation == inc {
		return true
	}
	dead, err := s.cfg.Detector.Dead(ctx, rec.Node, rec.Incarnation)
	return err == nil && dead
}

// tryTakeover re-reads the namespace linearizably, re-checks the master
// and passes the takeover decree conditional on that read.
func (s *Service) tryTakeover(ctx context.Context, inc uint64) error {
	st, err := s.read(ctx)
	if err != nil {
		return err
	}
	if rec := st.master; rec != nil {
		// A record naming this very incarnation means our own master halted
		// (it grants nothing any more): take over again in a new epoch.
		if rec.Node != s.cfg.Node || rec.Incarnation != inc {
			dead, err := s.cfg.Detector.Dead(ctx, rec.Node, rec.Incarnation)
			if err != nil || !dead {
				return err
			}
		}
	}
	epoch := uint64(1)
	if st.master != nil {
		epoch = st.master.Epoch + 1
	}
	rec := &pb.LockMasterRecord{Node: s.cfg.Node, Incarnation: inc, Epoch: epoch, GrpcAddr: s.cfg.GRPCAddr}
	_, err = s.cfg.Meta.Propose(ctx, &pb.Decree{Namespace: Namespace, ExpectedVersion: st.version, Ops: []*pb.Op{put("master", rec)}, Origin: "lock-standby"})
	if err != nil {
		return err // a stale version: someone else moved first; re-read next tick
	}
	// The decree was conditional on st: the clerk list and the recovery
	// records in st are exactly those at the moment this master took over.
	m := newMasterRT(s, inc, NewMaster(Epoch(epoch), st.clerks, st.records), rec)
	s.mu.Lock()
	if s.mu.inc != inc || !s.cfg.Live.Alive() {
		s.mu.Unlock()
		return ErrFenced
	}
	s.mu.master = m
	s.mu.Unlock()
	s.log.Info("lock master takes over", "epoch", epoch, "clerks", len(st.clerks), "recoveries", len(st.records), "version", st.version)
	m.start(st.version + 1)
	return nil
}

// masterRT runs a Master core for one epoch.
type masterRT struct {
	s      *Service
	inc    uint64
	rec    *pb.LockMasterRecord
	ctx    context.Context
	cancel context.CancelFunc
	mu     sync.Mutex // guards core and sessions
	core   *Master
	sess   map[ClerkID]*masterSession
	decree chan *pb.Op // ordered config-service writes (Persist, Forget)
	wg     sync.WaitGroup
}

type masterSession struct {
	out    chan *pb.SessionResponse
	closed bool
	stop   context.CancelFunc
}

func newMasterRT(s *Service, inc uint64, core *Master, rec *pb.LockMasterRecord) *masterRT {
	m := &masterRT{s: s, inc: inc, rec: rec, core: core, sess: map[ClerkID]*masterSession{}, decree: make(chan *pb.Op, 1024)}
	m.ctx, m.cancel = context.WithCancel(s.ctx)
	return m
}

func (m *masterRT) start(version uint64) {
	m.wg.Add(3)
	go m.tickLoop()
	go m.watch(version)
	go m.decrees()
}

// halt stops the master: no more grants, every session closes.
func (m *masterRT) halt(why string) {
	m.mu.Lock()
	if m.ctx.Err() == nil {
		m.s.log.Warn("lock master stops", "epoch", m.core.Epoch(), "why", why)
	}
	m.cancel()
	for id, ss := range m.sess {
		m.closeLocked(id, ss)
	}
	m.mu.Unlock()
	m.s.mu.Lock()
	if m.s.mu.master == m {
		m.s.mu.master = nil
	}
	m.s.mu.Unlock()
}

// okLocked: the master acts only while its node is alive and it is running.
func (m *masterRT) okLocked() bool {
	if m.ctx.Err() != nil {
		return false
	}
	if !m.s.cfg.Live.Alive() {
		go m.halt("node not alive")
		return false
	}
	return true
}

func (m *masterRT) closeLocked(id ClerkID, ss *masterSession) {
	if !ss.closed {
		ss.closed = true
		close(ss.out)
		ss.stop()
	}
	if m.sess[id] == ss {
		delete(m.sess, id)
	}
}

// applyLocked carries out the core's outputs.
func (m *masterRT) applyLocked(out []any) {
	for _, o := range out {
		switch x := o.(type) {
		case Send:
			ss := m.sess[x.To]
			if ss == nil || ss.closed {
				continue
			}
			select {
			case ss.out <- EncodeMasterMessage(x.Msg):
			default:
				m.closeLocked(x.To, ss) // full: the clerk reconnects with a Hello
			}
		case Drop:
			if ss := m.sess[x.Clerk]; ss != nil {
				m.closeLocked(x.Clerk, ss)
			}
		case Persist:
			r := &pb.LockRecoveryRecord{Dead: ClerkIDToPB(x.Record.Dead), Kind: x.Record.Kind, All: x.Record.All}
			for _, n := range x.Record.Names {
				r.Names = append(r.Names, []byte(n))
			}
			m.queueDecree(put(recoveryKey(x.Record.Dead), r))
		case Forget:
			m.queueDecree(&pb.Op{Kind: pb.Op_KIND_DELETE, Key: clerkKey(x.Clerk)})
			m.queueDecree(&pb.Op{Kind: pb.Op_KIND_DELETE, Key: recoveryKey(x.Clerk)})
		}
	}
}

// queueDecree queues a config write without blocking under m.mu. A master
// that cannot keep up with its own obligations stops (a standby, or this
// node's standby in a new epoch, rebuilds everything from the clerks).
func (m *masterRT) queueDecree(op *pb.Op) {
	select {
	case m.decree <- op:
	default:
		go m.halt("config-service writes are not keeping up")
	}
}

// decrees writes Persist and Forget to the config service in order. Each is
// retried until it lands or the master stops; a new master re-derives any
// that did not land (a dead clerk without a record gets an all-recovery).
func (m *masterRT) decrees() {
	defer m.wg.Done()
	for {
		var op *pb.Op
		select {
		case <-m.ctx.Done():
			return
		case op = <-m.decree:
		}
		for m.ctx.Err() == nil {
			ctx, cancel := context.WithTimeout(m.ctx, 10*time.Second)
			_, err := m.s.cfg.Meta.Update(ctx, Namespace, "lock-master", func(ns *pb.Namespace) ([]*pb.Op, error) {
				st, err := decodeState(ns)
				if err != nil {
					return nil, err
				}
				if st.master == nil || st.master.Epoch != m.rec.Epoch {
					return nil, errSuperseded
				}
				if op.Kind == pb.Op_KIND_DELETE {
					found := false
					for _, e := range ns.Entries {
						found = found || e.Key == op.Key
					}
					if !found {
						return nil, nil
					}
				}
				return []*pb.Op{op}, nil
			})
			cancel()
			if errors.Is(err, errSuperseded) {
				m.halt("a newer master took over")
				return
			}
			if err == nil {
				break
			}
			m.s.log.Warn("lock master: config write failed; retrying", "key", op.Key, "err", err)
			sleep(m.ctx, 200*time.Millisecond)
		}
	}
}

var errSuperseded = errors.New("lock: superseded by a newer master")

// tickLoop asks the failure detector about suspects.
func (m *masterRT) tickLoop() {
	defer m.wg.Done()
	for sleep(m.ctx, m.s.cfg.Tick) {
		m.mu.Lock()
		if !m.okLocked() {
			m.mu.Unlock()
			return
		}
		suspects := m.core.Tick()
		m.mu.Unlock()
		for _, c := range suspects {
			ctx, cancel := context.WithTimeout(m.ctx, 2*time.Second)
			dead, err := m.s.cfg.Detector.Dead(ctx, c.Node, c.Inc)
			cancel()
			if err != nil || !dead {
				continue
			}
			m.mu.Lock()
			if m.okLocked() {
				m.s.log.Info("clerk declared dead", "clerk", c)
				m.applyLocked(m.core.Verdict(c, true))
			}
			m.mu.Unlock()
		}
	}
}

// watch follows the lock namespace: new clerks, and a newer master.
func (m *masterRT) watch(after uint64) {
	defer m.wg.Done()
	for ns := range m.s.cfg.Meta.Watch(m.ctx, Namespace, after-1) {
		st, err := decodeState(ns)
		if err != nil {
			m.s.log.Warn("lock namespace does not decode", "err", err)
			continue
		}
		if st.master == nil || st.master.Epoch != m.rec.Epoch {
			m.halt("a newer master took over")
			return
		}
		m.mu.Lock()
		if m.okLocked() {
			for _, ci := range st.clerks {
				m.applyLocked(m.core.ClerkRegistered(ci))
			}
		}
		m.mu.Unlock()
	}
}

// serve runs one clerk's session on the master.
func (m *masterRT) serve(stream grpc.BidiStreamingServer[pb.SessionRequest, pb.SessionResponse]) error {
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
	ctx, stop := context.WithCancel(stream.Context())
	defer stop()
	ss := &masterSession{out: make(chan *pb.SessionResponse, SessionQueue), stop: stop}
	m.mu.Lock()
	if !m.okLocked() {
		m.mu.Unlock()
		return status.Error(codes.Unavailable, "lock: master stopped")
	}
	if old := m.sess[h.Clerk]; old != nil {
		m.closeLocked(h.Clerk, old)
	}
	m.sess[h.Clerk] = ss
	m.applyLocked(m.core.Hello(h))
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		if m.sess[h.Clerk] == ss {
			m.closeLocked(h.Clerk, ss)
			if m.okLocked() {
				m.applyLocked(m.core.Disconnected(h.Clerk))
			}
		}
		m.mu.Unlock()
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
				m.s.log.Warn("lock master dropped a malformed message; closing the session", "clerk", h.Clerk, "err", err)
				recvErr <- status.Error(codes.InvalidArgument, err.Error())
				return
			}
			m.mu.Lock()
			if m.sess[h.Clerk] != ss || !m.okLocked() {
				m.mu.Unlock()
				recvErr <- status.Error(codes.Unavailable, "lock: session superseded")
				return
			}
			m.applyLocked(m.core.Handle(h.Clerk, msg))
			m.mu.Unlock()
		}
	}()
	for {
		select {
		case r, ok := <-ss.out:
			if !ok {
				return status.Error(codes.Unavailable, "lock: session closed by the master")
			}
			if err := stream.Send(r); err != nil {
				return err
			}
		case err := <-recvErr:
			return err
		case <-ctx.Done():
			return status.Error(codes.Unavailable, "lock: session closed")
		}
	}
}

// list is the master's view for `grove lock list`.
func (m *masterRT) list() *pb.ListResponse {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := &pb.ListResponse{Master: m.rec, Serving: m.core.Serving()}
	for _, l := range m.core.Locks() {
		e := &pb.LockEntry{Name: []byte(l.Name)}
		var hs []ClerkID
		for h := range l.Holders {
			hs = append(hs, h)
		}
		sortIDs(hs)
		for _, h := range hs {
			e.Holders = append(e.Holders, &pb.LockHolder{Clerk: ClerkIDToPB(h), Mode: modeToPB(l.Holders[h])})
		}
		for _, w := range l.Waiters {
			e.Waiters = append(e.Waiters, ClerkIDToPB(w))
		}
		out.Locks = append(out.Locks, e)
	}
	for _, c := range m.core.Clerks() {
		out.Clerks = append(out.Clerks, &pb.ClerkEntry{Id: ClerkIDToPB(c.Info.ID), Kind: c.Info.Kind, Connected: c.Connected, Dead: c.Dead, Held: uint32(c.Held)})
	}
	for _, r := range m.core.Recoveries() {
		rr := &pb.LockRecoveryRecord{Dead: ClerkIDToPB(r.Dead), Kind: r.Kind, All: r.All}
		for _, n := range r.Names {
			rr.Names = append(rr.Names, []byte(n))
		}
		out.Recoveries = append(out.Recoveries, rr)
	}
	return out
}

func sortIDs(ids []ClerkID) {
	for i := 1; i < len(ids); i++ {
		for j := i; j > 0 && ids[j].Less(ids[j-1]); j-- {
			ids[j], ids[j-1] = ids[j-1], ids[j]
		}
	}
}
