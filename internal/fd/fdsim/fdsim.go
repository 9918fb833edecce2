// Package fdsim runs the failure detector on the simulator exactly as a node
// runs it: each node's fd.Engine (the same code the real driver runs) with a
// drifting clock, a simulated disk that is slow, fails and loses what was
// not durable at a crash, registration and membership through a simulated
// config service whose decrees are asynchronous and stall, and authenticated
// datagrams on a lossy network. Layers above (the lock service, RLDevs)
// build their simulations on it, so that they are tested against the real
// detector rather than an idealised one.
package fdsim

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"time"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/fd"
	"github.com/grovestore/grove/internal/meta"
	"github.com/grovestore/grove/internal/sim"
	"github.com/grovestore/grove/internal/sim/simmeta"
)

// Files on a node's simulated disk.
const (
	IncarnationFile = "incarnation"
	TombstoneFile   = "fd-tombstones.json"
)

// Node is one simulated node.
type Node struct {
	ID         fd.NodeID
	Proc       *sim.Process
	Clock      *sim.Clock
	Disk       *sim.Disk
	Eng        *fd.Engine // this life's engine
	IsObserver bool
	// Inc is the running incarnation (0 while the node takes a new one).
	Inc fd.Incarnation
	// Other receives every payload that is not the detector's own.
	Other   func(from uint64, msg any)
	asks    map[fd.QueryID]ask
	nextQID fd.QueryID
}

type ask struct {
	from uint64
	qid  uint64
	q    fd.Question
}

// Cluster is a set of simulated nodes running the detector.
type Cluster struct {
	W    *sim.World
	Net  *sim.Network
	Cfg  fd.Config
	Svc  *simmeta.Service
	Keys fd.Keyring
	// Ungated turns the observers' contact gate off (teeth tests).
	Ungated bool
	Nodes   map[fd.NodeID]*Node
	// Hooks, all optional. OnStart: a new incarnation is registered and
	// beaconing. OnFence: incarnation inc fenced itself (services stop).
	// OnEvent: the node handled a tick or a detector packet. OnAnswer: an
	// observer's answer is leaving (dead or not).
	OnStart  func(n *Node)
	OnFence  func(n *Node, inc fd.Incarnation)
	OnEvent  func(n *Node)
	OnAnswer func(o *Node, q fd.Question, dead bool)
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

// TestKey is the simulated cluster's key.
var TestKey = fd.Key("grove-simulated-cluster-key-0001")

// New builds n nodes (ids 1..n), those in cfg.Observers observers, with
// clocks drifting up to actualDrift, a fresh disk each, and svc as their
// config service. Call Start on each to run it.
func New(w *sim.World, net *sim.Network, svc *simmeta.Service, cfg fd.Config, n int, actualDrift float64) *Cluster {
	c := &Cluster{W: w, Net: net, Cfg: cfg, Svc: svc, Keys: fd.Keyring{Sign: TestKey}, Nodes: map[fd.NodeID]*Node{}, pending: map[uint64]*query{}}
	obs := map[fd.NodeID]bool{}
	for _, o := range cfg.Observers {
		obs[o] = true
	}
	for i := 1; i <= n; i++ {
		nd := &Node{ID: fd.NodeID(i), Proc: w.NewProcess(uint64(i)), Clock: w.NewClock(actualDrift), Disk: w.NewDisk(), IsObserver: obs[fd.NodeID(i)]}
		c.Nodes[nd.ID] = nd
		net.Attach(nd.Proc)
	}
	return c
}

// Start begins a life of n's process: it loads what its disk kept and takes
// a new incarnation through the engine's steps.
func (c *Cluster) Start(n *Node) {
	now := n.Clock.Now()
	last, tomb := loadDisk(n.Disk)
	e, err := fd.NewEngine(fd.EngineConfig{Config: c.Cfg, Self: n.ID, Observe: n.IsObserver, Keys: c.Keys, Ungated: c.Ungated}, now, last, tomb)
	if err != nil {
		panic(err)
	}
	n.Eng, n.Inc, n.asks = e, 0, map[fd.QueryID]ask{}
	n.Proc.Deliver = func(from uint64, msg any) { c.deliver(n, e, from, msg) }
	c.Svc.Watch(n.Proc, meta.NodesNamespace, func(ns *pb.Namespace) {
		regs := map[fd.NodeID]fd.Incarnation{}
		for _, r := range decodeNodes(ns) {
			regs[fd.NodeID(r.Id)] = fd.Incarnation(r.Incarnation)
		}
		e.SetRegistered(n.Clock.Now(), ns.Version, regs)
	})
	c.exec(n, e, e.Start(now))
	c.tick(n, e)
}

func loadDisk(d *sim.Disk) (fd.Incarnation, map[fd.NodeID]fd.Incarnation) {
	var last fd.Incarnation
	if b, ok := d.Read(IncarnationFile); ok {
		v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			panic("fdsim: corrupt incarnation file")
		}
		last = fd.Incarnation(v)
	}
	var tomb map[fd.NodeID]fd.Incarnation
	if b, ok := d.Read(TombstoneFile); ok {
		if err := json.Unmarshal(b, &tomb); err != nil {
			panic("fdsim: corrupt tombstone file")
		}
	}
	return last, tomb
}

// DurableTombstones returns what n's tombstone file holds on the platter.
func DurableTombstones(n *Node) map[fd.NodeID]fd.Incarnation {
	var tomb map[fd.NodeID]fd.Incarnation
	if b, ok := n.Disk.Durable(TombstoneFile); ok {
		if err := json.Unmarshal(b, &tomb); err != nil {
			panic("fdsim: corrupt tombstone file")
		}
	}
	return tomb
}

