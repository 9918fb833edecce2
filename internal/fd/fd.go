// Package fd is Boxwood's failure detector (§3.2, Figure 2): keepalive
// beacons echoed by a set of observers, a node that fences itself when a
// majority stops echoing, and a service that reports a node dead only when a
// majority of observers have not heard from it for GracePeriod.
//
// The package is a protocol core without I/O: Subject (the monitored side),
// Observer, and Engine (one node's whole detector: its subject, its observer,
// incarnation changes, the persistence of verdicts and the answers to
// queries) take packets, completions and the current local time and return
// packets and effects. The driver in driver.go does the UDP, the disk, the
// config-service calls and the timers; the simulator runs the same Engine in
// virtual time.
//
// # The invariant and why it holds
//
// If the service reports (A, i) dead at time T, then (A, i) does not consider
// itself alive at T or ever after. Proof sketch (ρ = MaxDrift, clock rates in
// [1-ρ, 1+ρ], message delays > 0):
//
//   - A dead verdict needs a majority M1 of observers each saying dead at some
//     time ≤ T. Observer o says dead only if it has not received a beacon of
//     (A, i) for GracePeriod on its own clock, i.e. for at least
//     GracePeriod/(1+ρ) of real time.
//   - (A, i) considers itself alive at T' only if a majority M2 echoed beacons
//     it sent less than SelfGrace ago on its clock, i.e. less than
//     SelfGrace/(1-ρ) of real time ago.
//   - M1 and M2 share an observer o. The beacon o echoed was received by o
//     after A sent it. SelfGrace < GracePeriod(1-ρ)/(1+ρ), so o's silence
//     window ends after A's deadline: T is past the deadline.
//   - Past its deadline an incarnation is fenced for good (Subject never
//     revives), so it stays dead after T as well.
//
// Beyond the paper, and each needed for "ever after" or for the proof's
// premises to hold against real failures:
//
//   - Verdicts are permanent and durable: an observer that answers "dead"
//     for (A, i) has first written a tombstone to disk, and never echoes
//     incarnation i again, even after a restart.
//   - Incarnations are registered in the config service before they beacon,
//     and observers echo only the registered incarnation: an older one is
//     dead (superseded), a newer one is not yet known. Every datagram is
//     authenticated with the cluster key (wire.go), so nobody without the key
//     can announce an incarnation or forge an acknowledgement.
//   - A node not acknowledged by a majority within GracePeriod of taking an
//     incarnation gives it up and takes the next one.
//
// An observer answers only while its own node is in contact with a majority
// of observers, and says "dead" only if that contact is recent compared with
// the subject's silence: an observer that is itself cut off must not leave
// permanent tombstones of healthy nodes behind (they would silently lower
// every other node's fault tolerance).
package fd

import (
	"errors"
	"fmt"
	"sort"
	"time"
)

// NodeID names a node of the cluster; 0 is never a valid id.
type NodeID uint64

// Incarnation counts a node's lives; it grows on every restart and every
// self-fence and is persisted before use. 0 is never a valid incarnation.
type Incarnation uint64

// Config holds the detector's tunables. The paper's values are the defaults.
type Config struct {
	Interval    time.Duration // ΔT: time between beacons
	GracePeriod time.Duration // an observer's silence threshold
	MaxDrift    float64       // ρ: bound on |clock rate − 1| of any node
	Observers   []NodeID      // the observers every node beacons to
}

// Defaults from Boxwood §3.2.
const (
	DefaultInterval    = 200 * time.Millisecond
	DefaultGracePeriod = time.Second
	DefaultMaxDrift    = 0.01
	// MinGraceIntervals is how many ΔT GracePeriod must span, so that a
	// single lost beacon or echo never fences a node.
	MinGraceIntervals = 3
	// MinMaxDrift is the least drift bound: a node's ClockGuard lets
	// through rate errors up to MaxDrift/2 but never fewer than ntpd's
	// 500 ppm, and the proof needs the rates within MaxDrift.
	MinMaxDrift = 2 * MinClockBound
)

