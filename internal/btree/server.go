package btree

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/chunk"
	"github.com/grovestore/grove/internal/lock"
	"github.com/grovestore/grove/internal/meta"
	"github.com/grovestore/grove/internal/metrics"
	"github.com/grovestore/grove/internal/rldev"
	"github.com/grovestore/grove/internal/txn"
)

// A B-tree server (one per node): its lock clerk of kind "btree", whose
// recovery function replays a dead server's log; its fence lock, whose
// token every write-back carries; its write-ahead log, found through the
// config service; its node cache; the trees it has opened.
//
// Recovery (Boxwood §3.7): a server's leases on the nodes it changed
// protect the log records of those changes. When the failure detector
// declares a server dead, the lock service keeps its leases and runs the
// recovery function on another live B-tree server: that server replays
// the dead server's log (txn.Recover, under the run's token, which is
// newer than any the dead server held), writing every logged image to its
// chunk, and only then are the leases freed. If no B-tree server is alive,
// the lock service runs the recovery when the first one registers, before
// any of the dead server's leases is granted. The dead server's fence lock
// and log lock are among those leases, so its next incarnation opens its
// log only after the replay.
//
// Fencing: every write-back carries the server's fence lock and token, and
// a recovery's replay carries the same lock name with the run's newer
// token, so an RLDev that saw the replay refuses the dead server's late
// writes; every chunk it had a write in flight to is in the replay (a node
// stays in the log until its write-back is acknowledged). The fence is
// one lock per server, not one per node, because an RLDev keeps tokens for
// rldev.MaxTokenNames lock names: a cluster of more B-tree servers than
// that needs coarser fences.

// Namespace is the config-service namespace of the trees.
const Namespace = "btree"

// FenceLock is server node's fence lock.
func FenceLock(node uint64) string { return fmt.Sprintf("btree/fence/%d", node) }

// LogName is server node's log.
func LogName(node uint64) string { return fmt.Sprintf("btree-%d", node) }

// Kind is the lock clerks' kind of B-tree servers.
const Kind = "btree"

// Scope is the names a B-tree server's clerk locks: nodes and anchors
// (LockName), fence locks (FenceLock), its log (txn.LockName(LogName)).
// When a new master does not know what a dead server held, only these
// wait for its recovery; the chunk managers' leases its replay needs do
// not.
func Scope() []string { return []string{"btree/", txn.LockName("btree-")} }

// MaxNameLen bounds a tree's name.
const MaxNameLen = 128

// TreeEntry is a tree as the config service records it.
type TreeEntry struct {
	Name      string
	Anchor    Handle
	NodeSize  int
	MaxFanout int
}

// Errors of the tree directory.
var (
	ErrNoTree     = errors.New("btree: no such tree")
	ErrTreeExists = errors.New("btree: a tree of that name exists")
	ErrBadName    = fmt.Errorf("btree: a tree's name is 1 to %d bytes of letters, digits and -_.", MaxNameLen)
)

// defaultOpTimeout is ServerConfig.OpTimeout's default.
const defaultOpTimeout = 30 * time.Second

// CheckTreeName reports a name a tree may not have.
func CheckTreeName(name string) error {
	if len(name) == 0 || len(name) > MaxNameLen {
		return ErrBadName
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_.", r)) {
			return fmt.Errorf("%w: %q", ErrBadName, name)
		}
	}
	return nil
}

func treeKey(name string) string { return "tree/" + name }

// dropKey records a drop under way (the dropped tree's entry): its name is
// gone from the directory, its chunks are being freed. Any server finishes
// it (DropTree, then every repair tick), so a drop cut off half-way does
// not leak the tree.
func dropKey(anchor Handle) string { return fmt.Sprintf("drop/%d-%d", anchor.CM, anchor.ID) }

// pendingDrop is a drop under way: the tree, and when its anchor was
// marked dropped (the recording server's wall clock).
type pendingDrop struct {
	TreeEntry
	Marked time.Time
}

// A drop record: u64 unix nanoseconds of the mark, then the tree's entry.
func encodeDrop(d pendingDrop) []byte {
	return append(binary.LittleEndian.AppendUint64(nil, uint64(d.Marked.UnixNano())), encodeEntry(d.TreeEntry)...)
}

// pendingDrops lists the drops under way.
func pendingDrops(ns *pb.Namespace) []pendingDrop {
	var out []pendingDrop
	for _, kv := range ns.GetEntries() {
		if !strings.HasPrefix(kv.Key, "drop/") || len(kv.Value) < 8 {
			continue
		}
		if e, err := decodeEntry(kv.Value[8:]); err == nil {
			out = append(out, pendingDrop{TreeEntry: e, Marked: time.Unix(0, int64(binary.LittleEndian.Uint64(kv.Value))).UTC()})
		}
	}
	return out
}

// encodeEntry: u8 version 1, u32 anchor CM, u64 anchor ID, u32 node size,
// u16 fanout, then the name.
func encodeEntry(e TreeEntry) []byte {
	b := []byte{1}
	b = binary.LittleEndian.AppendUint32(b, e.Anchor.CM)
	b = binary.LittleEndian.AppendUint64(b, e.Anchor.ID)
	b = binary.LittleEndian.AppendUint32(b, uint32(e.NodeSize))
	b = binary.LittleEndian.AppendUint16(b, uint16(e.MaxFanout))
	return append(b, e.Name...)
}

func decodeEntry(b []byte) (TreeEntry, error) {
	if len(b) < 19 || b[0] != 1 {
		return TreeEntry{}, errors.New("btree: tree entry does not decode")
	}
	e := TreeEntry{Anchor: getHandle(b[1:]), NodeSize: int(binary.LittleEndian.Uint32(b[13:])),
		MaxFanout: int(binary.LittleEndian.Uint16(b[17:])), Name: string(b[19:])}
	if CheckTreeName(e.Name) != nil || e.Anchor.IsZero() {
		return TreeEntry{}, errors.New("btree: tree entry does not decode")
	}
	// The node size and fanout are not checked here: an entry that holds
	// bad ones fails when its tree is opened (New), alone. Refusing it
	// here would make Trees, and so every tree, fail (review 44).
	return e, nil
}

// Trees decodes the namespace.
func Trees(ns *pb.Namespace) (map[string]TreeEntry, error) {
	out := map[string]TreeEntry{}
	for _, kv := range ns.GetEntries() {
		if !strings.HasPrefix(kv.Key, "tree/") {
			continue // a drop under way (dropKey)
		}
		e, err := decodeEntry(kv.Value)
		if err != nil {
			return nil, fmt.Errorf("%w (key %q)", err, kv.Key)
		}
		out[e.Name] = e
	}
	return out, nil
}

// ListTrees returns every tree whose directory entry decodes, by name, and
// a line ("key: error") for each entry that does not. A listing is for
// people: one bad entry does not hide the others (Trees, for the
// collections that must see every anchor, fails on it instead).
func ListTrees(ctx context.Context, m *meta.Client) (trees []TreeEntry, unreadable []string, err error) {
	ns, err := m.Read(ctx, Namespace)
	if err != nil {
		return nil, nil, err
	}
	trees, unreadable = listTrees(ns)
	return trees, unreadable, nil
}

// listTrees is ListTrees on directory ns.
func listTrees(ns *pb.Namespace) (trees []TreeEntry, unreadable []string) {
	for _, kv := range ns.GetEntries() {
		if !strings.HasPrefix(kv.Key, "tree/") {
			continue // a drop under way (dropKey)
		}
		e, err := decodeEntry(kv.Value)
		if err != nil {
			unreadable = append(unreadable, fmt.Sprintf("%q: %v", kv.Key, err))
			continue
		}
		trees = append(trees, e)
	}
	sort.Slice(trees, func(i, j int) bool { return trees[i].Name < trees[j].Name })
	sort.Strings(unreadable)
	return trees, unreadable
}

// LookupTree finds tree name.
func LookupTree(ctx context.Context, m *meta.Client, name string) (TreeEntry, error) {
	ns, err := m.Read(ctx, Namespace)
	if err != nil {
		return TreeEntry{}, err
	}
	return lookupIn(ns, name)
}

