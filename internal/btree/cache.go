package btree

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/grovestore/grove/internal/chunk"
	"github.com/grovestore/grove/internal/lock"
	"github.com/grovestore/grove/internal/rldev"
	"github.com/grovestore/grove/internal/txn"
	"golang.org/x/sync/errgroup"
)

// A B-tree server's node cache: the Store of every tree the server serves.
// Nodes live in chunks; a server caches a node only while its lock clerk
// holds a lease on the node's lock (a pin: one clerk-level hold the cache
// keeps), so caches stay coherent through the lock service (Boxwood §3.7,
// in Frangipani's manner):
//
//   - Local operations lock a node with a local latch (the Store's Lock);
//     the pin is taken, in the mode the latch needs, before the image is
//     read from its chunk, and kept afterwards.
//   - A change is a log transaction (Commit: every changed image as a
//     redo record with the image it replaces as undo, then a commit record)
//     and a new image published in the cache. Images are immutable, so a
//     lock-free reader sees a whole one.
//   - The node is then dirty: its image goes to its chunk later (write
//     back), once the log is durable up to its last change (the
//     write-ahead rule), fenced with the server's fence token: when the
//     master revokes the pin (another server wants the node), before the
//     log drops the records that protect it (txn.Checkpointer), or when
//     the cache evicts it. Only then is the pin given back, so the next
//     holder reads the latest image from the chunk.
//   - A pin that is given back drops the cached image: a server never
//     reads a node from its cache without holding a lease on it.
//
// Durability contract: Commit returns the LSN after the change's commit
// record; Durable(lsn) returns once the log has it on both replicas of its
// RLDev. The tree acknowledges an operation only after Durable of its own
// change and of every image it read (an image may carry another
// operation's change still on its way to the log). A chunk never holds an
// image whose change is not durable in the log (no steal), so the log's
// records carry the new images only (redo-only), and recovery's redo of
// the committed ones rebuilds exactly the committed state.

// Locks is the lock clerk as the cache uses it.
type Locks interface {
	Acquire(ctx context.Context, name string, mode lock.Mode) (Hold, error)
	// Revoking reports whether the master revoked the lease on name and
	// waits for local holders (the cache's pin) to release.
	Revoking(name string) bool
	// Lost is closed once the clerk's leases are lost (its node fenced
	// itself, or was declared dead): the cache stops serving at once.
	Lost() <-chan struct{}
	// ValidUntil is the local time until which every lease the clerk
	// holds is guaranteed (no dead verdict on its incarnation, hence no
	// grant elsewhere, can come before it); zero once they are lost. A
	// server paused past it may resume before its node notices and fences
	// itself: its cached images may be stale by then.
	ValidUntil() time.Time
}

// Hold is one granted hold of a lock.
type Hold interface {
	Token() lock.Token
	Release()
}

// Chunks is the chunk store as the cache uses it.
type Chunks interface {
	// Allocate returns a new chunk of size bytes, allocated durably and
	// tagged with owner (chunk.Owner; zero: none): a committed image may
	// name it at once.
	Allocate(ctx context.Context, size uint64, owner chunk.Owner) (Handle, error)
	// Disown takes the owner tag off hs: the changes that name them are
	// durable in the log (chunk.Clerk.Disown).
	Disown(ctx context.Context, hs []Handle) error
	// RetireOwners and Owned: what a log's older holders allocated and
	// never linked, found by whoever holds the log next (a recovery run,
	// or the server's next start) and freed (chunk.Clerk's).
	RetireOwners(ctx context.Context, log uint64, below lock.Token) error
	Owned(ctx context.Context, log uint64, below lock.Token) ([]Handle, error)
	// MaybeStrays counts the owned allocations so far that may have left
	// a chunk no handle was returned for (chunk.Clerk.MaybeStrays): when
	// it moves, CollectStrays frees them.
	MaybeStrays() uint64
	// Read reads the first n bytes of h (chunk.ErrUnallocated if freed).
	Read(ctx context.Context, h Handle, n uint64) ([]byte, error)
	// Write writes data at the start of h, fenced by f.
	Write(ctx context.Context, h Handle, data []byte, f *rldev.Fence) error
	// Free frees h (nil if already free).
	Free(ctx context.Context, h Handle) error
}

// DefaultCacheNodes is a server's default cache bound, in nodes: 128 MiB
// of images at the default 8 KiB nodes. At 4 096 (32 MiB) a tree of 120 000
// 272-byte entries outgrew it on one server and gets halved (their leaves
// read from chunks, each under a lease taken anew).
const DefaultCacheNodes = 16384

// LockName is the lock of node (or anchor) h.
func LockName(h Handle) string { return "btree/n/" + h.String() }

// AnchorSize is the size of an anchor's chunk.
const AnchorSize = 4096

// CacheConfig wires a cache.
type CacheConfig struct {
	Locks  Locks
	Chunks Chunks
	Log    *txn.Log
	// Fence is the fence of write-backs now (the server's fence lock and
	// its token); Renew replaces the token by a newer one, after a write
	// whose outcome is unknown: the retry, under the newer token, makes
	// the RLDev refuse the first attempt if it arrives late.
	Fence func() *rldev.Fence
	Renew func(ctx context.Context) error
	// Owner tags the chunks the cache allocates (nil: no tag): the
	// server's log and its token on it (OwnerOf).
	Owner func() chunk.Owner
	// Named returns the chunks the tree directory names (nil: none are
	// tagged), which the stray collection leaves alone: a tree's anchor
	// and first root may stay tagged with an earlier holder of the log
	// (created.go). It fails until the directory refuses creations by
	// the log's earlier holders (Server.named).
	Named func(ctx context.Context) (map[Handle]bool, error)
	// Capacity bounds the nodes cached (default DefaultCacheNodes).
	Capacity int
	Log2     *slog.Logger
}

// loggedFree is a value chunk to free, named by a free record of a
// committed change: rec is a position inside that record, end the
// change's commit (durable first: until then the tree may name the chunk
// again after a crash).
type loggedFree struct {
	rec, end uint64
	tries    int // checkpoints whose free of it failed
}

// linkTarget is the target of a link record: one per chunk a change names
// for the first time (a new node, a new value chunk), logged in the
// change's own transaction. The chunk was allocated tagged with the
// server's owner (chunk.Owner), so that a recovery of the server's log can
// find and free what the server allocated and never linked; a replay
// disowns the chunks of the committed link records first, and a checkpoint
// disowns them (disownLogged) before the log may forget the records.
func linkTarget(h Handle) []byte {
	t := txn.ChunkTarget(h)
	t[0] = 'L'
	return t
}

// parseLinkTarget decodes linkTarget.
func parseLinkTarget(t []byte) (Handle, bool) {
	if len(t) == 0 || t[0] != 'L' {
		return Handle{}, false
	}
	c := slices.Clone(t)
	c[0] = 'c'
	h, err := txn.ParseChunkTarget(c)
	return h, err == nil
}

// OwnerLog is the chunk.Owner log number of node's B-tree log (LogName).
func OwnerLog(node uint64) uint64 { return node }

// freeTarget is the target of a free record (one per value chunk a
// change stops naming: the value a put replaced or a delete removed),
// logged in the change's own transaction: once the change is durable
// the chunk is garbage, and a replay of the log frees it again if the
// server died first (chunk ids are never reused: freeing a freed chunk
// is harmless). Node images' records have txn.ChunkTarget's form.
func freeTarget(h Handle) []byte {
	t := txn.ChunkTarget(h)
	t[0] = 'F'
	return t
}

// parseFreeTarget decodes freeTarget.
func parseFreeTarget(t []byte) (Handle, bool) {
	if len(t) == 0 || t[0] != 'F' {
		return Handle{}, false
	}
	c := slices.Clone(t)
	c[0] = 'c'
	h, err := txn.ParseChunkTarget(c)
	return h, err == nil
}

// maxPendingFrees bounds the value chunks a cache frees in the background
// (FreeWhenDurable).
const maxPendingFrees = 1024

