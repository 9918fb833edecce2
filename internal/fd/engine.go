package fd

import (
	"errors"
	"fmt"
	"time"
)

// Question names one node incarnation in a query.
type Question struct {
	Node NodeID
	Inc  Incarnation
}

// QueryID names one query in flight at an Engine (chosen by the caller).
type QueryID uint64

// Effects an Engine asks its driver to carry out, in the order returned.
type (
	// Send sends Bytes to node To's beacon address: a beacon to an
	// observer, or an echo to the subject's registered address (never to
	// the source address of the beacon, which a forger chooses).
	Send struct {
		To    NodeID
		Bytes []byte
	}
	// PersistTombstones writes the observer's verdicts durably (replacing
	// the previous file), then reports with TombstonesPersisted. At most
	// one is in flight.
	PersistTombstones struct {
		Tombstones map[NodeID]Incarnation
		Version    uint64
	}
	// Answer completes a Query: Dead[i] answers question i, or Err says
	// why this observer does not answer (the querier counts it "alive").
	Answer struct {
		Query QueryID
		Dead  []bool
		Heard []bool // the observer acknowledges that very incarnation
		Err   error
	}
	// SelfFence: incarnation Inc is over (its deadline passed). Every
	// lease-protected service of the node must stop before the driver goes
	// on with the next effect; the engine is already taking a new
	// incarnation.
	SelfFence struct {
		Inc Incarnation
		// Why, if the node gave the incarnation up itself (Resign):
		// empty when its deadline passed.
		Why string
	}
	// Started: incarnation Inc is persisted, registered and beaconing.
	Started struct{ Inc Incarnation }
	// Acknowledged: a majority of observers acknowledged incarnation Inc
	// for the first time: it is alive, and may act under its leases.
	// (Only for logs: Alive reads the clock; an incarnation declared dead
	// before it was ever acknowledged never acted.)
	Acknowledged struct{ Inc Incarnation }
	// ReadRegistered asks the config service (linearizably) for the
	// incarnation registered for this node; report with RegisteredRead.
	ReadRegistered struct{}
	// PersistIncarnation writes Inc as the node's last incarnation,
	// durably; report with IncarnationPersisted.
	PersistIncarnation struct{ Inc Incarnation }
	// Register records Inc in the config service's membership; report with
	// RegisterDone (ErrIncarnationTaken if a newer one is registered).
	Register struct{ Inc Incarnation }
)

// Engine errors.
var (
	ErrNotObserver = errors.New("fd: this node is not an observer")
	// ErrNoMajority: an observer whose own node is not in contact with a
	// majority of observers does not answer: its view may be the stale one.
	ErrNoMajority = errors.New("fd: this observer is not in contact with a majority of observers; it does not answer")
	// ErrVerdictNotDurable: the observer decided "dead" but could not make
	// the tombstone durable, so it does not say so (yet).
	ErrVerdictNotDurable = errors.New("fd: verdict could not be made durable")
	// ErrIncarnationTaken is what a driver's registration returns when the
	// config service holds this incarnation (registered by another life) or
	// a newer one.
	ErrIncarnationTaken = errors.New("fd: the config service has this incarnation or a newer one registered for this node")
	ErrBadSource        = errors.New("fd: datagram from an address that is not the named node's")
)

// EngineConfig configures one node's detector.
type EngineConfig struct {
	Config
	Self    NodeID
	Observe bool
	Keys    Keyring
	// Replacement: this node is a config-service member that lost its
	// state and was re-added. Its observer lost its tombstones with it, so
	// it acknowledges only incarnations registered after it started (the
	// others' earlier verdicts may name them).
	Replacement bool
	// Ungated makes the observer answer even when its own node is not in
	// recent contact with a majority. Only for tests that show why the gate
	// exists; never set in a real node.
	Ungated bool
}

// lifecycle is where the engine is in taking an incarnation.
type lifecycle uint8

const (
	lifeIdle        lifecycle = iota // Start not called yet
	lifeReading                      // ReadRegistered in flight
	lifePersisting                   // PersistIncarnation in flight
	lifeRegistering                  // Register in flight
	lifeRunning                      // the subject beacons
)