func decodeNodes(ns *pb.Namespace) []*pb.Node {
	nodes, err := meta.DecodeNodes(ns)
	if err != nil {
		panic(err)
	}
	return nodes
}

// Registered returns the incarnation of id registered in the config
// service now (ground truth, for checkers).
func (c *Cluster) Registered(id fd.NodeID) fd.Incarnation {
	r, err := meta.Registered(c.Svc.Current(meta.NodesNamespace), uint64(id))
	if err != nil {
		panic(err)
	}
	if r == nil {
		return 0
	}
	return fd.Incarnation(r.Incarnation)
}

// exec carries out an engine's effects, as the real driver does.
func (c *Cluster) exec(n *Node, e *fd.Engine, out []any) {
	for _, o := range out {
		switch x := o.(type) {
		case fd.Send:
			c.Net.Send(uint64(n.ID), uint64(x.To), x.Bytes)
		case fd.Answer:
			a, ok := n.asks[x.Query]
			if !ok {
				continue
			}
			delete(n.asks, x.Query)
			if x.Err != nil {
				continue // no answer: the querier counts it "alive"
			}
			if c.OnAnswer != nil {
				c.OnAnswer(n, a.q, x.Dead[0])
			}
			c.Net.Send(uint64(n.ID), a.from, AnswerMsg{QID: a.qid, Dead: x.Dead[0]})
		case fd.PersistTombstones:
			b, err := json.Marshal(x.Tombstones)
			if err != nil {
				panic(err)
			}
			n.Disk.Write(n.Proc, TombstoneFile, b, func(err error) {
				c.exec(n, e, e.TombstonesPersisted(n.Clock.Now(), x, err))
			})
		case fd.SelfFence:
			n.Inc = 0
			if c.OnFence != nil {
				c.OnFence(n, x.Inc)
			}
		case fd.Started:
			n.Inc = x.Inc
			if c.OnStart != nil {
				c.OnStart(n)
			}
		case fd.ReadRegistered:
			c.Svc.Read(n.Proc, meta.NodesNamespace, func(ns *pb.Namespace, err error) {
				var inc fd.Incarnation
				if err == nil {
					var r *pb.Node
					if r, err = meta.Registered(ns, uint64(n.ID)); r != nil {
						inc = fd.Incarnation(r.Incarnation)
					}
				}
				c.exec(n, e, e.RegisteredRead(n.Clock.Now(), inc, err))
			})
		case fd.PersistIncarnation:
			n.Disk.Write(n.Proc, IncarnationFile, []byte(strconv.FormatUint(uint64(x.Inc), 10)), func(err error) {
				c.exec(n, e, e.IncarnationPersisted(n.Clock.Now(), x.Inc, err))
			})
		case fd.Register:
			rec := &pb.Node{Id: uint64(n.ID), Incarnation: uint64(x.Inc), BeaconAddr: "sim:" + strconv.Itoa(int(n.ID))}
			c.Svc.Update(n.Proc, meta.NodesNamespace, "node", func(ns *pb.Namespace) ([]*pb.Op, error) {
				return meta.RegisterOps(ns, rec)
			}, func(_ uint64, err error) {
				if errors.Is(err, meta.ErrOldIncarnation) {
					err = errors.Join(fd.ErrIncarnationTaken, err)
				}
				c.exec(n, e, e.RegisterDone(n.Clock.Now(), x.Inc, err))
			})
		}
	}
}

// Crash stops n at once (its sessions break, its disk keeps only what was
// durable).
func (c *Cluster) Crash(n *Node) {
	if !n.Proc.Up() {
		return
	}
	n.Proc.Crash()
	n.Disk.Crash()
	n.Inc = 0
	c.Net.CloseSessionsOf(uint64(n.ID))
}

// Restart brings a crashed node back; it takes a new incarnation.
func (c *Cluster) Restart(n *Node) {
	if n.Proc.Up() {
		return
	}
	n.Proc.Restart()
	c.Start(n)
}

// Alive is ground truth for checkers: the node's process is up and its
// incarnation inc is the running one and believes itself alive now.
func (c *Cluster) Alive(id fd.NodeID, inc fd.Incarnation) bool {
	n := c.Nodes[id]
	return n != nil && n.Proc.Up() && n.Eng.AliveAs(n.Clock.Now(), inc)
}

func (c *Cluster) tick(n *Node, e *fd.Engine) {
	c.exec(n, e, e.Tick(n.Clock.Now()))
	if c.OnEvent != nil {
		c.OnEvent(n)
	}
	n.Proc.Go(c.W.Between(5*time.Millisecond, 25*time.Millisecond), func() { c.tick(n, e) })
}

func (c *Cluster) deliver(n *Node, e *fd.Engine, from uint64, msg any) {
	switch m := msg.(type) {
	case []byte:
		out, _ := e.Receive(n.Clock.Now(), fd.NodeID(from), m)
		c.exec(n, e, out)
		if c.OnEvent != nil {
			c.OnEvent(n)
		}
	case QueryMsg:
		n.nextQID++
		q := fd.Question{Node: m.Node, Inc: m.Inc}
		n.asks[n.nextQID] = ask{from: from, qid: m.QID, q: q}
		c.exec(n, e, e.Query(n.Clock.Now(), n.nextQID, []fd.Question{q}))
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
	var verdict bool
	bound := from.Bind(func() { cb(verdict) }) // only to the life that asked
	q := &query{dead: map[uint64]bool{}, cb: func(d bool) { verdict = d; bound() }}
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
	if fd.CombineVerdicts(len(q.dead), len(c.Cfg.Observers)) {
		q.done = true
		delete(c.pending, a.QID)
		q.cb(true)
	}
}