// lookupIn finds tree name in directory ns. It reads that tree's entry
// alone: an entry of another tree that does not decode (Trees fails on
// it, as the collections that must see every anchor should) does not stop
// this one's operations.
func lookupIn(ns *pb.Namespace, name string) (TreeEntry, error) {
	key := treeKey(name)
	for _, kv := range ns.GetEntries() {
		if kv.Key != key {
			continue
		}
		e, err := decodeEntry(kv.Value)
		if err != nil {
			return TreeEntry{}, fmt.Errorf("%w (key %q)", err, kv.Key)
		}
		if e.Name != name {
			return TreeEntry{}, fmt.Errorf("btree: directory key %q holds the entry of tree %q", kv.Key, e.Name)
		}
		return e, nil
	}
	return TreeEntry{}, fmt.Errorf("%w: %q", ErrNoTree, name)
}

// ServerConfig wires a node's B-tree server.
type ServerConfig struct {
	Node   uint64
	Meta   *meta.Client
	Locks  *lock.Service
	Chunks *chunk.Clerk
	RLDev  *rldev.Clerk
	// LogSize is the size of the server's log, made at its first start
	// (default 64 MiB).
	LogSize uint64
	// CacheNodes bounds the nodes the cache pins (default
	// DefaultCacheNodes).
	CacheNodes int
	// OpTimeout bounds one operation (default defaultOpTimeout; well
	// below Grace).
	OpTimeout time.Duration
	// RepairEvery is how often a tree's repairer runs Repair on it
	// (default 30 s; 0 keeps the default, negative: never). See Repairer.
	RepairEvery time.Duration
	// Repairer reports whether this server is tree name's repairer (nil:
	// it is every tree's). A Repair pass reads every node of a tree under
	// shared leases, so that one pass per tree per RepairEvery is the
	// budget, not one per server: the repairer opens the trees it repairs
	// from the directory and runs the pass every RepairEvery; every other
	// server runs it on the trees it has open only every
	// RepairBackstop-th period, so that a tree in use whose repairer is
	// down is still repaired, later (a tree no live server has open is
	// not: nothing changes it either). In a node the repairer is the tree's home
	// (Home over the registered nodes), the node the etcd endpoint
	// forwards to.
	Repairer func(name string) bool
	Log      *slog.Logger
	// Metrics, if set, counts the replays of dead servers' logs this
	// server runs (grove_btree_replay*).
	Metrics *metrics.Node
}

// Server is a node's B-tree server.
type Server struct {
	cfg   ServerConfig
	log   *slog.Logger
	clerk *lock.ClerkRT
	cache *Cache
	wal   *txn.Log
	ctx   context.Context
	stop  context.CancelFunc
	wg    sync.WaitGroup
	bgMu  sync.Mutex // orders background's start with Close's stop
	// lateCollections counts the collections of dead servers' orphans
	// this server's recovery runs handed to its background and that ran.
	lateCollections atomic.Int64
	// replays counts this server's recovery runs that replayed a log;
	// replayTook is the last one's duration (ns).
	replays, replayTook atomic.Int64
	hints               chan hint
	fence               fenceHolder
	// creatorsRetired: the directory refuses creations by this log's
	// earlier holders (named).
	creatorsRetired atomic.Bool
	// Tests only: testCreateStop ends CreateTree at stage ("written":
	// before the decree; "decreed": before the disown) as if the server
	// died there; unsafeRecoverWithoutDirectory collects a dead server's
	// orphans without the directory (the teeth of TestCreateTreeCrash).
	testCreateStop                func(stage string, anchor, root Handle) bool
	unsafeRecoverWithoutDirectory atomic.Bool
	testOpenLooked                func(name string) // Open, after its directory lookup
	mu                            struct {
		sync.Mutex
		trees map[string]*Tree
		// forgets counts Forget and forgetTree calls: an Open whose
		// directory lookup began before one does not cache what it found
		// (it may be the tree just dropped; review 56, N1).
		forgets uint64
		// unsettled: trees this server marked dropped whose decree failed;
		// the dropper settles them (SettleDrop), so that the name does not
		// stay listed until someone touches it.
		unsettled map[string]bool
	}
	settling sync.Map // tree names whose drop is being settled (SettleDrop)
	// tokens counts the tokened writes' events of every tree this
	// server opens (metrics).
	tokens TokenCounters
	// testDecreeFails, in tests, fails a drop's decree (it is not made).
	testDecreeFails func() error
	// testDirectory, in tests, replaces the config service's tree
	// directory for creations and drops.
	testDirectory Directory
	// dropPasses counts the dropper's passes (settleListed's backstop).
	dropPasses atomic.Int64
}

type hint struct {
	t     *Tree
	level int
	key   []byte
}

// StartServer starts node's B-tree server: it registers the clerk (whose
// recovery function other servers' deaths call), takes the fence lock
// (after any recovery of this node's previous incarnation), and opens the
// node's log, making it the first time.
func StartServer(ctx context.Context, cfg ServerConfig) (*Server, error) {
	if cfg.LogSize == 0 {
		cfg.LogSize = 64 << 20
	}
	if cfg.OpTimeout == 0 {
		cfg.OpTimeout = defaultOpTimeout
	}
	if cfg.RepairEvery == 0 {
		cfg.RepairEvery = 30 * time.Second
	}
	s := &Server{cfg: cfg, log: cfg.Log, hints: make(chan hint, 1024)}
	if s.log == nil {
		s.log = slog.Default()
	}
	s.log = s.log.With("role", "btree")
	s.mu.trees = map[string]*Tree{}
	s.mu.unsettled = map[string]bool{}
	s.ctx, s.stop = context.WithCancel(context.Background())
	clerk, err := cfg.Locks.NewClerk(Kind, s.recoverDead, Scope()...)
	for errors.Is(err, lock.ErrFenced) && ctx.Err() == nil {
		// The node is between incarnations (it is starting, or it fenced
		// itself): its next incarnation takes clerks.
		time.Sleep(100 * time.Millisecond)
		clerk, err = cfg.Locks.NewClerk(Kind, s.recoverDead, Scope()...)
	}
	if err != nil {
		return nil, fmt.Errorf("btree: registering the lock clerk: %w", err)
	}
	s.clerk = clerk
	s.fence = fenceHolder{name: FenceLock(cfg.Node), timeout: cfg.OpTimeout,
		acquire: func(ctx context.Context, name string) (Hold, error) { return clerk.Acquire(ctx, name, lock.Exclusive) },
		drop:    func(name string) error { clerk.Drop(name); return nil },
		fail:    func(err error) { s.cache.fail(err) }}
	s.cache = NewCache(CacheConfig{Locks: clerkLocks{clerk}, Chunks: chunkStore{cfg.Chunks}, Fence: s.currentFence,
		Renew: s.renewFence, Named: s.named, Capacity: cfg.CacheNodes, Log2: s.log})
	clerk.OnRevoke(s.cache.Revoked)
	fail := func(err error) (*Server, error) {
		s.stop()
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = clerk.Close(cctx)
		return nil, err
	}
	h, err := clerk.Acquire(ctx, FenceLock(cfg.Node), lock.Exclusive)
	if err != nil {
		return fail(fmt.Errorf("btree: taking the fence lock: %w", err))
	}
	s.fence.set(h)
	name := LogName(cfg.Node)
	if _, err := txn.LookupLog(ctx, cfg.Meta, name); errors.Is(err, txn.ErrNoLog) {
		if _, err := txn.CreateLog(ctx, cfg.Meta, cfg.RLDev, name, cfg.LogSize); err != nil && !errors.Is(err, txn.ErrLogExists) {
			h.Release()
			return fail(fmt.Errorf("btree: making the log: %w", err))
		}
	} else if err != nil {
		h.Release()
		return fail(err)
	}
	wal, err := txn.OpenNamed(ctx, txn.NamedConfig{Meta: cfg.Meta, RLDev: cfg.RLDev, Lock: txn.ClerkLocker(clerk), Name: name,
		Config: txn.Config{Applier: replayApplier{chunks: chunkStore{cfg.Chunks}, fence: s.currentFence, keep: nil}, Checkpointer: s.cache, Log: s.log}})
	if err != nil {
		h.Release()
		return fail(fmt.Errorf("btree: opening the log: %w", err))
	}
	s.wal = wal
	s.cache.cfg.Log = wal
	// The chunks this server allocates carry its log and its token on the
	// log's lock (chunk.Owner) until a durable change names them.
	owner := chunk.Owner{Log: OwnerLog(cfg.Node), Token: wal.Fence().Token}
	s.cache.setOwner(owner)
	s.wg.Add(4)
	go s.compressor()
	go s.dropper()
	go func() {
		defer s.wg.Done()
		collectStraysEvery(s.ctx, s.cache, StrayEvery, s.log)
	}()
	go func() {
		defer s.wg.Done()
		collectOrphans(s.ctx, chunkStore{cfg.Chunks}, MetaDirectory{cfg.Meta}, owner.Log, owner.Token, s.log, "start")
	}()
	s.log.Info("B-tree server started", "log", name, "recovered", wal.Recovered().Redone)
	return s, nil
}