// Cache is a server's node cache. Safe for concurrent use.
type Cache struct {
	pendingFrees atomic.Int64 // FreeWhenDurable's waits
	refills      sync.WaitGroup
	renewMu      sync.Mutex // one owed renewal at a time (payRenewal)
	cfg          CacheConfig
	log          *slog.Logger
	mu           struct {
		sync.Mutex
		m      map[Handle]*entry
		byName map[string]*entry
		lru    *list.List // of *entry with pins and no users, least recently used first
		err    error      // sticky: the server was fenced out
		// owed counts node writes of unknown outcome (writeBack);
		// paid is owed as of the last fence renewal begun after them.
		// While paid < owed, no node write goes out under the current
		// token.
		owed, paid uint64
		// frees are the value chunks committed changes stopped naming
		// and that are not known freed yet, with the change's position
		// (loggedFree): a checkpoint frees those below its point before the
		// log forgets their records.
		frees map[Handle]loggedFree
		// unlinked: chunks the cache allocated with an owner tag that no
		// committed change names yet; links: those a committed change
		// names (its link record's position), not disowned yet.
		unlinked map[Handle]bool
		links    map[Handle]loggedFree
		// refree: chunks whose free failed (free), tried again.
		refree map[Handle]bool
		// closing: a clean close began (Quiesce): no commit from now on.
		closing bool
		// pool: node chunks allocated ahead, by size (takeNode);
		// refilling: a refill of that size runs.
		pool      map[uint64][]Handle
		refilling map[uint64]bool
		// allocSeq numbers the owned allocations begun (allocate);
		// allocating holds the numbers of those under way. strayWatch,
		// while a stray collection runs (non-nil), gathers every handle
		// an owned allocation returned since the collection took the
		// cache's sets (CollectStrays).
		allocSeq   uint64
		allocating map[uint64]bool
		strayWatch map[Handle]bool
	}
	// strays serializes CollectStrays; strayMark is the clerk's
	// MaybeStrays as of the last collection that listed every pair.
	strays    sync.Mutex
	strayMark uint64
	// unsafeStraysIgnoreLinks, the tests' teeth: a stray collection takes
	// chunks a committed change names but that are not disowned yet for
	// strays.
	unsafeStraysIgnoreLinks bool
	// unsafeNoOwedRenewal, the tests' teeth, never renews the fence
	// after a node write of unknown outcome.
	unsafeNoOwedRenewal bool
	// noDeltas logs every change as a whole image (BenchmarkPutDeltas'
	// baseline); unsafeNoRaceImage, the tests' teeth, omits the whole
	// image a commit owes after a write-back snapshot raced its delta.
	noDeltas, unsafeNoRaceImage bool
	// unsafeDeltaAcrossWriteBack, the simulator's teeth: a write-back
	// snapshot leaves the node's delta base in place.
	unsafeDeltaAcrossWriteBack bool
	// testBeforeCommit, if set, runs in commit between the updates and
	// the commit record (TestRacedDeltaLogsWholeImage).
	testBeforeCommit func()
	stats            cacheCounters
	done             chan struct{}
	closeOnce        sync.Once
	// closed ends at Close: lease acquisitions in flight give up then (an
	// operation waiting for a lease holds none; a clean close does not
	// wait for it: releaseStragglers).
	closed      context.Context
	closeClosed context.CancelFunc
	// releasing counts pins taken off their entries and not yet released
	// (giveUpRef, Drop, Abandon, an upgrade): releaseStragglers, which
	// looks at the entries, waits for them too.
	releasing atomic.Int64
	// unsafeStale breaks coherence on purpose (the simulator's teeth): a
	// pin given up keeps its image, and lock-free reads use it.
	unsafeStale bool
	// unsafeLeaseTime ignores the leases' guaranteed time on purpose (the
	// simulator's teeth): a server cut off serves its cache until it is
	// told it lost its leases.
	unsafeLeaseTime bool
	// unsafeReadPastLease serves an image or value read that ended past
	// the leases' time (the simulator's teeth for review 45's rule).
	unsafeReadPastLease bool
	// unsafeIgnoreDropped serves a dropped tree as a live one on purpose
	// (the simulator's teeth for drops).
	unsafeIgnoreDropped bool
	// unsafeNoStragglers skips releaseStragglers on purpose (the
	// simulator's teeth for clean closes).
	unsafeNoStragglers bool
	// until caches Locks.ValidUntil: a cached image is used only before
	// it (checked on every use; the clerk is asked again once it passes).
	until atomic.Pointer[time.Time]
}

// ErrLeaseExpired: the server's leases are past their guaranteed time
// (it was paused, or cut off): it serves nothing from its cache until its
// node renews them, or fences itself.
var ErrLeaseExpired = errors.New("btree: this server's leases are past their guaranteed time (paused or cut off): not serving cached nodes")

// leaseValid reports whether the cache's pins still guarantee its images.
func (c *Cache) leaseValid() bool {
	if c.unsafeLeaseTime {
		return !c.lost()
	}
	now := time.Now()
	if u := c.until.Load(); u != nil && now.Before(*u) {
		return true
	}
	d := c.cfg.Locks.ValidUntil()
	c.until.Store(&d)
	return now.Before(d)
}

// CacheStats count the cache's work.
type CacheStats struct {
	Hits, Misses, Loads         uint64
	WriteBacks, Revocations     uint64
	Evictions, Upgrades, Renews uint64
	// ValueWrites and ValueReads count values in chunks of their own;
	// ValueLeaks the value chunks whose write failed and whose first free failed
	// too. LoggedFrees counts the value chunks a checkpoint freed because
	// the change that replaced them recorded them and nothing had freed
	// them yet (the update's own free failed, or has not run yet);
	// FreeRetries the checkpoints' frees of those that failed (tried again
	// at the next). Disowned counts the chunks checkpoints disowned (their
	// link records about to be forgotten). Strays counts the chunks stray
	// collections freed (CollectStrays).
	ValueWrites, ValueReads, ValueLeaks, LoggedFrees, FreeRetries uint64
	Disowned, Strays                                              uint64
	// Deltas counts the node changes logged as deltas (delta.go), not
	// whole images; RaceImages the whole images a commit added after its
	// delta because a write-back snapshot of the node came in between.
	Deltas, RaceImages uint64
}

type entry struct {
	h    Handle
	name string
	size uint64 // chunk size
	tree uint64 // 0: an anchor
	// latch is the node's lock for local operations (Store.Lock).
	latch sync.RWMutex
	// load serializes taking the pin and reading the image (shared
	// lockers may race to do it).
	load sync.Mutex
	// wb serializes write-backs of this node.
	wb sync.Mutex
	// Under Cache.mu:
	node    *Node
	anchor  *Anchor
	pin     Hold
	pinMode lock.Mode
	dirty   bool
	recLSN  uint64 // the first change not written back (an LSN just below its record's end)
	lastLSN uint64 // the last change
	// logged is the image of the node's last commit (loggedNode) while
	// the log holds a whole image of it since its last write-back
	// snapshot, with a delta for every commit since: the base of the
	// next commit's delta. nil: the next commit logs a whole image (see
	// delta.go). snaps counts write-back snapshots of the node.
	logged     []byte
	loggedNode *Node
	snaps      uint64
	users      int  // latch holders and waiters, and lock-free readers loading
	revoke     bool // a revocation notice came: give the pin up when the users are gone
	elem       *list.Element
}

// NewCache returns an empty cache.
func NewCache(cfg CacheConfig) *Cache {
	if cfg.Capacity == 0 {
		cfg.Capacity = DefaultCacheNodes
	}
	c := &Cache{cfg: cfg, log: cfg.Log2}
	if c.log == nil {
		c.log = slog.Default()
	}
	c.mu.m = map[Handle]*entry{}
	c.mu.byName = map[string]*entry{}
	c.mu.lru = list.New()
	c.done = make(chan struct{})
	c.closed, c.closeClosed = context.WithCancel(context.Background())
	go func() {
		select {
		case <-cfg.Locks.Lost():
			c.fail(errors.New("btree: this server's leases are lost (its node fenced itself, or was declared dead): it serves nothing more"))
		case <-c.done:
		}
	}()
	return c
}

// lost reports whether the clerk's leases are lost.
func (c *Cache) lost() bool {
	select {
	case <-c.cfg.Locks.Lost():
		return true
	default:
		return false
	}
}

// Close stops the cache (it serves nothing more).
func (c *Cache) Close() {
	c.closeOnce.Do(func() { close(c.done) })
	c.fail(errors.New("btree: the server is closed"))
	c.closeClosed()
}

// acquire takes a hold on name for an operation, giving up if the cache
// closes meanwhile (then with the cache's error).
func (c *Cache) acquire(ctx context.Context, name string, mode lock.Mode) (Hold, error) {
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(c.closed, cancel)
	defer stop()
	h, err := c.cfg.Locks.Acquire(actx, name, mode)
	if err != nil && ctx.Err() == nil && c.closed.Err() != nil {
		if cerr := c.Err(); cerr != nil {
			return nil, cerr
		}
	}
	return h, err
}

// takePinLocked takes e's pin off it (nil if none), counted in releasing
// until releasePin releases it. The caller holds c.mu.
func (c *Cache) takePinLocked(e *entry) Hold {
	pin := e.pin
	e.pin = nil
	if pin != nil {
		c.releasing.Add(1)
	}
	return pin
}

// releasePin releases a pin takePinLocked took (nothing if nil).
func (c *Cache) releasePin(pin Hold) {
	if pin != nil {
		pin.Release()
		c.releasing.Add(-1)
	}
}

// Stats returns the cache's counters.
func (c *Cache) Stats() CacheStats {
	s := &c.stats
	return CacheStats{Hits: s.hits.Load(), Misses: s.misses.Load(), Loads: s.loads.Load(), WriteBacks: s.writeBacks.Load(),
		Revocations: s.revocations.Load(), Evictions: s.evictions.Load(), Upgrades: s.upgrades.Load(), Renews: s.renews.Load(),
		ValueWrites: s.valueWrites.Load(), ValueReads: s.valueReads.Load(), ValueLeaks: s.valueLeaks.Load(),
		LoggedFrees: s.loggedFrees.Load(), FreeRetries: s.freeRetries.Load(), Disowned: s.disowned.Load(), Strays: s.strays.Load(),
		Deltas: s.deltas.Load(), RaceImages: s.raceImages.Load()}
}

