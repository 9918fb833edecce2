package btree

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/grovestore/grove/internal/lock"
)

// Config sets a tree's shape and bounds.
type Config struct {
	// NodeSize bounds a node's image, in bytes (default 8 KiB; at least
	// MinNodeSize). It also bounds an entry: see MaxEntry.
	NodeSize int
	// MaxFanout bounds a node's entries (0: as many as fit). Boxwood's
	// measurements used 6.
	MaxFanout int
	// Grace is how long a removed node stays readable (pointing onward)
	// before its chunk is freed (default 2 min). No operation may run longer
	// than Grace holding a pointer it read: the server bounds operations by
	// a deadline well below it. A removed node's deadline is on the clock
	// of the server that removed it and is checked on any server's, which
	// may be 2·ClockSkew ahead: Grace must exceed that and the bound
	// (the defaults: 30 s + 60 s < 2 min).
	Grace time.Duration
	// MaxScanLeaves bounds the leaves one scan page holds at once (default
	// 256): a page ends early, with More set, rather than hold more.
	MaxScanLeaves int
	// MaxCountLeaves bounds the leaves a count holds at once (default
	// 4096); a larger range is refused with ErrRangeTooLarge.
	MaxCountLeaves int
	// MaxScanBytes bounds the keys and values of one scan page (default
	// 4 MiB): a page ends early, with More set, rather than hold more
	// (it holds one entry at least).
	MaxScanBytes int
	// MaxInline bounds an entry (key and value, with their lengths) kept
	// whole in its leaf (default MaxEntry(NodeSize)/2, at most
	// MaxEntry(NodeSize)): a larger one keeps its value in a chunk of its
	// own (value.go), up to MaxValue bytes. Half a node's room keeps a
	// leaf's fanout at two or more entries of the largest inline size
	// beside its bounds.
	MaxInline int
	// Underfull, if set, is told of a node a delete left under-full (its
	// level and a key it covers): compression's trigger (Sagiv's second
	// policy). The tree never calls it with a lock held.
	Underfull func(level int, key []byte)

	// tokenWindow and clockSkew are TokenWindow and ClockSkew but in
	// tests (completion.go).
	tokenWindow, clockSkew time.Duration
	// tokens, if set, also counts this tree's tokened writes' events
	// (its server's, over its trees); New gives the tree its own if not.
	tokens *TokenCounters
	// eagerFloors applies a token's floor at every write, not only once
	// the records take half the room (raiseFloor): the simulator's small
	// runs would otherwise seldom reach it.
	eagerFloors bool
}

func (c *Config) fill() error {
	if c.NodeSize == 0 {
		c.NodeSize = MinNodeSize
	}
	if c.NodeSize < MinNodeSize || c.NodeSize > MaxNodeSize {
		return fmt.Errorf("%w: node size %d outside [%d, %d]", ErrBadConfig, c.NodeSize, MinNodeSize, MaxNodeSize)
	}
	if c.MaxFanout != 0 && (c.MaxFanout < 4 || c.MaxFanout > math.MaxUint16) {
		// (The directory's entry holds it in 16 bits: review 44.)
		return fmt.Errorf("%w: fanout %d: at least 4 and at most %d (or 0, as many as fit)", ErrBadConfig, c.MaxFanout, math.MaxUint16)
	}
	if c.Grace == 0 {
		c.Grace = 2 * time.Minute
	}
	if c.tokenWindow == 0 {
		c.tokenWindow = TokenWindow
	}
	if c.tokens == nil {
		c.tokens = &TokenCounters{}
	}
	if c.clockSkew == 0 {
		c.clockSkew = ClockSkew
	}
	if c.MaxScanLeaves == 0 {
		c.MaxScanLeaves = 256
	}
	if c.MaxCountLeaves == 0 {
		c.MaxCountLeaves = 4096
	}
	if c.MaxScanBytes == 0 {
		c.MaxScanBytes = 4 << 20
	}
	if c.MaxInline == 0 {
		c.MaxInline = MaxEntry(c.NodeSize) / 2
	}
	if c.MaxScanBytes < 0 {
		return fmt.Errorf("btree: scan pages of %d bytes", c.MaxScanBytes)
	}
	if c.MaxInline < 0 || c.MaxInline > MaxEntry(c.NodeSize) {
		return fmt.Errorf("btree: inline entries of at most %d bytes: more than %d-byte nodes hold", c.MaxInline, c.NodeSize)
	}
	if c.MaxScanLeaves < 2 || c.MaxCountLeaves < 2 {
		return errors.New("btree: scans and counts must be allowed two leaves at least")
	}
	return nil
}

// MaxEntry is the largest entry (key and value, with their lengths) a node
// of size nodeSize holds: two of them fit beside the longest bounds and a
// full garbage list, so a split always leaves two legal halves.
func MaxEntry(nodeSize int) int {
	return (nodeSize - headerSize - 4 - 2*(2+MaxKey) - MaxGarbage*garbageSize - doneOverhead) / 2
}