// Close writes back every dirty node, gives every lease back, closes the
// log and the clerk: nothing is left for a recovery to do. An operation
// still running fails.
func (s *Server) Close(ctx context.Context) error {
	s.bgMu.Lock() // no background work starts after this (background)
	s.stop()
	s.bgMu.Unlock()
	s.wg.Wait()
	return closeSequence(ctx, s.cache, s.wal, nil, &s.fence, s.clerk.Close)
}

// background runs f on the server's context in a goroutine Close waits
// for; false: the server is stopping, and f does not run.
func (s *Server) background(f func(ctx context.Context)) bool {
	s.bgMu.Lock()
	defer s.bgMu.Unlock()
	if s.ctx.Err() != nil {
		return false
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		f(s.ctx)
	}()
	return true
}

// closingLog is what closeSequence needs of the server's log (*txn.Log).
type closingLog interface {
	KeepLock()
	Close(context.Context) error
}

// closeSequence is a clean close once the server's background work has
// stopped, shared by Server.Close and the simulator (so that what the
// simulator closes is closed as SIGTERM closes it): the cache writes
// everything back and gives its leases up, the log flushes and
// checkpoints and gives its lock up (logReleased, if the log's lock is
// not the log's own: the simulator's), then the fence lock goes and the
// clerk closes, leaving the master's record. A failure keeps every lease
// still held, the log's lock among them: once this node is declared dead,
// recovery replays the log.
func closeSequence(ctx context.Context, cache *Cache, wal closingLog, logReleased func(), fence *fenceHolder, closeClerk func(context.Context) error) error {
	// Operations already in the server may still run: Shutdown refuses
	// their commits before the final write-back (Cache.Quiesce).
	err := cache.Shutdown(ctx)
	if err != nil {
		// Some committed change may be in the log only. The log still
		// closes (flushing what it buffers, if the close's deadline has
		// not passed; an update not yet durable was not acknowledged),
		// but it keeps its lock: otherwise the recovery of this server's
		// leases would leave the log alone (ReplayDead), and those
		// changes would be lost.
		wal.KeepLock()
	}
	if cerr := wal.Close(ctx); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if logReleased != nil {
		logReleased()
	}
	fence.release()
	return closeClerk(ctx)
}

// Err is why the server stopped working, or nil.
func (s *Server) Err() error {
	if err := s.cache.Err(); err != nil {
		return err
	}
	return s.wal.Err()
}

// Cache returns the server's cache (for its statistics).
func (s *Server) Cache() *Cache { return s.cache }

// writeNew writes a new chunk's first image under the server's fence
// (writeFenced).
func (s *Server) writeNew(ctx context.Context, h Handle, img []byte) error {
	return writeFenced(ctx, chunkStore{s.cfg.Chunks}, s.currentFence, h, img)
}

// writeFenced writes a new chunk's first image under the fence current
// returns, again under the newer token if the server's own fence renewal
// overtook the write (the fence is read without waiting for a renewal in
// progress: fenceHolder), as WriteValue does.
func writeFenced(ctx context.Context, chunks Chunks, current func() *rldev.Fence, h Handle, img []byte) error {
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		f := current()
		if err = chunks.Write(ctx, h, img, f); err == nil || !errors.Is(err, chunk.ErrFenced) || !f.Token.Less(current().Token) {
			return err
		}
	}
	return err
}

// currentFence is the fence of this server's writes now (fenceHolder:
// it never waits for a renewal in progress).
func (s *Server) currentFence() *rldev.Fence { return s.fence.current() }

// renewFence takes the fence lock again, with a newer token
// (fenceHolder.renew).
func (s *Server) renewFence(ctx context.Context) error { return s.fence.renew(ctx) }

// recoverDead is the lock service's recovery function: it replays dead
// server's log before the dead server's leases are freed.
func (s *Server) recoverDead(ctx context.Context, r lock.Recovery) error {
	name := LogName(r.Dead.Node)
	if !r.Covers(txn.LockName(name)) {
		why := "its leases do not include its log's lock"
		if r.All {
			why = "another clerk holds its log's lock"
		}
		s.log.Info("a dead B-tree server held no log: nothing to replay", "dead", r.Dead, "token", r.Token, "all", r.All, "names", len(r.Names), "exclude", len(r.Exclude), "why", why)
		return nil
	}
	e, err := txn.LookupLog(ctx, s.cfg.Meta, name)
	if errors.Is(err, txn.ErrNoLog) {
		return nil // it died before it made its log: it changed nothing
	}
	if err != nil {
		return err
	}
	dev := &txn.RLDevDevice{Clerk: s.cfg.RLDev, ID: e.RLDev, Size: e.Blocks}
	var dir Directory = MetaDirectory{s.cfg.Meta}
	if s.unsafeRecoverWithoutDirectory.Load() {
		dir = nil
	}
	later := func(collect func(context.Context)) {
		if !s.background(func(ctx context.Context) { collect(ctx); s.lateCollections.Add(1) }) {
			s.log.Info("this server is stopping: the collection of a dead server's orphans is left to its log's next holder", "dead", r.Dead)
		}
	}
	start := time.Now()
	rep, err := replayDead(ctx, dev, r, chunkStore{s.cfg.Chunks}, dir, replayUnsafe{}, later, s.log, leakLogger(s.log, r.Dead))
	took := time.Since(start)
	s.cfg.Metrics.BTreeReplay(err, took, rep.Redone)
	if err != nil {
		return fmt.Errorf("btree: replaying the log of dead server %v: %w", r.Dead, err)
	}
	s.replays.Add(1)
	s.replayTook.Store(int64(took))
	s.log.Info("replayed a dead B-tree server's log", "dead", r.Dead, "records", rep.Records, "redone", rep.Redone, "undone", rep.Undone, "took", took.Round(time.Millisecond))
	return nil
}

