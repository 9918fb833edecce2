package btree

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/chunk"
	"github.com/grovestore/grove/internal/lock"
	"github.com/grovestore/grove/internal/rldev"
	"github.com/grovestore/grove/internal/txn"
)

// The simulator's stand-ins for the layers below the B-tree server: a lock
// service with the real one's lease semantics (cached leases, revocation
// that waits for local holders and tells them, tokens from one counter,
// a dead clerk's leases kept until a recovery run on a live clerk of its
// kind succeeds, runs deferred until one registers, "all" runs after a
// failover that lost a dead clerk's leases), a chunk store whose
// RLDevs admit fencing tokens per lock name and whose writes can be lost
// in flight and land late, and a log device on two in-memory replicas.

// ---- locks

type simLocks struct {
	mu      sync.Mutex
	cond    *sync.Cond
	seq     uint64
	clerks  []*simClerk
	running map[*simClerk]bool // dead clerks whose recovery runs
	r       *rand.Rand
	ctx     context.Context
	// Leases are renewed every lease/8 while a clerk reaches the service;
	// a clerk guarantees its leases until its last renewal + lease (its
	// ValidUntil) and is declared dead at its last renewal + lease + grace
	// (the failure detector's margin), whether or not it knows.
	lease, grace time.Duration
	onExpire     func(c *simClerk) // the world's hook: a clerk was declared dead
	// renewals counts recovery runs' renewed tokens; noRenew refuses them
	// (the teeth of the test that a replay renews rather than fails).
	runRenewals int
	noRenew     bool
	// allRunning: an "all" run is out (one at a time, as the master's
	// overlapping rule has it); failovers counts the masters that lost
	// their lease table (failover), allRuns the "all" runs that succeeded.
	allRunning         bool
	failovers, allRuns int
	// incs is each node's last clerk incarnation (a closed clerk leaves
	// the master's record; its node's next one is newer all the same).
	incs map[uint64]uint64
	// closes counts the clerks that closed (ClerkRT.Close).
	closes int
}

type simLease struct {
	mode      lock.Mode
	token     lock.Token
	shared    int
	exclusive bool
	revoking  bool
	keep      lock.Mode
}

type simClerk struct {
	s        *simLocks
	node     uint64
	dead     bool
	leases   map[string]*simLease
	onRevoke func(string)
	recover  func(ctx context.Context, r lock.Recovery) error
	lost     chan struct{}
	told     bool      // lost is closed: the clerk knows it is dead
	renewed  time.Time // its last renewal
	cut      bool      // it cannot reach the lock service (partitioned, or paused)
	paused   bool      // its process is frozen: not even a cached lease is granted
	// inc tells this clerk from the node's other incarnations (the
	// recovery's Dead).
	inc uint64
	// closing: Close began (ClerkRT.Close): it acquires nothing and is
	// given no recovery run; runs are the runs it is doing, by id, for
	// their cancellation at a close.
	closing bool
	runs    map[uint64]context.CancelFunc
	// all: it died and a new master does not know its leases (failover):
	// its recovery is an "all" run, which excludes the names every other
	// clerk the master knows of holds; nothing new is granted until it
	// succeeds. settled: dead and nothing of it left to recover.
	all, settled bool
}

func newSimLocks(ctx context.Context, r *rand.Rand) *simLocks {
	// The grace is the failure detector's margin between a node's own
	// deadline and the others' verdict (about 2 % of the lease in
	// production): small, so that a server that uses its leases past their
	// time is caught; not smaller than the scheduler's hiccups.
	lease, grace := 30*time.Millisecond, 5*time.Millisecond
	if raceEnabled { // the race detector's slower scheduling
		lease, grace = 90*time.Millisecond, 15*time.Millisecond
	}
	return newSimLocksLease(ctx, r, lease, grace)
}

// newSimLocksLease is newSimLocks with leases of the length and grace
// given.
func newSimLocksLease(ctx context.Context, r *rand.Rand, lease, grace time.Duration) *simLocks {
	s := &simLocks{running: map[*simClerk]bool{}, incs: map[uint64]uint64{}, r: r, ctx: ctx, lease: lease, grace: grace}
	s.cond = sync.NewCond(&s.mu)
	go func() { // wake waiters when the world ends
		<-ctx.Done()
		s.mu.Lock()
		s.cond.Broadcast()
		s.mu.Unlock()
	}()
	go s.renewals()
	return s
}

// renewals renews the leases of the clerks that reach the service and
// declares dead those that did not renew within lease + grace. A clerk
// cut off is not told: it learns when the cut heals (tell).
func (s *simLocks) renewals() {
	tk := time.NewTicker(s.lease / 8)
	defer tk.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-tk.C:
		}
		s.mu.Lock()
		now := time.Now()
		for _, c := range s.clerks {
			switch {
			case c.dead:
			case !c.cut:
				c.renewed = now
			case now.After(c.renewed.Add(s.lease + s.grace)):
				c.dead = true
				s.startRecoveriesLocked()
				if s.onExpire != nil {
					go s.onExpire(c)
				}
			}
		}
		s.cond.Broadcast() // waiters for a renewal, or for a dead clerk's recovery
		s.mu.Unlock()
	}
}

func (s *simLocks) newClerk(node uint64, recover func(context.Context, lock.Recovery) error) *simClerk {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := &simClerk{s: s, node: node, leases: map[string]*simLease{}, recover: recover, lost: make(chan struct{}), renewed: time.Now(), runs: map[uint64]context.CancelFunc{}}
	s.incs[node]++
	c.inc = s.incs[node]
	s.clerks = append(s.clerks, c)
	s.startRecoveriesLocked()
	return c
}