// Errors of tree operations. Each says what was done: nothing.
var (
	ErrKey           = fmt.Errorf("btree: a key is 1 to %d bytes", MaxKey)
	ErrTooLarge      = errors.New("btree: key and value too large for a node")
	ErrRangeTooLarge = errors.New("btree: the range spans too many leaves for one consistent count")
	ErrBadRange      = errors.New("btree: the range's start is not below its end")
	// ErrBadConfig: a tree's node size or fanout is out of range (a
	// creation refused, changing nothing).
	ErrBadConfig = errors.New("btree: bad tree configuration")
)

// ErrNotApplied marks an update's failure that came before any change:
// the update did not take effect and never will (no log record of it was
// buffered), so a client may retry it, on any server. Any other failure
// of a put or delete has an unknown outcome. errors.Is finds the cause
// too.
var ErrNotApplied = errors.New("btree: refused before any change")

type notAppliedError struct{ err error }

func (e *notAppliedError) Error() string   { return e.err.Error() }
func (e *notAppliedError) Unwrap() []error { return []error{e.err, ErrNotApplied} }

// refused marks err (nil stays nil) as ErrNotApplied.
func refused(err error) error {
	if err == nil || errors.Is(err, ErrNotApplied) {
		return err
	}
	return &notAppliedError{err}
}

// errRestart: the operation met a node whose keys moved left under it, or a
// freed node; it starts again from the root.
var errRestart = errors.New("btree: restart from the root")

// maxRestarts bounds restarts of one operation (each one means a
// concurrent compression moved the keys it was after).
const maxRestarts = 1000

// Stats count the algorithm's work.
type Stats struct {
	Restarts, MoveRights, Onwards                 atomic.Uint64
	Splits, RootSplits, Merges, Rebalances, Freed atomic.Uint64
	Repairs                                       atomic.Uint64 // downlinks put back by Repair
	Passes                                        atomic.Uint64 // Repair passes run to their end
	// ValuesFreed counts value chunks freed after an overwrite or delete
	// (or a put that did not apply); ValueLeaks those left allocated
	// because their free failed; ValueUnsettled the updates of unknown
	// outcome that left a value chunk (the new or the old one) allocated
	// and maybe named by nothing.
	ValuesFreed, ValueLeaks, ValueUnsettled atomic.Uint64
	// Tokened writes (completion.go): answered from their record;
	// refused (for age, a stamp from the future, the horizon, or below
	// their client's floor: the four after it); records (and floors)
	// dropped for age, evicted for room, and dropped below a floor.
	Repeats, TokensRefused                                  atomic.Uint64
	RefusedOld, RefusedFuture, RefusedHorizon, RefusedFloor atomic.Uint64
	RecordsDropped, RecordsEvicted, RecordsFloored          atomic.Int64
}

// Tree runs Sagiv's algorithm on one tree over a store. Safe for concurrent
// use: any number of operations on any number of servers.
type Tree struct {
	s  Store
	id uint64
	// anchor: the directory entry's anchor (Server.Open sets it).
	anchor Handle
	cfg    Config
	Stats  Stats
	// crashPoint, set only by tests, is called after each structural
	// change commits ("split", "merge", "rebalance", with the level of
	// the nodes changed); an error ends the operation there, as if its
	// server died at that instant (the crash-point tests kill it inside).
	crashPoint func(point string, level int) error
	// keepOldValues, set only by the simulator's teeth, never frees the
	// value chunk an update replaced (nor records it in the change).
	keepOldValues bool
	// logFreesOnly, set only by the simulator, skips an update's own free
	// of the value chunk it replaced: the change's free record alone
	// frees it (a checkpoint, or the replay of a dead server's log).
	logFreesOnly bool
	// onOutcome, set only by tests, is called under the leaf's lock when
	// a tokened write's outcome (applied or not) is committed afresh:
	// never twice for one token (completion.go's oracle).
	onOutcome func(tok WriteToken, key []byte, applied bool)
	// onDurable, set only by tests, is called when the commit of a
	// tokened write's outcome is known to be durable: never twice for one
	// token (the simulator's oracle; a commit lost with its server may be
	// made again by a later attempt, and is not called).
	onDurable func(tok WriteToken)
	// unsafeDone, set only by teeth tests, breaks one rule of
	// completion.go (the unsafeDone* constants).
	unsafeDone int
}

func (t *Tree) at(point string, level int) error {
	if t.crashPoint == nil {
		return nil
	}
	return t.crashPoint(point, level)
}

// New returns the tree whose anchor is chunk id's, over s.
func New(s Store, id uint64, cfg Config) (*Tree, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	return &Tree{s: s, id: id, cfg: cfg}, nil
}

// Config is the tree's configuration (defaults filled in).
func (t *Tree) Config() Config { return t.cfg }

// ID is the tree's id.
func (t *Tree) ID() uint64 { return t.id }

// Anchor is the tree's anchor, as its directory entry names it (zero for a
// tree not opened through a Server).
func (t *Tree) Anchor() Handle { return t.anchor }

// Init returns the images of an empty tree: its anchor and a root leaf,
// for the creator to write.
func Init(anchor, root Handle) (*Anchor, *Node) {
	a := &Anchor{Self: anchor, Root: root, Leftmost: []Handle{root}}
	n := &Node{Self: root, Tree: anchor.ID, HighInf: true}
	return a, n
}

