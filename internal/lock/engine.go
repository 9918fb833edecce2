package lock

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"sort"
	"time"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/meta"
)

// Env is what every Engine input carries: the node's local time and whether
// the engine's node incarnation considers itself alive at that time (the
// failure detector's self-check, read by the driver just before the call).
// An engine acts under leases only while Alive.
type Env struct {
	Now   time.Time
	Alive bool
}

// Subject names one node incarnation in a failure-detector query.
type Subject struct{ Node, Inc uint64 }

// Effects an Engine asks its driver to carry out, in the order returned.
// Each effect with an ID reports back through the matching Engine method.
type (
	// ReadLock reads the lock namespace linearizably → LockRead.
	ReadLock struct{ ID uint64 }
	// Propose passes one conditional decree (no retry) → Proposed.
	Propose struct {
		ID     uint64
		Decree *pb.Decree
	}
	// Update runs the config service's read-build-propose loop on the lock
	// namespace with Build (a pure function of the namespace read) →
	// Updated. Build returning no ops ends it with nothing proposed.
	Update struct {
		ID     uint64
		Origin string
		Build  func(*pb.Namespace) ([]*pb.Op, error)
	}
	// QueryFD asks the failure-detector service which subjects are dead →
	// FDAnswer.
	QueryFD struct {
		ID       uint64
		Subjects []Subject
	}
	// Dial opens clerk Clerk's session to Master (a stream; the first
	// message the engine sends on it is the Hello). A session that cannot be
	// opened, or breaks, reports SessionClosed.
	Dial struct {
		Session uint64
		Clerk   ClerkID
		Master  MasterRecord
	}
	// SessionSend sends a clerk message on a clerk's session, in order.
	SessionSend struct {
		Session uint64
		Msg     any
	}
	// HangUp closes a clerk's session (no SessionClosed follows).
	HangUp struct{ Session uint64 }
	// ClerkSend sends a master message on an accepted session, in order.
	ClerkSend struct {
		Session uint64
		Msg     any
	}
	// ClerkClose closes an accepted session (no MasterClosed follows).
	ClerkClose struct{ Session uint64 }
	// StartRecovery runs clerk Clerk's recovery function for Req →
	// RecoveryFinished. CancelRecovery asks a run to stop (it still reports).
	StartRecovery struct {
		Run   uint64
		Clerk ClerkID
		Req   Recover
	}
	CancelRecovery struct{ Run uint64 }
	// RecoveryRenewal answers RenewRun: the run's new token, or Err (the
	// run must fail: its writes may land late under the token it has).
	RecoveryRenewal struct {
		Run   uint64
		Token Token
		Err   error
	}
	// Wake: these local waiters are granted (or failed: Waiter.Failed).
	Wake struct{ Waiters []*Waiter }
	// RevokeNotice: the master revoked Clerk's lease on Name, which local
	// holders still hold (tell the clerk's revocation handler, if any).
	RevokeNotice struct {
		Clerk ClerkID
		Name  string
	}
	// LeasesLost: every lease of Clerk is gone (fenced, or declared dead).
	LeasesLost struct {
		Clerk  ClerkID
		Reason error
	}
	// ClerkClosed: Clerk's Close is complete (its record is gone from the
	// lock namespace); the engine has forgotten it.
	ClerkClosed struct{ Clerk ClerkID }
	// Note is a line for the node's log (Level: slog's levels).
	Note struct {
		Level int
		Msg   string
		Args  []any
	}
)

// Log levels of a Note (slog's).
const (
	levelInfo  = 0
	levelWarn  = 4
	levelError = 8
)

// EngineConfig configures the lock service of one node incarnation.
type EngineConfig struct {
	Node      uint64
	Inc       uint64
	Addr      string // this node's gRPC address, for the master record
	Candidate bool   // runs a standby (role "lock")
	// Tick is how often the master asks about suspects and the standby
	// checks the master (default 250 ms).
	Tick time.Duration
	// MaxDecreeQueue bounds a master's pending config-service writes; a
	// master that cannot keep up stops (a standby rebuilds everything).
	MaxDecreeQueue int
	// UnsafeFreeBeforeForget brings back defect 1 of the safety review
	// (a recovered clerk's leases freed before its records are removed).
	// Only for the simulator's test that its oracle catches it.
	UnsafeFreeBeforeForget bool
	// UnsafeReassignOnDisconnect gives a recovery to another clerk when the
	// assignee's session breaks, while its run may go on. Only for the
	// simulator's test that its oracle catches two runs at once.
	UnsafeReassignOnDisconnect bool
	// UnsafeOverlappingRuns runs recoveries whose names may overlap (an
	// "all" one and another of its kind) at once. Only for the
	// simulator's test that its oracle catches it.
	UnsafeOverlappingRuns bool
	// UnsafeIgnoreUnsettled runs a recovery while an overlapping one whose
	// run ended without success may still have writes landing. Only for
	// the simulator's test that its oracle catches it.
	UnsafeIgnoreUnsettled bool
}

// Backoffs of the engine's retries.
const (
	minBackoff = 100 * time.Millisecond
	maxBackoff = 2 * time.Second
)

// backoff is the pause after failures failures in a row: doubling from
// minBackoff to maxBackoff, then jittered into [d, 3d/2) by salt (a clerk's
// or master's identity), so that the clerks of a cluster that all lost
// their master at once do not retry in step. The jitter is a hash, not a
// random draw: engines stay deterministic for the simulator.
func backoff(failures int, salt uint64) time.Duration {
	d := minBackoff
	for i := 1; i < failures && d < maxBackoff; i++ {
		d *= 2
	}
	d = min(d, maxBackoff)
	h := fnv.New64a()
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], salt)
	binary.LittleEndian.PutUint64(b[8:], uint64(failures))
	h.Write(b[:])
	return d + time.Duration(h.Sum64()%uint64(d/2))
}

// salt identifies a clerk for backoff jitter.
func (id ClerkID) salt() uint64 { return id.Node<<40 ^ id.Inc<<20 ^ uint64(id.Seq) }