// cacheCounters are CacheStats as atomics: hits are counted on every
// lookup, by every goroutine, and must not serialize them.
type cacheCounters struct {
	hits, misses, loads, writeBacks, revocations, evictions, upgrades, renews atomic.Uint64
	valueWrites, valueReads, valueLeaks                                       atomic.Uint64
	loggedFrees, freeRetries, disowned, pooled                                atomic.Uint64
	strays, deltas, raceImages                                                atomic.Uint64
}

// Err is why the cache stopped (its server was fenced out), or nil.
func (c *Cache) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mu.err
}

// ref finds or makes h's entry and counts a user.
func (c *Cache) ref(h Handle, size, tree uint64) (*entry, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mu.err != nil {
		return nil, c.mu.err
	}
	e := c.mu.m[h]
	if e == nil {
		e = &entry{h: h, name: LockName(h), size: size, tree: tree}
		c.mu.m[h] = e
		c.mu.byName[e.name] = e
	}
	e.users++
	if e.elem != nil {
		c.mu.lru.Remove(e.elem)
		e.elem = nil
	}
	return e, nil
}

// unref drops a user; an entry without users goes to the LRU list (if it
// holds a pin), or away.
func (c *Cache) unref(e *entry) {
	c.mu.Lock()
	e.users--
	if e.users < 0 {
		c.mu.Unlock()
		panic(fmt.Sprintf("btree: cache entry %v has %d users", e.h, e.users))
	}
	revoke := e.users == 0 && e.revoke
	if e.users == 0 && !revoke {
		if e.pin != nil {
			e.elem = c.mu.lru.PushBack(e)
		} else if !e.dirty {
			c.forgetLocked(e)
		}
	}
	over := c.mu.lru.Len() > c.cfg.Capacity
	c.mu.Unlock()
	if revoke {
		go c.giveUp(e, "revocation")
	}
	if over {
		go c.evict()
	}
}

func (c *Cache) forgetLocked(e *entry) {
	if c.mu.m[e.h] == e {
		delete(c.mu.m, e.h)
		delete(c.mu.byName, e.name)
	}
}

// lockEntry takes e's latch in mode and makes sure the cache holds a pin of
// at least mode and e's current image.
func (c *Cache) lockEntry(ctx context.Context, e *entry, mode lock.Mode) error {
	if mode == lock.Exclusive {
		e.latch.Lock()
	} else {
		e.latch.RLock()
	}
	if err := c.ensure(ctx, e, mode); err != nil {
		c.unlatch(e, mode)
		return err
	}
	return nil
}

func (c *Cache) unlatch(e *entry, mode lock.Mode) {
	if mode == lock.Exclusive {
		e.latch.Unlock()
	} else {
		e.latch.RUnlock()
	}
}

// ensure takes the pin and loads the image, holding e's latch in mode.
func (c *Cache) ensure(ctx context.Context, e *entry, mode lock.Mode) error {
	e.load.Lock()
	defer e.load.Unlock()
	c.mu.Lock()
	if e.pin != nil && e.pinMode >= mode && (e.node != nil || e.anchor != nil) {
		c.mu.Unlock()
		if !c.leaseValid() {
			return ErrLeaseExpired
		}
		c.stats.hits.Add(1)
		return nil
	}
	var old Hold
	if e.pin != nil && e.pinMode < mode {
		// An upgrade: the shared pin is given back first (the lease may move
		// to another server between, so the image goes too). Only an
		// exclusive latch asks for it, so no local user reads the image.
		if e.dirty {
			c.mu.Unlock()
			panic(fmt.Sprintf("btree: node %v is dirty under a shared pin", e.h))
		}
		old = c.takePinLocked(e)
		e.node, e.anchor = nil, nil
		c.stats.upgrades.Add(1)
	}
	pinned := e.pin != nil
	c.mu.Unlock()
	c.releasePin(old)
	c.stats.misses.Add(1)
	var hold Hold
	if !pinned {
		var err error
		hold, err = c.acquire(ctx, e.name, mode)
		if err != nil {
			return err
		}
	}
	// Read the image under the pin: nobody else can change the node now.
	b, err := c.cfg.Chunks.Read(ctx, e.h, e.size)
	var n *Node
	var a *Anchor
	if err == nil {
		if e.tree == 0 {
			a, err = DecodeAnchor(b, e.h)
		} else {
			n, err = Decode(b, e.tree, e.h)
		}
	}
	if err != nil {
		if hold != nil {
			hold.Release()
		}
		if errors.Is(err, chunk.ErrUnallocated) {
			return ErrGone
		}
		return fmt.Errorf("btree: reading node %v: %w", e.h, err)
	}
	// Images read from a chunk carry the writer's log position, which means
	// nothing in this server's log: they are durable.
	if n != nil {
		n.LSN = 0
	} else {
		a.LSN = 0
	}
	c.stats.loads.Add(1)
	c.mu.Lock()
	if hold != nil {
		e.pin, e.pinMode = hold, mode
	}
	e.node, e.anchor = n, a
	if c.cfg.Locks.Revoking(e.name) {
		e.revoke = true // a notice that came while we took the pin
	}
	c.mu.Unlock()
	// The read may have outlived the leases (a pause, a slow read): the
	// image is then as fresh as the store's, possibly newer than a change
	// another server made to a node this server holds (its lease moved on
	// once the service declared this server dead). An operation that
	// combines the two (a scan's run of leaves, a leaf and the value chunk
	// it names) would see no state the tree ever had. The image stays
	// cached under its pin but is served only as a hit is, within the
	// leases' time: in the runtime never again (an incarnation past its
	// deadline is fenced for good); in the simulator only after a renewal
	// in time (no dead verdict, hence no conflicting grant). (Review 45,
	// and review 46: the one check after the last read covers every image
	// an operation holds, each checked when obtained and pinned since.)
	if !c.leaseValid() && !c.unsafeReadPastLease {
		return ErrLeaseExpired
	}
	return nil
}

// Revoked is the lock clerk's notice that the lease on name is revoked and
// waits for the cache's pin: the pin is given up once local users are
// done, after writing the node back.
func (c *Cache) Revoked(name string) {
	c.mu.Lock()
	e := c.mu.byName[name]
	if e == nil {
		c.mu.Unlock()
		return
	}
	e.revoke = true
	idle := e.users == 0
	if idle && e.elem != nil {
		c.mu.lru.Remove(e.elem)
		e.elem = nil
	}
	if idle {
		e.users++ // giveUp's
	}
	c.mu.Unlock()
	if idle {
		c.stats.revocations.Add(1)
		c.giveUpRef(e, "revocation")
	}
}

// giveUp is giveUpRef for an entry with no users (unref saw it).
func (c *Cache) giveUp(e *entry, why string) {
	c.mu.Lock()
	if e.users != 0 {
		c.mu.Unlock()
		return // a user came meanwhile: its unref gives the pin up
	}
	if e.pin == nil {
		e.revoke = false
		c.mu.Unlock()
		return
	}
	e.users++
	c.mu.Unlock()
	c.stats.revocations.Add(1)
	c.giveUpRef(e, why)
}

// giveUpRef writes e back, drops its image and releases its pin. The
// caller counted itself as a user.
func (c *Cache) giveUpRef(e *entry, why string) {
	e.latch.Lock() // local operations on the node are done
	for attempt := 0; ; attempt++ {
		err := c.writeBack(context.Background(), e)
		if err == nil {
			break
		}
		if c.lost() {
			break // our leases are gone: recovery replays our log before anyone gets them
		}
		if c.Err() != nil {
			// The cache stopped, but the lock service still counts our
			// leases: a dirty node's lease is kept (the node's records are
			// in the log; once our node is declared dead, recovery replays
			// them before the lease is freed). Never give up a dirty node.
			c.mu.Lock()
			e.users--
			c.mu.Unlock()
			e.latch.Unlock()
			return
		}
		c.log.Warn("writing a node back before giving its lease up failed; retrying", "node", e.h, "why", why, "attempt", attempt, "err", err)
		time.Sleep(min(time.Duration(attempt+1)*50*time.Millisecond, time.Second))
	}
	c.mu.Lock()
	pin := c.takePinLocked(e)
	e.revoke = false
	if !c.unsafeStale {
		e.node, e.anchor = nil, nil
	}
	e.users--
	if e.users == 0 && !e.dirty && !c.unsafeStale {
		c.forgetLocked(e)
	}
	c.mu.Unlock()
	e.latch.Unlock()
	c.releasePin(pin)
}

// evict gives up least recently used pins until the cache is within its
// capacity.
func (c *Cache) evict() {
	for {
		c.mu.Lock()
		if c.mu.lru.Len() <= c.cfg.Capacity {
			c.mu.Unlock()
			return
		}
		e := c.mu.lru.Remove(c.mu.lru.Front()).(*entry)
		e.elem = nil
		e.users++
		c.mu.Unlock()
		c.stats.evictions.Add(1)
		c.giveUpRef(e, "eviction")
	}
}