// CheckEntry reports whether key and val may be stored.
func (t *Tree) CheckEntry(key, val []byte) error {
	if len(key) == 0 || len(key) > MaxKey {
		return ErrKey
	}
	if len(val) > MaxValue {
		return fmt.Errorf("%w: a %d-byte value; at most %d bytes", ErrTooLarge, len(val), MaxValue)
	}
	return nil
}

// inline reports whether key and val are kept whole in their leaf.
func (t *Tree) inline(key, val []byte) bool {
	return EntrySize(true, key, val) <= t.cfg.MaxInline
}

// value returns the value leaf entry i stores (reading it from its chunk
// if it is in one of its own).
func (t *Tree) value(ctx context.Context, n *Node, i int) ([]byte, error) {
	v, _, err := t.valueRef(ctx, n, i)
	return v, err
}

// valueRef is value, with the reference of the value's chunk if it is in
// one of its own (nil otherwise).
func (t *Tree) valueRef(ctx context.Context, n *Node, i int) ([]byte, *ValueRef, error) {
	if !n.IsExt(i) {
		return n.Vals[i], nil, nil
	}
	ref, err := DecodeRef(n.Vals[i])
	if err != nil {
		return nil, nil, err
	}
	v, err := t.s.ReadValue(ctx, ref)
	if err != nil {
		return nil, nil, err
	}
	return v, &ref, nil
}

// fits, underfull and mergeable go by entries alone: completion records
// take what room the entries leave (trimDone).
func (t *Tree) fits(n *Node) bool {
	s := n.entriesSize()
	if n.version2() {
		s += doneOverhead
	}
	return s <= t.cfg.NodeSize && (t.cfg.MaxFanout == 0 || len(n.Keys) <= t.cfg.MaxFanout)
}

// underfull is Sagiv's "less than half full".
func (t *Tree) underfull(n *Node) bool {
	if t.cfg.MaxFanout != 0 {
		return len(n.Keys) < t.cfg.MaxFanout/2
	}
	return n.entriesSize() < t.cfg.NodeSize/2
}

// mergeable: the merged node leaves room, so that the next insert does not
// split it again at once.
func (t *Tree) mergeable(n *Node) bool {
	return n.entriesSize() <= t.cfg.NodeSize*3/4 && (t.cfg.MaxFanout == 0 || len(n.Keys) < t.cfg.MaxFanout)
}

// target is what a descent looks for: the node covering key, or (below)
// the node covering the keys just below key, where a nil key with below
// means "below +infinity" (the last node).
type target struct {
	key   []byte
	below bool
}

// here reports whether n covers the target; left that the target lies left
// of n (its keys moved under the operation: start again), otherwise it is
// to the right.
func (tg target) here(n *Node) (here, left bool) {
	if tg.below {
		if tg.key == nil {
			return n.HighInf, false
		}
		if len(n.Low) > 0 && bytes.Compare(tg.key, n.Low) <= 0 {
			return false, true
		}
		return n.HighInf || bytes.Compare(tg.key, n.High) <= 0, false
	}
	if bytes.Compare(tg.key, n.Low) < 0 {
		return false, true
	}
	return n.HighInf || bytes.Compare(tg.key, n.High) < 0, false
}

func (tg target) child(n *Node) int {
	if !tg.below {
		return n.Child(tg.key)
	}
	if tg.key == nil {
		return len(n.Kids) - 1
	}
	return n.ChildBelow(tg.key)
}

// locate descends without locks to the node at level that covers tg,
// moving right past concurrent splits and onward past removed nodes. It
// returns that node's image and the path: path[l] is the node it passed at
// level l (l > level), a hint for where a separator goes.
func (t *Tree) locate(ctx context.Context, tg target, level int) (*Node, []Handle, error) {
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			t.Stats.Restarts.Add(1)
			if attempt > maxRestarts {
				return nil, nil, fmt.Errorf("btree: %d restarts looking for %q", attempt, tg.key)
			}
		}
		a, err := t.s.Anchor(ctx)
		if err != nil {
			return nil, nil, err
		}
		if level > a.RootLevel() {
			return nil, nil, fmt.Errorf("btree: level %d above the root's %d", level, a.RootLevel())
		}
		path := make([]Handle, a.RootLevel()+1)
		h, want := a.Root, a.RootLevel()
		n, err := t.walk(ctx, h, want, level, tg, path)
		if errors.Is(err, errRestart) {
			continue
		}
		return n, path, err
	}
}

// walk is one descent of locate, from node h at level want.
func (t *Tree) walk(ctx context.Context, h Handle, want, level int, tg target, path []Handle) (*Node, error) {
	for steps := 0; ; steps++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		n, err := t.s.Read(ctx, h)
		if errors.Is(err, ErrGone) {
			return nil, errRestart
		}
		if err != nil {
			return nil, err
		}
		if int(n.Level) != want {
			// Only a corrupt image or a reused chunk could do this.
			return nil, fmt.Errorf("btree: node %v is at level %d where level %d was expected", h, n.Level, want)
		}
		if n.Deleted {
			t.Stats.Onwards.Add(1)
			h = n.Onward
			continue
		}
		here, left := tg.here(n)
		if left {
			return nil, errRestart
		}
		if !here {
			if n.Right.IsZero() {
				return nil, fmt.Errorf("btree: node %v at level %d has no right link but does not cover %q", h, want, tg.key)
			}
			t.Stats.MoveRights.Add(1)
			h = n.Right
			continue
		}
		path[want] = h
		if want == level {
			return n, nil
		}
		h = n.Kids[tg.child(n)]
		want--
	}
}

