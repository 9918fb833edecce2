package lock

import (
	"errors"
	"sort"
)

// Clerk outputs.

// ToMaster sends Msg to the master over the clerk's session (if it has one;
// otherwise the state travels in the next Hello).
type ToMaster struct{ Msg any }

// RunRecovery asks the driver to run the recovery function of the clerk's
// kind for a dead clerk, then call RecoveryDone.
type RunRecovery struct{ Req Recover }

// Woken lists local waiters whose acquire is now granted.
type Woken struct{ Waiters []*Waiter }

// Revoking says that the master revoked a lease that local holders still
// hold: the revocation completes once they release. A holder that keeps a
// hold for long (a cache's pin on what it caches) gives it up on this
// notice, after writing back what the lease protects.
type Revoking struct{ Name string }

// Waiter is one local acquire. Granted is set when the holder may proceed;
// Failed when the clerk fenced first.
type Waiter struct {
	Name    string
	Mode    Mode
	Granted bool
	Failed  bool
}

// Clerk is the lock clerk's state machine: the leases this clerk caches and
// the local holders and waiters on them. Not safe for concurrent use.
//
// A cached lease is used without any message to the master. A revocation
// waits until local holders allow, then downgrades or releases. Local
// waiters are served in FIFO order per lock, and new local holders are not
// admitted past a pending revocation, so that it cannot starve.
type Clerk struct {
	id        ClerkID
	kind      string
	scope     []string // name prefixes it may lock (nil: any)
	epoch     Epoch
	connected bool // welcomed in the current session
	fenced    bool
	closed    bool // Close: holds, wants and uses nothing, ever again
	leases    map[string]*lease
	changes   uint64 // counts changes of granted modes (for observers)
	clock     uint64 // counts local acquires (lease.used)
}

// MaxCachedLeases bounds the locks one clerk keeps state for (held,
// wanted or waited on): its Hello must stay a bounded message. Past it, an
// acquire of a new name gives back the least recently used idle lease, or
// fails with ErrTooManyLeases.
const MaxCachedLeases = 16384

// ErrTooManyLeases: the clerk uses MaxCachedLeases locks at once.
var ErrTooManyLeases = errors.New("lock: this clerk holds or waits on too many locks at once")

// Room makes room for state about a new lock name if the clerk is at its
// bound: it gives back the least recently used idle lease (the Release to
// send), or reports that nothing can be given back.
func (c *Clerk) Room(name string) ([]any, error) {
	if _, ok := c.leases[name]; ok || len(c.leases) < MaxCachedLeases {
		return nil, nil
	}
	victim, oldest := "", uint64(0)
	for n, l := range c.leases {
		idle := l.granted != None && l.shared == 0 && !l.exclusive && len(l.waiters) == 0 && l.want == None && !l.revoking
		if idle && (victim == "" || l.used < oldest) {
			victim, oldest = n, l.used
		}
	}
	if victim == "" {
		return nil, ErrTooManyLeases
	}
	return c.Drop(victim), nil
}

type lease struct {
	used      uint64 // when it was last acquired locally (clerk.clock): for eviction
	granted   Mode
	token     Token // token of the newest grant received
	want      Mode  // asked of the master and not yet granted
	shared    int   // local shared holders
	exclusive bool  // a local exclusive holder
	revoking  bool
	keep      Mode
	waiters   []*Waiter
}

// NewClerk returns a clerk with no leases, which may lock the names that
// start with one of scope's prefixes (any name if scope is empty).
func NewClerk(id ClerkID, kind string, scope ...string) *Clerk {
	return &Clerk{id: id, kind: kind, scope: append([]string(nil), scope...), leases: map[string]*lease{}}
}

// ID and Kind identify the clerk; Scope is the name prefixes it may lock.
func (c *Clerk) ID() ClerkID     { return c.id }
func (c *Clerk) Kind() string    { return c.kind }
func (c *Clerk) Scope() []string { return append([]string(nil), c.scope...) }

// Fenced reports whether the clerk's node fenced itself.
func (c *Clerk) Fenced() bool { return c.fenced }

// Held returns the mode of the cached lease on name.
func (c *Clerk) Held(name string) Mode {
	if l := c.leases[name]; l != nil {
		return l.granted
	}
	return None
}

// Revoking reports whether a revocation of the lease on name waits for
// local holders.
func (c *Clerk) Revoking(name string) bool {
	l := c.leases[name]
	return l != nil && l.revoking
}

// Lease returns the mode and token of the cached lease on name.
func (c *Clerk) Lease(name string) (Mode, Token) {
	if l := c.leases[name]; l != nil {
		return l.granted, l.token
	}
	return None, Token{}
}

func (c *Clerk) lease(name string) *lease {
	l := c.leases[name]
	if l == nil {
		l = &lease{}
		c.leases[name] = l
	}
	return l
}