// writeBack writes e's image to its chunk if it is dirty: the log first,
// up to the image's change, then the chunk, fenced. It takes no latch
// (images are immutable), so a checkpoint can write back a node whose
// latch a committer holds while it waits for log space.
func (c *Cache) writeBack(ctx context.Context, e *entry) error {
	e.wb.Lock()
	defer e.wb.Unlock()
	if c.lost() {
		// A dead server writes nothing back: recovery replays its log.
		return errors.New("btree: this server's leases are lost")
	}
	c.mu.Lock()
	if !e.dirty {
		c.mu.Unlock()
		return nil
	}
	n, a, last := e.node, e.anchor, e.lastLSN
	if n == nil && a == nil {
		c.mu.Unlock()
		panic(fmt.Sprintf("btree: node %v is dirty without an image", e.h))
	}
	// The chunk is about to change (and a crash may tear it): what the
	// log holds of the node from now on starts with a whole image. A
	// commit whose delta was made before this snapshot adds one itself
	// (commit compares snaps); one made after finds no base.
	if !c.unsafeDeltaAcrossWriteBack {
		e.snaps++
		e.logged, e.loggedNode = nil, nil
	}
	var tok lock.Token
	if e.pin != nil {
		tok = e.pin.Token()
	}
	c.mu.Unlock()
	if err := c.cfg.Log.Flush(ctx, txn.LSN(last)); err != nil {
		return err
	}
	var img []byte
	if n != nil {
		cp := *n
		cp.Token = tok
		img = cp.Encode(nil)
	} else {
		img = a.Encode(nil)
	}
	for attempt := 0; ; attempt++ {
		if err := c.payRenewal(ctx); err != nil {
			return err
		}
		f := c.cfg.Fence()
		err := c.cfg.Chunks.Write(ctx, e.h, img, f)
		if err == nil || errors.Is(err, chunk.ErrUnallocated) {
			break // written; or the node was freed since (nothing reads it again)
		}
		if errors.Is(err, chunk.ErrFenced) {
			if f.Token.Less(c.cfg.Fence().Token) {
				continue // our own renewal (after another write's unknown outcome) outran it: again, under the new token
			}
			c.fail(fmt.Errorf("btree: this server's write of node %v was fenced out: another server recovered its log: %w", e.h, err))
			return c.Err()
		}
		// The outcome is unknown: the write may still land later, after
		// a newer image of the node went out, and replace it. No node
		// write of this server goes out under this token again: the
		// next one (this retry, or, if our time is out or the renewal
		// fails, whichever write comes next) renews the fence first
		// (payRenewal), so that the RLDev refuses this one if it lands
		// after that write.
		c.mu.Lock()
		c.mu.owed++
		c.mu.Unlock()
		if ctx.Err() != nil {
			return err
		}
		if attempt > 0 {
			time.Sleep(min(time.Duration(attempt)*50*time.Millisecond, time.Second))
		}
		if rerr := c.payRenewal(ctx); rerr != nil {
			return fmt.Errorf("btree: after a failed write of node %v (%v): %w", e.h, err, rerr)
		}
	}
	c.stats.writeBacks.Add(1)
	c.mu.Lock()
	if e.lastLSN == last {
		e.dirty = false
	}
	c.mu.Unlock()
	return nil
}

// payRenewal renews the fence if a node write of unknown outcome gave up
// without renewing it (writeBack).
func (c *Cache) payRenewal(ctx context.Context) error {
	c.mu.Lock()
	owed, paid := c.mu.owed, c.mu.paid
	c.mu.Unlock()
	if owed == paid || c.unsafeNoOwedRenewal {
		return nil
	}
	// One renewal at a time: a write-back that waited behind another's
	// renewal finds its debt paid by it (that renewal began after the
	// writes this one owes for) instead of renewing again.
	c.renewMu.Lock()
	defer c.renewMu.Unlock()
	c.mu.Lock()
	paid, owedNow := c.mu.paid, c.mu.owed
	c.mu.Unlock()
	if paid >= owed {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err // the renewal stays owed: the next write pays it
	}
	if err := c.cfg.Renew(ctx); err != nil {
		return fmt.Errorf("btree: renewing the fence after a node write of unknown outcome: %w", err)
	}
	c.stats.renews.Add(1)
	c.mu.Lock()
	c.mu.paid = max(c.mu.paid, owedNow) // every write counted before the renewal began
	c.mu.Unlock()
	return nil
}

// fail stops the cache: its server was fenced out.
func (c *Cache) fail(err error) {
	c.mu.Lock()
	if c.mu.err == nil {
		c.mu.err = err
	}
	c.mu.Unlock()
}

// WriteBack writes back every node whose first change not yet in its chunk
// is below upTo (txn.Checkpointer).
func (c *Cache) WriteBack(ctx context.Context, upTo txn.LSN) error {
	if err := c.disownLogged(ctx, upTo); err != nil {
		return err
	}
	if err := c.freeLogged(ctx, upTo); err != nil {
		return err
	}
	c.mu.Lock()
	var todo []*entry
	for _, e := range c.mu.m {
		if e.dirty && e.recLSN < uint64(upTo) {
			todo = append(todo, e)
		}
	}
	c.mu.Unlock()
	// Several at a time: each write-back is a chunk write made durable on
	// both replicas, and the RLDevs share one sync among the writes in
	// flight (group commit), so a checkpoint of n nodes costs far fewer
	// than n syncs on each disk, and the log's own flushes, which wait
	// behind the checkpoint's syncs on the same disks, stall less.
	// The first failure cancels the others.
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(writeBackParallel)
	for _, e := range todo {
		if gctx.Err() != nil {
			break
		}
		g.Go(func() error { return c.writeBack(gctx, e) })
	}
	if err := g.Wait(); err != nil {
		return err
	}
	return ctx.Err()
}

// writeBackParallel bounds the write-backs of one WriteBack in flight
// (BenchmarkCheckpointWriteBack measures it against one at a time).
var writeBackParallel = 16

// Drop forgets h (its chunk is being freed): the pin is given back
// without a write-back, once local users are done.
func (c *Cache) Drop(h Handle) {
	c.mu.Lock()
	e := c.mu.m[h]
	if e == nil {
		c.mu.Unlock()
		return
	}
	e.users++
	if e.elem != nil {
		c.mu.lru.Remove(e.elem)
		e.elem = nil
	}
	c.mu.Unlock()
	e.latch.Lock()
	c.mu.Lock()
	pin := c.takePinLocked(e)
	e.node, e.anchor, e.dirty, e.revoke = nil, nil, false, false
	e.users--
	if e.users == 0 {
		c.forgetLocked(e)
	}
	c.mu.Unlock()
	e.latch.Unlock()
	c.releasePin(pin)
}

// ReleaseAll writes back every node and gives up every pin no operation
// uses (a clean shutdown: the leases go back with nothing left to recover).
func (c *Cache) ReleaseAll() {
	c.mu.Lock()
	var es []*entry
	for _, e := range c.mu.m {
		if e.pin != nil && e.users == 0 {
			e.users++
			if e.elem != nil {
				c.mu.lru.Remove(e.elem)
				e.elem = nil
			}
			es = append(es, e)
		}
	}
	c.mu.Unlock()
	for _, e := range es {
		c.giveUpRef(e, "shutdown")
	}
}

// errClosing: a commit refused because the server closes (Quiesce).
var errClosing = errors.New("btree: the server is closing")

// Quiesce makes the cache refuse every commit from now on (not applied,
// ErrNotApplied: the client may send it to another server). A clean close
// quiesces before its final write-back: the log's next holder opens the
// log without a replay, so a change committed after the write-back took
// its snapshot would be lost, and its new chunks, still tagged, freed.
func (c *Cache) Quiesce() {
	c.mu.Lock()
	c.mu.closing = true
	c.mu.Unlock()
}

// Shutdown is a clean close's part of the cache: no commit from now on
// (Quiesce), every dirty node written back and every linked chunk disowned
// (FlushAll), every lease given back, the cache closed. On an error the
// leases stay: the log must be replayed by a recovery.
func (c *Cache) Shutdown(ctx context.Context) error {
	c.Quiesce()
	waitCtx(ctx, c.refills.Wait) // none adds to the pool after this (refill)
	c.drainPool(ctx)
	err := c.FlushAll(ctx)
	if err == nil && c.cfg.Log != nil {
		// The log's head past everything: the next holder finds no
		// record of this one's to replay (or link records to disown:
		// all were, by FlushAll), and needs no chunk pair to open it.
		err = c.cfg.Log.Checkpoint(ctx)
	}
	if err == nil {
		c.ReleaseAll()
	}
	c.Close()
	if err == nil && !c.unsafeNoStragglers {
		err = c.releaseStragglers(ctx)
	}
	return err
}

// errStragglers: a clean close's operations kept their nodes past its
// deadline (releaseStragglers).
var errStragglers = errors.New("btree: the close's stragglers")

