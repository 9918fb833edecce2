package btree

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/grovestore/grove/internal/lock"
)

// Scans and counts read several leaves as one atomic step: they hold the
// leaves' locks in shared mode, all at once, taken left to right (the
// order compression takes its locks in, so neither can deadlock the
// other), and release them together. A page is therefore linearizable:
// it is exactly the tree's entries in [Page.Lo, Page.Hi) at one instant.
// A long range is read in several pages, each atomic on its own (an
// iterator over pages is not a snapshot of the whole range).

// Span is a range of keys [From, To); To nil means no end.
type Span struct {
	From, To []byte
}

func (s Span) check() error {
	if len(s.From) > MaxKey || len(s.To) > MaxKey {
		return ErrKey
	}
	if s.To != nil && bytes.Compare(s.From, s.To) >= 0 {
		return ErrBadRange
	}
	return nil
}

func (s Span) contains(k []byte) bool {
	return bytes.Compare(k, s.From) >= 0 && (s.To == nil || bytes.Compare(k, s.To) < 0)
}

// Page is one page of a scan: exactly the entries in [Lo, Hi) (Hi nil: no
// end), in key order, or in reverse order for a reverse scan. More reports
// whether the span asked for goes on past the page: the next page starts at
// Hi (forward) or ends at Lo (reverse).
type Page struct {
	Keys, Vals [][]byte
	Lo, Hi     []byte
	More       bool
}

// Scan returns the first page of at most limit entries (limit <= 0: as
// many as MaxScanLeaves leaves hold) of span, in order, or the last ones
// in reverse order.
func (t *Tree) Scan(ctx context.Context, span Span, limit int, reverse bool) (Page, error) {
	return t.scan(ctx, span, limit, reverse, false)
}

// ScanKeys is Scan without the values (Page.Vals nil): values in chunks of
// their own are not read, and a page's bytes count its keys only.
func (t *Tree) ScanKeys(ctx context.Context, span Span, limit int, reverse bool) (Page, error) {
	return t.scan(ctx, span, limit, reverse, true)
}

func (t *Tree) scan(ctx context.Context, span Span, limit int, reverse, keysOnly bool) (Page, error) {
	if err := span.check(); err != nil {
		return Page{}, err
	}
	// Values in chunks of their own are read once the leaves are
	// released; if one was freed meanwhile (an overwrite), the page is
	// read again with the values read under the leaves' locks, which no
	// overwrite can pass: a writer cannot starve a scan.
	hold := false
	for attempt := 0; ; attempt++ {
		if attempt > maxRestarts {
			return Page{}, fmt.Errorf("btree: %d restarts scanning", attempt)
		}
		var pg Page
		var err error
		if reverse {
			pg, err = t.scanReverse(ctx, span, limit, keysOnly, hold)
		} else {
			pg, err = t.scanForward(ctx, span, limit, keysOnly, hold)
		}
		if errors.Is(err, errValueGone) {
			hold = true
		}
		if errors.Is(err, errRestart) || errors.Is(err, errValueGone) {
			t.Stats.Restarts.Add(1)
			continue
		}
		return pg, err
	}
}

// errValueGone: a value chunk a page named was freed before it was read.
var errValueGone = errors.New("btree: a value chunk was freed under the read")

// held is a set of leaves locked in shared mode, in key order.
type held struct {
	t     *Tree
	nodes []*Node
	lsn   uint64
}

func (h *held) add(n *Node) {
	h.nodes = append(h.nodes, n)
	if n.LSN > h.lsn {
		h.lsn = n.LSN
	}
}

func (h *held) release() {
	for i := len(h.nodes) - 1; i >= 0; i-- {
		h.t.s.Unlock(h.nodes[i].Self, lock.Shared)
	}
	h.nodes = nil
}

// lockRun locks, in shared mode, the leaf covering from and the leaves to
// its right until one reaches to (nil: the last leaf) or max leaves are
// held. Each next leaf is live and starts where the previous one ends: it
// could only be removed into, or give keys to, a leaf we hold.
func (t *Tree) lockRun(ctx context.Context, start Handle, from, to []byte, max int) (*held, error) {
	hd := &held{t: t}
	n, err := t.lockCovering(ctx, start, target{key: from}, lock.Shared)
	if err != nil {
		return nil, err
	}
	hd.add(n)
	for !n.HighInf && (to == nil || bytes.Compare(n.High, to) < 0) && len(hd.nodes) < max {
		r, err := t.s.Lock(ctx, n.Right, lock.Shared)
		if err != nil {
			hd.release()
			if errors.Is(err, ErrGone) {
				return nil, errRestart
			}
			return nil, err
		}
		if r.Deleted || !bytes.Equal(r.Low, n.High) {
			panic(fmt.Sprintf("btree: leaf %v (held) links to %v, which is deleted (%v) or starts at %q, not %q", n.Self, r.Self, r.Deleted, r.Low, n.High))
		}
		n = r
		hd.add(n)
	}
	return hd, nil
}

