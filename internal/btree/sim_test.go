package btree

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand"
	"os"
	"runtime"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/grovestore/grove/internal/btree/lincheck"
	"github.com/grovestore/grove/internal/chunk"
	"github.com/grovestore/grove/internal/lock"
	"github.com/grovestore/grove/internal/rldev"
	"github.com/grovestore/grove/internal/treecall"
	"github.com/grovestore/grove/internal/txn"
)

// The B-tree simulator runs the B-tree server's real runtime — the cache
// with its pins, revocation handling, write-back, checkpoints and fence
// renewal, the real txn log, the tree algorithm — on stand-ins for the
// lock service, the chunk store and the log's RLDev (simparts_test.go),
// with three servers on one tree, clients on all of them, and faults:
// servers die (their leases kept until another server replays their log)
// and come back, all of them die at once sometimes, and chunk writes lose
// their answers and land late, after the writer has moved on or died.
// Servers are also paused (frozen: their calls wait, their leases lapse),
// cut off the lock service (they keep serving clients and writing chunks
// and their log while their leases run out; the service declares them
// dead lease + grace after their last renewal and another server replays
// their log), or cut off the storage (their chunk and log calls fail, and
// the server resigns as Service.watch makes it). A server declared dead
// learns it when the fault heals, after its frozen calls went out, and
// is restarted. A restarting server's node may die again as it starts
// (once its clerk registered, once it holds its fence lock, its log's lock
// too, or once its log is open), and the lock master fails over now and
// then: a new master that lost a dead clerk's leases recovers it in "all"
// mode, as lock.Master does (one such run at a time, the first pending
// first; nothing new granted meanwhile; the names every other clerk it
// knows holds excluded) — the case of a node's incarnation that died
// before it opened its log, beside the names recovery of the one before.
// Histories are checked with porcupine; after healing, the tree is walked
// from the chunks (structure, keys, leaks). A seed replays the fault and
// operation choices; the interleaving is the scheduler's.

var simLog = slog.New(slog.NewTextHandler(io.Discard, nil))

type simWorld struct {
	t        testing.TB
	seed     int64
	ctx      context.Context
	locks    *simLocks
	chunks   *simChunks
	devs     map[uint64]*simDevice
	anchor   Handle
	nodeSize int
	stale    bool // teeth: caches serve images after giving their leases up
	start    time.Time
	// inline is the tree's MaxInline (0: the default): odd seeds keep
	// almost every value in a chunk of its own.
	inline int
	// keepOldValues: teeth: updates never free the value chunk they
	// replaced. logFreesOnly: updates leave it to their change's free
	// record (a checkpoint frees it, or a dead server's replay).
	keepOldValues, logFreesOnly bool
	// replayLeaks counts the value chunks replays let leak (their free
	// failed: the replaying server was cut off meanwhile).
	replayLeaks atomic.Int64
	// baseless counts replays that met a delta with no base (errBaseless:
	// the full-page-write rule of delta.go broken); any fails the seed.
	baseless atomic.Int64
	// broke is the first invariant assertion (a panic) an operation or
	// the run itself met: the world stops at once and the seed fails with
	// it, its seed printed (a panic left to the runtime would end the
	// test binary with neither). A teeth seed whose defect trips an
	// assertion before the oracle sees it is not counted as caught.
	broke atomic.Pointer[string]
	// brokeCh is closed with the first broke: the run stops waiting for
	// its clients and background loops, which may be blocked for good on
	// a latch the panicking operation held (left behind, with the world).
	brokeCh chan struct{}
	// tearOneIn: one node write in tearOneIn is cut off by its writer's
	// death and lands torn (0: none).
	tearOneIn int
	noTears   atomic.Bool
	// stop ends the seed's world (its context).
	stop func()
	// deltaAcrossWriteBack: teeth: a write-back snapshot leaves the node's
	// delta base in place (no whole image first after a write-back).
	deltaAcrossWriteBack bool
	// orphans counts the chunks the final collection freed (collectAll);
	// createdTagged those it disowned (created trees' anchors and roots
	// their creators left tagged: died, or the decree's answer was lost).
	orphans, createdTagged atomic.Int64
	// Teeth: untagged: servers allocate without an owner tag (what they
	// allocate and never link leaks); replayKeepsTags: replays skip the
	// link records (the recovery's collection frees chunks the tree names).
	untagged, replayKeepsTags bool
	// straysIgnoreLinks: teeth: the servers' stray collections take the
	// chunks committed changes name, not disowned yet, for strays.
	straysIgnoreLinks bool
	// every is every server incarnation started, for their counters.
	every []*simServer

	// collections are the recovery runs' collections of orphans, which
	// run after the runs (replayDead's later); lateCollections counts
	// those that ran.
	collections     sync.WaitGroup
	lateCollections atomic.Int64

	mu      sync.Mutex
	r       *rand.Rand
	servers map[uint64]*simServer // live ones
	events  struct {
		sync.Mutex
		lines []string
	}
	killed  map[uint64]bool // nodes that died at least once
	kills   int
	restart int
	// ignoreLeaseTime: teeth: caches serve their images past the leases'
	// guaranteed time (a server cut off keeps serving reads).
	ignoreLeaseTime bool
	// readPastLease: teeth: caches serve images and values whose read
	// ended past the leases' time. pauseMidReadOneIn: one read in so many
	// pauses its server with the read in flight.
	readPastLease     bool
	pauseMidReadOneIn int
	// drop: this seed drops the tree mid-load (markDropped through a live
	// server) and frees it at the end; droppedAt is when the mark
	// returned (w.now(); 0: not yet); afterDrop counts operations that
	// began after it and succeeded (each a violation); ignoreDropped is
	// the teeth (caches serve a dropped tree).
	drop, ignoreDropped bool
	droppedAt           atomic.Int64
	afterDrop           atomic.Int64
	afterDropFirst      atomic.Value
	// unsafeUncovered: teeth: a recovery run replays the dead server's
	// node's log even if it does not cover the log's lock.
	unsafeUncovered bool
	// biasAborts: more servers die as they wait for their fence lock, and
	// the last live one dies more often (the uncovered teeth's seeds;
	// GROVE_SIM_BIAS_ABORTS=1 for any seed).
	biasAborts bool
	// aborted counts servers killed while they started.
	aborted    int
	disrupts   int // pauses and partitions
	expired    int // of which the server was declared dead
	resigned   int // servers that failed with their leases standing
	notApplied int // attempts a server refused before any change (a write's sent again elsewhere, as the client does)
	leftOut    int // writes that did nothing, by the client's rules (refused, or out of time with nothing sent that took effect)
	// tokens: puts and deletes carry write tokens (completion.go) and are
	// sent again, through another live server, after an attempt of
	// unknown outcome (half the seeds). tokDurable counts, per token, the
	// outcomes committed and known durable (never twice: tokBad is the
	// first that was); tokRepeats the answers from records, tokRetried
	// the writes answered after an attempt of unknown outcome.
	tokens                 bool
	floors                 bool // tokened writes carry their client's floor
	tokDurable             map[WriteToken]int
	tokBad                 string
	tokRepeats, tokRetried int
	tokLost                int // answers of tokened attempts lost on their way back (the write resent)
	// late runs the duplicates of answered tokened attempts that arrive
	// late (tokDups of them, tokDupRepeats answered from a record), as
	// a request a paused server read before its pause, or one the
	// network delivered twice.
	late                   sync.WaitGroup
	tokDups, tokDupRepeats int
	unsafeDone             int // teeth: a broken rule of completion.go in every tree
	// aging (a quarter of the seeds, with tokens): records age within the
	// run. The trees' token window is simWindow and their clock bound
	// simSkew; each server incarnation's clock (its TreeStore's, which
	// the garbage deadlines read too) is off true time by up to skewBy
	// (simSkew; 4·simSkew in the teeth, beyond the bound), each client's
	// (its stamps) by up to simSkew; two thirds of the late duplicates come
	// up to twice as late as a record lives. tokExpired counts attempts
	// refused as too old, recordsAged the records dropped for age.
	aging, skewTeeth bool
	skewBy           time.Duration
	clientOff        [4]int64
	// pend: the tokened writes of each client process (two of the four
	// clients, whose writes may be in flight at once, share one: its token
	// id, its numbers, its floors, its clock), as the Go client keeps them.
	pend                    [2]treecall.Pending
	tokExpired, recordsAged int
	// closing: nodes whose server closes cleanly (closeClean) now: none
	// restarts there until the close ends, as a node's next process
	// starts after the last one exited. closes counts the clean closes,
	// closeFailed those that failed (the leases stayed, as at a kill).
	closing             map[uint64]bool
	closes, closeFailed int
	closeViolation      string // a clean close that failed with nothing in its way
	noStragglers        bool   // teeth: Cache.Shutdown skips releaseStragglers
	// dir is the tree directory (the config service's, simDirectory):
	// servers create trees in it (creator, non-drop seeds) while they die,
	// pause and are cut off; every collection of orphans and of strays
	// reads it. created holds the creations acknowledged; createErrs
	// counts those that failed (refused: by a retired creator).
	dir                           *simDirectory
	created                       []simCreation
	createErrs, createRefused     int
	createExists                  int
	unsafeCollectIgnoresDirectory bool // teeth: collections of orphans read no directory
	// treeDropper drops trees meanwhile (dropOne), and settles and
	// finishes drops (dropPass). dropped holds the anchors whose drop
	// was acknowledged, dropFailed per name when each drop that failed
	// (its outcome unknown) ended, and unsettled the names whose drop may
	// have been cut off after its mark.
	dropped                               map[Handle]bool
	dropFailed                            map[string][]int64
	unsettled                             map[string]bool
	dropViolation                         string          // the first checkDropsHold failure
	finished                              map[Handle]bool // the anchors of the drops finished
	drops, dropErrs, dropNoTree, dropDied int
	settled, dropsFinished, finishErrs    int
	settledListed                         int // drops settled by settleListed
}

type simServer struct {
	w      *simWorld
	node   uint64
	clerk  *simClerk
	chunks *simChunkClerk
	cache  *Cache
	wal    *txn.Log
	tree   *Tree
	dead   atomic.Bool
	// paused: the process is frozen (its calls wait at the gate); cutStore:
	// cut off the chunk store and its log's RLDev; disrupted: either, or
	// cut off the lock service, is in progress.
	paused, cutStore, disrupted atomic.Bool
	clockOff                    int64        // how far this incarnation's clock is from true time (ns)
	disruptions                 atomic.Int32 // pauses and cuts begun
	stop                        chan struct{}
	once                        sync.Once
	done                        sync.WaitGroup
	hints                       chan hint
	fence                       fenceHolder // the runtime's (Server.fence)
	logHold                     Hold        // its log's lock (the runtime's log holds it: txn.OpenNamed)
	dir                         simDirClerk // the tree directory, through its gate
	creatorsRetired             atomic.Bool // (Server.creatorsRetired)
}

func (s *simServer) isDead() bool { return s.dead.Load() }

// now is the server's clock: its trees' (token ages, garbage deadlines).
func (s *simServer) now() int64 { return time.Now().UnixNano() + s.clockOff }

// gate is what a call of s to the storage meets before it is sent.
// dirGate is gate for the tree directory's calls: the config service is
// a service of its own, which a server cut off the storage still reaches
// (its chunk calls fail while its decrees go through).
func (s *simServer) dirGate(ctx context.Context) error {
	if err := s.waitRunning(ctx); err != nil {
		return err
	}
	if s.isDead() {
		return errSimDead
	}
	return nil
}

func (s *simServer) gate(ctx context.Context) error {
	if err := s.waitRunning(ctx); err != nil {
		return err
	}
	if s.isDead() {
		return errSimDead
	}
	if s.cutStore.Load() {
		return errSimCut
	}
	return nil
}

// waitRunning waits while s is frozen.
func (s *simServer) waitRunning(ctx context.Context) error {
	for s.paused.Load() && !s.isDead() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
	return nil
}

func (s *simServer) halt() { s.once.Do(func() { close(s.stop) }) }

func (s *simServer) currentFence() *rldev.Fence { return s.fence.current() }

func (s *simServer) renew(ctx context.Context) error { return s.fence.renew(ctx) }

func (w *simWorld) rand(n int) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.r.Intn(n)
}