// lockCovering takes h's lock in mode and moves right (and onward) holding
// one lock at a time until the locked node covers tg. On errRestart nothing
// is held.
func (t *Tree) lockCovering(ctx context.Context, h Handle, tg target, mode lock.Mode) (*Node, error) {
	for {
		n, err := t.s.Lock(ctx, h, mode)
		if errors.Is(err, ErrGone) {
			return nil, errRestart
		}
		if err != nil {
			return nil, err
		}
		if n.Deleted {
			t.s.Unlock(h, mode)
			t.Stats.Onwards.Add(1)
			h = n.Onward
			continue
		}
		here, left := tg.here(n)
		if left {
			t.s.Unlock(h, mode)
			return nil, errRestart
		}
		if here {
			return n, nil
		}
		t.s.Unlock(h, mode)
		if n.Right.IsZero() {
			return nil, fmt.Errorf("btree: node %v has no right link but does not cover %q", h, tg.key)
		}
		t.Stats.MoveRights.Add(1)
		h = n.Right
	}
}

// Get returns key's value (found false if absent). It takes no lock.
func (t *Tree) Get(ctx context.Context, key []byte) ([]byte, bool, error) {
	v, _, ok, err := t.getRef(ctx, key)
	return v, ok, err
}

// known is a value read without locks and the reference of the chunk it
// was read from (a value in a chunk of its own). A chunk is never written
// again and its id never reused, so a leaf that still names ref under its
// lock holds exactly val: a conditional update compares against it
// without reading the chunk while it holds the leaf exclusively.
type known struct {
	ref ValueRef
	val []byte
}

// getRef is Get, with the reference of the value's chunk if it is in one
// of its own (nil otherwise).
func (t *Tree) getRef(ctx context.Context, key []byte) ([]byte, *ValueRef, bool, error) {
	if len(key) == 0 || len(key) > MaxKey {
		return nil, nil, false, ErrKey
	}
	gone := 0
	for attempt := 0; ; attempt++ {
		if attempt > maxRestarts {
			return nil, nil, false, fmt.Errorf("btree: %d restarts reading %q", attempt, key)
		}
		n, _, err := t.locate(ctx, target{key: key}, 0)
		if err != nil {
			return nil, nil, false, err
		}
		if gone >= 2 {
			// Overwrites keep freeing the value under the read: read it
			// under the leaf's lock, which they cannot pass.
			return t.getLocked(ctx, n.Self, key)
		}
		// What we read must be durable before we report it: the image may
		// carry a change whose commit is still on its way to the log.
		if err := t.s.Durable(ctx, n.LSN); err != nil {
			return nil, nil, false, err
		}
		i, ok := n.Search(key)
		if !ok {
			return nil, nil, false, nil
		}
		v, ref, err := t.valueRef(ctx, n, i)
		if errors.Is(err, ErrGone) {
			// Overwritten and freed since the image was current.
			t.Stats.Restarts.Add(1)
			gone++
			continue
		}
		if err != nil {
			return nil, nil, false, err
		}
		return v, ref, true, nil
	}
}

// getLocked is Get holding the covering leaf's lock in shared mode, found
// from start, while it reads the value.
func (t *Tree) getLocked(ctx context.Context, start Handle, key []byte) ([]byte, *ValueRef, bool, error) {
	tg := target{key: key}
	for attempt := 0; ; attempt++ {
		if attempt > maxRestarts {
			return nil, nil, false, fmt.Errorf("btree: %d restarts reading %q", attempt, key)
		}
		n, err := t.lockCovering(ctx, start, tg, lock.Shared)
		if errors.Is(err, errRestart) {
			t.Stats.Restarts.Add(1)
			leaf, _, lerr := t.locate(ctx, tg, 0)
			if lerr != nil {
				return nil, nil, false, lerr
			}
			start = leaf.Self
			continue
		}
		if err != nil {
			return nil, nil, false, err
		}
		i, ok := n.Search(key)
		var v []byte
		var ref *ValueRef
		if ok {
			v, ref, err = t.valueRef(ctx, n, i)
		}
		t.s.Unlock(n.Self, lock.Shared)
		if err != nil {
			return nil, nil, false, err
		}
		if err := t.s.Durable(ctx, n.LSN); err != nil {
			return nil, nil, false, err
		}
		return v, ref, ok, nil
	}
}

// CondKind is the condition of a conditional put or delete.
type CondKind uint8

const (
	Always   CondKind = iota // no condition
	IfAbsent                 // only if the key is absent
	IfEquals                 // only if the key is present with value Cond.Value
	IfExists                 // only if the key is present
)

// Cond is a condition on a key's current value.
type Cond struct {
	Kind  CondKind
	Value []byte
	// Prev asks for the previous value in Result.Prev even when the
	// condition does not need it and it is in a chunk of its own (a
	// value kept in its leaf is always reported).
	Prev bool
}

func (c Cond) holds(found bool, cur []byte) bool {
	switch c.Kind {
	case IfAbsent:
		return !found
	case IfEquals:
		return found && bytes.Equal(cur, c.Value)
	case IfExists:
		return found
	}
	return true
}

