package btree

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/grovestore/grove/internal/lock"
)

// MemStore is a Store in one process's memory: images in a map, node locks
// as reader/writer mutexes, commits applied at once. It runs the algorithm
// alone (the differential test, fuzzing, a single-node tree); it asserts
// the store contract (commits only of nodes locked exclusively).
type MemStore struct {
	clock func() int64

	mu struct {
		sync.Mutex
		images map[Handle]*Node
		values map[Handle][]byte // value chunks' images
		anchor *Anchor
		locks  map[Handle]*memLock
		next   uint64
		lsn    uint64
		freed  map[Handle]bool
		live   map[Handle]bool // allocated and not freed
	}
}

type memLock struct {
	rw        sync.RWMutex
	exclusive bool // under MemStore.mu
	users     int  // holders and waiters, under MemStore.mu
}

var _ Store = (*MemStore)(nil)

// NewMemStore returns a store holding an empty tree, and the tree's id.
// clock nil means the wall clock.
func NewMemStore(clock func() int64) (*MemStore, uint64) {
	if clock == nil {
		clock = func() int64 { return time.Now().UnixNano() }
	}
	s := &MemStore{clock: clock}
	s.mu.images = map[Handle]*Node{}
	s.mu.values = map[Handle][]byte{}
	s.mu.locks = map[Handle]*memLock{}
	s.mu.freed = map[Handle]bool{}
	s.mu.live = map[Handle]bool{}
	ah, rh := s.alloc(), s.alloc()
	a, root := Init(ah, rh)
	s.mu.anchor, s.mu.images[rh] = a, root
	return s, ah.ID
}

func (s *MemStore) alloc() Handle {
	s.mu.next++
	h := Handle{CM: 1, ID: s.mu.next}
	s.mu.live[h] = true
	return h
}

func (s *MemStore) Now() int64 { return s.clock() }

func (s *MemStore) Anchor(ctx context.Context) (*Anchor, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.anchor, nil
}

func (s *MemStore) Read(ctx context.Context, h Handle) (*Node, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.mu.images[h]
	if n == nil {
		if s.mu.freed[h] {
			return nil, ErrGone
		}
		return nil, fmt.Errorf("btree: mem store: read of node %v, which was never written", h)
	}
	return n, nil
}

func (s *MemStore) lockOf(h Handle) *memLock {
	l := s.mu.locks[h]
	if l == nil {
		l = &memLock{}
		s.mu.locks[h] = l
	}
	l.users++
	return l
}

func (s *MemStore) take(h Handle, mode lock.Mode) {
	s.mu.Lock()
	l := s.lockOf(h)
	s.mu.Unlock()
	if mode == lock.Exclusive {
		l.rw.Lock()
		s.mu.Lock()
		l.exclusive = true
		s.mu.Unlock()
	} else {
		l.rw.RLock()
	}
}

func (s *MemStore) Lock(ctx context.Context, h Handle, mode lock.Mode) (*Node, error) {
	s.take(h, mode)
	s.mu.Lock()
	n := s.mu.images[h]
	s.mu.Unlock()
	if n == nil {
		s.Unlock(h, mode)
		if s.freedNow(h) {
			return nil, ErrGone
		}
		return nil, fmt.Errorf("btree: mem store: lock of node %v, which was never written", h)
	}
	return n, nil
}

func (s *MemStore) freedNow(h Handle) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.freed[h]
}

func (s *MemStore) Unlock(h Handle, mode lock.Mode) {
	s.mu.Lock()
	l := s.mu.locks[h]
	if l == nil {
		s.mu.Unlock()
		panic(fmt.Sprintf("btree: mem store: unlock of %v, not locked", h))
	}
	if mode == lock.Exclusive {
		l.exclusive = false
	}
	l.users--
	if l.users == 0 {
		delete(s.mu.locks, h)
	}
	s.mu.Unlock()
	if mode == lock.Exclusive {
		l.rw.Unlock()
	} else {
		l.rw.RUnlock()
	}
}