// kill declares c dead and tells it: it has fenced itself (its calls fail
// from now on); its leases stay until a recovery run on a live clerk
// succeeds.
func (s *simLocks) kill(c *simClerk) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !c.told {
		c.told = true
		close(c.lost)
	}
	if c.dead {
		return
	}
	c.dead = true
	s.startRecoveriesLocked()
	s.cond.Broadcast()
}

// wakeAtEnd wakes the service's waiters when ctx ends (so that a wait on
// s.cond sees it); the caller calls what it returns once it waits no more.
func (s *simLocks) wakeAtEnd(ctx context.Context) func() bool {
	return context.AfterFunc(ctx, func() {
		s.mu.Lock()
		s.cond.Broadcast()
		s.mu.Unlock()
	})
}

// closeClerk is ClerkRT.Close: it refuses while a hold is out
// (ErrStillHeld); it cancels the recovery runs c does and waits for their
// ends, then gives every cached lease back and leaves the master's record
// (it needs the service: a clerk cut off waits, until ctx ends). A clerk
// declared dead first gets ErrFenced: its leases are then a dead clerk's,
// left to a recovery.
func (s *simLocks) closeClerk(ctx context.Context, c *simClerk) error {
	defer s.wakeAtEnd(ctx)()
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, l := range c.leases {
		if l.exclusive || l.shared > 0 {
			return fmt.Errorf("%w: %s", lock.ErrStillHeld, name)
		}
	}
	c.closing = true
	for _, cancel := range c.runs {
		cancel()
	}
	for {
		if c.told || c.dead {
			return lock.ErrFenced
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if len(c.runs) == 0 && !c.cut {
			break
		}
		s.cond.Wait()
	}
	c.leases = map[string]*simLease{}
	s.clerks = slices.DeleteFunc(s.clerks, func(o *simClerk) bool { return o == c })
	s.closes++
	s.startRecoveriesLocked() // (its runs' dead clerks, on another clerk)
	s.cond.Broadcast()
	return nil
}

// setCut cuts c off the lock service (paused: its process frozen too), or
// heals it; a clerk declared dead meanwhile stays dead (its node learns it
// and restarts the server: the world's heal does that).
func (s *simLocks) setCut(c *simClerk, cut, paused bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c.cut, c.paused = cut, paused
	if !cut && !c.dead {
		if time.Now().After(c.renewed.Add(s.lease)) {
			// Past its deadline: fenced for good, like the failure
			// detector's subject (it never revives), verdict or not.
			c.dead = true
		} else {
			c.renewed = time.Now()
			// What it gave back locally while cut off reaches the master.
			for name, l := range c.leases {
				c.settleLocked(name, l)
			}
		}
	}
	s.startRecoveriesLocked()
	s.cond.Broadcast()
}

// alive: c reaches the service and its leases are within their time.
func (c *simClerk) aliveLocked(now time.Time) bool {
	return !c.dead && !c.paused && now.Before(c.renewed.Add(c.s.lease))
}

// failover: the lock master dies and a new one takes over without the
// leases of some dead clerks (not recorded yet when the old one died, in
// the real service): each dead clerk whose recovery has not succeeded and
// is not running — one holding leases, or one that died holding none, as
// a server killed while it waited for its fence lock — is recovered in
// "all" mode from now on, with even odds.
func (s *simLocks) failover() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failovers++
	for _, d := range s.clerks {
		if d.dead && !d.settled && !d.all && !s.running[d] && s.r.Intn(2) == 0 {
			d.all = true
		}
	}
	s.startRecoveriesLocked()
	s.cond.Broadcast()
}

// allPendingLocked: an "all" recovery is pending: the master grants
// nothing new.
func (s *simLocks) allPendingLocked() bool {
	for _, d := range s.clerks {
		if d.dead && d.all {
			return true
		}
	}
	return false
}

// excludedLocked is what an "all" run of d must not touch, as the master's
// excluded: the names any other clerk it knows of holds, live or dead (not
// those of clerks in "all" mode: it does not know them).
func (s *simLocks) excludedLocked(d *simClerk) []string {
	var names []string
	for _, c := range s.clerks {
		if c == d || c.all {
			continue
		}
		for n := range c.leases {
			if !slices.Contains(names, n) {
				names = append(names, n)
			}
		}
	}
	sort.Strings(names)
	return names
}