// Engine is the lock service of one node incarnation as a state machine:
// its clerks' registration, sessions with the master and recovery runs; its
// standby; and, after a takeover, its master with the master's ordered
// config-service writes and failure-detector polls. It does no I/O: every
// input returns the effects to carry out, and completions come back as
// inputs. Not safe for concurrent use.
//
// Everything in it is bound to its incarnation: once the node fences that
// incarnation (Fence), every lease is gone, the master stops, and nothing
// created afterwards works; the next incarnation gets a new Engine.
type Engine struct {
	cfg    EngineConfig
	fenced bool
	nextID uint64

	hint      *State // the lock namespace as last seen (watch or read)
	hintStale bool   // a session failed: refresh with a linearizable read
	reading   uint64 // the clerks' ReadLock in flight (0: none)

	clerks  map[ClerkID]*clerkRun
	order   []ClerkID // clerks in id order, for determinism
	nextSeq uint32

	sb standby
	m  *masterRun
}

// clerkRun is one clerk's runtime state.
type clerkRun struct {
	core        *Clerk
	registered  bool
	regVersion  uint64 // lock namespace version that had its registration
	registering uint64 // Update in flight
	// closing: Close ran. The clerk keeps (re)connecting until its
	// Goodbye reached a master and a namespace at or after regVersion no
	// longer lists it; then the engine forgets it (ClerkClosed).
	closing     bool
	goodbyeSent bool // on the current session
	regRetry    time.Time
	regFails    int
	dead        bool // the master said its incarnation is dead
	sess        uint64
	sessEpoch   Epoch
	welcomed    bool
	dialAt      time.Time
	fails       int // sessions that ended before a welcome, in a row
	runs        map[ClerkID]*run
}

type run struct {
	id        uint64
	token     Token
	epoch     Epoch // the master epoch that asked for it
	cancelled bool
	renewing  bool // a RenewRecovery under token is out
	// resend: renewing, and the session it went out on broke before the
	// answer: it goes out again on the clerk's next welcomed session of
	// the run's epoch (a newer epoch cancels the run).
	resend bool
	// renewFailed: a renewal of the run failed (its writes may land late
	// under a token it could not supersede): its end is reported as a
	// failure whatever the recovery function returns.
	renewFailed bool
}

// cancel stops the run (CancelRecovery) and fails a renewal it waits for.
func (r *run) cancel() []any {
	var out []any
	if !r.cancelled {
		r.cancelled = true
		out = append(out, CancelRecovery{r.id})
	}
	if r.renewing {
		out = append(out, r.renewalFailed("the run is cancelled"))
	}
	return out
}

// sortedRunKeys orders a clerk's runs by dead clerk (one order, so that a
// simulation replays).
func sortedRunKeys(runs map[ClerkID]*run) []ClerkID {
	keys := make([]ClerkID, 0, len(runs))
	for k := range runs {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].Less(keys[j]) })
	return keys
}

// renewalFailed ends the run's pending renewal, or refuses a new one.
func (r *run) renewalFailed(why string) RecoveryRenewal {
	r.renewing, r.renewFailed, r.resend = false, true, false
	return RecoveryRenewal{Run: r.id, Err: fmt.Errorf("%w: %s", ErrRenewRefused, why)}
}

// ErrRenewRefused: a recovery run's renewal failed (the master refused it,
// a newer master took over, or the run was cancelled or ended); the run
// must fail.
var ErrRenewRefused = errors.New("lock: the recovery run's token was not renewed")

// NewEngine returns the engine of incarnation cfg.Inc of node cfg.Node.
func NewEngine(cfg EngineConfig) *Engine {
	if cfg.Tick == 0 {
		cfg.Tick = 250 * time.Millisecond
	}
	if cfg.MaxDecreeQueue == 0 {
		cfg.MaxDecreeQueue = 4096
	}
	if cfg.Node == 0 || cfg.Inc == 0 {
		panic("lock: engine without node or incarnation")
	}
	return &Engine{cfg: cfg, clerks: map[ClerkID]*clerkRun{}}
}

func (e *Engine) id() uint64 { e.nextID++; return e.nextID }

// Fenced reports whether the engine's incarnation is over.
func (e *Engine) Fenced() bool { return e.fenced }

// Incarnation is the engine's node incarnation.
func (e *Engine) Incarnation() uint64 { return e.cfg.Inc }

// ---------------------------------------------------------------- clerks

// NewClerk creates a clerk of kind for this incarnation and registers it.
// It fails once the incarnation is fenced: nothing made under a fenced
// incarnation may ever hold a lease.
//
// scope lists the name prefixes the clerk may lock (none: any name). A kind
// with recovery should declare one: when a dead clerk's leases are unknown
// (a new master's "all" recovery), only names in its scope wait for the
// recovery to finish.
func (e *Engine) NewClerk(env Env, kind string, scope ...string) (ClerkID, []any, error) {
	if e.fenced {
		return ClerkID{}, nil, ErrFenced
	}
	if len(kind) > MaxKindLen {
		return ClerkID{}, nil, fmt.Errorf("lock: kind longer than %d bytes", MaxKindLen)
	}
	if len(scope) > MaxScopePrefixes {
		return ClerkID{}, nil, fmt.Errorf("lock: a scope of %d prefixes (at most %d)", len(scope), MaxScopePrefixes)
	}
	for _, p := range scope {
		if p == "" || len(p) > MaxNameLen {
			return ClerkID{}, nil, fmt.Errorf("lock: a scope prefix is 1..%d bytes", MaxNameLen)
		}
	}
	e.nextSeq++
	id := ClerkID{Node: e.cfg.Node, Inc: e.cfg.Inc, Seq: e.nextSeq}
	c := &clerkRun{core: NewClerk(id, kind, scope...), runs: map[ClerkID]*run{}}
	e.clerks[id] = c
	e.order = append(e.order, id)
	sort.Slice(e.order, func(i, j int) bool { return e.order[i].Less(e.order[j]) })
	return id, e.register(id, c), nil
}