// Retry delays for the incarnation steps (the config service or the disk may
// be down for a while; the node stays down until they are back).
const (
	minRetry = 200 * time.Millisecond
	maxRetry = time.Second
)

// Engine is one node's failure detector: the subject of its current
// incarnation, its observer (if it observes), the steps that take a new
// incarnation (read the registered one, persist the next, register it, only
// then beacon), the persistence of verdicts, and the answers to queries.
// Not safe for concurrent use; every method returns the effects the driver
// must carry out, in order.
type Engine struct {
	cfg  EngineConfig
	subj *Subject  // the running incarnation (nil unless lifeRunning)
	obs  *Observer // nil unless cfg.Observe

	life       lifecycle
	lastInc    Incarnation // the highest incarnation persisted on this node
	next       Incarnation // the incarnation being persisted or registered
	retryAt    time.Time   // zero: no step waits for a retry
	retryDelay time.Duration

	membership uint64 // version of the membership last applied

	persisting       bool   // a PersistTombstones is in flight
	persistedVersion uint64 // every condemnation up to it is durable
	pending          []*pendingQuery
}

type pendingQuery struct {
	id    QueryID
	dead  []bool
	heard []bool
	need  uint64 // the observer version that must be durable first
}

// NewEngine returns an engine that has persisted incarnations up to lastInc
// and tombstones (from its disk). Call Start to take the first incarnation.
func NewEngine(cfg EngineConfig, now time.Time, lastInc Incarnation, tombstones map[NodeID]Incarnation) (*Engine, error) {
	if err := cfg.Config.Validate(); err != nil {
		return nil, err
	}
	if err := cfg.Keys.Validate(); err != nil {
		return nil, err
	}
	if cfg.Self == 0 {
		return nil, errors.New("fd: zero node id")
	}
	e := &Engine{cfg: cfg, lastInc: lastInc}
	if cfg.Observe {
		e.obs = NewObserver(cfg.Self, cfg.GracePeriod, now, tombstones)
		e.obs.fresh = cfg.Replacement
	}
	return e, nil
}

// Start takes the first incarnation.
func (e *Engine) Start(now time.Time) []any {
	if e.life != lifeIdle {
		return nil
	}
	return e.read()
}

func (e *Engine) read() []any {
	e.life, e.retryAt = lifeReading, time.Time{}
	return []any{ReadRegistered{}}
}

func (e *Engine) retry(now time.Time) {
	if e.retryDelay == 0 {
		e.retryDelay = minRetry
	} else if e.retryDelay *= 2; e.retryDelay > maxRetry {
		e.retryDelay = maxRetry
	}
	e.retryAt = now.Add(e.retryDelay)
}

// RegisteredRead reports the incarnation the config service has registered
// for this node (0 if none).
func (e *Engine) RegisteredRead(now time.Time, registered Incarnation, err error) []any {
	if e.life != lifeReading || !e.retryAt.IsZero() {
		return nil
	}
	if err != nil {
		e.retry(now)
		return nil
	}
	// Above anything this disk or the cluster has seen: a node whose data
	// directory was lost must not reuse an incarnation (or a clerk id).
	e.next = max(e.lastInc, registered) + 1
	e.life = lifePersisting
	return []any{PersistIncarnation{Inc: e.next}}
}

// IncarnationPersisted reports the outcome of PersistIncarnation.
func (e *Engine) IncarnationPersisted(now time.Time, inc Incarnation, err error) []any {
	if e.life != lifePersisting || inc != e.next || !e.retryAt.IsZero() {
		return nil
	}
	if err != nil {
		// Without a persisted incarnation the node must not come back.
		e.retry(now)
		return nil
	}
	e.lastInc = max(e.lastInc, inc)
	e.life = lifeRegistering
	return []any{Register{Inc: inc}}
}