func (t *Tree) scanForward(ctx context.Context, span Span, limit int, keysOnly, hold bool) (Page, error) {
	leaf, _, err := t.locate(ctx, target{key: span.From}, 0)
	if err != nil {
		return Page{}, err
	}
	hd, err := t.lockRun(ctx, leaf.Self, span.From, span.To, t.cfg.MaxScanLeaves)
	if err != nil {
		return Page{}, err
	}
	pg := Page{Lo: span.From, Hi: span.To}
	last := hd.nodes[len(hd.nodes)-1]
	if !last.HighInf && (span.To == nil || bytes.Compare(last.High, span.To) < 0) {
		pg.Hi, pg.More = last.High, true // the page ends early: too many leaves
	}
	full := false
	var ext []bool
	var next []byte // full: the first key left out
	size := 0
	for _, n := range hd.nodes {
		i, _ := n.Search(span.From)
		for ; i < len(n.Keys); i++ {
			k := n.Keys[i]
			if pg.Hi != nil && bytes.Compare(k, pg.Hi) >= 0 {
				break
			}
			es := entryBytes(n, i, keysOnly)
			if limit > 0 && len(pg.Keys) == limit || len(pg.Keys) > 0 && size+es > t.cfg.MaxScanBytes {
				full, next = true, k
				break
			}
			size += es
			pg.Keys = append(pg.Keys, k)
			pg.Vals = append(pg.Vals, n.Vals[i])
			ext = append(ext, n.IsExt(i))
		}
		if full {
			break
		}
	}
	if full {
		// The page ends at the first key it leaves out (a key: at most
		// MaxKey bytes, unlike the last key + 0, which the next page
		// could not start from).
		pg.Hi, pg.More = next, true
	}
	return t.finishPage(ctx, hd, pg, ext, keysOnly, hold)
}

// finishPage reads the page's values in chunks of their own (under the
// leaves' locks if hold) and waits until what the page read is durable.
func (t *Tree) finishPage(ctx context.Context, hd *held, pg Page, ext []bool, keysOnly, hold bool) (Page, error) {
	var err error
	if hold {
		err = t.resolve(ctx, &pg, ext, keysOnly)
	}
	hd.release()
	if err != nil {
		return Page{}, err
	}
	if err := t.s.Durable(ctx, hd.lsn); err != nil {
		return Page{}, err
	}
	if !hold {
		err = t.resolve(ctx, &pg, ext, keysOnly)
	}
	return pg, err
}

// entryBytes is what leaf entry i adds to a page: its key and its value's
// length.
func entryBytes(n *Node, i int, keysOnly bool) int {
	if keysOnly {
		return len(n.Keys[i])
	}
	if n.IsExt(i) {
		if r, err := DecodeRef(n.Vals[i]); err == nil {
			return len(n.Keys[i]) + int(r.Length)
		}
	}
	return len(n.Keys[i]) + len(n.Vals[i])
}

// resolve reads the page's values that are in chunks of their own (ext),
// once its leaves are released. A chunk freed since (an overwrite's)
// restarts the page: the page's entries were current at one instant, and
// every chunk still allocated holds the value of that instant.
func (t *Tree) resolve(ctx context.Context, pg *Page, ext []bool, keysOnly bool) error {
	if keysOnly {
		pg.Vals = nil
		return nil
	}
	for i, e := range ext {
		if !e {
			continue
		}
		ref, err := DecodeRef(pg.Vals[i])
		if err != nil {
			return err
		}
		v, err := t.s.ReadValue(ctx, ref)
		if errors.Is(err, ErrGone) {
			return errValueGone
		}
		if err != nil {
			return err
		}
		pg.Vals[i] = v
	}
	return nil
}