func (e *Engine) register(id ClerkID, c *clerkRun) []any {
	c.registering = e.id()
	ci := ClerkInfo{ID: id, Kind: c.core.Kind(), Scope: c.core.Scope()}
	return []any{Update{ID: c.registering, Origin: "clerk-" + id.String(), Build: func(ns *pb.Namespace) ([]*pb.Op, error) {
		return registerClerkOps(ns, ci)
	}}}
}

// usable checks that a clerk may take part in lease operations now.
func (e *Engine) usable(env Env, id ClerkID) (*clerkRun, error) {
	c := e.clerks[id]
	switch {
	case e.fenced:
		return nil, ErrFenced
	case c == nil:
		return nil, ErrUnregistered
	case c.dead:
		return nil, ErrDeadClerk
	case c.closing:
		return nil, ErrClosed
	case !env.Alive:
		return nil, ErrNotAlive
	}
	return c, nil
}

// Acquire asks for name in mode for a local holder. If the returned waiter
// is Granted, the holder proceeds at once (a cached lease: no message);
// otherwise a later Wake names it.
func (e *Engine) Acquire(env Env, id ClerkID, name string, mode Mode) (*Waiter, []any, error) {
	if err := ValidName(name); err != nil {
		return nil, nil, err
	}
	if mode != Shared && mode != Exclusive {
		return nil, nil, ErrBadMode
	}
	c, err := e.usable(env, id)
	if err != nil {
		return nil, nil, err
	}
	if !InScope(c.core.Scope(), name) {
		return nil, nil, fmt.Errorf("%w: %q, scope %q", ErrOutOfScope, name, c.core.Scope())
	}
	room, err := c.core.Room(name)
	if err != nil {
		return nil, nil, err
	}
	w, out := c.core.Acquire(name, mode)
	return w, e.clerkOut(env, id, c, append(room, out...)), nil
}

// Release ends a local holder's use of a lock.
func (e *Engine) Release(env Env, id ClerkID, w *Waiter) []any {
	c := e.clerks[id]
	if c == nil || e.fenced || c.dead {
		return nil
	}
	out, _ := c.core.Release(w)
	return e.clerkOut(env, id, c, out)
}

// Cancel abandons a local acquire that was not granted.
func (e *Engine) Cancel(env Env, id ClerkID, w *Waiter) []any {
	c := e.clerks[id]
	if c == nil || e.fenced || c.dead {
		return nil
	}
	return e.clerkOut(env, id, c, c.core.Cancel(w))
}

// Drop gives a cached, unused lease back to the master.
func (e *Engine) Drop(env Env, id ClerkID, name string) []any {
	c := e.clerks[id]
	if c == nil || e.fenced || c.dead {
		return nil
	}
	return e.clerkOut(env, id, c, c.core.Drop(name))
}

// Valid reports whether a granted local hold may act: the incarnation is
// not fenced, the clerk not declared dead, and the hold not released. The
// caller also checks that the node is alive as this incarnation, against
// the clock, and should bound its act by the incarnation's deadline.
func (e *Engine) Valid(id ClerkID, w *Waiter) bool {
	c := e.clerks[id]
	return !e.fenced && c != nil && !c.dead && w.Granted && c.core.Held(w.Name) >= w.Mode
}

// LeaseChanges counts the changes of a clerk's cached leases (observers
// compare it to skip unchanged clerks).
func (e *Engine) LeaseChanges(id ClerkID) uint64 {
	if c := e.clerks[id]; c != nil {
		return c.core.Changes()
	}
	return 0
}

// Lease returns a clerk's cached lease on name and its token.
func (e *Engine) Lease(id ClerkID, name string) (Mode, Token) {
	if c := e.clerks[id]; c != nil && !e.fenced && !c.dead {
		return c.core.Lease(name)
	}
	return None, Token{}
}

// Revoking reports whether a revocation of a clerk's lease on name waits
// for its local holders.
func (e *Engine) Revoking(id ClerkID, name string) bool {
	if c := e.clerks[id]; c != nil && !e.fenced && !c.dead {
		return c.core.Revoking(name)
	}
	return false
}

// clerkOut carries out a clerk core's outputs.
func (e *Engine) clerkOut(env Env, id ClerkID, c *clerkRun, out []any) []any {
	var fx []any
	for _, o := range out {
		switch x := o.(type) {
		case ToMaster:
			if c.sess != 0 {
				fx = append(fx, SessionSend{c.sess, x.Msg})
			}
			// Without a session the next Hello carries the state.
		case Woken:
			fx = append(fx, Wake{x.Waiters})
		case Revoking:
			fx = append(fx, RevokeNotice{Clerk: id, Name: x.Name})
		case RunRecovery:
			fx = append(fx, e.startRun(id, c, x.Req)...)
		case RecoveryRenewed:
			r := c.runs[x.Dead]
			if r == nil || !r.renewing || r.token != x.Old {
				break // an answer for a run that is gone, or already answered
			}
			if x.Token.IsZero() {
				fx = append(fx, r.renewalFailed("the master refused it"))
				break
			}
			r.renewing = false
			r.token = x.Token
			fx = append(fx, RecoveryRenewal{Run: r.id, Token: x.Token})
		}
	}
	return fx
}

// startRun starts a recovery run unless one for the same dead clerk is
// still going here (at most one run per dead clerk at a time: the master
// hears of the running one's end and decides again).
func (e *Engine) startRun(id ClerkID, c *clerkRun, req Recover) []any {
	if _, running := c.runs[req.Dead]; running {
		return nil
	}
	r := &run{id: e.id(), token: req.Token, epoch: c.sessEpoch}
	c.runs[req.Dead] = r
	return []any{StartRecovery{Run: r.id, Clerk: id, Req: req}}
}

