// Package lock is Boxwood's lock service (§3.3): named multiple-reader /
// single-writer locks handed out as leases without timeouts ("degenerate
// leases"). Clerks cache leases until the master revokes them for a
// conflicting request; a clerk loses its leases only when the failure
// detector declares it dead, and then, if it registered a recovery kind, only
// after recovery has run on a live clerk of the same kind. One master and
// standbys; the master's identity and the clerk list live in the config
// service; a standby takes over by decree and rebuilds lease state from the
// live clerks before granting anything.
//
// Master and Clerk are protocol cores without I/O: messages in, messages and
// effects out. Each clerk talks to the master over one ordered session (a
// gRPC stream in the real system, sim.Session in the simulator); a session
// is bound to one master epoch, so nothing an old master sent can reach a
// clerk after it has reported to a newer one.
package lock

import (
	"errors"
	"fmt"
	"slices"
)

// Mode is a lease mode.
type Mode uint8

const (
	None      Mode = iota
	Shared         // many readers
	Exclusive      // one writer
)

func (m Mode) String() string {
	switch m {
	case None:
		return "none"
	case Shared:
		return "shared"
	case Exclusive:
		return "exclusive"
	}
	return fmt.Sprintf("mode(%d)", uint8(m))
}

// ParseMode reads "shared" or "exclusive".
func ParseMode(s string) (Mode, error) {
	switch s {
	case "shared":
		return Shared, nil
	case "exclusive":
		return Exclusive, nil
	}
	return None, fmt.Errorf("lock: unknown mode %q (want shared or exclusive)", s)
}

// Compatible reports whether two holders may hold these modes at once.
func Compatible(a, b Mode) bool { return a == None || b == None || (a == Shared && b == Shared) }

// MaxScopePrefixes bounds a clerk's scope.
const MaxScopePrefixes = 8

// MaxNameLen is the longest lock name, in bytes. Names are arbitrary bytes.
const MaxNameLen = 1024

// ClerkID names one clerk: the node it runs on, that node's incarnation (so
// that the failure detector's verdict on the node decides the clerk's fate),
// and a number distinguishing clerks of one node incarnation.
type ClerkID struct {
	Node uint64
	Inc  uint64
	Seq  uint32
}

func (c ClerkID) String() string { return fmt.Sprintf("%d.%d.%d", c.Node, c.Inc, c.Seq) }

// Less orders clerk ids (for deterministic choices).
func (c ClerkID) Less(o ClerkID) bool {
	if c.Node != o.Node {
		return c.Node < o.Node
	}
	if c.Inc != o.Inc {
		return c.Inc < o.Inc
	}
	return c.Seq < o.Seq
}

// Epoch numbers masters: each takeover decree increments it.
type Epoch uint64

// Token is a fencing token: every grant of a lock (and every recovery run)
// gets one, larger than every token of any earlier grant of that lock, across
// master failovers: the master's epoch first, then a counter of the master's
// grants. A storage server that a lease protects remembers the largest
// token it has accepted a write with, per lock name, and refuses a write
// that carries a smaller one (TokenGuard): a holder that was paused, or
// whose message was delayed, past the moment its lease moved on cannot
// overwrite what the next holder wrote.
type Token struct {
	Epoch Epoch
	Seq   uint64
}

// Less orders tokens.
func (t Token) Less(o Token) bool {
	if t.Epoch != o.Epoch {
		return t.Epoch < o.Epoch
	}
	return t.Seq < o.Seq
}

// IsZero reports whether t is the zero token (no grant).
func (t Token) IsZero() bool { return t == Token{} }

func (t Token) String() string { return fmt.Sprintf("%d.%d", t.Epoch, t.Seq) }

// Errors. They are values; each says what the caller should do.
var (
	ErrBadName      = fmt.Errorf("lock: name must be 1..%d bytes", MaxNameLen)
	ErrBadMode      = errors.New("lock: mode must be shared or exclusive")
	ErrOutOfScope   = errors.New("lock: the name is outside the clerk's scope (the name prefixes its kind declared)")
	ErrFenced       = errors.New("lock: this node fenced itself; its leases are gone (it comes back with a new incarnation and a new clerk)")
	ErrUnregistered = errors.New("lock: clerk is not registered with the lock service")
	ErrDeadClerk    = errors.New("lock: clerk was declared dead; it must not come back")
	ErrNotHeld      = errors.New("lock: release of a lock this holder does not hold")
	ErrClosed       = errors.New("lock: the clerk was closed")
	ErrStillHeld    = errors.New("lock: the clerk still has holders; release them before closing it")
	ErrNotAlive     = errors.New("lock: this node is not alive (yet): it is joining, or fenced")
	ErrShutdown     = errors.New("lock: this node is shutting down; its leases are released when the failure detector declares it dead")
)

