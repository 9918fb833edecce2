package txn

import (
	"context"
	"fmt"
	"slices"

	"github.com/grovestore/grove/internal/lock"
	"github.com/grovestore/grove/internal/rldev"
)

// The log gives no isolation (Boxwood §3.6): a transaction's caller locks
// what it touches with the lock service, and two callers that take the
// same locks in different orders can deadlock. AcquireInOrder takes a set
// of locks in one global order, the names' byte order, so callers that
// all use it never wait on each other in a cycle. It also hands back the
// fencing tokens the caller passes to its chunk and RLDev writes.

// Hold is a lock held (lock.Held satisfies it).
type Hold interface {
	Token() lock.Token
	Release()
}

// LockSet is the locks AcquireInOrder took.
type LockSet[H Hold] struct {
	names []string // in acquisition order
	holds map[string]H
}

// AcquireInOrder acquires every lock in want (name → mode) through acquire
// (lock.ClerkRT's Acquire), in ascending byte order of the names; each
// name once (want is a map: a caller that needs a name both shared and
// exclusive asks for exclusive). If an acquisition fails, the locks
// already taken are released, latest first, and the error names the lock.
func AcquireInOrder[H Hold](ctx context.Context, acquire func(context.Context, string, lock.Mode) (H, error), want map[string]lock.Mode) (*LockSet[H], error) {
	names := make([]string, 0, len(want))
	for n, m := range want {
		if m != lock.Shared && m != lock.Exclusive {
			return nil, fmt.Errorf("txn: lock %q wanted in mode %v", n, m)
		}
		names = append(names, n)
	}
	// Byte order (Go's string comparison), the same on every node: a
	// comparator that is not a strict total order (one that reports two
	// different names equal, say by comparing a prefix) would let two
	// callers order the same pair differently, which is the deadlock this
	// helper exists to prevent.
	slices.Sort(names)
	s := &LockSet[H]{holds: map[string]H{}}
	for _, n := range names {
		h, err := acquire(ctx, n, want[n])
		if err != nil {
			s.Release()
			return nil, fmt.Errorf("txn: acquiring lock %q: %w", n, err)
		}
		s.names = append(s.names, n)
		s.holds[n] = h
	}
	return s, nil
}

// Names are the locks held, in the order they were taken.
func (s *LockSet[H]) Names() []string { return slices.Clone(s.names) }

// Hold returns the hold on name.
func (s *LockSet[H]) Hold(name string) (H, bool) {
	h, ok := s.holds[name]
	return h, ok
}

// Fence is the fence for writes made under the lock name (nil if it is
// not held): its token, for the chunk and RLDev writes that must be
// refused once a newer holder has written.
func (s *LockSet[H]) Fence(name string) *rldev.Fence {
	h, ok := s.holds[name]
	if !ok {
		return nil
	}
	return &rldev.Fence{Name: name, Token: h.Token()}
}

// Release releases every lock, latest first. The caller's changes under
// them must be durable (committed, or their log records flushed) first.
func (s *LockSet[H]) Release() {
	for i := len(s.names) - 1; i >= 0; i-- {
		s.holds[s.names[i]].Release()
	}
	s.names = nil
	clear(s.holds)
}
