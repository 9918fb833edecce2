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
	case "shared", "s", "read":
		return Shared, nil
	case "exclusive", "x", "write":
		return Exclusive, nil
	}
	return None, fmt.Errorf("lock: unknown mode %q (want shared or exclusive)", s)
}

// Compatible reports whether two holders may hold these modes at once.
func Compatible(a, b Mode) bool { return a == None || b == None || (a == Shared && b == Shared) }

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

// Errors. They are values; each says what the caller should do.
var (
	ErrBadName      = fmt.Errorf("lock: name must be 1..%d bytes", MaxNameLen)
	ErrBadMode      = errors.New("lock: mode must be shared or exclusive")
	ErrFenced       = errors.New("lock: this node fenced itself; its leases are gone (it comes back with a new incarnation and a new clerk)")
	ErrUnregistered = errors.New("lock: clerk is not registered with the lock service")
	ErrDeadClerk    = errors.New("lock: clerk was declared dead; it must not come back")
	ErrNotHeld      = errors.New("lock: release of a lock this holder does not hold")
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
// wants. The master replaces what it knew of the clerk with this report.
type Hello struct {
	Clerk ClerkID
	Kind  string // recovery kind ("" = none)
	Epoch Epoch  // the master epoch the clerk is talking to
	Held  map[string]Mode
	Seqs  map[string]uint64 // the grant sequence number of each held lease
	Want  map[string]Mode
}

// Acquire asks for a lease in a mode.
type Acquire struct {
	Name string
	Mode Mode
}

// Release gives a lease up (Mode None) or downgrades it to Shared. Seq is
// the sequence number of the newest grant the clerk had received: a release
// that crossed a newer grant on the wire refers to an older one, and the
// master ignores it (otherwise it would free a lease the clerk now holds).
type Release struct {
	Name string
	Mode Mode // the mode the clerk keeps
	Seq  uint64
}

// RecoveryDone reports a recovery run for a dead clerk.
type RecoveryDone struct {
	Dead ClerkID
	OK   bool
}

// Messages from master to clerk.

// Welcome accepts a session in an epoch.
type Welcome struct{ Epoch Epoch }

// Reject refuses a session. Dead means the clerk's incarnation was declared
// dead and it must never come back.
type Reject struct {
	Reason string
	Dead   bool
}

// Grant gives a lease. Seq grows with every grant of one lock to one clerk.
type Grant struct {
	Name string
	Mode Mode
	Seq  uint64
}

// Revoke asks the clerk to come down to Keep (None or Shared) once its local
// holders allow.
type Revoke struct {
	Name string
	Keep Mode
}

// Recover asks the clerk to run its kind's recovery for a dead clerk. Names
// lists the leases the dead clerk held; All means they are unknown (a master
// failover lost them) and recovery must cover everything.
type Recover struct {
	Dead  ClerkID
	Names []string
	All   bool
}
