package btree

import (
	"bytes"
	"context"
	"fmt"
)

// Reader reads a tree's images (a Store does; so does a reader of chunks
// that bypasses every cache).
type Reader interface {
	Anchor(ctx context.Context) (*Anchor, error)
	Read(ctx context.Context, h Handle) (*Node, error)
	ReadValue(ctx context.Context, r ValueRef) ([]byte, error)
}

// Shape is what Walk found.
type Shape struct {
	Height  int // levels
	Nodes   int // live nodes
	Removed int // removed nodes waiting in garbage lists
	Keys    []([]byte)
	Vals    [][]byte
	Values  int             // values in chunks of their own
	Chunks  map[Handle]bool // every chunk the tree uses: anchor, live and removed nodes, values
	Missing int             // live nodes without a downlink (after a crash, before Repair)
}

// Walk checks a quiescent tree's structure, independently of the
// algorithm, and returns its entries. It checks: every level is a chain of
// live nodes from its leftmost one, at the right level, whose bounds join
// (first low empty, each high the next low, the last unbounded), with keys
// sorted inside the bounds; every internal node's children, in order, are
// nodes of the level below in chain order, each separator the child's low
// bound; every node of a level is some parent's child, unless complete is
// false (a crash may leave downlinks missing: they are counted); the root
// is the top level's only node (unless complete is false); garbage lists
// name removed nodes, each once.
//
// Walk reads every value in a chunk of its own too (its length, checksum
// and identity checked), for tests and offline checks of a quiescent tree.
func Walk(ctx context.Context, r Reader, complete bool) (Shape, error) {
	return walk(ctx, r, complete, true)
}

// WalkStructure is Walk without reading the values in chunks of their own
// (their references are checked, counted and listed in Shape.Chunks; Vals
// holds the references): a live tree's shape, as `grove tree stat` shows
// it, without reading its data set or meeting chunks that overwrites free
// under the walk.
func WalkStructure(ctx context.Context, r Reader, complete bool) (Shape, error) {
	return walk(ctx, r, complete, false)
}

