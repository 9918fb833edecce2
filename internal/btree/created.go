package btree

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/chunk"
	"github.com/grovestore/grove/internal/lock"
	"github.com/grovestore/grove/internal/meta"
)

// A new tree's chunks and the collection of a log's orphans.
//
// CreateTree allocates a tree's anchor and first root tagged with its
// server's owner (its log and its token on it, chunk.Owner), as every
// other chunk a server allocates: a server that dies between the
// allocation and the directory's decree leaves them to the collection of
// its log's orphans (collectOrphans), which frees them, where untagged
// chunks would leak for ever. Once the decree names the tree, the server
// disowns them. Until then, and if it dies before, the directory is what
// says they are no orphans: the collection disowns, instead of freeing,
// every chunk the directory names (an anchor of a tree or of a drop under
// way, and the first root of either, rootKey).
//
// That is safe only if no decree naming a chunk lands after the
// collection read the directory. So the collection first retires the
// log's earlier holders in the directory too (retiredKey, by decree), and
// a creation's decree is conditional on its owner not being retired
// (createTreeOps): the config service orders the two decrees, and its
// read-modify-decree loop (meta.Client.Update) makes each conditional on
// the namespace it read. A creation's decree that landed before the mark
// is seen by the read after it; one after the mark is refused, and its
// chunks, tagged and unnamed, are the collection's to free.
//
// A server's own stray collection (Cache.CollectStrays) lists the chunks
// of the log's earlier holders too; it leaves alone what the directory
// names, and it frees nothing until the directory retired those holders
// (Server.named).

// rootKey records tree anchor's first root, the leaf CreateTree made: the
// leftmost leaf for ever (leftmost nodes are never removed), so a live
// chunk while the tree, or its drop, is listed. The value is the root's
// handle (putHandle, rootRecordLen bytes). Written by the creation's decree, deleted with the
// drop's record (finishDrop). Trees made before it have none: their
// chunks were never tagged.
func rootKey(anchor Handle) string { return fmt.Sprintf("root/%d-%d", anchor.CM, anchor.ID) }

// rootRecordLen is a root record's length: u32 CM, u64 ID.
const rootRecordLen = 12

// retiredKey records, for log (OwnerLog), the token below which the
// log's holders may no longer create a tree: u64 epoch, u64 seq.
func retiredKey(log uint64) string { return "retired/" + strconv.FormatUint(log, 10) }

func encodeToken(t lock.Token) []byte {
	return binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, uint64(t.Epoch)), t.Seq)
}

// retiredBelow is log's mark in directory ns (zero: none). A mark that
// does not decode is an error: a creation is then refused (not let
// through as unmarked), and the next retirement replaces it.
func retiredBelow(ns *pb.Namespace, log uint64) (lock.Token, error) {
	key := retiredKey(log)
	for _, kv := range ns.GetEntries() {
		if kv.Key != key {
			continue
		}
		if len(kv.Value) != 16 {
			return lock.Token{}, fmt.Errorf("btree: directory key %q: a %d-byte mark", key, len(kv.Value))
		}
		return lock.Token{Epoch: lock.Epoch(binary.LittleEndian.Uint64(kv.Value)), Seq: binary.LittleEndian.Uint64(kv.Value[8:])}, nil
	}
	return lock.Token{}, nil
}

// ErrCreatorRetired refuses a tree creation by a server whose log has a
// newer holder (a recovery of it ran, or its next incarnation started):
// the creation's chunks are that holder's to free.
var ErrCreatorRetired = errors.New("btree: this server's log has a newer holder: it may not create a tree")

// errTestStop ends a CreateTree that a test stopped (Server.testCreateStop).
var errTestStop = errors.New("btree: stopped by a test")

// createTreeOps is CreateTree's decree for entry e, first root root,
// created by owner (zero: untagged chunks), over directory ns: put the
// entry and its root's record, or nothing if the name is taken (existing:
// the entry that has it). The config-service client runs it again when an
// attempt's answer was lost; if that attempt committed, the name is taken
// by e itself (its anchor is this call's, never reused): that is success,
// not a clash — else the caller would free the anchor and root the
// directory now names. A retired owner is refused (ErrCreatorRetired),
// unless its own earlier attempt committed.
func createTreeOps(ns *pb.Namespace, e TreeEntry, root Handle, owner chunk.Owner) ([]*pb.Op, *TreeEntry, error) {
	ts, err := Trees(ns)
	if err != nil {
		return nil, nil, err
	}
	if x, ok := ts[e.Name]; ok && x.Anchor == e.Anchor {
		return nil, nil, nil // our own earlier attempt
	}
	for _, kv := range ns.GetEntries() {
		if kv.Key == dropKey(e.Anchor) || kv.Key == rootKey(e.Anchor) {
			// Our own earlier attempt too, and the tree dropped since
			// (review 28): only this call's decree names this anchor.
			// Success (a creation, then a drop); its chunks are the
			// drop's to free.
			return nil, nil, nil
		}
	}
	if x, ok := ts[e.Name]; ok {
		return nil, &x, nil
	}
	if !owner.IsZero() {
		mark, err := retiredBelow(ns, owner.Log)
		if err != nil {
			return nil, nil, err
		}
		if owner.Token.Less(mark) {
			return nil, nil, fmt.Errorf("%w (log %d, token %v, retired below %v)", ErrCreatorRetired, owner.Log, owner.Token, mark)
		}
	}
	ops := []*pb.Op{{Kind: pb.Op_KIND_PUT, Key: treeKey(e.Name), Value: encodeEntry(e)}}
	if !root.IsZero() {
		v := make([]byte, rootRecordLen)
		putHandle(v, root)
		ops = append(ops, &pb.Op{Kind: pb.Op_KIND_PUT, Key: rootKey(e.Anchor), Value: v})
	}
	return ops, nil, nil
}