// Validate rejects settings under which the invariant or liveness fails.
func (c Config) Validate() error {
	switch {
	case c.Interval <= 0:
		return errors.New("fd: Interval must be positive")
	case c.GracePeriod < MinGraceIntervals*c.Interval:
		return fmt.Errorf("fd: GracePeriod %v must be at least %d×Interval (%v)", c.GracePeriod, MinGraceIntervals, MinGraceIntervals*c.Interval)
	case c.MaxDrift < MinMaxDrift || c.MaxDrift > 0.1:
		return fmt.Errorf("fd: MaxDrift %v must be in [%v, 0.1]", c.MaxDrift, MinMaxDrift)
	case len(c.Observers) == 0:
		return errors.New("fd: no observers")
	}
	seen := map[NodeID]bool{}
	for _, o := range c.Observers {
		if o == 0 || seen[o] {
			return fmt.Errorf("fd: observer list has a zero or duplicate id %d", o)
		}
		seen[o] = true
	}
	if c.SelfGrace() < 2*c.Interval {
		return fmt.Errorf("fd: GracePeriod %v too short for drift %v", c.GracePeriod, c.MaxDrift)
	}
	return nil
}

// Quorum is the number of observers that makes a majority.
func (c Config) Quorum() int { return len(c.Observers)/2 + 1 }

// SelfGrace is how long, on its own clock, a node may go without a majority
// of acknowledgements before it must consider itself dead. It is strictly
// less than GracePeriod·(1−ρ)/(1+ρ), which is what the invariant needs.
func (c Config) SelfGrace() time.Duration {
	g := time.Duration(float64(c.GracePeriod) * (1 - c.MaxDrift) / (1 + c.MaxDrift))
	return g - time.Millisecond
}

// Phase is a Subject's view of its own incarnation.
type Phase uint8

const (
	// Joining: no majority has acknowledged this incarnation yet. The node
	// must not act under leases; nothing was granted to this incarnation.
	// A subject that stays joining for GracePeriod fences itself: observers
	// may have declared this incarnation dead before it was ever heard.
	Joining Phase = iota
	// Alive: a majority acknowledged a beacon sent less than SelfGrace ago.
	Alive
	// Fenced: the deadline passed. Terminal: the incarnation never revives,
	// even if echoes arrive later; the node must take a new incarnation.
	Fenced
)

func (p Phase) String() string {
	return [...]string{"joining", "alive", "fenced"}[p]
}

// Subject is the monitored side of the protocol, one per node incarnation.
// Not safe for concurrent use; the driver serialises calls.
type Subject struct {
	cfg  Config
	id   NodeID
	inc  Incarnation
	obs  map[NodeID]bool
	seq  uint64 // last sequence number sent
	sent []sentBeacon
	// lastAck[o] is the local send time of the newest beacon o echoed.
	lastAck    map[NodeID]time.Time
	phase      Phase
	started    time.Time // local time the incarnation began
	deadline   time.Time // valid when phase == Alive
	nextBeacon time.Time
	// connected is the local send time of the first beacon a majority
	// acknowledged: when this incarnation's contact with the observers
	// began. Valid when phase == Alive.
	connected time.Time
}

type sentBeacon struct {
	seq uint64
	at  time.Time
}

// NewSubject starts incarnation inc of node id at local time now. The caller
// must have persisted inc before calling.
func NewSubject(cfg Config, id NodeID, inc Incarnation, now time.Time) *Subject {
	if err := cfg.Validate(); err != nil {
		panic(err)
	}
	if id == 0 || inc == 0 {
		panic("fd: zero node id or incarnation")
	}
	s := &Subject{cfg: cfg, id: id, inc: inc, obs: map[NodeID]bool{}, lastAck: map[NodeID]time.Time{}, nextBeacon: now, started: now}
	for _, o := range cfg.Observers {
		s.obs[o] = true
	}
	// Keep enough sent beacons to match any echo that could still matter
	// (an echo of a beacon sent more than SelfGrace ago moves nothing), at
	// the joining rate of four per interval.
	s.sent = make([]sentBeacon, 0, 4*int(cfg.GracePeriod/cfg.Interval)+4)
	return s
}

// ID and Incarnation identify the subject.
func (s *Subject) ID() NodeID                  { return s.id }
func (s *Subject) Incarnation() Incarnation    { return s.inc }
func (s *Subject) Config() Config              { return s.cfg }
func (s *Subject) NextBeaconAt() time.Time     { return s.nextBeacon }
func (s *Subject) Deadline() (time.Time, bool) { return s.deadline, s.phase == Alive }

