package btree

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/grovestore/grove/internal/lock"
)

// Compression (Sagiv): a node left under half full is merged with, or
// given entries from, its neighbour under the same parent, holding three
// locks: the parent, then the left node, then the right one. A merge moves
// the right node's entries into the left one and removes the right node:
// its image stays, marked Deleted with Onward naming the left node, so
// that an operation that read a pointer to it before finds the keys; the
// left node lists it as garbage, and its chunk is freed once Grace has
// passed. Leftmost nodes are never removed, so the anchor does not change.
//
// Policy: compression of a node runs when a delete leaves it under half
// full (Config.Underfull queues it; the server runs the queue in the
// background), and a periodic pass (Repair) walks the whole tree to free
// removed nodes past their grace period, put back downlinks a crash left
// missing, and compress what the queue missed.

// Compress compresses the node at level that covers key with a neighbour
// under the same parent, if either is under-full. It reports whether it
// changed anything.
func (t *Tree) Compress(ctx context.Context, level int, key []byte) (bool, error) {
	a, err := t.s.Anchor(ctx)
	if err != nil {
		return false, err
	}
	if level >= a.RootLevel() {
		return false, nil // the root has no neighbour
	}
	tg := target{key: key}
	pn, _, err := t.locate(ctx, tg, level+1)
	if err != nil {
		return false, err
	}
	p, err := t.lockCovering(ctx, pn.Self, tg, lock.Exclusive)
	if errors.Is(err, errRestart) {
		return false, nil // a compression moved it meanwhile: the hint is stale
	}
	if err != nil {
		return false, err
	}
	ph := p.Self
	if len(p.Kids) < 2 {
		t.s.Unlock(ph, lock.Exclusive)
		return false, nil
	}
	i := p.Child(key)
	if i == len(p.Kids)-1 {
		i--
	}
	pp, err := t.compressPair(ctx, p, i)
	t.s.Unlock(ph, lock.Exclusive)
	if pp != nil && t.cfg.Underfull != nil && t.underfull(pp) {
		t.cfg.Underfull(level+1, key) // the parent lost an entry: compress it in turn
	}
	return pp != nil, err
}

