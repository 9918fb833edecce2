package btree

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/grovestore/grove/internal/lock"
	"github.com/grovestore/grove/internal/rldev"
)

// fenceHolder is a B-tree server's fence: its exclusive lock on
// FenceLock(node), whose token every node and value write carries (so that
// once another server recovers this one's log, with a newer token, the
// RLDevs refuse this one's writes), and the renewal that takes the lock
// again under a newer token (Cache.payRenewal, after a write of unknown
// outcome: the lost attempt must not land over a later image).
//
// current never waits: a renewal in progress (a lock-master round trip,
// up to the operation timeout when the master is slow) does not hold up
// the writes of other nodes, which go out under the token that was
// current when they started. That is safe because a renewal protects
// only the writes after it in the writer's own order: the node whose
// write had an unknown outcome is written again only after its writer's
// payRenewal returned — after a renewal that began once that write was
// counted (its own, or one it waited behind: Cache.renewMu) — so its next
// write carries a newer token; a write under an older token that lands after a newer one is
// refused by the RLDev (and writeBack tries it again under the newest).
// The Server's runtime and the simulator both run this code.
type fenceHolder struct {
	name    string
	timeout time.Duration // an acquisition's bound once the old hold is given up
	acquire func(ctx context.Context, name string) (Hold, error)
	drop    func(name string) error // forget the name's released lease at the clerk
	fail    func(error)             // the server cannot write without a fence

	mu   sync.Mutex // serializes renewals; guards hold and released
	hold Hold
	// released: a clean close gave the hold up; no renewal takes the lock
	// again after it (a new hold would stay out, and the clerk's close be
	// refused: the leases would wait for a recovery).
	released bool
	// broken: a renewal gave the old hold up and could not take the lock
	// again (the server failed): no later renewal tries again, since the
	// server writes nothing more.
	broken error
	cur    atomic.Pointer[rldev.Fence]
}

// set installs the first hold.
func (f *fenceHolder) set(h Hold) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hold = h
	f.cur.Store(&rldev.Fence{Name: f.name, Token: h.Token()})
}

// current is the fence to write under now (a copy: callers may keep it).
func (f *fenceHolder) current() *rldev.Fence {
	p := f.cur.Load()
	if p == nil {
		return &rldev.Fence{Name: f.name}
	}
	c := *p
	return &c
}

// renew takes the fence lock again, with a newer token: the lease is
// given back to the master first, so the new grant carries a new token.
func (f *fenceHolder) renew(ctx context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err // nothing given up yet: the renewal stays owed
	}
	if f.released {
		return errClosing
	}
	if f.broken != nil {
		return f.broken
	}
	old := f.hold
	old.Release()
	if err := f.drop(f.name); err != nil {
		return err
	}
	// Once the old hold is given up there is no going back: the caller's
	// deadline (a shutdown's flush) does not cut the acquisition short,
	// the operation timeout does.
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), f.timeout)
	defer cancel()
	h, err := f.acquire(actx, f.name)
	if err != nil {
		// Without a fence the server cannot write anything back.
		f.broken = fmt.Errorf("btree: the fence lock could not be taken again: %w", err)
		f.fail(f.broken)
		return err
	}
	if !old.Token().Less(h.Token()) {
		h.Release()
		f.broken = fmt.Errorf("btree: the fence lock's new token %s is not newer than %s", h.Token(), old.Token())
		f.fail(f.broken)
		return f.broken
	}
	f.hold = h
	f.cur.Store(&rldev.Fence{Name: f.name, Token: h.Token()})
	return nil
}

// release gives the hold up (a clean close).
func (f *fenceHolder) release() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.released = true
	if f.hold != nil {
		f.hold.Release()
	}
}

var _ Hold = (*lock.Held)(nil)