// scanReverse finds, without locks, the leftmost leaf it will need (walking
// left from the end of the span until it has seen limit entries), then
// locks the run from there to the end of the span and takes the last limit
// entries. A page may be short (concurrent deletes, or more leaves than
// MaxScanLeaves): More then says the span goes on below Lo.
func (t *Tree) scanReverse(ctx context.Context, span Span, limit int, keysOnly, hold bool) (Page, error) {
	n, _, err := t.locate(ctx, target{key: span.To, below: true}, 0)
	if err != nil {
		return Page{}, err
	}
	leaves := 1
	seen := countIn(n, span)
	for (limit <= 0 || seen < limit) && bytes.Compare(n.Low, span.From) > 0 && leaves < t.cfg.MaxScanLeaves {
		n, _, err = t.locate(ctx, target{key: n.Low, below: true}, 0)
		if err != nil {
			return Page{}, err
		}
		leaves++
		seen += countIn(n, span)
	}
	from := span.From
	if bytes.Compare(n.Low, from) > 0 {
		from = n.Low
	}
	hd, err := t.lockRun(ctx, n.Self, from, span.To, 2*t.cfg.MaxScanLeaves)
	if err != nil {
		return Page{}, err
	}
	first, last := hd.nodes[0], hd.nodes[len(hd.nodes)-1]
	if !last.HighInf && (span.To == nil || bytes.Compare(last.High, span.To) < 0) {
		// The span's end moved right past what we may hold (splits under
		// us): try again.
		hd.release()
		return Page{}, errRestart
	}
	pg := Page{Lo: span.From, Hi: span.To}
	if bytes.Compare(first.Low, span.From) > 0 {
		pg.Lo, pg.More = first.Low, true
	}
	var keys, vals [][]byte
	var exts []bool
	var sizes []int
	for _, l := range hd.nodes {
		for i, k := range l.Keys {
			if bytes.Compare(k, pg.Lo) >= 0 && (span.To == nil || bytes.Compare(k, span.To) < 0) {
				keys = append(keys, k)
				vals = append(vals, l.Vals[i])
				exts = append(exts, l.IsExt(i))
				sizes = append(sizes, entryBytes(l, i, keysOnly))
			}
		}
	}
	// The page is the last entries, as many as limit and MaxScanBytes
	// allow (one at least).
	keep, size := 0, 0
	for j := len(keys) - 1; j >= 0; j-- {
		if limit > 0 && keep == limit || keep > 0 && size+sizes[j] > t.cfg.MaxScanBytes {
			break
		}
		keep++
		size += sizes[j]
	}
	if keep < len(keys) {
		cut := len(keys) - keep
		keys, vals, exts = keys[cut:], vals[cut:], exts[cut:]
		pg.Lo, pg.More = keys[0], true
	}
	var ext []bool
	for i := len(keys) - 1; i >= 0; i-- {
		pg.Keys = append(pg.Keys, keys[i])
		pg.Vals = append(pg.Vals, vals[i])
		ext = append(ext, exts[i])
	}
	return t.finishPage(ctx, hd, pg, ext, keysOnly, hold)
}

func countIn(n *Node, span Span) int {
	c := 0
	for _, k := range n.Keys {
		if span.contains(k) {
			c++
		}
	}
	return c
}

// Count returns the number of keys in span, as one atomic step (all the
// span's leaves held at once). A span of more than MaxCountLeaves leaves
// is refused with ErrRangeTooLarge.
func (t *Tree) Count(ctx context.Context, span Span) (int, error) {
	if err := span.check(); err != nil {
		return 0, err
	}
	for attempt := 0; ; attempt++ {
		if attempt > maxRestarts {
			return 0, fmt.Errorf("btree: %d restarts counting", attempt)
		}
		leaf, _, err := t.locate(ctx, target{key: span.From}, 0)
		if err != nil {
			return 0, err
		}
		hd, err := t.lockRun(ctx, leaf.Self, span.From, span.To, t.cfg.MaxCountLeaves+1)
		if errors.Is(err, errRestart) {
			t.Stats.Restarts.Add(1)
			continue
		}
		if err != nil {
			return 0, err
		}
		if len(hd.nodes) > t.cfg.MaxCountLeaves {
			hd.release()
			return 0, fmt.Errorf("%w: more than %d leaves", ErrRangeTooLarge, t.cfg.MaxCountLeaves)
		}
		c := 0
		for _, n := range hd.nodes {
			c += countIn(n, span)
		}
		hd.release()
		return c, t.s.Durable(ctx, hd.lsn)
	}
}