// Result says what a put or delete found and did.
type Result struct {
	Applied bool   // the condition held and the change is durable
	Found   bool   // the key was present before
	Prev    []byte // its value then (not reported when Repeat)
	// Repeat: a tokened write's answer came from its completion record
	// (an earlier attempt's outcome); Prev is not known then.
	Repeat bool
	// unnamed: whatever the error, no change names the write's own value
	// chunk (a repeat, or a failed condition's record): it is freed.
	unnamed bool
}

// Put sets key to val if cond holds on the current value. It holds one
// node lock at a time, even when splits climb several levels.
func (t *Tree) Put(ctx context.Context, key, val []byte, cond Cond) (Result, error) {
	return t.PutOnce(ctx, key, val, cond, nil)
}

// PutOnce is Put with a write token (nil: none): an attempt of a write
// whose earlier attempt took effect, or failed its condition, is answered
// with that outcome (Result.Repeat) and changes nothing (completion.go).
func (t *Tree) PutOnce(ctx context.Context, key, val []byte, cond Cond, tok *WriteToken) (Result, error) {
	if err := t.CheckEntry(key, val); err != nil {
		return Result{}, err
	}
	if err := t.sameTree(tok); err != nil {
		return Result{}, err
	}
	stored, ext := val, false
	var ref ValueRef
	var pre *known
	var print uint64
	if tok != nil {
		print = fingerprint(opPut, key, val, cond)
	}
	// (A tokened write skips the lock-free pre-check: its answer could
	// contradict an earlier attempt's outcome, which only the leaf's
	// records know.)
	if tok == nil && (!t.inline(key, val) && (cond.Kind == IfAbsent || cond.Kind == IfEquals) || t.comparesLarge(key, cond)) {
		// A large value's write is worth sparing a put whose condition
		// fails: a lock-free read first. If the condition fails there,
		// the put fails at that read's instant, changing nothing (the
		// read is linearizable); if it holds, the locked path below
		// checks it again — against this read's value if the leaf still
		// names the same chunk, so that a large current value is not
		// read while the leaf is held exclusively.
		var failed *Result
		var err error
		if pre, failed, err = t.preCheck(ctx, key, cond); err != nil || failed != nil {
			return deref(failed), err
		}
	}
	if !t.inline(key, val) {
		// The value first, in a chunk of its own (durable): the leaf's
		// change names it once committed.
		var err error
		if ref, err = t.s.WriteValue(ctx, val); err != nil {
			return Result{}, refused(err)
		}
		stored, ext = ref.Encode(), true
	}
	res, old, lsn, err := t.update(ctx, key, cond, pre, tok, print, func(n *Node, i int, found bool) {
		if found {
			n.setVal(i, stored, ext)
			return
		}
		n.insertEntry(i, key, stored, ext)
	})
	var unused *ValueRef
	if ext {
		unused = &ref
	}
	t.settleValues(ctx, res, lsn, err, unused, old)
	return res, err
}

// settleValues frees the value chunks an update left unnamed: the new
// value's (mine) if the update did not apply, the old value's if it did.
// A change committed (at lsn) whose durability the caller stopped waiting
// for frees the old value once it is durable. When the outcome is unknown
// otherwise, both stay (one of them leaks: Stats.ValueUnsettled).
func (t *Tree) settleValues(ctx context.Context, res Result, lsn uint64, err error, mine, old *ValueRef) {
	free := func(r *ValueRef) {
		if r == nil {
			return
		}
		// Not cut by the caller's end, but bounded: a pair that is down
		// does not hold the put up (a failed free is tried again).
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), giveBackWait)
		ferr := t.s.Free(fctx, r.Chunk)
		cancel()
		if ferr != nil {
			t.Stats.ValueLeaks.Add(1)
			return
		}
		t.Stats.ValuesFreed.Add(1)
	}
	switch {
	case res.Repeat || res.unnamed || didNothing(err):
		free(mine) // (an earlier attempt's change names its own chunk, if any)
	case err == nil && res.Applied:
		if t.keepOldValues || t.logFreesOnly {
			return // teeth: the old value chunk leaks; or the log frees it
		}
		free(old)
	case err == nil || errors.Is(err, ErrNotApplied):
		free(mine)
	case lsn != 0 && t.logFreesOnly:
	case lsn != 0 && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)):
		// Committed; only the wait for its durability ended.
		if old != nil && !t.s.FreeWhenDurable(lsn, old.Chunk, func(freed bool) {
			if freed {
				t.Stats.ValuesFreed.Add(1)
			} else {
				t.Stats.ValueLeaks.Add(1)
			}
		}) {
			t.Stats.ValueUnsettled.Add(1)
		}
	default:
		if mine != nil || old != nil {
			t.Stats.ValueUnsettled.Add(1)
		}
	}
}

// Delete removes key if cond holds. It holds one node lock; a leaf left
// under-full is reported to Config.Underfull for compression.
func (t *Tree) Delete(ctx context.Context, key []byte, cond Cond) (Result, error) {
	return t.DeleteOnce(ctx, key, cond, nil)
}

