package ddstable

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// Outcome is what a coordinator reports for an operation.
type Outcome uint8

const (
	Pending   Outcome = iota
	Succeeded         // applied at every member; every later read sees it
	Failed            // applied nowhere, and never will be (Result.Reason says why)
	Unknown           // the deadline passed first: it may or may not take effect
)

func (o Outcome) String() string {
	return [...]string{"pending", "succeeded", "failed", "unknown"}[o]
}

// Result reports one operation to the library's caller.
type Result struct {
	Op      OpID
	Outcome Outcome
	Reason  Reason // for Failed
	Stamp   Stamp  // the newer maps a brick holds, for ReasonRepair
}

// Send is a message the coordinator wants delivered to a brick; the
// answer comes back through OnVote or OnAck.
type Send struct {
	To      BrickID
	Prepare *Prepare
	Decide  *Decide
}

// CoordEffects are what a coordinator call asks of its runtime.
type CoordEffects struct {
	Sends   []Send
	Results []Result
}

// CoordinatorConfig tunes a Coordinator.
type CoordinatorConfig struct {
	Session uint64 // random, drawn when the library starts
	// RetryEvery: a prepare or decision not answered is sent again.
	RetryEvery time.Duration
	// VoteTimeout: an operation missing votes this long is aborted.
	VoteTimeout time.Duration
	// Deadline: an operation not finished this long is reported Unknown
	// (Succeeded if its decision is commit: that is final). It is still
	// driven to the end afterwards, for its session's Done mark.
	Deadline time.Duration
	// MaxOps bounds the operations being driven.
	MaxOps int
}

// DefaultCoordinatorConfig has the defaults for session.
func DefaultCoordinatorConfig(session uint64) CoordinatorConfig {
	return CoordinatorConfig{Session: session, RetryEvery: 200 * time.Millisecond,
		VoteTimeout: time.Second, Deadline: 20 * time.Second, MaxOps: 4096}
}

// ErrTooManyOps is Begin's answer when MaxOps operations are in flight.
var ErrTooManyOps = errors.New("ddstable: too many operations in flight at this library")

// Coordinator is the DDS library's side of two-phase commit (DDS §4.1):
// it prepares an update at every member of the key's replica group,
// decides commit when every member voted yes and abort on any no (or when
// votes are missing after VoteTimeout), and delivers the decision.
//
// What it reports, and why that is safe against the participants' rules
// (participant.go): it decides commit only once every member the prepare
// named voted yes; Succeeded once every member still in the group
// acknowledged the commit (or, at the deadline, once commit is decided: no
// termination can then conclude abort); Failed only once every member acknowledged the abort —
// a member resolving with its peers refuses an abort and may yet commit,
// and then the coordinator learns Committed from it and follows; Unknown
// otherwise. A member removed from the group by decree is not waited for.
//
// Not safe for concurrent use; the library's runtime serializes calls.
type Coordinator struct {
	cfg   CoordinatorConfig
	maps  *Maps
	stamp Stamp // of maps (encoding them per operation costs too much)
	next  uint64
	ops   map[uint64]*cop // by Seq: the operations not finished
}

type cop struct {
	id       OpID
	update   Update
	digest   uint32
	part     Partition
	gen      uint64 // the table's generation
	group    []BrickID
	stamp    Stamp
	start    time.Time
	votes    map[BrickID]Vote
	decision State // Absent until decided, then Committed or Aborted
	reason   Reason
	repair   Stamp
	acks     map[BrickID]State
	later    map[BrickID]bool // members that cannot acknowledge its abort (Ack.Later)
	sent     map[BrickID]time.Time
	reported bool
}