// RenewRun asks the master for a newer token for a recovery run that goes
// on (lock.Recovery.Renew) → RecoveryRenewal. It fails at once unless the
// run's clerk has a welcomed session of the epoch that asked for the run:
// a renewal the master never sees cannot be waited for.
func (e *Engine) RenewRun(env Env, runID uint64) []any {
	for _, id := range e.order {
		c := e.clerks[id]
		for dead, r := range c.runs {
			if r.id != runID {
				continue
			}
			switch {
			case r.renewing:
				return []any{RecoveryRenewal{Run: runID, Err: fmt.Errorf("%w: a renewal is already out", ErrRenewRefused)}}
			case e.fenced || c.dead || r.cancelled:
				return []any{r.renewalFailed("the run is cancelled")}
			case c.sess == 0 || !c.welcomed || r.epoch != c.sessEpoch:
				return []any{r.renewalFailed("no session with the master that asked for the run")}
			}
			r.renewing = true
			return e.clerkOut(env, id, c, c.core.RenewRecovery(dead, r.token))
		}
	}
	return []any{RecoveryRenewal{Run: runID, Err: fmt.Errorf("%w: no such run", ErrRenewRefused)}}
}

// AbandonRenewal: the run's function gave up waiting for its renewal (its
// context ended). A late answer is ignored, and the run's end counts as a
// failure.
func (e *Engine) AbandonRenewal(runID uint64) {
	for _, id := range e.order {
		for _, r := range e.clerks[id].runs {
			switch {
			case r.id != runID:
			case r.renewing:
				r.renewalFailed("abandoned")
			default:
				// Its answer came as the function gave up on it: the
				// run's writes may not carry the new token yet, so its
				// end still counts as a failure.
				r.renewFailed = true
			}
		}
	}
}

// RecoveryFinished reports the end of a recovery run (err nil: success).
func (e *Engine) RecoveryFinished(env Env, runID uint64, err error) []any {
	for _, id := range e.order {
		c := e.clerks[id]
		for dead, r := range c.runs {
			if r.id != runID {
				continue
			}
			delete(c.runs, dead)
			var out []any
			if r.renewing {
				// It ended with a renewal out, or waiting to be sent
				// again after a session break: a write of it may still
				// land under the token it has, so it did not end well
				// (whatever the function says), and the renewal's
				// waiter is answered.
				out = append(out, r.renewalFailed("the run ended before its renewal was answered"))
			}
			if e.fenced || c.dead || c.sess == 0 {
				return out // the next Hello does not list it: the master decides again
			}
			ok := err == nil && !r.cancelled && !r.renewFailed && r.epoch == c.sessEpoch
			return append(out, e.clerkOut(env, id, c, c.core.RecoveryDone(dead, ok, r.token))...)
		}
	}
	return nil
}

// Updated reports the outcome of an Update (clerk registration, or a
// master's write).
func (e *Engine) Updated(env Env, id uint64, version uint64, err error) []any {
	for _, cid := range e.order {
		c := e.clerks[cid]
		if c.registering == id {
			c.registering = 0
			if err != nil {
				c.regFails++
				c.regRetry = env.Now.Add(backoff(c.regFails, cid.salt()))
				return []any{Note{levelWarn, "clerk registration failed; retrying", []any{"clerk", cid, "err", err}}}
			}
			c.registered, c.regFails, c.regVersion = true, 0, version
			return e.step(env)
		}
	}
	if e.m != nil && e.m.decree == id {
		if !env.Alive {
			return e.step(env) // halts the master: it acts only while alive
		}
		return e.decreeDone(env, version, err)
	}
	return nil
}

// LockRead reports a linearizable read of the lock namespace.
func (e *Engine) LockRead(env Env, id uint64, st *State, err error) []any {
	var out []any
	if err == nil {
		e.setHint(st)
	}
	if id == e.reading {
		e.reading = 0
		if err == nil {
			e.hintStale = false
		}
	}
	if e.sb.state == sbReading && e.sb.id == id {
		out = append(out, e.standbyRead(env, st, err)...)
	}
	return append(out, e.step(env)...)
}

// LockNamespace gives the engine the lock namespace from a watch (a hint:
// it may trail the config service, never goes backwards).
func (e *Engine) LockNamespace(env Env, st *State) []any {
	e.setHint(st)
	return e.step(env)
}

func (e *Engine) setHint(st *State) {
	if st == nil || e.hint != nil && st.Version <= e.hint.Version {
		return
	}
	if st.Master != nil && (e.hint == nil || e.hint.Master == nil || e.hint.Master.Epoch != st.Master.Epoch) {
		// A new master: clerks waiting out a backoff dial it at once.
		for _, id := range e.order {
			e.clerks[id].dialAt, e.clerks[id].fails = time.Time{}, 0
		}
	}
	e.hint = st
}

// dial opens sessions for clerks that need one.
func (e *Engine) dialAll(env Env) []any {
	var out []any
	for _, id := range e.order {
		c := e.clerks[id]
		if !c.registered || c.dead || c.sess != 0 || env.Now.Before(c.dialAt) {
			continue
		}
		if e.hint == nil || e.hint.Master == nil || e.hintStale {
			if e.reading == 0 {
				e.reading = e.id()
				out = append(out, ReadLock{e.reading})
			}
			continue // dial once the read is back
		}
		rec := *e.hint.Master
		c.sess, c.sessEpoch, c.welcomed = e.id(), rec.Epoch, false
		h := c.core.Connect(rec.Epoch)
		for dead, r := range c.runs {
			h.Recovering[dead] = r.token
		}
		out = append(out, Dial{Session: c.sess, Clerk: id, Master: rec}, SessionSend{c.sess, h})
		// A renewal waiting to be sent again cannot be answered by a newer
		// master (its Welcome cancels the run): it fails now rather than
		// wait for that Welcome, which may be long in coming. After the
		// Dial and the Hello, which lists the run: a driver may report the
		// run's end (RecoveryFinished: a RecoveryDone on c.sess) as soon
		// as it carries the failure out, and that report must follow the
		// Hello on a session that exists. (Carried out before them, in the
		// simulator, the report went to a session not dialled yet and was
		// lost; the new master, which adopted the run from the Hello,
		// waited for it forever, and every "all" recovery behind it: seed
		// 555053, diagnosed by outside review 64.)
		for _, dead := range sortedRunKeys(c.runs) {
			if r := c.runs[dead]; r.renewing && r.resend && r.epoch < rec.Epoch {
				out = append(out, r.renewalFailed("a newer lock master took over"))
			}
		}
	}
	return out
}

