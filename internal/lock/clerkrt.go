package lock

import (
	"context"
	"errors"
	"sync"
	"time"
)

// ClerkRT is a clerk as the layers above use it: acquire, hold, release.
// It belongs to one node incarnation; once that incarnation is fenced its
// leases are gone for good and a new clerk must be made in the next one.
type ClerkRT struct {
	s        *Service
	e        *Engine
	id       ClerkID
	recover  RecoveryFunc
	lost     chan struct{} // closed when the leases are lost
	closed   chan struct{} // closed when Close completed
	loseOnce sync.Once
	reason   error             // why (under s.mu once lost is closed)
	onRevoke func(name string) // under s.mu
}

// OnRevoke sets the function told when the master revokes a lease this
// clerk's local holders still hold (see Revoking). It runs on its own
// goroutine; it is told once per revocation, and a holder that misses the
// notice (it was taking its hold as the notice came) finds the revocation
// with Revoking.
func (c *ClerkRT) OnRevoke(f func(name string)) {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	c.onRevoke = f
}

// Revoking reports whether the master revoked the lease on name and the
// revocation waits for this clerk's local holders to release.
func (c *ClerkRT) Revoking(name string) bool {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	return c.e.Revoking(c.id, name)
}

// Lost is closed when the clerk's leases are lost (its node fenced itself,
// or the master declared it dead): a cache of what its leases protect must
// stop serving at once.
func (c *ClerkRT) Lost() <-chan struct{} { return c.lost }

// Cached returns the mode and token of the lease the clerk caches on name
// (None if it holds no lease).
func (c *ClerkRT) Cached(name string) (Mode, Token) {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	return c.e.Lease(c.id, name)
}

// ID is the clerk's identity.
func (c *ClerkRT) ID() ClerkID { return c.id }