func (s *simLocks) startRecoveriesLocked() {
	var live []*simClerk
	for _, c := range s.clerks {
		if !c.dead && !c.cut && !c.closing { // a recovery is a message from the service
			live = append(live, c)
		}
	}
	if len(live) == 0 {
		return // deferred until a clerk registers (Boxwood §3.7)
	}
	firstAll := true // "all" runs go one at a time, the first pending first
	for _, d := range s.clerks {
		if !d.dead || d.settled {
			continue
		}
		if !d.all && len(d.leases) == 0 {
			d.settled = true
			continue
		}
		if d.all {
			first := firstAll
			firstAll = false
			if !first || s.allRunning {
				continue
			}
		}
		if s.running[d] {
			continue
		}
		run := live[s.r.Intn(len(live))]
		s.seq++
		tok := lock.Token{Epoch: 1, Seq: s.seq}
		s.running[d] = true
		rec := lock.Recovery{Dead: lock.ClerkID{Node: d.node, Inc: d.inc}, Token: tok}
		if d.all {
			rec.All, rec.Exclude = true, s.excludedLocked(d)
			s.allRunning = true
		} else {
			for n := range d.leases {
				rec.Names = append(rec.Names, n)
			}
		}
		ctx, cancel := context.WithTimeout(s.ctx, 20*time.Second)
		s.seq++
		id := s.seq
		run.runs[id] = cancel // (a close cancels it)
		go func(d, run *simClerk, rec lock.Recovery) {
			// Renew, as the lock master's: a newer token for a run whose
			// clerk can reach the service (a message on its session).
			renew := func(context.Context) (lock.Token, error) {
				s.mu.Lock()
				defer s.mu.Unlock()
				if run.dead || run.cut || s.noRenew {
					return lock.Token{}, lock.ErrRenewRefused
				}
				s.seq++
				s.runRenewals++
				return lock.Token{Epoch: 1, Seq: s.seq}, nil
			}
			rec.Renew = renew
			err := run.recover(ctx, rec)
			cancel()
			s.mu.Lock()
			defer s.mu.Unlock()
			delete(s.running, d)
			delete(run.runs, id)
			s.cond.Broadcast() // (a close waits for its runs' ends)
			if rec.All {
				s.allRunning = false
			}
			// The master ignores the end of a run on a clerk declared dead
			// meanwhile, and recovers again (lock.Engine.RecoveryFinished).
			if err == nil && !run.dead {
				d.leases = map[string]*simLease{}
				d.settled = true
				if d.all {
					d.all = false
					s.allRuns++
				}
				s.startRecoveriesLocked() // the next "all" run
				s.cond.Broadcast()
			} else if s.ctx.Err() == nil {
				time.AfterFunc(5*time.Millisecond, func() {
					s.mu.Lock()
					s.startRecoveriesLocked()
					s.mu.Unlock()
				})
			}
		}(d, run, rec)
	}
}

type simHold struct {
	c     *simClerk
	name  string
	mode  lock.Mode
	token lock.Token
	once  sync.Once
}

func (h *simHold) Token() lock.Token { return h.token }

func (h *simHold) Release() {
	h.once.Do(func() {
		s := h.c.s
		s.mu.Lock()
		defer s.mu.Unlock()
		l := h.c.leases[h.name]
		if l == nil || h.c.dead {
			return // a dead clerk's leases wait for its recovery
		}
		if h.mode == lock.Exclusive {
			l.exclusive = false
		} else {
			l.shared--
		}
		h.c.settleLocked(h.name, l)
		s.cond.Broadcast()
	})
}

// settleLocked completes a pending revocation if local holders allow and
// the clerk can tell the master (not cut off: then at the heal).
func (c *simClerk) settleLocked(name string, l *simLease) {
	if !l.revoking || c.cut {
		return
	}
	if l.exclusive || l.keep == lock.None && l.shared > 0 {
		return
	}
	l.revoking = false
	if l.keep == lock.None {
		delete(c.leases, name)
	} else {
		l.mode = l.keep
	}
}

func (c *simClerk) Acquire(ctx context.Context, name string, mode lock.Mode) (Hold, error) {
	s := c.s
	defer s.wakeAtEnd(ctx)()
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		if c.told {
			return nil, lock.ErrFenced
		}
		if c.closing {
			return nil, lock.ErrClosed
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if !c.aliveLocked(time.Now()) {
			// Past its leases' time (cut off, or declared dead and not told
			// yet), or frozen: like the real engine, it grants nothing, not
			// even a cached lease, until it renews or learns it is fenced.
			s.cond.Wait()
			continue
		}
		l := c.leases[name]
		if l != nil && l.mode >= mode && !l.revoking {
			local := mode == lock.Shared && !l.exclusive || mode == lock.Exclusive && !l.exclusive && l.shared == 0
			if local {
				if mode == lock.Exclusive {
					l.exclusive = true
				} else {
					l.shared++
				}
				return &simHold{c: c, name: name, mode: mode, token: l.token}, nil
			}
			s.cond.Wait()
			continue
		}
		if l != nil && l.revoking || c.cut || s.allPendingLocked() {
			// (cut off: the master is out of reach; an "all" recovery
			// pending: it grants nothing new)
			s.cond.Wait()
			continue
		}
		// Ask the "master": revoke conflicting leases elsewhere.
		blocked := false
		for _, o := range s.clerks {
			ol := o.leases[name]
			if o == c || ol == nil || (mode == lock.Shared && ol.mode == lock.Shared) {
				continue
			}
			if o.dead || o.cut {
				blocked = true
				continue // held until its recovery, or until the revocation reaches it
			}
			keep := lock.None
			if mode == lock.Shared {
				keep = lock.Shared
			}
			if !ol.revoking || keep < ol.keep {
				ol.revoking, ol.keep = true, keep
				o.settleLocked(name, ol)
				if o.leases[name] == ol && ol.revoking && o.onRevoke != nil {
					f := o.onRevoke
					go f(name)
				}
			}
			if x := o.leases[name]; x != nil && !(mode == lock.Shared && x.mode == lock.Shared) {
				blocked = true // not given up at once: wait for its holders
			}
		}
		if blocked {
			s.cond.Wait()
			continue
		}
		s.seq++
		if l == nil {
			l = &simLease{}
			c.leases[name] = l
		}
		l.mode, l.token = mode, lock.Token{Epoch: 1, Seq: s.seq}
	}
}