// hangUpStale closes sessions to a master older than the hinted one (the old
// stream may stay up through a partition).
func (e *Engine) hangUpStale(env Env) []any {
	if e.hint == nil || e.hint.Master == nil {
		return nil
	}
	var out []any
	for _, id := range e.order {
		c := e.clerks[id]
		if c.sess != 0 && c.sessEpoch < e.hint.Master.Epoch {
			out = append(out, HangUp{c.sess})
			out = append(out, e.sessionEnded(env, c)...)
		}
	}
	return out
}

func (e *Engine) sessionEnded(env Env, c *clerkRun) []any {
	c.core.Disconnected()
	if !c.welcomed {
		c.fails++
		e.hintStale = true // the hint led nowhere: read the namespace
	}
	c.sess, c.welcomed, c.goodbyeSent = 0, false, false
	c.dialAt = env.Now.Add(backoff(c.fails, c.core.ID().salt()))
	// A renewal whose answer can no longer come is sent again on the next
	// session, instead of failing the run (a session break would otherwise
	// cost a whole recovery, which may be large). The master may have
	// renewed the run's token already: the next Hello reports the old one,
	// which the master then takes back (nothing was written under the new
	// one), and the renewal sent again under it gets a token above both.
	// The run keeps its assignment meanwhile (the master does not reassign
	// a run because its clerk's session broke); the run's function waits,
	// as long as its context lets it.
	for _, r := range c.runs {
		if r.renewing {
			r.resend = true
		}
	}
	return nil
}

// SessionClosed reports that a clerk's session broke (or never opened).
func (e *Engine) SessionClosed(env Env, session uint64) []any {
	for _, id := range e.order {
		if c := e.clerks[id]; c.sess == session {
			out := e.sessionEnded(env, c)
			return append(out, e.step(env)...)
		}
	}
	return nil
}

// SessionRecv delivers a master message on a clerk's session.
func (e *Engine) SessionRecv(env Env, session uint64, msg any) []any {
	var id ClerkID
	var c *clerkRun
	for _, x := range e.order {
		if e.clerks[x].sess == session {
			id, c = x, e.clerks[x]
		}
	}
	if c == nil || e.fenced {
		return []any{HangUp{session}}
	}
	if !env.Alive {
		// A clerk applies nothing once its node is not alive.
		return append([]any{HangUp{session}}, e.sessionEnded(env, c)...)
	}
	switch x := msg.(type) {
	case Reject:
		out := []any{HangUp{session}}
		if c.closing {
			// Told it is gone (its Goodbye was taken) or unknown: the
			// namespace decides when it is closed; look at it afresh.
			e.hintStale = true
			return append(out, e.sessionEnded(env, c)...)
		}
		if x.Dead {
			return append(out, e.clerkDied(id, c, fmt.Errorf("%w: %s", ErrDeadClerk, x.Reason))...)
		}
		c.welcomed = false
		out = append(out, e.sessionEnded(env, c)...)
		return append(out, Note{levelInfo, "lock master refused a clerk session", []any{"clerk", id, "reason", x.Reason}})
	case Welcome:
		if x.Epoch != c.sessEpoch {
			return nil
		}
		c.welcomed, c.fails = true, 0
		var out []any
		// Runs an older master asked for are over for this one: stop them
		// (they report their end; the master waits for it before running
		// the recovery again).
		for _, r := range c.runs {
			if r.epoch < c.sessEpoch {
				out = append(out, r.cancel()...)
			}
		}
		out = append(out, e.clerkOut(env, id, c, c.core.Handle(msg))...)
		// Renewals whose session broke go out again (the Hello, sent
		// before, reported the token they are under).
		for _, dead := range sortedRunKeys(c.runs) {
			if r := c.runs[dead]; r.renewing && r.resend && r.epoch == c.sessEpoch {
				r.resend = false
				out = append(out, e.clerkOut(env, id, c, c.core.RenewRecovery(dead, r.token))...)
			}
		}
		return append(out, e.closeStep(id, c)...)
	}
	return e.clerkOut(env, id, c, c.core.Handle(msg))
}

// CloseClerk starts closing a clerk (ClerkRT.Close): it fails its waiters,
// gives its cached leases back, cancels its recovery runs, and says Goodbye to the
// master once its runs have reported their ends; ClerkClosed follows when
// the clerk's record is gone from the lock namespace. It refuses while a
// local holder still holds a lock (ErrStillHeld).
func (e *Engine) CloseClerk(env Env, id ClerkID) ([]any, error) {
	c := e.clerks[id]
	switch {
	case c == nil:
		return nil, ErrUnregistered
	case e.fenced || c.dead:
		return nil, nil // gone already: LeasesLost said so
	case c.closing:
		return nil, nil
	}
	failed, releases, err := c.core.Close()
	if err != nil {
		return nil, err
	}
	c.closing = true
	out := e.clerkOut(env, id, c, releases)
	if len(failed) > 0 {
		out = append(out, Wake{failed})
	}
	// The runs' cancellations after step's: step may dial the clerk's
	// next session with a Hello that lists a run whose renewal the
	// cancellation fails, and a driver may report that run's end on the
	// session as soon as it carries the failure out (as in dialAll;
	// outside review 65).
	out = append(out, e.step(env)...)
	for _, dead := range sortedRunKeys(c.runs) {
		out = append(out, c.runs[dead].cancel()...)
	}
	return out, nil
}

// Closing reports whether clerk id is closing (a closed clerk is unknown).
func (e *Engine) Closing(id ClerkID) bool {
	c := e.clerks[id]
	return c != nil && c.closing
}

// closeStep moves a closing clerk on: Goodbye on a welcomed session once no
// run of it is going; done once a namespace that had its registration no
// longer lists it.
func (e *Engine) closeStep(id ClerkID, c *clerkRun) []any {
	if !c.closing {
		return nil
	}
	if c.registered && e.hint != nil && e.hint.Version >= c.regVersion && !e.hint.hasClerk(id) {
		var out []any
		if c.sess != 0 {
			out = append(out, HangUp{c.sess})
			c.sess = 0
		}
		delete(e.clerks, id)
		for i, x := range e.order {
			if x == id {
				e.order = append(e.order[:i], e.order[i+1:]...)
				break
			}
		}
		return append(out, ClerkClosed{id})
	}
	if c.welcomed && !c.goodbyeSent && len(c.runs) == 0 {
		c.goodbyeSent = true
		return []any{SessionSend{c.sess, Goodbye{}}}
	}
	return nil
}

