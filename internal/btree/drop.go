package btree

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/chunk"
	"github.com/grovestore/grove/internal/lock"
)

// A tree's drop, in three steps, each safe to cut off and to run again:
//
//  1. beginDrop marks the tree's anchor dropped, durably, under its lock:
//     the drop takes effect there (no operation starts on the tree after
//     it, on any server).
//  2. Then one decree removes the name and records the drop
//     (Directory.RecordDrop: a drop/ key with the entry and the mark's
//     time). A drop cut off between 1 and 2 is settled (settleDrop) by its
//     server's next dropper pass, a drop tried again, an operation that
//     finds the anchor dropped, or, if its server died, any server's
//     dropper pass that reads the anchor's chunk (settleListed).
//  3. DropWait after the mark, any server's dropper (finishDrops) frees
//     the tree's chunks from the leaves up, the anchor last, then removes
//     the drop's record and its first root's (Directory.Dropped). While
//     the record is there the collections of orphans disown, never free,
//     the anchor and first root (created.go): a creator that died before
//     its disown leaves them tagged.
//
// A creation's decree, with every attempt meta.Client.Update makes of it,
// ends within OpTimeout of the creation's start (Server.CreateTree bounds
// it, whatever its caller's context), well within DropWait: no attempt of
// it computed on a namespace read after the drop of the tree it made was
// finished (its drop/ and root/ keys gone) can list the freed anchor again
// (review 30). An attempt still in flight when Update gave up may land
// later, but only on the namespace version it was computed from (the
// config service refuses it after any change), so never after the drop.
// DropWait is computed from the finishing server's OpTimeout and clock:
// servers share OpTimeout (it is not configurable), and their clocks may
// differ by the minute DropWait allows for (as for operations in flight).
//
// The server and the simulator run these functions over their own
// Directory (the config service's, MetaDirectory; the simulator's
// stand-in, whose decrees lose their answers).

// beginDrop marks tree name's anchor dropped (through c), then removes the
// name from dir and records the drop. unsettled: the mark is made, the
// decree failed (the caller settles the drop later). decreeFails (tests)
// fails the decree as if it had.
func beginDrop(ctx context.Context, c *Cache, dir Directory, name string, decreeFails func() error) (e TreeEntry, unsettled bool, err error) {
	e, err = dir.Lookup(ctx, name)
	if err != nil {
		return TreeEntry{}, false, err
	}
	// First the anchor says "dropped", durably, under its lock (which
	// takes every server's cached anchor away): the drop takes effect
	// there, and no operation starts on the tree after it, on any server,
	// even one that still knows the tree by its name.
	if err := markDropped(ctx, c.Store(e.Anchor, e.NodeSize, nil)); errors.Is(err, ErrNoTree) {
		// The anchor is freed, yet the name is listed (a drop finished
		// under a name a creation's late attempt listed again, which
		// the bound on decrees rules out, or a defect): the drop is
		// recorded all the same, and its finish removes the records, so
		// that the name does not stay stuck. The tree's other chunks,
		// if any are left, are not reachable any more.
		c.log.Warn("dropping a listed tree whose anchor chunk is freed: its name and records go; any other chunk of it left allocated leaks", "tree", name, "anchor", e.Anchor)
	} else if err != nil {
		return TreeEntry{}, false, err
	}
	if decreeFails != nil {
		err = decreeFails() // (as if the decree failed)
	}
	if err == nil {
		err = dir.RecordDrop(ctx, e, time.Now())
	}
	if err != nil {
		return TreeEntry{}, !errors.Is(err, ErrNoTree), err
	}
	return e, false, nil
}

// errAnchorFreed marks an ErrNoTree whose anchor's chunk is freed (the
// drop finished), as against one marked dropped. It adds nothing to the
// error's text.
var errAnchorFreed = errors.New("")

// droppedAnchor reports whether listed tree e's anchor says dropped (read
// under its lock; not when it is freed: that is a finished drop's, or a
// defect's, and DropTree of the name handles it).
func droppedAnchor(ctx context.Context, c *Cache, e TreeEntry) bool {
	_, err := c.Store(e.Anchor, e.NodeSize, nil).Anchor(ctx)
	return errors.Is(err, ErrNoTree) && !errors.Is(err, errAnchorFreed)
}

// markDropped marks a tree's anchor dropped (nothing if it is already).
func markDropped(ctx context.Context, st *TreeStore) error {
	a, err := st.lockAnchor(ctx)
	if err != nil {
		return err
	}
	defer st.Unlock(st.anchor, lock.Exclusive)
	if a.Dropped {
		// Marked already, maybe by an earlier attempt here whose commit
		// was published and whose flush failed: the mark counts once it
		// is durable (a retry that said "marked" at once reported a drop
		// that a restart of this server, its log failed, took back:
		// TestDropMarkRetryWaitsForDurability; TestSimTreeDrop seeds
		// 474298 and 928708 in CI race runs). An anchor read from its
		// chunk has LSN 0: written back, so durable.
		return st.Durable(ctx, a.LSN)
	}
	na := a.Clone()
	na.Dropped = true
	lsn, err := st.Commit(ctx, nil, na, nil)
	if err != nil {
		return err
	}
	return st.Durable(ctx, lsn)
}

