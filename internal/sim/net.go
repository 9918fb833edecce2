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
	Deliver func(from uint64, payload []byte)
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
	Sent     int
	Dropped  int
}

// NewNetwork returns a fault-free network with LAN-like delays.
func (w *World) NewNetwork() *Network {
	return &Network{w: w, procs: map[uint64]*Process{}, MinDelay: 50 * time.Microsecond, MaxDelay: 500 * time.Microsecond, blocked: map[[2]uint64]bool{}}
}

// Attach registers a process as an endpoint.
func (n *Network) Attach(p *Process) { n.procs[p.ID] = p }

// Send sends a datagram. The payload is copied: the sender may reuse it.
func (n *Network) Send(from, to uint64, payload []byte) {
	n.Sent++
	if n.blocked[[2]uint64{from, to}] || n.w.Rand.Float64() < n.DropRate {
		n.Dropped++
		return
	}
	copies := 1
	if n.w.Rand.Float64() < n.DupRate {
		copies = 2
	}
	for i := 0; i < copies; i++ {
		b := append([]byte(nil), payload...)
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

// Heal restores every link.
func (n *Network) Heal() { n.blocked = map[[2]uint64]bool{} }
