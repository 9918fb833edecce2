package rldev

import (
	"encoding/binary"
	"fmt"
	"slices"
)

// Owed ranges (beyond Boxwood).
//
// A primary back from a crash pulls its dirty regions from its peer
// (startRecovery), and a write its peer refused for its token is pulled
// back from the peer (startRecoveryOf): in those ranges the peer's copy is
// the up-to-date one, and this one may hold a block torn at the crash, or
// a write that was refused. Each such range is written to the segment's
// owed page before this replica may degrade with it (and as soon as its
// pull begins), and taken out of it, durably, only once the pulled data
// has landed, before the range is let go. So:
//
//   - a peer declared dead, or failed, before the pull ends no longer
//     holds the RLDev back: it degrades, this copy serves every other
//     block, and requests for an owed range are answered Unavailable at
//     once. Outside review 86 showed why they must not be served: a block
//     torn here was served as corrupt and then resynced over the peer's
//     good copy (an acknowledged write lost on both), and a write the peer
//     had refused was served in place of the acknowledged value. Before
//     owed ranges such a primary kept the RLDev normal, every write
//     waiting, until the peer came back (for ever if it never did);
//     Owing only the blocks that fail their check would not do: a block
//     that passes it may hold a write the peer would have refused for its
//     fencing token (this replica crashed before the refusal reached it),
//     and served, or resynced to the peer, a fenced writer's write would
//     stand over a newer writer's on both copies;
//   - a restart finds them again in the page;
//   - when the peer is back, stale but with its copy whole since (nothing
//     is written to a stale copy while the RLDev is degraded, and the
//     resync does not start while a range is owed), they are pulled from
//     it (Pull.Owed) and the resync follows;
//   - when the peer's copy is not whole (its disk replaced, its segment
//     re-placed by grove rldev forget-node --re-place), this copy is all
//     there is: it stands, the range goes to the degraded-mode log (the
//     resync copies it), and the log says so at level 3.
//
// An owed range never covers a block written since its pull began: the
// range is held (exclusively) from then until it is taken out of the page,
// so a range the page names after a restart holds no write acknowledged
// since. That matters, because pulling the peer's copy over such a write
// would lose it; for the same reason a page that does not decode is taken
// as empty (a level-3 log line), never as "everything owed".
//
// A range pulled back after a refusal while the peer was already stale
// (a resync target's) is not owed: the stale copy is not whole. It is
// given up to this copy as before (abandonRecovery).
//
// On disk (PageOwed, owedArea bytes, A/B; payload little endian): a
// bitmap of the dirty-region log's regions owed whole (encodeBitmap: its
// region size, then its bytes), the number of other ranges (u32), then
// each one's first block and block count (u64 each).

// maxOwedRuns bounds the ranges other than whole regions (those pulled
// back after a refusal) the page holds. A refusal beyond it pulls its
// range back unrecorded, as before owed ranges, and such a range keeps the
// RLDev from degrading until it is pulled (recoveryOwed).
const maxOwedRuns = 200

// owedWriter writes the owed page: one write at a time; a change made
// while one is in flight waits for the next, which carries every change.
type owedWriter struct {
	seq       uint64 // sequence number of the durable copy
	writing   bool
	cur, next []func(error) []any
}

func encodeOwed(b Bitmap, runs []run) []byte {
	p := encodeBitmap(b)
	p = binary.LittleEndian.AppendUint32(p, uint32(len(runs)))
	for _, g := range runs {
		p = binary.LittleEndian.AppendUint64(p, g.first)
		p = binary.LittleEndian.AppendUint64(p, g.n)
	}
	return p
}

// decodeOwed checks an owed page's payload against the region size and
// block count the segment must have.
func decodeOwed(p []byte, regionBlocks, blocks uint64) (Bitmap, []run, error) {
	nb := len(NewBitmap(regionBlocks, blocks).Bits) + 8
	if len(p) < nb+4 {
		return Bitmap{}, nil, fmt.Errorf("rldev: owed page of %d bytes, want at least %d", len(p), nb+4)
	}
	b, err := decodeBitmap(p[:nb], regionBlocks, blocks)
	if err != nil {
		return Bitmap{}, nil, err
	}
	for x := (blocks + regionBlocks - 1) / regionBlocks; x < b.Regions(); x++ {
		if b.Has(x) {
			return Bitmap{}, nil, fmt.Errorf("rldev: owed page names region %d past the segment's end", x)
		}
	}
	n := binary.LittleEndian.Uint32(p[nb:])
	p = p[nb+4:]
	if n > maxOwedRuns || uint64(len(p)) != uint64(n)*16 {
		return Bitmap{}, nil, fmt.Errorf("rldev: owed page with %d ranges in %d bytes", n, len(p))
	}
	runs := make([]run, 0, n)
	for i := uint32(0); i < n; i++ {
		g := run{binary.LittleEndian.Uint64(p), binary.LittleEndian.Uint64(p[8:])}
		p = p[16:]
		if g.n == 0 || g.first >= blocks || g.n > blocks-g.first {
			return Bitmap{}, nil, fmt.Errorf("rldev: owed range [%d, +%d) outside the segment's %d blocks", g.first, g.n, blocks)
		}
		runs = append(runs, g)
	}
	return b, runs, nil
}

