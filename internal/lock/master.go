package lock

import (
	"fmt"
	"sort"
	"strings"
)

// Bounds on recovery messages and records: a recovery record is one
// config-service value (64 KiB, meta.MaxValueLen); a Recover message carries
// its exclusions within a clerk's receive limit.
const (
	MaxRecordBytes  = 60 << 10
	MaxRecoverNames = 16384
	MaxRecoverBytes = 16 << 20
)

// RevokePatience is how many master ticks a revocation may go unanswered
// before the master asks the failure detector about the clerk.
const RevokePatience = 4

// ClerkInfo is a clerk as the config service's clerk list records it.
type ClerkInfo struct {
	ID   ClerkID
	Kind string
	// Scope is the name prefixes the clerk may lock (nil: any name). A
	// clerk's kind declares it, so that an "all" recovery of a dead clerk
	// (its leases unknown) blocks only the names it could have held, not
	// every grant: a B-tree server's replay needs the chunk managers'
	// leases granted meanwhile.
	Scope []string
}

// InScope reports whether a clerk of scope may lock name.
func InScope(scope []string, name string) bool {
	if len(scope) == 0 {
		return true
	}
	for _, p := range scope {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// RecoveryRecord is a recovery obligation, recorded in the config service
// so that a new master keeps the dead clerk's leases held.
type RecoveryRecord struct {
	Dead ClerkID
	Kind string
	Held map[string]Mode // the dead clerk's leases
	All  bool            // they are unknown: nothing in Scope may be granted until it is done
	// Scope is the dead clerk's (nil: any name).
	Scope []string
	// Started: a run may have been sent (recorded before the first one),
	// so its writes may land until a run succeeds; a new master takes the
	// recovery for one that may still have writes landing
	// (Master.overlapping).
	Started bool
}

// Names lists the record's lock names in order.
func (r RecoveryRecord) Names() []string { return sortedKeys(r.Held) }

// Master outputs.

// Send delivers Msg to a clerk over its current session.
type Send struct {
	To  ClerkID
	Msg any
}

// Drop closes a clerk's session (it was declared dead or rejected).
type Drop struct{ Clerk ClerkID }

// Persist records a recovery obligation in the config service.
type Persist struct{ Record RecoveryRecord }

// Forget removes a dead clerk whose leases are resolved: its clerk record
// and its recovery record go in one decree. The leases stay held until the
// runtime reports the decree committed (Master.Forgotten): otherwise a new
// master, finding the records, would run the recovery again while the next
// holder uses the lease.
type Forget struct{ Clerk ClerkID }

// Anomaly reports a state the protocol should make impossible; the runtime
// logs it loudly. The master has already refused to act on it.
type Anomaly struct{ Text string }

// Master is the lock master's state machine for one epoch. Not safe for
// concurrent use. It acts only while its node is alive: the driver stops it
// when the node fences itself, which the failure detector guarantees happens
// before any standby can take over.
type Master struct {
	epoch  Epoch
	clerks map[ClerkID]*clerkState
	locks  map[string]*lockState
	recov  map[ClerkID]*recovery
	// deadBelow[n] is the newest incarnation of node n a verdict declared
	// dead: every clerk of it or an older one is dead.
	deadBelow map[uint64]uint64
	// serving is false after a takeover until every clerk in the list has
	// reported its leases or been declared dead.
	serving  bool
	tokenSeq uint64 // grants and recovery runs of this epoch so far
	out      []any
	// others records runs reported in clerks' Hellos that this master
	// did not assign (dead clerk → clerk → run token): a run that an older
	// master started. No other run of that recovery starts until they end.
	others map[ClerkID]map[ClerkID]Token
	// unsafeFreeBeforeForget restores the order of the defect found in
	// review (free the leases when recovery reports, before the records
	// are gone), for the simulator's teeth test only.
	unsafeFreeBeforeForget bool
	// unsafeReassignOnDisconnect gives a recovery to another clerk as soon
	// as the assignee's session breaks (while its run may go on), for the
	// simulator's teeth test only.
	unsafeReassignOnDisconnect bool
	// unsafeOverlappingRuns lets recoveries whose names may overlap (an
	// "all" one and any other of its kind) run at once, for the
	// simulator's teeth test only.
	unsafeOverlappingRuns bool
	// unsafeIgnoreUnsettled lets a recovery run while an overlapping one
	// whose run ended without success may still have writes landing, for
	// the simulator's teeth test only.
	unsafeIgnoreUnsettled bool
}

type clerkState struct {
	info      ClerkInfo
	leaving   bool // said Goodbye: dead for the master, record being removed
	connected bool // has a session in this epoch
	reported  bool // has said Hello in this epoch: held is authoritative
	dead      bool
	held      map[string]Mode
	token     map[string]Token // token of the newest grant per lock
	revoking  map[string]Mode  // revocations sent and not yet answered
	since     int              // master ticks since a revocation went out
}

type lockState struct {
	holders map[ClerkID]Mode
	queue   []waiter
}

type waiter struct {
	clerk ClerkID
	mode  Mode
}

// recovery is one dead clerk's pending obligation. Invariant: while it
// exists, the dead clerk's leases are held (nothing conflicting is granted).
type recovery struct {
	rec RecoveryRecord
	// assigned is the clerk running (or asked to run) the recovery, with
	// the run's token; nil while nobody runs it. A clerk keeps its
	// assignment across a broken session: its run may still be going, and
	// only its report (RecoveryDone, or a Hello without it) ends it.
	assigned *ClerkID
	token    Token
	// forgetting: recovery succeeded and the Forget decree is in flight.
	forgetting bool
	// persisted: the record is in the config service (its Persist decree
	// committed, or it was read from there). No run starts before: a
	// master that dies with the record in flight leaves nothing a new
	// master would not know of, so no run of it can go on unseen.
	persisted bool
	// failed is the clerk whose run failed last; the next run goes to
	// another clerk of the kind if there is one, and not before the next
	// tick (no spinning on a clerk that always fails).
	failed *ClerkID
	wait   bool
	// reported: an anomaly about it was emitted (once is enough).
	reported bool
	// starting: the record's Started mark is being persisted; no run of it
	// is sent before, and overlapping ones wait as if it ran.
	starting bool
}

// NewMaster starts epoch e with the clerk list and the recovery records read
// from the config service in the decree that made it master.
func NewMaster(e Epoch, clerks []ClerkInfo, records []RecoveryRecord) *Master {
	m := &Master{epoch: e, clerks: map[ClerkID]*clerkState{}, locks: map[string]*lockState{}, recov: map[ClerkID]*recovery{},
		deadBelow: map[uint64]uint64{}, others: map[ClerkID]map[ClerkID]Token{}}
	for _, c := range clerks {
		m.clerks[c.ID] = newClerkState(c)
	}
	for _, r := range records {
		// A Started record's run (an older master's) may have ended
		// without success, and nothing else tells this master (a Hello
		// lists only runs still going; a runner declared dead before its
		// Hello lists none): its Started mark makes it go first (overlapping).
		m.recov[r.Dead] = &recovery{rec: r, persisted: true}
		c := m.clerks[r.Dead]
		if c == nil {
			// The record outlived the clerk record (written by an older
			// version in two decrees): the leases are still pending.
			c = newClerkState(ClerkInfo{ID: r.Dead, Kind: r.Kind, Scope: r.Scope})
			m.clerks[r.Dead] = c
		}
		c.dead = true
		for n, mode := range r.Held {
			c.held[n] = mode
			m.lock(n).holders[r.Dead] = mode
		}
	}
	m.checkServing()
	return m
}

// Epoch is the master's epoch.
func (m *Master) Epoch() Epoch { return m.epoch }

// Serving reports whether the master grants every name (lease state
// rebuilt, no recovery of unknown leases pending; one that is pending blocks
// the names in its dead clerk's scope only).
func (m *Master) Serving() bool { return m.serving && !m.blockedAll() }

func (m *Master) lock(name string) *lockState {
	l := m.locks[name]
	if l == nil {
		l = &lockState{holders: map[ClerkID]Mode{}}
		m.locks[name] = l
	}
	return l
}

// gc drops the entry of a lock nobody holds or wants (memory stays bounded
// by what is in use).
func (m *Master) gc(name string) {
	if l := m.locks[name]; l != nil && len(l.holders) == 0 && len(l.queue) == 0 {
		delete(m.locks, name)
	}
}

func (m *Master) emit(o any) { m.out = append(m.out, o) }

func (m *Master) flush() []any {
	o := m.out
	m.out = nil
	return o
}

func (m *Master) nextToken() Token {
	m.tokenSeq++
	return Token{Epoch: m.epoch, Seq: m.tokenSeq}
}

func newClerkState(ci ClerkInfo) *clerkState {
	return &clerkState{info: ci, held: map[string]Mode{}, token: map[string]Token{}, revoking: map[string]Mode{}}
}

func (m *Master) knownDead(id ClerkID) bool { return id.Inc <= m.deadBelow[id.Node] }

// ClerkRegistered adds a clerk that registered after the master started.
func (m *Master) ClerkRegistered(ci ClerkInfo) []any {
	if m.clerks[ci.ID] == nil {
		c := newClerkState(ci)
		m.clerks[ci.ID] = c
		if m.knownDead(ci.ID) {
			// Its node incarnation was declared dead: it holds nothing
			// and must leave the list.
			c.dead = true
			m.emit(Forget{ci.ID})
		}
		m.checkServing()
	}
	return m.flush()
}

// Hello handles a clerk opening a session.
func (m *Master) Hello(h Hello) []any {
	c := m.clerks[h.Clerk]
	switch {
	case c == nil && m.knownDead(h.Clerk), c != nil && c.dead:
		m.emit(Send{h.Clerk, Reject{Reason: ErrDeadClerk.Error(), Dead: true}})
		m.emit(Drop{h.Clerk})
		return m.flush()
	case c == nil:
		m.emit(Send{h.Clerk, Reject{Reason: ErrUnregistered.Error()}})
		m.emit(Drop{h.Clerk})
		return m.flush()
	case h.Epoch != m.epoch:
		m.emit(Send{h.Clerk, Reject{Reason: fmt.Sprintf("clerk talks to epoch %d, this master is epoch %d", h.Epoch, m.epoch)}})
		m.emit(Drop{h.Clerk})
		return m.flush()
	}
	// The clerk's report is authoritative: what it does not list it does not
	// hold (grants lost with an old session never reached it).
	for name := range c.held {
		if l := m.locks[name]; l != nil {
			delete(l.holders, h.Clerk)
			m.gc(name)
		}
	}
	m.removeWaiters(h.Clerk)
	c.held, c.token, c.revoking = map[string]Mode{}, map[string]Token{}, map[string]Mode{}
	for name, mode := range h.Held {
		if ValidName(name) != nil || mode == None || mode > Exclusive {
			continue
		}
		if !InScope(c.info.Scope, name) {
			// Kept (the clerk holds it), but an "all" recovery of this
			// clerk would not block it: only an older master grants that.
			m.emit(Anomaly{fmt.Sprintf("clerk %s reports %q, outside its scope %q", h.Clerk, name, c.info.Scope)})
		}
		c.held[name] = mode
		c.token[name] = h.Tokens[name]
		m.lock(name).holders[h.Clerk] = mode
	}
	// Recoveries: a run the clerk reports is the one in progress (this
	// master waits for its end before starting another); a run assigned to
	// this clerk that it no longer reports has ended without a report that
	// reached us: it is free to be assigned again.
	for d, r := range m.recov {
		if _, ok := h.Recovering[d]; !ok && r.assigned != nil && *r.assigned == h.Clerk && !r.forgetting {
			r.assigned = nil
		}
	}
	for d := range m.others { // runs it reported before and no longer runs have ended
		if _, ok := h.Recovering[d]; !ok {
			m.endOther(d, h.Clerk)
		}
	}
	for d, tok := range h.Recovering {
		if r := m.recov[d]; r != nil && (r.assigned == nil || *r.assigned == h.Clerk) && !r.forgetting {
			id := h.Clerk
			r.assigned, r.token = &id, tok
			m.markStarted(r) // an older master's run, maybe of an older version
			continue
		}
		if r := m.recov[d]; r != nil && r.assigned != nil && *r.assigned == h.Clerk {
			continue
		}
		// A run this master did not assign (an older master's, for an
		// obligation it has not met yet, or while another clerk runs it).
		if m.others[d] == nil {
			m.others[d] = map[ClerkID]Token{}
		}
		m.others[d][h.Clerk] = tok
		if r := m.recov[d]; r != nil && !r.forgetting {
			m.markStarted(r)
		}
	}
	c.connected, c.reported = true, true
	m.emit(Send{h.Clerk, Welcome{Epoch: m.epoch}})
	names := make([]string, 0, len(h.Want))
	for name := range h.Want {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if ValidName(name) == nil && (h.Want[name] == Shared || h.Want[name] == Exclusive) && m.inScope(c, name) {
			m.acquire(h.Clerk, name, h.Want[name])
		}
	}
	m.checkServing()
	m.assignRecoveries()
	m.tryAll()
	return m.flush()
}

// Disconnected handles a clerk's session breaking. Its leases stay held: it
// may reconnect, and only the failure detector can free them. A recovery it
// runs stays assigned to it for the same reason.
func (m *Master) Disconnected(id ClerkID) []any {
	c := m.clerks[id]
	if c == nil || !c.connected {
		return nil
	}
	c.connected = false
	c.revoking = map[string]Mode{}
	m.removeWaiters(id)
	m.tryAll() // a waiter behind the departed one may be grantable now
	if m.unsafeReassignOnDisconnect {
		for _, r := range m.recov {
			if r.assigned != nil && *r.assigned == id && !r.forgetting {
				r.assigned = nil
			}
		}
		m.assignRecoveries()
	}
	return m.flush()
}

// Handle handles a message on a clerk's session.
func (m *Master) Handle(from ClerkID, msg any) []any {
	c := m.clerks[from]
	if c == nil || c.dead || !c.connected {
		return nil // a straggler from a dead or closed session
	}
	switch x := msg.(type) {
	case Acquire:
		if ValidName(x.Name) != nil || (x.Mode != Shared && x.Mode != Exclusive) || !m.inScope(c, x.Name) {
			return m.flush()
		}
		m.acquire(from, x.Name, x.Mode)
		m.try(x.Name)
	case Release:
		if ValidName(x.Name) != nil || x.Mode > Shared {
			return nil
		}
		if x.Token != c.token[x.Name] {
			return nil // it crossed a newer grant: it does not release that one
		}
		if cur := c.held[x.Name]; x.Mode < cur {
			m.setHeld(c, x.Name, x.Mode)
		}
		delete(c.revoking, x.Name)
		m.try(x.Name)
		m.gc(x.Name)
	case Withdraw:
		if ValidName(x.Name) != nil {
			return nil
		}
		if l := m.locks[x.Name]; l != nil {
			q := l.queue[:0]
			for _, w := range l.queue {
				if w.clerk != from {
					q = append(q, w)
				}
			}
			l.queue = q
		}
		m.try(x.Name) // the next waiter may be grantable now
		m.gc(x.Name)
	case Goodbye:
		m.goodbye(from, c)
	case RenewRecovery:
		// A newer token for a run that goes on: only for the run this
		// master assigned to this clerk, under the token it last gave it.
		// Any other request is answered with no token, and its run fails.
		r := m.recov[x.Dead]
		if r == nil || r.assigned == nil || *r.assigned != from || r.forgetting || x.Token != r.token || x.Token.Epoch != m.epoch {
			m.emit(Send{from, RecoveryRenewed{Dead: x.Dead, Old: x.Token}})
			break
		}
		r.token = m.nextToken()
		m.emit(Send{from, RecoveryRenewed{Dead: x.Dead, Old: x.Token, Token: r.token}})
	case RecoveryDone:
		if _, ok := m.others[x.Dead][from]; ok {
			m.endOther(x.Dead, from)
			m.assignRecoveries()
		}
		r := m.recov[x.Dead]
		if r == nil || r.assigned == nil || *r.assigned != from || r.forgetting {
			return m.flush() // a stale report: the recovery was reassigned or done
		}
		r.assigned = nil
		if !x.OK || x.Token != r.token {
			// It failed, or it was a run of an older master that ended
			// (cancelled): run it again (recovery is idempotent), on
			// another clerk of the kind if there is one, from the next tick.
			if !x.OK && x.Token == r.token && x.Token.Epoch == m.epoch {
				f := from
				r.failed, r.wait = &f, true
			}
			m.assignRecoveries()
			break
		}
		m.finishRecovery(x.Dead)
		m.assignRecoveries() // one that waited for this run (overlapping)
	}
	return m.flush()
}

// Tick is called by the driver every suspect interval; it retries waiting
// recoveries (outputs in Pending) and returns the clerks whose liveness the
// driver should ask the failure detector about now: those without a
// session, and those that have had revocations outstanding for more than
// RevokePatience consecutive ticks (a paused or partitioned clerk, or one
// under steady contention).
func (m *Master) Tick() []ClerkID {
	for _, r := range m.recov {
		r.wait = false
	}
	m.assignRecoveries() // its outputs come with Pending
	var out []ClerkID
	for id, c := range m.clerks {
		if c.dead {
			continue
		}
		c.since++
		if len(c.revoking) == 0 {
			c.since = 0
		}
		// Every clerk without a session is a suspect: it reconnects soon or
		// it is dead, and a dead one must leave the clerk list even if it
		// holds nothing (each restart of a node adds clerks).
		if !c.connected || c.since > RevokePatience {
			out = append(out, id)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Less(out[j]) })
	return out
}

// Pending returns outputs produced outside a message (by Tick).
func (m *Master) Pending() []any { return m.flush() }

// Persisted reports that a recovery record's Persist decree committed.
func (m *Master) Persisted(dead ClerkID) []any {
	if r := m.recov[dead]; r != nil {
		r.persisted, r.starting = true, false
		m.assignRecoveries()
	}
	return m.flush()
}

// Verdict applies the failure detector's answer about a clerk. A dead
// verdict is final: the clerk's node incarnation has fenced itself and never
// acts again, so its leases can be resolved.
func (m *Master) Verdict(id ClerkID, dead bool) []any {
	c := m.clerks[id]
	if !dead || c == nil || c.dead {
		return nil
	}
	if id.Inc > m.deadBelow[id.Node] {
		m.deadBelow[id.Node] = id.Inc
	}
	c.dead, c.connected = true, false
	m.emit(Drop{id})
	m.removeWaiters(id)
	switch {
	case c.info.Kind == "":
		// No recovery: the leases are simply free.
		for name := range c.held {
			m.setHeld(c, name, None)
		}
		m.emit(Forget{id})
	case !c.reported && !m.serving:
		// A new master does not know what it held: recover everything.
		r := RecoveryRecord{Dead: id, Kind: c.info.Kind, All: true, Scope: c.info.Scope}
		m.recov[id] = &recovery{rec: r}
		m.emit(Persist{r})
	case len(c.held) > 0:
		// Leases stay held until recovery has run on a live clerk of its kind.
		r := RecoveryRecord{Dead: id, Kind: c.info.Kind, Held: map[string]Mode{}, Scope: c.info.Scope}
		size := 0
		for _, p := range c.info.Scope {
			size += len(p) + 8
		}
		for name, mode := range c.held {
			r.Held[name] = mode
			size += len(name) + 8
		}
		if size > MaxRecordBytes {
			// Too big for one config-service value: record "all" (the
			// leases stay held, as the table still says; recovery covers
			// everything of the kind).
			r = RecoveryRecord{Dead: id, Kind: c.info.Kind, All: true, Scope: c.info.Scope}
		}
		m.recov[id] = &recovery{rec: r}
		m.emit(Persist{r})
	default:
		m.emit(Forget{id})
	}
	// A run the dead clerk had is over (its node fenced; its writes carry
	// an older token than the next run's).
	for _, r := range m.recov {
		if r.assigned != nil && *r.assigned == id {
			r.assigned = nil
		}
	}
	m.endOthers(id)
	m.checkServing()
	m.assignRecoveries()
	m.tryAll()
	return m.flush()
}

// goodbye: a live clerk leaves. Its leases are free at once (it holds and
// uses nothing; its own report is as good as a release of each), it waits
// for nothing, the runs it was asked for are over (their ends were reported
// before the Goodbye on the same ordered session, or they are abandoned and
// run again elsewhere), and its record goes with a Forget decree. Until that
// commits it counts as dead here, so no liveness question is asked about it
// and a Hello from it is told so.
func (m *Master) goodbye(id ClerkID, c *clerkState) {
	c.leaving, c.dead = true, true
	m.removeWaiters(id)
	c.revoking = map[string]Mode{}
	for name := range c.held {
		m.setHeld(c, name, None)
		m.gc(name)
	}
	for _, r := range m.recov {
		if r.assigned != nil && *r.assigned == id && !r.forgetting {
			r.assigned = nil
		}
	}
	m.endOthers(id)
	m.emit(Forget{id})
	m.checkServing()
	m.assignRecoveries()
	m.tryAll()
}

// finishRecovery: the recovery succeeded. The leases stay held until the
// removal of the records has committed (Forgotten).
func (m *Master) finishRecovery(dead ClerkID) {
	r := m.recov[dead]
	r.forgetting = true
	m.emit(Forget{dead})
	if m.unsafeFreeBeforeForget {
		delete(m.recov, dead)
		if c := m.clerks[dead]; c != nil {
			for name := range c.held {
				m.setHeld(c, name, None)
			}
		}
		m.checkServing()
		m.tryAll()
	}
}

// Forgotten reports that the Forget decree for a dead clerk committed: its
// records are gone, so no later master can run its recovery again, and its
// leases are free.
func (m *Master) Forgotten(dead ClerkID) []any {
	if r := m.recov[dead]; r != nil {
		if !r.forgetting {
			return nil // a Forget from before a new obligation; not this one
		}
		delete(m.recov, dead)
	}
	if c := m.clerks[dead]; c != nil {
		if !c.dead {
			return nil
		}
		for name := range c.held {
			m.setHeld(c, name, None)
			m.gc(name)
		}
		delete(m.clerks, dead)
		if c.leaving {
			// Its record is gone: tell it, and close its session.
			m.emit(Send{dead, Reject{Reason: ErrClosed.Error(), Dead: true}})
			m.emit(Drop{dead})
		}
	}
	m.checkServing()
	m.tryAll()
	return m.flush()
}

// assignRecoveries hands each unassigned recovery to a live, connected,
// reported clerk of its kind, if there is one; otherwise it waits (the
// deferred case) and the leases stay held. A recovery starts only once its
// record is in the config service, no run of it reported by a clerk is
// still going, and (for a new master) every live clerk has reported: one of
// them may still be running it for the old master.
func (m *Master) assignRecoveries() {
	if !m.serving {
		return
	}
	var deads []ClerkID
	for d := range m.recov {
		deads = append(deads, d)
	}
	sort.Slice(deads, func(i, j int) bool { return deads[i].Less(deads[j]) })
	for _, d := range deads {
		r := m.recov[d]
		if r.assigned != nil || r.forgetting || !r.persisted || r.starting || r.wait || len(m.others[d]) > 0 {
			continue
		}
		if m.overlapping(d, r) {
			continue
		}
		if h, ok := m.conflict(r); ok {
			if !r.reported { // once per obligation: Tick retries every tick
				r.reported = true
				m.emit(Anomaly{fmt.Sprintf("recovery of %s not started: live clerk %s holds a conflicting lease on %q", d, h.clerk, h.name)})
			}
			continue
		}
		var best, fallback *ClerkID
		for id, c := range m.clerks {
			if c.info.Kind != r.rec.Kind || c.dead || !c.connected || !c.reported || id == d {
				continue
			}
			id := id
			if r.failed != nil && id == *r.failed {
				fallback = &id
				continue
			}
			if best == nil || id.Less(*best) {
				best = &id
			}
		}
		if best == nil {
			best = fallback
		}
		if best == nil {
			continue
		}
		req := Recover{Dead: d, Names: r.rec.Names(), All: r.rec.All}
		if r.rec.All {
			var ok bool
			if req.Exclude, ok = m.excluded(d, r.rec.Kind); !ok {
				if !r.reported {
					r.reported = true
					m.emit(Anomaly{fmt.Sprintf("recovery of %s (all) not started: clerks of kind %q hold %d names, more than one message carries", d, r.rec.Kind, len(req.Exclude))})
				}
				continue
			}
		}
		if r.rec.All && !r.rec.Started && !m.unsafeOverlappingRuns {
			// Recorded before the first run: a later master must know
			// that this recovery's writes may land (overlapping: only
			// "all" runs overlap). It runs once the mark is in
			// (Persisted).
			r.rec.Started, r.starting = true, true
			m.emit(Persist{r.rec})
			continue
		}
		r.assigned, r.token = best, m.nextToken()
		req.Token = r.token
		m.emit(Send{*best, req})
	}
}

// overlapping reports whether recovery r of dead must wait for another of
// its kind whose names may overlap its own: both are "all" (their names
// are unknown). A B-tree server's replay reads a node, keeps the newer of
// its image and the log's, and writes it back, so a run that rewrote an
// older image after another dead server's run wrote a newer one, at once,
// would undo that write (two "all" runs after a whole-cluster restart
// did: TestEndToEndTreeKillAll). Other pairs cover disjoint names, or
// write the same image: two dead clerks never held one name in conflicting
// modes; two runs with names may share a name both clerks held shared,
// and both then rewrite the node's current image (a B-tree server writes a
// node back before it gives its lease up, so neither log holds a newer
// one); and an "all" run excludes every name another clerk of its kind
// holds, live or dead (excluded).
//
// Such a run waits while an overlapping one is going (assigned here,
// reported by a clerk for an older master, or its Started mark being
// persisted), and while an overlapping one is Started (a run of it may
// have gone out, from this master or an older one, and not succeeded: its
// writes may still land, under its dead clerk's fence name, which the
// other run's writes do not fence out; every run of an "all" recovery,
// sent or adopted, is marked first): that one goes first, and its next
// run's newer token fences its earlier run's writes out wherever they
// could land. Among Started ones the least dead clerk id goes first (one
// master never leaves two Started: it starts one at a time, and keeps the
// mark until the run succeeds and the record is forgotten).
func (m *Master) overlapping(dead ClerkID, r *recovery) bool {
	if m.unsafeOverlappingRuns {
		return false
	}
	for d, o := range m.recov {
		if d == dead || o.forgetting || o.rec.Kind != r.rec.Kind || !o.rec.All || !r.rec.All {
			continue
		}
		if o.assigned != nil || o.starting || len(m.others[d]) > 0 {
			return true
		}
		if o.rec.Started && (!r.rec.Started || d.Less(dead)) && !m.unsafeIgnoreUnsettled {
			return true
		}
	}
	return false
}

// markStarted records that a run of "all" recovery r may have gone out,
// when this master learns of one it did not send (a clerk reports it): an
// older master, maybe of a version without the mark, sent it, and a later
// master must know it even if this one never assigns r (outside review 14).
func (m *Master) markStarted(r *recovery) {
	if !r.rec.All || r.rec.Started {
		return
	}
	r.rec.Started, r.starting = true, true
	m.emit(Persist{r.rec})
}

// endOther: a run an older master started, of dead's recovery, at clerk
// id, is over (reported done, or no longer reported, or its clerk died or
// left). Nothing says it succeeded: this master runs the recovery again,
// and until then its writes may still land (the record is Started:
// markStarted when the run was reported).
func (m *Master) endOther(dead, id ClerkID) {
	if _, ok := m.others[dead][id]; !ok {
		return
	}
	delete(m.others[dead], id)
	if len(m.others[dead]) == 0 {
		delete(m.others, dead)
	}
}

// endOthers: every run at clerk id that an older master started is over.
func (m *Master) endOthers(id ClerkID) {
	for d := range m.others {
		m.endOther(d, id)
	}
}

// excluded lists the names an "all" recovery of dead must not touch: those
// held by any other clerk of its kind, live or dead (a live holder's work, or
// another dead clerk's pending recovery; the dead clerk cannot have held them
// in a conflicting mode, and the run's newer token would fence the others'
// writes out). A recovery of kind K touches only names clerks of kind K lock
// (names are the kind's namespace). ok is false if they are too many for one
// message.
func (m *Master) excluded(dead ClerkID, kind string) (names []string, ok bool) {
	for name, l := range m.locks {
		for h := range l.holders {
			if c := m.clerks[h]; h != dead && c != nil && c.info.Kind == kind {
				names = append(names, name)
				break
			}
		}
	}
	sort.Strings(names)
	size := 0
	for _, n := range names {
		size += len(n) + 8
	}
	return names, len(names) <= MaxRecoverNames && size <= MaxRecoverBytes
}

type holding struct {
	clerk ClerkID
	name  string
}

// conflict finds a live clerk holding a lease that conflicts with one the
// dead clerk held. The protocol makes it impossible (the dead clerk's leases
// stay held until its records are gone); if it ever happens, recovery must
// not run over the live holder's work.
func (m *Master) conflict(r *recovery) (holding, bool) {
	for _, name := range r.rec.Names() {
		l := m.locks[name]
		if l == nil {
			continue
		}
		for h, mode := range l.holders {
			if h == r.rec.Dead {
				continue
			}
			if c := m.clerks[h]; c != nil && !c.dead && !Compatible(mode, r.rec.Held[name]) {
				return holding{h, name}, true
			}
		}
	}
	return holding{}, false
}

func (m *Master) blockedAll() bool {
	for _, r := range m.recov {
		if r.rec.All {
			return true
		}
	}
	return false
}

// inScope checks a wanted name against the clerk's recorded scope: the
// master never grants a clerk a name outside it, so that an "all" recovery
// of the clerk, which blocks only its scope, covers everything it could
// hold (the clerk's engine refuses such names too; this does not trust it).
func (m *Master) inScope(c *clerkState, name string) bool {
	if InScope(c.info.Scope, name) {
		return true
	}
	m.emit(Anomaly{fmt.Sprintf("clerk %s asks for %q, outside its scope %q: ignored", c.info.ID, name, c.info.Scope)})
	return false
}

// blocked reports whether a pending "all" recovery keeps name from being
// granted: the dead clerk may have held it (it is in the clerk's scope).
func (m *Master) blocked(name string) bool {
	for _, r := range m.recov {
		if r.rec.All && InScope(r.rec.Scope, name) {
			return true
		}
	}
	return false
}

// checkServing starts granting once every clerk has reported or is dead.
func (m *Master) checkServing() {
	if m.serving {
		return
	}
	for _, c := range m.clerks {
		if !c.dead && !c.reported {
			return
		}
	}
	m.serving = true
	m.assignRecoveries()
}

func (m *Master) setHeld(c *clerkState, name string, mode Mode) {
	l := m.lock(name)
	if mode == None {
		delete(c.held, name)
		delete(c.token, name)
		delete(l.holders, c.info.ID)
	} else {
		c.held[name] = mode
		l.holders[c.info.ID] = mode
	}
}

func (m *Master) acquire(id ClerkID, name string, mode Mode) {
	l := m.lock(name)
	for i, w := range l.queue {
		if w.clerk == id {
			if mode > w.mode {
				l.queue[i].mode = mode
			}
			return
		}
	}
	l.queue = append(l.queue, waiter{id, mode})
}

func (m *Master) removeWaiters(id ClerkID) {
	for name, l := range m.locks {
		q := l.queue[:0]
		for _, w := range l.queue {
			if w.clerk != id {
				q = append(q, w)
			}
		}
		l.queue = q
		m.gc(name)
	}
}

func (m *Master) tryAll() {
	names := make([]string, 0, len(m.locks))
	for n, l := range m.locks {
		if len(l.queue) > 0 {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	for _, n := range names {
		m.try(n)
	}
}

// try grants a lock's waiters in FIFO order while they are compatible with
// every other holder, and revokes the holders that stand in the way of the
// first one that is not.
func (m *Master) try(name string) {
	if !m.serving || m.blocked(name) {
		return
	}
	l := m.locks[name]
	if l == nil {
		return
	}
	for len(l.queue) > 0 {
		w := l.queue[0]
		c := m.clerks[w.clerk]
		if c == nil || c.dead || !c.connected {
			l.queue = l.queue[1:]
			continue
		}
		var conflicts []ClerkID
		for h, hm := range l.holders {
			if h != w.clerk && !Compatible(hm, w.mode) {
				conflicts = append(conflicts, h)
			}
		}
		if len(conflicts) == 0 {
			if w.mode > c.held[name] {
				m.setHeld(c, name, w.mode)
			}
			tok := m.nextToken()
			c.token[name] = tok
			m.emit(Send{w.clerk, Grant{Name: name, Mode: c.held[name], Token: tok}})
			// A newer grant voids a revocation in flight (the clerk drops a
			// pending revocation when a grant arrives, and an answer it
			// already sent carries the older token and is ignored), so the
			// revocation is sent again (after the grant, on the same
			// ordered session) if the lock is still wanted elsewhere.
			delete(c.revoking, name)
			l.queue = l.queue[1:]
			continue
		}
		keep := None
		if w.mode == Shared {
			keep = Shared
		}
		sort.Slice(conflicts, func(i, j int) bool { return conflicts[i].Less(conflicts[j]) })
		for _, h := range conflicts {
			hc := m.clerks[h]
			if hc == nil || hc.dead || !hc.connected {
				continue // wait for it to reconnect, or for its verdict
			}
			if k, ok := hc.revoking[name]; ok && k <= keep {
				continue // already asked for at least this much
			}
			hc.revoking[name] = keep
			m.emit(Send{h, Revoke{Name: name, Keep: keep}})
		}
		return
	}
}

// LockView is one lock as the master sees it (for `grove lock list`).
type LockView struct {
	Name    string
	Holders map[ClerkID]Mode
	Tokens  map[ClerkID]Token
	Waiters []ClerkID
}

// ClerkView is one clerk as the master sees it.
type ClerkView struct {
	Info      ClerkInfo
	Connected bool
	Dead      bool
	Held      int
}

// Locks lists every held or awaited lock, by name.
func (m *Master) Locks() []LockView {
	var out []LockView
	for n, l := range m.locks {
		if len(l.holders) == 0 && len(l.queue) == 0 {
			continue
		}
		v := LockView{Name: n, Holders: map[ClerkID]Mode{}, Tokens: map[ClerkID]Token{}}
		for h, md := range l.holders {
			v.Holders[h] = md
			if c := m.clerks[h]; c != nil {
				v.Tokens[h] = c.token[n]
			}
		}
		for _, w := range l.queue {
			v.Waiters = append(v.Waiters, w.clerk)
		}
		out = append(out, v)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Clerks lists the clerks the master knows.
func (m *Master) Clerks() []ClerkView {
	var out []ClerkView
	for _, c := range m.clerks {
		out = append(out, ClerkView{Info: c.info, Connected: c.connected, Dead: c.dead, Held: len(c.held)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Info.ID.Less(out[j].Info.ID) })
	return out
}

// Recoveries lists the pending recovery obligations.
func (m *Master) Recoveries() []RecoveryRecord {
	var out []RecoveryRecord
	for _, r := range m.recov {
		out = append(out, r.rec)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Dead.Less(out[j].Dead) })
	return out
}