// releaseStragglers gives up the pins of operations that were still in the
// cache at its close: Close fails them, and each pin comes back unused as
// its operation ends; ReleaseAll took only the unused ones. Without this the
// clerk's close would be refused (a hold still out: lock.ErrStillHeld) and a
// clean close would leave its leases to a recovery, as a crash does. No
// node is dirty (no commit since Quiesce, all written back), so each pin
// goes at once. It waits until no pin is left and no operation uses a node
// (one may be taking a pin), or ctx ends (the error: the leases stay).
func (c *Cache) releaseStragglers(ctx context.Context) error {
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		c.ReleaseAll()
		c.mu.Lock()
		left := 0
		for _, e := range c.mu.m {
			// (a user may be taking a pin: ensure keeps the hold to itself
			// until the image is loaded; one waiting for a lease gave up at
			// the Close: Cache.acquire)
			if e.pin != nil || e.users > 0 {
				left++
			}
		}
		c.mu.Unlock()
		if left == 0 && c.releasing.Load() == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %d nodes still pinned or in use by operations at the close, %d pins being released: %w", errStragglers, left, c.releasing.Load(), ctx.Err())
		case <-tick.C:
		}
	}
}

// waitCtx runs wait, returning when it does or when ctx ends.
func waitCtx(ctx context.Context, wait func()) {
	done := make(chan struct{})
	go func() { wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// FlushAll writes back every dirty node (a clean shutdown).
func (c *Cache) FlushAll(ctx context.Context) error {
	return c.WriteBack(ctx, txn.LSN(^uint64(0)))
}

// Dirty counts the dirty nodes.
func (c *Cache) Dirty() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := 0
	for _, e := range c.mu.m {
		if e.dirty {
			k++
		}
	}
	return k
}

// commit logs a change of images (the caller holds each node's latch and
// pin exclusively) and publishes them.
func (c *Cache) commit(ctx context.Context, nodes []*Node, anchor *Anchor, frees []Handle) (uint64, error) {
	type change struct {
		e     *entry
		redo  []byte // what is logged: img, or a delta from the node's last image
		img   []byte // a node's new image (nil: an anchor)
		delta bool
		snaps uint64 // e.snaps when the delta was made
		first uint64
	}
	changes := make([]change, 0, len(nodes)+1)
	c.mu.Lock()
	if err := c.mu.err; err != nil {
		c.mu.Unlock()
		return 0, err
	}
	if c.mu.closing {
		c.mu.Unlock()
		return 0, refused(errClosing)
	}
	// Each image goes to the log redo-only (no undo image): no chunk ever
	// holds an image whose commit is not durable (no steal), so nothing is
	// rolled back, and replays use committed images only. An image has its
	// own length: what lies past it in the chunk is never read.
	add := func(h Handle) *entry {
		e := c.mu.m[h]
		if e == nil || e.pin == nil || e.pinMode != lock.Exclusive {
			c.mu.Unlock()
			panic(fmt.Sprintf("btree: commit of node %v, which this server does not hold exclusively", h))
		}
		return e
	}
	deltas := 0 // log bytes of the whole images the deltas may need (see below)
	for _, n := range nodes {
		e := add(n.Self)
		n.Version = 1 // a new node
		if e.node != nil {
			n.Version = e.node.Version + 1
		}
		ch := change{e: e, img: n.Encode(nil)}
		ch.redo = ch.img
		if e.logged != nil && e.loggedNode == e.node && e.node != nil && !c.noDeltas {
			if d, ok := makeDelta(e.logged, ch.img); ok {
				ch.redo, ch.delta, ch.snaps = d, true, e.snaps
				deltas += txn.RedoOnlySize(txn.ChunkTarget(n.Self), ch.img)
			}
		}
		changes = append(changes, ch)
	}
	if anchor != nil {
		e := add(anchor.Self)
		if e.anchor != nil {
			anchor.Version = e.anchor.Version + 1
		}
		img := anchor.Encode(nil)
		changes = append(changes, change{e: e, redo: img})
	}
	// The chunks this change names for the first time: its new nodes and
	// the new values in its leaves.
	var links []Handle
	if len(c.mu.unlinked) > 0 {
		for _, n := range nodes {
			if c.mu.unlinked[n.Self] {
				links = append(links, n.Self)
			}
			if n.Leaf() && n.Ext != nil {
				for _, r := range n.Refs() {
					if c.mu.unlinked[r.Chunk] && !slices.Contains(links, r.Chunk) {
						links = append(links, r.Chunk)
					}
				}
			}
		}
	}
	c.mu.Unlock()
	tx := c.cfg.Log.Begin()
	abort := func(err error) (uint64, error) {
		if aerr := tx.Abort(context.Background(), nil); aerr != nil {
			c.fail(fmt.Errorf("btree: the log failed: %w", aerr))
		}
		return 0, err
	}
	for i := range changes {
		ch := &changes[i]
		off := uint64(0)
		if ch.delta {
			off = deltaOff
		}
		lsn, err := tx.Update(ctx, txn.ChunkTarget(ch.e.h), off, ch.redo, nil)
		if err != nil {
			return abort(err)
		}
		ch.first = uint64(lsn) - 1
	}
	// Room for the whole images of the delta'd nodes, which the commit
	// logs if a write-back snapshot of the node came after its delta was
	// made (then the chunk may hold the delta's base only until its next,
	// possibly torn, write-back). It is logged under c.mu, where waiting
	// for a checkpoint could deadlock, so the room is set aside now.
	if err := tx.Reserve(ctx, deltas); err != nil {
		return abort(err)
	}
	if c.testBeforeCommit != nil {
		c.testBeforeCommit()
	}
	freeRecs := make([]uint64, len(frees))
	for i, h := range frees {
		lsn, err := tx.Update(ctx, freeTarget(h), 0, nil, nil)
		if err != nil {
			if aerr := tx.Abort(context.Background(), nil); aerr != nil {
				c.fail(fmt.Errorf("btree: the log failed: %w", aerr))
			}
			return 0, err
		}
		freeRecs[i] = uint64(lsn) - 1
	}
	linkRecs := make([]uint64, len(links))
	for i, h := range links {
		lsn, err := tx.Update(ctx, linkTarget(h), 0, nil, nil)
		if err != nil {
			if aerr := tx.Abort(context.Background(), nil); aerr != nil {
				c.fail(fmt.Errorf("btree: the log failed: %w", aerr))
			}
			return 0, err
		}
		linkRecs[i] = uint64(lsn) - 1
	}
	// The commit record's append and the publish happen under c.mu at
	// once: a checkpoint takes its snapshot of dirty nodes under c.mu, so
	// it either sees the transaction still open (and keeps the head below
	// its records) or the nodes dirty (and writes them back). A lazy
	// commit appends into room set aside by the updates: it does not wait
	// for a checkpoint, so holding c.mu cannot deadlock with one.
	c.mu.Lock()
	if c.mu.closing {
		c.mu.Unlock()
		return abort(refused(errClosing))
	}
	for i := range changes {
		ch := &changes[i]
		if !ch.delta || ch.e.snaps == ch.snaps || c.unsafeNoRaceImage {
			continue
		}
		// A write-back snapshot of the node came between its delta's
		// making and now: it may have written the delta's base to the
		// chunk and let the head pass the node's last whole image. Log
		// the new image whole, after the delta, so that what the log
		// holds of the node still starts with one (delta.go).
		if _, err := tx.UpdateReserved(txn.ChunkTarget(ch.e.h), 0, ch.img); err != nil {
			c.mu.Unlock()
			return abort(err)
		}
		c.stats.raceImages.Add(1)
	}
	end, err := tx.Commit(ctx, false)
	if err != nil {
		c.mu.Unlock()
		// The commit record was not appended (a lazy commit only appends):
		// roll the transaction back. If even that fails the log is broken,
		// and the cache stops: recovery decides.
		if aerr := tx.Abort(context.Background(), nil); aerr != nil {
			c.fail(fmt.Errorf("btree: the log failed: %w", aerr))
		}
		return 0, err
	}
	for _, n := range nodes {
		n.LSN = uint64(end)
	}
	if anchor != nil {
		anchor.LSN = uint64(end)
	}
	for i, ch := range changes {
		e := ch.e
		if i < len(nodes) {
			e.node = nodes[i]
			e.logged, e.loggedNode = ch.img, nodes[i]
			if ch.delta {
				c.stats.deltas.Add(1)
			}
		} else {
			e.anchor = anchor
		}
		if !e.dirty {
			e.dirty, e.recLSN = true, ch.first
		}
		e.lastLSN = uint64(end)
	}
	for i, h := range frees {
		if c.mu.frees == nil {
			c.mu.frees = map[Handle]loggedFree{}
		}
		c.mu.frees[h] = loggedFree{rec: freeRecs[i], end: uint64(end)}
	}
	for i, h := range links {
		if c.mu.links == nil {
			c.mu.links = map[Handle]loggedFree{}
		}
		c.mu.links[h] = loggedFree{rec: linkRecs[i], end: uint64(end)}
		delete(c.mu.unlinked, h)
	}
	c.mu.Unlock()
	return uint64(end), nil
}

// free frees chunk h, which no durable image names, and forgets it
// (freed) once the chunk manager said so.
// A free that fails leaves h in refree: the server's stray loop tries it
// again (RefreeFailed), since the chunk, still in the unlinked set, is one
// the stray collection must leave alone.
func (c *Cache) free(ctx context.Context, h Handle) error {
	err := c.cfg.Chunks.Free(ctx, h)
	if err == nil {
		c.freed(h)
		return nil
	}
	c.mu.Lock()
	if c.mu.refree == nil {
		c.mu.refree = map[Handle]bool{}
	}
	c.mu.refree[h] = true
	c.mu.Unlock()
	return err
}

// giveBackWait bounds a free of a chunk the server gives back outside its
// caller's context (a chunk nothing names: a value whose write failed, a
// node a split could not use, a refill that ended late): a pair that is
// down holds neither the operation nor a close up; the free, failed, is
// tried again by the server's loop (refree).
var giveBackWait = 10 * time.Second

// giveBack frees h, which nothing names, under a context of its own,
// bounded by giveBackWait.
func (c *Cache) giveBack(h Handle) error {
	ctx, cancel := context.WithTimeout(context.Background(), giveBackWait)
	defer cancel()
	return c.free(ctx, h)
}

// disownCreated disowns a new tree's anchor and first root once the
// directory names them (CreateTree), under a bound of its own
// (giveBackWait), and forgets them as unlinked. A failure leaves them
// tagged, and unlinked for the life of the server (its stray collection
// leaves them alone); the collection of the log's orphans at its next
// holder disowns them, since the directory names them.
func (c *Cache) disownCreated(hs ...Handle) {
	if c.cfg.Owner == nil || c.cfg.Owner().IsZero() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), giveBackWait)
	defer cancel()
	if err := c.cfg.Chunks.Disown(ctx, hs); err != nil {
		c.log.Warn("disowning a new tree's anchor and root failed: they stay tagged until this log's next holder, which disowns them", "chunks", hs, "err", err)
		return
	}
	c.mu.Lock()
	for _, h := range hs {
		delete(c.mu.unlinked, h)
	}
	c.mu.Unlock()
}

