package lock

import (
	"context"
	"errors"
	"sync"
	"time"

	pb "github.com/grovestore/grove/api/grovepb"
)

// SessionQueue bounds the messages waiting to go out on one session. A full
// queue breaks the session: the next Hello carries the whole state, so
// nothing is lost but time.
const SessionQueue = 4096

// ClerkRT runs a Clerk core: it keeps a session with the master the config
// service names, turns local Acquire calls into waits, and runs recovery.
type ClerkRT struct {
	s       *Service
	recover RecoveryFunc
	ctx     context.Context
	cancel  context.CancelFunc
	mu      sync.Mutex // guards core, waits, out
	core    *Clerk
	waits   map[*Waiter]chan struct{}
	out     chan *pb.SessionRequest // the current session's send queue (nil: none)
	lost    chan struct{}           // closed at fence
	lostOne sync.Once
}

// ID is the clerk's identity.
func (c *ClerkRT) ID() ClerkID { return c.core.ID() }

// Held is one granted local hold on a lock.
type Held struct {
	c    *ClerkRT
	w    *Waiter
	once sync.Once
}

// Name and Mode describe the hold.
func (h *Held) Name() string { return h.w.Name }
func (h *Held) Mode() Mode   { return h.w.Mode }

// Valid reports whether the holder may act under the lease now: the clerk
// has not fenced and the node still considers itself alive. Check it before
// every action the lease protects.
func (h *Held) Valid() bool {
	h.c.mu.Lock()
	defer h.c.mu.Unlock()
	return !h.c.core.Fenced() && h.c.s.cfg.Live.Alive()
}

// Lost is closed when the node fences itself (the lease is gone).
func (h *Held) Lost() <-chan struct{} { return h.c.lostCh() }

// Release ends the hold. The lease stays cached at the clerk until the
// master revokes it. Releasing twice is a no-op.
func (h *Held) Release() {
	h.once.Do(func() {
		h.c.mu.Lock()
		defer h.c.mu.Unlock()
		out, _ := h.c.core.Release(h.w)
		h.c.applyLocked(out)
	})
}

func (c *ClerkRT) lostCh() chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lost == nil {
		c.lost = make(chan struct{})
	}
	return c.lost
}

// Acquire blocks until the lock is held in mode (a cached lease returns at
// once, without a message), ctx ends, or the node fences itself.
func (c *ClerkRT) Acquire(ctx context.Context, name string, mode Mode) (*Held, error) {
	if err := ValidName(name); err != nil {
		return nil, err
	}
	if mode != Shared && mode != Exclusive {
		return nil, ErrBadMode
	}
	if !c.s.cfg.Live.Alive() {
		return nil, ErrFenced
	}
	c.mu.Lock()
	w, out := c.core.Acquire(name, mode)
	if w.Failed {
		c.mu.Unlock()
		return nil, ErrFenced
	}
	ch := make(chan struct{})
	granted := w.Granted // read under c.mu: the session goroutine writes it
	if !granted {
		c.waits[w] = ch
	}
	c.applyLocked(out)
	c.mu.Unlock()
	if granted {
		return &Held{c: c, w: w}, nil
	}
	select {
	case <-ch: // closed under c.mu after w's fields were set
	case <-ctx.Done():
		c.mu.Lock()
		delete(c.waits, w)
		granted := w.Granted
		if !granted {
			c.applyLocked(c.core.Cancel(w))
		}
		c.mu.Unlock()
		if granted {
			(&Held{c: c, w: w}).Release()
		}
		return nil, ctx.Err()
	}
	if w.Failed {
		return nil, ErrFenced
	}
	return &Held{c: c, w: w}, nil
}

// Drop gives the cached lease on name back to the master if unused.
func (c *ClerkRT) Drop(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.applyLocked(c.core.Drop(name))
}

// applyLocked carries out the core's outputs. Holds c.mu.
func (c *ClerkRT) applyLocked(out []any) {
	for _, o := range out {
		switch x := o.(type) {
		case ToMaster:
			if c.out == nil {
				continue // no session: the next Hello carries the state
			}
			select {
			case c.out <- EncodeClerkMessage(x.Msg):
			default:
				close(c.out) // the queue is full: break the session
				c.out = nil
			}
		case Woken:
			for _, w := range x.Waiters {
				if ch := c.waits[w]; ch != nil {
					delete(c.waits, w)
					close(ch)
				}
			}
		case RunRecovery:
			go c.runRecovery(x.Req)
		}
	}
}