// DeleteOnce is Delete with a write token (nil: none), as PutOnce.
func (t *Tree) DeleteOnce(ctx context.Context, key []byte, cond Cond, tok *WriteToken) (Result, error) {
	if len(key) == 0 || len(key) > MaxKey {
		return Result{}, ErrKey
	}
	if cond.Kind == IfAbsent {
		return Result{}, errors.New("btree: a delete on condition that the key is absent")
	}
	if err := t.sameTree(tok); err != nil {
		return Result{}, err
	}
	if cond.Kind == Always {
		cond.Kind = IfExists // deleting an absent key changes nothing
	}
	var pre *known
	var print uint64
	if tok != nil {
		print = fingerprint(opDelete, key, nil, cond)
	}
	if tok == nil && t.comparesLarge(key, cond) {
		// As in Put: a lock-free read first, so that the comparison under
		// the leaf's exclusive lock need not read a large value's chunk.
		var failed *Result
		var err error
		if pre, failed, err = t.preCheck(ctx, key, cond); err != nil || failed != nil {
			return deref(failed), err
		}
	}
	res, old, lsn, err := t.update(ctx, key, cond, pre, tok, print, func(n *Node, i int, found bool) {
		n.removeEntry(i)
	})
	t.settleValues(ctx, res, lsn, err, nil, old)
	return res, err
}

// preCheck is a conditional update's lock-free read of key: if cond fails
// there, failed is the update's answer (it fails at that read's instant,
// changing nothing: the read is linearizable); otherwise pre is what it
// read if the value is in a chunk of its own (update compares against it
// if the leaf still names that chunk).
func (t *Tree) preCheck(ctx context.Context, key []byte, cond Cond) (pre *known, failed *Result, err error) {
	cur, cref, found, err := t.getRef(ctx, key)
	if err != nil {
		return nil, nil, refused(err)
	}
	if !cond.holds(found, cur) {
		return nil, &Result{Found: found, Prev: cur}, nil
	}
	if cref != nil {
		pre = &known{ref: *cref, val: cur}
	}
	return pre, nil, nil
}

func deref(r *Result) Result {
	if r == nil {
		return Result{}
	}
	return *r
}

// comparesLarge reports whether cond compares the key's value with one too
// large to stay in a leaf: the current value, if equal, is in a chunk of
// its own.
func (t *Tree) comparesLarge(key []byte, cond Cond) bool {
	return cond.Kind == IfEquals && !t.inline(key, cond.Value)
}

// update is the body of Put and Delete: lock the leaf covering key, check
// cond, change it, split it if it overflows, then carry the split upwards.
// old is the reference of the key's value before, if it was in a chunk of
// its own; lsn is the change's log position once it committed (0 before).
//
// pre, if not nil, is the key's value read without locks just before: if
// the leaf names the same chunk, the comparison uses it.
//
// tok, if not nil, is the write's token and print its fingerprint: its
// record is looked up first, and its outcome recorded (completion.go).
func (t *Tree) update(ctx context.Context, key []byte, cond Cond, pre *known, tok *WriteToken, print uint64, change func(n *Node, i int, found bool)) (res Result, old *ValueRef, lsn uint64, err error) {
	tg := target{key: key}
	for attempt := 0; ; attempt++ {
		if attempt > maxRestarts {
			return Result{}, nil, 0, refused(fmt.Errorf("btree: %d restarts updating %q", attempt, key))
		}
		leaf, path, err := t.locate(ctx, tg, 0)
		if err != nil {
			return Result{}, nil, 0, refused(err)
		}
		n, err := t.lockCovering(ctx, leaf.Self, tg, lock.Exclusive)
		if errors.Is(err, errRestart) {
			t.Stats.Restarts.Add(1)
			continue
		}
		if err != nil {
			return Result{}, nil, 0, refused(err)
		}
		h := n.Self
		if tok != nil {
			if res, done, err := t.lookupDone(ctx, n, key, tok, print); done {
				t.s.Unlock(h, lock.Exclusive)
				if err == nil {
					// The answer waits until the record is durable (it
					// may be another server's lazy commit).
					err = t.s.Durable(ctx, n.LSN)
				}
				return res, nil, 0, err
			}
		}
		i, found := n.Search(key)
		res := Result{Found: found}
		old = nil
		if found {
			res.Prev = n.Vals[i]
			if n.IsExt(i) {
				r, err := DecodeRef(n.Vals[i])
				if err != nil {
					t.s.Unlock(h, lock.Exclusive)
					return Result{}, nil, 0, refused(err)
				}
				old, res.Prev = &r, nil
				if pre != nil && pre.ref == r {
					res.Prev = pre.val // the same chunk: the same bytes
				} else if cond.Kind == IfEquals || cond.Prev || !cond.holds(found, nil) {
					// Under the lock the chunk is the current value's:
					// nobody frees it.
					if res.Prev, err = t.s.ReadValue(ctx, r); err != nil {
						t.s.Unlock(h, lock.Exclusive)
						return Result{}, nil, 0, refused(err)
					}
				}
			}
		}
		if !cond.holds(found, res.Prev) && tok != nil && t.unsafeDone != unsafeDoneNoFailure {
			// The failure is an outcome too: recorded, so that an
			// earlier attempt arriving later does not apply.
			nn := n.Clone()
			tc := trims{floored: t.raiseFloor(nn, tok)}
			nn.addDone(t.completion(key, tok, print, false, found))
			t.trimDone(nn, &tc)
			lsn, err := t.s.Commit(ctx, []*Node{nn}, nil, nil)
			if err == nil {
				t.outcome(tok, key, false)
				t.count(tc)
			}
			t.s.Unlock(h, lock.Exclusive)
			if err != nil {
				return Result{unnamed: true}, nil, 0, err
			}
			res.unnamed = true
			return res, nil, 0, t.durable(ctx, lsn, tok)
		}
		if !cond.holds(found, res.Prev) {
			t.s.Unlock(h, lock.Exclusive)
			// Nothing to change; the answer waits until what it read is
			// durable (it may be another server's lazy commit).
			return res, nil, 0, refused(t.s.Durable(ctx, n.LSN))
		}
		nn := n.Clone()
		change(nn, i, found)
		var tc trims // (counted once committed)
		if tok != nil {
			tc.floored = t.raiseFloor(nn, tok)
			nn.addDone(t.completion(key, tok, print, true, found))
		}
		// The value chunk the change stops naming is freed by the
		// caller once the change is durable (settleValues); the change
		// records it too, for a server that dies before.
		var frees []Handle
		if old != nil && !t.keepOldValues {
			frees = []Handle{old.Chunk}
		}
		if t.fits(nn) {
			t.trimDone(nn, &tc)
			lsn, err := t.s.Commit(ctx, []*Node{nn}, nil, frees)
			if err == nil {
				t.outcome(tok, key, true)
				t.count(tc)
			}
			t.s.Unlock(h, lock.Exclusive)
			if err != nil {
				return Result{}, old, 0, err
			}
			if t.cfg.Underfull != nil && len(nn.Keys) < len(n.Keys) && t.underfull(nn) {
				t.cfg.Underfull(0, key)
			}
			res.Applied = true
			return res, old, lsn, t.durable(ctx, lsn, tok)
		}
		// (The outcome is told inside split, before the right half's lock
		// goes: a write to the key there may commit as soon as it does.)
		sep, right, lsn, err := t.split(ctx, nn, frees, tc, func() { t.outcome(tok, key, true) })
		t.s.Unlock(h, lock.Exclusive)
		if err != nil {
			return Result{}, old, 0, err
		}
		res.Applied = true
		// The key is in place (in the left or the right half, linked from
		// the left): the separator's insertion above can fail without
		// losing anything; Repair puts back a downlink that is missing.
		t.insertSeparator(ctx, 1, sep, right, path, false)
		return res, old, lsn, t.durable(ctx, lsn, tok)
	}
}