// NewCoordinator is a coordinator with maps m.
func NewCoordinator(cfg CoordinatorConfig, m *Maps) (*Coordinator, error) {
	if cfg.RetryEvery <= 0 || cfg.VoteTimeout <= 0 || cfg.Deadline < cfg.VoteTimeout || cfg.MaxOps < 1 {
		return nil, fmt.Errorf("ddstable: coordinator config %+v: need positive retry and vote timeout, deadline ≥ vote timeout, MaxOps ≥ 1", cfg)
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return &Coordinator{cfg: cfg, maps: m.Clone(), stamp: m.Stamp(), next: 1, ops: map[uint64]*cop{}}, nil
}

// Maps are the coordinator's maps.
func (c *Coordinator) Maps() *Maps { return c.maps }

// Stamp is the stamp of Maps, computed once per change of the maps.
func (c *Coordinator) Stamp() Stamp { return c.stamp }

// Done is the session's mark: every operation below it is finished.
func (c *Coordinator) Done() uint64 {
	d := c.next
	for seq := range c.ops {
		d = min(d, seq)
	}
	return d
}

// InFlight is the number of operations being driven.
func (c *Coordinator) InFlight() int { return len(c.ops) }

// Begin starts a put or remove.
func (c *Coordinator) Begin(now time.Time, u Update) (OpID, CoordEffects, error) {
	if len(c.ops) >= c.cfg.MaxOps {
		return OpID{}, CoordEffects{}, ErrTooManyOps
	}
	part, group := c.maps.Group(u.Key)
	o := &cop{
		id: OpID{Session: c.cfg.Session, Seq: c.next}, update: u, digest: u.Digest(), part: part, gen: c.maps.Gen, group: slices.Clone(group),
		stamp: c.stamp, start: now, votes: map[BrickID]Vote{}, acks: map[BrickID]State{}, sent: map[BrickID]time.Time{},
	}
	c.next++
	c.ops[o.id.Seq] = o
	var e CoordEffects
	for _, b := range o.group {
		e.Sends = append(e.Sends, c.prepare(now, o, b))
	}
	return o.id, e, nil
}

func (c *Coordinator) prepare(now time.Time, o *cop, b BrickID) Send {
	o.sent[b] = now
	return Send{To: b, Prepare: &Prepare{Op: o.id, Partition: o.part, Stamp: o.stamp, Group: o.group, Update: o.update, Done: c.Done()}}
}

func (c *Coordinator) decide(now time.Time, o *cop, b BrickID) Send {
	o.sent[b] = now
	return Send{To: b, Decide: &Decide{Op: o.id, Partition: o.part, Epoch: o.stamp.Epoch, Digest: o.digest, Commit: o.decision == Committed, Done: c.Done()}}
}

// members are o's group members still in the group by the coordinator's
// maps; none if the partition was split or merged away (its participants
// are gone, and whatever the operation did with them).
func (c *Coordinator) members(o *cop) []BrickID {
	cur, ok := c.maps.RG[o.part]
	if !ok || c.maps.Gen != o.gen {
		return nil
	}
	var out []BrickID
	for _, b := range o.group {
		if slices.Contains(cur, b) {
			out = append(out, b)
		}
	}
	return out
}

// SetMaps installs newer maps: a later epoch, or another generation of
// the table (dropped and created again), whose operations in flight then
// end Unknown (their partitions are gone with the old table).
func (c *Coordinator) SetMaps(now time.Time, m *Maps) CoordEffects {
	if m.Gen == c.maps.Gen && m.Epoch <= c.maps.Epoch {
		return CoordEffects{}
	}
	c.maps, c.stamp = m.Clone(), m.Stamp()
	var e CoordEffects
	for _, o := range c.ops {
		c.step(now, o, &e)
	}
	return e
}

// OnVote takes a brick's vote.
func (c *Coordinator) OnVote(now time.Time, from BrickID, op OpID, v Vote) CoordEffects {
	o, ok := c.ops[op.Seq]
	if !ok || op.Session != c.cfg.Session || !slices.Contains(o.group, from) {
		return CoordEffects{}
	}
	if _, dup := o.votes[from]; dup {
		return CoordEffects{}
	}
	o.votes[from] = v
	if !v.Yes && o.decision == Absent {
		o.decision, o.reason, o.repair = Aborted, v.Reason, v.Stamp
		if v.Reason.recorded() {
			// A recorded no is the brick's abort (rule 1).
			o.acks[from] = Aborted
		}
		var e CoordEffects
		for _, b := range o.group {
			if _, acked := o.acks[b]; !acked {
				e.Sends = append(e.Sends, c.decide(now, o, b))
			}
		}
		c.step(now, o, &e)
		return e
	}
	var e CoordEffects
	c.step(now, o, &e)
	return e
}

// OnAck takes a brick's answer to a decision.
func (c *Coordinator) OnAck(now time.Time, from BrickID, op OpID, a Ack) CoordEffects {
	o, ok := c.ops[op.Seq]
	if !ok || op.Session != c.cfg.Session || o.decision == Absent || !slices.Contains(o.group, from) {
		return CoordEffects{}
	}
	var e CoordEffects
	switch a.State {
	case Committed:
		if o.decision == Aborted {
			// The members resolved it without us, and decreed commit: follow.
			o.decision = Committed
			clear(o.acks)
			for _, b := range o.group {
				if b != from {
					e.Sends = append(e.Sends, c.decide(now, o, b))
				}
			}
		}
		o.acks[from] = Committed
	case Aborted:
		if o.decision == Aborted {
			o.acks[from] = Aborted
		}
		// An abort answered to a commit breaks the rules; the simulator's
		// oracle reports what follows from it. Not acknowledged.
	case Absent:
		if a.Later && o.decision == Aborted {
			if o.later == nil {
				o.later = map[BrickID]bool{}
			}
			o.later[from] = true
		}
		if o.decision == Committed {
			// Every member voted yes and commit is final, so a member with
			// no record committed and swept it (a library stalled longer
			// than RecordLife; review 120, finding 5).
			o.acks[from] = Committed
		}
		// For an abort, no record may mean a brick too full to keep one:
		// asked again at the next retry.
	case Prepared:
		// Refused while the member resolves: asked again at the next retry.
	}
	c.step(now, o, &e)
	return e
}

// step decides and finishes o where its votes and acknowledgements allow.
func (c *Coordinator) step(now time.Time, o *cop, e *CoordEffects) {
	mem := c.members(o)
	if len(mem) == 0 {
		// Every member of its group was removed, or its partition retired:
		// whatever it did went with them, or was copied on before that.
		delete(c.ops, o.id.Seq)
		if !o.reported {
			o.reported = true
			out := Unknown
			if o.decision == Committed && c.maps.Gen == o.gen && reshapedFrom(c.maps.DP.Lookup(o.update.Key), o.part) {
				// A split or merge retires a partition only once every
				// member decided every operation, and commit is final
				// (every member voted yes): it committed everywhere, and
				// the new partition holds it (outside review 123).
				out = Succeeded
			}
			e.Results = append(e.Results, Result{Op: o.id, Outcome: out})
		}
		return
	}
	if o.decision == Absent {
		// Commit needs the yes of every member the prepare named, not only
		// of those still members: a member removed since may have said no
		// for good (rule 1), and a peer may have had abort decreed on that
		// answer before the removal (outside review 120, finding 1). An
		// operation that lost a member before it voted aborts at
		// VoteTimeout and is tried again with the new maps.
		for _, b := range o.group {
			if v, ok := o.votes[b]; !ok || !v.Yes {
				return
			}
		}
		o.decision = Committed
		for _, b := range o.group {
			e.Sends = append(e.Sends, c.decide(now, o, b))
		}
	}
	later := false
	for _, b := range mem {
		if o.acks[b] == o.decision {
			continue
		}
		if o.decision == Aborted && o.later[b] {
			later = true // it never will (review 124): finished, unknown
			continue
		}
		return
	}
	delete(c.ops, o.id.Seq)
	if !o.reported {
		o.reported = true
		r := Result{Op: o.id, Outcome: Succeeded}
		if o.decision == Aborted {
			r = Result{Op: o.id, Outcome: Failed, Reason: o.reason, Stamp: o.repair}
		}
		if later {
			r = Result{Op: o.id, Outcome: Unknown}
		}
		e.Results = append(e.Results, r)
	}
}

// Drop ends every operation in flight as Unknown: the table was dropped.
func (c *Coordinator) Drop() CoordEffects {
	var e CoordEffects
	for seq, o := range c.ops {
		if !o.reported {
			e.Results = append(e.Results, Result{Op: o.id, Outcome: Unknown})
		}
		delete(c.ops, seq)
	}
	return e
}

// Tick repeats unanswered messages, aborts operations missing votes, and
// reports operations past their deadline.
func (c *Coordinator) Tick(now time.Time) CoordEffects {
	var e CoordEffects
	for _, o := range c.ops {
		age := now.Sub(o.start)
		if o.decision == Absent && age >= c.cfg.VoteTimeout {
			o.decision, o.reason = Aborted, ReasonNone
			for _, b := range o.group {
				e.Sends = append(e.Sends, c.decide(now, o, b))
			}
			continue
		}
		for _, b := range c.members(o) {
			if now.Sub(o.sent[b]) < c.cfg.RetryEvery {
				continue
			}
			switch {
			case o.decision == Absent:
				if _, ok := o.votes[b]; !ok {
					e.Sends = append(e.Sends, c.prepare(now, o, b))
				}
			case o.acks[b] != o.decision:
				e.Sends = append(e.Sends, c.decide(now, o, b))
			}
		}
		if !o.reported && age >= c.cfg.Deadline {
			o.reported = true
			out := Unknown
			if o.decision == Committed && len(c.members(o)) > 0 {
				out = Succeeded // final: every member voted yes
			}
			e.Results = append(e.Results, Result{Op: o.id, Outcome: out})
		}
	}
	return e
}

// reshapedFrom says whether partition now descends from, or contains,
// partition was: the key's partition changed by splits or merges (not by
// a restore, which keeps the name).
func reshapedFrom(now, was Partition) bool {
	if now == was {
		return false
	}
	if now.Depth > was.Depth {
		return was.Contains(now.Bits)
	}
	return now.Contains(was.Bits)
}