// owedRuns is how many ranges other than whole regions recoverQ owes.
func (r *replica) owedRuns() int {
	n := 0
	for _, q := range r.recoverQ {
		if q.owe && q.x == noRegion {
			n++
		}
	}
	return n
}

// syncOwed makes the owed page say what recoverQ's entries owe now (q.owe),
// then runs then (with the write's error: the replica failed).
func (r *replica) syncOwed(then func(error) []any) []any {
	r.owedW.next = append(r.owedW.next, then)
	return r.flushOwed()
}

func (r *replica) flushOwed() []any {
	w := &r.owedW
	if w.writing || len(w.next) == 0 || r.state == repFailed || r.state == repRetired {
		return nil
	}
	b := NewBitmap(r.drl.durable.RegionBlocks, r.rec.Blocks)
	var runs []run
	for _, q := range append(r.recoverQ[:len(r.recoverQ):len(r.recoverQ)], r.owedAtLoad...) {
		switch {
		case !q.owe:
		case q.x != noRegion:
			b.Set(q.x)
		default:
			runs = append(runs, run{q.first, q.n})
		}
	}
	page, err := EncodePage(PageOwed, w.seq+1, encodeOwed(b, runs), owedArea)
	if err != nil {
		panic(err) // maxOwedRuns and a page of bits fit owedArea
	}
	w.writing = true
	w.cur, w.next = w.next, nil
	seq := w.seq + 1
	off, _ := pageSlot(PageOwed, seq%2)
	r.e.stats.OwedWrites++
	return r.writeDurable(r.base+off, page, func(err error) []any {
		waiters := w.cur
		w.cur, w.writing = nil, false
		var out []any
		if err == nil {
			w.seq = seq
		} else {
			out = append(out, r.fail(fmt.Errorf("writing the owed page: %w", err))...)
		}
		for _, fn := range waiters {
			out = append(out, fn(err)...)
		}
		return append(out, r.flushOwed()...)
	})
}

// owe records the entries qs in the owed page (their pulls need not wait:
// what matters is that the page names them before this replica degrades
// without them, recoveryOwed, and after any restart).
func (r *replica) owe(qs []*recover) []any {
	if len(qs) == 0 {
		return nil
	}
	for _, q := range qs {
		q.owe = true
	}
	return r.syncOwed(func(err error) []any {
		if err != nil {
			return nil
		}
		for _, q := range qs {
			q.owed = q.owe
		}
		return nil
	})
}

// recoveryOwed: every range still to pull from the peer is durably owed,
// so the replica may degrade without its peer (want).
func (r *replica) recoveryOwed() bool {
	for _, q := range r.recoverQ {
		if !q.owed {
			return false
		}
	}
	return true
}

// owedErr answers a request that touches an owed range while the peer is
// stale (the RLDev degraded): Unavailable, at once. While the peer is not
// stale, or once the peer's copy of the range has arrived (its landing,
// then its removal from the page, under way), the request waits for the
// range.
func (r *replica) owedErr(block, n uint64) error {
	if !r.peerStale() {
		return nil
	}
	for _, q := range r.recoverQ {
		if q.owe && !q.writing && !q.clearing && !q.givingUp && q.first < block+n && block < q.first+q.n {
			return fmt.Errorf("%w: blocks [%d, %d) of rldev %d wait for node %d's copy, which is down (this one was pulling them from it after a crash): back when node %d is, or once it is forgotten (grove rldev forget-node %d --re-place)",
				ErrUnavailable, q.first, q.first+q.n, r.rec.ID, r.peerNode(), r.peerNode(), r.peerNode())
		}
	}
	return nil
}

// owedCount is the number of ranges owed (ReplicaStatus.Owed).
func (r *replica) owedCount() int {
	n := 0
	for _, q := range r.recoverQ {
		if q.owe {
			n++
		}
	}
	return n
}