// collectOrphans frees what the holders of log before token below
// allocated and never linked: it retires them (an allocation of theirs
// still in flight is refused from then on; with dir, a tree creation of
// theirs too), lists what they still own and frees it — but disowns what
// dir names (a tree's anchor and first root, created.go). Every chunk
// they linked otherwise was disowned before: by their own checkpoints,
// before the log forgot the link records, or by the replay of the log,
// before this call. A failure only delays the collection: the log's next
// holder collects everything below its own, newer, token. dir nil: the
// holders' trees were made with untagged chunks (tests, the simulator).
func collectOrphans(ctx context.Context, chunks Chunks, dir Directory, log uint64, below lock.Token, logger *slog.Logger, why string) int {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := chunks.RetireOwners(ctx, log, below); errors.Is(err, chunk.ErrMapFull) {
		// No room for the mark: collect anyway (freeing is what makes
		// room). An allocation of theirs still in flight may then land
		// after the list: it stays tagged, for the log's next holder.
		logger.Warn("retiring this log's earlier holders found a chunk map full; collecting without it", "log", log, "below", below, "when", why, "err", err)
	} else if err != nil {
		logger.Warn("retiring this log's earlier holders failed: what they allocated and never linked stays allocated until the log's next holder", "log", log, "below", below, "when", why, "err", err)
		return 0
	}
	if dir != nil {
		if err := dir.RetireCreators(ctx, log, below); err != nil {
			logger.Warn("retiring this log's earlier holders in the tree directory failed: what they allocated and never linked stays allocated until the log's next holder", "log", log, "below", below, "when", why, "err", err)
			return 0
		}
	}
	hs, err := chunks.Owned(ctx, log, below)
	if err != nil {
		logger.Warn("listing what this log's earlier holders allocated failed: it stays allocated until the log's next holder", "log", log, "below", below, "when", why, "err", err)
		return 0
	}
	var named map[Handle]bool
	if dir != nil && len(hs) > 0 {
		// After the directory's mark: no creation of theirs lands later.
		if named, err = dir.Named(ctx); err != nil {
			logger.Warn("reading the tree directory failed: what this log's earlier holders allocated and never linked stays allocated until the log's next holder", "log", log, "below", below, "when", why, "err", err)
			return 0
		}
	}
	freed := 0
	var disown []Handle
	for _, h := range hs {
		if named[h] {
			disown = append(disown, h)
			continue
		}
		if err := chunks.Free(ctx, h); errors.Is(err, chunk.ErrUnallocated) {
			continue // another collection of the same log's orphans freed it (a recovery run's, which runs late, and the log's next holder's at its start)
		} else if err != nil {
			logger.Warn("freeing a chunk an earlier holder of this log allocated and never linked failed", "chunk", h, "when", why, "err", err)
			continue
		}
		freed++
	}
	if len(disown) > 0 {
		// A tree made by an earlier holder that died (or failed to
		// disown) after the directory's decree.
		if err := chunks.Disown(ctx, disown); err != nil {
			logger.Warn("disowning the anchors and roots of trees an earlier holder of this log made failed: they stay tagged, for the log's next holder", "chunks", disown, "when", why, "err", err)
		} else {
			logger.Info("disowned the anchors and roots of trees an earlier holder of this log made", "log", log, "below", below, "when", why, "disowned", len(disown))
		}
	}
	if len(hs) > len(disown) {
		logger.Info("freed the chunks earlier holders of this log allocated and never linked", "log", log, "below", below, "when", why, "freed", freed, "found", len(hs)-len(disown))
	}
	return freed
}

// StrayEvery is how often a server looks whether an allocation of its own
// may have left a stray chunk (Cache.CollectStrays): a stray is collected
// about this long after the allocation that left it ended.
const StrayEvery = time.Second

// collectStraysEvery runs c's stray collection every period, and the
// frees of its own that failed again (RefreeFailed), until ctx ends (the
// server's and the simulator's loop). Each, after a failure (a pair down,
// an allocation stuck on it), waits twice as long as the last time, up to
// 32 periods: the collection has not marked MaybeStrays, the frees are
// still registered.
func collectStraysEvery(ctx context.Context, c *Cache, period time.Duration, logger *slog.Logger) {
	type task struct {
		run         func(context.Context) (int, error)
		did, failed string
		fails       int
		next        time.Time
	}
	tasks := []*task{
		{run: c.CollectStrays, did: "freed the chunks of allocations whose answers were lost",
			failed: "collecting the chunks of allocations whose answers were lost failed; trying again"},
		{run: c.RefreeFailed, did: "freed again chunks whose free had failed",
			failed: "freeing again chunks whose free had failed failed; trying again"},
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(period):
		}
		for _, k := range tasks {
			if time.Now().Before(k.next) {
				continue
			}
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			n, err := k.run(cctx)
			cancel()
			if n > 0 {
				logger.Info(k.did, "freed", n)
			}
			switch {
			case err == nil:
				k.fails = 0
			case ctx.Err() == nil && c.Err() == nil:
				k.fails++
				k.next = time.Now().Add(period << min(k.fails, 5))
				logger.Warn(k.failed, "err", err, "in", time.Until(k.next).Round(time.Millisecond))
			}
		}
	}
}

// ReplayDead replays dead server node's log (on dev) under a recovery
// run's token: the log's device is fenced with it under the log's lock
// name, the chunks under the dead server's fence lock name. It writes
// only committed images (a server never writes back an uncommitted one:
// no steal, so no undo), only of the nodes r says the dead server's leases
// still protect (r.Names; every name but r.Exclude when r.All — the lock
// service then grants no name in the kind's Scope until the run is done,
// and the replay touches only node locks, which are in it), and only over an
// older version of the node: the dead server's log may hold images of a
// node it gave up long ago, which other servers have changed since.
//
// The log is one per node, shared by its incarnations; it is the dead
// server's only if the run covers the log's lock (r.Names holds it, or r.All
// and r.Exclude does not). Otherwise the dead server did not hold it: it
// died before it took it (nobody may hold it then), or another clerk holds
// it — an older incarnation of the node that died holding it (its own run
// replays the log) or a newer one that has opened the log since. The dead
// server then wrote no record in the log (a server writes it only under its
// lock, which it gives up only by a clean close: txn.Log.Close), and a
// replay would read records another run is replaying, fence the log under
// a new token and truncate it under that run — which then finds nothing to
// redo, and the changes it protects are lost (TestEndToEndTreeLinearizable
// found it: a new lock master ran an "all" recovery of an incarnation that
// died waiting for its log next to the names recovery of the one before).
// Such a run has nothing to do.
//
// Its collection of the dead server's orphans reads no tree directory: it
// is for logs whose trees were made with untagged chunks (tests); a
// server's recovery function passes its directory (created.go).
func ReplayDead(ctx context.Context, dev txn.Device, r lock.Recovery, chunks Chunks) (txn.Report, error) {
	return replayDead(ctx, dev, r, chunks, nil, replayUnsafe{}, nil, slog.Default(), leakLogger(slog.Default(), r.Dead))
}

// leakLogger reports, on log, the value chunks a replay of dead's log let
// leak (their free failed).
func leakLogger(log *slog.Logger, dead lock.ClerkID) func(Handle, error) {
	return func(h Handle, err error) {
		log.Warn("replay: freeing a value chunk a committed change replaced failed; it leaks", "dead", dead, "chunk", h, "err", err)
	}
}

// replayUnsafe breaks a replay on purpose (the tests' teeth only):
// uncovered replays a log the run does not cover; keepTags skips the link
// records (the chunks committed changes name stay tagged, and the run's
// collection frees them).
type replayUnsafe struct{ uncovered, keepTags bool }

// replayDead is ReplayDead, collecting the orphans with dir (nil: none),
// logging on logger, telling leaked (nil: nobody) of the value chunks
// whose replayed free failed.
//
// later, if not nil, takes the collection of the orphans to run on its
// own, so that the run returns (and the dead server's leases are freed)
// without waiting for it: the collection is a chunk map's retirement mark,
// a directory decree and read, and a free per orphan, none of which the
// dead server's nodes need to be available again. It may go on while the
// leases are released or after; its safety depends on no lease. The
// chunks it frees are tagged with the dead holders' log and tokens older
// than the run's, which no live server ever links (a server links only
// what it allocated under its own tag, and the replay disowned, before
// this, everything a committed change of the dead server names); the
// retirement refuses their allocations still in flight whenever it lands.
// A collection that never runs (the recovering server stops first) or
// fails is the log's next holder's to do.
func replayDead(ctx context.Context, dev txn.Device, r lock.Recovery, chunks Chunks, dir Directory, unsafe replayUnsafe, later func(collect func(context.Context)), logger *slog.Logger, leaked func(Handle, error)) (txn.Report, error) {
	node := r.Dead.Node
	if !unsafe.uncovered && !r.Covers(txn.LockName(LogName(node))) {
		return txn.Report{}, nil
	}
	fence := rldev.Fence{Name: FenceLock(node), Token: r.Token}
	names := map[string]bool{}
	for _, n := range r.Names {
		names[n] = true
	}
	for _, n := range r.Exclude {
		names[n] = true
	}
	keep := func(h Handle) bool { return names[LockName(h)] != r.All }
	// The run's fence, which its writes (up to replayParallel at once) read
	// and its renewals replace.
	var fenceMu sync.Mutex
	current := func() *rldev.Fence {
		fenceMu.Lock()
		defer fenceMu.Unlock()
		f := fence
		return &f
	}
	a := replayApplier{chunks: chunks, fence: current, keep: keep, leaked: leaked, keepTags: unsafe.keepTags, parallel: replayParallel}
	if r.Renew != nil {
		a.renew = func(ctx context.Context, used lock.Token) error {
			fenceMu.Lock()
			defer fenceMu.Unlock()
			if used.Less(fence.Token) {
				return nil // another write of the run renewed it since this one went out: again under that token
			}
			t, err := r.Renew(ctx)
			if err != nil {
				return err
			}
			if !fence.Token.Less(t) {
				return fmt.Errorf("btree: the recovery run's renewed token %v is not newer than %v", t, fence.Token)
			}
			fence.Token = t
			return nil
		}
	}
	// The log's own fence keeps the run's first token: only the dead
	// server's next incarnation writes the log after this run, under a
	// newer token of the log's lock.
	rep, err := txn.Recover(ctx, dev, rldev.Fence{Name: txn.LockName(LogName(node)), Token: r.Token}, a, txn.Unsafe{})
	if err != nil {
		return rep, err
	}
	// The replay disowned every chunk a committed change of the log names
	// (its link records); what the dead server still owns, nothing names.
	// The run's token is newer than the dead server's on the log's lock,
	// and older than the log's next holder's.
	if !unsafe.uncovered {
		collect := func(ctx context.Context) {
			collectOrphans(ctx, chunks, dir, OwnerLog(node), r.Token, logger, "recovery")
		}
		if later != nil {
			later(collect)
		} else {
			collect(ctx)
		}
	}
	return rep, nil
}