// dropTreeOps is a drop's decree on ns: the name goes, the drop is
// recorded with its mark's time (so that it is finished even if its server
// dies before it frees everything). applied false: the name no longer
// names e's tree (this drop's earlier attempt landed, or another drop).
func dropTreeOps(ns *pb.Namespace, e TreeEntry, marked time.Time) (ops []*pb.Op, applied bool, err error) {
	ts, err := Trees(ns)
	if err != nil {
		return nil, false, err
	}
	if x, ok := ts[e.Name]; !ok || x.Anchor != e.Anchor {
		return nil, false, nil
	}
	return []*pb.Op{{Kind: pb.Op_KIND_DELETE, Key: treeKey(e.Name)}, {Kind: pb.Op_KIND_PUT, Key: dropKey(e.Anchor),
		Value: encodeDrop(pendingDrop{TreeEntry: e, Marked: marked})}}, true, nil
}

// droppedDrop is dropTreeOps not applied: nil if ns records e's drop (an
// earlier attempt of it, or another server's settling of it), else
// ErrNoTree (dropped by another drop, and finished).
func droppedDrop(ns *pb.Namespace, e TreeEntry) error {
	for _, d := range pendingDrops(ns) {
		if d.Anchor == e.Anchor {
			return nil
		}
	}
	return fmt.Errorf("%w: %q (dropped meanwhile)", ErrNoTree, e.Name)
}

// droppedOps is a finished drop's decree: its record and its first
// root's (created.go) go.
func droppedOps(ns *pb.Namespace, anchor Handle) []*pb.Op {
	var ops []*pb.Op
	for _, kv := range ns.GetEntries() {
		if kv.Key == dropKey(anchor) || kv.Key == rootKey(anchor) {
			ops = append(ops, &pb.Op{Kind: pb.Op_KIND_DELETE, Key: kv.Key})
		}
	}
	return ops
}

// settleDrop finishes the directory's side of a drop cut off between its
// two steps: tree name's anchor says dropped (an operation found it so),
// but the directory still lists it. The name goes and the drop is
// recorded, as beginDrop would have done. settled: this call did it.
// It fails only if it could not find out or could not settle.
func settleDrop(ctx context.Context, c *Cache, dir Directory, name string) (settled bool, err error) {
	e, err := dir.Lookup(ctx, name)
	if errors.Is(err, ErrNoTree) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	if _, err := c.Store(e.Anchor, e.NodeSize, nil).Anchor(ctx); err == nil {
		return false, nil // a live tree (a new one of the same name)
	} else if !errors.Is(err, ErrNoTree) {
		return false, err
	}
	err = dir.RecordDrop(ctx, e, time.Now())
	if errors.Is(err, ErrNoTree) {
		return false, nil // settled by another
	}
	return err == nil, err
}

