package rldev

import (
	"errors"
	"fmt"

	"github.com/grovestore/grove/internal/lock"
)

// Fence is what a write protected by a lock carries: the lock's name and
// the fencing token of the grant (lock.TokenGuard's contract).
type Fence struct {
	Name  string
	Token lock.Token
}

// Code is the outcome of a request or a peer message.
type Code int

const (
	OK         Code = iota
	NotPrimary      // writes go to the primary (the reply names the epoch the replica knows)
	NotServing      // this replica is stale, recovering, loading, fenced, or not a replica of the RLDev
	WrongEpoch      // the sender and the replica disagree on the RLDev's configuration
	StaleToken      // a write carried an older fencing token than one already admitted
	DiskFailed      // the replica's disk failed: it is leaving the RLDev
	Corrupt         // a block failed its check here and could not be repaired from the peer
	BadRequest      // unaligned, out of range, or malformed
	Unknown         // no such RLDev
	// Unavailable: the blocks' up-to-date copy is the peer's, which is
	// down (owed ranges, owed.go): nothing here may serve them until it
	// is back, or an operator forgets it.
	Unavailable
	// NotWhole answers a pull of owed blocks: this stale copy is not
	// whole (blank, incomplete, lost, being overwritten), so the puller's
	// own copy is all there is.
	NotWhole

	lastCode = NotWhole // decoders refuse a code above it
)

// Errors a request can end with (Reply.Err wraps one with details).
var (
	ErrNotPrimary  = errors.New("rldev: not the primary")
	ErrNotServing  = errors.New("rldev: this replica is not serving")
	ErrWrongEpoch  = errors.New("rldev: configuration changed")
	ErrStaleToken  = errors.New("rldev: stale fencing token")
	ErrDiskFailed  = errors.New("rldev: disk failed")
	ErrDiskHung    = errors.New("rldev: disk hung")
	ErrCorrupt     = errors.New("rldev: block corrupt and not repairable")
	ErrBadRequest  = errors.New("rldev: bad request")
	ErrUnknown     = errors.New("rldev: no such RLDev")
	ErrUnavailable = errors.New("rldev: blocks unavailable")
	errNotWhole    = errors.New("rldev: this copy is not whole")

	// ErrMaybeWritten accompanies a write's error when the write had
	// begun to land (on this replica's disk, forwarded to the peer)
	// before it failed: the blocks may hold the old data or the new, and
	// readers may see either. A write failing without it was refused
	// before anything was written. Trying a write again after
	// ErrMaybeWritten is a new write: a write of another writer that came
	// between may be overwritten by it (writers of a block share a lock).
	ErrMaybeWritten = errors.New("the write may have taken effect")
)

// Err is a code's error.
func (c Code) Err() error {
	switch c {
	case OK:
		return nil
	case NotPrimary:
		return ErrNotPrimary
	case NotServing:
		return ErrNotServing
	case WrongEpoch:
		return ErrWrongEpoch
	case StaleToken:
		return ErrStaleToken
	case DiskFailed:
		return ErrDiskFailed
	case Corrupt:
		return ErrCorrupt
	case BadRequest:
		return ErrBadRequest
	case Unknown:
		return ErrUnknown
	case Unavailable:
		return ErrUnavailable
	case NotWhole:
		return errNotWhole
	}
	return fmt.Errorf("rldev: code %d", int(c))
}

// CodeOf maps an error to its code.
func CodeOf(err error) Code {
	for c := OK + 1; c <= lastCode; c++ {
		if errors.Is(err, c.Err()) {
			return c
		}
	}
	if err == nil {
		return OK
	}
	return BadRequest
}

// Peer messages, between the replicas of an RLDev (and between a stale
// replica and the up-to-date one). Every message names the RLDev and the
// epoch its sender acts in; the receiver refuses another epoch.

// Forward asks the other replica to apply a write (the primary's, in
// normal state; the resync source's, to the target).
type Forward struct {
	RLDev, Epoch, Seq uint64
	Block             uint64
	Gen               uint64
	Data              []byte // whole blocks
	Fence             *Fence
	// Target: for the move's target on the receiving node rather than
	// the segment it holds (a node may hold both: a move to another of
	// its disks).
	Target bool
	// WID: the client's write (landed.go), remembered where it lands.
	WID WriteID
}

// Ack answers a Forward or a Copy (by Seq).
type Ack struct {
	RLDev, Seq uint64
	Code       Code
	Epoch      uint64 // the receiver's epoch, when Code is WrongEpoch
}

// Pull asks a serving replica for its copy of blocks (a dirty-region pull,
// a read repair).
type Pull struct {
	RLDev, Epoch, Seq uint64
	Block, Count      uint64
	GensOnly          bool // the scrubber: the generations (and Bad) without the data
	// Owed: a pull of owed blocks (owed.go) from a peer that is stale
	// since: it answers from its copy if that is whole, NotWhole if not.
	Owed bool
}

// PullData answers a Pull: the blocks' data and generations. With Code
// Corrupt, Data and Gens still carry every block and Bad lists those that
// failed their check at the sender (their Data is zero): the rest are
// good.
type PullData struct {
	RLDev, Seq uint64
	Code       Code
	Data       []byte
	Gens       []uint64
	Bad        []uint64
}

// usable reports whether pd carries blocks for [first, first+n): all of
// them (OK) or all but pd.Bad (Corrupt).
func (pd PullData) usable(n uint64) bool {
	if pd.Data == nil && uint64(len(pd.Gens)) == n && (pd.Code == OK || pd.Code == Corrupt) {
		return false // generations only
	}
	return (pd.Code == OK || pd.Code == Corrupt && len(pd.Bad) > 0) &&
		uint64(len(pd.Data)) == n*BlockSize && uint64(len(pd.Gens)) == n
}

// ResyncMe is a stale replica asking the up-to-date one to bring it up to
// date: the regions of its own dirty-region log (DRL granularity), or
// Blank if its segment lost everything.
type ResyncMe struct {
	RLDev, Epoch uint64
	Dirty        []uint64
	Blank        bool
}

// Copy writes blocks onto the resync target, overwriting whatever it
// holds there (the source holds the range while the copy is in flight, so
// no write interleaves).
type Copy struct {
	RLDev, Epoch, Seq uint64
	Block             uint64
	Data              []byte
	Gens              []uint64
	Tokens            []Fence // the source's fencing tokens, merged by the target
	Target            bool    // a move's copy, for the move's target (see Forward)
}