func (c *simClerk) Revoking(name string) bool {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	l := c.leases[name]
	return l != nil && l.revoking
}

func (c *simClerk) Lost() <-chan struct{} { return c.lost }

// ValidUntil: the leases hold until the last renewal + lease (a clerk cut
// off, or declared dead and not told yet, sees that time pass), and not at
// all once the clerk knows it is dead.
func (c *simClerk) ValidUntil() time.Time {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	if c.told {
		return time.Time{}
	}
	return c.renewed.Add(c.s.lease)
}

// drop gives an idle lease back (the fence renewal's fresh token); a clerk
// cut off cannot.
func (c *simClerk) drop(name string) error {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	if c.cut {
		return errors.New("sim: cut off the lock service")
	}
	if l := c.leases[name]; l != nil && l.shared == 0 && !l.exclusive {
		delete(c.leases, name)
		c.s.cond.Broadcast()
	}
	return nil
}

// ---- chunks

type simChunks struct {
	mu        sync.Mutex
	r         *rand.Rand
	next      uint64
	data      map[Handle][]byte
	owner     map[Handle]uint64 // the node that allocated it
	freed     map[Handle]bool
	tokens    map[uint64]map[string]lock.Token // per simulated RLDev
	lossRate  float64                          // writes whose answer is lost (they land later, or never)
	late      sync.WaitGroup
	lateCount int
	refused   int
	torn      int // node writes landed torn (their writer died mid-write)
	trace     func(string)
	// Owned allocations (chunk.Owner), as a chunk manager keeps them: tag
	// per chunk, retirement marks per log. lostAllocs counts allocations
	// whose answer was lost (lossRate of them: the chunk is allocated and
	// tagged, the caller told "may have taken effect"); retiredRefused
	// the allocations refused as retired.
	tag            map[Handle]chunk.Owner
	retired        map[uint64]lock.Token
	lostAllocs     int
	retriedAllocs  int // of lostAllocs, those the clerk retried with success
	retiredRefused int
}

func newSimChunks(r *rand.Rand) *simChunks {
	return &simChunks{r: r, data: map[Handle][]byte{}, owner: map[Handle]uint64{}, freed: map[Handle]bool{}, tokens: map[uint64]map[string]lock.Token{},
		tag: map[Handle]chunk.Owner{}, retired: map[uint64]lock.Token{}}
}

func rldevOf(h Handle) uint64 { return h.ID % 3 }

// clerk is node's view of the store (allocations are attributed to it).
func (s *simChunks) clerk(node uint64, gate func(context.Context) error) *simChunkClerk {
	return &simChunkClerk{s: s, node: node, gate: gate}
}

type simChunkClerk struct {
	s    *simChunks
	node uint64
	// gate is the caller's state before a call is sent: it waits while
	// the caller is frozen, and fails if it is dead or cut off the store.
	gate func(context.Context) error
	// strays: MaybeStrays (allocations whose answer was lost).
	strays atomic.Uint64
	// crash, if set, is asked before each node write whether the
	// writer's node crashes in the middle of it: the write then lands
	// torn (part new image, part old bytes) and the writer is dead.
	crash func() bool
	// midRead, if set, runs in each read between the gate and the store's
	// answer: a server paused with a read in flight (review 45).
	midRead func()
}

func (c *simChunkClerk) MaybeStrays() uint64 { return c.strays.Load() }

var (
	errSimDead = errors.New("sim: this server is dead")
	// errSimAborted: the server was killed while it started.
	errSimAborted = errors.New("sim: the server died while it started")
	errSimCut     = errors.New("sim: this server is cut off the storage (the call was not sent)")
)

func (c *simChunkClerk) Allocate(ctx context.Context, size uint64, owner chunk.Owner) (Handle, error) {
	if err := c.gate(ctx); err != nil {
		return Handle{}, err
	}
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if t, ok := s.retired[owner.Log]; ok && !owner.IsZero() && owner.Token.Less(t) {
		s.retiredRefused++
		return Handle{}, fmt.Errorf("%w: %v", chunk.ErrRetired, owner)
	}
	alloc := func() Handle {
		s.next++
		h := Handle{CM: 1, ID: s.next}
		s.data[h] = make([]byte, size)
		s.owner[h] = c.node
		if !owner.IsZero() {
			s.tag[h] = owner
		}
		return h
	}
	h := alloc()
	if s.r.Float64() < s.lossRate {
		// Allocated, and its answer lost: the caller never learns the
		// id. The clerk counts it (MaybeStrays) and tries again, as
		// chunk.Clerk does; the retry succeeds, or its answer is lost
		// too and the allocation fails.
		s.lostAllocs++
		c.strays.Add(1)
		if s.r.Intn(2) == 0 {
			s.retriedAllocs++
			return alloc(), nil
		}
		return Handle{}, fmt.Errorf("sim: the allocation's answer was lost: %w", chunk.ErrMaybeDone)
	}
	return h, nil
}

func (c *simChunkClerk) Disown(ctx context.Context, hs []Handle) error {
	if err := c.gate(ctx); err != nil {
		return err
	}
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, h := range hs {
		delete(s.tag, h)
	}
	return nil
}

func (c *simChunkClerk) RetireOwners(ctx context.Context, log uint64, below lock.Token) error {
	if err := c.gate(ctx); err != nil {
		return err
	}
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if t, ok := s.retired[log]; !ok || t.Less(below) {
		s.retired[log] = below
	}
	return nil
}