// retireCreatorsOps raises log's mark in ns to below (nothing if it is
// there already).
func retireCreatorsOps(ns *pb.Namespace, log uint64, below lock.Token) []*pb.Op {
	if mark, err := retiredBelow(ns, log); err == nil && !mark.Less(below) {
		return nil
	}
	return []*pb.Op{{Kind: pb.Op_KIND_PUT, Key: retiredKey(log), Value: encodeToken(below)}}
}

// namedChunks is every chunk directory ns names: the anchors of its trees
// and of its drops under way, and their first roots.
func namedChunks(ns *pb.Namespace) (map[Handle]bool, error) {
	ts, err := Trees(ns)
	if err != nil {
		return nil, err
	}
	out := map[Handle]bool{}
	anchors := map[string]bool{}
	for _, e := range ts {
		out[e.Anchor] = true
		anchors[rootKey(e.Anchor)] = true
	}
	for _, d := range pendingDrops(ns) {
		out[d.Anchor] = true
		anchors[rootKey(d.Anchor)] = true
	}
	for _, kv := range ns.GetEntries() {
		if !strings.HasPrefix(kv.Key, "root/") || !anchors[kv.Key] {
			continue // (a record of no listed anchor stops nothing)
		}
		if len(kv.Value) != rootRecordLen {
			return nil, fmt.Errorf("btree: directory key %q: a %d-byte root record", kv.Key, len(kv.Value))
		}
		out[getHandle(kv.Value)] = true
	}
	return out, nil
}

// createTree makes tree name on cache c's server, through dir, writing
// the new chunks with write; stop (tests) ends it at a stage as if the
// server died there ("written": before the decree; "decreed": before the
// disown).
func createTree(ctx context.Context, c *Cache, dir Directory, write func(ctx context.Context, h Handle, img []byte) error, name string, cfg Config,
	stop func(stage string, anchor, root Handle) bool) (TreeEntry, error) {
	if err := CheckTreeName(name); err != nil {
		return TreeEntry{}, err
	}
	if err := cfg.fill(); err != nil {
		return TreeEntry{}, err
	}
	if e, err := dir.Lookup(ctx, name); err == nil {
		// A tree whose drop was cut off between its mark and its
		// decree still holds the name: its drop is settled first (as
		// the dropper would), and the name is free if nothing else took
		// it meanwhile.
		if !droppedAnchor(ctx, c, e) {
			return e, fmt.Errorf("%w: %q", ErrTreeExists, name)
		}
		if _, err := settleDrop(ctx, c, dir, name); err != nil {
			return e, fmt.Errorf("btree: settling the drop of the tree that holds the name %q: %w", name, err)
		}
		if e, err := dir.Lookup(ctx, name); err == nil {
			return e, fmt.Errorf("%w: %q", ErrTreeExists, name)
		} else if !errors.Is(err, ErrNoTree) {
			return TreeEntry{}, err
		}
	} else if !errors.Is(err, ErrNoTree) {
		return TreeEntry{}, err
	}
	ah, err := c.allocate(ctx, AnchorSize)
	if err != nil {
		return TreeEntry{}, fmt.Errorf("btree: allocating the anchor: %w", err)
	}
	rh, err := c.allocate(ctx, uint64(cfg.NodeSize))
	if err != nil {
		_ = c.giveBack(ah)
		return TreeEntry{}, fmt.Errorf("btree: allocating the root: %w", err)
	}
	undo := func() {
		_ = c.giveBack(rh)
		_ = c.giveBack(ah)
	}
	a, root := Init(ah, rh)
	if err := write(ctx, rh, root.Encode(nil)); err != nil {
		undo()
		return TreeEntry{}, err
	}
	if err := write(ctx, ah, a.Encode(nil)); err != nil {
		undo()
		return TreeEntry{}, err
	}
	if stop != nil && stop("written", ah, rh) {
		return TreeEntry{}, errTestStop
	}
	e := TreeEntry{Name: name, Anchor: ah, NodeSize: cfg.NodeSize, MaxFanout: cfg.MaxFanout}
	var owner chunk.Owner
	if c.cfg.Owner != nil {
		owner = c.cfg.Owner()
	}
	existing, err := dir.Create(ctx, e, rh, owner)
	switch {
	case errors.Is(err, ErrCreatorRetired):
		// A zombie: refused, nothing made (a client tries another node).
		undo()
		return TreeEntry{}, fmt.Errorf("btree: recording tree %q: %w (%w)", name, err, ErrNotApplied)
	case err != nil:
		// The decree may have landed all the same (its answer lost, the
		// client gave up): the chunks stay tagged and known to this
		// server; the log's next holder frees them, or disowns them if
		// the directory names them.
		return TreeEntry{}, fmt.Errorf("btree: recording tree %q: %w", name, err)
	case existing != nil:
		undo()
		return *existing, fmt.Errorf("%w: %q", ErrTreeExists, name)
	}
	if stop != nil && stop("decreed", ah, rh) {
		return TreeEntry{}, errTestStop
	}
	c.disownCreated(ah, rh)
	return e, nil
}