// clerkDied: the master says this clerk's incarnation was declared dead.
// The failure detector's invariant says the node fenced itself first, so
// this cannot happen to a live node; if it does, every lease goes at once.
func (e *Engine) clerkDied(id ClerkID, c *clerkRun, why error) []any {
	if c.dead {
		return nil
	}
	c.dead = true
	var out []any
	if failed := c.core.Fence(); len(failed) > 0 {
		out = append(out, Wake{failed})
	}
	for _, r := range c.runs {
		out = append(out, r.cancel()...)
	}
	if c.sess != 0 {
		out = append(out, HangUp{c.sess})
		c.sess = 0
	}
	return append(out, LeasesLost{Clerk: id, Reason: why},
		Note{levelError, "the lock master declared this clerk dead; dropping its leases", []any{"clerk", id, "reason", why}})
}

// Fence ends the incarnation: every clerk drops its leases and fails its
// waiters, every run is cancelled, every session closes, and the master
// stops. Nothing works afterwards. why is what holders are told
// (ErrFenced for the node's self-fence, ErrShutdown for a graceful stop).
func (e *Engine) Fence(env Env, why error) []any {
	if e.fenced {
		return nil
	}
	e.fenced = true
	var out []any
	for _, id := range e.order {
		c := e.clerks[id]
		if failed := c.core.Fence(); len(failed) > 0 {
			out = append(out, Wake{failed})
		}
		for _, r := range c.runs {
			out = append(out, r.cancel()...)
		}
		if c.sess != 0 {
			out = append(out, HangUp{c.sess})
			c.sess = 0
		}
		out = append(out, LeasesLost{Clerk: id, Reason: why})
	}
	return append(out, e.halt(why.Error())...)
}

// ---------------------------------------------------------------- ticks

// Tick drives retries, the standby and the master's polls; call it every
// few tens of milliseconds.
func (e *Engine) Tick(env Env) []any {
	return e.step(env)
}

// step re-evaluates everything after an input.
func (e *Engine) step(env Env) []any {
	if e.fenced {
		return nil
	}
	var out []any
	if !env.Alive {
		out = append(out, e.halt("node not alive")...)
		for _, id := range e.order {
			if c := e.clerks[id]; c.sess != 0 {
				out = append(out, HangUp{c.sess})
				out = append(out, e.sessionEnded(env, c)...)
			}
		}
		return out
	}
	for _, id := range e.order {
		c := e.clerks[id]
		if !c.registered && c.registering == 0 && !env.Now.Before(c.regRetry) {
			out = append(out, e.register(id, c)...)
		}
	}
	out = append(out, e.hangUpStale(env)...)
	out = append(out, e.dialAll(env)...)
	for _, id := range append([]ClerkID(nil), e.order...) {
		out = append(out, e.closeStep(id, e.clerks[id])...)
	}
	out = append(out, e.standbyTick(env)...)
	out = append(out, e.masterTick(env)...)
	return out
}

// ---------------------------------------------------------------- standby

type sbState uint8

const (
	sbIdle sbState = iota
	sbQuerying
	sbReading
	sbConfirming
	sbProposing
)

// standby watches the master record and takes over, by a decree conditional
// on the version it read, when the failure detector declares the named
// master dead (or there is none, or it names this incarnation whose master
// stopped).
type standby struct {
	state sbState
	id    uint64 // the effect in flight
	last  time.Time
	read  *State        // the read the takeover is conditional on
	rec   *MasterRecord // the record being checked
}

func (e *Engine) self(r *MasterRecord) bool {
	return r != nil && r.Node == e.cfg.Node && r.Inc == e.cfg.Inc
}

func (e *Engine) standbyTick(env Env) []any {
	if !e.cfg.Candidate || e.m != nil {
		e.sb.state = sbIdle
		return nil
	}
	if e.sb.state != sbIdle || env.Now.Sub(e.sb.last) < e.cfg.Tick {
		return nil
	}
	e.sb.last = env.Now
	if e.hint == nil || e.hint.Master == nil || e.self(e.hint.Master) {
		return e.sbRead()
	}
	rec := *e.hint.Master
	e.sb.state, e.sb.id, e.sb.rec = sbQuerying, e.id(), &rec
	return []any{QueryFD{ID: e.sb.id, Subjects: []Subject{{rec.Node, rec.Inc}}}}
}

func (e *Engine) sbRead() []any {
	e.sb.state, e.sb.id = sbReading, e.id()
	return []any{ReadLock{e.sb.id}}
}

func (e *Engine) standbyRead(env Env, st *State, err error) []any {
	if err != nil {
		e.sb.state = sbIdle
		return nil
	}
	switch {
	case st.Master == nil || e.self(st.Master):
		return e.propose(st)
	case e.sb.rec != nil && *st.Master == *e.sb.rec:
		return e.propose(st) // the master found dead is still the recorded one
	}
	// Another master is recorded now: is it dead too?
	rec := *st.Master
	e.sb.state, e.sb.id, e.sb.rec, e.sb.read = sbConfirming, e.id(), &rec, st
	return []any{QueryFD{ID: e.sb.id, Subjects: []Subject{{rec.Node, rec.Inc}}}}
}

func (e *Engine) propose(st *State) []any {
	epoch := Epoch(1)
	if st.Master != nil {
		epoch = st.Master.Epoch + 1
	}
	rec := MasterRecord{Node: e.cfg.Node, Inc: e.cfg.Inc, Epoch: epoch, Addr: e.cfg.Addr}
	e.sb.state, e.sb.id, e.sb.read, e.sb.rec = sbProposing, e.id(), st, &rec
	return []any{Propose{ID: e.sb.id, Decree: takeoverDecree(st.Version, rec)}}
}