// Phase returns the phase at local time now, applying the deadline first.
func (s *Subject) Phase(now time.Time) Phase {
	s.expire(now)
	return s.phase
}

// Alive reports whether the node may act under its leases at local time now.
// Every lease-protected action must check this (or a fence built on it)
// against the current clock, not against a cached flag: a paused process
// that wakes up after its deadline must see itself dead at once.
func (s *Subject) Alive(now time.Time) bool { return s.Phase(now) == Alive }

// Contact returns the local send time of the newest beacon a majority of
// observers acknowledged, if the subject is alive at now: the node was in
// contact with a majority then. since is when that contact began: the
// first beacon of the incarnation a majority acknowledged. (A node cut off
// for longer than SelfGrace fences, so after a long isolation or pause
// since is the reconnection; shorter gaps in contact do not move it, so
// that a node on a bursty link is not kept from ever condemning.)
func (s *Subject) Contact(now time.Time) (contact, since time.Time, ok bool) {
	if !s.Alive(now) {
		return time.Time{}, time.Time{}, false
	}
	return s.deadline.Add(-s.cfg.SelfGrace()), s.connected, true
}

func (s *Subject) expire(now time.Time) {
	switch {
	case s.phase == Alive && !now.Before(s.deadline):
		s.phase = Fenced
	case s.phase == Joining && now.Sub(s.started) >= s.cfg.GracePeriod:
		s.phase = Fenced
	}
}

// Tick returns the beacon due at local time now, if a beacon interval has
// elapsed (send reports it; the driver sends it to every observer). fenced
// reports that the incarnation is over (whichever call noticed it first): the
// driver must fence the node's services and start a new incarnation.
func (s *Subject) Tick(now time.Time) (beacon Packet, send, fenced bool) {
	s.expire(now)
	if s.phase == Fenced {
		return Packet{}, false, true
	}
	if now.Before(s.nextBeacon) {
		return Packet{}, false, false
	}
	s.seq++
	if len(s.sent) == cap(s.sent) {
		copy(s.sent, s.sent[1:])
		s.sent = s.sent[:len(s.sent)-1]
	}
	s.sent = append(s.sent, sentBeacon{seq: s.seq, at: now})
	s.nextBeacon = now.Add(s.cfg.Interval)
	if s.phase == Joining {
		// Until a majority acknowledges it, a new incarnation beacons four
		// times as often: observers may learn of its registration only
		// after its first beacon, and it should not wait a whole interval.
		s.nextBeacon = now.Add(s.cfg.Interval / 4)
	}
	return Packet{Kind: KindBeacon, Subject: s.id, Incarnation: s.inc, Seq: s.seq}, true, false
}

// Beacon errors: reasons an echo is ignored.
var (
	ErrNotMine         = errors.New("fd: echo is for another node or incarnation")
	ErrUnknownSeq      = errors.New("fd: echo for a beacon not in the window")
	ErrUnknownObserver = errors.New("fd: echo from a node that is not an observer")
)

// Echo records an observer's echo received at local time now.
func (s *Subject) Echo(now time.Time, p Packet) error {
	s.expire(now)
	if p.Kind != KindEcho || p.Subject != s.id || p.Incarnation != s.inc {
		return ErrNotMine
	}
	if !s.obs[p.Observer] {
		return ErrUnknownObserver
	}
	var at time.Time
	found := false
	for _, b := range s.sent {
		if b.seq == p.Seq {
			at, found = b.at, true
			break
		}
	}
	if !found {
		return ErrUnknownSeq
	}
	if s.phase == Fenced {
		return nil // terminal: late echoes never revive an incarnation
	}
	if at.After(s.lastAck[p.Observer]) {
		s.lastAck[p.Observer] = at
	}
	// The deadline is the q-th newest acknowledgement plus SelfGrace.
	acks := make([]time.Time, 0, len(s.lastAck))
	for _, t := range s.lastAck {
		acks = append(acks, t)
	}
	q := s.cfg.Quorum()
	if len(acks) < q {
		return nil
	}
	sort.Slice(acks, func(i, j int) bool { return acks[i].After(acks[j]) })
	d := acks[q-1].Add(s.cfg.SelfGrace())
	if !now.Before(d) {
		return nil // a stale majority: still joining, or about to fence
	}
	if s.phase == Alive && d.Before(s.deadline) {
		panic("fd: deadline moved backwards") // invariant: lastAck only grows
	}
	if s.phase != Alive {
		s.connected = acks[q-1] // the first contact
	}
	s.phase, s.deadline = Alive, d
	return nil
}