// RegisterDone reports the outcome of Register.
func (e *Engine) RegisterDone(now time.Time, inc Incarnation, err error) []any {
	if e.life != lifeRegistering || inc != e.next || !e.retryAt.IsZero() {
		return nil
	}
	switch {
	case errors.Is(err, ErrIncarnationTaken):
		return e.read() // another life registered it or a newer one: start over above it
	case err != nil:
		e.retry(now)
		return nil
	}
	e.life, e.retryDelay = lifeRunning, 0
	e.subj = NewSubject(e.cfg.Config, e.cfg.Self, inc, now)
	return append([]any{Started{Inc: inc}}, e.tickSubject(now)...)
}

// Resign ends incarnation inc now, as if its deadline had passed: the
// node fences itself (every role stops) and starts a new incarnation once
// this one is declared dead, so that the lock service recovers what the old
// one held. For a role that cannot go on and cannot give its leases back
// (a B-tree server whose log failed). Nothing if inc is not running.
func (e *Engine) Resign(now time.Time, inc Incarnation, why string) []any {
	if e.life != lifeRunning || e.subj == nil || e.subj.Incarnation() != inc {
		return nil
	}
	e.subj = nil
	return append([]any{SelfFence{Inc: inc, Why: why}}, e.read()...)
}

// Tick drives beacons, the self-fence and retries; call it at least every
// Interval/4.
func (e *Engine) Tick(now time.Time) []any {
	if !e.retryAt.IsZero() && !now.Before(e.retryAt) {
		e.retryAt = time.Time{}
		switch e.life {
		case lifeReading:
			return []any{ReadRegistered{}}
		case lifePersisting:
			return []any{PersistIncarnation{Inc: e.next}}
		case lifeRegistering:
			return []any{Register{Inc: e.next}}
		}
	}
	if e.life != lifeRunning {
		return nil
	}
	return e.tickSubject(now)
}

func (e *Engine) tickSubject(now time.Time) []any {
	b, send, fenced := e.subj.Tick(now)
	if fenced {
		inc := e.subj.Incarnation()
		e.subj = nil
		return append([]any{SelfFence{Inc: inc}}, e.read()...)
	}
	if !send {
		return nil
	}
	buf := b.Seal(nil, e.cfg.Keys.Sign)
	out := make([]any, 0, len(e.cfg.Observers))
	for _, o := range e.cfg.Observers {
		out = append(out, Send{To: o, Bytes: buf})
	}
	return out
}

// Receive handles a datagram received at local time now from the node the
// driver found at its source address (0 if the address is no node's).
func (e *Engine) Receive(now time.Time, from NodeID, b []byte) ([]any, error) {
	p, err := Open(b, e.cfg.Keys)
	if err != nil {
		return nil, err
	}
	switch p.Kind {
	case KindBeacon:
		if e.obs == nil {
			return nil, ErrNotObserver
		}
		if from != p.Subject {
			return nil, fmt.Errorf("%w: beacon of node %d from node %d's address", ErrBadSource, p.Subject, from)
		}
		echo, err := e.obs.Beacon(now, p)
		if err != nil {
			return nil, err
		}
		return []any{Send{To: p.Subject, Bytes: echo.Seal(nil, e.cfg.Keys.Sign)}}, nil
	case KindEcho:
		if from != p.Observer {
			return nil, fmt.Errorf("%w: echo of observer %d from node %d's address", ErrBadSource, p.Observer, from)
		}
		if e.subj == nil {
			return nil, ErrNotMine
		}
		joining := e.subj.Phase(now) == Joining
		if err := e.subj.Echo(now, p); err != nil {
			return nil, err
		}
		if joining && e.subj.Phase(now) == Alive {
			return []any{Acknowledged{Inc: e.subj.Incarnation()}}, nil
		}
		return nil, nil
	}
	return nil, ErrBadKind
}

// SetRegistered gives the observer the cluster's registered incarnations as
// of membership version (the config-service namespace version); an older
// version than one already applied is ignored.
func (e *Engine) SetRegistered(now time.Time, version uint64, regs map[NodeID]Incarnation) {
	if version <= e.membership {
		return
	}
	e.membership = version
	if e.obs != nil {
		e.obs.SetRegistered(now, regs)
	}
}

// MembershipVersion is the version of the membership SetRegistered last
// took (0: none yet).
func (e *Engine) MembershipVersion() uint64 { return e.membership }