// settleListed settles (settleDrop) every tree dir lists for which mine
// is true (nil: every tree) whose anchor's chunk says dropped: a drop whose
// server died between the anchor's mark and the decree leaves the name
// listed, and the tree's chunks allocated, until a DropTree or an
// operation on the tree settles it, or this (every server's dropper runs
// it on the trees it repairs, and on every tree every RepairBackstop-th
// pass). The anchors are read from their chunks, without their locks (a
// filter: settleDrop looks again under the lock; an anchor never goes from
// dropped back to live): a mark still only in a live server's cache is
// that server's to settle (its dropper keeps the names whose decree
// failed), and a dead server's is written to the chunk by the replay of
// its log. Each anchor's read, and each settling, is bounded by wait, so
// that an anchor on a chunk pair that is down costs the pass at most wait.
// It returns how many it settled, how many anchors it could not read (a
// pair down, or freed: a DropTree of such a name records its drop), and
// the first failure to settle or to list.
func settleListed(ctx context.Context, c *Cache, dir Directory, mine func(string) bool, wait time.Duration) (settled, unreadable int, err error) {
	ts, err := dir.Trees(ctx)
	if err != nil {
		return 0, 0, err
	}
	names := make([]string, 0, len(ts))
	for name := range ts {
		if mine == nil || mine(name) {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	for _, name := range names {
		if ctx.Err() != nil {
			break
		}
		e := ts[name]
		rctx, cancel := context.WithTimeout(ctx, wait)
		b, rerr := c.cfg.Chunks.Read(rctx, e.Anchor, AnchorSize)
		cancel()
		if rerr != nil {
			unreadable++
			continue
		}
		if a, derr := DecodeAnchor(b, e.Anchor); derr != nil || !a.Dropped {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, wait)
		ok, serr := settleDrop(sctx, c, dir, name)
		cancel()
		if serr != nil && err == nil {
			err = fmt.Errorf("settling tree %q's drop: %w", name, serr)
		}
		if ok {
			settled++
		}
	}
	return settled, unreadable, err
}

// dropPassSteps is what every dropper pass (the server's, the
// simulator's) does after settling its own cut-off drops: finish the drops
// minAge old (finishDrops, telling finished of each), then settle the
// listed trees mine chooses whose anchor says dropped (settleListed, each
// anchor within wait). Each step has budget of its own, so that one held
// up (an anchor on a chunk pair that is down, a directory that does not
// answer) does not starve the other (review 31).
func dropPassSteps(ctx context.Context, c *Cache, dir Directory, free func(context.Context, Handle) error, minAge, budget time.Duration,
	finished func(TreeEntry, error), mine func(string) bool, wait time.Duration) (settled, unreadable int, finishErr, settleErr error) {
	fctx, cancel := context.WithTimeout(ctx, budget)
	finishErr = finishDrops(fctx, c, dir, free, minAge, finished)
	cancel()
	sctx, cancel := context.WithTimeout(ctx, budget)
	settled, unreadable, settleErr = settleListed(sctx, c, dir, mine, wait)
	cancel()
	return settled, unreadable, finishErr, settleErr
}

// finishDrops finishes every drop dir records that was marked at least
// minAge ago (finishDrop), telling done of each (err nil: finished). It
// fails only if it could not list the drops.
func finishDrops(ctx context.Context, c *Cache, dir Directory, free func(context.Context, Handle) error, minAge time.Duration, done func(TreeEntry, error)) error {
	ds, err := dir.Drops(ctx)
	if err != nil {
		return fmt.Errorf("btree: listing the drops under way: %w", err)
	}
	for _, d := range ds {
		if time.Since(d.Marked) < minAge {
			continue
		}
		done(d.TreeEntry, finishDrop(ctx, c, dir, free, d.TreeEntry))
	}
	return nil
}

// finishDrop frees a dropped tree's chunks, then removes its drop record.
// Chunks are freed level by level from the leaves up, the removed nodes
// of a node's garbage list before it, the anchor last: a drop cut off and
// resumed finds every chunk not yet freed from the anchor down.
func finishDrop(ctx context.Context, c *Cache, dir Directory, free func(context.Context, Handle) error, e TreeEntry) error {
	st := c.Store(e.Anchor, e.NodeSize, nil)
	if err := markDropped(ctx, st); errors.Is(err, ErrGone) || errors.Is(err, ErrNoTree) {
		return dir.Dropped(ctx, e) // another server finished it
	} else if err != nil {
		return err
	}
	// The anchor's image, not its lock: after the mark and DropWait
	// nothing changes the tree (no operation starts on a dropped anchor,
	// and every one that began before has ended), so the walk needs no
	// lock, and servers that still know the tree by name read the dropped
	// anchor meanwhile and look the name up again.
	if err := freeDropped(ctx, st, free); err != nil {
		return err
	}
	return dir.Dropped(ctx, e)
}

// freeDropped frees the chunks of a tree whose anchor is marked dropped
// (markDropped), DropWait after the mark: its nodes in dropOrder, then
// its anchor (nothing if another server freed it already).
func freeDropped(ctx context.Context, st *TreeStore, free func(context.Context, Handle) error) error {
	a, err := st.lockAnchor(ctx)
	if errors.Is(err, ErrGone) || errors.Is(err, ErrNoTree) {
		return nil
	}
	if err != nil {
		return err
	}
	st.Unlock(st.anchor, lock.Exclusive)
	if !a.Dropped {
		return fmt.Errorf("btree: freeing tree %v, whose anchor is not marked dropped", st.anchor)
	}
	order, err := dropOrder(ctx, st, a)
	if err != nil {
		return err
	}
	for _, h := range append(order, st.anchor) {
		if err := free(ctx, h); err != nil && !errors.Is(err, chunk.ErrUnallocated) {
			return err
		}
		st.c.Drop(h)
	}
	return nil
}

// RecordDrop implements Directory.
func (d MetaDirectory) RecordDrop(ctx context.Context, e TreeEntry, marked time.Time) error {
	var notApplied error
	_, err := d.Meta.Update(ctx, Namespace, "drop tree "+e.Name, func(ns *pb.Namespace) (ops []*pb.Op, err error) {
		ops, applied, err := dropTreeOps(ns, e, marked)
		notApplied = nil
		if err == nil && !applied {
			// Recorded already (another server settled this drop, or
			// an attempt of this call landed) or dropped by another
			// drop: read on the namespace the decree was computed
			// from (review 30: a second read could fail, or see the
			// drop finished meanwhile).
			notApplied = droppedDrop(ns, e)
		}
		return ops, err
	})
	if err == nil {
		return notApplied
	}
	return err
}

// Drops implements Directory.
func (d MetaDirectory) Drops(ctx context.Context) ([]pendingDrop, error) {
	ns, err := d.Meta.Read(ctx, Namespace)
	if err != nil {
		return nil, err
	}
	return pendingDrops(ns), nil
}

// Dropped implements Directory.
func (d MetaDirectory) Dropped(ctx context.Context, e TreeEntry) error {
	_, err := d.Meta.Update(ctx, Namespace, "dropped tree "+e.Name, func(ns *pb.Namespace) ([]*pb.Op, error) {
		return droppedOps(ns, e.Anchor), nil
	})
	return err
}