// member is what an observer knows of one registered node.
type member struct {
	inc     Incarnation // the incarnation registered in the config service
	learned time.Time   // local time this observer learned of inc
	// history holds the last registrations learned (incarnation and
	// when), inc's included: an older incarnation i stopped being echoed
	// when the first registration newer than i was learned.
	history   []learnedReg
	heard     bool      // a beacon of inc has been received
	lastHeard time.Time // local receipt time of the newest beacon of inc
	maxSeq    uint64    // newest beacon sequence number heard from inc
}

type learnedReg struct {
	inc Incarnation
	at  time.Time
}

// maxHistory bounds member.history; for an incarnation older than every
// entry, the oldest entry's time is used (later than the truth: safe).
const maxHistory = 8

// stoppedEchoing is when this observer stopped echoing incarnation i (older
// than the registered one).
func (m *member) stoppedEchoing(i Incarnation) time.Time {
	for _, h := range m.history {
		if h.inc > i {
			return h.at
		}
	}
	return m.learned
}

// Verdict is one observer's answer about one node incarnation.
type Verdict uint8

const (
	// VerdictAlive: not dead as far as this observer knows.
	VerdictAlive Verdict = iota
	// VerdictDead: dead, durably (a tombstone on disk, or a newer
	// incarnation registered in the config service).
	VerdictDead
	// VerdictCondemned: dead once the new tombstone is durable. The
	// observer already refuses the incarnation's beacons; the answer must
	// not leave until the tombstone is on disk.
	VerdictCondemned
	// VerdictAbstain: the observer cannot tell, because its own contact
	// with a majority of observers is not recent enough compared with the
	// subject's silence (it may be the one cut off). Counts as "alive".
	VerdictAbstain
)

func (v Verdict) String() string {
	return [...]string{"alive", "dead", "condemned", "abstain"}[v]
}

// Observer is the observing side: it echoes beacons and answers queries.
// Not safe for concurrent use.
//
// Its verdicts are permanent: once it has decided (n, i) is dead it refuses
// every beacon of n's incarnation i or older. Without that, an incarnation
// still joining (never acknowledged) could be reported dead during a pause and
// become alive afterwards, and a lock master that freed its leases on that
// verdict would be wrong. The decision is first volatile (condemned); the
// caller persists Tombstones() and calls Durable before any "dead" answer
// leaves (the durability contract of Query), so a restarted observer keeps
// refusing every incarnation it ever reported dead.
//
// It knows the cluster's nodes and their registered incarnations from the
// config service (SetRegistered) and echoes only those: a beacon of an older
// incarnation is from a dead life, one of a newer incarnation from a node
// whose registration it has not seen yet (or from a forger).
type Observer struct {
	id        NodeID
	grace     time.Duration
	start     time.Time // local time the observer started: it knows nothing before
	members   map[NodeID]*member
	durable   map[NodeID]Incarnation // tombstones on disk
	condemned map[NodeID]Incarnation // decided dead, maybe not yet on disk
	version   uint64                 // grows with every condemnation
	// fresh: the observer lost its tombstones (a replaced member); it
	// refuses incarnations already registered when it first learned the
	// membership (preexisting), whose verdicts it cannot know.
	fresh       bool
	preexisting map[NodeID]Incarnation
}

// NewObserver starts an observer at local time now with the tombstones it
// persisted in earlier lives (nil for none). It echoes nothing until
// SetRegistered tells it the cluster's nodes.
func NewObserver(id NodeID, grace time.Duration, now time.Time, tombstones map[NodeID]Incarnation) *Observer {
	o := &Observer{id: id, grace: grace, start: now, members: map[NodeID]*member{},
		durable: map[NodeID]Incarnation{}, condemned: map[NodeID]Incarnation{}}
	for n, i := range tombstones {
		o.durable[n], o.condemned[n] = i, i
	}
	return o
}