// replayWriteAttempts bounds the attempts of one replayed node write whose
// outcome stays unknown (each after a renewal of the run's token).
const replayWriteAttempts = 16

// replayParallel bounds the node writes of a recovery run in flight: each
// node's newest image is written once (replayChains), so the writes are
// independent, and the RLDevs share their syncs among the writes in
// flight (as a checkpoint's write-backs: writeBackParallel).
var replayParallel = 16

// replayApplier writes replayed images to their chunks under a B-tree
// server's fence lock name (the dead server's, for a recovery run): the
// name its own write-backs carried, so that the RLDev refuses those once
// the replay's newer token is in. A chunk freed since is skipped: nothing
// reads it again. keep chooses the nodes it replays (nil: none — a server
// opening its own log, which its previous incarnation's recovery run, or
// its clean close, has made void).
type replayApplier struct {
	chunks Chunks
	fence  func() *rldev.Fence
	keep   func(h Handle) bool
	// renew takes a newer token for the run (lock.Recovery.Renew; nil: a
	// write that may land late fails the run), unless the run's token is
	// already newer than used, the one the write carried (another write
	// of the run renewed it meanwhile).
	renew func(ctx context.Context, used lock.Token) error
	// parallel: the writes of up to this many nodes at once (0, 1: one at
	// a time; txn.ParallelApplier).
	parallel int
	// leaked hears of a value chunk whose replayed free failed (it leaks).
	leaked func(h Handle, err error)
	// keepTags: replayUnsafe.keepTags.
	keepTags bool
}

// errBaseless: a delta Apply could not replay, its base neither in the log
// nor in the chunk. The full-page-write rule of delta.go makes it
// impossible (the simulator fails on it); the run fails, so that the dead
// server's leases stay held rather than a node lose a change.
var errBaseless = errors.New("btree: a delta without its base")

// replayFreeAttempts bounds the tries of one replayed free record.
const replayFreeAttempts = 5

var _ txn.ParallelApplier = replayApplier{}

// Parallel is how many records recovery may apply at once. Select keeps
// one image per node, and the records of one chunk commute: a write of a
// chunk freed since is skipped (chunk.ErrUnallocated), a free is
// idempotent, and a disown of a freed or disowned chunk does nothing (the
// chunk managers skip it), so a chunk's link, image and free records may
// go in any order and leave it as the log's order does.
func (a replayApplier) Parallel() int { return a.parallel }

// Select keeps the committed updates of the nodes to replay, and no undo.
func (a replayApplier) Select(p txn.Plan) (redo, undo []txn.Record) {
	committed := map[uint64]bool{}
	for _, t := range p.Committed {
		committed[t] = true
	}
	for _, r := range p.Redo {
		if r.Kind != txn.KindUpdate || !committed[r.Txn] {
			continue
		}
		if _, ok := parseLinkTarget(r.Target); ok {
			// A chunk the committed change named first: disowned, so that
			// the collection of what the log's holders allocated and never
			// linked (collectOrphans, after a recovery run's replay or at
			// the log's next start) leaves it alone. Also when the log's
			// own server opens it (keep nil): a clean close disowned
			// everything it committed, and this makes sure of it.
			if !a.keepTags {
				redo = append(redo, r)
			}
			continue
		}
		if a.keep == nil {
			continue
		}
		if _, ok := parseFreeTarget(r.Target); ok {
			// A value chunk the committed change stopped naming: freed
			// again whoever holds the leaf now (no image after the
			// change names it, and its id is never reused).
			redo = append(redo, r)
			continue
		}
		if h, err := txn.ParseChunkTarget(r.Target); err == nil && a.keep(h) {
			redo = append(redo, r)
		}
	}
	return replayChains(redo), nil
}

// replayChains makes, of the node records in redo, each node's newest
// image: its whole images and deltas (delta.go) in log order, which is
// the node's version order (a node's commits are serialized by its lock
// and appended before they are published), each delta applied to the
// image it was made from. The result is one whole-image record per node,
// carrying the LSN of the last record it took in, and the other records
// in their order. Applying them leaves each chunk holding the newer of
// its own image and that one (Apply rewrites what the chunk holds when
// it is as new), as applying every image in turn would; each other write
// would cost a chunk read and a replicated write in the window where the
// dead server's nodes are unavailable (a hot leaf has one record per put
// since its last write-back).
//
// A delta whose base is not the image made so far (an orphan) is kept,
// the newest of the node's, for Apply to check against the chunk: the
// log's head passed the node's whole image only after a write-back
// snapshot that came after every delta made from it, so such a delta's
// change is in the chunk, unless a later whole image in the log
// supersedes it (then it is dropped here). Apply applies it to the chunk
// if the chunk holds its base version (not expected), and fails the run
// if the chunk holds an older one (errBaseless).
// A record whose image does not decode is kept: Apply fails the run on it.
func replayChains(redo []txn.Record) []txn.Record {
	type chain struct {
		img     []byte
		version uint64
		last    int // index of the last record taken in
		orphan  int // the newest delta with no base in the log, if newer than img (else -1)
	}
	chains := map[string]*chain{}
	keep := map[int]bool{}
	for i, r := range redo {
		if _, err := txn.ParseChunkTarget(r.Target); err != nil {
			keep[i] = true
			continue
		}
		k := string(r.Target)
		c := chains[k]
		if c == nil {
			c = &chain{last: -1, orphan: -1}
			chains[k] = c
		}
		if r.Off == deltaOff {
			base, next, ok := deltaVersions(r.Redo)
			if !ok {
				keep[i] = true
				continue
			}
			if c.img != nil && c.version == base {
				if img, err := applyDelta(c.img, r.Redo, true); err == nil {
					c.img, c.version, c.last = img, next, i
					continue
				}
			}
			if c.img == nil || next > c.version {
				c.orphan = i // (the newest: records come in version order)
			}
			continue
		}
		v, ok := imageVersion(r.Redo)
		if !ok || r.Off != 0 {
			keep[i] = true
			continue
		}
		if c.img == nil || v > c.version {
			c.img, c.version, c.last = r.Redo, v, i
			if c.orphan >= 0 {
				if _, next, _ := deltaVersions(redo[c.orphan].Redo); next <= v {
					c.orphan = -1
				}
			}
		}
	}
	// One record per node, so that the parallel apply never writes a
	// chunk twice at once: the image, or an orphan newer than it (a gap
	// in the log's chain of the node, which the rule makes impossible:
	// Apply then takes it only if the chunk holds its base or newer, and
	// fails the run otherwise).
	for _, c := range chains {
		if c.orphan < 0 {
			continue
		}
		if _, next, _ := deltaVersions(redo[c.orphan].Redo); c.img != nil && next <= c.version {
			c.orphan = -1
		} else {
			c.last = -1
		}
	}
	out := redo[:0:0]
	for i, r := range redo {
		if keep[i] {
			out = append(out, r)
			continue
		}
		c := chains[string(r.Target)]
		if c.last == i {
			r.Off, r.Redo = 0, c.img
			out = append(out, r)
		} else if c.orphan == i {
			out = append(out, r)
		}
	}
	return out
}