// Acquire blocks until the lock is held in mode (a cached lease returns at
// once, without a message), ctx ends, or the clerk's leases are lost.
func (c *ClerkRT) Acquire(ctx context.Context, name string, mode Mode) (*Held, error) {
	s := c.s
	if c.isClosed() {
		return nil, ErrClosed
	}
	s.mu.Lock()
	w, out, err := c.e.Acquire(s.env(c.e), c.id, name, mode)
	joining, told := time.Now(), false
	for errors.Is(err, ErrNotAlive) && !c.e.Fenced() {
		// The incarnation is still joining (not yet acknowledged by a
		// majority of observers): wait for it rather than fail. Said
		// once if it lasts: a caller waiting here is otherwise invisible.
		if !told && time.Since(joining) > 5*time.Second {
			told = true
			s.log.Warn("lock acquire waiting for this incarnation to be acknowledged by a majority of observers", "clerk", c.id, "lock", name, "waited", time.Since(joining).Round(time.Millisecond))
		}
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		s.mu.Lock()
		w, out, err = c.e.Acquire(s.env(c.e), c.id, name, mode)
	}
	if err != nil {
		s.mu.Unlock()
		return nil, err
	}
	ch := make(chan struct{})
	if !w.Granted {
		s.mu.waits[w] = ch
	}
	s.execLocked(c.e, out)
	granted := w.Granted
	s.mu.Unlock()
	if !granted {
		select {
		case <-ch: // closed under s.mu after w's fields were set
		case <-ctx.Done():
			s.mu.Lock()
			delete(s.mu.waits, w)
			granted := w.Granted
			if !granted {
				s.execLocked(c.e, c.e.Cancel(Env{Now: time.Now()}, c.id, w)) // giving up needs no liveness
			}
			s.mu.Unlock()
			if granted {
				(&Held{c: c, w: w}).Release()
			}
			return nil, ctx.Err()
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if w.Failed || !w.Granted {
		switch {
		case c.reason != nil:
			return nil, c.reason
		case c.e.Closing(c.id) || c.isClosed():
			return nil, ErrClosed
		}
		return nil, ErrFenced
	}
	_, tok := c.e.Lease(c.id, name)
	return &Held{c: c, w: w, token: tok}, nil
}

// Close ends the clerk: it fails its waiters, gives up every lease, cancels
// the recovery runs it was asked for, and removes its record from the lock
// service, so that nothing of it stays behind (a layer that makes a clerk
// per session or per mount closes it when done). It refuses with
// ErrStillHeld while a hold is not released: the holder's work must be done
// (and durable) first, as before a release. It returns once the master has
// taken its Goodbye and its record is gone, or when ctx ends (the close
// then goes on in the background), or with the reason if the node fenced
// first (the master then resolves its leases as a dead clerk's).
func (c *ClerkRT) Close(ctx context.Context) error {
	s := c.s
	if c.isClosed() {
		return nil
	}
	s.mu.Lock()
	if s.mu.def == c {
		s.mu.Unlock()
		return errors.New("lock: the node's default clerk is not closed (it lives as long as its incarnation)")
	}
	out, err := c.e.CloseClerk(Env{Now: time.Now(), Alive: s.cfg.Live.AliveAs(c.e.Incarnation())}, c.id)
	if err == nil {
		s.execLocked(c.e, out)
	}
	s.mu.Unlock()
	if err != nil {
		return err
	}
	select {
	case <-c.closed:
		return nil
	case <-c.lost:
		s.mu.Lock()
		defer s.mu.Unlock()
		select {
		case <-c.closed:
			return nil
		default:
		}
		return c.reason
	case <-ctx.Done():
		return ctx.Err()
	}
}

// isClosed reports whether Close completed.
func (c *ClerkRT) isClosed() bool {
	select {
	case <-c.closed:
		return true
	default:
		return false
	}
}

// Drop gives the cached lease on name back to the master if unused.
func (c *ClerkRT) Drop(name string) {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	c.s.execLocked(c.e, c.e.Drop(Env{Now: time.Now()}, c.id, name))
}

// Held is one granted local hold on a lock.
type Held struct {
	c     *ClerkRT
	w     *Waiter
	token Token
	once  sync.Once
}

// Name and Mode describe the hold.
func (h *Held) Name() string { return h.w.Name }
func (h *Held) Mode() Mode   { return h.w.Mode }

// Token is the hold's fencing token: attach it to every write the lease
// protects, so that storage can refuse a write from a holder whose lease has
// since moved on (see Token and TokenGuard).
func (h *Held) Token() Token { return h.token }

// Valid reports whether the holder may act under the lease now: the hold is
// not released, the clerk's incarnation is the node's running incarnation,
// it is alive by the clock, and it was neither fenced nor declared dead.
// It is a check at one instant: bound what follows by ValidUntil, and fence
// writes with Token.
func (h *Held) Valid() bool {
	s := h.c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	return h.c.e.Valid(h.c.id, h.w) && s.cfg.Live.AliveAs(h.c.e.Incarnation())
}

// ValidUntil returns the local time (monotonic clock) until which the lease
// is guaranteed: no dead verdict on the clerk's incarnation, hence no grant
// of a conflicting lease elsewhere, can come before it. Zero if the hold is
// not valid now. An action that may take longer (an RPC, an fsync) must
// carry Token as well.
func (h *Held) ValidUntil() time.Time {
	s := h.c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if !h.c.e.Valid(h.c.id, h.w) {
		return time.Time{}
	}
	d, ok := s.cfg.Live.Deadline(h.c.e.Incarnation())
	if !ok {
		return time.Time{}
	}
	return d
}

// Lost is closed when the clerk's leases are lost (its node fenced itself,
// or the master declared it dead); LostReason says which.
func (h *Held) Lost() <-chan struct{} { return h.c.lost }

// ValidUntil returns the local time (monotonic clock) until which every
// lease the clerk holds is guaranteed: its incarnation's liveness
// deadline, before which no dead verdict, hence no conflicting grant
// elsewhere, can come. Zero once its leases are lost.
func (c *ClerkRT) ValidUntil() time.Time {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.e.Fenced() || !s.cfg.Live.AliveAs(c.e.Incarnation()) {
		return time.Time{}
	}
	d, ok := s.cfg.Live.Deadline(c.e.Incarnation())
	if !ok {
		return time.Time{}
	}
	return d
}

// LostReason is why the leases were lost (nil while they are not).
func (h *Held) LostReason() error {
	h.c.s.mu.Lock()
	defer h.c.s.mu.Unlock()
	return h.c.reason
}

// Release ends the hold. The lease stays cached at the clerk until the
// master revokes it. Releasing twice is a no-op.
func (h *Held) Release() {
	h.once.Do(func() {
		s := h.c.s
		s.mu.Lock()
		defer s.mu.Unlock()
		s.execLocked(h.c.e, h.c.e.Release(Env{Now: time.Now()}, h.c.id, h.w)) // releasing needs no liveness
	})
}
