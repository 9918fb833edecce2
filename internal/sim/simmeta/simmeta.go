// Package simmeta is the config service as the simulator runs it: the real
// state machine (meta.FSM, conditional decrees on versioned namespaces)
// behind a model of what clients of a replicated service see. Calls take a
// random time; the whole service stalls now and then for seconds (an
// election, a slow disk); a call times out at the client while its decree
// may still commit later (an ambiguous outcome) or be lost; a client that
// cannot reach the service gets nothing but a timeout; watches deliver
// versions late, never backwards. The lock service's and the failure
// detector's engines are simulated against it, so that asynchronous decrees
// are part of what the simulator checks.
package simmeta

import (
	"errors"
	"log/slog"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/meta"
	"github.com/grovestore/grove/internal/sim"
)

// Errors a simulated call can end with, besides meta's own.
var (
	ErrTimeout = errors.New("simmeta: call timed out (the decree may still commit)")
)

// Service is one simulated config service.
type Service struct {
	w   *sim.World
	fsm *meta.FSM
	// Reachable tells whether process id can reach the service now (a
	// partition model); nil means always.
	Reachable func(id uint64) bool
	// Latency of a call, uniform in [MinLatency, MaxLatency].
	MinLatency, MaxLatency time.Duration
	// Timeout is the client's deadline per call.
	Timeout time.Duration
	// LoseRate is the probability that a decree is lost (its leader died
	// before committing it): the client times out and nothing changes.
	LoseRate     float64
	stalledUntil time.Duration
	index        uint64
	Decrees      int
	Ambiguous    int
	// MaxPerSecond is the most decrees committed in any second of
	// simulated time: engines that trade decrees without end (a
	// livelock, each undoing the other's) show here first.
	MaxPerSecond int
	recent       []time.Duration // commit times within the last second
}

// New returns a service with LAN-like latencies and no faults.
func New(w *sim.World) *Service {
	return &Service{w: w, fsm: meta.NewFSM(slog.New(slog.DiscardHandler)), MinLatency: 500 * time.Microsecond, MaxLatency: 5 * time.Millisecond, Timeout: 3 * time.Second}
}

// StallFor makes every call issued in the next d (and those in flight)
// complete only after d has passed: an election, or a leader's slow disk.
func (s *Service) StallFor(d time.Duration) {
	if until := s.w.Now() + d; until > s.stalledUntil {
		s.stalledUntil = until
	}
}

// EndStall ends a stall now (the liveness phase of a test).
func (s *Service) EndStall() { s.stalledUntil = 0 }

// Stalled reports whether the service is stalled now.
func (s *Service) Stalled() bool { return s.w.Now() < s.stalledUntil }

func (s *Service) reachable(p *sim.Process) bool {
	return s.Reachable == nil || s.Reachable(p.ID)
}

// when returns the true time at which a call issued now takes effect.
func (s *Service) when() time.Duration {
	t := s.w.Now() + s.w.Between(s.MinLatency, s.MaxLatency)
	if t < s.stalledUntil {
		t = s.stalledUntil + s.w.Between(s.MinLatency, s.MaxLatency)
	}
	return t
}

// CurrentVersion returns a namespace's committed version now (0 if it was
// never written), without copying it as Current does.
func (s *Service) CurrentVersion(name string) uint64 { return s.fsm.Version(name) }

// Current returns a namespace as committed now (for checkers: ground truth).
func (s *Service) Current(name string) *pb.Namespace {
	ns, _ := s.fsm.Namespace(name)
	return ns
}