// Directory is the tree directory as creations and the collections of
// orphans need it (nil for a collection: a test or simulation whose
// trees' chunks are untagged).
type Directory interface {
	// Lookup finds tree name (ErrNoTree).
	Lookup(ctx context.Context, name string) (TreeEntry, error)
	// Trees lists the trees.
	Trees(ctx context.Context) (map[string]TreeEntry, error)
	// Create records tree e, its first root root, made by owner, by
	// decree (createTreeOps): existing is the entry that has the name if
	// it is taken; ErrCreatorRetired if owner is retired.
	Create(ctx context.Context, e TreeEntry, root Handle, owner chunk.Owner) (existing *TreeEntry, err error)
	// RetireCreators makes the directory refuse, from its answer on,
	// every tree creation by a holder of log whose token is below below.
	RetireCreators(ctx context.Context, log uint64, below lock.Token) error
	// Named returns every chunk the directory names (namedChunks).
	Named(ctx context.Context) (map[Handle]bool, error)
	// RecordDrop removes tree e's name and records its drop, marked at
	// marked, by decree (dropTreeOps): ErrNoTree if the name no longer
	// names e's tree and no drop of it is recorded.
	RecordDrop(ctx context.Context, e TreeEntry, marked time.Time) error
	// Drops lists the drops under way.
	Drops(ctx context.Context) ([]pendingDrop, error)
	// Dropped removes tree e's drop record and its first root's, by
	// decree (droppedOps): its chunks are freed.
	Dropped(ctx context.Context, e TreeEntry) error
}

// MetaDirectory is the tree directory in the config service.
type MetaDirectory struct{ Meta *meta.Client }

// Lookup implements Directory.
func (d MetaDirectory) Lookup(ctx context.Context, name string) (TreeEntry, error) {
	return LookupTree(ctx, d.Meta, name)
}

// Trees implements Directory.
func (d MetaDirectory) Trees(ctx context.Context) (map[string]TreeEntry, error) {
	ns, err := d.Meta.Read(ctx, Namespace)
	if err != nil {
		return nil, err
	}
	return Trees(ns)
}

// Create implements Directory.
func (d MetaDirectory) Create(ctx context.Context, e TreeEntry, root Handle, owner chunk.Owner) (*TreeEntry, error) {
	var existing *TreeEntry
	_, err := d.Meta.Update(ctx, Namespace, "tree "+e.Name, func(ns *pb.Namespace) (ops []*pb.Op, err error) {
		ops, existing, err = createTreeOps(ns, e, root, owner)
		return ops, err
	})
	return existing, err
}

// RetireCreators implements Directory.
func (d MetaDirectory) RetireCreators(ctx context.Context, log uint64, below lock.Token) error {
	_, err := d.Meta.Update(ctx, Namespace, fmt.Sprintf("retire tree creators of log %d below %v", log, below), func(ns *pb.Namespace) ([]*pb.Op, error) {
		return retireCreatorsOps(ns, log, below), nil
	})
	return err
}

// Named implements Directory.
func (d MetaDirectory) Named(ctx context.Context) (map[Handle]bool, error) {
	ns, err := d.Meta.Read(ctx, Namespace)
	if err != nil {
		return nil, err
	}
	return namedChunks(ns)
}

// named is the stray collection's CacheConfig.Named (namedAfterRetiring
// over the config service's directory).
func (s *Server) named(ctx context.Context) (map[Handle]bool, error) {
	return namedAfterRetiring(ctx, MetaDirectory{s.cfg.Meta}, s.cache.cfg.Owner(), &s.creatorsRetired)
}

// namedAfterRetiring returns the chunks dir names, once dir refuses
// creations by the holders of owner's log before owner (the start's
// collection of orphans makes that mark too; this server makes it itself
// the first time, retired then set): else an earlier holder's creation
// still in flight could land after the read and name a chunk the stray
// collection then frees.
func namedAfterRetiring(ctx context.Context, dir Directory, owner chunk.Owner, retired *atomic.Bool) (map[Handle]bool, error) {
	if !retired.Load() {
		if err := dir.RetireCreators(ctx, owner.Log, owner.Token); err != nil {
			return nil, fmt.Errorf("retiring this log's earlier holders in the tree directory: %w", err)
		}
		retired.Store(true)
	}
	return dir.Named(ctx)
}