func (c *simChunkClerk) Owned(ctx context.Context, log uint64, below lock.Token) ([]Handle, error) {
	if err := c.gate(ctx); err != nil {
		return nil, err
	}
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Handle
	for h, o := range s.tag {
		if o.Log == log && o.Token.Less(below) {
			out = append(out, h)
		}
	}
	slices.SortFunc(out, func(a, b Handle) int { return cmp.Compare(a.ID, b.ID) })
	return out, nil
}

func (c *simChunkClerk) Read(ctx context.Context, h Handle, n uint64) ([]byte, error) {
	if err := c.gate(ctx); err != nil {
		return nil, err
	}
	if c.midRead != nil {
		c.midRead()
	}
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	d, ok := s.data[h]
	if !ok {
		return nil, chunk.ErrUnallocated
	}
	out := make([]byte, n)
	copy(out, d)
	return out, nil
}

func (s *simChunks) apply(h Handle, data []byte, f *rldev.Fence, late bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f == nil || f.Token.IsZero() {
		panic("sim: an unfenced node write")
	}
	// An unallocated chunk is refused by the chunk manager before any
	// RLDev sees the write (its token is not admitted).
	d, ok := s.data[h]
	if !ok {
		return chunk.ErrUnallocated
	}
	t := s.tokens[rldevOf(h)]
	if t == nil {
		t = map[string]lock.Token{}
		s.tokens[rldevOf(h)] = t
	}
	if f.Token.Less(t[f.Name]) {
		if s.trace != nil {
			s.trace(fmt.Sprintf("refused %v by %s %s (late %v)", h, f.Name, f.Token, late))
		}
		s.refused++
		return fmt.Errorf("%w: %s", chunk.ErrFenced, f.Name)
	}
	t[f.Name] = f.Token
	if s.trace != nil {
		v, _ := imageVersion(data)
		var keys [][]byte
		if n, err := decode(data); err == nil {
			keys = n.Keys
		}
		s.trace(fmt.Sprintf("write %v v%d by %s %s late %v keys %q", h, v, f.Name, f.Token, late, keys))
	}
	if len(data) > len(d) {
		return fmt.Errorf("sim: a write of %d bytes to a %d-byte chunk", len(data), len(d))
	}
	copy(d, data)
	return nil
}

// applyTorn lands a write of data to h torn (if its fence admits it):
// the first cut bytes new and the rest old, or the other way round.
func (s *simChunks) applyTorn(h Handle, data []byte, f *rldev.Fence) {
	s.mu.Lock()
	old := slices.Clone(s.data[h])
	cut := 1 + s.r.Intn(len(data)-1)
	newFirst := s.r.Intn(2) == 0
	s.mu.Unlock()
	torn := slices.Clone(data)
	if newFirst {
		copy(torn[cut:], old[min(cut, len(old)):])
	} else {
		copy(torn[:cut], old)
	}
	if s.trace != nil {
		s.trace(fmt.Sprintf("torn write of %v at byte %d (new first %v)", h, cut, newFirst))
	}
	_ = s.apply(h, torn, f, false)
	s.mu.Lock()
	s.torn++
	s.mu.Unlock()
}

func (c *simChunkClerk) Write(ctx context.Context, h Handle, data []byte, f *rldev.Fence) error {
	s := c.s
	s.mu.Lock()
	lose := s.r.Float64() < s.lossRate
	delay := time.Duration(s.r.Intn(30)) * time.Millisecond
	s.mu.Unlock()
	if err := c.gate(ctx); err != nil {
		return err
	}
	if c.crash != nil && isNodeImage(data) && c.crash() {
		// The writer's machine dies mid-write: the chunk keeps a part of
		// the new image and a part of what it held (a write of several
		// blocks cut off; worse than the RLDev's, which keeps each 4 KiB
		// block whole), and the writer is gone.
		s.applyTorn(h, data, f)
		return errSimDead
	}
	if lose {
		// The answer is lost; the write itself lands later (or, if its
		// fence is stale by then, is refused), after the writer moved on.
		// Half the time the chunk clerk's retry gets through meanwhile:
		// the write is done, and its first attempt still lands later
		// (chunkStore.Write's errWrittenEarlierMayLand).
		data := append([]byte(nil), data...)
		fc := *f
		s.late.Add(1)
		s.mu.Lock()
		s.lateCount++
		retried := s.r.Intn(2) == 0
		if s.trace != nil {
			v, _ := imageVersion(data)
			s.trace(fmt.Sprintf("write %v v%d by %s %s sent, its answer lost: lands in %v (retried %v)", h, v, f.Name, f.Token, delay, retried))
		}
		s.mu.Unlock()
		time.AfterFunc(delay, func() {
			defer s.late.Done()
			_ = s.apply(h, data, &fc, true)
		})
		if retried {
			if err := s.apply(h, data, f, false); err != nil {
				return err
			}
			return fmt.Errorf("sim: writing chunk %v: %w", h, errWrittenEarlierMayLand)
		}
		return fmt.Errorf("sim: the write's answer was lost: %w", chunk.ErrMaybeDone)
	}
	return s.apply(h, data, f, false)
}

func (c *simChunkClerk) Free(ctx context.Context, h Handle) error {
	if err := c.gate(ctx); err != nil {
		return err
	}
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.data[h]; !ok {
		return nil
	}
	delete(s.data, h)
	delete(s.tag, h)
	s.freed[h] = true
	return nil
}

// ---- the log's device