// loadOwed turns the owed page read at load into recovery entries (not yet
// holding their ranges: afterLoad decides what becomes of them).
func (r *replica) loadOwed(meta []byte) (qs []*recover, log []any) {
	oa, sa := pageSlot(PageOwed, 0)
	ob, _ := pageSlot(PageOwed, 1)
	a, b := meta[oa:oa+int64(sa)], meta[ob:ob+int64(sa)]
	r.owedW = owedWriter{}
	if allZero(a) && allZero(b) {
		return nil, nil // never written (a segment of an earlier build, or nothing ever owed)
	}
	seq, payload, ok := NewestPage(a, b, PageOwed)
	if !ok {
		return nil, []any{r.e.logf(3, "rldev owed page corrupt: taken as empty (a range it named, if any, is served from this copy)", "rldev", r.rec.ID)}
	}
	r.owedW.seq = seq
	bits, runs, err := decodeOwed(payload, r.drl.durable.RegionBlocks, r.rec.Blocks)
	if err != nil {
		return nil, []any{r.e.logf(3, "rldev owed page does not decode: taken as empty (a range it named, if any, is served from this copy)", "rldev", r.rec.ID, "err", err)}
	}
	rb := bits.RegionBlocks
	for _, x := range bits.List() {
		first := x * rb
		qs = append(qs, &recover{x: x, first: first, n: min(rb, r.rec.Blocks-first), owe: true, owed: true})
	}
	for _, g := range runs {
		qs = append(qs, &recover{x: noRegion, first: g.first, n: g.n, owe: true, owed: true})
	}
	return qs, nil
}

// owedDirty, at load: the dirty regions not owed whole already that no
// degraded-mode write touched (no mark of the degraded-mode log in their
// span), as new owed entries. Such a region's writes were all forwarded
// (normal state), so the peer's copy of it is the one readers may have
// seen; a write acknowledged in degraded mode marks its degraded-mode
// region durably first (as do writes while resyncing), so a region that
// may hold one is left out: this copy of it stands. This holds whatever
// the table this replica has seen says (it may be older than a decree
// its peer made on its own failure while this one was down): the rule
// reads only this segment's logs. A secondary's or a stale replica's
// entries are dropped once the table names it (afterLoad).
func (r *replica) owedDirty() []*recover {
	if r.target || r.rec.DRLOff || r.drlCorrupt {
		// (drlCorrupt: both copies of the log's page failed their check,
		// and every region reads as dirty: owing them all would make the
		// whole RLDev unavailable while its peer is stale, for marks
		// that say nothing. The old rule stands: pulled if the peer is
		// up to date, this copy's if it is stale. Outside review 90.)
		return nil
	}
	rb := r.drl.durable.RegionBlocks
	var out []*recover
	for _, x := range r.drl.durable.List() {
		first := x * rb
		if first >= r.rec.Blocks || hasOwedRegion(r.owedAtLoad, x) {
			continue
		}
		n := min(rb, r.rec.Blocks-first)
		a, b := r.deg.durable.Span(first, n)
		touched := false
		for y := a; y <= b; y++ {
			touched = touched || r.deg.durable.Has(y)
		}
		if !touched {
			out = append(out, &recover{x: x, first: first, n: n, owe: true})
		}
	}
	return out
}

// dropOwed empties the owed page (this replica is stale or not the
// primary: what it owes is the peer's to copy, by resync).
func (r *replica) dropOwed() []any {
	if r.owedW.seq == 0 && !r.owedW.writing {
		return nil // nothing was ever written
	}
	return r.syncOwed(func(error) []any { return nil })
}

// owedNotWhole: the peer answered an owed pull that its copy is not whole
// (its disk replaced, its segment re-placed): this copy of the range is
// all there is. It goes into the degraded-mode log (the resync copies it)
// before it is let go.
func (r *replica) owedNotWhole(q *recover) []any {
	return r.owedGiveUp(q, "rldev owed range: the peer's copy is not whole; this copy stands (a block torn here at the crash stays corrupt)")
}