func (s *MemStore) LockAnchor(ctx context.Context) (*Anchor, error) {
	s.mu.Lock()
	ah := s.mu.anchor.Self
	s.mu.Unlock()
	s.take(ah, lock.Exclusive)
	return s.Anchor(ctx)
}

func (s *MemStore) New(ctx context.Context) (Handle, error) {
	s.mu.Lock()
	h := s.alloc()
	s.mu.Unlock()
	s.take(h, lock.Exclusive)
	return h, nil
}

func (s *MemStore) Commit(ctx context.Context, nodes []*Node, anchor *Anchor, _ []Handle) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mu.lsn++
	for _, n := range nodes {
		if l := s.mu.locks[n.Self]; l == nil || !l.exclusive {
			panic(fmt.Sprintf("btree: mem store: commit of node %v, not locked exclusively", n.Self))
		}
		if err := n.Check(); err != nil {
			panic(fmt.Sprintf("btree: mem store: commit of a bad image of %v: %v", n.Self, err))
		}
	}
	if anchor != nil {
		if l := s.mu.locks[anchor.Self]; l == nil || !l.exclusive {
			panic("btree: mem store: commit of the anchor, not locked")
		}
		anchor.LSN = s.mu.lsn
		anchor.Version = s.mu.anchor.Version + 1
		s.mu.anchor = anchor
	}
	for _, n := range nodes {
		n.LSN = s.mu.lsn
		n.Version = 1
		if old := s.mu.images[n.Self]; old != nil {
			n.Version = old.Version + 1
		}
		s.mu.images[n.Self] = n
	}
	return s.mu.lsn, nil
}

func (s *MemStore) Durable(ctx context.Context, lsn uint64) error { return nil }

func (s *MemStore) Abandon(h Handle) {
	s.mu.Lock()
	if s.mu.images[h] != nil {
		s.mu.Unlock()
		panic(fmt.Sprintf("btree: mem store: abandon of %v, which a commit wrote", h))
	}
	delete(s.mu.live, h)
	s.mu.freed[h] = true
	s.mu.Unlock()
	s.Unlock(h, lock.Exclusive)
}

func (s *MemStore) Free(ctx context.Context, h Handle) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.freed[h] {
		return nil
	}
	if _, ok := s.mu.values[h]; ok {
		delete(s.mu.values, h)
		delete(s.mu.live, h)
		s.mu.freed[h] = true
		return nil
	}
	if n := s.mu.images[h]; n == nil || !n.Deleted {
		panic(fmt.Sprintf("btree: mem store: free of %v, which is not a removed node", h))
	}
	delete(s.mu.images, h)
	delete(s.mu.live, h)
	s.mu.freed[h] = true
	return nil
}

func (s *MemStore) WriteValue(ctx context.Context, val []byte) (ValueRef, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.alloc()
	img, ref := EncodeValue(s.mu.anchor.Self.ID, h, val)
	s.mu.values[h] = img
	return ref, nil
}

func (s *MemStore) ReadValue(ctx context.Context, r ValueRef) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	img, ok := s.mu.values[r.Chunk]
	if !ok {
		if s.mu.freed[r.Chunk] {
			return nil, ErrGone
		}
		return nil, fmt.Errorf("btree: mem store: read of value chunk %v, which was never written", r.Chunk)
	}
	return DecodeValue(img, s.mu.anchor.Self.ID, r)
}

func (s *MemStore) FreeWhenDurable(lsn uint64, h Handle, done func(freed bool)) bool {
	done(s.Free(context.Background(), h) == nil) // (every change is durable at once)
	return true
}

// Chunks returns every allocated chunk: for the walker's leak check. Call
// it when no operation runs.
func (s *MemStore) Chunks() map[Handle]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := map[Handle]bool{}
	for h := range s.mu.live {
		m[h] = true
	}
	return m
}