// ValidName checks a lock name against the limits.
func ValidName(name string) error {
	if len(name) == 0 || len(name) > MaxNameLen {
		return ErrBadName
	}
	return nil
}

// Messages from clerk to master.

// Hello opens a session: the clerk's identity and everything it holds and
// wants, and the recoveries it is still running. The master replaces what it
// knew of the clerk with this report.
type Hello struct {
	Clerk      ClerkID
	Kind       string // recovery kind ("" = none)
	Epoch      Epoch  // the master epoch the clerk is talking to
	Held       map[string]Mode
	Tokens     map[string]Token // the token of the grant of each held lease
	Want       map[string]Mode
	Recovering map[ClerkID]Token // dead clerk → token of the run in progress
}

// Acquire asks for a lease in a mode.
type Acquire struct {
	Name string
	Mode Mode
}

// Release gives a lease up (Mode None) or downgrades it to Shared. Token is
// the token of the newest grant the clerk had received: a release that
// crossed a newer grant on the wire refers to an older one, and the master
// ignores it (otherwise it would free a lease the clerk now holds).
type Release struct {
	Name  string
	Mode  Mode // the mode the clerk keeps
	Token Token
}

// Withdraw takes back a clerk's pending Acquire of Name: its local waiters
// gave up before a grant (a caller's context ended). The master drops the
// clerk's place in the lock's queue; a grant it already sent crosses the
// withdrawal on the wire and the clerk caches it like any other lease.
// Without it, an abandoned request would be granted later to nobody (found
// by the operator-conventions review: Ctrl-C on `grove lock acquire`).
type Withdraw struct {
	Name string
}

// RecoveryDone reports the end of a recovery run for a dead clerk: OK if it
// succeeded, and the run's token (a report of an older run, from before a
// failover, must not complete the current one).
type RecoveryDone struct {
	Dead  ClerkID
	OK    bool
	Token Token
}

// RenewRecovery asks for a newer token for the clerk's run of Dead's
// recovery, whose current token is Token. A run needs one when a write it
// made may still land later (its answer was lost and it was sent again):
// once the run ends, the dead clerk's names are granted again, and only a
// newer token of the run, admitted where that write would land, keeps it
// from overwriting what the next holder writes. The master answers with
// RecoveryRenewed.
type RenewRecovery struct {
	Dead  ClerkID
	Token Token
}

// Goodbye ends a clerk: it holds, wants and runs nothing any more and will
// never act again. The master frees its leases at once and removes its
// record; once that decree commits it tells the clerk so (a Reject, Dead).
// A clerk closes only with no local holders: its users must have made their
// work durable first, as they would before releasing.
type Goodbye struct{}

// Messages from master to clerk.

// Welcome accepts a session in an epoch.
type Welcome struct{ Epoch Epoch }

// Reject refuses a session. Dead means the clerk's incarnation was declared
// dead and it must never come back.
type Reject struct {
	Reason string
	Dead   bool
}

// Grant gives a lease with its fencing token.
type Grant struct {
	Name  string
	Mode  Mode
	Token Token
}

// Revoke asks the clerk to come down to Keep (None or Shared) once its local
// holders allow.
type Revoke struct {
	Name string
	Keep Mode
}

// RecoveryRenewed answers RenewRecovery: the run of Dead's recovery under
// Old now has Token, newer than any token granted before (a zero Token: the
// run is no longer the clerk's under Old — it was reassigned, finished or
// renewed already — and must fail).
type RecoveryRenewed struct {
	Dead  ClerkID
	Old   Token
	Token Token
}

// Recover asks the clerk to run its kind's recovery for a dead clerk. Names
// lists the leases the dead clerk held; All means they are unknown (a master
// failover lost them) and recovery must cover everything. Token fences the
// run's writes: it is larger than the dead clerk's tokens and smaller than
// any grant made after the recovery.
type Recover struct {
	Dead    ClerkID
	Names   []string
	All     bool
	Exclude []string // with All: names live clerks hold, which the run must not touch
	Token   Token
}

// Covers says whether the run may touch what lock name protects: a name it
// names, or for an "all" run any name it does not exclude.
func (q Recover) Covers(name string) bool { return covers(q.All, q.Names, q.Exclude, name) }

func covers(all bool, names, exclude []string, name string) bool {
	if all {
		return !slices.Contains(exclude, name)
	}
	return slices.Contains(names, name)
}