// freed notes that chunk h is free (no checkpoint needs to free it).
func (c *Cache) freed(h Handle) {
	c.mu.Lock()
	delete(c.mu.frees, h)
	delete(c.mu.unlinked, h)
	delete(c.mu.refree, h)
	c.mu.Unlock()
}

// RefreeFailed tries again the frees that failed (Cache.free, and so
// TreeStore.Free), and returns how many succeeded now, and the first
// failure. Each such chunk was given back because nothing names it or will
// (a value whose write failed or whose put did not apply, a node a failed
// split never linked, a removed node past its grace, a refill that ended
// late); a chunk id is never reused, so a free that landed after all is
// harmless to repeat. It does nothing once the cache failed or closes:
// what is left then goes to the log's next holder (the chunks still
// tagged) or leaks (a removed node's, a replaced value's whose record the
// log forgot).
func (c *Cache) RefreeFailed(ctx context.Context) (int, error) {
	c.mu.Lock()
	if c.mu.err != nil || c.mu.closing {
		c.mu.Unlock()
		return 0, nil
	}
	todo := make([]Handle, 0, len(c.mu.refree))
	for h := range c.mu.refree {
		todo = append(todo, h)
	}
	c.mu.Unlock()
	n := 0
	var first error
	for _, h := range todo {
		if err := c.free(ctx, h); err != nil {
			if first == nil {
				first = fmt.Errorf("btree: freeing chunk %v again (%d frees still failing): %w", h, len(todo)-n, err)
			}
			continue
		}
		n++
	}
	return n, first
}

// nodePoolSize is how many node chunks a cache keeps allocated ahead,
// per node size, so that a split does not wait for an allocation (a
// durable change of the chunk map on both replicas, with the chunk's
// zeroing). Only with an owner: what the pool holds when the server dies
// is freed by the collection of its log, as any chunk it never linked.
const nodePoolSize = 8

// takeNode returns a node chunk of size bytes from the pool (refilled in
// the background), or allocates one if the pool is empty.
func (c *Cache) takeNode(ctx context.Context, size uint64) (Handle, error) {
	c.mu.Lock()
	switch {
	case c.mu.err != nil:
		err := c.mu.err
		c.mu.Unlock()
		return Handle{}, refused(err)
	case c.mu.closing:
		c.mu.Unlock()
		return Handle{}, refused(errClosing)
	}
	c.mu.Unlock()
	if c.cfg.Owner == nil || c.cfg.Owner().IsZero() {
		return c.allocate(ctx, size)
	}
	c.mu.Lock()
	if c.mu.pool == nil {
		c.mu.pool = map[uint64][]Handle{}
		c.mu.refilling = map[uint64]bool{}
	}
	var h Handle
	free := c.mu.pool[size]
	if n := len(free); n > 0 {
		h, c.mu.pool[size] = free[n-1], free[:n-1]
	}
	if !c.mu.refilling[size] {
		c.mu.refilling[size] = true
		c.refills.Add(1)
		go c.refill(size)
	}
	c.mu.Unlock()
	if h != (Handle{}) {
		c.stats.pooled.Add(1)
		return h, nil
	}
	return c.allocate(ctx, size)
}

// refill fills the pool of size up to nodePoolSize, one allocation at a
// time; it stops at the first failure (the next take starts it again).
func (c *Cache) refill(size uint64) {
	defer func() {
		c.mu.Lock()
		c.mu.refilling[size] = false
		c.mu.Unlock()
		c.refills.Done()
	}()
	for {
		c.mu.Lock()
		stop := c.mu.err != nil || c.mu.closing || len(c.mu.pool[size]) >= nodePoolSize
		c.mu.Unlock()
		if stop {
			return
		}
		ctx, cancel := context.WithTimeout(c.closed, 10*time.Second)
		h, err := c.allocate(ctx, size)
		cancel()
		if err != nil {
			return
		}
		c.mu.Lock()
		late := c.mu.err != nil || c.mu.closing
		if !late {
			c.mu.pool[size] = append(c.mu.pool[size], h)
		}
		c.mu.Unlock()
		if late {
			// The close began while it was allocated (its drain may be
			// over): give it back here.
			_ = c.giveBack(h)
			return
		}
	}
}

// Pooled is how many node chunks the pool holds now.
func (c *Cache) Pooled() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, hs := range c.mu.pool {
		n += len(hs)
	}
	return n
}

// drainPool frees the pool's chunks (a clean close; a failure leaves them
// to the collection at the log's next holder: they are tagged).
func (c *Cache) drainPool(ctx context.Context) {
	c.mu.Lock()
	var all []Handle
	for size, hs := range c.mu.pool {
		all = append(all, hs...)
		delete(c.mu.pool, size)
	}
	c.mu.Unlock()
	for _, h := range all {
		_ = c.free(ctx, h)
	}
}

// setOwner tags the cache's allocations with o from now on (before any
// operation runs: the server's start, once its log is open).
func (c *Cache) setOwner(o chunk.Owner) { c.cfg.Owner = func() chunk.Owner { return o } }

// allocate allocates a chunk tagged with the server's owner, and notes it
// unlinked until a commit names it.
func (c *Cache) allocate(ctx context.Context, size uint64) (Handle, error) {
	var owner chunk.Owner
	if c.cfg.Owner != nil {
		owner = c.cfg.Owner()
	}
	if owner.IsZero() {
		return c.cfg.Chunks.Allocate(ctx, size, owner)
	}
	c.mu.Lock()
	if c.mu.allocating == nil {
		c.mu.allocating = map[uint64]bool{}
	}
	c.mu.allocSeq++
	seq := c.mu.allocSeq
	c.mu.allocating[seq] = true
	c.mu.Unlock()
	h, err := c.cfg.Chunks.Allocate(ctx, size, owner)
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.mu.allocating, seq)
	if err != nil {
		return h, err
	}
	if c.mu.unlinked == nil {
		c.mu.unlinked = map[Handle]bool{}
	}
	c.mu.unlinked[h] = true
	if c.mu.strayWatch != nil {
		c.mu.strayWatch[h] = true
	}
	return h, nil
}

// strayHold bounds how long a stray collection waits, after its listing,
// for the owned allocations begun before the listing answered to end (it
// tries again later).
const strayHold = 2 * time.Second