// Connect starts a session with the master of epoch e: it returns the Hello
// that reports everything the clerk holds and wants (the caller adds the
// recoveries it runs).
func (c *Clerk) Connect(e Epoch) Hello {
	c.epoch, c.connected = e, false
	h := Hello{Clerk: c.id, Kind: c.kind, Epoch: e, Held: map[string]Mode{}, Tokens: map[string]Token{}, Want: map[string]Mode{}, Recovering: map[ClerkID]Token{}}
	for name, l := range c.leases {
		if l.granted != None {
			h.Held[name] = l.granted
			h.Tokens[name] = l.token
		}
		if l.want > l.granted {
			h.Want[name] = l.want
		}
	}
	return h
}

// Disconnected notes that the session broke. Cached leases stay valid: the
// master keeps them held until this clerk reconnects or is declared dead.
func (c *Clerk) Disconnected() { c.connected = false }

// Connected reports whether the clerk has a welcomed session.
func (c *Clerk) Connected() bool { return c.connected }

// Epoch is the master epoch of the current (or last) session.
func (c *Clerk) Epoch() Epoch { return c.epoch }

// Acquire asks for name in mode for a local holder. If w.Granted, the holder
// proceeds at once (a cached lease: no message); otherwise it waits for a
// later Woken output.
func (c *Clerk) Acquire(name string, mode Mode) (*Waiter, []any) {
	w := &Waiter{Name: name, Mode: mode}
	if c.fenced || c.closed {
		w.Failed = true
		return w, nil
	}
	l := c.lease(name)
	c.clock++
	l.used = c.clock
	l.waiters = append(l.waiters, w)
	var out []any
	c.admit(name, l, &out)
	return w, out
}

// Release ends a local holder's use of a lock.
func (c *Clerk) Release(w *Waiter) ([]any, error) {
	if c.fenced {
		return nil, nil
	}
	l := c.leases[w.Name]
	if l == nil || !w.Granted {
		return nil, ErrNotHeld
	}
	switch w.Mode {
	case Exclusive:
		if !l.exclusive {
			return nil, ErrNotHeld
		}
		l.exclusive = false
	case Shared:
		if l.shared == 0 {
			return nil, ErrNotHeld
		}
		l.shared--
	}
	w.Granted = false
	var out []any
	c.admit(w.Name, l, &out)
	return out, nil
}

// Cancel abandons a local acquire that has not been granted (its caller gave
// up). A granted waiter must be released instead.
func (c *Clerk) Cancel(w *Waiter) []any {
	l := c.leases[w.Name]
	if l == nil || w.Granted {
		return nil
	}
	for i, x := range l.waiters {
		if x == w {
			l.waiters = append(l.waiters[:i], l.waiters[i+1:]...)
			break
		}
	}
	w.Failed = true
	var out []any
	// Withdraw a request to the master that no remaining local waiter
	// needs (admit asks again for what the first remaining one needs).
	need := None
	for _, x := range l.waiters {
		need = max(need, x.Mode)
	}
	if l.want > l.granted && need < l.want {
		l.want = None
		out = append(out, ToMaster{Withdraw{Name: w.Name}})
	}
	c.admit(w.Name, l, &out) // the next waiter may now be admissible
	return out
}

// Drop gives a cached lease back to the master if no local holder uses it
// (Boxwood leaves this optimisation out; Grove offers it for callers that
// know they are done with a lock, and for benchmarks).
func (c *Clerk) Drop(name string) []any {
	l := c.leases[name]
	if c.fenced || c.closed || l == nil || l.granted == None || l.shared > 0 || l.exclusive || len(l.waiters) > 0 {
		return nil
	}
	l.granted, l.revoking = None, false
	c.changes++
	out := []any{ToMaster{Release{Name: name, Mode: None, Token: l.token}}}
	c.gc(name, l)
	return out
}

// Close ends the clerk's use of the lock service: it fails its waiters,
// gives every cached lease back (out: releases for the master; the caller
// then says Goodbye, which settles anything still in flight) and forgets
// them. It refuses while a local holder still holds a lock: the holder's
// work must end (and be made durable) first.
func (c *Clerk) Close() (failed []*Waiter, out []any, err error) {
	if c.fenced || c.closed {
		return nil, nil, nil
	}
	names := make([]string, 0, len(c.leases))
	for n, l := range c.leases {
		if l.shared > 0 || l.exclusive {
			return nil, nil, ErrStillHeld
		}
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if l := c.leases[n]; l.granted != None {
			out = append(out, ToMaster{Release{Name: n, Mode: None, Token: l.token}})
		}
	}
	failed = c.Fence() // the same as a fence, locally: nothing held, every waiter failed
	c.fenced, c.closed = false, true
	return failed, out, nil
}

// Closed reports whether Close ran.
func (c *Clerk) Closed() bool { return c.closed }