// owedGiveUp: the copy a range is owed by is gone (why): this copy of it
// stands. Into the degraded-mode log (the resync copies it), then let go.
func (r *replica) owedGiveUp(q *recover, why string) []any {
	if q.clearing || !q.owe || q.writing || q.givingUp {
		// (writing: a part pulled is landing; the range is let go once
		// it has, and its next part, asked of the copy now, answered
		// NotWhole: as review 71 showed, a range let go while pulled
		// data lands lets a write in that the landing undoes.)
		return nil
	}
	r.e.stats.OwedNotWhole++
	q.givingUp = true
	r.forgetPulls(q)
	a, b := r.deg.durable.Span(q.first, q.n)
	out := []any{r.e.logf(3, why, "rldev", r.rec.ID,
		"blocks", fmt.Sprintf("[%d, %d)", q.first, q.first+q.n), "peer", r.peerNode())}
	return append(out, r.deg.mark(a, b, func(err error) []any {
		if err != nil {
			return nil // the replica failed
		}
		return r.recovered(q)
	})...)
}

// hasOwedRegion reports whether region x of the dirty-region log is owed
// whole by an entry already.
func hasOwedRegion(qs []*recover, x uint64) bool {
	return slices.ContainsFunc(qs, func(q *recover) bool { return q.x == x })
}

// owedServe says whether this replica answers the pull m from its copy:
// a plain pull, or an owed one (Pull.Owed) from a stale copy that is
// whole -- stale since the RLDev degraded, nothing written to it since
// (a stale copy takes no write, and the resync that would write it does
// not start while a range is owed). NotWhole tells the puller its own
// copy is all there is; NotServing, to ask again (loading, resyncing).
func (r *replica) owedServe(m Pull) Code {
	if !m.Owed || !r.stale() {
		return OK
	}
	switch {
	case r.target || m.GensOnly || r.rec.State != Degraded:
		return NotServing
	case r.lost || r.blank || r.super.Incomplete || r.super.Overwritten || r.rec.StaleGivenUp:
		// (StaleGivenUp: an operator gave this copy up for the other:
		// its writes are not to come back.)
		return NotWhole
	}
	return OK
}

// owedWaiter is a client request waiting for a range an owed entry holds
// (admitted while the peer was not stale: owedErr let it wait).
type owedWaiter struct {
	lock     *rangeLock
	first, n uint64
	fail     func(error) []any
}

// owedAwait notes a client request whose range lock lk waits, if an owed
// range holds it back: when the peer turns stale, or a part of the range
// landed with the peer stale, it is answered Unavailable, as a request
// arriving then is (outside review 89: it waited until the peer came
// back, for ever if it never did; review 90: one that arrived while a
// part's data was being written, the same).
func (r *replica) owedAwait(lk *rangeLock, first, n uint64, fail func(error) []any) {
	for _, q := range r.recoverQ {
		if q.owe && q.first < first+n && first < q.first+q.n {
			r.owedWaiters = append(r.owedWaiters, owedWaiter{lk, first, n, fail})
			return
		}
	}
}

// owedUnwait: lk was granted.
func (r *replica) owedUnwait(lk *rangeLock) {
	for i, w := range r.owedWaiters {
		if w.lock == lk {
			r.owedWaiters = append(r.owedWaiters[:i], r.owedWaiters[i+1:]...)
			return
		}
	}
}

// owedFail answers Unavailable the requests still waiting for an owed
// range (the peer is stale).
func (r *replica) owedFail() []any {
	var out []any
	ws := r.owedWaiters
	r.owedWaiters = nil
	for _, w := range ws {
		if w.lock.done || r.heldNow(w.lock) {
			continue
		}
		if err := r.owedErr(w.first, w.n); err != nil {
			out = append(out, w.fail(err)...)
			continue
		}
		r.owedWaiters = append(r.owedWaiters, w)
	}
	return out
}

// dropRecovery: this replica turned stale while it pulled ranges from its
// peer. Its copy is the resync's to overwrite (they stay in its
// dirty-region log, which its request to be resynced names), or, if an
// operator accepts it as it is, its own: what it owed the peer is owed no
// more (outside review 89: accepted, it went on pulling the owed ranges
// from the copy it was accepted in place of, a newer history, once that
// one came back). A range whose pulled data is being written keeps its
// lock until that lands (pumpRecovery ends it).
func (r *replica) dropRecovery() []any {
	if r.recovering() == 0 {
		return nil
	}
	var out []any
	var keep []*recover
	for _, q := range r.recoverQ {
		if q.writing {
			keep = append(keep, q)
			continue
		}
		q.owe = false
		out = append(out, r.locks.release(q.lock)...)
	}
	for seq, p := range r.pulls {
		if p.q != nil && !slices.Contains(keep, p.q) {
			delete(r.pulls, seq)
		}
	}
	r.recoverQ = keep
	return append(out, r.syncOwed(func(error) []any { return nil })...)
}