// SetRegistered updates, at local time now, the registered incarnation of
// every node of the cluster (the config service's membership). A node's
// registered incarnation never goes backwards; a node missing from regs is
// no longer a member.
func (o *Observer) SetRegistered(now time.Time, regs map[NodeID]Incarnation) {
	if o.fresh && o.preexisting == nil {
		o.preexisting = map[NodeID]Incarnation{}
		for n, inc := range regs {
			o.preexisting[n] = inc
		}
	}
	for n := range o.members {
		if _, ok := regs[n]; !ok {
			delete(o.members, n)
		}
	}
	for n, inc := range regs {
		if n == 0 || inc == 0 {
			continue
		}
		if m := o.members[n]; m == nil || inc > m.inc {
			nm := &member{inc: inc, learned: now}
			if m != nil {
				nm.history = append(nm.history, m.history...)
			}
			nm.history = append(nm.history, learnedReg{inc, now})
			if len(nm.history) > maxHistory {
				nm.history = nm.history[len(nm.history)-maxHistory:]
			}
			o.members[n] = nm
		}
	}
}

// Registered returns the incarnation of node n this observer knows as
// registered (0 if none).
func (o *Observer) Registered(n NodeID) Incarnation {
	if m := o.members[n]; m != nil {
		return m.inc
	}
	return 0
}

// Observer errors: reasons a beacon is not echoed.
var (
	ErrNotBeacon      = errors.New("fd: observer got a packet that is not a beacon")
	ErrUnknownNode    = errors.New("fd: beacon from a node that is not a registered member")
	ErrOldIncarnation = errors.New("fd: beacon from an incarnation older than the registered one")
	ErrUnregistered   = errors.New("fd: beacon from an incarnation not (yet) registered")
	ErrDeclaredDead   = errors.New("fd: beacon from an incarnation this observer declared dead")
	ErrStaleSeq       = errors.New("fd: beacon not newer than one already heard (duplicate, reordered or replayed)")
	ErrPreexisting    = errors.New("fd: beacon from an incarnation registered before this (replaced) observer started; it lost the verdicts that might name it")
)

func (o *Observer) tombstone(n NodeID) Incarnation {
	return max(o.durable[n], o.condemned[n])
}

// Beacon handles a beacon received at local time now and returns the echo.
func (o *Observer) Beacon(now time.Time, p Packet) (Packet, error) {
	if p.Kind != KindBeacon {
		return Packet{}, ErrNotBeacon
	}
	m := o.members[p.Subject]
	switch {
	case m == nil:
		return Packet{}, fmt.Errorf("%w: %d", ErrUnknownNode, p.Subject)
	case p.Incarnation <= o.tombstone(p.Subject):
		return Packet{}, fmt.Errorf("%w: node %d incarnation %d", ErrDeclaredDead, p.Subject, p.Incarnation)
	case p.Incarnation < m.inc:
		return Packet{}, fmt.Errorf("%w: node %d incarnation %d < %d", ErrOldIncarnation, p.Subject, p.Incarnation, m.inc)
	case p.Incarnation > m.inc:
		return Packet{}, fmt.Errorf("%w: node %d incarnation %d > %d", ErrUnregistered, p.Subject, p.Incarnation, m.inc)
	case p.Incarnation <= o.preexisting[p.Subject]:
		return Packet{}, fmt.Errorf("%w: node %d incarnation %d", ErrPreexisting, p.Subject, p.Incarnation)
	case m.heard && p.Seq <= m.maxSeq:
		return Packet{}, ErrStaleSeq
	}
	m.heard, m.maxSeq = true, p.Seq
	if now.After(m.lastHeard) {
		m.lastHeard = now
	}
	return Packet{Kind: KindEcho, Subject: p.Subject, Incarnation: p.Incarnation, Seq: p.Seq, Observer: o.id}, nil
}

