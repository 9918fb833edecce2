// Package fdsim runs the failure detector's protocol core on the simulator:
// every node has a Subject (and an Observer if it observes), a drifting
// clock, a persisted incarnation and persisted tombstones that survive
// crashes, and anyone can query the failure-detector service. Layers above
// (the lock service, RLDevs) build their simulations on it, so that they are
// tested against the real detector rather than an idealised one.
package fdsim

import (
	"time"

	"github.com/grovestore/grove/internal/fd"
	"github.com/grovestore/grove/internal/sim"
)

// Node is one simulated node.
type Node struct {
	ID         fd.NodeID
	Proc       *sim.Process
	Clock      *sim.Clock
	DiskInc    fd.Incarnation               // persisted: survives crashes
	DiskTomb   map[fd.NodeID]fd.Incarnation // persisted observer tombstones
	Subj       *fd.Subject
	Obs        *fd.Observer
	IsObserver bool
	// Other receives every payload that is not the detector's own.
	Other func(from uint64, msg any)
}

// Cluster is a set of simulated nodes running the detector.
type Cluster struct {
	W     *sim.World
	Net   *sim.Network
	Cfg   fd.Config
	Nodes map[fd.NodeID]*Node
	// Hooks, all optional. OnStart: a new incarnation began (process start
	// or after a self-fence). OnFence: incarnation inc fenced itself.
	// OnEvent: the node handled a tick or a detector packet.
	OnStart func(n *Node)
	OnFence func(n *Node, inc fd.Incarnation)
	OnEvent func(n *Node)
	// Queries in flight, by id.
	pending map[uint64]*query
	nextQID uint64
}

type query struct {
	dead map[uint64]bool
	done bool
	cb   func(dead bool)
}

// QueryMsg and AnswerMsg are the detector's query protocol on the simulated
// network (the real system uses gRPC for it).
type QueryMsg struct {
	QID  uint64
	Node fd.NodeID
	Inc  fd.Incarnation
}

type AnswerMsg struct {
	QID  uint64
	Dead bool
}

// QueryTimeout: a query without a majority of "dead" answers by then is
// answered "alive", as the paper's client does.
const QueryTimeout = 300 * time.Millisecond

// New builds n nodes (ids 1..n), the first `observers` of them observers,
// with clocks drifting up to actualDrift. Call Start on each to run it.
func New(w *sim.World, net *sim.Network, cfg fd.Config, n int, actualDrift float64) *Cluster {
	c := &Cluster{W: w, Net: net, Cfg: cfg, Nodes: map[fd.NodeID]*Node{}, pending: map[uint64]*query{}}
	obs := map[fd.NodeID]bool{}
	for _, o := range cfg.Observers {
		obs[o] = true
	}
	for i := 1; i <= n; i++ {
		nd := &Node{ID: fd.NodeID(i), Proc: w.NewProcess(uint64(i)), Clock: w.NewClock(actualDrift), IsObserver: obs[fd.NodeID(i)]}
		c.Nodes[nd.ID] = nd
		net.Attach(nd.Proc)
	}
	return c
}

func (c *Cluster) known(n fd.NodeID) bool { return c.Nodes[n] != nil }

// Start begins a new life of n: a new incarnation, persisted before use.
func (c *Cluster) Start(n *Node) {
	now := n.Clock.Now()
	n.DiskInc++
	n.Subj = fd.NewSubject(c.Cfg, n.ID, n.DiskInc, now)
	if n.IsObserver {
		n.Obs = fd.NewObserver(n.ID, c.Cfg.GracePeriod, now, n.DiskTomb, c.known)
	}
	n.Proc.Deliver = func(from uint64, msg any) { c.deliver(n, from, msg) }
	if c.OnStart != nil {
		c.OnStart(n)
	}
	c.tick(n)
}

// Crash stops n at once (its sessions break).
func (c *Cluster) Crash(n *Node) {
	if !n.Proc.Up() {
		return
	}
	n.Proc.Crash()
	c.Net.CloseSessionsOf(uint64(n.ID))
}

// Restart brings a crashed node back with a new incarnation.
func (c *Cluster) Restart(n *Node) {
	if n.Proc.Up() {
		return
	}
	n.Proc.Restart()
	c.Start(n)
}