// split divides nn (the new image of a node the caller holds exclusively,
// too big to fit) into two: nn keeps the lower half, a new node the upper
// one. Both images are committed together; the new node's lock is given
// back before it returns, the caller's is not. It returns the separator
// (the new node's low bound) and the new node. committed, if not nil, is
// called once both halves are committed, under both locks.
func (t *Tree) split(ctx context.Context, nn *Node, frees []Handle, tc trims, committed func()) ([]byte, Handle, uint64, error) {
	rh, err := t.s.New(ctx)
	if err != nil {
		return nil, Handle{}, 0, refused(err)
	}
	mid := t.splitPoint(nn)
	r := &Node{Self: rh, Tree: t.id, Level: nn.Level, Low: nn.Keys[mid], High: nn.High, HighInf: nn.HighInf, Right: nn.Right}
	r.Keys = append([][]byte(nil), nn.Keys[mid:]...)
	if nn.Leaf() {
		r.Vals = append([][]byte(nil), nn.Vals[mid:]...)
		r.Ext = nn.extRange(mid, len(nn.Keys))
		nn.Vals = nn.Vals[:mid:mid]
		nn.Ext = nn.extRange(0, mid)
	} else {
		r.Kids = append([]Handle(nil), nn.Kids[mid:]...)
		nn.Kids = nn.Kids[:mid:mid]
	}
	nn.Keys = nn.Keys[:mid:mid]
	nn.High, nn.HighInf, nn.Right = r.Low, false, rh
	if nn.Leaf() {
		splitDone(nn.Done, nn.Floors, nn.Horizon, nn, r)
		if t.unsafeDone == unsafeDoneSplitDrops {
			r.Done = nil
		}
		t.trimDone(nn, &tc)
		t.trimDone(r, &tc)
	}
	if !t.fits(nn) || !t.fits(r) {
		panic(fmt.Sprintf("btree: split of %v at %d left halves of %d and %d bytes", nn.Self, mid, nn.Size(), r.Size()))
	}
	// The right half is written with the left, in one change: until the
	// separator reaches the parent the pair acts as one node, reached
	// through the left one's right link.
	lsn, err := t.s.Commit(ctx, []*Node{r, nn}, nil, frees)
	if err != nil {
		t.s.Abandon(rh)
		return nil, Handle{}, 0, err
	}
	t.count(tc)
	if committed != nil {
		committed()
	}
	if err := t.at("split", int(nn.Level)); err != nil {
		return nil, Handle{}, 0, err
	}
	t.s.Unlock(rh, lock.Exclusive)
	t.Stats.Splits.Add(1)
	return r.Low, rh, lsn, nil
}