// Query is this observer's answer, at local time now, to "is incarnation inc
// of node n dead?". contact is the local send time of the newest beacon of
// the observer's own node that a majority of observers acknowledged; the
// caller must not ask at all while its node is not alive.
//
// Dead if a tombstone covers it or a newer incarnation has been registered
// for GracePeriod; condemned if the observer has heard nothing of it for GracePeriod (measured
// from the latest of: the observer's start, when it learned of the
// registration, the last beacon) and its own contact with a majority came at
// least GracePeriod/2 after it last heard from the node; abstain if only the
// second condition fails.
//
// Durability contract: on VerdictCondemned, the caller must persist
// Tombstones() and call Durable with it before any "dead" answer leaves.
func (o *Observer) Query(now, contact time.Time, n NodeID, inc Incarnation) Verdict {
	return o.QueryConnected(now, contact, time.Time{}, n, inc)
}

// QueryConnected is Query with since, when the observer's node's contact
// with a majority began (Subject.Contact): a node's silence counts against
// it only from since. An observer whose own node was
// cut off with the suspect, and has just regained contact (a healed
// partition, a resumed pause), has not yet had time to hear the suspect's
// next beacon; without since it would condemn every node it is asked about
// in that instant, and each such verdict, though not a majority's, is
// permanent: the node is heard by one observer fewer for the rest of its
// incarnation.
func (o *Observer) QueryConnected(now, contact, since time.Time, n NodeID, inc Incarnation) Verdict {
	if inc <= o.durable[n] {
		return VerdictDead
	}
	if inc <= o.condemned[n] {
		return VerdictCondemned
	}
	m := o.members[n]
	switch {
	case m == nil || inc > m.inc:
		return VerdictAlive // not registered as far as this observer knows
	case inc < m.inc:
		// Superseded: the config service has a newer incarnation, so this
		// life is over; but say so only once this observer cannot have
		// echoed it for GracePeriod (it stopped when it learned of the first
		// newer one; later registrations do not move that). Were a second process running the node id elsewhere, the
		// old one still alive, the invariant would otherwise break.
		if now.Sub(m.stoppedEchoing(inc)) > o.grace {
			return VerdictDead
		}
		return VerdictAlive
	}
	last := o.start
	if m.learned.After(last) {
		last = m.learned
	}
	if m.heard && m.lastHeard.After(last) {
		last = m.lastHeard
	}
	if now.Sub(last) <= o.grace {
		return VerdictAlive
	}
	if contact.Sub(last) < o.grace/2 || contact.Sub(since) < o.grace/2 {
		return VerdictAbstain
	}
	o.condemned[n] = inc
	o.version++
	return VerdictCondemned
}

// Heard reports whether the observer has heard a beacon of incarnation inc
// of node n within GracePeriod: it acknowledges that incarnation.
func (o *Observer) Heard(now time.Time, n NodeID, inc Incarnation) bool {
	m := o.members[n]
	return m != nil && m.inc == inc && m.heard && inc > o.tombstone(n) && now.Sub(m.lastHeard) <= o.grace
}

// Tombstones returns every verdict, durable or not, for persisting, and the
// version it covers (for Durable).
func (o *Observer) Tombstones() (map[NodeID]Incarnation, uint64) {
	t := make(map[NodeID]Incarnation, len(o.condemned))
	for n, i := range o.condemned {
		t[n] = i
	}
	return t, o.version
}

// Durable records that tombstones t (from Tombstones) are on disk.
func (o *Observer) Durable(t map[NodeID]Incarnation) {
	for n, i := range t {
		if i > o.durable[n] {
			o.durable[n] = i
		}
	}
}

// Version counts condemnations.
func (o *Observer) Version() uint64 { return o.version }

// View is an observer's opinion of one node's registered incarnation.
type View struct {
	Node        NodeID
	Incarnation Incarnation
	Heard       bool
	Silence     time.Duration // time since the last beacon (or since learning of it)
}

// Views lists the observer's view of every registered node.
func (o *Observer) Views(now time.Time) []View {
	out := make([]View, 0, len(o.members))
	for n, m := range o.members {
		last := m.learned
		if m.heard {
			last = m.lastHeard
		}
		out = append(out, View{Node: n, Incarnation: m.inc, Heard: m.heard, Silence: now.Sub(last)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	return out
}

// Verdict combines observers' answers as the paper's querying client does:
// dead only if a majority of all observers (not of those that answered) said
// dead. Missing answers count as "alive".
func CombineVerdicts(deadAnswers, observers int) bool {
	return deadAnswers >= observers/2+1
}