// simDevice is a log's RLDev: two replicas in memory, every write on both
// (durable when it returns), tokens admitted per lock name.
type simDevice struct {
	mu     sync.Mutex
	blocks uint64
	rep    [2]map[uint64][]byte
	tokens map[string]lock.Token
}

func newSimDevice(blocks uint64) *simDevice {
	return &simDevice{blocks: blocks, rep: [2]map[uint64][]byte{{}, {}}, tokens: map[string]lock.Token{}}
}

func (d *simDevice) Blocks() uint64 { return d.blocks }

// clone is a copy of d: its blocks and tokens.
func (d *simDevice) clone() *simDevice {
	d.mu.Lock()
	defer d.mu.Unlock()
	c := newSimDevice(d.blocks)
	for r := range d.rep {
		for b, data := range d.rep[r] {
			c.rep[r][b] = append([]byte(nil), data...)
		}
	}
	for n, t := range d.tokens {
		c.tokens[n] = t
	}
	return c
}

// gatedDevice is a server's own view of its log's device: its calls pass
// the server's gate (frozen, dead, cut off the storage) before they are
// sent.
type gatedDevice struct {
	*simDevice
	gate func(context.Context) error
}

func (d gatedDevice) Write(ctx context.Context, block uint64, data []byte, f *rldev.Fence) error {
	if err := d.gate(ctx); err != nil {
		return err
	}
	return d.simDevice.Write(ctx, block, data, f)
}

func (d gatedDevice) ReadReplica(ctx context.Context, replica int, block, n uint64) ([]byte, error) {
	if err := d.gate(ctx); err != nil {
		return nil, err
	}
	return d.simDevice.ReadReplica(ctx, replica, block, n)
}

func (d gatedDevice) WriteReplica(ctx context.Context, replica int, block uint64, data []byte, f *rldev.Fence) error {
	if err := d.gate(ctx); err != nil {
		return err
	}
	return d.simDevice.WriteReplica(ctx, replica, block, data, f)
}

func (d *simDevice) admit(f *rldev.Fence) error {
	if f == nil {
		return nil
	}
	if f.Token.Less(d.tokens[f.Name]) {
		return fmt.Errorf("%w: %s", rldev.ErrStaleToken, f.Name)
	}
	d.tokens[f.Name] = f.Token
	return nil
}

func (d *simDevice) Write(ctx context.Context, block uint64, data []byte, f *rldev.Fence) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.admit(f); err != nil {
		return err
	}
	for r := 0; r < 2; r++ {
		for i := 0; i*txn.BlockSize < len(data); i++ {
			d.rep[r][block+uint64(i)] = append([]byte(nil), data[i*txn.BlockSize:(i+1)*txn.BlockSize]...)
		}
	}
	return nil
}

func (d *simDevice) ReadReplica(ctx context.Context, replica int, block, n uint64) ([]byte, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]byte, 0, n*txn.BlockSize)
	for i := uint64(0); i < n; i++ {
		b := d.rep[replica][block+i]
		if b == nil {
			b = make([]byte, txn.BlockSize)
		}
		out = append(out, b...)
	}
	return out, nil
}

func (d *simDevice) WriteReplica(ctx context.Context, replica int, block uint64, data []byte, f *rldev.Fence) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.admit(f); err != nil {
		return err
	}
	for i := 0; i*txn.BlockSize < len(data); i++ {
		d.rep[replica][block+uint64(i)] = append([]byte(nil), data[i*txn.BlockSize:(i+1)*txn.BlockSize]...)
	}
	return nil
}

// ---- one server alone (the scripted tests' rig)

// soloServer is node 1's B-tree server alone over the stand-ins: its clerk
// holds its fence lock and its log's lock, and its cache (whose renewals
// fail: nothing in these tests needs one) hears of revocations. The
// caller opens the log on logFence and sets cache.cfg.Log.
type soloServer struct {
	clerk    *simClerk
	fence    func() *rldev.Fence
	logFence rldev.Fence
	cache    *Cache
}

// newLoggedSolo is a soloServer (node 1) on simulated chunks (seed's),
// with a log (commits are durable in it) and its owner set (allocations
// tag): the chunks it uses are wrap's of the store's clerk (wrap nil: the
// clerk itself).
func newLoggedSolo(t *testing.T, ctx context.Context, seed int64, wrap func(*simChunkClerk) Chunks) (*simChunks, *simChunkClerk, *soloServer, chunk.Owner) {
	t.Helper()
	r := rand.New(rand.NewSource(seed))
	locks := newSimLocks(ctx, r)
	store := newSimChunks(r)
	clerk := store.clerk(1, func(context.Context) error { return nil })
	var chunks Chunks = clerk
	if wrap != nil {
		chunks = wrap(clerk)
	}
	solo := newSoloServer(t, ctx, locks, chunks)
	dev := newSimDevice(txn.HeaderBlocks + 256)
	wal, err := txn.Open(ctx, txn.Config{Device: dev, Fence: solo.logFence,
		Applier: replayApplier{chunks: chunks, fence: solo.fence}, Checkpointer: solo.cache, LazyInterval: time.Hour, Log: simLog})
	if err != nil {
		t.Fatal(err)
	}
	solo.cache.cfg.Log = wal
	owner := chunk.Owner{Log: OwnerLog(1), Token: solo.logFence.Token}
	solo.cache.setOwner(owner)
	return store, clerk, solo, owner
}