func walk(ctx context.Context, r Reader, complete, values bool) (Shape, error) {
	sh := Shape{Chunks: map[Handle]bool{}}
	a, err := r.Anchor(ctx)
	if err != nil {
		return sh, err
	}
	if a.Dropped {
		// Its nodes are being freed from the leaves up: nothing to walk.
		return sh, fmt.Errorf("%w: anchor %v is marked dropped", ErrNoTree, a.Self)
	}
	sh.Chunks[a.Self] = true
	sh.Height = len(a.Leftmost)
	if a.Root != a.Leftmost[len(a.Leftmost)-1] {
		return sh, fmt.Errorf("walk: anchor's root %v is not the top level's leftmost %v", a.Root, a.Leftmost[len(a.Leftmost)-1])
	}
	var above []*Node // the chain of the level above, in order
	garbage := map[Handle]bool{}
	for level := len(a.Leftmost) - 1; level >= 0; level-- {
		var chain []*Node
		pos := map[Handle]int{}
		for h := a.Leftmost[level]; !h.IsZero(); {
			if _, dup := pos[h]; dup {
				return sh, fmt.Errorf("walk: level %d's chain loops at %v", level, h)
			}
			n, err := r.Read(ctx, h)
			if err != nil {
				return sh, fmt.Errorf("walk: level %d, node %v: %w", level, h, err)
			}
			if n.Self != h || int(n.Level) != level || n.Deleted {
				return sh, fmt.Errorf("walk: level %d's chain reaches %v: self %v level %d deleted %v", level, h, n.Self, n.Level, n.Deleted)
			}
			if err := n.Check(); err != nil {
				return sh, fmt.Errorf("walk: node %v: %w", h, err)
			}
			if len(chain) == 0 && len(n.Low) != 0 {
				return sh, fmt.Errorf("walk: level %d's leftmost node %v has low bound %q", level, h, n.Low)
			}
			if len(chain) > 0 {
				p := chain[len(chain)-1]
				if p.HighInf || !bytes.Equal(p.High, n.Low) {
					return sh, fmt.Errorf("walk: level %d: %v's high %q (unbounded %v) is not %v's low %q", level, p.Self, p.High, p.HighInf, h, n.Low)
				}
			}
			if n.Right.IsZero() != n.HighInf {
				return sh, fmt.Errorf("walk: node %v: right link %v but unbounded %v", h, n.Right, n.HighInf)
			}
			for _, k := range n.Keys {
				if bytes.Compare(k, n.Low) < 0 || !n.HighInf && bytes.Compare(k, n.High) >= 0 {
					return sh, fmt.Errorf("walk: node %v: key %q outside its bounds", h, k)
				}
			}
			for _, g := range n.Garbage {
				if garbage[g.Node] {
					return sh, fmt.Errorf("walk: removed node %v listed twice", g.Node)
				}
				garbage[g.Node] = true
			}
			pos[h] = len(chain)
			chain = append(chain, n)
			sh.Chunks[h] = true
			h = n.Right
		}
		if level == len(a.Leftmost)-1 && len(chain) > 1 && complete {
			return sh, fmt.Errorf("walk: the top level has %d nodes", len(chain))
		}
		if level < len(a.Leftmost)-1 {
			if err := checkLinks(above, chain, complete, &sh); err != nil {
				return sh, err
			}
		}
		above = chain
		if level == 0 {
			var last []byte
			for _, n := range chain {
				for i, k := range n.Keys {
					if last != nil && bytes.Compare(last, k) >= 0 {
						return sh, fmt.Errorf("walk: leaf keys out of order: %q then %q", last, k)
					}
					last = k
					sh.Keys = append(sh.Keys, k)
					v := n.Vals[i]
					if n.IsExt(i) {
						ref, err := DecodeRef(v)
						if err != nil {
							return sh, fmt.Errorf("walk: leaf %v, key %q: %w", n.Self, k, err)
						}
						if sh.Chunks[ref.Chunk] {
							return sh, fmt.Errorf("walk: leaf %v, key %q: value chunk %v is named twice", n.Self, k, ref.Chunk)
						}
						if values {
							if v, err = r.ReadValue(ctx, ref); err != nil {
								return sh, fmt.Errorf("walk: leaf %v, key %q: value chunk %v: %w", n.Self, k, ref.Chunk, err)
							}
						}
						sh.Chunks[ref.Chunk] = true
						sh.Values++
					}
					sh.Vals = append(sh.Vals, v)
				}
			}
		}
		sh.Nodes += len(chain)
	}
	for g := range garbage {
		n, err := r.Read(ctx, g)
		if err != nil {
			return sh, fmt.Errorf("walk: removed node %v: %w", g, err)
		}
		if !n.Deleted || n.Self != g {
			return sh, fmt.Errorf("walk: garbage names %v, which is not a removed node", g)
		}
		if sh.Chunks[g] {
			return sh, fmt.Errorf("walk: removed node %v is still on a chain", g)
		}
		sh.Chunks[g] = true
		sh.Removed++
	}
	return sh, nil
}

// checkLinks checks the downlinks of parents (one level's chain) against
// kids (the chain below).
func checkLinks(parents, kids []*Node, complete bool, sh *Shape) error {
	pos := map[Handle]int{}
	for i, k := range kids {
		pos[k.Self] = i
	}
	linked := make([]bool, len(kids))
	prev := -1
	for _, p := range parents {
		for i, c := range p.Kids {
			j, ok := pos[c]
			if !ok {
				return fmt.Errorf("walk: node %v's child %v is not on the level below", p.Self, c)
			}
			if j <= prev {
				return fmt.Errorf("walk: node %v's child %v is out of order", p.Self, c)
			}
			if !bytes.Equal(p.Keys[i], kids[j].Low) {
				return fmt.Errorf("walk: node %v's separator %q for %v is not its low bound %q", p.Self, p.Keys[i], c, kids[j].Low)
			}
			// The child's range must lie in the parent's.
			if bytes.Compare(kids[j].Low, p.Low) < 0 {
				return fmt.Errorf("walk: child %v starts below its parent %v", c, p.Self)
			}
			linked[j] = true
			prev = j
		}
		// Each parent's first separator is its low bound (Check), so the
		// parents' ranges split the level below where their children do.
	}
	for j, ok := range linked {
		if !ok {
			if complete {
				return fmt.Errorf("walk: node %v (low %q) has no downlink", kids[j].Self, kids[j].Low)
			}
			sh.Missing++
		}
	}
	if !linked[0] {
		return fmt.Errorf("walk: the leftmost node %v has no downlink", kids[0].Self)
	}
	return nil
}
