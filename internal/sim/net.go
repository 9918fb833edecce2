package sim

import "time"

// Process is a simulated OS process: it can crash (losing every scheduled
// event of its life), restart, and pause (its events wait until it resumes,
// as a stopped process's timers and socket buffers do).
type Process struct {
	w           *World
	ID          uint64
	up          bool
	life        uint64 // bumps on crash: events of older lives are dropped
	pausedUntil time.Duration
	// Deliver handles a datagram for the current life; set by the owner.
	// Payloads are shared, not copied: receivers must not modify them.
	Deliver func(from uint64, payload any)
}

// NewProcess returns a process that is up.
func (w *World) NewProcess(id uint64) *Process {
	return &Process{w: w, ID: id, up: true, life: 1}
}

// Up reports whether the process is running (it may still be paused).
func (p *Process) Up() bool { return p.up }

// Paused reports whether the process is paused now.
func (p *Process) Paused() bool { return p.w.now < p.pausedUntil }

// Go runs fn after d in the process's current life. If the process crashes
// first, fn never runs; if it is paused when fn is due, fn runs at resume.
func (p *Process) Go(d time.Duration, fn func()) {
	life := p.life
	var run func()
	run = func() {
		if !p.up || p.life != life {
			return
		}
		if p.w.now < p.pausedUntil {
			p.w.At(p.pausedUntil, run)
			return
		}
		fn()
	}
	p.w.After(d, run)
}

// Bind returns fn wrapped to run only in the process's current life: a
// completion of a request made before a crash must not reach the process
// restarted after it.
func (p *Process) Bind(fn func()) func() {
	life := p.life
	return func() {
		if p.up && p.life == life {
			fn()
		}
	}
}

// Crash stops the process at once; nothing scheduled in this life runs.
func (p *Process) Crash() { p.up = false; p.life++ }

// Restart brings a crashed process back with a fresh life. The owner
// rebuilds its state from what it persisted.
func (p *Process) Restart() { p.up = true; p.pausedUntil = 0 }

// Pause freezes the process for d (a GC pause, a SIGSTOP, a VM migration).
func (p *Process) Pause(d time.Duration) {
	if until := p.w.now + d; until > p.pausedUntil {
		p.pausedUntil = until
	}
}

// Network is a datagram network between processes with configurable faults.
// Every fault is drawn from the world's seeded random source.
type Network struct {
	w        *World
	procs    map[uint64]*Process
	DropRate float64       // probability a datagram is lost
	DupRate  float64       // probability a datagram is delivered twice
	MinDelay time.Duration // delays are uniform in [MinDelay, MaxDelay]; > 0
	MaxDelay time.Duration // spread of delays reorders datagrams
	blocked  map[[2]uint64]bool
	// ResetRate is the probability that a session message resets its
	// session instead of arriving.
	ResetRate   float64
	sessions    []*Session
	nextSession uint64
	Sent        int
	Dropped     int
	// Tap, if set, sees every datagram sent (a rogue host capturing
	// traffic for replay).
	Tap func(from, to uint64, payload any)
}

// NewNetwork returns a fault-free network with LAN-like delays.
func (w *World) NewNetwork() *Network {
	return &Network{w: w, procs: map[uint64]*Process{}, MinDelay: 50 * time.Microsecond, MaxDelay: 500 * time.Microsecond, blocked: map[[2]uint64]bool{}}
}

// Attach registers a process as an endpoint.
func (n *Network) Attach(p *Process) { n.procs[p.ID] = p }

// Send sends a datagram. A []byte payload is copied, so the sender may
// reuse it; other payloads are shared and must not be modified.
func (n *Network) Send(from, to uint64, payload any) {
	n.Sent++
	if n.Tap != nil {
		n.Tap(from, to, payload)
	}
	if n.blocked[[2]uint64{from, to}] || n.w.Rand.Float64() < n.DropRate {
		n.Dropped++
		return
	}
	copies := 1
	if n.w.Rand.Float64() < n.DupRate {
		copies = 2
	}
	if b, ok := payload.([]byte); ok {
		payload = append([]byte(nil), b...)
	}
	for i := 0; i < copies; i++ {
		b := payload
		d := n.w.Between(n.MinDelay, n.MaxDelay)
		n.w.After(d, func() {
			p := n.procs[to]
			if p == nil || !p.up {
				return
			}
			// A paused receiver gets the datagram when it resumes.
			p.Go(0, func() {
				if p.Deliver != nil {
					p.Deliver(from, b)
				}
			})
		})
	}
}