// splitPoint picks the index of the first entry of the upper half: the
// middle by bytes, leaving each half one entry at least.
func (t *Tree) splitPoint(n *Node) int {
	total := 0
	for i, k := range n.Keys {
		total += EntrySize(n.Leaf(), k, n.val(i))
	}
	acc := 0
	for i, k := range n.Keys {
		acc += EntrySize(n.Leaf(), k, n.val(i))
		if acc*2 >= total {
			mid := i + 1
			if t.cfg.MaxFanout != 0 && (mid < len(n.Keys)/2) {
				mid = len(n.Keys) / 2
			}
			if mid >= len(n.Keys) {
				mid = len(n.Keys) - 1
			}
			if mid < 1 {
				mid = 1
			}
			return mid
		}
	}
	return len(n.Keys) / 2
}

// insertSeparator puts the downlink (sep, child) into level, starting at
// the node the descent passed there (path), moving right holding one lock
// at a time, and splitting upwards as needed. A split of the root grows a
// new root under the anchor's lock. repair: the downlink may be missing
// after a crash rather than in flight (Repair); it is put back only if
// the child is still live. Errors are counted, not returned: the key that
// caused the split is in place, and Repair finishes what is left.
func (t *Tree) insertSeparator(ctx context.Context, level int, sep []byte, child Handle, path []Handle, repair bool) error {
	for attempt := 0; ; attempt++ {
		if attempt > maxRestarts {
			return fmt.Errorf("btree: %d restarts inserting a separator at level %d", attempt, level)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		a, err := t.s.Anchor(ctx)
		if err != nil {
			return err
		}
		if level > a.RootLevel() {
			done, err := t.growRoot(ctx, level, sep, child)
			if err != nil || done {
				return err
			}
			continue
		}
		start := a.Leftmost[level]
		if level < len(path) && !path[level].IsZero() {
			start = path[level]
		}
		tg := target{key: sep}
		p, err := t.lockCovering(ctx, start, tg, lock.Exclusive)
		if errors.Is(err, errRestart) {
			t.Stats.Restarts.Add(1)
			path = nil
			continue
		}
		if err != nil {
			return err
		}
		ph := p.Self
		if p.IndexOf(child) >= 0 {
			t.s.Unlock(ph, lock.Exclusive)
			return nil // it is there already (a repair and an insert raced)
		}
		i, eq := p.Search(sep)
		if eq {
			t.s.Unlock(ph, lock.Exclusive)
			return fmt.Errorf("btree: separator %q already in node %v for another child", sep, ph)
		}
		// Only a live child without a downlink, still starting at sep, gets
		// one: while its downlink is missing nothing can remove it or move
		// its low bound, and we hold the only node the downlink could go
		// in. A split's own insertion checks too: Repair may have put the
		// downlink in first, and compression removed the child since.
		if c, err := t.s.Read(ctx, child); err != nil || c.Deleted || !bytes.Equal(c.Low, sep) {
			t.s.Unlock(ph, lock.Exclusive)
			return ignoreGone(err)
		}
		pp := p.Clone()
		pp.Keys = insertAt(pp.Keys, i, sep)
		pp.Kids = insertAt(pp.Kids, i, child)
		if t.fits(pp) {
			_, err := t.s.Commit(ctx, []*Node{pp}, nil, nil)
			t.s.Unlock(ph, lock.Exclusive)
			return err
		}
		nsep, right, _, err := t.split(ctx, pp, nil, trims{}, nil)
		t.s.Unlock(ph, lock.Exclusive)
		if err != nil {
			return err
		}
		level, sep, child, repair = level+1, nsep, right, false
	}
}

// growRoot makes a new root over the top level when a node there split (or
// a node there has no parent, after a crash). done false: the tree grew
// meanwhile; insert at level as usual.
func (t *Tree) growRoot(ctx context.Context, level int, sep []byte, child Handle) (bool, error) {
	a, err := t.s.LockAnchor(ctx)
	if err != nil {
		return false, err
	}
	defer t.s.Unlock(a.Self, lock.Exclusive)
	if level <= a.RootLevel() {
		return false, nil
	}
	if level != a.RootLevel()+1 || level >= MaxLevels {
		return false, fmt.Errorf("btree: a separator for level %d over a root at level %d", level, a.RootLevel())
	}
	rh, err := t.s.New(ctx)
	if err != nil {
		return false, err
	}
	root := &Node{Self: rh, Tree: t.id, Level: uint8(level), HighInf: true,
		Keys: [][]byte{nil, sep}, Kids: []Handle{a.Leftmost[level-1], child}}
	na := a.Clone()
	na.Leftmost = append(na.Leftmost, rh)
	na.Root = rh
	if _, err = t.s.Commit(ctx, []*Node{root}, na, nil); err != nil {
		t.s.Abandon(rh)
		return false, err
	}
	t.s.Unlock(rh, lock.Exclusive)
	t.Stats.RootSplits.Add(1)
	return true, nil
}

func insertAt[T any](s []T, i int, v T) []T {
	s = append(s, v)
	copy(s[i+1:], s[i:])
	s[i] = v
	return s
}

func removeAt[T any](s []T, i int) []T {
	return append(s[:i:i], s[i+1:]...)
}
