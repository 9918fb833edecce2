package btree

import (
	"context"
	"errors"

	"github.com/grovestore/grove/internal/lock"
)

// Store is what the tree algorithm needs of the layers below: node images
// that every server sees coherently, node locks, and atomic durable
// changes. A single-process store keeps images in memory behind mutexes
// (MemStore); a B-tree server keeps them in chunks, caches them under the
// lock service's leases and logs every change (package btree's server).
//
// Coherence contract: an image Read returns was the node's current image
// at some instant during the call; an image Lock returns stays the node's
// current image until Unlock, except for the caller's own Commits. Images
// are immutable: a change publishes new ones (copy on write), so a reader
// never sees one in part.
//
// Lock order (the algorithm's, so that the store may block): a caller holds
// at most one lock while it waits for another, except compression, which
// takes a parent before its children and a left node before its right one,
// and scans, which take leaves left to right in shared mode. New nodes and
// the anchor are locked while holding others: nobody else can be waiting
// for a node that is not yet linked in, and the anchor is taken only by a
// root split, which holds no other lock.
type Store interface {
	// Anchor returns a coherent image of the tree's anchor.
	Anchor(ctx context.Context) (*Anchor, error)
	// Read returns a coherent image of node h without taking its lock
	// (ErrGone if h's chunk was freed: the caller starts again from the root).
	Read(ctx context.Context, h Handle) (*Node, error)
	// Lock takes h's lock in mode (lock.Shared or lock.Exclusive) and
	// returns h's current image.
	Lock(ctx context.Context, h Handle, mode lock.Mode) (*Node, error)
	// Unlock gives back a lock Lock, LockAnchor or New took.
	Unlock(h Handle, mode lock.Mode)
	// LockAnchor takes the anchor's lock exclusively and returns its image.
	LockAnchor(ctx context.Context) (*Anchor, error)
	// New allocates the chunk of a new node, locked exclusively.
	New(ctx context.Context) (Handle, error)
	// Commit replaces the images of nodes (and of the anchor, if not nil)
	// that the caller holds exclusively, atomically: after a crash, all of
	// them or none. It publishes them at once (Read and Lock return them)
	// and returns the position at which the change is durable: the caller
	// waits for it with Durable before it reports the change done, and
	// anyone who read an image with LSN x waits for x before it reports
	// what it read. Commit sets the images' LSN. An error leaves the images
	// unchanged. frees are value chunks the change stops naming (a value
	// replaced or deleted): a store with a log records them in the change,
	// so that they are freed even if the caller's own Free never happens
	// (its server dies first: the log's replay frees them).
	Commit(ctx context.Context, nodes []*Node, anchor *Anchor, frees []Handle) (uint64, error)
	// Durable waits until every change up to lsn is durable.
	Durable(ctx context.Context, lsn uint64) error
	// Abandon gives back a chunk New returned that no committed image
	// names (the change that was to link it in failed), and its lock.
	Abandon(h Handle)
	// Free frees a removed node's chunk (its grace period is over). Freeing
	// a chunk that is already free succeeds.
	Free(ctx context.Context, h Handle) error
	// Now is the store's clock, in nanoseconds, for grace periods.
	Now() int64
	// WriteValue writes val into a new chunk of its own, durably, and
	// returns its reference (value.go). An error leaves nothing behind
	// that a committed image could name.
	WriteValue(ctx context.Context, val []byte) (ValueRef, error)
	// ReadValue reads the value r names (ErrGone if its chunk was freed:
	// the caller starts again from the root). Free frees a value chunk
	// no committed image names any more.
	ReadValue(ctx context.Context, r ValueRef) ([]byte, error)
	// FreeWhenDurable frees value chunk h once the change at lsn is
	// durable, after the caller returns if need be (the caller's wait
	// ended first: its deadline passed), then calls done with whether it
	// did. It reports whether it will (false: done is not called).
	FreeWhenDurable(lsn uint64, h Handle, done func(freed bool)) bool
}

// ErrGone: the node's chunk was freed (a removed node past its grace
// period); an operation that meets it starts again from the root.
var ErrGone = errors.New("btree: node is gone")