// Block cuts the one-way link from→to.
func (n *Network) Block(from, to uint64) { n.blocked[[2]uint64{from, to}] = true }

// Partition splits the given processes into groups that cannot talk to each
// Blocked reports whether datagrams and sessions from a to b are cut.
func (n *Network) Blocked(a, b uint64) bool { return n.blocked[[2]uint64{a, b}] }

// other (in either direction). Processes not named keep their links.
func (n *Network) Partition(groups ...[]uint64) {
	for i, g := range groups {
		for j, h := range groups {
			if i == j {
				continue
			}
			for _, a := range g {
				for _, b := range h {
					n.Block(a, b)
				}
			}
		}
	}
}

// RandomSplit divides processes 1..n into two random sides (either may be
// empty), for Partition.
func (w *World) RandomSplit(n int) (a, b []uint64) {
	for i := 1; i <= n; i++ {
		if w.Rand.Intn(2) == 0 {
			a = append(a, uint64(i))
		} else {
			b = append(b, uint64(i))
		}
	}
	return a, b
}

// Heal restores every link.
func (n *Network) Heal() { n.blocked = map[[2]uint64]bool{} }

// Session is an ordered, reliable connection between two processes that can
// break, the model of a TCP stream (or a gRPC stream over it): messages
// arrive in the order sent, none is lost or duplicated while the session is
// open, and a break (a partition, a crash, a random reset) drops whatever is
// in flight and tells both ends once. A process may connect to itself.
type Session struct {
	n      *Network
	ID     uint64
	closed bool
	ends   [2]*End
}

// End is one side of a session.
type End struct {
	s       *Session
	i       int
	proc    uint64
	last    time.Duration // delivery time of the last message sent from here
	onRecv  func(msg any)
	onClose func()
}

// OpenSession connects process a (the dialer) to process b and returns a's
// end and b's end. Each side sets its handlers with Handle.
func (n *Network) OpenSession(a, b uint64) (*End, *End) {
	n.nextSession++
	s := &Session{n: n, ID: n.nextSession}
	s.ends = [2]*End{{s: s, i: 0, proc: a}, {s: s, i: 1, proc: b}}
	n.sessions = append(n.sessions, s)
	return s.ends[0], s.ends[1]
}

// Handle sets this end's handlers: recv for each message, closed once when
// the session breaks.
func (e *End) Handle(recv func(msg any), closed func()) { e.onRecv, e.onClose = recv, closed }

// Closed reports whether the session has broken.
func (e *End) Closed() bool { return e.s.closed }

// Close breaks the session.
func (e *End) Close() { e.s.close() }

// Send sends msg to the other end. A blocked link or a random reset breaks
// the session instead.
func (e *End) Send(msg any) {
	s := e.s
	if s.closed {
		return
	}
	peer := s.ends[1-e.i]
	n := s.n
	if n.blocked[[2]uint64{e.proc, peer.proc}] || n.w.Rand.Float64() < n.ResetRate {
		s.close()
		return
	}
	at := n.w.Now() + n.w.Between(n.MinDelay, n.MaxDelay)
	if at <= e.last {
		at = e.last + 1
	}
	e.last = at
	n.w.At(at, func() {
		p := n.procs[peer.proc]
		if s.closed || p == nil || !p.up {
			return
		}
		p.Go(0, func() {
			if !s.closed && peer.onRecv != nil {
				peer.onRecv(msg)
			}
		})
	})
}

func (s *Session) close() {
	if s.closed {
		return
	}
	s.closed = true
	for _, e := range s.ends {
		p := s.n.procs[e.proc]
		if p == nil || !p.up {
			continue
		}
		fn := e.onClose
		p.Go(s.n.w.Between(s.n.MinDelay, s.n.MaxDelay), func() {
			if fn != nil {
				fn()
			}
		})
	}
}

// CloseSessionsOf breaks every open session of a process (it crashed).
func (n *Network) CloseSessionsOf(p uint64) {
	open := n.sessions[:0]
	for _, s := range n.sessions {
		if !s.closed && (s.ends[0].proc == p || s.ends[1].proc == p) {
			s.close()
		}
		if !s.closed {
			open = append(open, s)
		}
	}
	n.sessions = open
}

// BreakBlockedSessions breaks every session whose link is now blocked, as a
// partition eventually does to TCP connections.
func (n *Network) BreakBlockedSessions() {
	for _, s := range n.sessions {
		a, b := s.ends[0].proc, s.ends[1].proc
		if !s.closed && (n.blocked[[2]uint64{a, b}] || n.blocked[[2]uint64{b, a}]) {
			s.close()
		}
	}
}