// compressPair works on children i and i+1 of p, which the caller holds
// exclusively. It returns p's new image if it changed anything.
func (t *Tree) compressPair(ctx context.Context, p *Node, i int) (*Node, error) {
	ah, bh := p.Kids[i], p.Kids[i+1]
	a, err := t.s.Lock(ctx, ah, lock.Exclusive)
	if err != nil {
		return nil, ignoreGone(err)
	}
	defer t.s.Unlock(ah, lock.Exclusive)
	if a.Deleted || a.Right != bh {
		// A split of a is under way (its right half has no downlink yet):
		// leave the pair to a later pass.
		return nil, nil
	}
	b, err := t.s.Lock(ctx, bh, lock.Exclusive)
	if err != nil {
		return nil, ignoreGone(err)
	}
	defer t.s.Unlock(bh, lock.Exclusive)
	if b.Deleted || !bytes.Equal(b.Low, p.Keys[i+1]) || !bytes.Equal(a.High, b.Low) {
		panic(fmt.Sprintf("btree: children %v and %v of %v disagree with it (b deleted %v, low %q, separator %q, a's high %q)",
			ah, bh, p.Self, b.Deleted, b.Low, p.Keys[i+1], a.High))
	}
	if !t.underfull(a) && !t.underfull(b) {
		return nil, nil
	}
	now := t.s.Now()
	m := a.Clone()
	if m.Leaf() {
		m.appendEntries(b)
	} else {
		m.Keys = append(m.Keys, b.Keys...)
		m.Kids = append(m.Kids, b.Kids...)
	}
	m.High, m.HighInf, m.Right = b.High, b.HighInf, b.Right
	if m.Leaf() {
		// The records follow their keys (completion.go): b's go with
		// its entries, and the pair's horizon is the larger.
		if t.unsafeDone != unsafeDoneMergeDrops {
			m.Done = append(m.Done, b.Done...)
			m.Floors = mergeFloors(a.Floors, b.Floors)
		}
		m.Horizon = max(a.Horizon, b.Horizon)
	}
	m.Garbage = append(m.Garbage, b.Garbage...)
	m.Garbage = append(m.Garbage, Garbage{Node: bh, Deadline: now + int64(t.cfg.Grace)})
	pp := p.Clone()
	if t.mergeable(m) && len(m.Garbage) <= MaxGarbage {
		gone := &Node{Self: bh, Tree: t.id, Level: b.Level, Deleted: true, Onward: ah, Low: b.Low, High: b.High, HighInf: b.HighInf}
		pp.Keys = removeAt(pp.Keys, i+1)
		pp.Kids = removeAt(pp.Kids, i+1)
		var tc trims
		t.trimDone(m, &tc)
		if _, err := t.s.Commit(ctx, []*Node{m, gone, pp}, nil, nil); err != nil {
			return nil, err
		}
		t.count(tc)
		if err := t.at("merge", int(m.Level)); err != nil {
			return nil, err
		}
		t.Stats.Merges.Add(1)
		return pp, nil
	}
	// Rebalance: split the pair's entries again, at the middle by bytes.
	// Keys that move left leave b's range: an operation that meets b with
	// such a key sees it below b's low bound and starts again.
	all := a.Clone()
	all.Keys = m.Keys
	all.Vals, all.Kids, all.Ext = m.Vals, m.Kids, m.Ext
	mid := t.splitPoint(all)
	if mid == len(a.Keys) || mid < 1 || mid >= len(all.Keys) {
		// Nothing moves, or a half would be empty (a pair of one entry:
		// an empty node beside a node of one key, whose merge the full
		// garbage list declined): leave it for a pass after the grace.
		return nil, nil
	}
	na, nb := a.Clone(), b.Clone()
	na.Keys = append([][]byte(nil), all.Keys[:mid]...)
	nb.Keys = append([][]byte(nil), all.Keys[mid:]...)
	if a.Leaf() {
		na.Vals = append([][]byte(nil), all.Vals[:mid]...)
		nb.Vals = append([][]byte(nil), all.Vals[mid:]...)
		na.Ext, nb.Ext = all.extRange(0, mid), all.extRange(mid, len(all.Keys))
	} else {
		na.Kids = append([]Handle(nil), all.Kids[:mid]...)
		nb.Kids = append([]Handle(nil), all.Kids[mid:]...)
	}
	sep := nb.Keys[0]
	na.High, nb.Low = sep, sep
	var tc trims
	if a.Leaf() {
		// Keys move across the separator: so do their records.
		splitDone(m.Done, m.Floors, m.Horizon, na, nb)
		if t.unsafeDone == unsafeDoneRebalanceDrops {
			na.Done, nb.Done = keepOwn(na.Done, a.Done), keepOwn(nb.Done, b.Done)
		}
		t.trimDone(na, &tc)
		t.trimDone(nb, &tc)
	}
	pp.Keys[i+1] = sep
	if !t.fits(na) || !t.fits(nb) || !t.fits(pp) {
		return nil, nil // the new separator does not fit the parent, or a half is too big: leave it
	}
	if _, err := t.s.Commit(ctx, []*Node{na, nb, pp}, nil, nil); err != nil {
		return nil, err
	}
	t.count(tc)
	if err := t.at("rebalance", int(na.Level)); err != nil {
		return nil, err
	}
	t.Stats.Rebalances.Add(1)
	return pp, nil
}

func ignoreGone(err error) error {
	if errors.Is(err, ErrGone) {
		return nil
	}
	return err
}

// RepairReport says what a Repair pass did.
type RepairReport struct {
	Nodes      int // nodes visited
	Downlinks  int // missing downlinks put back
	Compressed int // pairs merged or rebalanced
	Freed      int // removed nodes freed
}