// Handle applies a message from the master on the current session.
func (c *Clerk) Handle(msg any) []any {
	if c.fenced {
		return nil
	}
	if c.closed {
		// Until its Goodbye is taken, a closed clerk gives back what still
		// reaches it, so that nobody waits on it meanwhile (a revocation
		// needs nothing: its leases were released at Close).
		switch x := msg.(type) {
		case Welcome:
			if x.Epoch == c.epoch {
				c.connected = true
			}
		case Grant: // asked for before the close
			return []any{ToMaster{Release{Name: x.Name, Mode: None, Token: x.Token}}}
		case Recover: // the master gives the run to another clerk of the kind
			return []any{ToMaster{RecoveryDone{Dead: x.Dead, OK: false, Token: x.Token}}}
		}
		return nil
	}
	var out []any
	switch x := msg.(type) {
	case Welcome:
		if x.Epoch == c.epoch {
			c.connected = true
		}
	case Grant:
		l := c.lease(x.Name)
		if l.token.Less(x.Token) {
			l.token = x.Token
		}
		// A newer grant voids a revocation still pending here: the master
		// forgot it when it granted, and revokes again if it still must.
		l.revoking = false
		if x.Mode > l.granted {
			l.granted = x.Mode
			c.changes++
		}
		if l.granted >= l.want {
			l.want = None
		}
		c.admit(x.Name, l, &out)
	case Revoke:
		l := c.leases[x.Name]
		if l == nil || l.granted <= x.Keep {
			// Already at or below what the master wants (a release crossed
			// the revocation, or the name is unknown here): say so again,
			// harmlessly, without keeping state for it.
			if l == nil {
				out = append(out, ToMaster{Release{Name: x.Name, Mode: None}})
			} else {
				out = append(out, ToMaster{Release{Name: x.Name, Mode: l.granted, Token: l.token}})
			}
			break
		}
		if !l.revoking || x.Keep < l.keep {
			l.revoking, l.keep = true, x.Keep
		}
		c.admit(x.Name, l, &out)
		if l.revoking {
			out = append(out, Revoking{Name: x.Name})
		}
	case Recover:
		out = append(out, RunRecovery{x})
	case RecoveryRenewed:
		out = append(out, x) // the runtime's run waits for it
	}
	return out
}

// RenewRecovery asks the master for a newer token for the run of dead's
// recovery under token.
func (c *Clerk) RenewRecovery(dead ClerkID, token Token) []any {
	if c.fenced {
		return nil
	}
	return []any{ToMaster{RenewRecovery{Dead: dead, Token: token}}}
}

// RecoveryDone reports the end of a recovery run.
func (c *Clerk) RecoveryDone(dead ClerkID, ok bool, token Token) []any {
	if c.fenced { // a closing clerk still reports its runs' ends (before its Goodbye)
		return nil
	}
	return []any{ToMaster{RecoveryDone{Dead: dead, OK: ok, Token: token}}}
}

// Changes counts the changes of the clerk's granted modes so far.
func (c *Clerk) Changes() uint64 { return c.changes }

// Fence drops every lease and fails every waiter: the node fenced itself.
func (c *Clerk) Fence() []*Waiter {
	c.fenced = true
	c.changes++
	var failed []*Waiter
	names := make([]string, 0, len(c.leases))
	for n := range c.leases {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		for _, w := range c.leases[n].waiters {
			w.Failed = true
			failed = append(failed, w)
		}
	}
	c.leases = map[string]*lease{}
	return failed
}

// admit completes a pending revocation if local holders allow, grants local
// waiters in FIFO order while the lease and the local holders allow, and
// asks the master for more when the first waiter needs it.
func (c *Clerk) admit(name string, l *lease, out *[]any) {
	if l.revoking {
		ok := l.keep == Shared && !l.exclusive || l.keep == None && !l.exclusive && l.shared == 0
		if ok {
			l.granted, l.revoking = l.keep, false
			c.changes++
			*out = append(*out, ToMaster{Release{Name: name, Mode: l.keep, Token: l.token}})
		}
	}
	var woken []*Waiter
	for len(l.waiters) > 0 {
		w := l.waiters[0]
		allowed := l.granted
		if l.revoking && l.keep < allowed {
			allowed = l.keep
		}
		local := w.Mode == Shared && !l.exclusive || w.Mode == Exclusive && !l.exclusive && l.shared == 0
		if allowed < w.Mode || !local {
			if l.granted < w.Mode && l.want < w.Mode {
				l.want = w.Mode
				*out = append(*out, ToMaster{Acquire{Name: name, Mode: w.Mode}})
			}
			break
		}
		if w.Mode == Exclusive {
			l.exclusive = true
		} else {
			l.shared++
		}
		w.Granted = true
		woken = append(woken, w)
		l.waiters = l.waiters[1:]
	}
	if len(woken) > 0 {
		*out = append(*out, Woken{woken})
	}
	c.gc(name, l)
}

// gc drops the state of a lock the clerk neither holds, wants nor uses, so
// that a clerk's memory stays bounded by what it uses.
func (c *Clerk) gc(name string, l *lease) {
	if l.granted == None && l.want == None && !l.revoking && l.shared == 0 && !l.exclusive && len(l.waiters) == 0 {
		delete(c.leases, name)
	}
}