func (c *ClerkRT) runRecovery(r Recover) {
	log := c.s.log.With("clerk", c.ID(), "dead", r.Dead)
	log.Info("running recovery", "all", r.All, "names", len(r.Names))
	ctx, cancel := context.WithTimeout(c.ctx, time.Minute)
	err := c.recover(ctx, r.Dead, r.Names, r.All)
	cancel()
	if err != nil {
		log.Warn("recovery failed; the master will retry", "err", err)
	} else {
		log.Info("recovery done")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.applyLocked(c.core.RecoveryDone(r.Dead, err == nil))
}

// fence drops every lease: the node fenced itself.
func (c *ClerkRT) fence() {
	c.mu.Lock()
	failed := c.core.Fence()
	for _, w := range failed {
		if ch := c.waits[w]; ch != nil {
			delete(c.waits, w)
			close(ch)
		}
	}
	if c.lost == nil {
		c.lost = make(chan struct{})
	}
	c.lostOne.Do(func() { close(c.lost) })
	c.mu.Unlock()
	c.cancel()
}

// register records the clerk in the config service's clerk list.
func (c *ClerkRT) register() error {
	id := c.ID()
	rec := &pb.LockClerkRecord{Id: ClerkIDToPB(id), Kind: c.core.Kind()}
	for c.ctx.Err() == nil {
		ctx, cancel := context.WithTimeout(c.ctx, 10*time.Second)
		_, err := c.s.cfg.Meta.Update(ctx, Namespace, "clerk-"+id.String(), func(ns *pb.Namespace) ([]*pb.Op, error) {
			for _, e := range ns.Entries {
				if e.Key == clerkKey(id) {
					return nil, nil
				}
			}
			return []*pb.Op{put(clerkKey(id), rec)}, nil
		})
		cancel()
		if err == nil {
			return nil
		}
		c.s.log.Warn("clerk registration failed; retrying", "clerk", id, "err", err)
		sleep(c.ctx, 500*time.Millisecond)
	}
	return c.ctx.Err()
}

// run registers the clerk, then keeps a session with the current master.
func (c *ClerkRT) run() {
	defer c.s.wg.Done()
	if c.register() != nil {
		return
	}
	fresh := false // use the hint first; after a failed session, re-read
	for c.ctx.Err() == nil {
		welcomed, err := c.session(fresh)
		if err != nil && c.ctx.Err() == nil {
			c.s.log.Debug("clerk session ended", "clerk", c.ID(), "err", err)
		}
		fresh = !welcomed
		sleep(c.ctx, 100*time.Millisecond)
	}
}

var errRejected = errors.New("lock: master rejected the session")

// session runs one session: find the master (from the hint, or by a
// linearizable read when fresh), connect, say Hello, and apply what the
// master sends until the stream breaks or a newer master appears. It
// reports whether the master welcomed the session.
func (c *ClerkRT) session(fresh bool) (welcomed bool, err error) {
	if !c.s.cfg.Live.Alive() {
		return false, ErrFenced
	}
	st, _ := c.s.hint()
	if fresh || st == nil || st.master == nil {
		rctx, cancel := context.WithTimeout(c.ctx, 5*time.Second)
		st, err = c.s.read(rctx)
		cancel()
		if err != nil {
			return false, err
		}
	}
	if st.master == nil {
		return false, errors.New("lock: no master yet")
	}
	cl, err := c.s.conns.get(st.master.GrpcAddr)
	if err != nil {
		return false, err
	}
	ctx, stop := context.WithCancel(c.ctx)
	defer stop()
	stream, err := cl.Session(ctx)
	if err != nil {
		return false, err
	}
	out := make(chan *pb.SessionRequest, SessionQueue)
	c.mu.Lock()
	hello := c.core.Connect(Epoch(st.master.Epoch))
	c.out = out
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		if c.out == out {
			close(out)
			c.out = nil
		}
		c.core.Disconnected()
		c.mu.Unlock()
	}()
	if err := stream.Send(EncodeClerkMessage(hello)); err != nil {
		return false, err
	}
	// The sender: the one goroutine that writes on the stream.
	go func() {
		for m := range out {
			if stream.Send(m) != nil {
				stop()
				for range out {
				}
				return
			}
		}
		stop()
	}()
	// Notice a newer master even if the old stream stays up (partition),
	// from the watched hint: no load on the config-service leader.
	epoch := st.master.Epoch
	go func() {
		for {
			h, changed := c.s.hint()
			if h != nil && h.version > st.version && (h.master == nil || h.master.Epoch != epoch) {
				stop()
				return
			}
			select {
			case <-changed:
			case <-ctx.Done():
				return
			}
		}
	}()
	for {
		m, err := stream.Recv()
		if err != nil {
			return welcomed, err
		}
		msg, err := DecodeMasterMessage(m)
		if err != nil {
			c.s.log.Warn("clerk dropped a malformed message from the master", "clerk", c.ID(), "err", err)
			return welcomed, err
		}
		if r, ok := msg.(Reject); ok {
			if r.Dead {
				c.s.log.Error("master says this clerk is dead", "clerk", c.ID(), "reason", r.Reason)
			}
			return false, errRejected
		}
		if _, ok := msg.(Welcome); ok {
			welcomed = true
		}
		c.mu.Lock()
		if !c.s.cfg.Live.Alive() {
			c.mu.Unlock()
			return welcomed, ErrFenced // a clerk applies nothing once its node is not alive
		}
		c.applyLocked(c.core.Handle(msg))
		c.mu.Unlock()
	}
}