// Repair walks the whole tree, level by level from the top: it grows a
// root over a top level that has more than one node, puts back every
// missing downlink (a split whose separator never reached the parent,
// because its server died or its operation was cancelled), compresses
// under-full pairs, and frees removed nodes whose grace period is over.
// It runs beside every other operation.
func (t *Tree) Repair(ctx context.Context) (RepairReport, error) {
	var rep RepairReport
	a, err := t.s.Anchor(ctx)
	if err != nil {
		return rep, err
	}
	for level := a.RootLevel(); level >= 0; level-- {
		h := a.Leftmost[level]
		var prev *Node // the previous live node at this level
		stale := 0
		for steps := 0; !h.IsZero(); steps++ {
			if err := ctx.Err(); err != nil {
				return rep, err
			}
			if steps > 1_000_000 {
				return rep, fmt.Errorf("btree: repair: level %d's chain does not end (at node %v)", level, h)
			}
			n, err := t.s.Read(ctx, h)
			if errors.Is(err, ErrGone) {
				break // the level changed under us: the next pass goes on
			}
			if err != nil {
				return rep, err
			}
			rep.Nodes++
			if n.Deleted {
				// Removed since we read the link that led here: read the
				// previous node again and go on from its current link (the
				// leftmost node of a level is never removed).
				if prev == nil {
					break
				}
				if stale++; stale > 100 {
					break // the level keeps changing under us: the next pass goes on
				}
				h, prev = prev.Self, nil
				continue
			}
			if len(n.Garbage) > 0 && n.Garbage[0].Deadline <= t.s.Now() {
				k, err := t.sweep(ctx, n)
				if err != nil {
					return rep, err
				}
				rep.Freed += k
			}
			if level == a.RootLevel() && !n.Right.IsZero() {
				// A top level of several nodes: the root split and the new
				// root was never made.
				r, err := t.s.Read(ctx, n.Right)
				if err == nil && !r.Deleted {
					if err := t.insertSeparator(ctx, level+1, r.Low, r.Self, nil, true); err != nil {
						return rep, err
					}
					rep.Downlinks++
					t.Stats.Repairs.Add(1)
				}
			}
			if level > 0 {
				if err := t.repairBelow(ctx, n, &rep); err != nil {
					return rep, err
				}
			}
			prev = n
			h = n.Right
		}
	}
	t.Stats.Passes.Add(1)
	return rep, nil
}

// repairBelow checks the children of internal node p (an image read
// without locks): each child's right link must lead to the next child (or
// to the first child of p's right neighbour, for the last); a node between
// is missing its downlink. Under-full children are compressed.
func (t *Tree) repairBelow(ctx context.Context, p *Node, rep *RepairReport) error {
	if p.Leaf() {
		return nil
	}
	for i, ch := range p.Kids {
		c, err := t.s.Read(ctx, ch)
		if errors.Is(err, ErrGone) {
			return nil
		}
		if err != nil {
			return err
		}
		if c.Deleted {
			return nil // p's image is stale; the next pass sees the new one
		}
		var next Handle
		if i+1 < len(p.Kids) {
			next = p.Kids[i+1]
		}
		if !c.Right.IsZero() && c.Right != next && (p.HighInf || bytes.Compare(c.High, p.High) < 0) {
			// c's right neighbour is inside p's range but not p's child.
			r, err := t.s.Read(ctx, c.Right)
			if err == nil && !r.Deleted {
				if err := t.insertSeparator(ctx, int(p.Level), r.Low, r.Self, nil, true); err != nil {
					return err
				}
				rep.Downlinks++
				t.Stats.Repairs.Add(1)
				return nil // p changed: leave the rest of it to the next pass
			}
		}
		if t.underfull(c) && len(p.Kids) > 1 {
			changed, err := t.Compress(ctx, int(c.Level), c.Low)
			if err != nil {
				return err
			}
			if changed {
				rep.Compressed++
				return nil // p changed
			}
		}
	}
	return nil
}

// sweep frees the garbage of n whose grace period is over, holding n's
// lock: the chunks first, then n's list (a crash between frees them again,
// which succeeds).
func (t *Tree) sweep(ctx context.Context, n *Node) (int, error) {
	l, err := t.s.Lock(ctx, n.Self, lock.Exclusive)
	if err != nil {
		return 0, ignoreGone(err)
	}
	defer t.s.Unlock(n.Self, lock.Exclusive)
	if l.Deleted {
		return 0, nil
	}
	now := t.s.Now()
	keep := l.Garbage[:0:0]
	freed := 0
	for _, g := range l.Garbage {
		if g.Deadline > now {
			keep = append(keep, g)
			continue
		}
		if err := t.s.Free(ctx, g.Node); err != nil {
			return freed, err
		}
		freed++
	}
	if freed == 0 {
		return 0, nil
	}
	nn := l.Clone()
	nn.Garbage = keep
	if _, err := t.s.Commit(ctx, []*Node{nn}, nil, nil); err != nil {
		return freed, err
	}
	t.Stats.Freed.Add(uint64(freed))
	return freed, nil
}