// CollectStrays frees the chunks tagged with the server's owner that
// nothing of the server knows — left by an allocation whose answer was
// lost (the chunk manager pair's primary died, or the connection, after
// the change; the clerk then tried again, or failed) — if the chunk
// clerk's MaybeStrays moved since the last collection; it returns how
// many it freed.
//
// Without it such a chunk stays allocated for the life of the server: the
// collection of the log's earlier holders (collectOrphans) frees it only
// at the log's next holder. Only the owner itself can tell its strays
// from its live chunks: a chunk tagged with its owner is one it knows —
// unlinked (allocated and handed out, or pooled, and named by no committed
// change yet) or linked (named by a committed change, not disowned yet) —
// or one no allocation returned. So the collection takes the server's two
// sets, then lists what the pairs say its owner tags, then waits until
// every owned allocation begun before the listing answered has ended, and
// frees each chunk listed that is neither in the sets nor returned by an
// allocation since they were taken (strayWatch). A chunk listed was made
// by a request sent before the listing answered (the managers make a new
// chunk for every request, never one of an earlier request), so only an
// allocation begun by then can return it; once each has ended, a chunk
// listed that none returned, and that the sets did not hold, is a stray.
// A chunk of the sets disowned or freed meanwhile is not taken (the sets
// were taken before the listing), and a chunk the list leaves out is not
// freed. Allocations are never held back: an allocation stuck on a pair
// that is down delays only the collection (which gives up after strayHold
// and tries again later). Chunks of the log's earlier holders (older
// tokens) are listed too: they are strays by definition (collectOrphans).
//
// What it cannot see: an attempt the clerk abandoned (its caller gave up,
// or the attempt timed out) whose request reaches its manager after the
// listing. That chunk stays tagged, for the collection after the next lost
// answer, or the log's next holder.
func (c *Cache) CollectStrays(ctx context.Context) (int, error) {
	if c.cfg.Owner == nil {
		return 0, nil
	}
	owner := c.cfg.Owner()
	if owner.IsZero() {
		return 0, nil
	}
	c.strays.Lock()
	defer c.strays.Unlock()
	mark := c.cfg.Chunks.MaybeStrays()
	if mark == c.strayMark {
		return 0, nil
	}
	c.mu.Lock()
	switch {
	case c.mu.err != nil:
		c.mu.Unlock()
		return 0, c.mu.err
	case c.mu.closing:
		c.mu.Unlock()
		return 0, errClosing
	}
	known := make(map[Handle]bool, len(c.mu.unlinked)+len(c.mu.links))
	for h := range c.mu.unlinked {
		known[h] = true
	}
	if !c.unsafeStraysIgnoreLinks {
		for h := range c.mu.links {
			known[h] = true
		}
	}
	c.mu.strayWatch = map[Handle]bool{}
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.mu.strayWatch = nil
		c.mu.Unlock()
	}()
	tagged, err := c.cfg.Chunks.Owned(ctx, owner.Log, lock.Token{Epoch: owner.Token.Epoch, Seq: owner.Token.Seq + 1})
	if err != nil {
		return 0, fmt.Errorf("btree: collecting strays: listing what this server's log tags: %w", err)
	}
	c.mu.Lock()
	upTo := c.mu.allocSeq
	c.mu.Unlock()
	deadline := time.Now().Add(strayHold)
	for {
		c.mu.Lock()
		waiting := 0
		for seq := range c.mu.allocating {
			if seq <= upTo {
				waiting++
			}
		}
		if waiting == 0 {
			for h := range c.mu.strayWatch {
				known[h] = true
			}
		}
		c.mu.Unlock()
		if waiting == 0 {
			break
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("btree: collecting strays: %d allocations begun before the listing still under way after %v", waiting, strayHold)
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("btree: collecting strays: %w", ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
	unknown := false
	for _, h := range tagged {
		unknown = unknown || !known[h]
	}
	if c.cfg.Named != nil && unknown {
		named, err := c.cfg.Named(ctx)
		if err != nil {
			return 0, fmt.Errorf("btree: collecting strays: reading the tree directory: %w", err)
		}
		for h := range named {
			known[h] = true
		}
	}
	freed := 0
	for _, h := range tagged {
		if known[h] {
			continue
		}
		if err := c.cfg.Chunks.Free(ctx, h); err != nil {
			return freed, fmt.Errorf("btree: collecting strays: freeing %v: %w", h, err)
		}
		freed++
		c.stats.strays.Add(1)
	}
	c.strayMark = mark
	return freed, nil
}

// disownLogged disowns the chunks whose link records lie below upTo
// (WriteBack, before the log forgets those records), once their changes
// are durable. Unlike a free, a disown that fails fails the checkpoint:
// once the record is gone, a recovery of this log would take the chunk,
// still tagged, for one that nothing names, and free it under the tree.
func (c *Cache) disownLogged(ctx context.Context, upTo txn.LSN) error {
	c.mu.Lock()
	var todo []Handle
	var last uint64
	for h, l := range c.mu.links {
		if l.rec < uint64(upTo) {
			todo = append(todo, h)
			last = max(last, l.end)
		}
	}
	c.mu.Unlock()
	if len(todo) == 0 {
		return nil
	}
	if err := c.cfg.Log.Flush(ctx, txn.LSN(last)); err != nil {
		return err
	}
	if err := c.cfg.Chunks.Disown(ctx, todo); err != nil {
		return fmt.Errorf("btree: disowning %d chunks that committed changes name (the log keeps their records until it succeeds): %w", len(todo), err)
	}
	c.mu.Lock()
	for _, h := range todo {
		delete(c.mu.links, h)
	}
	c.mu.Unlock()
	c.stats.disowned.Add(uint64(len(todo)))
	return nil
}

// freeLogged frees the value chunks whose free records lie below upTo
// (WriteBack, before the log forgets those records), each once its change
// is durable. A free that fails does not fail the checkpoint (one chunk
// whose chunk manager does not answer, or answers with a lasting error,
// would stop the log's head, then every update, and the server's close):
// the chunk stays registered and every later checkpoint tries it again; it
// leaks only if the server dies before one succeeds, its record gone.
func (c *Cache) freeLogged(ctx context.Context, upTo txn.LSN) error {
	c.mu.Lock()
	var todo []Handle
	var last uint64
	for h, f := range c.mu.frees {
		if f.rec < uint64(upTo) {
			todo = append(todo, h)
			last = max(last, f.end)
		}
	}
	c.mu.Unlock()
	if len(todo) == 0 {
		return nil
	}
	if err := c.cfg.Log.Flush(ctx, txn.LSN(last)); err != nil {
		return err
	}
	for _, h := range todo {
		if err := c.cfg.Chunks.Free(ctx, h); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			c.stats.freeRetries.Add(1)
			c.mu.Lock()
			f, ok := c.mu.frees[h]
			if ok {
				f.tries++
				c.mu.frees[h] = f
			}
			c.mu.Unlock()
			if ok && f.tries == 1 {
				c.log.Warn("freeing a value chunk a committed change replaced failed; every checkpoint tries again (it leaks if this server dies first)", "chunk", h, "err", err)
			}
			continue
		}
		c.freed(h)
		c.stats.loggedFrees.Add(1)
	}
	return nil
}

// TreeStore is the Store of one tree over a server's cache.
type TreeStore struct {
	c        *Cache
	anchor   Handle
	tree     uint64
	nodeSize uint64
	now      func() int64
}

var _ Store = (*TreeStore)(nil)

// Store returns the store of the tree whose anchor is anchor.
func (c *Cache) Store(anchor Handle, nodeSize int, now func() int64) *TreeStore {
	if now == nil {
		now = func() int64 { return time.Now().UnixNano() }
	}
	return &TreeStore{c: c, anchor: anchor, tree: anchor.ID, nodeSize: uint64(nodeSize), now: now}
}

func (s *TreeStore) Now() int64 { return s.now() }

func (s *TreeStore) entry(h Handle) (*entry, error) {
	if h == s.anchor {
		return s.c.ref(h, AnchorSize, 0)
	}
	return s.c.ref(h, s.nodeSize, s.tree)
}

// peek returns e's image if the cache holds it under a pin.
func (s *TreeStore) peek(h Handle) (*Node, *Anchor, bool) {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.mu.m[h]
	if c.mu.err != nil || e == nil || e.pin == nil && !c.unsafeStale || (e.node == nil && e.anchor == nil) || !c.leaseValid() {
		return nil, nil, false // (past the leases' time: the locked path reports it)
	}
	if e.elem != nil {
		c.mu.lru.MoveToBack(e.elem)
	}
	return e.node, e.anchor, true
}

func (s *TreeStore) Anchor(ctx context.Context) (*Anchor, error) {
	if _, a, ok := s.peek(s.anchor); ok && a != nil && (!a.Dropped || s.c.unsafeIgnoreDropped) {
		s.c.stats.hits.Add(1)
		return a, nil
	}
	e, err := s.entry(s.anchor)
	if err != nil {
		return nil, err
	}
	defer s.c.unref(e)
	if err := s.c.lockEntry(ctx, e, lock.Shared); err != nil {
		if errors.Is(err, ErrGone) {
			return nil, fmt.Errorf("%w: its anchor chunk %v is freed (the tree was dropped)%w", ErrNoTree, s.anchor, errAnchorFreed)
		}
		return nil, err
	}
	s.c.mu.Lock()
	a := e.anchor
	s.c.mu.Unlock()
	s.c.unlatch(e, lock.Shared)
	if a.Dropped && !s.c.unsafeIgnoreDropped {
		return nil, s.droppedErr(ctx, a)
	}
	return a, nil
}

// droppedErr is what finding anchor a marked dropped answers: ErrNoTree
// once the mark is durable. A mark whose commit was published and whose
// flush failed is in the cache only, and a restart of this server (its
// log failed) takes it back: answered at once, clients were told "no such
// tree" and settleDrop recorded the drop, for a tree that lives on
// (outside review 69, TestReview69DropMarkNotDurableAnswered). An anchor
// read from its chunk has LSN 0: durable.
func (s *TreeStore) droppedErr(ctx context.Context, a *Anchor) error {
	if err := s.Durable(ctx, a.LSN); err != nil {
		return err
	}
	return fmt.Errorf("%w: tree %d is dropped", ErrNoTree, s.tree)
}

func (s *TreeStore) Read(ctx context.Context, h Handle) (*Node, error) {
	if n, _, ok := s.peek(h); ok && n != nil {
		s.c.stats.hits.Add(1)
		return n, nil
	}
	n, err := s.Lock(ctx, h, lock.Shared)
	if err != nil {
		return nil, err
	}
	s.Unlock(h, lock.Shared)
	return n, nil
}

func (s *TreeStore) Lock(ctx context.Context, h Handle, mode lock.Mode) (*Node, error) {
	e, err := s.entry(h)
	if err != nil {
		return nil, err
	}
	if err := s.c.lockEntry(ctx, e, mode); err != nil {
		s.c.unref(e)
		return nil, err
	}
	s.c.mu.Lock()
	n := e.node
	s.c.mu.Unlock()
	if n == nil {
		s.c.unlatch(e, mode)
		s.c.unref(e)
		return nil, fmt.Errorf("btree: chunk %v holds no node", h)
	}
	return n, nil
}

func (s *TreeStore) Unlock(h Handle, mode lock.Mode) {
	s.c.mu.Lock()
	e := s.c.mu.m[h]
	s.c.mu.Unlock()
	if e == nil {
		panic(fmt.Sprintf("btree: unlock of %v, which is not cached", h))
	}
	s.c.unlatch(e, mode)
	s.c.unref(e)
}

func (s *TreeStore) LockAnchor(ctx context.Context) (*Anchor, error) {
	a, err := s.lockAnchor(ctx)
	if err == nil && a.Dropped && !s.c.unsafeIgnoreDropped {
		s.Unlock(s.anchor, lock.Exclusive)
		return nil, s.droppedErr(ctx, a)
	}
	return a, err
}

// lockAnchor is LockAnchor for a drop: a dropped anchor too.
func (s *TreeStore) lockAnchor(ctx context.Context) (*Anchor, error) {
	e, err := s.entry(s.anchor)
	if err != nil {
		return nil, err
	}
	if err := s.c.lockEntry(ctx, e, lock.Exclusive); err != nil {
		s.c.unref(e)
		if errors.Is(err, ErrGone) {
			return nil, fmt.Errorf("%w: its anchor chunk %v is freed (the tree was dropped)%w", ErrNoTree, s.anchor, errAnchorFreed)
		}
		return nil, err
	}
	s.c.mu.Lock()
	a := e.anchor
	s.c.mu.Unlock()
	return a, nil
}

// New takes a node's chunk (allocated, zeroed and tagged with the
// server's owner: a committed image may name it at once, recovery finds it
// allocated, and a death before the commit leaves it to the collection of
// the server's log) from the cache's pool, or allocates one, takes its pin
// and latch exclusively.
func (s *TreeStore) New(ctx context.Context) (Handle, error) {
	h, err := s.c.takeNode(ctx, s.nodeSize)
	if err != nil {
		return Handle{}, err
	}
	e, err := s.entry(h)
	if err != nil {
		_ = s.c.giveBack(h)
		return Handle{}, err
	}
	e.latch.Lock()
	hold, err := s.c.acquire(ctx, e.name, lock.Exclusive)
	if err != nil {
		e.latch.Unlock()
		s.c.unref(e)
		_ = s.c.giveBack(h)
		return Handle{}, err
	}
	s.c.mu.Lock()
	e.pin, e.pinMode = hold, lock.Exclusive
	s.c.mu.Unlock()
	return h, nil
}

// WriteValue writes val into a new chunk of its own, fenced by the
// server's fence: durable on return. The chunk is written whole, once (a
// write that succeeded while an earlier attempt of it may still land is
// done: that attempt writes the same bytes). A write that failed, whatever
// it may have left (a chunk clerk's failure may wrap chunk.ErrMaybeDone:
// it is not a success), is tried again while the failure is only this
// server's own fence renewal overtaking it; otherwise the chunk is given
// back and the put fails, marked not applied (no image names the chunk
// yet; the chunk manager quarantines freed space against the late landing
// of an attempt).
func (s *TreeStore) WriteValue(ctx context.Context, val []byte) (ValueRef, error) {
	c := s.c
	if err := c.Err(); err != nil {
		return ValueRef{}, refused(err)
	}
	h, err := c.allocate(ctx, ValueChunkSize(len(val)))
	if err != nil {
		return ValueRef{}, refused(err)
	}
	img, ref := EncodeValue(s.tree, h, val)
	for attempt := 0; attempt < 3; attempt++ {
		f := c.cfg.Fence()
		err = c.cfg.Chunks.Write(ctx, h, img, f)
		if err == nil || errors.Is(err, errWrittenEarlierMayLand) {
			c.stats.valueWrites.Add(1)
			return ref, nil
		}
		if !errors.Is(err, chunk.ErrFenced) || !f.Token.Less(c.cfg.Fence().Token) {
			break
		}
	}
	if ferr := c.giveBack(h); ferr != nil {
		c.stats.valueLeaks.Add(1)
		c.log.Warn("freeing a value chunk whose write failed failed: the server tries again while it runs", "chunk", h, "err", ferr)
	}
	return ValueRef{}, refused(fmt.Errorf("btree: writing a value chunk: %w", err))
}

// FreeWhenDurable frees h once lsn is durable, waiting for it in the
// background (up to 10 minutes) while the server runs. If the log fails
// first, the chunk leaks (done(false)). At most maxPendingFrees wait at
// once (a stalled log is what makes them: past that, it returns false).
func (s *TreeStore) FreeWhenDurable(lsn uint64, h Handle, done func(freed bool)) bool {
	c := s.c
	if c.Err() != nil {
		return false
	}
	if c.pendingFrees.Add(1) > maxPendingFrees {
		c.pendingFrees.Add(-1)
		return false
	}
	go func() {
		defer c.pendingFrees.Add(-1)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		go func() { // ends with the cache
			select {
			case <-c.done:
				cancel()
			case <-ctx.Done():
			}
		}()
		if err := c.cfg.Log.Flush(ctx, txn.LSN(lsn)); err != nil {
			done(false)
			return
		}
		err := c.cfg.Chunks.Free(ctx, h)
		if err == nil {
			c.freed(h)
		}
		done(err == nil)
	}()
	return true
}

// ReadValue reads the value r names, from its chunk (values are not
// cached: each is written once and read whole). ErrGone if the chunk was
// freed (an overwrite replaced it after the reader took the reference).
func (s *TreeStore) ReadValue(ctx context.Context, r ValueRef) ([]byte, error) {
	b, err := s.c.cfg.Chunks.Read(ctx, r.Chunk, ValueChunkSize(int(r.Length)))
	if errors.Is(err, chunk.ErrUnallocated) {
		return nil, ErrGone
	}
	if err != nil {
		return nil, err
	}
	s.c.stats.valueReads.Add(1)
	if !s.c.leaseValid() && !s.c.unsafeReadPastLease {
		// Past the leases' time, the leaf that named the chunk may have
		// changed elsewhere and the chunk been freed (ensure's rule for
		// images read, applied to the value; chunk ids are never reused,
		// so this is a second guard beside the reference's checksum).
		return nil, ErrLeaseExpired
	}
	return DecodeValue(b, s.tree, r)
}

func (s *TreeStore) Abandon(h Handle) {
	c := s.c
	c.mu.Lock()
	e := c.mu.m[h]
	if e == nil || e.node != nil {
		c.mu.Unlock()
		panic(fmt.Sprintf("btree: abandon of %v, which a commit wrote", h))
	}
	pin := c.takePinLocked(e)
	c.mu.Unlock()
	c.releasePin(pin)
	e.latch.Unlock()
	c.unref(e)
	if err := c.giveBack(h); err != nil {
		c.log.Warn("freeing an abandoned node's chunk failed: the server tries again while it runs", "chunk", h, "err", err)
	}
}

func (s *TreeStore) Commit(ctx context.Context, nodes []*Node, anchor *Anchor, frees []Handle) (uint64, error) {
	return s.c.commit(ctx, nodes, anchor, frees)
}

func (s *TreeStore) Durable(ctx context.Context, lsn uint64) error {
	if lsn == 0 {
		return nil
	}
	return s.c.cfg.Log.Flush(ctx, txn.LSN(lsn))
}

func (s *TreeStore) Free(ctx context.Context, h Handle) error {
	return s.c.free(ctx, h) // (a failure: tried again while the server runs)
}