// Proposed reports the outcome of a Propose (the standby's takeover).
func (e *Engine) Proposed(env Env, id uint64, version uint64, err error) []any {
	if e.sb.state != sbProposing || e.sb.id != id {
		return nil
	}
	e.sb.state = sbIdle
	if err != nil || e.fenced || !env.Alive {
		// A stale version: someone moved first. A timeout: the decree may
		// still commit; then the record names this incarnation without a
		// running master and the next tick takes over again.
		if err != nil && !errors.Is(err, meta.ErrStaleVersion) {
			return []any{Note{levelWarn, "lock standby: takeover decree failed; retrying", []any{"err", err}}}
		}
		return nil
	}
	st, rec := e.sb.read, *e.sb.rec
	// The decree was conditional on st: the clerk list and the recovery
	// records in st are exactly those at the moment this master took over.
	e.m = &masterRun{core: NewMaster(rec.Epoch, st.Clerks, st.Records), rec: rec, version: version,
		sessions: map[uint64]ClerkID{}, byClerk: map[ClerkID]uint64{}}
	e.m.core.unsafeFreeBeforeForget = e.cfg.UnsafeFreeBeforeForget
	e.m.core.unsafeReassignOnDisconnect = e.cfg.UnsafeReassignOnDisconnect
	e.m.core.unsafeOverlappingRuns = e.cfg.UnsafeOverlappingRuns
	e.m.core.unsafeIgnoreUnsettled = e.cfg.UnsafeIgnoreUnsettled
	out := []any{Note{levelInfo, "lock master takes over", []any{"epoch", rec.Epoch, "clerks", len(st.Clerks), "recoveries", len(st.Records), "version", version}}}
	return append(out, e.step(env)...)
}

// FDAnswer reports a failure-detector query (dead[i] answers subject i).
func (e *Engine) FDAnswer(env Env, id uint64, dead []bool, err error) []any {
	switch {
	case e.sb.id == id && (e.sb.state == sbQuerying || e.sb.state == sbConfirming):
		if err != nil || len(dead) != 1 || !dead[0] || !env.Alive {
			e.sb.state = sbIdle
			return nil
		}
		if e.sb.state == sbConfirming {
			return e.propose(e.sb.read)
		}
		return e.sbRead()
	case e.m != nil && e.m.query == id:
		return e.verdicts(env, dead, err)
	}
	return nil
}

// ---------------------------------------------------------------- master

// masterRun runs a Master core for one epoch.
type masterRun struct {
	core    *Master
	rec     MasterRecord
	version uint64 // the namespace version the takeover produced
	seen    uint64 // the newest namespace version looked at
	// forgotAt is the version the newest Forget decree produced: a hint
	// older than it may still list the forgotten clerk (a watch or read
	// already under way), which the core would take for a live clerk that
	// has not reported (a closed clerk never will: the master would wait
	// for it forever). Such hints are skipped; a clerk registered in them
	// is listed again by every later version.
	forgotAt uint64
	sessions map[uint64]ClerkID // accepted session → clerk
	byClerk  map[ClerkID]uint64 // clerk → its current session
	// decrees are the config-service writes the core asked for, in order;
	// one is in flight at a time (decree), retried until it lands.
	decrees  []decreeReq
	decree   uint64
	retryAt  time.Time
	fails    int
	query    uint64 // the suspects query in flight
	suspects []ClerkID
	asked    []Subject // the query's subjects (suspects' node incarnations)
	rotate   int       // where the next capped round of suspects starts
	lastTick time.Time
}

type decreeReq struct {
	persist *RecoveryRecord
	forget  *ClerkID
}

// Master returns the running master's core (nil if none), for views.
func (e *Engine) Master() (*Master, MasterRecord) {
	if e.m == nil {
		return nil, MasterRecord{}
	}
	return e.m.core, e.m.rec
}

func (e *Engine) halt(why string) []any {
	if e.m == nil {
		return nil
	}
	m := e.m
	e.m = nil
	out := []any{Note{levelWarn, "lock master stops", []any{"epoch", m.rec.Epoch, "why", why}}}
	sessions := make([]uint64, 0, len(m.sessions))
	for s := range m.sessions {
		sessions = append(sessions, s)
	}
	sort.Slice(sessions, func(i, j int) bool { return sessions[i] < sessions[j] })
	for _, s := range sessions {
		out = append(out, ClerkClose{s})
	}
	return out
}

// Accept handles a clerk opening a session with this node's master.
func (e *Engine) Accept(env Env, session uint64, h Hello) []any {
	if e.m == nil || e.fenced || !env.Alive {
		return []any{ClerkSend{session, Reject{Reason: "this node is not the lock master"}}, ClerkClose{session}}
	}
	m := e.m
	var out []any
	if old, ok := m.byClerk[h.Clerk]; ok {
		delete(m.sessions, old)
		out = append(out, ClerkClose{old})
	}
	m.sessions[session] = h.Clerk
	m.byClerk[h.Clerk] = session
	return append(out, e.masterOut(env, m.core.Hello(h))...)
}

// MasterRecv delivers a clerk message on an accepted session.
func (e *Engine) MasterRecv(env Env, session uint64, msg any) []any {
	if e.m == nil || !env.Alive {
		return append([]any{ClerkClose{session}}, e.step(env)...)
	}
	m := e.m
	id, ok := m.sessions[session]
	if !ok || m.byClerk[id] != session {
		return []any{ClerkClose{session}}
	}
	return e.masterOut(env, m.core.Handle(id, msg))
}

// MasterClosed reports that an accepted session broke.
func (e *Engine) MasterClosed(env Env, session uint64) []any {
	if e.m == nil {
		return nil
	}
	m := e.m
	id, ok := m.sessions[session]
	if !ok {
		return nil
	}
	delete(m.sessions, session)
	if m.byClerk[id] != session {
		return nil
	}
	delete(m.byClerk, id)
	if !env.Alive {
		return e.step(env)
	}
	return e.masterOut(env, m.core.Disconnected(id))
}