// Query asks this observer about node incarnations. The Answer comes at once
// unless a new verdict must first be made durable.
func (e *Engine) Query(now time.Time, id QueryID, qs []Question) []any {
	if e.obs == nil {
		return []any{Answer{Query: id, Err: ErrNotObserver}}
	}
	var contact, since time.Time
	ok := false
	if e.subj != nil {
		contact, since, ok = e.subj.Contact(now)
	}
	if e.cfg.Ungated {
		contact, since, ok = now, time.Time{}, true
	}
	if !ok {
		return []any{Answer{Query: id, Err: ErrNoMajority}}
	}
	dead, heard := make([]bool, len(qs)), make([]bool, len(qs))
	condemned := false
	for i, q := range qs {
		v := e.obs.QueryConnected(now, contact, since, q.Node, q.Inc)
		dead[i] = v == VerdictDead || v == VerdictCondemned
		heard[i] = !dead[i] && e.obs.Heard(now, q.Node, q.Inc)
		condemned = condemned || v == VerdictCondemned
	}
	if !condemned {
		return []any{Answer{Query: id, Dead: dead, Heard: heard}}
	}
	e.pending = append(e.pending, &pendingQuery{id: id, dead: dead, heard: heard, need: e.obs.Version()})
	return e.maybePersist()
}

// CancelQuery forgets a query whose caller gave up.
func (e *Engine) CancelQuery(id QueryID) {
	for i, p := range e.pending {
		if p.id == id {
			e.pending = append(e.pending[:i], e.pending[i+1:]...)
			return
		}
	}
}

func (e *Engine) maybePersist() []any {
	if e.persisting || len(e.pending) == 0 || e.obs.Version() <= e.persistedVersion {
		return nil
	}
	e.persisting = true
	t, v := e.obs.Tombstones()
	return []any{PersistTombstones{Tombstones: t, Version: v}}
}

// TombstonesPersisted reports the outcome of a PersistTombstones. Answers
// that waited for it leave now (or fail, if the write failed).
func (e *Engine) TombstonesPersisted(now time.Time, p PersistTombstones, err error) []any {
	e.persisting = false
	if err == nil {
		e.obs.Durable(p.Tombstones)
		e.persistedVersion = max(e.persistedVersion, p.Version)
	}
	var out []any
	keep := e.pending[:0]
	for _, q := range e.pending {
		switch {
		case err == nil && q.need <= e.persistedVersion:
			out = append(out, Answer{Query: q.id, Dead: q.dead, Heard: q.heard})
		case err != nil && q.need <= p.Version:
			out = append(out, Answer{Query: q.id, Err: fmt.Errorf("%w: %v", ErrVerdictNotDurable, err)})
		default:
			keep = append(keep, q)
		}
	}
	e.pending = keep
	return append(out, e.maybePersist()...)
}

// Alive reports whether the running incarnation may act under its leases at
// local time now.
func (e *Engine) Alive(now time.Time) bool { return e.subj != nil && e.subj.Alive(now) }

// AliveAs reports whether incarnation inc is the running one and alive at
// local time now: leases are bound to the incarnation that acquired them.
func (e *Engine) AliveAs(now time.Time, inc Incarnation) bool {
	return e.subj != nil && e.subj.Incarnation() == inc && e.subj.Alive(now)
}

// Deadline returns the local time until which incarnation inc is guaranteed
// to consider itself alive (no dead verdict on it can come before), if inc
// is the running incarnation and alive at now.
func (e *Engine) Deadline(now time.Time, inc Incarnation) (time.Time, bool) {
	if !e.AliveAs(now, inc) {
		return time.Time{}, false
	}
	return e.subj.Deadline()
}

// Incarnation is the running (or last started) incarnation and its phase at
// now; 0 and Fenced while none runs.
func (e *Engine) Incarnation(now time.Time) (Incarnation, Phase) {
	if e.subj == nil {
		return e.next, Fenced
	}
	return e.subj.Incarnation(), e.subj.Phase(now)
}

// Views returns the observer's view of every registered node (nil if not
// observing).
func (e *Engine) Views(now time.Time) []View {
	if e.obs == nil {
		return nil
	}
	return e.obs.Views(now)
}