// startServer starts node's server: it waits for the replay of its
// previous incarnation's log (the fence and log locks are that
// incarnation's until then), then opens the log.
//
// abortAt > 0 kills the server's node while the server starts, at step
// abortAt: 1 once its clerk registered (a recovery the service gives it
// fails), 2 once it holds its fence lock, 3 once it holds its log's lock
// too, 4 once it opened its log. startServer then returns errSimAborted.
func (w *simWorld) startServer(node uint64, abortAt int) (_ *simServer, err error) {
	s := &simServer{w: w, node: node, stop: make(chan struct{}), hints: make(chan hint, 256)}
	switch {
	case w.skewTeeth:
		// Server 1 as far ahead as server 2 is behind.
		s.clockOff = [4]int64{0, int64(w.skewBy), -int64(w.skewBy), 0}[node]
	case w.skewBy > 0:
		// (Each start a new offset: a restarted machine's clock may have
		// been set meanwhile, within the bound.)
		s.clockOff = int64(w.rand(int(2*w.skewBy+1))) - int64(w.skewBy)
	}
	w.mu.Lock()
	w.every = append(w.every, s)
	w.mu.Unlock()
	abort := func(step int) bool {
		if step != abortAt {
			return false
		}
		w.event("server %d dies while it starts (step %d)", node, step)
		s.dead.Store(true)
		w.locks.kill(s.clerk)
		return true
	}
	defer func() {
		if err != nil && s.wal != nil {
			go func() { // refused once a replay fenced the log
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				_ = s.wal.Close(ctx)
				cancel()
			}()
		}
	}()
	chunks := w.chunks.clerk(node, s.gate)
	if w.tearOneIn > 0 {
		chunks.crash = func() bool {
			if s.isDead() || w.noTears.Load() || w.rand(w.tearOneIn) != 0 {
				return false
			}
			w.event("server %d's node dies in the middle of a chunk write", node)
			w.die(s)
			return true
		}
	}
	chunks.midRead = func() {
		// Now and then the server pauses with a read in flight, past its
		// leases' time: the read ends with the store's image of a node
		// whose lease the service may have granted elsewhere meanwhile
		// (review 45: the cache must not serve it with its own images).
		if w.pauseMidReadOneIn <= 0 || w.noTears.Load() || w.rand(w.pauseMidReadOneIn) != 0 {
			return
		}
		w.mu.Lock()
		if w.servers[node] != s || !s.disrupted.CompareAndSwap(false, true) {
			w.mu.Unlock()
			return // (a server starting: a death now is not the world's to see)
		}
		w.disrupts++
		d := time.Duration(float64(w.locks.lease+w.locks.grace) * (1.2 + w.r.Float64()))
		if w.readPastLease {
			// (the teeth: long enough for the others to change the
			// nodes and write them back, revoked)
			d *= 5
		}
		w.mu.Unlock()
		w.event("server %d pauses with a read in flight", node)
		w.disrupt(s, 0, d)
	}
	s.chunks = chunks
	s.dir = w.dir.clerk(s.dirGate)
	var dir Directory = s.dir
	if w.unsafeCollectIgnoresDirectory {
		dir = nil
	}
	s.clerk = w.locks.newClerk(node, func(ctx context.Context, r lock.Recovery) error {
		if s.isDead() {
			return errSimDead
		}
		// The run's collection of the dead server's orphans runs after
		// the run, as the server's does (after the leases are freed),
		// 0-30 ms late, on the recovering server's gates.
		later := func(collect func(context.Context)) {
			delay := time.Duration(w.rand(31)) * time.Millisecond
			w.collections.Add(1)
			go func() {
				defer w.collections.Done()
				select {
				case <-time.After(delay):
				case <-w.ctx.Done():
					return
				}
				if s.isDead() {
					return // a stopped server's is the log's next holder's
				}
				collect(w.ctx)
				w.lateCollections.Add(1)
				w.event("server %d collects server %v's orphans, %v after its replay", node, r.Dead, delay)
			}()
		}
		rep, err := replayDead(ctx, gatedDevice{w.devs[r.Dead.Node], s.gate}, r, chunks, dir, replayUnsafe{uncovered: w.unsafeUncovered, keepTags: w.replayKeepsTags}, later, simLog, func(h Handle, err error) {
			w.replayLeaks.Add(1)
			w.event("server %d's replay of node %d's log let value chunk %v leak: %v", node, r.Dead.Node, h, err)
		})
		w.event("server %d replays server %v's log (all %v, %d names, %d excluded): %d records, committed %d, redone %d, err %v", node, r.Dead, r.All, len(r.Names), len(r.Exclude), rep.Records, len(rep.Committed), rep.Redone, err)
		if errors.Is(err, errBaseless) {
			w.baseless.Add(1)
			w.stop()
		}
		return err
	})
	clerk := s.clerk
	s.fence = fenceHolder{name: FenceLock(node), timeout: 2 * time.Second, // (the runtime's: OpTimeout)
		acquire: func(ctx context.Context, name string) (Hold, error) { return clerk.Acquire(ctx, name, lock.Exclusive) },
		drop:    clerk.drop,
		fail:    func(err error) { s.cache.fail(err) }}
	s.cache = NewCache(CacheConfig{Locks: s.clerk, Chunks: chunks, Fence: s.currentFence, Renew: s.renew, Capacity: 24, Log2: simLog})
	s.cache.unsafeStraysIgnoreLinks = w.straysIgnoreLinks
	s.cache.unsafeStale = w.stale
	s.cache.unsafeDeltaAcrossWriteBack = w.deltaAcrossWriteBack
	s.cache.testBeforeCommit = func() {
		// Now and then a commit dawdles between its updates and its
		// commit record, so that checkpoints (and their write-back
		// snapshots) run in between: the race delta.go's rule must close.
		if w.rand(8) == 0 {
			time.Sleep(time.Duration(w.rand(3000)) * time.Microsecond)
		}
	}
	s.cache.unsafeLeaseTime = w.ignoreLeaseTime
	s.cache.unsafeReadPastLease = w.readPastLease
	s.cache.unsafeIgnoreDropped = w.ignoreDropped
	w.locks.mu.Lock()
	s.clerk.onRevoke = s.cache.Revoked
	w.locks.mu.Unlock()
	ctx, cancel := context.WithTimeout(w.ctx, 30*time.Second)
	defer cancel()
	if abort(1) {
		return nil, errSimAborted
	}
	h, err := s.clerk.Acquire(ctx, FenceLock(node), lock.Exclusive)
	if err != nil {
		return nil, err
	}
	s.fence.set(h)
	if abort(2) {
		return nil, errSimAborted
	}
	lh, err := s.clerk.Acquire(ctx, txn.LockName(LogName(node)), lock.Exclusive)
	if err != nil {
		return nil, err
	}
	s.logHold = lh
	if abort(3) {
		return nil, errSimAborted
	}
	wal, err := txn.Open(ctx, txn.Config{Device: gatedDevice{w.devs[node], s.gate}, Fence: rldev.Fence{Name: txn.LockName(LogName(node)), Token: lh.Token()},
		Applier: replayApplier{chunks: chunks, fence: s.currentFence}, Checkpointer: s.cache, Log: simLog, LazyInterval: time.Second})
	if err != nil {
		return nil, err
	}
	s.wal = wal
	s.cache.cfg.Log = wal
	owner := chunk.Owner{Log: OwnerLog(node), Token: lh.Token()} // as StartServer: the log's lock token
	if !w.untagged {
		s.cache.setOwner(owner)
		s.cache.cfg.Named = func(ctx context.Context) (map[Handle]bool, error) { // as StartServer's (Server.named)
			return namedAfterRetiring(ctx, s.dir, owner, &s.creatorsRetired)
		}
	}
	if abort(4) {
		return nil, errSimAborted
	}
	cfg := Config{NodeSize: w.nodeSize, MaxFanout: 4, Grace: 40 * time.Millisecond, MaxInline: w.inline,
		Underfull: func(level int, key []byte) {
			select {
			case s.hints <- hint{level: level, key: key}:
			default:
			}
		}}
	// Half the floor seeds drop records below a floor at every write,
	// half once records take half a leaf's room (seldom in runs this
	// short: the same as no floors, mostly).
	cfg.eagerFloors = w.floors && (w.seed/32)%2 == 0 || w.unsafeDone == unsafeDoneFloorForgets
	if w.aging {
		// Grace covers the servers' clocks' spread as Config.Grace says
		// (in the teeth too: only the token rule's bound is broken).
		cfg.tokenWindow, cfg.clockSkew, cfg.Grace = simWindow, simSkew, cfg.Grace+2*w.skewBy
	}
	tr, err := New(s.cache.Store(w.anchor, w.nodeSize, s.now), w.anchor.ID, cfg)
	if err != nil {
		return nil, err
	}
	tr.keepOldValues, tr.logFreesOnly = w.keepOldValues, w.logFreesOnly
	tr.onDurable = w.tokenDurable
	tr.unsafeDone = w.unsafeDone
	s.tree = tr
	s.done.Add(4)
	stopped := func() (context.Context, context.CancelFunc) { // ends at s.stop
		ctx, cancel := context.WithCancel(w.ctx)
		go func() {
			select {
			case <-s.stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		return ctx, cancel
	}
	go func() { // what the log's earlier holders left, as StartServer collects it
		defer s.done.Done()
		ctx, cancel := stopped()
		defer cancel()
		if n := collectOrphans(ctx, chunks, dir, owner.Log, owner.Token, simLog, "start"); n > 0 {
			w.event("server %d freed %d chunks earlier holders of its log left", node, n)
		}
	}()
	go func() { // what its own allocations whose answers were lost left, as StartServer runs it
		defer s.done.Done()
		ctx, cancel := stopped()
		defer cancel()
		collectStraysEvery(ctx, s.cache, 20*time.Millisecond, simLog)
	}()
	go func() { // the failure watch, as Service.watch runs it
		defer s.done.Done()
		for {
			select {
			case <-s.stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			err := s.cache.Err()
			if err == nil {
				err = s.wal.Err()
			}
			if err != nil && !s.cache.lost() {
				w.event("server %d failed with its leases standing: it resigns: %v", node, err)
				w.mu.Lock()
				w.resigned++
				w.mu.Unlock()
				go w.die(s)
				return
			}
		}
	}()
	go func() { // compression, as the server's compressor runs it
		defer s.done.Done()
		defer w.guard(fmt.Sprintf("server %d's compressor", node))
		for {
			select {
			case <-s.stop:
				return
			case h := <-s.hints:
				ctx, cancel := context.WithTimeout(w.ctx, 2*time.Second)
				_, _ = s.tree.Compress(ctx, h.level, h.key)
				cancel()
			}
		}
	}()
	return s, nil
}

// die takes s out of the live servers (if it still is one) and kills it.
func (w *simWorld) die(s *simServer) {
	w.mu.Lock()
	if w.servers[s.node] != s {
		w.mu.Unlock()
		return
	}
	delete(w.servers, s.node)
	w.killed[s.node] = true
	w.kills++
	w.mu.Unlock()
	w.kill(s)
}

// closeClean stops s as `grove server` stops on SIGTERM (Server.Close):
// its background work ends; the cache refuses every commit from then on,
// writes every dirty node back, disowns what the log links, and the log is
// checkpointed and closed; then the fence, the log's lock and the clerk go
// (every lease given back: nothing for a recovery to do). Operations in
// flight on s are refused as not applied, or fail. A close that fails (a
// hold still out, the storage or the lock service out of reach) leaves the
// leases standing; the process exits all the same: it is declared dead and
// its log replayed, as after a kill. Either way the node's next server
// starts only once this one is gone. Clients keep sending s requests
// until the close ends (a node's service stops listening last), and s may
// be killed, paused or cut off meanwhile.
func (w *simWorld) closeClean(s *simServer) {
	w.event("server %d closes cleanly", s.node)
	d0 := s.disruptions.Load()
	s.cache.unsafeNoStragglers = w.noStragglers
	s.halt()
	s.done.Wait()
	ctx, cancel := context.WithTimeout(w.ctx, 2*time.Second)
	defer cancel()
	err := closeSequence(ctx, s.cache, s.wal, s.logHold.Release, &s.fence, func(ctx context.Context) error { return w.locks.closeClerk(ctx, s.clerk) })
	if err != nil {
		w.event("server %d's clean close failed; its process exits with its leases standing: %v", s.node, err)
		w.kill(s)
	} else {
		s.dead.Store(true) // the process exits: nothing more goes out
		w.event("server %d closed", s.node)
	}
	w.mu.Lock()
	mine := w.servers[s.node] == s // (not killed, nor resigned, meanwhile)
	if mine {
		delete(w.servers, s.node)
	}
	switch {
	case err == nil:
		w.closes++
	case mine:
		if os.Getenv("GROVE_SIM_ERRS") != "" {
			fmt.Fprintf(os.Stderr, "CLOSE FAILED %v\n", err)
		}
		if s.disruptions.Load() == d0 && errors.Is(err, lock.ErrStillHeld) && w.closeViolation == "" {
			// Nothing kept this close from giving every lease back: a
			// hold still out is the close's defect. (An operation that
			// outlives the close's deadline, errStragglers, may be slow
			// rather than wrong on a loaded machine: not judged here;
			// TestReview23ShutdownWaitsForWaiterWithoutPin checks the
			// waiters.)
			w.closeViolation = fmt.Sprintf("server %d's clean close, neither disrupted nor killed, failed: %v", s.node, err)
		}
		w.killed[s.node] = true
		w.kills++
		w.closeFailed++
	}
	delete(w.closing, s.node)
	w.mu.Unlock()
}

// disrupt pauses s, or cuts it off the lock service or the storage, for d;
// then heals it. A server declared dead meanwhile learns it at the heal,
// after its frozen calls went out, and dies (its node restarts it later).
func (w *simWorld) disrupt(s *simServer, kind int, d time.Duration) {
	names := []string{"paused", "cut off the lock service", "cut off the storage"}
	w.event("server %d %s for %v", s.node, names[kind], d)
	s.disruptions.Add(1)
	switch kind {
	case 0:
		s.paused.Store(true)
		w.locks.setCut(s.clerk, true, true)
	case 1:
		w.locks.setCut(s.clerk, true, false)
	case 2:
		s.cutStore.Store(true)
	}
	select {
	case <-time.After(d):
	case <-w.ctx.Done():
	}
	s.paused.Store(false)
	s.cutStore.Store(false)
	time.Sleep(2 * time.Millisecond) // the resumed calls go out first
	w.locks.setCut(s.clerk, false, false)
	w.locks.mu.Lock()
	dead := s.clerk.dead
	w.locks.mu.Unlock()
	s.disrupted.Store(false)
	w.event("server %d healed (declared dead meanwhile: %v)", s.node, dead)
	if dead {
		w.mu.Lock()
		w.expired++
		w.mu.Unlock()
		w.die(s)
	}
}

// kill declares s dead: it fenced itself; its leases stay until another
// server (or its next incarnation, if none is alive) replays its log.
func (w *simWorld) kill(s *simServer) {
	w.event("kill server %d", s.node)
	s.dead.Store(true)
	w.locks.kill(s.clerk)
	s.halt()
	go func() {
		s.done.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = s.wal.Close(ctx) // in flight at the death: refused once the replay fenced the log
		cancel()
	}()
}

// ---- the oracle: a map of keys, with scans and counts

type (
	kvIn    = lincheck.In
	kvOut   = lincheck.Out
	history = lincheck.History
)

var kvModel = lincheck.Model

func (w *simWorld) now() int64 { return int64(time.Since(w.start)) }

func (w *simWorld) event(format string, args ...any) {
	w.events.Lock()
	defer w.events.Unlock()
	w.events.lines = append(w.events.lines, fmt.Sprintf("EVENT %d ", w.now()/1000)+fmt.Sprintf(format, args...))
}

// eventsOf returns the events that contain what, one a line.
func (w *simWorld) eventsOf(what string) string {
	w.events.Lock()
	defer w.events.Unlock()
	var out []string
	for _, l := range w.events.lines {
		if strings.Contains(l, what) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) string {
	l := strings.Split(s, "\n")
	return strings.Join(l[max(0, len(l)-n):], "\n")
}

// pick returns a live server (nil if none).
func (w *simWorld) pick() *simServer {
	w.mu.Lock()
	defer w.mu.Unlock()
	var live []*simServer
	for n := uint64(1); n <= 3; n++ {
		if s := w.servers[n]; s != nil {
			live = append(live, s)
		}
	}
	if len(live) == 0 {
		return nil
	}
	return live[w.r.Intn(len(live))]
}

const simKeys = 24

func simKey(i int) string { return fmt.Sprintf("k%02d", i) }

// op runs one random operation on server s and records it.
func (w *simWorld) op(h *history, client, i int, s *simServer) {
	in := kvIn{Key: simKey(w.rand(simKeys))}
	x := w.rand(100)
	if w.readPastLease && x >= 60 && x < 80 {
		x = 80 + w.rand(15) // (the teeth: scans for gets, runs of leaves)
	}
	switch {
	case x < 35:
		in.Kind, in.Val = "put", fmt.Sprintf("c%d.%d", client, i)
		switch w.rand(6) {
		case 0:
			in.Cond = lincheck.IfAbsent
		case 1:
			in.Cond, in.Eq = lincheck.IfEquals, fmt.Sprintf("c%d.%d", w.rand(4), w.rand(i+1))
		}
	case x < 60:
		in.Kind = "del"
		if w.rand(5) == 0 {
			in.Cond, in.Eq = lincheck.IfEquals, fmt.Sprintf("c%d.%d", w.rand(4), w.rand(i+1))
		}
	case x < 80:
		in.Kind = "get"
	case x < 95:
		in.Kind, in.Limit, in.Reverse = "scan", w.rand(6), w.rand(2) == 0
		a, b := w.rand(simKeys+1), w.rand(simKeys+1)
		if a > b {
			a, b = b, a
		}
		in.From = simKey(a)
		if a == 0 {
			in.From = ""
		}
		if b != simKeys && b > a {
			in.To = simKey(b)
		}
	default:
		in.Kind = "count"
		a := w.rand(simKeys)
		in.From, in.To = simKey(a), simKey(a+1+w.rand(simKeys-a))
	}
	timeout := 3 * time.Second
	if w.ignoreLeaseTime {
		// Clients give up soon on a server that waits for its leases, so
		// that they come back with reads its cache may answer.
		timeout = w.locks.lease / 3
	}
	ctx, cancel := context.WithTimeout(w.ctx, timeout)
	defer cancel()
	w.send(ctx, h, client, i, s, in)
}

// send runs one operation as the Go client runs a call, by the rules of
// package treecall (the client's own): an attempt at s, then, as the rules
// allow, attempts at other live servers within ctx (and at most 4),
// backing off after each round of them. A put or delete goes under a write token in the
// tokens seeds (each attempt within a second, as the client's attempt
// timeout is a third of its call's), untokened otherwise. The operation
// is one in the history, from its first send to its answer: open-ended
// if its outcome is unknown, left out if the rules say that nothing was
// done (refused before any change, or an answer that is a refusal).
func (w *simWorld) send(ctx context.Context, h *history, client, i int, s *simServer, in kvIn) {
	call := treecall.Call{Kind: treecall.Read}
	if in.Kind == "put" || in.Kind == "del" {
		call.Kind, call.Tokened = treecall.Write, w.tokens
	}
	// Clients 0 and 1 are one process to the trees, and 2 and 3 another
	// (one token id, numbered and floored by one treecall.Pending, as the
	// Go client does), so that one process has writes in flight at once.
	pend := &w.pend[client/2]
	tok := WriteToken{Client: [16]byte{byte(client/2 + 1)}}
	if call.Tokened {
		tok.Seq, tok.Stamp = pend.Begin(), time.Now().UnixNano()+w.clientOff[client]
		defer func() {
			if tok.Seq != 0 {
				pend.End(tok.Seq)
			}
		}()
	}
	start := w.now()
	var servers []uint64
	backoff := 50 * time.Millisecond
	var err error
	for tried := 1; ; tried++ {
		if tried > 1 && ctx.Err() != nil {
			// (Its time ended in the pause before this attempt.)
			if call.Ended() == treecall.Unknown {
				h.Add(client, in, kvOut{Unknown: true}, start, math.MaxInt64, "servers ", servers, " tokened ", call.Tokened, " err ", err)
			} else if call.Kind == treecall.Write {
				w.mu.Lock()
				w.leftOut++
				w.mu.Unlock()
			}
			return
		}
		var out kvOut
		var r Result
		err = errSimNotSent
		if s != nil {
			servers = append(servers, s.node)
			actx, cancel := ctx, context.CancelFunc(func() {})
			if call.Tokened {
				actx, cancel = context.WithTimeout(ctx, time.Second)
			}
			if err = s.waitRunning(actx); err != nil {
				err = errSimNotSent // (a frozen server takes a request when it resumes)
			} else if call.Tokened {
				tk := tok
				tk.Attempt = call.Attempt()
				if w.floors {
					tk.Floor = pend.Floor()
				}
				cond := Cond{Kind: simCond(in.Cond), Value: []byte(in.Eq), Prev: true}
				if in.Kind == "put" {
					r, err = s.tree.PutOnce(actx, []byte(in.Key), []byte(in.Val), cond, &tk)
				} else {
					r, err = s.tree.DeleteOnce(actx, []byte(in.Key), cond, &tk)
				}
				out = kvOut{Applied: r.Applied, Found: r.Found, Prev: string(r.Prev), FoundOnly: r.Repeat}
			} else if in.Kind == "get" {
				var v []byte
				v, out.Found, err = s.tree.Get(actx, []byte(in.Key))
				out.Val = string(v)
			} else {
				err = w.run(actx, s, in, &out)
			}
			cancel()
			if err == nil && call.Tokened && w.rand(8) == 0 {
				// The answer is lost on its way back (RIFL's case): the
				// write took effect, or failed its condition, and the
				// client resends it; the retry's answer, from the record,
				// is what goes into the history.
				err = errSimAnswerLost
				w.mu.Lock()
				w.tokLost++
				w.mu.Unlock()
			}
		}
		if err == nil {
			if d := w.droppedAt.Load(); d != 0 && start > d {
				if w.afterDrop.Add(1) == 1 {
					w.afterDropFirst.Store(fmt.Sprintf("a %s of %q through server %d began %dµs after the drop's mark returned and succeeded (tokened: %v)", in.Kind, in.Key, s.node, (start-d)/1000, call.Tokened))
				}
			}
			if call.Tokened {
				w.mu.Lock()
				if r.Repeat {
					w.tokRepeats++
				}
				if call.Ambiguous > 0 {
					w.tokRetried++
				}
				w.mu.Unlock()
			}
			h.Add(client, in, out, start, w.now(), "servers ", servers, " attempts ", tried, " tokened ", call.Tokened, " repeat ", r.Repeat)
			if call.Tokened && (w.rand(4) == 0 || w.skewTeeth) {
				tk := tok
				tk.Attempt = call.Attempt()
				if w.floors {
					tk.Floor = pend.Floor()
				}
				w.duplicate(in, tk, r)
			}
			return
		}
		if errors.Is(err, ErrTokenReused) {
			w.tokenViolation(fmt.Sprintf("write %d.%d: a token of one write refused as another's: %v", client+1, tok.Seq, err))
			return
		}
		st := status.Convert(rpcError(err))
		if os.Getenv("GROVE_SIM_ERRS") != "" {
			fmt.Fprintf(os.Stderr, "ATTEMPT %s %s: %v\n", in.Kind, in.Key, err)
		}
		if err != errSimNotSent && treecall.IsNotApplied(st) {
			w.mu.Lock()
			w.notApplied++
			w.mu.Unlock()
		}
		if errors.Is(err, ErrTokenExpired) {
			w.mu.Lock()
			w.tokExpired++
			w.mu.Unlock()
		}
		// The client tries until its context ends; the simulator gives a
		// write up after 4 attempts and a read after one, as if its
		// context had ended (its time goes to writes: a read's retry
		// changes nothing the oracle checks), so that a seed whose
		// servers refuse for long (a teeth's broken tree) stays short.
		done := ctx.Err() != nil || tried >= 4 || call.Kind == treecall.Read
		switch d := call.Failed(st, done); d.Step {
		case treecall.Again:
			if d.NewToken {
				pend.End(tok.Seq)
				tok.Seq, tok.Stamp = pend.Begin(), time.Now().UnixNano()+w.clientOff[client]
			}
			if d.Untokened {
				pend.End(tok.Seq)
				tok.Seq = 0
			}
			continue
		case treecall.Answer, treecall.Unavailable:
			// Nothing was done: left out, so that a lie here shows as a
			// value no operation wrote.
			if call.Kind == treecall.Write {
				w.mu.Lock()
				w.leftOut++
				w.mu.Unlock()
			}
			return
		case treecall.Unknown:
			// It may take effect at any time after its first send.
			h.Add(client, in, kvOut{Unknown: true}, start, math.MaxInt64, "servers ", servers, " tokened ", call.Tokened, " err ", err)
			return
		}
		// Next: another live server, after a pause once per round.
		if tried%3 == 0 {
			select {
			case <-ctx.Done():
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, time.Second)
		}
		s = w.pick()
	}
}

// The aging seeds' token window and clock bound (Config.tokenWindow,
// clockSkew): records live simWindow + 2·simSkew.
const (
	simWindow = 150 * time.Millisecond
	simSkew   = 30 * time.Millisecond
)

// errSimAnswerLost is an attempt whose answer the simulated network lost.
var errSimAnswerLost = status.Error(codes.Unavailable, "sim: the answer was lost")

// errSimNotSent is an attempt that found no live server, or one frozen past
// its time: nothing was sent (the client's unreachable endpoint).
var errSimNotSent = NotAppliedError(codes.Unavailable, "sim: not sent")

// duplicate sends an answered attempt of a tokened write again, late,
// through a random live server: its answer, if it has one, must be the
// write's (first).
func (w *simWorld) duplicate(in kvIn, tok WriteToken, first Result) {
	delay := time.Duration(w.rand(30)) * time.Millisecond
	switch {
	case w.skewTeeth:
		// Once the fast server may have dropped the record, before the
		// slow one's window ends.
		delay = simWindow/2 + time.Duration(w.rand(int(simWindow/time.Millisecond)))*time.Millisecond
	case w.aging && w.rand(3) != 0:
		// Up to twice as late as a record lives: inside the window,
		// past it with the record still kept, and past the record's
		// life (refused, never applied again).
		delay = time.Duration(w.rand(int(2*(simWindow+2*simSkew)/time.Millisecond))) * time.Millisecond
	}
	w.late.Add(1)
	go func() {
		defer w.late.Done()
		defer w.guard("a late duplicate")
		time.Sleep(delay)
		s := w.pick()
		if s == nil {
			return
		}
		ctx, cancel := context.WithTimeout(w.ctx, time.Second)
		defer cancel()
		if s.waitRunning(ctx) != nil {
			return
		}
		cond := Cond{Kind: simCond(in.Cond), Value: []byte(in.Eq)}
		var r Result
		var err error
		if in.Kind == "put" {
			r, err = s.tree.PutOnce(ctx, []byte(in.Key), []byte(in.Val), cond, &tok)
		} else {
			r, err = s.tree.DeleteOnce(ctx, []byte(in.Key), cond, &tok)
		}
		w.mu.Lock()
		w.tokDups++
		if errors.Is(err, ErrTokenExpired) {
			w.tokExpired++
		}
		if err == nil && r.Repeat {
			w.tokDupRepeats++
		}
		w.mu.Unlock()
		switch {
		case err == nil && (!r.Repeat || r.Applied != first.Applied || r.Found != first.Found):
			w.tokenViolation(fmt.Sprintf("write %d.%d of %q: answered %+v, a late duplicate of attempt %d through server %d %+v",
				tok.Client[0], tok.Seq, in.Key, first, tok.Attempt, s.node, r))
		case errors.Is(err, ErrTokenReused):
			w.tokenViolation(fmt.Sprintf("write %d.%d: a late duplicate refused as another write's: %v", tok.Client[0], tok.Seq, err))
		}
	}()
}

// tokenDurable is every tree's onDurable: a tokened write's outcome
// committed durably twice is an oracle failure.
func (w *simWorld) tokenDurable(tok WriteToken) {
	tok.Attempt, tok.Floor = 0, 0
	w.mu.Lock()
	w.tokDurable[tok]++
	n := w.tokDurable[tok]
	w.mu.Unlock()
	if n > 1 {
		w.tokenViolation(fmt.Sprintf("write %d.%d: its outcome committed durably %d times", tok.Client[0], tok.Seq, n))
	}
}

func (w *simWorld) tokenViolation(msg string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.tokBad == "" {
		w.tokBad = msg
	}
}

// simCond is the tree's condition for the oracle's.
func simCond(c lincheck.Cond) CondKind {
	switch c {
	case lincheck.IfAbsent:
		return IfAbsent
	case lincheck.IfEquals:
		return IfEquals
	case lincheck.IfExists:
		return IfExists
	}
	return Always
}

// run runs a write, count or scan on s.
func (w *simWorld) run(ctx context.Context, s *simServer, in kvIn, out *kvOut) (err error) {
	switch in.Kind {
	case "put", "del":
		var r Result
		if in.Kind == "put" {
			r, err = s.tree.Put(ctx, []byte(in.Key), []byte(in.Val), Cond{Kind: simCond(in.Cond), Value: []byte(in.Eq), Prev: true})
		} else {
			r, err = s.tree.Delete(ctx, []byte(in.Key), Cond{Kind: simCond(in.Cond), Value: []byte(in.Eq), Prev: true})
		}
		out.Applied, out.Found, out.Prev = r.Applied, r.Found, string(r.Prev)
	case "count":
		out.Count, err = s.tree.Count(ctx, Span{From: []byte(in.From), To: []byte(in.To)})
	case "scan":
		span := Span{From: []byte(in.From)}
		if in.To != "" {
			span.To = []byte(in.To)
		}
		var pg Page
		pg, err = s.tree.Scan(ctx, span, in.Limit, in.Reverse)
		for i, k := range pg.Keys {
			out.Keys = append(out.Keys, string(k))
			out.Vals = append(out.Vals, string(pg.Vals[i]))
		}
		out.Lo, out.Hi, out.HiInf, out.More = string(pg.Lo), string(pg.Hi), pg.Hi == nil, pg.More
	}
	return err
}

// faults kills and restarts, pauses and cuts off servers until stop
// closes; it returns once every disruption healed.
func (w *simWorld) faults(stop chan struct{}, wg *sync.WaitGroup) {
	defer wg.Done()
	defer w.guard("the faults")
	var heals sync.WaitGroup
	defer heals.Wait()
	for {
		select {
		case <-stop:
			return
		case <-time.After(time.Duration(3+w.rand(12)) * time.Millisecond):
		}
		if x := w.rand(10); x < 2 || w.ignoreLeaseTime && x < 6 {
			w.mu.Lock()
			var cand []*simServer
			for n := uint64(1); n <= 3; n++ {
				if s := w.servers[n]; s != nil && !s.disrupted.Load() {
					cand = append(cand, s)
				}
			}
			if len(cand) == 0 || w.ignoreLeaseTime && len(cand) < len(w.servers) {
				w.mu.Unlock()
				continue // (the teeth: one at a time, the others serve)
			}
			s := cand[w.r.Intn(len(cand))]
			kind := w.r.Intn(3)
			// Half of them last past lease + grace.
			d := time.Duration(float64(w.locks.lease+w.locks.grace) * (0.2 + 1.6*w.r.Float64()))
			if w.ignoreLeaseTime {
				kind, d = 1, 5*(w.locks.lease+w.locks.grace)
			}
			s.disrupted.Store(true)
			w.disrupts++
			w.mu.Unlock()
			heals.Add(1)
			go func() {
				defer heals.Done()
				w.disrupt(s, kind, d)
			}()
			continue
		}
		switch x := w.rand(10); {
		case x < 4 && !w.noStragglers: // (the teeth: closes instead)
			w.mu.Lock()
			var live []*simServer
			for _, s := range w.servers {
				live = append(live, s)
			}
			if len(live) == 0 || len(live) == 1 && w.r.Intn(4) > 0 && !w.biasAborts {
				w.mu.Unlock()
				continue
			}
			sort.Slice(live, func(i, j int) bool { return live[i].node < live[j].node })
			s := live[w.r.Intn(len(live))]
			delete(w.servers, s.node)
			w.killed[s.node] = true
			w.kills++
			failover := len(w.servers) == 0 && w.r.Intn(4) == 0
			w.mu.Unlock()
			w.kill(s)
			if failover {
				w.event("the lock master fails over and loses the leases of some dead servers")
				w.locks.failover()
			}
		case x < 5:
			w.mu.Lock()
			var cand []*simServer
			for n := uint64(1); n <= 3; n++ {
				if s := w.servers[n]; s != nil && !s.disrupted.Load() && !w.closing[n] {
					cand = append(cand, s)
				}
			}
			if len(cand) == 0 {
				w.mu.Unlock()
				continue
			}
			s := cand[w.r.Intn(len(cand))]
			w.closing[s.node] = true // (it serves on while it closes)
			w.mu.Unlock()
			heals.Add(1)
			go func() {
				defer heals.Done()
				w.closeClean(s)
			}()
		case x < 8:
			w.restartOne(true)
		case x < 9:
			w.event("the lock master fails over and loses the leases of some dead servers")
			w.locks.failover()
		default:
			w.chunks.mu.Lock()
			if w.chunks.lossRate == 0 {
				w.chunks.lossRate = 0.1
			} else {
				w.chunks.lossRate = 0
			}
			w.chunks.mu.Unlock()
		}
	}
}

// restartOne restarts a dead server, if any. mayAbort: its node may crash
// again while it starts (a sixth of the time), and then, if no server is
// left alive, the lock master may fail over (half the time).
func (w *simWorld) restartOne(mayAbort bool) bool {
	w.mu.Lock()
	var node uint64
	for n := uint64(1); n <= 3; n++ {
		if w.servers[n] == nil && !w.closing[n] {
			node = n
			break
		}
	}
	abort := 0
	if mayAbort && w.r.Intn(6) == 0 {
		abort = 1 + w.r.Intn(4)
	}
	if mayAbort && w.biasAborts && w.r.Intn(2) == 0 {
		// (the teeth: more nodes that die as their server waits for its
		// fence lock)
		abort = 1
	}
	w.mu.Unlock()
	if node == 0 {
		return false
	}
	s, err := w.startServer(node, abort)
	if errors.Is(err, errSimAborted) {
		w.mu.Lock()
		w.aborted++
		alone := len(w.servers) == 0
		failover := alone
		w.mu.Unlock()
		if failover {
			w.event("the lock master fails over and loses the leases of some dead servers")
			w.locks.failover()
		}
		return false
	}
	if err != nil {
		// (A replay that met a delta without its base never ends: the
		// seed fails on that, not here.)
		if w.ctx.Err() == nil && w.baseless.Load() == 0 {
			w.t.Errorf("seed %d: restarting server %d: %v", w.seed, node, err)
			// What led here, in the test's log (a CI run keeps nothing
			// else): the last events.
			w.events.Lock()
			tail := w.events.lines[max(0, len(w.events.lines)-40):]
			w.t.Logf("seed %d: the last %d events:\n%s", w.seed, len(tail), strings.Join(tail, "\n"))
			w.events.Unlock()
			if os.Getenv("GROVE_SIM_DUMP") != "" {
				buf := make([]byte, 1<<22)
				buf = buf[:runtime.Stack(buf, true)]
				w.events.Lock()
				lines := strings.Join(w.events.lines, "\n")
				w.events.Unlock()
				_ = os.WriteFile(fmt.Sprintf("/tmp/btree-sim-%d.restart", w.seed), append([]byte(lines+"\n\n"), buf...), 0o644)
			}
		}
		return false
	}
	w.event("server %d started", node)
	w.mu.Lock()
	w.servers[node] = s
	w.restart++
	w.mu.Unlock()
	return true
}

// simChunkReader reads the tree straight from the simulated chunks.
type simChunkReader struct {
	w *simWorld
}

func (r simChunkReader) Anchor(ctx context.Context) (*Anchor, error) {
	r.w.chunks.mu.Lock()
	defer r.w.chunks.mu.Unlock()
	return DecodeAnchor(r.w.chunks.data[r.w.anchor], r.w.anchor)
}

func (r simChunkReader) Read(ctx context.Context, h Handle) (*Node, error) {
	r.w.chunks.mu.Lock()
	defer r.w.chunks.mu.Unlock()
	b, ok := r.w.chunks.data[h]
	if !ok {
		return nil, fmt.Errorf("chunk %v is not allocated", h)
	}
	return Decode(b, r.w.anchor.ID, h)
}

func (r simChunkReader) ReadValue(ctx context.Context, ref ValueRef) ([]byte, error) {
	r.w.chunks.mu.Lock()
	defer r.w.chunks.mu.Unlock()
	b, ok := r.w.chunks.data[ref.Chunk]
	if !ok {
		return nil, fmt.Errorf("value chunk %v is not allocated", ref.Chunk)
	}
	return DecodeValue(b, r.w.anchor.ID, ref)
}

type simResult struct {
	ops, unknown, kills, restarts, late, refused, splits, merges int
	disrupts, expired, resigned, notApplied, leftOut             int
	tokSeeds, tokRepeats, tokRetried, tokDups, tokDupRepeats     int // seeds with tokened writes; their answers from records, writes answered after an attempt of unknown outcome, late duplicates and those answered from records
	agingSeeds, tokExpired, recordsAged                          int // seeds whose records aged; attempts refused (ErrTokenExpired); records dropped for age
	tokLost                                                      int // tokened attempts' answers lost
	refusedOld, refusedFuture, refusedHorizon                    int // the servers' refusals: past the window, stamped in the future, at or below a horizon
	floorSeeds, recordsFloored, refusedFloor                     int // seeds whose clients send floors; records dropped below a floor; attempts refused below one
	closes, closeFailed                                          int // clean closes; those that failed (leases left to a recovery)
	valueWrites, valuesFreed, loggedFrees                        int
	runRenewals                                                  int // recovery runs' renewed tokens
	aborted, failovers, allRuns                                  int // servers killed while they started; master failovers; "all" runs
	lostAllocs, orphans, disowned                                int // allocations whose answer was lost; chunks the final collection freed; chunks checkpoints disowned
	retriedAllocs, strays                                        int // of lostAllocs, those retried with success; chunks live servers' stray collections freed
	lateCollections                                              int // recovery runs' collections of orphans run after the run
	deltas, raceImages                                           int // node changes logged as deltas; whole images commits added after a raced delta
	torn                                                         int // node writes landed torn, their writer dead
	created, createErrs, createRefused, dirLost, dirRefused      int // creations acknowledged, failed, refused as retired; directory decrees whose answer was lost; creations the directory refused
	createExists, dirLate, createdTagged                         int // creations that found their name taken; creation decrees that landed after their caller was told they failed; created trees' chunks left tagged for the final collection
	drops, dropErrs, dropNoTree, dropDied, dropsLate             int // drops acknowledged, failed, of no tree; drops whose server died after the mark; drop decrees that landed after their caller was told they failed
	settled, dropsFinished, finishErrs                           int // drops cut off after their mark and settled; drops finished; finishes that failed (tried again)
	settledListed                                                int // of settled, those settleListed found (their server died)
}

// simTeeth names a defect a seed runs with on purpose (the oracle must
// catch it).
type simTeeth int

const (
	teethNone                    simTeeth = iota
	teethStale                            // caches serve images after giving their leases up
	teethLeaseTime                        // caches serve images past their leases' time
	teethReadPastLease                    // caches serve images and values whose read ended past the leases' time
	teethIgnoreDropped                    // (with a drop) caches serve a dropped tree as a live one
	teethUntagged                         // allocations carry no owner tag
	teethReplayKeepsTags                  // replays leave the chunks committed changes name tagged
	teethKeepOldValues                    // updates never free the value chunks they replaced
	teethUncovered                        // recovery runs replay a log whose lock they do not cover
	teethStragglers                       // clean closes leave the pins of operations still in the cache
	teethStraysIgnoreLinks                // stray collections free chunks committed changes name, not disowned yet
	teethCollectIgnoresDirectory          // collections of orphans free what the tree directory names
	teethDropKeepsName                    // a drop's decree leaves the tree's name listed
	teethLongRerun                        // creations' decrees run again 100-150 ms after they listed the tree (beyond simDropWait)
	teethDeltaAcrossWriteBack             // deltas go on across write-backs: no whole image first (delta.go's rule)
	teethTokenSplitDrops                  // tokened writes, and a split's new node gets no completion records
	teethClockSkew                        // tokened writes aging, the servers' clocks off by 4 times the trees' bound
	teethFloorForgets                     // tokened writes with floors, and records dropped below a floor leave no floor
	logFreesOnly                          // (not teeth) updates leave the old value's free to their change's free record
)

// healAll brings every server back and makes sure no dead incarnation's
// log is still to be replayed: a server whose log or cache failed resigns
// here if its watch has not made it yet (the watch acts asynchronously, and
// a server that died after the restarts would leave its log unreplayed
// under the final checks), every dead node is restarted (each start waits
// for its previous incarnation's replay), until all three are live and
// sound and no dead clerk holds a lease.
func (w *simWorld) healAll() error {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if n := w.baseless.Load(); n > 0 {
			// (A failed replay keeps the dead server's leases: no heal.)
			return fmt.Errorf("%d replays met a node delta whose base image was neither in the log nor in its chunk", n)
		}
		for w.restartOne(false) {
		}
		failed := false
		for n := uint64(1); n <= 3; n++ {
			s := w.servers[n]
			if s == nil {
				failed = true
				continue
			}
			if s.disrupted.Load() {
				// A pause begun before the faults' end (a read's, midRead)
				// is still on: at its heal the server may learn it was
				// declared dead and die, under the final reads (CI seed
				// 626514 under the race detector: "final get: this
				// server's leases are lost"). Wait for it.
				failed = true
				continue
			}
			if (s.cache.Err() != nil || s.wal.Err() != nil) && !s.cache.lost() {
				w.event("server %d failed before the final checks: it resigns", n)
				w.die(s)
				failed = true
			}
		}
		w.locks.mu.Lock()
		for _, c := range w.locks.clerks {
			if c.dead && (len(c.leases) > 0 || c.all) {
				failed = true // its recovery has not run yet
			}
		}
		w.locks.mu.Unlock()
		if !failed {
			return nil
		}
		time.Sleep(5 * time.Millisecond)
	}
	return errors.New("the servers did not all come back sound within a minute of the faults' end")
}

// dropper marks the tree dropped through a live server, once, a while into
// the load (retrying through another server if that one fails).
// simCreations and simDrops bound the trees a seed creates and drops.
const simCreations, simDrops = 8, 4

// simDropWait is the simulator's DropWait: how long after its mark a
// drop is finished. No operation runs on the created trees, so it need
// only outlast what a creation or a drop leaves in flight: the stand-ins'
// late decrees and chunk calls (at most 30 ms), and the attempts of a
// decree Update runs again (simDirectory.maxRerun, 30 ms).
const simDropWait = 50 * time.Millisecond

// creator creates trees through random live servers every 5-30 ms, up to
// simCreations (of fewer names: some clash), while the faults run, and
// while treeDropper drops them: CreateTree's own steps (createTree) on the
// server's cache, chunks and directory clerk. A quarter of the creations
// kill their server just after the chunks were written (before the
// decree), another quarter just after the decree (before the disown): the
// windows the collections of orphans must get right; an eighth freeze
// their server past its lease just before the decree (a zombie's
// creation, which the directory must refuse once a recovery ran).
func (w *simWorld) creator(stop chan struct{}, wg *sync.WaitGroup) {
	defer wg.Done()
	defer w.guard("the creator")
	for i := 0; i < simCreations; i++ {
		select {
		case <-stop:
			return
		case <-time.After(time.Duration(5+w.rand(25)) * time.Millisecond):
		}
		if s := w.pick(); s != nil {
			w.createOne(s)
		}
	}
}

// treeDropper drops trees through random live servers, up to simDrops,
// at the same time as creator creates them (DropTree's steps: beginDrop;
// a quarter kill their server between the anchor's mark and the decree),
// and every 5-20 ms runs a dropper pass on a random live server: the drops
// cut off after their mark are settled, those simDropWait old finished.
func (w *simWorld) treeDropper(stop chan struct{}, wg *sync.WaitGroup) {
	defer wg.Done()
	defer w.guard("the treeDropper")
	drops := 0
	for {
		select {
		case <-stop:
			return
		case <-time.After(time.Duration(5+w.rand(15)) * time.Millisecond):
		}
		if err := w.checkDropsHold(); err != nil {
			w.mu.Lock()
			if w.dropViolation == "" {
				w.dropViolation = err.Error()
			}
			w.mu.Unlock()
		}
		s := w.pick()
		if s == nil {
			continue
		}
		// (With teethLongRerun, every step drops a listed tree, so
		// that drops meet the late attempts.)
		if eager := w.dir.rerunCreations && len(w.dir.trees()) > 0; (drops < simDrops && w.rand(3) == 0) || eager {
			drops++
			w.dropOne(s)
		}
		w.dropPass(simDropWait)
	}
}

// createOne creates a tree through s (creator).
func (w *simWorld) createOne(s *simServer) {
	name := fmt.Sprintf("c%02d", w.rand(simCreations*3/4)) // (some names clash)
	dieAt := [8]string{"", "", "", "written", "written", "decreed", "decreed", "pause"}[w.rand(8)]
	if w.dir.rerunCreations {
		dieAt = "" // (teethLongRerun: every creation's late attempt counts)
	}
	write := func(ctx context.Context, h Handle, img []byte) error {
		return writeFenced(ctx, s.chunks, s.currentFence, h, img)
	}
	var paused sync.WaitGroup
	ctx, cancel := context.WithTimeout(w.ctx, 2*time.Second)
	began := w.now()
	e, err := createTree(ctx, s.cache, s.dir, write, name, Config{NodeSize: w.nodeSize, MaxFanout: 4}, func(stage string, a, r Handle) bool {
		if dieAt == "pause" && stage == "written" && s.disrupted.CompareAndSwap(false, true) {
			// Frozen past its lease before its decree: declared
			// dead, its log recovered, then its decree goes out —
			// before or after the run's collection (which runs
			// late) retires its creations: refused after it, and
			// before it, named when the collection reads the
			// directory (its chunks disowned, not freed).
			w.mu.Lock()
			w.disrupts++
			w.mu.Unlock()
			paused.Add(1)
			go func() {
				defer paused.Done()
				w.disrupt(s, 0, 3*(w.locks.lease+w.locks.grace))
			}()
			time.Sleep(time.Millisecond)
			return false
		}
		if stage != dieAt {
			return false
		}
		w.event("server %d dies creating tree %s (%v, %v) once %s", s.node, name, a, r, stage)
		w.die(s)
		return true
	})
	cancel()
	paused.Wait()
	w.mu.Lock()
	switch {
	case err == nil:
		w.created = append(w.created, simCreation{e: e, began: began})
	case errors.Is(err, ErrCreatorRetired):
		w.createRefused++
	case errors.Is(err, ErrTreeExists):
		w.createExists++
	default:
		w.createErrs++
	}
	w.mu.Unlock()
	w.event("server %d created tree %s: %v (%v)", s.node, name, e.Anchor, err)
}

// checkDropsHold checks, while the faults run, that no tree whose drop
// was acknowledged or finished is listed again (a drop of the name would settle it
// afterwards: the final checks come too late to see it).
func (w *simWorld) checkDropsHold() error {
	listed := w.dir.trees()
	w.mu.Lock()
	defer w.mu.Unlock()
	for name, e := range listed {
		if w.dropped[e.Anchor] {
			return fmt.Errorf("tree %s (%v), whose drop was acknowledged, is listed again", name, e.Anchor)
		}
		if w.finished[e.Anchor] {
			return fmt.Errorf("tree %s (%v), whose drop was finished, is listed again", name, e.Anchor)
		}
	}
	return nil
}

// dropOne drops a tree through s (creator): three times in four one the
// directory lists (as an operator would pick it), else a name of the
// creations', listed or not.
func (w *simWorld) dropOne(s *simServer) {
	name := fmt.Sprintf("c%02d", w.rand(simCreations*3/4))
	var listed []string
	for n := range w.dir.trees() {
		listed = append(listed, n)
	}
	if sort.Strings(listed); len(listed) > 0 && w.rand(4) > 0 {
		name = listed[w.rand(len(listed))]
	}
	die := w.rand(4) == 0
	ctx, cancel := context.WithTimeout(w.ctx, 2*time.Second)
	e, unsettled, err := beginDrop(ctx, s.cache, s.dir, name, func() error {
		if !die {
			return nil
		}
		w.event("server %d dies dropping tree %s once its anchor is marked", s.node, name)
		w.die(s)
		return errTestStop
	})
	cancel()
	w.mu.Lock()
	switch {
	case err == nil:
		w.drops++
		w.dropped[e.Anchor] = true
	case errors.Is(err, ErrNoTree):
		w.dropNoTree++
	default:
		if die {
			w.dropDied++
		} else {
			w.dropErrs++
		}
		// The tree it looked up may be dropped (createdFate).
		w.dropFailed[name] = append(w.dropFailed[name], w.now())
		if unsettled && !die {
			// Its live server's dropper settles it (a dead one's
			// drop is left to settleListed).
			w.unsettled[name] = true
		}
	}
	w.mu.Unlock()
	w.event("server %d dropped tree %s: %v (%v)", s.node, name, e.Anchor, err)
}

// dropPass is a server's dropper pass (Server.dropPass) on a random live
// server: the drops cut off after their mark are settled, the drops
// minAge old finished.
func (w *simWorld) dropPass(minAge time.Duration) {
	s := w.pick()
	if s == nil {
		return
	}
	ctx, cancel := context.WithTimeout(w.ctx, 2*time.Second)
	defer cancel()
	w.mu.Lock()
	var names []string
	for n := range w.unsettled {
		names = append(names, n)
	}
	w.mu.Unlock()
	sort.Strings(names)
	for _, n := range names {
		settled, err := settleDrop(ctx, s.cache, s.dir, n)
		w.mu.Lock()
		if err == nil {
			delete(w.unsettled, n)
		}
		if settled {
			w.settled++
		}
		w.mu.Unlock()
	}
	n, _, _, _ := dropPassSteps(ctx, s.cache, s.dir, s.chunks.Free, minAge, time.Second, func(e TreeEntry, err error) {
		w.mu.Lock()
		defer w.mu.Unlock()
		if err != nil {
			w.finishErrs++
		} else {
			w.dropsFinished++
			w.finished[e.Anchor] = true
		}
		w.event("server %d finished the drop of tree %s (%v): %v", s.node, e.Name, e.Anchor, err)
	}, nil, 200*time.Millisecond)
	if n > 0 {
		w.mu.Lock()
		w.settledListed += n
		w.mu.Unlock()
		w.event("server %d settled %d listed trees whose anchors say dropped", s.node, n)
	}
}

// finishAllDrops settles and finishes every drop once the faults are over
// (the directory loses no answer), through server 1, as the servers'
// droppers and the operations that find a dropped anchor would: every
// listed tree whose anchor is marked dropped is settled (and only those). Then no drop is
// left, no acknowledged drop's tree is listed, and its anchor is free
// (the leak check finds any other chunk of it left allocated).
func (w *simWorld) finishAllDrops(ctx context.Context) error {
	s := w.servers[1]
	cl := w.chunks.clerk(0, func(context.Context) error { return nil })
	// A dropper pass's settling, as the servers' (dropPass): the names
	// whose decree failed on a live server, then every listed tree whose
	// anchor's chunk says dropped (the dead servers' cut drops). Only
	// those: settleDrop takes an anchor that is gone for dropped too, and
	// would hide a listed tree whose chunks were freed from checkCreated.
	for name := range w.unsettled {
		settled, err := settleDrop(ctx, s.cache, s.dir, name)
		if err != nil {
			return fmt.Errorf("settling tree %s's drop: %w", name, err)
		}
		if settled {
			w.settled++
		}
	}
	n, unreadable, err := settleListed(ctx, s.cache, s.dir, nil, 5*time.Second)
	if err != nil {
		return fmt.Errorf("settling the listed trees whose anchors say dropped: %w", err)
	}
	if unreadable > 0 {
		return fmt.Errorf("settling the listed trees whose anchors say dropped: %d anchors unreadable", unreadable)
	}
	w.settledListed += n
	var failed error
	err = finishDrops(ctx, s.cache, s.dir, s.chunks.Free, 0, func(e TreeEntry, err error) {
		if err != nil && failed == nil {
			failed = fmt.Errorf("finishing tree %s's drop (%v): %w", e.Name, e.Anchor, err)
		} else if err == nil {
			w.dropsFinished++
		}
	})
	if err != nil {
		return err
	}
	if failed != nil {
		return failed
	}
	if ds := w.dir.drops(); len(ds) > 0 {
		return fmt.Errorf("%d drops left after the last pass, the first of tree %s (%v)", len(ds), ds[0].Name, ds[0].Anchor)
	}
	if rs := w.dir.strayRecords(); len(rs) > 0 {
		return fmt.Errorf("root records %v name no listed tree and no drop", rs)
	}
	listed := w.dir.trees()
	_, maybe := w.createdFate()
	for a := range maybe {
		live := false
		for _, e := range listed {
			live = live || e.Anchor == a
		}
		if _, err := cl.Read(ctx, a, AnchorSize); live == errors.Is(err, chunk.ErrUnallocated) {
			return fmt.Errorf("the anchor %v of a tree whose drop failed is listed %v and allocated %v (%v): half dropped", a, live, err == nil, err)
		}
	}
	for a := range w.dropped {
		for name, e := range listed {
			if e.Anchor == a {
				return fmt.Errorf("tree %s (%v), whose drop was acknowledged, is listed", name, a)
			}
		}
		if _, err := cl.Read(ctx, a, AnchorSize); !errors.Is(err, chunk.ErrUnallocated) {
			return fmt.Errorf("the anchor %v of a tree whose drop was acknowledged and finished is not free (%v)", a, err)
		}
	}
	return nil
}

// simCreation is an acknowledged creation: its tree, and when its call
// began (w.now()).
type simCreation struct {
	e     TreeEntry
	began int64
}

// createdFate sorts the acknowledged creations: must, the trees that must
// be listed (no drop of theirs was acknowledged, and every drop of their
// name that failed ended before their creation began: it looked up an
// earlier tree), and maybe, the anchors of those a failed drop may have
// dropped (its lookup, after their decree, may have found them): at the
// end each is a live listed tree's, or free.
func (w *simWorld) createdFate() (must map[string]TreeEntry, maybe map[Handle]bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	must, maybe = map[string]TreeEntry{}, map[Handle]bool{}
	for _, c := range w.created {
		if w.dropped[c.e.Anchor] {
			continue
		}
		excused := false
		for _, end := range w.dropFailed[c.e.Name] {
			excused = excused || end > c.began
		}
		if excused {
			maybe[c.e.Anchor] = true
			continue
		}
		if x, ok := must[c.e.Name]; ok {
			// Both must be listed: the check fails on one of them.
			w.t.Errorf("seed %d: tree %s created twice, anchors %v and %v, neither dropped", w.seed, c.e.Name, x.Anchor, c.e.Anchor)
		}
		must[c.e.Name] = c.e
	}
	return must, maybe
}

// checkCreated checks the trees the directory lists once the faults are
// over, the drops finished and the orphans collected: every acknowledged
// creation is listed with its anchor (durable once acknowledged) unless
// a drop of it failed (its outcome unknown), and every listed tree's
// anchor and first root are allocated and decode as a live empty tree's;
// they join reachable (the leak check's). (Their tags are not checked: the
// final collection, collectAll, disowns what the directory names, as the
// log's next holder would; it counts them, createdTagged.)
func (w *simWorld) checkCreated(ctx context.Context, reachable map[Handle]bool) error {
	listed := w.dir.trees()
	must, _ := w.createdFate()
	for name, e := range must {
		if x, ok := listed[name]; !ok || x.Anchor != e.Anchor {
			return fmt.Errorf("tree %s, whose creation was acknowledged (anchor %v), is not listed (%+v); its events:\n%s", name, e.Anchor, x, w.eventsOf("tree "+name))
		}
	}
	named := w.dir.named()
	cl := w.chunks.clerk(0, func(context.Context) error { return nil })
	for name, e := range listed {
		b, err := cl.Read(ctx, e.Anchor, AnchorSize)
		if err != nil {
			return fmt.Errorf("listed tree %s: its anchor %v: %v", name, e.Anchor, err)
		}
		a, err := DecodeAnchor(b, e.Anchor)
		if err != nil {
			return fmt.Errorf("listed tree %s: %v", name, err)
		}
		if a.Dropped {
			return fmt.Errorf("listed tree %s: its anchor %v is marked dropped", name, e.Anchor)
		}
		if !named[a.Root] {
			return fmt.Errorf("listed tree %s: its root %v has no record", name, a.Root)
		}
		b, err = cl.Read(ctx, a.Root, uint64(e.NodeSize))
		if err != nil {
			return fmt.Errorf("listed tree %s: its root %v: %v", name, a.Root, err)
		}
		if _, err := Decode(b, e.Anchor.ID, a.Root); err != nil {
			return fmt.Errorf("listed tree %s: its root: %v", name, err)
		}
		reachable[e.Anchor], reachable[a.Root] = true, true
	}
	return nil
}

func (w *simWorld) dropper(stop chan struct{}, wg *sync.WaitGroup) {
	defer wg.Done()
	defer w.guard("the dropper")
	select {
	case <-stop:
		return
	case <-time.After(time.Duration(10+w.rand(40)) * time.Millisecond):
	}
	for w.droppedAt.Load() == 0 {
		if s := w.pick(); s != nil {
			ctx, cancel := context.WithTimeout(w.ctx, 2*time.Second)
			err := markDropped(ctx, s.cache.Store(w.anchor, w.nodeSize, nil))
			cancel()
			if err == nil {
				w.droppedAt.Store(w.now())
				w.event("server %d marked the tree dropped", s.node)
				return
			}
			w.event("server %d: marking the tree dropped failed: %v", s.node, err)
		}
		select {
		case <-stop:
			return
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// finishDrop ends a seed that dropped the tree: the history is checked;
// every server finds the tree dropped; no operation that began after the
// mark succeeded; then, all operations over, the tree's chunks are freed
// as FinishDrops frees them, and none is left but those a dead server
// leaked.
// checkLinearizable checks a history with porcupine; with GROVE_SIM_DUMP
// set, a failure's history, the events and porcupine's visualization go to
// /tmp/btree-sim-SEED.txt(.html), and its explanation to the test's log.
func (w *simWorld) checkLinearizable(t testing.TB, ops []porcupine.Operation, unknown int) error {
	check, info := lincheck.Check(kvModel, ops, 90*time.Second) // 30 s timed out once under -race in CI (seed 748166, 226 operations, 12 of unknown outcome, 2026-12-02)
	if check == porcupine.Ok {
		return nil
	}
	if check == porcupine.Unknown {
		return fmt.Errorf("porcupine timed out on %d operations, %d of unknown outcome", len(ops), unknown)
	}
	if os.Getenv("GROVE_SIM_DUMP") != "" {
		for _, l := range lincheck.Explain(ops, 10*time.Second) {
			t.Log(l)
		}
		w.events.Lock()
		events := append([]string(nil), w.events.lines...)
		w.events.Unlock()
		path := fmt.Sprintf("/tmp/btree-sim-%d.txt", w.seed)
		if err := lincheck.WriteFailure(path, ops, info, events); err == nil {
			t.Logf("the history and the events are in %s, the visualization in %s.html", path, path)
		} else {
			t.Logf("writing the history out: %v", err)
		}
	}
	return fmt.Errorf("history of %d operations is not linearizable (GROVE_SIM_DUMP=1 writes it out)", len(ops))
}

func (w *simWorld) finishDrop(ctx context.Context, h *history, res simResult) (simResult, error) {
	if w.droppedAt.Load() == 0 { // (the load ended first: drop it now)
		mctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := markDropped(mctx, w.servers[1].cache.Store(w.anchor, w.nodeSize, nil))
		cancel()
		if err != nil {
			return res, fmt.Errorf("marking the tree dropped after the load: %v", err)
		}
		w.droppedAt.Store(w.now())
		w.event("server 1 marked the tree dropped after the load")
	}
	for n := uint64(1); n <= 3; n++ {
		// After a late lease renewal, as the other final checks (a
		// loaded CI machine, seed 542127: the server's leases had lapsed
		// when the get came, "past their guaranteed time").
		err := afterLeaseLapse(ctx, func() error { _, _, err := w.servers[n].tree.Get(ctx, []byte(simKey(0))); return err })
		if !errors.Is(err, ErrNoTree) && !w.ignoreDropped {
			// (Seen once, in a CI race-detector run, seed 928708, not
			// reproduced in 600 seeds since: the marks' events say which
			// server marked, and when.)
			return res, fmt.Errorf("server %d: a get after the drop: %v (want ErrNoTree); the drop's events:\n%s", n, err, w.eventsOf("dropped"))
		}
	}
	ops := h.Ops()
	res.ops = len(ops)
	if err := w.checkLinearizable(w.t, ops, res.unknown); err != nil {
		return res, err
	}
	if n := w.afterDrop.Load(); n > 0 {
		return res, fmt.Errorf("%d operations began after the drop's mark and succeeded; the first: %v", n, w.afterDropFirst.Load())
	}
	for n := uint64(1); n <= 3; n++ {
		w.servers[n].halt()
		w.servers[n].done.Wait()
	}
	w.collections.Wait()
	w.chunks.late.Wait()
	sv := w.servers[1]
	fctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	err := freeDropped(fctx, sv.cache.Store(w.anchor, w.nodeSize, nil), sv.chunks.Free)
	cancel()
	if err != nil {
		return res, fmt.Errorf("freeing the dropped tree: %v", err)
	}
	if err := w.collectAll(ctx); err != nil {
		return res, err
	}
	if err := w.checkLeaks(nil, h); err != nil {
		return res, fmt.Errorf("after the drop: %v", err)
	}
	w.mu.Lock()
	res.kills, res.restarts = w.kills, w.restart-3
	w.mu.Unlock()
	for n := uint64(1); n <= 3; n++ {
		w.kill(w.servers[n])
	}
	return res, nil
}

// collectAll frees what every log's holders allocated and never linked,
// as each log's next holder would (collectOrphans), once the servers have
// written everything back (their checkpoints disowned every chunk their
// committed changes name). A chunk a committed change names and that kept
// its tag would be freed here, and the walk after it would find it gone.
func (w *simWorld) collectAll(ctx context.Context) error {
	// The node pools' refills: none may allocate after the collection
	// (nothing would free it). Quiesce stops them (a clean close's first
	// step); wait for those under way.
	for n := uint64(1); n <= 3; n++ {
		w.servers[n].cache.Quiesce()
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		busy := false
		for n := uint64(1); n <= 3; n++ {
			c := w.servers[n].cache
			c.mu.Lock()
			for _, r := range c.mu.refilling {
				busy = busy || r
			}
			c.mu.Unlock()
		}
		if !busy {
			break
		}
	}
	cl := w.chunks.clerk(0, func(context.Context) error { return nil })
	for n := uint64(1); n <= 3; n++ {
		hs, err := cl.Owned(ctx, OwnerLog(n), lock.Token{Epoch: ^lock.Epoch(0), Seq: ^uint64(0)})
		if err != nil {
			return fmt.Errorf("listing log %d's orphans: %v", n, err)
		}
		named := w.dir.named()
		var disown []Handle
		for _, h := range hs {
			if named[h] {
				disown = append(disown, h) // a created tree's, its creator died before its disown
				continue
			}
			if err := cl.Free(ctx, h); err != nil {
				return fmt.Errorf("freeing log %d's orphan %v: %v", n, h, err)
			}
		}
		if len(disown) > 0 {
			if err := cl.Disown(ctx, disown); err != nil {
				return fmt.Errorf("disowning log %d's created trees' chunks: %v", n, err)
			}
		}
		w.orphans.Add(int64(len(hs) - len(disown)))
		w.createdTagged.Add(int64(len(disown)))
	}
	return nil
}

// checkLeaks checks that every allocated chunk but the anchor is in use
// (reachable; after a drop, nil: nothing is, the anchor included), once
// collectAll has run: what a server allocated carries its log's tag until
// a durable change names it, so that nothing it allocated leaks whenever
// it dies (a split cut off before its commit, a put whose outcome stayed
// unknown, an allocation whose answer was lost). The only leaks allowed
// are the value chunks a committed change replaced whose frees failed five
// times in a replay (counted; the replay does not fail the run for them).
func (w *simWorld) checkLeaks(reachable map[Handle]bool, h *history) error {
	allowed := int(w.replayLeaks.Load())
	w.chunks.mu.Lock()
	defer w.chunks.mu.Unlock()
	var leaked []string
	for hd, b := range w.chunks.data {
		if reachable[hd] || reachable != nil && hd == w.anchor {
			continue
		}
		owner, ok := w.chunks.owner[hd]
		if !ok && reachable != nil {
			continue // the world made it (the first root): only a drop must free it
		}
		kind := "node"
		if len(b) != w.nodeSize && len(b) != AnchorSize {
			kind = "value"
		}
		leaked = append(leaked, fmt.Sprintf("%s chunk %v (allocated by server %d, died %v)", kind, hd, owner, w.killed[owner]))
	}
	if len(leaked) > allowed {
		sort.Strings(leaked)
		return fmt.Errorf("%d chunks leaked (%d allowed: frees a replay gave up on): %v", len(leaked), allowed, leaked[:min(len(leaked), 10)])
	}
	return nil
}

// newSimWorld makes the world of a seed: the simulated lock service,
// chunks and three log devices of devBlocks blocks, and one empty tree,
// made as CreateTree makes it; no server runs yet.
func newSimWorld(t testing.TB, ctx context.Context, seed int64, stale bool, devBlocks uint64) *simWorld {
	w := &simWorld{t: t, seed: seed, ctx: ctx, stop: func() {}, brokeCh: make(chan struct{}), locks: newSimLocks(ctx, rand.New(rand.NewSource(seed+1))), chunks: newSimChunks(rand.New(rand.NewSource(seed + 2))),
		devs: map[uint64]*simDevice{}, nodeSize: MinNodeSize, stale: stale, r: rand.New(rand.NewSource(seed)), servers: map[uint64]*simServer{}, killed: map[uint64]bool{}, closing: map[uint64]bool{}, start: time.Now()}
	for n := uint64(1); n <= 3; n++ {
		w.devs[n] = newSimDevice(devBlocks)
	}
	w.dir = newSimDirectory(rand.New(rand.NewSource(seed + 3)))
	w.dir.lossRate = 0.1
	w.dropped, w.dropFailed, w.unsettled, w.finished = map[Handle]bool{}, map[string][]int64{}, map[string]bool{}, map[Handle]bool{}
	w.chunks.next = 2
	w.anchor = Handle{CM: 1, ID: 1}
	a, root := Init(w.anchor, Handle{CM: 1, ID: 2})
	w.chunks.data[w.anchor] = a.Encode(make([]byte, 0, AnchorSize))[:AnchorSize:AnchorSize]
	w.chunks.data[root.Self] = append(root.Encode(nil), make([]byte, w.nodeSize)...)[:w.nodeSize]
	return w
}

// guard, deferred, turns a panic (an invariant assertion) of the
// goroutine it runs in into the seed's failure and stops the world: the
// panicking operation may hold locks nothing will give back. The stack
// goes to /tmp/btree-sim-SEED.panic.
func (w *simWorld) guard(who string) {
	p := recover()
	if p == nil {
		return
	}
	msg := fmt.Sprintf("%s panicked: %v", who, p)
	if w.broke.CompareAndSwap(nil, &msg) {
		_ = os.WriteFile(fmt.Sprintf("/tmp/btree-sim-%d.panic", w.seed), append([]byte(msg+"\n\n"), debug.Stack()...), 0o644)
		w.event("%s", msg)
		close(w.brokeCh)
	}
	w.stop()
}

// waitUnlessBroke waits for wg, or until an assertion broke (false).
func (w *simWorld) waitUnlessBroke(wg *sync.WaitGroup) bool {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-w.brokeCh:
		return false
	}
}

// runSim runs one seed and reports a violation as an error.
func runSim(t testing.TB, seed int64, teeth simTeeth, opsPerClient int) (simResult, error) {
	return runSimDrop(t, seed, teeth, opsPerClient, false)
}

// runSimDrop is runSim; with drop, a server drops the tree mid-load (the
// drop's mark, as BeginDrop makes it) and the tree's chunks are freed at
// the end (as FinishDrops frees them once every operation that began
// before the mark has ended): no operation that begins after the mark
// succeeds, and every chunk of the tree is freed.
func runSimDrop(t testing.TB, seed int64, teeth simTeeth, opsPerClient int, drop bool) (res simResult, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	w := newSimWorld(t, ctx, seed, teeth == teethStale, 64)
	// A replay that met a delta without its base fails forever (the
	// dead server's leases stay held): the world stops at once, and
	// that is the seed's error, whatever the stop made fail.
	w.stop = cancel
	defer func() {
		if b := w.broke.Load(); b != nil {
			err = fmt.Errorf("an invariant assertion failed: %s (then: %v)", *b, err)
			return
		}
		if n := w.baseless.Load(); n > 0 {
			err = fmt.Errorf("%d replays met a node delta whose base image was neither in the log nor in its chunk (then: %v)", n, err)
		}
		w.mu.Lock()
		bad := w.tokBad
		w.mu.Unlock()
		if bad != "" {
			err = fmt.Errorf("tokened writes: %s (then: %v)", bad, err)
		}
	}()
	defer w.guard("the run") // (runs before the one above)
	w.ignoreLeaseTime = teeth == teethLeaseTime
	w.readPastLease = teeth == teethReadPastLease
	w.tokens = teeth == teethNone && (seed/2)%2 == 0 || teeth == teethTokenSplitDrops || teeth == teethClockSkew || teeth == teethFloorForgets
	// Clients send floors in three quarters of the tokened seeds (the
	// rest: a cluster with a node of a build before floors).
	w.floors = w.tokens && (seed/8)%4 != 0 || teeth == teethFloorForgets
	w.aging = w.tokens && (seed/4)%2 == 0 && teeth == teethNone || teeth == teethClockSkew
	if w.aging {
		w.skewBy = simSkew
		if teeth == teethClockSkew {
			w.skewBy, w.skewTeeth = 4*simSkew, true
		}
		for c := 0; c < len(w.clientOff); c += 2 {
			w.clientOff[c] = int64(w.rand(int(2*simSkew+1))) - int64(simSkew)
			w.clientOff[c+1] = w.clientOff[c] // (one process, one clock)
		}
	}
	w.tokDurable = map[WriteToken]int{}
	if teeth == teethTokenSplitDrops {
		w.unsafeDone = unsafeDoneSplitDrops
	}
	if teeth == teethFloorForgets {
		w.unsafeDone = unsafeDoneFloorForgets
	}
	w.pauseMidReadOneIn = 400
	if w.readPastLease {
		w.pauseMidReadOneIn = 20
	}
	w.drop, w.ignoreDropped = drop || teeth == teethIgnoreDropped, teeth == teethIgnoreDropped
	if seed%2 != 0 || teeth == teethKeepOldValues || teeth == logFreesOnly {
		// Keys "kNN", values "cC.I": an entry of 13 bytes or less
		// stays in its leaf, nearly every value goes to a chunk.
		w.inline = 13
	}
	w.keepOldValues = teeth == teethKeepOldValues
	w.tearOneIn = 150
	if teeth == teethDeltaAcrossWriteBack {
		w.tearOneIn = 20 // (the loss needs a torn write-back of a node whose chain broke)
	}
	w.deltaAcrossWriteBack = teeth == teethDeltaAcrossWriteBack
	w.logFreesOnly = teeth == logFreesOnly
	w.unsafeUncovered = teeth == teethUncovered
	w.noStragglers = teeth == teethStragglers
	w.untagged, w.replayKeepsTags = teeth == teethUntagged, teeth == teethReplayKeepsTags
	w.straysIgnoreLinks = teeth == teethStraysIgnoreLinks
	w.unsafeCollectIgnoresDirectory = teeth == teethCollectIgnoresDirectory
	w.dir.unsafeKeepName = teeth == teethDropKeepsName
	if teeth == teethLongRerun {
		// Every creation's decree run again 100-150 ms after it
		// listed the tree: a drop of it may be finished by then.
		w.dir.minRerun, w.dir.maxRerun, w.dir.rerunCreations = 100*time.Millisecond, 150*time.Millisecond, true
	}
	w.biasAborts = teeth == teethUncovered || os.Getenv("GROVE_SIM_BIAS_ABORTS") != ""
	w.locks.onExpire = func(c *simClerk) {
		w.event("server %d's leases expired: the service declared it dead (it does not know yet)", c.node)
	}
	if os.Getenv("GROVE_SIM_DUMP") != "" {
		w.chunks.trace = func(line string) { w.event("%s", line) }
	}
	for n := uint64(1); n <= 3; n++ {
		if !w.restartOne(false) {
			return res, fmt.Errorf("starting server %d failed", n)
		}
	}
	h := &history{}
	stop := make(chan struct{})
	var fwg sync.WaitGroup
	fwg.Add(1)
	go w.faults(stop, &fwg)
	var cwg sync.WaitGroup
	for c := 0; c < 4; c++ {
		cwg.Add(1)
		go func(c int) {
			defer cwg.Done()
			defer w.guard(fmt.Sprintf("client %d", c))
			for i := 0; i < opsPerClient && ctx.Err() == nil; i++ {
				s := w.pick()
				if s == nil {
					time.Sleep(5 * time.Millisecond)
					i--
					continue
				}
				w.op(h, c, i, s)
				time.Sleep(time.Duration(w.rand(2000)) * time.Microsecond)
			}
		}(c)
	}
	if w.drop {
		fwg.Add(1)
		go w.dropper(stop, &fwg)
	} else if !w.untagged {
		fwg.Add(1)
		go w.creator(stop, &fwg)
		fwg.Add(1)
		go w.treeDropper(stop, &fwg)
	}
	stopped := errors.New("the world stopped at the failed assertion")
	if !w.waitUnlessBroke(&cwg) || !w.waitUnlessBroke(&w.late) {
		close(stop)
		return res, stopped
	}
	close(stop)
	if !w.waitUnlessBroke(&fwg) || w.broke.Load() != nil {
		return res, stopped
	}
	// Heal: every server back (each waits for its log's replay), no more
	// lost answers; then every key read through each server.
	w.chunks.mu.Lock()
	w.chunks.lossRate = 0
	w.chunks.mu.Unlock()
	w.noTears.Store(true) // the faults are over
	if err := w.healAll(); err != nil {
		return res, err
	}
	if t.Failed() {
		return res, errors.New("a restart failed")
	}
	if w.closeViolation != "" {
		return res, errors.New(w.closeViolation)
	}
	if w.drop {
		return w.finishDrop(ctx, h, res)
	}
	for n := uint64(1); n <= 3; n++ {
		s := w.servers[n]
		for k := 0; k < simKeys; k++ {
			in := kvIn{Kind: "get", Key: simKey(k)}
			call := w.now()
			var v []byte
			var ok bool
			err := afterLeaseLapse(ctx, func() (err error) {
				v, ok, err = s.tree.Get(ctx, []byte(in.Key))
				return err
			})
			if err != nil {
				// (With what happened to that server, last first: a
				// CI run once met "leases are lost" here, not
				// reproduced.)
				return res, fmt.Errorf("server %d: final get: %v\nits events, the last 20:\n%s", n, err, lastLines(w.eventsOf(fmt.Sprintf("server %d", n)), 20))
			}
			h.Add(10+int(n), in, kvOut{Found: ok, Val: string(v)}, call, w.now())
		}
	}
	ops := h.Ops()
	res.ops, res.unknown = len(ops), lincheck.Unknown(ops)
	w.mu.Lock() // the servers still run: a failure watch may count a resignation and a death
	res.kills, res.restarts = w.kills, w.restart-3
	res.disrupts, res.expired, res.resigned, res.notApplied, res.leftOut = w.disrupts, w.expired, w.resigned, w.notApplied, w.leftOut
	if w.tokens {
		res.tokSeeds = 1
	}
	res.tokRepeats, res.tokRetried, res.tokDups, res.tokDupRepeats = w.tokRepeats, w.tokRetried, w.tokDups, w.tokDupRepeats
	res.tokExpired, res.tokLost = w.tokExpired, w.tokLost
	if w.aging {
		res.agingSeeds = 1
	}
	if w.floors {
		res.floorSeeds = 1
	}
	for _, s := range w.every {
		if s.tree != nil {
			res.recordsAged += int(s.tree.Stats.RecordsDropped.Load())
			res.refusedOld += int(s.tree.Stats.RefusedOld.Load())
			res.refusedFuture += int(s.tree.Stats.RefusedFuture.Load())
			res.refusedHorizon += int(s.tree.Stats.RefusedHorizon.Load())
			res.recordsFloored += int(s.tree.Stats.RecordsFloored.Load())
			res.refusedFloor += int(s.tree.Stats.RefusedFloor.Load())
		}
	}
	res.closes, res.closeFailed = w.closes, w.closeFailed
	w.mu.Unlock()
	w.locks.mu.Lock()
	res.runRenewals = w.locks.runRenewals
	res.failovers, res.allRuns = w.locks.failovers, w.locks.allRuns
	res.aborted = w.aborted
	w.locks.mu.Unlock()
	if err := w.checkLinearizable(t, ops, res.unknown); err != nil {
		return res, err
	}
	// Quiesce and walk the chunks: structure, keys equal to the final
	// reads, no chunk leaked but by a server that died.
	for n := uint64(1); n <= 3; n++ {
		s := w.servers[n]
		s.halt()
		s.done.Wait()
	}
	sv := w.servers[1]
	rctx, rcancel := context.WithTimeout(ctx, 20*time.Second)
	dumper := time.AfterFunc(10*time.Second, func() {
		if os.Getenv("GROVE_SIM_DUMP") != "" {
			buf := make([]byte, 1<<22)
			buf = buf[:runtime.Stack(buf, true)]
			_ = os.WriteFile(fmt.Sprintf("/tmp/btree-sim-%d.stacks-during", seed), buf, 0o644)
			w.dumpLocks(seed)
		}
	})
	for pass := 0; pass < 20; pass++ { // until a pass finds nothing to do
		var rep RepairReport
		err = afterLeaseLapse(rctx, func() (err error) {
			rep, err = sv.tree.Repair(rctx)
			return err
		})
		if err != nil || rep.Downlinks+rep.Compressed+rep.Freed == 0 {
			break
		}
	}
	dumper.Stop()
	rcancel()
	if err != nil {
		if os.Getenv("GROVE_SIM_DUMP") != "" {
			buf := make([]byte, 1<<22)
			buf = buf[:runtime.Stack(buf, true)]
			_ = os.WriteFile(fmt.Sprintf("/tmp/btree-sim-%d.stacks", seed), buf, 0o644)
			w.dumpLocks(seed)
		}
		return res, fmt.Errorf("repair: %v", err)
	}
	for n := uint64(1); n <= 3; n++ {
		if err := afterLeaseLapse(ctx, func() error { return w.servers[n].cache.FlushAll(ctx) }); err != nil {
			return res, fmt.Errorf("server %d: flush: %v", n, err)
		}
	}
	w.collections.Wait()
	w.chunks.late.Wait()
	w.dir.late.Wait()
	w.dir.mu.Lock()
	w.dir.lossRate = 0
	w.dir.mu.Unlock()
	if w.dropViolation != "" {
		return res, errors.New(w.dropViolation)
	}
	if err := w.checkDropsHold(); err != nil {
		return res, err
	}
	// (Its steps are idempotent: run again after a late lease renewal,
	// as the servers' own dropper passes are: seed 882622 in a loaded CI
	// run failed "finishing tree c03's drop: ... leases are past their
	// guaranteed time".)
	if err := afterLeaseLapse(ctx, func() error { return w.finishAllDrops(ctx) }); err != nil {
		return res, err
	}
	if err := w.collectAll(ctx); err != nil {
		return res, err
	}
	var sh Shape
	sh, err = Walk(ctx, simChunkReader{w}, true)
	if err != nil {
		if os.Getenv("GROVE_SIM_DUMP") != "" {
			w.dumpChunks(seed)
		}
		return res, fmt.Errorf("walking the chunks: %v", err)
	}
	final := map[string]string{}
	for _, o := range ops[len(ops)-simKeys:] {
		if out := o.Output.(kvOut); out.Found {
			final[o.Input.(kvIn).Key] = out.Val
		}
	}
	if len(sh.Keys) != len(final) {
		if os.Getenv("GROVE_SIM_DUMP") != "" {
			w.dumpChunks(seed)
		}
		return res, fmt.Errorf("the chunks hold %d keys, the final reads %d", len(sh.Keys), len(final))
	}
	for i, k := range sh.Keys {
		if final[string(k)] != string(sh.Vals[i]) {
			return res, fmt.Errorf("key %q: the chunks hold %q, the final reads %q", k, sh.Vals[i], final[string(k)])
		}
	}
	reachable := sh.Chunks
	if err := w.checkCreated(ctx, reachable); err != nil {
		return res, err
	}
	if err := w.checkLeaks(reachable, h); err != nil {
		return res, err
	}
	res.created, res.createErrs, res.createRefused = len(w.created), w.createErrs, w.createRefused
	w.dir.mu.Lock()
	res.dirLost, res.dirRefused, res.dirLate = w.dir.lost, w.dir.refused, w.dir.landedLate
	res.createExists = w.createExists
	res.createdTagged = int(w.createdTagged.Load())
	res.dropsLate = w.dir.dropsLate
	w.dir.mu.Unlock()
	w.mu.Lock()
	res.drops, res.dropErrs, res.dropNoTree, res.dropDied = w.drops, w.dropErrs, w.dropNoTree, w.dropDied
	res.settled, res.dropsFinished, res.finishErrs = w.settled, w.dropsFinished, w.finishErrs
	res.settledListed = w.settledListed
	w.mu.Unlock()
	w.chunks.mu.Lock()
	res.late, res.refused, res.lostAllocs, res.retriedAllocs = w.chunks.lateCount, w.chunks.refused, w.chunks.lostAllocs, w.chunks.retriedAllocs
	res.torn = w.chunks.torn
	res.orphans = int(w.orphans.Load())
	w.chunks.mu.Unlock()
	for n := uint64(1); n <= 3; n++ {
		st := &w.servers[n].tree.Stats
		res.splits += int(st.Splits.Load())
		res.merges += int(st.Merges.Load())
		w.kill(w.servers[n])
	}
	res.lateCollections = int(w.lateCollections.Load())
	for _, s := range w.every {
		if s.cache != nil {
			res.valueWrites += int(s.cache.Stats().ValueWrites)
			res.loggedFrees += int(s.cache.Stats().LoggedFrees)
			res.disowned += int(s.cache.Stats().Disowned)
			res.strays += int(s.cache.Stats().Strays)
			res.deltas += int(s.cache.Stats().Deltas)
			res.raceImages += int(s.cache.Stats().RaceImages)
		}
		if s.tree != nil {
			res.valuesFreed += int(s.tree.Stats.ValuesFreed.Load())
		}
	}
	return res, nil
}

// afterLeaseLapse runs f of the final checks again while it fails with
// ErrLeaseExpired: the faults are over, and a server whose lease renewal
// was late (the stand-in renews every lease/8; a loaded machine can starve
// that goroutine longer than the 30 ms lease) serves again at the next
// renewal, as a real client would find by retrying. Bounded by ctx and 5 s.
func afterLeaseLapse(ctx context.Context, f func() error) error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := f()
		if !errors.Is(err, ErrLeaseExpired) || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		time.Sleep(time.Millisecond)
	}
}

func simSeeds(t *testing.T, def int) (int64, int) {
	first := time.Now().UnixNano() % 1_000_000
	if s := os.Getenv("GROVE_SEED"); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return v, 1
	}
	n := def
	if s := os.Getenv("GROVE_BTREE_SEEDS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil {
			t.Fatal(err)
		}
		n = v
	}
	return first, n
}

// TestSimTree: porcupine-checked histories of puts, conditional puts,
// deletes, gets, scans and counts on one tree through three servers that
// die and come back, with write answers lost.
func TestSimTree(t *testing.T) {
	first, n := simSeeds(t, 100)
	if testing.Short() && os.Getenv("GROVE_BTREE_SEEDS") == "" {
		n = 20
	}
	var total simResult
	for seed := first; seed < first+int64(n); seed++ {
		r, err := runSim(t, seed, teethNone, 40)
		if err != nil {
			t.Fatalf("seed %d (GROVE_SEED=%d replays its choices): %v", seed, seed, err)
		}
		total.ops += r.ops
		total.unknown += r.unknown
		total.kills += r.kills
		total.restarts += r.restarts
		total.late += r.late
		total.refused += r.refused
		total.splits += r.splits
		total.merges += r.merges
		total.disrupts += r.disrupts
		total.expired += r.expired
		total.resigned += r.resigned
		total.notApplied += r.notApplied
		total.leftOut += r.leftOut
		total.valueWrites += r.valueWrites
		total.valuesFreed += r.valuesFreed
		total.runRenewals += r.runRenewals
		total.tokSeeds += r.tokSeeds
		total.tokRepeats += r.tokRepeats
		total.tokRetried += r.tokRetried
		total.tokDups += r.tokDups
		total.tokDupRepeats += r.tokDupRepeats
		total.agingSeeds += r.agingSeeds
		total.tokLost += r.tokLost
		total.tokExpired += r.tokExpired
		total.recordsAged += r.recordsAged
		total.refusedOld += r.refusedOld
		total.refusedFuture += r.refusedFuture
		total.refusedHorizon += r.refusedHorizon
		total.floorSeeds += r.floorSeeds
		total.recordsFloored += r.recordsFloored
		total.refusedFloor += r.refusedFloor
		total.aborted += r.aborted
		total.failovers += r.failovers
		total.allRuns += r.allRuns
		total.lostAllocs += r.lostAllocs
		total.orphans += r.orphans
		total.disowned += r.disowned
		total.retriedAllocs += r.retriedAllocs
		total.strays += r.strays
		total.lateCollections += r.lateCollections
		total.deltas += r.deltas
		total.raceImages += r.raceImages
		total.torn += r.torn
		total.closes += r.closes
		total.closeFailed += r.closeFailed
		total.created += r.created
		total.createErrs += r.createErrs
		total.createRefused += r.createRefused
		total.dirLost += r.dirLost
		total.dirRefused += r.dirRefused
		total.createExists += r.createExists
		total.dirLate += r.dirLate
		total.createdTagged += r.createdTagged
		total.drops += r.drops
		total.dropErrs += r.dropErrs
		total.dropNoTree += r.dropNoTree
		total.dropDied += r.dropDied
		total.dropsLate += r.dropsLate
		total.settled += r.settled
		total.dropsFinished += r.dropsFinished
		total.finishErrs += r.finishErrs
		total.settledListed += r.settledListed
	}
	t.Logf("clean closes: %d (%d more failed and left their leases to a recovery)", total.closes, total.closeFailed)
	t.Logf("node changes logged as deltas: %d (%d whole images logged after a delta a write-back snapshot raced); %d node writes landed torn, their writer's node dead (repaired by the replays)", total.deltas, total.raceImages, total.torn)
	t.Logf("tree creations: %d trees acknowledged, %d creations failed (half killed their server on purpose, an eighth froze it), %d found the name taken, %d refused as the creator was retired; %d directory decrees' answers lost, %d creation decrees landed after their caller was told they failed; %d created trees' chunks left tagged for the final collection",
		total.created, total.createErrs, total.createExists, total.createRefused, total.dirLost, total.dirLate, total.createdTagged)
	t.Logf("tree drops: %d acknowledged, %d failed, %d killed their server after the mark, %d found no tree; %d drop decrees landed after their caller was told they failed; %d drops cut off after their mark settled by their live server, %d found by the dropper passes (their server died); %d drops finished (%d finishes failed and were tried again)",
		total.drops, total.dropErrs, total.dropDied, total.dropNoTree, total.dropsLate, total.settled, total.settledListed, total.dropsFinished, total.finishErrs)
	t.Logf("owned allocations: %d chunks disowned by checkpoints, %d allocations' answers lost (%d retried with success), %d chunks freed by live servers' stray collections, %d recovery runs' collections of orphans run after their runs, %d chunks left for the final collection (what a log's next holder frees); no chunk leaked",
		total.disowned, total.lostAllocs, total.retriedAllocs, total.strays, total.lateCollections, total.orphans)
	t.Logf("seeds %d..%d: %d operations (%d writes of unknown outcome, %d that did nothing; %d attempts refused before any change and sent again elsewhere), %d deaths, %d restarts (%d servers died while they started), %d pauses and partitions (%d outlived the lease: declared dead; %d servers resigned after a failure), %d lock-master failovers (%d \"all\" recovery runs), %d writes landed late (%d refused by their fence), %d splits, %d merges, %d values written to chunks of their own (%d freed), %d recovery tokens renewed",
		first, first+int64(n)-1, total.ops, total.unknown, total.leftOut, total.notApplied, total.kills, total.restarts, total.aborted, total.disrupts, total.expired, total.resigned, total.failovers, total.allRuns, total.late, total.refused, total.splits, total.merges, total.valueWrites, total.valuesFreed, total.runRenewals)
	t.Logf("tokened writes (%d seeds): %d answers lost after the attempt took effect (resent); %d writes answered from their record, %d answered after an attempt of unknown outcome; %d late duplicates of answered attempts, %d of them answered from the record (none applied again: no outcome committed durably twice)",
		total.tokSeeds, total.tokLost, total.tokRepeats, total.tokRetried, total.tokDups, total.tokDupRepeats)
	t.Logf("floors (%d seeds): %d records dropped below their client's floor; %d attempts refused below one (late duplicates)",
		total.floorSeeds, total.recordsFloored, total.refusedFloor)
	t.Logf("records aging (%d seeds: a %v token window, servers' and clients' clocks up to %v off): %d records dropped for age; %d attempts refused (%d past the window, %d stamped in the future, %d at or below a horizon)",
		total.agingSeeds, simWindow, simSkew, total.recordsAged, total.tokExpired, total.refusedOld, total.refusedFuture, total.refusedHorizon)
	if total.refusedFuture > 0 {
		// (Clients and servers within simSkew of true time are within
		// 2·simSkew of each other: review 52's bound.)
		t.Fatalf("%d tokened attempts refused as stamped in the future, with every clock within the bound", total.refusedFuture)
	}
	if n >= 50 && (total.tokSeeds == 0 || total.recordsFloored == 0 || total.refusedFloor == 0 || total.tokDupRepeats == 0 || total.tokRepeats == 0 || total.recordsAged == 0 || total.refusedOld == 0 || total.kills == 0 || total.late == 0 || total.splits == 0 || total.expired == 0 || total.resigned == 0 || total.notApplied == 0 || total.valueWrites == 0 || total.valuesFreed == 0 || total.aborted == 0 || total.allRuns == 0 || total.closes == 0 || total.strays == 0 || total.deltas == 0 || total.torn == 0 || total.created == 0 || total.createErrs == 0 || total.dirLost == 0 || total.createExists == 0 ||
		total.drops == 0 || total.dropDied == 0 || total.settled+total.settledListed == 0 || total.settledListed == 0 || total.dropsFinished == 0) {
		t.Fatal("the faults or the workload did not happen: the simulation tests too little")
	}
}

// expectTeeth runs up to seeds seeds of a broken variant and passes at the
// first the oracle rejects with a message containing one of want. A seed
// that fails otherwise (broken caches can send lookups round in circles)
// is not a catch.
func expectTeeth(t *testing.T, what string, seeds int, run func(seed int64) error, want ...string) {
	if testing.Short() {
		t.Skip("teeth run in the full suite")
	}
	first, _ := simSeeds(t, 0)
	for seed := first; seed < first+int64(seeds); seed++ {
		err := run(seed)
		if err == nil {
			continue
		}
		for _, w := range want {
			if strings.Contains(err.Error(), w) {
				t.Logf("seed %d: caught: %v", seed, err)
				return
			}
		}
		t.Logf("seed %d: failed, but not as the oracle rejects (not counted): %v", seed, err)
	}
	t.Fatalf("%d seeds with %s passed: the oracle cannot see it", seeds, what)
}

// expectTeethPar is expectTeeth running up to par seeds at once (for
// simulations that mostly wait): it starts no seed once one is caught,
// and waits for those running.
func expectTeethPar(t *testing.T, what string, seeds, par int, run func(seed int64) error, want ...string) {
	if testing.Short() {
		t.Skip("teeth run in the full suite")
	}
	first, _ := simSeeds(t, 0)
	var (
		mu     sync.Mutex
		caught bool
		wg     sync.WaitGroup
	)
	slots := make(chan struct{}, par)
	for seed := first; seed < first+int64(seeds); seed++ {
		slots <- struct{}{}
		mu.Lock()
		done := caught
		mu.Unlock()
		if done {
			<-slots
			break
		}
		wg.Add(1)
		go func(seed int64) {
			defer func() { <-slots; wg.Done() }()
			err := run(seed)
			if err == nil {
				return
			}
			for _, w := range want {
				if strings.Contains(err.Error(), w) {
					t.Logf("seed %d: caught: %v", seed, err)
					mu.Lock()
					caught = true
					mu.Unlock()
					return
				}
			}
			t.Logf("seed %d: failed, but not as the oracle rejects (not counted): %v", seed, err)
		}(seed)
	}
	wg.Wait()
	if !caught {
		t.Fatalf("%d seeds with %s passed: the oracle cannot see it", seeds, what)
	}
}

// TestSimTeethStaleCache: caches that keep serving a node's image after
// giving its lease up (a lookup from a stale cached node) are caught.
func TestSimTeethStaleCache(t *testing.T) {
	expectTeeth(t, "stale caches", 40, func(seed int64) error {
		_, err := runSim(t, seed, teethStale, 40)
		return err
	}, "not linearizable", "the chunks hold")
}

// TestSimTreeDrop: the tree is dropped mid-load (servers dying, paused,
// cut off meanwhile): the history stays linearizable, no operation that
// began after the drop's mark succeeds, every server finds the tree
// dropped, and once the operations are over every chunk of the tree is
// freed.
func TestSimTreeDrop(t *testing.T) {
	first, n := simSeeds(t, 30)
	if testing.Short() && os.Getenv("GROVE_BTREE_SEEDS") == "" {
		n = 10
	}
	var total simResult
	for seed := first; seed < first+int64(n); seed++ {
		r, err := runSimDrop(t, seed, teethNone, 40, true)
		if err != nil {
			t.Fatalf("seed %d (GROVE_SEED=%d replays its choices): %v", seed, seed, err)
		}
		total.ops += r.ops
		total.kills += r.kills
	}
	t.Logf("seeds %d..%d: %d operations, %d deaths, each seed's tree dropped mid-load and freed whole", first, first+int64(n)-1, total.ops, total.kills)
}

// TestSimTeethReadPastLease: caches that serve an image or a value whose
// read ended past the leases' time (a server paused with the read in
// flight, declared dead meanwhile, its nodes changed elsewhere) are caught:
// by the history, or by lockRun's assertion that a held leaf's right
// sibling starts where it ends (review 45, found that way in CI).
//
// About one seed in ten is caught, and a seed takes 2-40 s of mostly
// waiting (leases run in real time): the seeds run four at a time
// (expectTeethPar): four runs took 9-11 s three times and 111 s once,
// against 5-203 s one at a time (123 s in the last such run).
func TestSimTeethReadPastLease(t *testing.T) {
	expectTeethPar(t, "reads served past the leases' time", 80, 4, func(seed int64) error {
		_, err := runSim(t, seed, teethReadPastLease, 120)
		return err
	}, "not linearizable", "invariant assertion failed")
}

// TestSimTeethClockSkew: with records aging, servers whose clocks are off
// by more than the trees' bound (ClockSkew) drop records while an attempt
// may still apply elsewhere: the oracle sees a write applied twice (a late
// duplicate applied again, or its outcome committed twice).
func TestSimTeethClockSkew(t *testing.T) {
	expectTeeth(t, "clocks off past the bound", 40, func(seed int64) error {
		_, err := runSim(t, seed, teethClockSkew, 40)
		return err
	}, "tokened writes:")
}

// TestSimTeethFloorForgets: with floors, a leaf that drops a client's
// records below its floor but keeps no floor in their place is caught: a
// late duplicate of an answered attempt finds neither record nor floor and
// applies again (its outcome committed durably twice, or answered as a
// new write).
func TestSimTeethFloorForgets(t *testing.T) {
	expectTeeth(t, "floors forgotten", 40, func(seed int64) error {
		_, err := runSim(t, seed, teethFloorForgets, 40)
		return err
	}, "tokened writes:")
}

// TestSimTeethTokenSplitDrops: with tokened writes, splits that leave the
// new node without its keys' completion records are caught: a late
// duplicate of an answered attempt (or a retry) finds no record and
// applies again, its outcome committed durably twice, or answers
// otherwise than the write was answered.
func TestSimTeethTokenSplitDrops(t *testing.T) {
	expectTeeth(t, "splits dropping completion records", 40, func(seed int64) error {
		_, err := runSim(t, seed, teethTokenSplitDrops, 40)
		return err
	}, "tokened writes:")
}

// TestSimTeethIgnoreDropped: caches that serve a dropped tree as a live
// one are caught.
func TestSimTeethIgnoreDropped(t *testing.T) {
	expectTeeth(t, "caches serving a dropped tree", 20, func(seed int64) error {
		_, err := runSimDrop(t, seed, teethIgnoreDropped, 40, true)
		return err
	}, "after the drop's mark")
}

// TestSimTeethLeaseTime: a server cut off the lock service that keeps
// serving its cache past its leases' time (while another server, having
// replayed its log, changes the nodes) is caught.
func TestSimTeethLeaseTime(t *testing.T) {
	expectTeeth(t, "caches ignoring their leases' time", 40, func(seed int64) error {
		_, err := runSim(t, seed, teethLeaseTime, 40)
		return err
	}, "not linearizable")
}

// TestSimLogFreesOnly: updates that leave the value chunk they replaced to
// their change's free record alone (no free of their own) leak nothing:
// live servers' checkpoints free them (the final write-back), and the
// replay of a dead server's log frees those it had not.
func TestSimLogFreesOnly(t *testing.T) {
	first, seeds := simSeeds(t, 10)
	freed := 0
	for seed := first; seed < first+int64(seeds); seed++ {
		res, err := runSim(t, seed, logFreesOnly, 40)
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		freed += res.loggedFrees
	}
	if seeds >= 5 && freed == 0 {
		t.Fatalf("%d seeds: no checkpoint freed a value chunk by its record", seeds)
	}
	t.Logf("%d seeds from %d: %d value chunks freed by checkpoints from their records, none leaked", seeds, first, freed)
}

// TestSimTeethDeltaAcrossWriteBack: servers that go on logging deltas
// after a write-back snapshot of the node (no whole image first) lose a
// change when a later write-back of the node lands torn: the replay finds
// the delta's base neither in the log nor in the chunk.
func TestSimTeethDeltaAcrossWriteBack(t *testing.T) {
	expectTeeth(t, "deltas across write-backs", 40, func(seed int64) error {
		_, err := runSim(t, seed, teethDeltaAcrossWriteBack, 150)
		return err
	}, "whose base image", "not linearizable", "walking the chunks", "chunks hold", "final get")
}

// TestSimTeethKeepOldValues: updates that never free the value chunk
// they replaced (nor record it in their change) are caught by the leak
// check.
func TestSimTeethKeepOldValues(t *testing.T) {
	expectTeeth(t, "values never freed", 10, func(seed int64) error {
		_, err := runSim(t, seed, teethKeepOldValues, 40)
		return err
	}, "chunks leaked")
}

// TestSimTeethUntagged: servers whose allocations carry no owner tag leak
// what they allocate and never link (an allocation whose answer was lost,
// a split or a put cut off by a death): the leak check sees it.
func TestSimTeethUntagged(t *testing.T) {
	expectTeeth(t, "untagged allocations", 40, func(seed int64) error {
		_, err := runSim(t, seed, teethUntagged, 40)
		return err
	}, "chunks leaked")
}

// TestSimTeethReplayKeepsTags: replays that do not disown the chunks a
// dead server's committed changes name let the recovery's collection free
// them under the tree: caught (a read finds the chunk gone, the history,
// or the walk).
func TestSimTeethReplayKeepsTags(t *testing.T) {
	expectTeeth(t, "replays that keep the tags", 60, func(seed int64) error {
		_, err := runSim(t, seed, teethReplayKeepsTags, 40)
		return err
	}, "not linearizable", "walking the chunks", "chunks hold", "final get", "node is gone")
}

// TestSimTeethStraysIgnoreLinks: live servers' stray collections that
// take a chunk a committed change names, but that the server has not
// disowned yet, for a stray free it under the tree: caught (a read finds
// the chunk gone, the history, or the walk).
// TestSimTeethCollectIgnoresDirectory: recoveries and starts that collect
// a log's orphans without the tree directory free the anchor or root of a
// tree created just before its creator died.
func TestSimTeethCollectIgnoresDirectory(t *testing.T) {
	expectTeeth(t, "collections of orphans that ignore the directory", 20, func(seed int64) error {
		_, err := runSim(t, seed, teethCollectIgnoresDirectory, 40)
		return err
	}, "listed tree", "is not listed")
}

// TestSimTeethDropKeepsName: a drop whose decree leaves the tree's name
// listed (its chunks then freed under it) is caught.
func TestSimTeethDropKeepsName(t *testing.T) {
	expectTeeth(t, "drops that leave the name", 20, func(seed int64) error {
		_, err := runSim(t, seed, teethDropKeepsName, 40)
		return err
	}, "listed tree", "is listed")
}

// TestSimTeethLongRerun: decrees whose attempts run on past simDropWait
// (the servers' bound, OpTimeout within DropWait, broken) let a creation's
// attempt list again a tree whose drop was finished (review 30).
func TestSimTeethLongRerun(t *testing.T) {
	expectTeeth(t, "decree attempts beyond the drop's wait", 60, func(seed int64) error {
		_, err := runSim(t, seed, teethLongRerun, 80) // (a longer load: more drops meet the late attempts)
		return err
	}, "whose drop was acknowledged, is listed", "whose drop was finished, is listed", "listed tree", "root records")
}

func TestSimTeethStraysIgnoreLinks(t *testing.T) {
	expectTeeth(t, "stray collections that ignore links", 60, func(seed int64) error {
		_, err := runSim(t, seed, teethStraysIgnoreLinks, 40)
		return err
	}, "not linearizable", "walking the chunks", "chunks hold", "final get", "node is gone")
}

// TestSimTeethUncovered: recovery runs that replay a node's log without
// covering its lock (an "all" run of an incarnation that died before it
// opened the log, beside the names run of the one before: the loss
// TestEndToEndTreeLinearizable found) are caught.
func TestSimTeethUncovered(t *testing.T) {
	expectTeeth(t, "uncovered replays", 200, func(seed int64) error {
		_, err := runSim(t, seed, teethUncovered, 40)
		return err
	}, "not linearizable", "walking the chunks", "the chunks hold", "final get")
}

func (w *simWorld) dumpLocks(seed int64) {
	w.locks.mu.Lock()
	var b strings.Builder
	for i, c := range w.locks.clerks {
		for name, l := range c.leases {
			fmt.Fprintf(&b, "clerk %d node %d dead %v running %v: %s mode %v shared %d excl %v revoking %v keep %v\n", i, c.node, c.dead, w.locks.running[c], name, l.mode, l.shared, l.exclusive, l.revoking, l.keep)
		}
	}
	w.locks.mu.Unlock()
	for n := uint64(1); n <= 3; n++ {
		c := w.servers[n].cache
		c.mu.Lock()
		for h, e := range c.mu.m {
			fmt.Fprintf(&b, "server %d entry %v users %d pin %v revoke %v dirty %v\n", n, h, e.users, e.pin != nil, e.revoke, e.dirty)
		}
		c.mu.Unlock()
	}
	_ = os.WriteFile(fmt.Sprintf("/tmp/btree-sim-%d.locks", seed), []byte(b.String()), 0o644)
}

// dumpChunks writes every node image in the chunks, for a failed walk.
func (w *simWorld) dumpChunks(seed int64) {
	w.chunks.mu.Lock()
	defer w.chunks.mu.Unlock()
	var hs []Handle
	for h := range w.chunks.data {
		hs = append(hs, h)
	}
	sort.Slice(hs, func(i, j int) bool { return hs[i].ID < hs[j].ID })
	var b strings.Builder
	for _, h := range hs {
		d := w.chunks.data[h]
		if a, err := DecodeAnchor(d, h); err == nil {
			fmt.Fprintf(&b, "%v anchor v%d leftmost %v\n", h, a.Version, a.Leftmost)
			continue
		}
		n, err := decode(d)
		if err != nil {
			fmt.Fprintf(&b, "%v: %v\n", h, err)
			continue
		}
		fmt.Fprintf(&b, "%v v%d level %d deleted %v onward %v [%q,%q inf %v) right %v keys %q kids %v garbage %v\n", h, n.Version, n.Level, n.Deleted, n.Onward, n.Low, n.High, n.HighInf, n.Right, n.Keys, n.Kids, n.Garbage)
	}
	w.events.Lock()
	for _, e := range w.events.lines {
		b.WriteString(e + "\n")
	}
	w.events.Unlock()
	_ = os.WriteFile(fmt.Sprintf("/tmp/btree-sim-%d.chunks", seed), []byte(b.String()), 0o644)
}

// TestSimTeethStragglers: clean closes that leave the pins of operations
// still in the cache (before the fix: the clerk's close was refused, and
// the leases went to a recovery as after a crash) are caught.
func TestSimTeethStragglers(t *testing.T) {
	expectTeeth(t, "clean closes that leave stragglers' pins", 100, func(seed int64) error {
		_, err := runSim(t, seed, teethStragglers, 40)
		return err
	}, "clean close, neither disrupted nor killed, failed")
}