// masterOut carries out a master core's outputs.
func (e *Engine) masterOut(env Env, out []any) []any {
	m := e.m
	var fx []any
	for _, o := range out {
		switch x := o.(type) {
		case Send:
			if s, ok := m.byClerk[x.To]; ok {
				fx = append(fx, ClerkSend{s, x.Msg})
			}
		case Drop:
			if s, ok := m.byClerk[x.Clerk]; ok {
				delete(m.byClerk, x.Clerk)
				delete(m.sessions, s)
				fx = append(fx, ClerkClose{s})
			}
		case Persist:
			r := x.Record
			m.decrees = append(m.decrees, decreeReq{persist: &r})
		case Forget:
			d := x.Clerk
			m.decrees = append(m.decrees, decreeReq{forget: &d})
		case Anomaly:
			fx = append(fx, Note{levelError, "lock master: " + x.Text, nil})
		}
	}
	if len(m.decrees) > e.cfg.MaxDecreeQueue {
		return append(fx, e.halt("config-service writes are not keeping up")...)
	}
	return append(fx, e.nextDecree(env)...)
}

// nextDecree sends the head of the decree queue if nothing is in flight.
func (e *Engine) nextDecree(env Env) []any {
	m := e.m
	if m == nil || m.decree != 0 || len(m.decrees) == 0 || env.Now.Before(m.retryAt) {
		return nil
	}
	d := m.decrees[0]
	epoch := m.rec.Epoch
	m.decree = e.id()
	if d.persist != nil {
		r := *d.persist
		return []any{Update{ID: m.decree, Origin: "lock-master", Build: func(ns *pb.Namespace) ([]*pb.Op, error) { return persistOps(ns, epoch, r) }}}
	}
	dead := *d.forget
	return []any{Update{ID: m.decree, Origin: "lock-master", Build: func(ns *pb.Namespace) ([]*pb.Op, error) { return forgetOps(ns, epoch, dead) }}}
}

func (e *Engine) decreeDone(env Env, version uint64, err error) []any {
	m := e.m
	m.decree = 0
	if errors.Is(err, errSuperseded) {
		return e.halt("a newer master took over")
	}
	if errors.Is(err, meta.ErrBadDecree) {
		// It can never commit, and everything queued behind it would wait
		// forever: stop; a successor recovers from what is recorded.
		return append([]any{Note{levelError, "lock master: a config write was refused as malformed", []any{"err", err}}},
			e.halt("a config write can never commit")...)
	}
	if err != nil {
		m.fails++
		m.retryAt = env.Now.Add(backoff(m.fails, e.cfg.Node<<32^e.cfg.Inc))
		return []any{Note{levelWarn, "lock master: config write failed; retrying", []any{"err", err}}}
	}
	m.fails = 0
	d := m.decrees[0]
	m.decrees = m.decrees[1:]
	var out []any
	if d.forget != nil {
		m.forgotAt = max(m.forgotAt, version)
		out = e.masterOut(env, m.core.Forgotten(*d.forget))
	} else {
		out = e.masterOut(env, m.core.Persisted(d.persist.Dead))
	}
	if e.m == m {
		out = append(out, e.nextDecree(env)...)
	}
	return out
}

// masterTick: the master asks about suspects, follows the namespace, and
// retries its writes.
func (e *Engine) masterTick(env Env) []any {
	m := e.m
	if m == nil {
		return nil
	}
	if h := e.hint; h != nil && h.Version > m.version && (h.Master == nil || h.Master.Epoch != m.rec.Epoch) {
		return e.halt("a newer master took over")
	}
	var out []any
	if h := e.hint; h != nil && h.Version > max(m.version, m.seen) && h.Version >= m.forgotAt {
		m.seen = h.Version
		for _, ci := range h.Clerks {
			out = append(out, e.masterOut(env, m.core.ClerkRegistered(ci))...)
			if e.m != m {
				return out
			}
		}
	}
	out = append(out, e.nextDecree(env)...)
	if m.query != 0 || env.Now.Sub(m.lastTick) < e.cfg.Tick {
		return out
	}
	m.lastTick = env.Now
	all := m.core.Tick()
	out = append(out, e.masterOut(env, m.core.Pending())...)
	if e.m != m || len(all) == 0 {
		return out
	}
	// One question per node incarnation, however many clerks it has; at
	// most MaxSuspects per tick, starting where the last tick stopped, so
	// that suspects that never die cannot starve the others.
	var subjects []Subject
	seen := map[Subject]bool{}
	for _, c := range all {
		if x := (Subject{c.Node, c.Inc}); !seen[x] {
			seen[x] = true
			subjects = append(subjects, x)
		}
	}
	if len(subjects) > MaxSuspects {
		start := m.rotate % len(subjects)
		subjects = append(subjects[start:], subjects[:start]...)[:MaxSuspects]
		m.rotate += MaxSuspects
	}
	chosen := map[Subject]bool{}
	for _, x := range subjects {
		chosen[x] = true
	}
	m.suspects = m.suspects[:0]
	for _, c := range all {
		if chosen[Subject{c.Node, c.Inc}] {
			m.suspects = append(m.suspects, c)
		}
	}
	m.query = e.id()
	m.asked = subjects
	return append(out, QueryFD{ID: m.query, Subjects: subjects})
}

// MaxSuspects bounds the node incarnations a master asks about per tick (and
// so the verdicts, and the decrees they cause, per tick).
const MaxSuspects = 512

func (e *Engine) verdicts(env Env, dead []bool, err error) []any {
	m := e.m
	m.query = 0
	if err != nil || len(dead) != len(m.asked) || !env.Alive {
		return nil
	}
	isDead := map[Subject]bool{}
	for i, x := range m.asked {
		isDead[x] = dead[i]
	}
	var out []any
	for _, c := range m.suspects {
		if !isDead[Subject{c.Node, c.Inc}] {
			continue
		}
		out = append(out, Note{levelInfo, "clerk declared dead", []any{"clerk", c}})
		out = append(out, e.masterOut(env, m.core.Verdict(c, true))...)
		if e.m != m {
			break
		}
	}
	return out
}