func (a replayApplier) Apply(ctx context.Context, target []byte, off uint64, data []byte, lsn txn.LSN, _ *rldev.Fence) error {
	if h, ok := parseLinkTarget(target); ok {
		// Unlike a free, a disown that fails fails the run: the
		// collection after the replay would free a chunk the tree names.
		var err error
		for attempt := 1; attempt <= replayFreeAttempts; attempt++ {
			if err = a.chunks.Disown(ctx, []Handle{h}); err == nil || ctx.Err() != nil {
				return err
			}
			select {
			case <-time.After(time.Duration(attempt) * 100 * time.Millisecond):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return fmt.Errorf("btree: disowning chunk %v, which a committed change names: %w", h, err)
	}
	if h, ok := parseFreeTarget(target); ok {
		// A few tries; then the chunk leaks rather than fail the run: a
		// failed run keeps every lease of the dead server held, for one
		// chunk of garbage.
		var err error
		for attempt := 1; attempt <= replayFreeAttempts; attempt++ {
			if err = a.chunks.Free(ctx, h); err == nil || ctx.Err() != nil {
				return err
			}
			select {
			case <-time.After(time.Duration(attempt) * 100 * time.Millisecond):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if a.leaked != nil {
			a.leaked(h, err)
		}
		return nil
	}
	h, err := txn.ParseChunkTarget(target)
	if err != nil {
		return err
	}
	var nv uint64
	switch off {
	case 0:
		v, ok := imageVersion(data)
		if !ok {
			return fmt.Errorf("btree: the log's image of chunk %v does not decode", h)
		}
		nv = v
	case deltaOff:
		_, v, ok := deltaVersions(data)
		if !ok {
			return fmt.Errorf("btree: the log's delta of chunk %v does not decode", h)
		}
		nv = v
	default:
		return fmt.Errorf("btree: a record at offset %d of chunk %v: node images start at 0", off, h)
	}
	cur, err := a.chunks.Read(ctx, h, max(uint64(len(data)), AnchorSize))
	if errors.Is(err, chunk.ErrUnallocated) {
		return nil
	}
	if err != nil {
		return err
	}
	if l := imageLength(cur); l > len(cur) {
		if cur, err = a.chunks.Read(ctx, h, uint64(l)); err != nil {
			return err
		}
	}
	cv, _ := imageVersion(cur)
	if off == deltaOff && cv < nv {
		// A delta whose base the log no longer holds (replayChains): the
		// chunk must hold that base, or the change is lost.
		img, err := applyDelta(cur, data, false)
		if err != nil {
			return fmt.Errorf("btree: replaying a change of node %v whose base image is neither in the log nor in its chunk (version %d): %w: %w", h, cv, errBaseless, err)
		}
		data = img
	}
	if cv >= nv {
		// The chunk holds this image or a newer one. Write what it holds
		// again anyway, under the run's token: the dead server may have a
		// write of this node in flight (its answer lost) under an older
		// token of the same fence lock, and only a newer token admitted on
		// this RLDev makes it refuse that write when it lands. Nobody
		// else writes the node meanwhile: the dead server's lease on it
		// stands until this run is done, and no other recovery run that
		// may write it goes at once (the lock master runs an "all" run
		// alone among its kind's: Master.overlapping). Two at once could
		// each write the image it read here after the other wrote a
		// newer one: a whole-cluster restart did, and a leaf went back to
		// an image from before its split.
		data = cur
	}
	for attempt := 1; ; attempt++ {
		f := a.fence()
		err = a.chunks.Write(ctx, h, data, f)
		if err == nil || errors.Is(err, chunk.ErrUnallocated) {
			return nil
		}
		if errors.Is(err, chunk.ErrFenced) && f.Token.Less(a.fence().Token) && attempt < replayWriteAttempts && ctx.Err() == nil {
			// Another write of this run renewed its token (writes go
			// several at once), and the newer one reached this RLDev
			// first: again, under it.
			continue
		}
		if !errors.Is(err, chunk.ErrMaybeDone) || a.renew == nil || attempt == replayWriteAttempts || ctx.Err() != nil {
			return err
		}
		// An attempt of this write may still land later, under the token
		// it carried: harmless while this run lasts (nobody else writes
		// the node, and this run writes it again below, or wrote its
		// latest image already), not once the node's lock is granted
		// again. So the write goes again under a newer token of the run:
		// once that is in, the RLDev refuses the stray attempt (as
		// Cache.writeBack does with the server's fence). Failing the run
		// instead would make every new run of a large replay meet a lost
		// answer again: it succeeds only with probability (1 − p)^N.
		if rerr := a.renew(ctx, f.Token); rerr != nil {
			return fmt.Errorf("%w; renewing the run's token: %w", err, rerr)
		}
	}
}

// imageLength is the length an image's header claims (0 if none).
func imageLength(b []byte) int {
	if len(b) < 8 || !isNodeImage(b) && string(b[:4]) != anchorMagic && string(b[:4]) != droppedMagic {
		return 0
	}
	return int(binary.LittleEndian.Uint32(b[4:]))
}

// imageVersion is the version of the node or anchor image at the start of
// b, if it is a whole one.
func imageVersion(b []byte) (uint64, bool) {
	if len(b) < 4 {
		return 0, false
	}
	switch string(b[:4]) {
	case nodeMagic, nodeMagic2:
		if n, err := decode(b); err == nil {
			return n.Version, true
		}
	case anchorMagic, droppedMagic:
		if len(b) >= 24 {
			if a, err := DecodeAnchor(b, getHandle(b[12:])); err == nil {
				return a.Version, true
			}
		}
	}
	return 0, false
}

// Open returns tree name (looked up once, then kept).
func (s *Server) Open(ctx context.Context, name string) (*Tree, error) {
	s.mu.Lock()
	t, forgets := s.mu.trees[name], s.mu.forgets
	s.mu.Unlock()
	if t != nil {
		return t, nil
	}
	e, err := LookupTree(ctx, s.cfg.Meta, name)
	if err != nil {
		return nil, err
	}
	if s.testOpenLooked != nil {
		s.testOpenLooked(name)
	}
	var tr *Tree
	tr, err = New(s.cache.Store(e.Anchor, e.NodeSize, nil), e.Anchor.ID, Config{NodeSize: e.NodeSize, MaxFanout: e.MaxFanout, tokens: &s.tokens,
		Underfull: func(level int, key []byte) {
			select {
			case s.hints <- hint{tr, level, key}:
			default: // the queue is full: the periodic pass finds it
			}
		}})
	if err != nil {
		return nil, err
	}
	tr.anchor = e.Anchor
	s.mu.Lock()
	defer s.mu.Unlock()
	if t := s.mu.trees[name]; t != nil {
		return t, nil
	}
	if s.mu.forgets != forgets {
		// A drop was noticed meanwhile: tr may be the dropped tree. The
		// caller's operation finds out (ErrNoTree, or a token's anchor
		// that differs); the next Open looks the directory up again.
		return tr, nil
	}
	s.mu.trees[name] = tr
	return tr, nil
}

// Forget drops tree name from the trees the server has opened (after a
// drop).
func (s *Server) Forget(name string) {
	s.mu.Lock()
	s.mu.forgets++
	delete(s.mu.trees, name)
	s.mu.Unlock()
}

// forgetTree forgets t under whatever name it is known by.
func (s *Server) forgetTree(t *Tree) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mu.forgets++
	for name, x := range s.mu.trees {
		if x == t {
			delete(s.mu.trees, name)
		}
	}
}

// compressor runs compression hints and the periodic Repair pass.
func (s *Server) compressor() {
	defer s.wg.Done()
	period := 0
	var tick <-chan time.Time
	if s.cfg.RepairEvery > 0 {
		tk := time.NewTicker(s.cfg.RepairEvery)
		defer tk.Stop()
		tick = tk.C
	}
	for {
		select {
		case <-s.ctx.Done():
			return
		case h := <-s.hints:
			ctx, cancel := context.WithTimeout(s.ctx, s.cfg.OpTimeout)
			if _, err := h.t.Compress(ctx, h.level, h.key); err != nil && s.ctx.Err() == nil {
				s.log.Warn("compression failed", "tree", h.t.ID(), "err", err)
			}
			cancel()
		case <-tick:
			period++
			for _, t := range s.repairTrees(period%RepairBackstop == 0) {
				ctx, cancel := context.WithTimeout(s.ctx, 10*s.cfg.OpTimeout)
				if rep, err := t.Repair(ctx); errors.Is(err, ErrNoTree) {
					s.forgetTree(t) // dropped
				} else if err != nil && s.ctx.Err() == nil {
					s.log.Warn("repair pass failed", "tree", t.ID(), "err", err)
				} else if rep.Downlinks+rep.Freed+rep.Compressed > 0 {
					s.log.Info("repair pass", "tree", t.ID(), "downlinks", rep.Downlinks, "freed", rep.Freed, "compressed", rep.Compressed)
				}
				cancel()
			}
		}
	}
}

// RepairBackstop: a server that is not a tree's repairer runs the periodic
// Repair pass on it (if it has the tree open) every RepairBackstop-th
// period (5 minutes by default), in case its repairer is down.
const RepairBackstop = 10

// repairTrees lists the trees this period's Repair pass covers: those this
// server repairs (opened from the directory if need be), and, when
// backstop, every other tree it has open.
func (s *Server) repairTrees(backstop bool) []*Tree {
	var out []*Tree
	seen := map[*Tree]bool{}
	if s.cfg.Repairer != nil && s.cfg.Meta != nil {
		ctx, cancel := context.WithTimeout(s.ctx, s.cfg.OpTimeout)
		ns, err := s.cfg.Meta.Read(ctx, Namespace)
		var ts map[string]TreeEntry
		if err == nil {
			ts, err = Trees(ns)
		}
		if err != nil && s.ctx.Err() == nil {
			s.log.Warn("repair pass: reading the tree directory", "err", err)
		}
		for name := range ts {
			if !s.cfg.Repairer(name) {
				continue
			}
			if t, err := s.Open(ctx, name); err == nil {
				out, seen[t] = append(out, t), true
			} else if s.ctx.Err() == nil && !errors.Is(err, ErrNoTree) {
				s.log.Warn("repair pass: opening a tree", "tree", name, "err", err)
			}
		}
		cancel()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, t := range s.mu.trees {
		if !seen[t] && (s.cfg.Repairer == nil || backstop || s.cfg.Repairer(name)) {
			out = append(out, t)
		}
	}
	return out
}

// dropper frees dropped trees' chunks (DropWait after their drop), at start
// and every RepairEvery.
func (s *Server) dropper() {
	defer s.wg.Done()
	every := s.cfg.RepairEvery
	if every <= 0 {
		every = 30 * time.Second
	}
	for {
		s.dropPass(s.ctx)
		select {
		case <-s.ctx.Done():
			return
		case <-time.After(every):
		}
	}
}

// dropPass is one pass of the dropper: settle this server's drops cut off
// after their mark, finish the drops DropWait old, then settle the trees
// it repairs (all of them every RepairBackstop-th pass) whose anchor says
// dropped (settleListed). Each step has a budget of its own (10 ×
// OpTimeout), so that a step held up (a chunk pair down) does not starve
// the next.
func (s *Server) dropPass(ctx context.Context) {
	pass := s.dropPasses.Add(1)
	s.mu.Lock()
	var names []string
	for n := range s.mu.unsettled {
		names = append(names, n)
	}
	clear(s.mu.unsettled)
	s.mu.Unlock()
	for _, n := range names {
		if err := s.SettleDrop(ctx, n); err != nil && s.ctx.Err() == nil {
			s.log.Warn("settling a drop cut off half-way failed (the next pass tries again)", "tree", n, "err", err)
			s.mu.Lock()
			s.mu.unsettled[n] = true
			s.mu.Unlock()
		}
	}
	mine := s.cfg.Repairer
	if pass%RepairBackstop == 1 {
		mine = nil // (the first pass, and every RepairBackstop-th)
	}
	n, unreadable, ferr, serr := dropPassSteps(ctx, s.cache, s.directory(), s.cfg.Chunks.Free, s.DropWait(), 10*s.cfg.OpTimeout, s.dropFinished, mine, settleWait)
	if s.ctx.Err() != nil {
		return
	}
	if ferr != nil {
		s.log.Warn("finishing the drops under way: listing them failed (the next pass tries again)", "err", ferr)
	}
	switch {
	case serr != nil || unreadable > 0:
		s.log.Warn("settling the drops of listed trees whose anchors say dropped: some could not be looked at (the next pass tries again)", "settled", n, "unreadable", unreadable, "err", serr)
	case n > 0:
		s.log.Info("settled the drops of listed trees whose anchors say dropped (their servers died before the decree)", "settled", n)
	}
}

// settleWait bounds a dropper pass's read of one listed tree's anchor, and
// its settling (settleListed).
const settleWait = 5 * time.Second

// CreateTree makes tree name: its anchor and root chunks, allocated tagged
// with the server's owner, written, then its entry, by decree, then the
// chunks disowned (createTree; created.go says why). A tree of that name
// already there: ErrTreeExists (the chunks made are freed).
//
// It is bounded by OpTimeout (OpContext), whatever the caller's context:
// a drop is finished only DropWait after its mark, so no attempt of this
// creation's decree (meta.Client.Update runs it again after a lost answer)
// can land after the drop of the tree it made was finished and name its
// freed chunks again (drop.go; review 30).
func (s *Server) CreateTree(ctx context.Context, name string, cfg Config) (TreeEntry, error) {
	ctx, cancel := s.OpContext(ctx)
	defer cancel()
	return createTree(ctx, s.cache, s.directory(), s.writeNew, name, cfg, s.testCreateStop)
}

// directory is the tree directory this server's creations and drops use:
// the config service's (a test's stand-in if set).
func (s *Server) directory() Directory {
	if s.testDirectory != nil {
		return s.testDirectory
	}
	return MetaDirectory{s.cfg.Meta}
}

// DropTree removes tree name's entry, by decree, then frees every chunk of
// the tree (walking it; an operation still running on the tree meanwhile
// fails). A crash during the walk leaks the chunks not yet freed.
//
// The drop takes effect at once; its chunks are freed later, by any
// server's dropper, once DropWait has passed: an operation that began
// before the drop (it read the anchor before the mark) may still be
// splitting a node, allocating a chunk the walk would miss, until its
// deadline.
func (s *Server) DropTree(ctx context.Context, name string) error {
	_, err := s.BeginDrop(ctx, name)
	return err
}

// DropWait is how long after a drop's mark its chunks are freed: the
// longest an operation that began before it can run (Repair's deadline,
// 10 × OpTimeout), plus a minute for the servers' clocks to differ.
func (s *Server) DropWait() time.Duration { return 10*s.cfg.OpTimeout + time.Minute }

// BeginDrop marks tree name's anchor dropped, removes the name from the
// directory and records the drop (beginDrop); the chunks are freed by
// FinishDrops (every server's dropper runs it). If the mark is made but
// the decree fails, the tree answers as dropped and the name stays listed
// until this server's dropper settles it (its next pass), a drop of it is
// tried again, or an operation on it settles it.
//
// It is bounded by OpTimeout (OpContext), as CreateTree is.
func (s *Server) BeginDrop(ctx context.Context, name string) (TreeEntry, error) {
	ctx, cancel := s.OpContext(ctx)
	defer cancel()
	e, unsettled, err := beginDrop(ctx, s.cache, s.directory(), name, s.testDecreeFails)
	if err != nil {
		if unsettled {
			s.mu.Lock()
			s.mu.unsettled[name] = true
			s.mu.Unlock()
		}
		return TreeEntry{}, err
	}
	s.Forget(name)
	return e, nil
}

// SettleDrop finishes the directory's side of a drop cut off between its
// two steps (settleDrop). It fails only if it could not find out or could
// not settle.
func (s *Server) SettleDrop(ctx context.Context, name string) error {
	ctx, cancel := s.OpContext(ctx)
	defer cancel()
	settled, err := settleDrop(ctx, s.cache, s.directory(), name)
	if settled {
		s.log.Info("settled a drop cut off half-way", "tree", name)
	}
	return err
}

// FinishDrops finishes every drop marked at least minAge ago (the dropper
// passes DropWait): finishDrops on this server.
func (s *Server) FinishDrops(ctx context.Context, minAge time.Duration) {
	err := finishDrops(ctx, s.cache, s.directory(), s.cfg.Chunks.Free, minAge, s.dropFinished)
	if err != nil && s.ctx.Err() == nil {
		s.log.Warn("finishing the drops under way: listing them failed (the next repair pass tries again)", "err", err)
	}
}

// dropFinished logs a drop's finish (err nil), or its failure.
func (s *Server) dropFinished(e TreeEntry, err error) {
	if err != nil && s.ctx.Err() == nil {
		s.log.Warn("finishing a tree's drop failed (the next repair pass tries again)", "tree", e.Name, "err", err)
	} else if err == nil {
		s.log.Info("finished a tree's drop", "tree", e.Name)
	}
}

// dropOrder lists a tree's node chunks (not its anchor) in the order a drop
// frees them: levels from the leaves up, a node's garbage before it, the
// nodes of a level in the reverse of the order they were found. It
// reaches nodes through downlinks, right links and the anchor's leftmost
// links, and skips nodes already freed (a resumed drop).
func dropOrder(ctx context.Context, st Store, a *Anchor) ([]Handle, error) {
	seen := map[Handle]bool{}
	levels := make([][][]Handle, a.RootLevel()+1) // per level, units: a node's garbage, then it
	frontier := []Handle{a.Root}
	for level := a.RootLevel(); level >= 0; level-- {
		if !a.Leftmost[level].IsZero() {
			frontier = append(frontier, a.Leftmost[level])
		}
		var next []Handle
		for len(frontier) > 0 {
			h := frontier[0]
			frontier = frontier[1:]
			if h.IsZero() || seen[h] {
				continue
			}
			seen[h] = true
			n, err := st.Read(ctx, h)
			if errors.Is(err, ErrGone) {
				continue
			}
			if err != nil {
				return nil, err
			}
			var unit []Handle
			for _, g := range n.Garbage {
				if !seen[g.Node] {
					seen[g.Node] = true
					unit = append(unit, g.Node)
				}
			}
			if !n.Deleted {
				// A live leaf's values in chunks of their own go before
				// it (a removed leaf's moved to the node that took them).
				for _, r := range n.Refs() {
					if !seen[r.Chunk] {
						seen[r.Chunk] = true
						unit = append(unit, r.Chunk)
					}
				}
			}
			levels[level] = append(levels[level], append(unit, h))
			if n.Deleted {
				continue
			}
			frontier = append(frontier, n.Right)
			if level > 0 {
				next = append(next, n.Kids...)
			}
		}
		frontier = next
	}
	// Within a level, the latest found first: a node found only through
	// its left neighbour's right link (a split whose downlink is not in
	// yet) goes before that neighbour, so a resumed drop still finds it.
	var out []Handle
	for _, l := range levels {
		for i := len(l) - 1; i >= 0; i-- {
			out = append(out, l[i]...)
		}
	}
	return out, nil
}

// OpContext bounds an operation by the server's OpTimeout.
func (s *Server) OpContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.cfg.OpTimeout)
}

// clerkLocks adapts a lock clerk to Locks.
type clerkLocks struct{ c *lock.ClerkRT }

func (l clerkLocks) Acquire(ctx context.Context, name string, mode lock.Mode) (Hold, error) {
	h, err := l.c.Acquire(ctx, name, mode)
	if err != nil {
		return nil, err
	}
	return h, nil
}

func (l clerkLocks) Revoking(name string) bool { return l.c.Revoking(name) }

func (l clerkLocks) Lost() <-chan struct{} { return l.c.Lost() }

func (l clerkLocks) ValidUntil() time.Time { return l.c.ValidUntil() }

// chunkStore adapts a chunk clerk to Chunks.
type chunkStore struct{ c *chunk.Clerk }

func (s chunkStore) Allocate(ctx context.Context, size uint64, owner chunk.Owner) (Handle, error) {
	return s.c.AllocateOwned(ctx, size, 0, owner)
}

func (s chunkStore) Disown(ctx context.Context, hs []Handle) error { return s.c.Disown(ctx, hs) }

func (s chunkStore) RetireOwners(ctx context.Context, log uint64, below lock.Token) error {
	return s.c.RetireOwners(ctx, log, below)
}

func (s chunkStore) Owned(ctx context.Context, log uint64, below lock.Token) ([]Handle, error) {
	return s.c.Owned(ctx, log, below)
}

func (s chunkStore) MaybeStrays() uint64 { return s.c.MaybeStrays() }

func (s chunkStore) Read(ctx context.Context, h Handle, n uint64) ([]byte, error) {
	return s.c.Read(ctx, h, 0, n)
}

// Write writes a node's image. When the chunk clerk retried it after an
// attempt it sent got no answer, that attempt may still land later, under
// the same token, over a newer image another server wrote once the node's
// lock moved: such a success is reported as ErrMaybeDone, and the cache
// renews its fence and writes again under the newer token, which the
// RLDev then holds against the stray attempt. (Attempts that found their
// connection down sent nothing and do not count: a pair member that is
// down costs no renewal.)
func (s chunkStore) Write(ctx context.Context, h Handle, data []byte, f *rldev.Fence) error {
	earlier, err := s.c.WriteFencedReport(ctx, h, 0, data, f)
	if err == nil && earlier {
		return fmt.Errorf("writing chunk %v: %w (an earlier attempt, unanswered, may still land under the same token)", h, errWrittenEarlierMayLand)
	}
	return err
}

// errWrittenEarlierMayLand: the write is done, and an earlier attempt of
// it may still land (chunkStore.Write). It wraps chunk.ErrMaybeDone, which
// the chunk clerk also wraps in failures whose attempts may have landed:
// only this one says the data is there.
var errWrittenEarlierMayLand = fmt.Errorf("written; %w", chunk.ErrMaybeDone)

func (s chunkStore) Free(ctx context.Context, h Handle) error {
	err := s.c.Free(ctx, h)
	if errors.Is(err, chunk.ErrUnallocated) {
		return nil
	}
	return err
}

// ChunkReader reads a tree's images straight from their chunks, bypassing
// every cache: the walker's view of what is durable in the chunks (the
// whole tree once no server holds a dirty node of it).
type ChunkReader struct {
	Chunks *chunk.Clerk
	Entry  TreeEntry
}

func (r ChunkReader) Anchor(ctx context.Context) (*Anchor, error) {
	b, err := r.Chunks.Read(ctx, r.Entry.Anchor, 0, AnchorSize)
	if err != nil {
		return nil, err
	}
	return DecodeAnchor(b, r.Entry.Anchor)
}

func (r ChunkReader) Read(ctx context.Context, h Handle) (*Node, error) {
	b, err := r.Chunks.Read(ctx, h, 0, uint64(r.Entry.NodeSize))
	if err != nil {
		return nil, err
	}
	return Decode(b, r.Entry.Anchor.ID, h)
}

func (r ChunkReader) ReadValue(ctx context.Context, ref ValueRef) ([]byte, error) {
	b, err := r.Chunks.Read(ctx, ref.Chunk, 0, ValueChunkSize(int(ref.Length)))
	if err != nil {
		return nil, err
	}
	return DecodeValue(b, r.Entry.Anchor.ID, ref)
}