// Alive is ground truth for checkers: the node's process is up and its
// current incarnation believes itself alive now.
func (c *Cluster) Alive(id fd.NodeID, inc fd.Incarnation) bool {
	n := c.Nodes[id]
	return n != nil && n.Proc.Up() && n.Subj.Incarnation() == inc && n.Subj.Alive(n.Clock.Now())
}

func (c *Cluster) tick(n *Node) {
	b, send, fenced := n.Subj.Tick(n.Clock.Now())
	if fenced {
		old := n.Subj.Incarnation()
		if c.OnFence != nil {
			c.OnFence(n, old)
		}
		// The in-process restart: a new incarnation, persisted first.
		n.DiskInc++
		n.Subj = fd.NewSubject(c.Cfg, n.ID, n.DiskInc, n.Clock.Now())
		if c.OnStart != nil {
			c.OnStart(n)
		}
		b, send, _ = n.Subj.Tick(n.Clock.Now())
	}
	if send {
		buf := b.Encode(nil)
		for _, o := range c.Cfg.Observers {
			c.Net.Send(uint64(n.ID), uint64(o), buf)
		}
	}
	if c.OnEvent != nil {
		c.OnEvent(n)
	}
	n.Proc.Go(c.W.Between(5*time.Millisecond, 25*time.Millisecond), func() { c.tick(n) })
}

func (c *Cluster) deliver(n *Node, from uint64, msg any) {
	switch m := msg.(type) {
	case []byte:
		p, err := fd.Decode(m)
		if err != nil {
			panic("fdsim: undecodable detector packet: " + err.Error())
		}
		now := n.Clock.Now()
		switch p.Kind {
		case fd.KindBeacon:
			if n.Obs == nil {
				return
			}
			if e, err := n.Obs.Beacon(now, p); err == nil {
				c.Net.Send(uint64(n.ID), uint64(p.Subject), e.Encode(nil))
			}
		case fd.KindEcho:
			_ = n.Subj.Echo(now, p)
		}
		if c.OnEvent != nil {
			c.OnEvent(n)
		}
	case QueryMsg:
		if n.Obs == nil {
			return
		}
		dead, persist := n.Obs.Query(n.Clock.Now(), m.Node, m.Inc)
		if persist {
			n.DiskTomb = n.Obs.Tombstones() // durable before the answer leaves
		}
		c.Net.Send(uint64(n.ID), from, AnswerMsg{QID: m.QID, Dead: dead})
	case AnswerMsg:
		c.answer(from, m)
	default:
		if n.Other != nil {
			n.Other(from, msg)
		}
	}
}

// AttachQuerier lets a process that is not a node query the service.
func (c *Cluster) AttachQuerier(p *sim.Process) {
	c.Net.Attach(p)
	p.Deliver = func(from uint64, msg any) {
		if a, ok := msg.(AnswerMsg); ok {
			c.answer(from, a)
		}
	}
}

// Query asks the service whether (node, inc) is dead, on behalf of process
// from; cb runs once, in from's life, with the verdict.
func (c *Cluster) Query(from *sim.Process, node fd.NodeID, inc fd.Incarnation, cb func(dead bool)) {
	c.nextQID++
	qid := c.nextQID
	q := &query{dead: map[uint64]bool{}, cb: cb}
	c.pending[qid] = q
	for _, o := range c.Cfg.Observers {
		c.Net.Send(from.ID, uint64(o), QueryMsg{QID: qid, Node: node, Inc: inc})
	}
	from.Go(QueryTimeout, func() {
		if !q.done {
			q.done = true
			delete(c.pending, qid)
			q.cb(false)
		}
	})
}

func (c *Cluster) answer(from uint64, a AnswerMsg) {
	q := c.pending[a.QID]
	if q == nil || q.done {
		return
	}
	if a.Dead {
		q.dead[from] = true // count each observer once: the network duplicates
	}
	if fd.Verdict(len(q.dead), len(c.Cfg.Observers)) {
		q.done = true
		delete(c.pending, a.QID)
		q.cb(true)
	}
}