func newSoloServer(t *testing.T, ctx context.Context, locks *simLocks, chunks Chunks) *soloServer {
	t.Helper()
	clerk := locks.newClerk(1, func(context.Context, lock.Recovery) error { return nil })
	fh, err := clerk.Acquire(ctx, FenceLock(1), lock.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	lh, err := clerk.Acquire(ctx, txn.LockName(LogName(1)), lock.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	fence := func() *rldev.Fence { return &rldev.Fence{Name: FenceLock(1), Token: fh.Token()} }
	cache := NewCache(CacheConfig{Locks: clerk, Chunks: chunks, Fence: fence,
		Renew: func(context.Context) error { return errors.New("solo server: no renewal") }, Log2: simLog})
	locks.mu.Lock()
	clerk.onRevoke = cache.Revoked
	locks.mu.Unlock()
	return &soloServer{clerk: clerk, fence: fence, logFence: rldev.Fence{Name: txn.LockName(LogName(1)), Token: lh.Token()}, cache: cache}
}

// simDirectory is the config service's tree directory as the simulator
// keeps it: one namespace, each decree computed from it and applied at
// once, as meta.Client.Update's conditional decrees are, one at a time. A
// decree's answer is lost lossRate of the time: after it was applied, the
// caller is told it failed (Update gave up), or, as often, the decree is
// computed again from the namespace it changed (Update's retry after a
// stale version: createTreeOps must take its own committed attempt for
// success); or the creation's decree is held back and lands 1-30 ms after
// its caller was told it failed (a proposal still in flight when Update
// gave up), computed then from the namespace as it is (the real decree,
// conditional on the version it was computed from, is refused after any
// change: the stand-in lets more through, never less).
type simDirectory struct {
	mu       sync.Mutex
	r        *rand.Rand
	ns       *pb.Namespace
	lossRate float64
	late     sync.WaitGroup
	// Counters: decrees whose answer was lost, those run again, those
	// that landed late, the creations refused as retired, the
	// retirements made, the drop decrees that landed late.
	lost, rerun, landedLate, refused, retires, dropsLate int
	// unsafeKeepName (teeth): a drop's decree records the drop but
	// leaves the tree's name.
	unsafeKeepName bool
	// maxRerun bounds the wait before a decree's attempt is run again
	// (rerunWait); minRerun (teeth) is its least.
	maxRerun, minRerun time.Duration
	// rerunCreations (teeth): every creation's answer is lost after it
	// was applied, and the decree run again.
	rerunCreations bool
}

func newSimDirectory(r *rand.Rand) *simDirectory {
	return &simDirectory{r: r, ns: &pb.Namespace{Name: Namespace}, maxRerun: 30 * time.Millisecond}
}

// clerk is a server's view of the directory: each call passes its gate
// first (a dead server's fails; a paused one's waits, and goes out late).
func (d *simDirectory) clerk(gate func(context.Context) error) simDirClerk {
	return simDirClerk{d: d, gate: gate}
}

type simDirClerk struct {
	d    *simDirectory
	gate func(context.Context) error
}

var errSimDecreeLost = errors.New("sim: the directory decree's answer was lost")

func (c simDirClerk) Lookup(ctx context.Context, name string) (TreeEntry, error) {
	if err := c.gate(ctx); err != nil {
		return TreeEntry{}, err
	}
	c.d.mu.Lock()
	defer c.d.mu.Unlock()
	return lookupIn(c.d.ns, name)
}

func (c simDirClerk) Trees(ctx context.Context) (map[string]TreeEntry, error) {
	if err := c.gate(ctx); err != nil {
		return nil, err
	}
	c.d.mu.Lock()
	defer c.d.mu.Unlock()
	return Trees(c.d.ns)
}

func (c simDirClerk) Create(ctx context.Context, e TreeEntry, root Handle, owner chunk.Owner) (*TreeEntry, error) {
	if err := c.gate(ctx); err != nil {
		return nil, err
	}
	d := c.d
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.r.Float64() < d.lossRate/2 {
		d.landLate(func() {
			existing, err := nsCreate(d.ns, e, root, owner)
			if errors.Is(err, ErrCreatorRetired) {
				d.refused++
			} else if err == nil && existing == nil {
				d.landedLate++
			}
		})
		return nil, fmt.Errorf("sim: the creation's decree is still in flight: %w", context.DeadlineExceeded)
	}
	existing, err := nsCreate(d.ns, e, root, owner)
	if errors.Is(err, ErrCreatorRetired) {
		d.refused++
	}
	if err == nil && existing == nil && (d.r.Float64() < d.lossRate || d.rerunCreations) {
		d.lost++
		if d.r.Intn(2) == 0 && !d.rerunCreations {
			return nil, errSimDecreeLost
		}
		d.rerun++
		if err := d.rerunWait(ctx); err != nil {
			return nil, err
		}
		return nsCreate(d.ns, e, root, owner)
	}
	return existing, err
}

// landLate counts a decree's answer lost and applies it (apply, under
// d.mu) 1-30 ms later: a proposal still in flight when Update gave up.
func (d *simDirectory) landLate(apply func()) {
	d.lost++
	delay := time.Duration(1+d.r.Intn(30)) * time.Millisecond
	d.late.Add(1)
	go func() {
		defer d.late.Done()
		time.Sleep(delay)
		d.mu.Lock()
		defer d.mu.Unlock()
		apply()
	}()
}

// rerunWait is the time between an attempt whose answer was lost and
// Update's next attempt: d.mu is let go for up to maxRerun (drops,
// settles and finishes go on meanwhile), then taken again; an error if
// ctx ends first (Update gave up; the outcome stays unknown). maxRerun
// is the simulator's bound on a decree's attempts, as OpTimeout is the
// servers' (drop.go): below simDropWait, so that no attempt of a creation
// lands after the drop of its tree was finished.
func (d *simDirectory) rerunWait(ctx context.Context) error {
	delay := d.minRerun + time.Duration(d.r.Int63n(int64(d.maxRerun-d.minRerun)+1))
	d.mu.Unlock()
	defer d.mu.Lock()
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return fmt.Errorf("sim: Update gave up before it ran the decree again: %w", ctx.Err())
	case <-t.C:
		return nil
	}
}

func (c simDirClerk) RetireCreators(ctx context.Context, log uint64, below lock.Token) error {
	if err := c.gate(ctx); err != nil {
		return err
	}
	d := c.d
	d.mu.Lock()
	defer d.mu.Unlock()
	if ops := retireCreatorsOps(d.ns, log, below); len(ops) > 0 {
		applyOps(d.ns, ops)
		d.retires++
	}
	if d.r.Float64() < d.lossRate {
		d.lost++
		return errSimDecreeLost
	}
	return nil
}

func (c simDirClerk) Named(ctx context.Context) (map[Handle]bool, error) {
	if err := c.gate(ctx); err != nil {
		return nil, err
	}
	c.d.mu.Lock()
	defer c.d.mu.Unlock()
	return namedChunks(c.d.ns)
}

func (c simDirClerk) RecordDrop(ctx context.Context, e TreeEntry, marked time.Time) error {
	if err := c.gate(ctx); err != nil {
		return err
	}
	d := c.d
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.r.Float64() < d.lossRate/2 {
		d.landLate(func() {
			if ops, applied, err := d.dropOps(e, marked); err == nil && applied {
				applyOps(d.ns, ops)
				d.dropsLate++
			}
		})
		return fmt.Errorf("sim: the drop's decree is still in flight: %w", context.DeadlineExceeded)
	}
	ops, applied, err := d.dropOps(e, marked)
	if err != nil {
		return err
	}
	if !applied {
		return droppedDrop(d.ns, e)
	}
	applyOps(d.ns, ops)
	if d.r.Float64() < d.lossRate {
		d.lost++
		if d.r.Intn(2) == 0 {
			return errSimDecreeLost
		}
		d.rerun++
		if err := d.rerunWait(ctx); err != nil {
			return err
		}
		ops, applied, err := d.dropOps(e, marked)
		if err != nil {
			return err
		}
		if applied {
			// (Its first attempt's record finished and the name
			// listed again meanwhile: a new tree's, which
			// dropTreeOps's anchor check leaves alone.)
			applyOps(d.ns, ops)
			return nil
		}
		return droppedDrop(d.ns, e)
	}
	return nil
}

// dropOps is dropTreeOps, or with unsafeKeepName its decree without the
// name's removal (and then applied only once).
func (d *simDirectory) dropOps(e TreeEntry, marked time.Time) ([]*pb.Op, bool, error) {
	ops, applied, err := dropTreeOps(d.ns, e, marked)
	if !d.unsafeKeepName || !applied {
		return ops, applied, err
	}
	for _, kv := range d.ns.GetEntries() {
		if kv.Key == dropKey(e.Anchor) {
			return nil, false, nil
		}
	}
	return ops[1:], true, nil
}

func (c simDirClerk) Drops(ctx context.Context) ([]pendingDrop, error) {
	if err := c.gate(ctx); err != nil {
		return nil, err
	}
	c.d.mu.Lock()
	defer c.d.mu.Unlock()
	return pendingDrops(c.d.ns), nil
}

func (c simDirClerk) Dropped(ctx context.Context, e TreeEntry) error {
	if err := c.gate(ctx); err != nil {
		return err
	}
	d := c.d
	d.mu.Lock()
	defer d.mu.Unlock()
	applyOps(d.ns, droppedOps(d.ns, e.Anchor))
	if d.r.Float64() < d.lossRate {
		d.lost++
		return errSimDecreeLost
	}
	return nil
}

// strayRecords lists the root records that name an anchor no listed tree
// and no drop under way has (a creation's record outliving its tree).
func (d *simDirectory) strayRecords() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	live := map[string]bool{}
	ts, err := Trees(d.ns)
	if err != nil {
		panic(err)
	}
	for _, e := range ts {
		live[rootKey(e.Anchor)] = true
	}
	for _, dr := range pendingDrops(d.ns) {
		live[rootKey(dr.Anchor)] = true
	}
	var out []string
	for _, kv := range d.ns.GetEntries() {
		if strings.HasPrefix(kv.Key, "root/") && !live[kv.Key] {
			out = append(out, kv.Key)
		}
	}
	return out
}

// drops lists the drops under way.
func (d *simDirectory) drops() []pendingDrop {
	d.mu.Lock()
	defer d.mu.Unlock()
	return pendingDrops(d.ns)
}

// trees lists the directory's trees.
func (d *simDirectory) trees() map[string]TreeEntry {
	d.mu.Lock()
	defer d.mu.Unlock()
	ts, err := Trees(d.ns)
	if err != nil {
		panic(err)
	}
	return ts
}

// named is what the directory names now.
func (d *simDirectory) named() map[Handle]bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	n, err := namedChunks(d.ns)
	if err != nil {
		panic(err)
	}
	return n
}