// Read reads a namespace linearizably on behalf of p; done runs in p's life.
func (s *Service) Read(p *sim.Process, name string, done func(*pb.Namespace, error)) {
	if !s.reachable(p) {
		p.Go(s.Timeout, func() { done(nil, ErrTimeout) })
		return
	}
	at := s.when()
	if at-s.w.Now() > s.Timeout {
		p.Go(s.Timeout, func() { done(nil, ErrTimeout) })
		return
	}
	var ns *pb.Namespace
	s.w.At(at, func() { ns = s.Current(name) }) // the linearization point
	// The answer goes to the life that asked (scheduled now, in it).
	back := s.w.Between(s.MinLatency/2, s.MaxLatency/2) + 1
	p.Go(at-s.w.Now()+back, func() { done(ns, nil) })
}

// Propose passes a decree on behalf of p. done gets the new version, or
// meta.ErrStaleVersion, or ErrTimeout (the decree may commit later).
func (s *Service) Propose(p *sim.Process, d *pb.Decree, done func(uint64, error)) {
	if err := meta.ValidateDecree(d); err != nil {
		p.Go(0, func() { done(0, err) })
		return
	}
	if !s.reachable(p) {
		p.Go(s.Timeout, func() { done(0, ErrTimeout) })
		return
	}
	b, err := proto.Marshal(d)
	if err != nil {
		panic(err)
	}
	if s.w.Rand.Float64() < s.LoseRate {
		p.Go(s.Timeout, func() { done(0, ErrTimeout) })
		return
	}
	at := s.when()
	late := at-s.w.Now() > s.Timeout
	if late {
		s.Ambiguous++
		p.Go(s.Timeout, func() { done(0, ErrTimeout) })
	}
	var res meta.ApplyResult
	s.w.At(at, func() {
		s.index++
		res = s.fsm.Apply(&raft.Log{Index: s.index, Type: raft.LogCommand, Data: b}).(meta.ApplyResult)
		if res.Err == nil {
			s.Decrees++
			now := s.w.Now()
			i := 0
			for i < len(s.recent) && s.recent[i] <= now-time.Second {
				i++
			}
			s.recent = append(s.recent[i:], now)
			s.MaxPerSecond = max(s.MaxPerSecond, len(s.recent))
		}
	})
	if !late {
		back := s.w.Between(s.MinLatency/2, s.MaxLatency/2) + 1
		p.Go(at-s.w.Now()+back, func() { done(res.Version, res.Err) })
	}
}

// Update is meta.Client.Update: read, compute ops, propose conditional on
// the version read, and start over when the namespace moved. fn returning
// no ops ends it with nothing proposed.
func (s *Service) Update(p *sim.Process, name, origin string, fn func(*pb.Namespace) ([]*pb.Op, error), done func(uint64, error)) {
	s.Read(p, name, func(ns *pb.Namespace, err error) {
		if err != nil {
			done(0, err)
			return
		}
		ops, err := fn(ns)
		if err != nil || len(ops) == 0 {
			done(ns.Version, err)
			return
		}
		s.Propose(p, &pb.Decree{Namespace: name, ExpectedVersion: ns.Version, Ops: ops, Origin: origin}, func(v uint64, err error) {
			if errors.Is(err, meta.ErrStaleVersion) {
				s.Update(p, name, origin, fn, done)
				return
			}
			done(v, err)
		})
	})
}

// Watch delivers namespace name to fn, in p's current life, whenever a newer
// version than the last delivered one exists and p can reach the service,
// after a lag (a replica's local copy trails the leader). Versions never go
// backwards. It ends when p crashes or stop is called.
func (s *Service) Watch(p *sim.Process, name string, fn func(*pb.Namespace)) (stop func()) {
	var delivered uint64
	stopped := false
	var poll func()
	poll = func() {
		if stopped {
			return
		}
		if s.reachable(p) && !s.Stalled() && s.fsm.Version(name) > delivered {
			ns := s.Current(name)
			delivered = ns.Version
			fn(ns)
		}
		p.Go(s.w.Between(10*time.Millisecond, 50*time.Millisecond), poll)
	}
	p.Go(s.w.Between(s.MinLatency, s.MaxLatency), poll)
	return func() { stopped = true }
}
