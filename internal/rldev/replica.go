package rldev

import (
	"cmp"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/grovestore/grove/internal/disk"
	"github.com/grovestore/grove/internal/lock"
)

type repState int

const (
	repLoading repState = iota // reading its metadata
	repJoining                 // loaded: waiting for the table to name this incarnation for its segment
	repReady                   // loaded and named: serves what the table lets it
	repFailed                  // its disk failed: leaving the RLDev
	repRetired                 // no longer a replica here
)

// replica is this node's segment of one RLDev.
type replica struct {
	e        *Engine
	rec      *Record
	seg      int // this node's segment index in rec
	disk     uint32
	base     int64 // segment offset on its disk
	state    repState
	err      error     // why it failed
	failedAt time.Time // when

	blank bool // the segment held no RLDev when loaded
	// loadedStale: the segment is incomplete (formatted blank while
	// stale, not copied whole since), the table said it stale when this
	// incarnation loaded it, and has not said so of this incarnation
	// since. A decree that says it up to date meanwhile is a resync of an
	// earlier incarnation of this node, whose copies this one lacks: it is
	// lost (takeRecord), stale in fact, serving nothing, and made stale,
	// copied whole, when the peer is not stale too (outside reviews 74
	// and 75: a blank disk served zeros as up to date; a segment with its
	// disk intact is up to date after such a resync, and is left alone).
	loadedStale bool
	// staleSeen: the table said the segment stale at some time since this
	// life of the replica began (created or loaded again). A blank
	// segment formatted then holds nothing, even if an operator's
	// accept-stale declared it up to date while it loaded (outside review
	// 77: formatted complete, it served zeros as up to date, and its
	// peer's intact copy was then copied over with them).
	staleSeen    bool
	lost         bool // its disk was replaced: stale in fact, until the table says so
	super        Super
	superSeq     uint64
	superW       bool                // a superblock write is in flight
	superQ       []func(error) []any // waiting for the next superblock write
	superChanges []func(*Super)      // what it changes
	nextGen      uint64

	drl, deg *pageLog

	tokens  map[string]lock.Token // durable
	tokSeq  uint64
	tokNext map[string]lock.Token // admitted, to write
	tokW    bool
	tokCur  []func(error) []any
	tokQ    []func(error) []any

	locks    rangeLocks
	inflight map[uint64]int  // dirty region → writes in flight in it
	touched  map[uint64]bool // dirty regions written since the last lazy clear
	lastEnd  uint64          // the block after the last client write began here (sequential writers)

	writes map[*writeOp]bool     // writes in progress here (as primary or replica-only)
	fwd    map[uint64]*writeOp   // forwards awaiting an ack, by seq
	pulls  map[uint64]*pullWait  // pulls awaiting data, by seq
	copies map[uint64]*copyChunk // resync copies awaiting an ack, by seq

	// A move's target (move.go): this node receives a copy of segment
	// seg at its new place (disk, base); it serves nothing until the
	// table puts it there.
	target bool
	mv     *resyncSrc          // the primary: the copy to a move's target
	tfwd   map[uint64]*writeOp // forwards to a move's target awaiting an ack, by seq
	// fwdIn: forwards being written here (as a secondary or a move's
	// target), by write; a copy of one sent again meanwhile is answered
	// with it rather than written once more (onForward).
	fwdIn map[fwdKey]*fwdDup
	// landed: the client writes that landed on this copy in this engine
	// (landed.go): a retry of one is not applied again.
	landed landedWrites

	reloadHeld bool // a failed replica: its reload waits for an operation of the failed life (logged once)
	marking    bool // a named move target's superblock write (join)

	pending int // its disk writes in progress (writeDurable)
	reading int // its disk reads in progress (readRun, load, dropCache)
	// The segment's cached pages were dropped (dropCache) when the disk's
	// failed syncs were cleanAt (cacheOK: once in this engine); dropAgain:
	// the last drop left pages cached, tried again at the next retry,
	// dropTries in a row so far.
	cacheOK, dropAgain bool
	cleanAt            uint64
	dropTries          int
	droppedAt          time.Time

	// The primary of a moving RLDev (move.go): the epoch in which the
	// moving secondary confirmed it stopped serving, a probe for it in
	// flight, the target's content possibly behind this replica's (a
	// range taken from the peer), since when the target is unreachable
	// and the target incarnation that clock is for.
	stopConfirmed uint64
	probing       bool
	mvStale       bool
	tgtDown       time.Time
	tgtDownInc    uint64
	peerChanges   int // blocks being taken from the peer (pullNewer) now

	recoverQ    []*recover   // dirty regions still to pull from the peer (after a crash), in order
	owedW       owedWriter   // the owed page (owed.go)
	owedLogged  bool         // "ranges wait for the peer's copy" said
	owedAtLoad  []*recover   // the owed page's ranges, read at load (afterLoad takes them)
	owedWaiters []owedWaiter // client requests waiting for an owed range (owedFail)
	drlCorrupt  bool         // both copies of the dirty-region log's page failed their check at load
	resyncReq   *ResyncMe    // a stale peer's request
	resyncHeld  time.Time    // no resync started before (resyncHold)
	// resyncHeldInc: the target incarnation resyncHeld is for (a new one,
	// restarted, is not held).
	resyncHeldInc uint64
	resync        *resyncSrc // this replica is the source of a resync
	askedAt       time.Time  // a stale replica: when it last asked to be resynced
	scrub         scrubState
}

func (s repState) String() string {
	switch s {
	case repLoading:
		return "loading"
	case repJoining:
		return "joining"
	case repReady:
		return "ready"
	case repFailed:
		return "failed"
	case repRetired:
		return "retired"
	}
	return "?"
}

// newReplica is segment seg of rec at place (a move's target if target).
func newReplica(e *Engine, rec *Record, seg int, place Segment, target bool) *replica {
	return &replica{e: e, rec: rec, seg: seg, disk: place.Disk, base: place.Offset, target: target, staleSeen: rec.Stale[seg],
		tokens: map[string]lock.Token{}, tokNext: map[string]lock.Token{}, inflight: map[uint64]int{}, touched: map[uint64]bool{},
		writes: map[*writeOp]bool{}, fwd: map[uint64]*writeOp{}, tfwd: map[uint64]*writeOp{}, pulls: map[uint64]*pullWait{}, copies: map[uint64]*copyChunk{}}
}

func (r *replica) ready() bool { return r.state == repReady }

// sortedWrites returns the writes in progress in the order they began
// (the engine's outputs must not depend on map order: the simulator
// replays a seed exactly).
func (r *replica) sortedWrites() []*writeOp {
	ws := make([]*writeOp, 0, len(r.writes))
	for w := range r.writes {
		ws = append(ws, w)
	}
	sort.Slice(ws, func(i, j int) bool { return ws[i].id < ws[j].id })
	return ws
}

func sortedSeqs[V any](m map[uint64]V) []uint64 {
	ks := make([]uint64, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Slice(ks, func(i, j int) bool { return ks[i] < ks[j] })
	return ks
}

// peer is the segment this replica exchanges with: the other one, or for
// a move's target the primary, which copies to it.
func (r *replica) peer() int {
	if r.target {
		return r.rec.Primary
	}
	return 1 - r.seg
}
func (r *replica) peerNode() NodeID { return r.rec.Segs[r.peer()].Node }
func (r *replica) isPrimary() bool  { return r.rec.Primary == r.seg && !r.target }

// stale: may have missed writes, or (a move's target) is not in the table
// yet; serves nothing.
func (r *replica) stale() bool         { return r.rec.Stale[r.seg] || r.lost || r.target }
func (r *replica) peerStale() bool     { return r.rec.Stale[r.peer()] }
func (r *replica) peerReachable() bool { return r.e.up[r.peerNode()] }

func (r *replica) checkRange(block, n uint64) error {
	if block >= r.rec.Blocks || n > r.rec.Blocks-block {
		return fmt.Errorf("%w: blocks [%d, %d) outside the RLDev's %d", ErrBadRequest, block, block+n, r.rec.Blocks)
	}
	return nil
}

// ------------------------------------------------------------------ loading

// load reads the segment's metadata area; a segment that holds nothing
// yet is formatted (a new RLDev, or a stale replica about to be copied).
func (r *replica) load(env Env) []any {
	r.landed.forget() // a new life of the copy: what landed in a failed one is not known whole (review 115)
	if d := r.e.disks[r.disk]; d != nil && (d.suspect && !r.cacheOK || r.cleanAt != d.syncFails) {
		return r.dropCache(d)
	}
	r.reading++
	return r.e.read(r.disk, r.base, MetaSize, func(data []byte, err error) []any {
		r.reading--
		if r.state != repLoading {
			return nil
		}
		if err != nil {
			return r.fail(fmt.Errorf("reading its metadata: %w", err))
		}
		return r.loaded(env, data)
	})
}

// dropCache makes the segment's reads see what its disk holds, then loads
// it again: a sync (the drop evicts clean pages only; a failed one is
// counted as any other, failing the writes it covered), then a DropCache
// of the segment's extent. One that leaves a page cached (a large folio
// shared with a neighbour's write in flight) is tried again at the next
// retry, up to maxDropTries, then the replica fails.
//
// Why: after a failed writeback Linux may keep the lost pages cached,
// clean and readable, and report the error once. The replica failed for
// it (every write in flight across a failed sync fails), but, loading
// again from the cache, it would serve, log and copy to its peer writes
// that a crash takes back. A new engine or process never heard of an
// earlier one's failure: its disks are suspect (LocalDisk.Suspect).
func (r *replica) dropCache(d *diskState) []any {
	r.reading++
	d.waiting = append(d.waiting, func(error) []any {
		// A failed sync (counted: the writes in flight across it fail)
		// leaves the pages it lost clean, and the drop evicts them all
		// the same; it may also be an earlier process's failure that no
		// one heard, reported to this one's first sync (outside review
		// 60). This replica had nothing in flight: it goes on. (The
		// flush before the drop must be this counted sync: a
		// sync_file_range(2) that waits would take the failure's report,
		// and the next fdatasync would succeed, review 59.)
		fails := d.syncFails
		return r.e.dropRange(r.disk, r.base, SegmentSize(r.rec.Blocks), func(err error) []any {
			r.reading--
			if r.state != repLoading {
				return nil
			}
			switch {
			case err == nil:
				r.cacheOK, r.cleanAt, r.dropTries = true, fails, 0
				return r.load(r.e.env)
			case errors.Is(err, disk.ErrStillCached) && r.dropTries < maxDropTries:
				r.dropTries++
				r.dropAgain, r.droppedAt = true, r.e.env.Now // again RetryEvery later
				return []any{r.e.logf(1, "rldev segment: pages still cached after a drop; trying again", "rldev", r.rec.ID, "err", err)}
			}
			r.dropTries = 0
			return r.fail(fmt.Errorf("dropping its cached pages: %w", err))
		})
	})
	return r.e.maybeSync(d)
}

// maxDropTries bounds replica.dropCache's attempts in a row.
const maxDropTries = 20

func (r *replica) loaded(env Env, meta []byte) []any {
	page := func(kind uint16) (uint64, []byte, bool, bool) {
		oa, sa := pageSlot(kind, 0)
		ob, _ := pageSlot(kind, 1)
		a, b := meta[oa:oa+int64(sa)], meta[ob:ob+int64(sa)]
		seq, payload, ok := NewestPage(a, b, kind)
		blank := allZero(a) && allZero(b)
		return seq, payload, ok, blank
	}
	drlRB, degRB := regionBlocks(cmp.Or(r.e.cfg.drlRegion, DRLRegionBlocks), r.rec.Blocks), regionBlocks(DegradedRegionBlocks, r.rec.Blocks)
	var out []any
	r.loadedStale = false
	seq, payload, ok, blank := page(PageSuper)
	switch {
	case blank:
		// Nothing here yet: a new RLDev, or a segment to be copied whole.
		r.blank = true
		// A stale (or lost) segment formatted now holds nothing: it stays
		// incomplete, across restarts, until a full copy has run.
		r.super = Super{RLDev: r.rec.ID, Blocks: r.rec.Blocks, Incomplete: r.stale() || r.staleSeen}
		if r.target {
			r.super.Incomplete, r.super.TargetInc = true, r.e.cfg.Inc
		}
		r.loadedStale = r.super.Incomplete && r.rec.Stale[r.seg] && !r.target
		if r.super.Incomplete && !r.rec.Stale[r.seg] && !r.target && !r.lost {
			r.lost = true
			out = append(out, r.e.logf(3, "rldev segment blank, stale when it began loading and declared up to date since: it holds nothing and serves nothing", "rldev", r.rec.ID))
		}
		r.drl = newPageLog(r, PageDRL, NewBitmap(drlRB, r.rec.Blocks), 0)
		r.deg = newPageLog(r, PageDegraded, NewBitmap(degRB, r.rec.Blocks), 0)
		r.owedW, r.owedAtLoad = owedWriter{}, nil
		return r.format(env)
	case !ok:
		return r.fail(fmt.Errorf("%w: both superblocks of rldev %d's segment are corrupt", ErrDiskFailed, r.rec.ID))
	}
	s, err := decodeSuper(payload)
	if err != nil || s.RLDev != r.rec.ID || s.Blocks != r.rec.Blocks {
		return r.fail(fmt.Errorf("%w: the segment at %d holds rldev %d (%d blocks), not %d (%d): %v",
			ErrDiskFailed, r.base, s.RLDev, s.Blocks, r.rec.ID, r.rec.Blocks, err))
	}
	r.super, r.superSeq = s, seq
	r.nextGen = s.GenFloor
	r.loadedStale = s.Incomplete && r.rec.Stale[r.seg] && !r.target
	var mark func(*Super) // a change to the superblock, durable before the replica joins
	switch {
	case s.Incomplete && !r.target && s.TargetInc != 0 && r.rec.Inc[r.seg] == s.TargetInc && (!r.rec.Stale[r.seg] || !r.rec.FullCopy):
		// Moved here: the switch named the target incarnation that
		// received the whole copy, which died before it marked the
		// segment complete (promote). It is whole -- up to date, or
		// stale since (its death degraded the RLDev after the switch:
		// outside review 81), to be resynced by the peer's logs. The
		// table names that incarnation and says a full copy is due only
		// when the move's moving replica failed before the copy ended
		// (moveDegraded): that target holds part of a copy.
		// The same for a full copy's target (onCopy): the "resynced"
		// decree named the incarnation that received it, which died
		// before it cleared Incomplete.
		mark = func(s *Super) { s.Incomplete, s.TargetInc, s.Overwritten = false, 0, false }
		r.loadedStale = false
		out = append(out, r.e.logf(2, "rldev segment whose copy ended as its incarnation stopped (a move's switch, or a full copy's \"resynced\"): the copy it received is whole", "rldev", r.rec.ID, "target_incarnation", s.TargetInc, "stale", r.rec.Stale[r.seg]))
	case s.Incomplete && !r.rec.Stale[r.seg] && !r.target:
		// Formatted after its disk was replaced and not yet copied whole,
		// though the table does not say stale (its peer may be stale too:
		// no decree could say so), or a move's target whose incarnation
		// the switch did not name. It holds nothing to serve.
		r.lost = true
		out = append(out, r.e.logf(3, "rldev segment incomplete (its disk was replaced, no full copy since): it serves nothing", "rldev", r.rec.ID))
	}
	r.drlCorrupt = false
	loadLog := func(kind uint16, rb uint64) *pageLog {
		seq, payload, ok, blank := page(kind)
		if blank || !ok {
			b := NewBitmap(rb, r.rec.Blocks)
			if !blank {
				r.drlCorrupt = r.drlCorrupt || kind == PageDRL
				// Both copies corrupt: take every region as dirty
				// (costs a copy, loses nothing).
				for i := range b.Bits {
					b.Bits[i] = 0xff
				}
				out = append(out, r.e.logf(3, "rldev log pages corrupt: every region taken as dirty", "rldev", r.rec.ID, "kind", kind))
			}
			return newPageLog(r, kind, b, seq)
		}
		b, err := decodeBitmap(payload, rb, r.rec.Blocks)
		if err != nil {
			r.drlCorrupt = r.drlCorrupt || kind == PageDRL
			b = NewBitmap(rb, r.rec.Blocks)
			for i := range b.Bits {
				b.Bits[i] = 0xff
			}
		}
		return newPageLog(r, kind, b, seq)
	}
	r.drl = loadLog(PageDRL, drlRB)
	r.deg = loadLog(PageDegraded, degRB)
	var olog []any
	r.owedAtLoad, olog = r.loadOwed(meta)
	out = append(out, olog...)
	if seq, payload, ok, blank := page(PageTokens); ok {
		if m, err := decodeTokens(payload); err == nil {
			r.tokens, r.tokSeq = m, seq
		} else {
			out = append(out, r.e.logf(3, "rldev token table does not decode", "rldev", r.rec.ID, "err", err))
		}
	} else if !blank {
		out = append(out, r.e.logf(3, "rldev token table corrupt: fenced writes are checked from now on only", "rldev", r.rec.ID))
	}
	if fresh := r.owedDirty(); len(fresh) > 0 {
		// Dirty regions no degraded-mode write touched are owed to the
		// peer before anything else (owed.go): durable before this
		// replica joins, so that no decree -- not even one its peer makes
		// on its own failure while this one loads -- can leave them to
		// this copy (outside review 89).
		r.owedAtLoad = append(r.owedAtLoad, fresh...)
		return append(out, r.syncOwed(func(err error) []any {
			if err != nil || r.state != repLoading {
				return nil // failed (flushOwed did it)
			}
			for _, q := range fresh {
				q.owed = q.owe
			}
			return r.loadedTail(mark)
		})...)
	}
	return append(out, r.loadedTail(mark)...)
}

// loadedTail: the superblock's change (mark) durable, then join.
func (r *replica) loadedTail(mark func(*Super)) []any {
	if mark != nil {
		return r.writeSuper(mark, func(err error) []any {
			if r.state != repLoading {
				return nil
			}
			if err != nil {
				return r.fail(fmt.Errorf("marking the segment's superblock: %w", err))
			}
			return r.join(r.e.env)
		})
	}
	return r.join(r.e.env)
}

// join: the replica is loaded. It serves once the table names this
// incarnation as its segment's (want proposes it): from then on a dead
// verdict on an earlier incarnation of this node cannot degrade the RLDev
// behind its back, and messages of the earlier one, sent in an earlier
// epoch, are refused.
func (r *replica) join(env Env) []any {
	if r.named(r.rec) || r.e.cfg.Unsafe.NoJoin && !r.target {
		if r.target && (r.super.TargetInc != r.e.cfg.Inc || !r.super.Incomplete) {
			// A move's target named in the table: before it takes the
			// first block of its copy, its superblock says this
			// incarnation receives it (Super.TargetInc). Not before it is
			// named: until then the move may still switch to the
			// incarnation before it, whose copy this extent holds whole.
			if r.marking {
				return nil
			}
			r.marking = true
			return r.writeSuper(func(s *Super) { s.Incomplete, s.TargetInc = true, r.e.cfg.Inc }, func(err error) []any {
				r.marking = false
				if r.state != repLoading && r.state != repJoining {
					return nil
				}
				if err != nil {
					return r.fail(fmt.Errorf("marking the move target's superblock: %w", err))
				}
				return r.join(r.e.env)
			})
		}
		r.state = repReady
		return r.afterLoad(env)
	}
	r.state = repJoining
	return []any{r.e.logf(1, "rldev replica loaded: asking the table to name this incarnation", "rldev", r.rec.ID, "segment", r.seg)}
}

// format writes a blank segment's superblock and empty logs.
func (r *replica) format(env Env) []any {
	var out []any
	pending := 0
	done := func(err error) []any {
		pending--
		if err != nil {
			return r.fail(fmt.Errorf("formatting the segment: %w", err))
		}
		if pending > 0 || r.state != repLoading {
			return nil
		}
		return r.join(env)
	}
	for _, kind := range []uint16{PageSuper, PageDRL, PageDegraded, PageTokens} {
		var payload []byte
		switch kind {
		case PageSuper:
			payload = encodeSuper(r.super)
		case PageDRL:
			payload = encodeBitmap(r.drl.durable)
		case PageDegraded:
			payload = encodeBitmap(r.deg.durable)
		case PageTokens:
			payload, _ = encodeTokens(nil)
		}
		off, size := pageSlot(kind, 0)
		p, err := EncodePage(kind, 0, payload, size)
		if err != nil {
			panic(err)
		}
		pending++
		out = append(out, r.writeDurable(r.base+off, p, done)...)
	}
	return out
}

// afterLoad starts what a loaded replica must do before or while serving.
func (r *replica) afterLoad(env Env) []any {
	out := []any{r.e.logf(1, "rldev replica loaded", "rldev", r.rec.ID, "segment", r.seg, "state", r.rec.State,
		"stale", r.stale(), "blank", r.blank, "dirty_regions", r.drl.durable.Count(), "degraded_regions", r.deg.durable.Count(), "move_target", r.target)}
	if !r.target && !r.stale() && !r.lost && r.super.Overwritten {
		// Up to date: the full copy it marked ended (its "resynced" table
		// unseen by the life that marked it: outside review 81), or an
		// operator accepted it as it is.
		out = append(out, r.writeSuper(func(s *Super) { s.Overwritten = false }, func(error) []any { return nil })...)
	}
	owed := r.owedAtLoad
	r.owedAtLoad = nil
	if len(owed) > 0 && (r.target || r.stale() || !r.isPrimary()) {
		// Stale (the peer's resync, a full copy after an accept or a
		// disk loss, overwrites this copy), or a secondary (its primary
		// is up to date: pulling from it would wait on the primary's
		// writes in flight, which wait on this replica): nothing is owed.
		out = append(out, r.e.logf(2, "rldev owed ranges dropped: this copy is stale, or not the primary", "rldev", r.rec.ID, "ranges", len(owed)))
		out = append(out, r.dropOwed()...)
		owed = nil
	}
	switch {
	case r.target:
		return out // the primary copies everything to it
	case r.stale():
		return append(out, r.askResync(env)...)
	case (len(owed) > 0 || !r.drl.durable.Empty()) && r.rec.State == Normal && !r.peerStale() && r.isPrimary():
		// This replica crashed, as the primary, while writes were in
		// flight (or while it pulled such regions): its peer's copy of
		// those regions is the one readers may have seen.
		return append(out, r.startRecovery(env, owed)...)
	case len(owed) > 0:
		// Owed ranges and a stale peer: they wait for its copy (pulled
		// from it once it is back: owed.go), served by nobody
		// meanwhile. The dirty regions not owed are this copy's, as
		// below: writes in flight when the peer went stale, which may
		// have been acknowledged in degraded mode.
		out = append(out, r.holdRecover(owed)...)
		out = append(out, r.abandonRecovery()...)
		out = append(out, r.pumpRecovery(env)...)
		var mine []uint64
		for _, x := range r.drl.durable.List() {
			if !hasOwedRegion(owed, x) {
				mine = append(mine, x)
			}
		}
		if len(mine) > 0 {
			out = append(out, r.drlToDeg(mine)...)
		}
		return out
	case !r.drl.durable.Empty() && r.peerStale():
		// The only up-to-date copy, back from a crash with writes in
		// flight: they may be here and not at the stale peer. Their
		// regions go into the degraded-mode log, which the resync copies.
		return append(out, r.drlToDeg(r.drl.durable.List())...)
	case !r.drl.durable.Empty():
		// A secondary in step with the primary: only a primary marks
		// dirty regions, and a replica that stopped being the primary was
		// made stale and then resynced, its dirty regions with the rest
		// (it crashed before it cleared them). Pulling them from the
		// primary would also wait on the primary's writes in flight,
		// which wait on this replica.
		for _, x := range r.drl.durable.List() {
			r.drl.unmark(x)
		}
		return append(out, r.drl.flush()...)
	}
	return out
}

// fail takes the replica out of service after a disk error: every request
// in progress here fails, and the replica asks (decide) to be marked
// stale so that its peer serves alone.
func (r *replica) fail(err error) []any {
	if r.state == repFailed || r.state == repRetired {
		return nil
	}
	r.state = repFailed
	r.err = err
	r.failedAt = r.e.env.Now
	r.forgetLanded()
	out := []any{r.e.logf(3, "rldev segment failed: leaving the RLDev", "rldev", r.rec.ID, "err", err)}
	return append(out, r.abort(fmt.Errorf("%w: %v", ErrDiskFailed, err))...)
}

// retire ends the replica (the table no longer puts it here).
func (r *replica) retire(env Env, why string) []any {
	if r.state == repRetired {
		return nil
	}
	r.state = repRetired
	out := []any{r.e.logf(1, "rldev replica retired", "rldev", r.rec.ID, "why", why)}
	return append(out, r.abort(fmt.Errorf("%w: %s", ErrNotServing, why))...)
}

// abort fails every operation in progress on the replica.
func (r *replica) abort(err error) []any {
	var out []any
	for _, w := range r.sortedWrites() {
		out = append(out, w.finish(err)...)
	}
	for _, seq := range sortedSeqs(r.pulls) {
		p := r.pulls[seq]
		delete(r.pulls, seq)
		out = append(out, p.then(PullData{Code: NotServing})...)
	}
	if r.resync != nil {
		out = append(out, r.stopResync("replica stopped")...)
	}
	if r.mv != nil {
		out = append(out, r.stopCopy(r.mv, "replica stopped")...)
		r.mv = nil
	}
	for _, q := range r.recoverQ {
		out = append(out, r.locks.release(q.lock)...)
	}
	r.recoverQ = nil
	return out
}

// ------------------------------------------------------------------ table changes

// setRecord takes a new version of the replica's record.
func (r *replica) setRecord(env Env, rec *Record) []any {
	var out []any
	if r.resync != nil && !r.resync.failed && rec.Inc[r.peer()] != r.resync.peerInc {
		// The peer's segment is served by another incarnation now: the
		// copies went to one that is gone, and what this one holds is
		// its own to tell (it asks again). Declaring it resynced from
		// them would be a lie (outside review 74).
		out = r.stopResync("the peer's node restarted")
	}
	return append(out, r.takeRecord(env, rec)...)
}

// takeRecord is setRecord's work once a resync for a past incarnation
// of the peer is stopped.
func (r *replica) takeRecord(env Env, rec *Record) []any {
	old := r.rec
	r.rec = rec
	if rec.Stale[r.seg] {
		r.lost = false // the table says it now
		r.staleSeen = true
		if rec.Inc[r.seg] == r.e.cfg.Inc {
			r.loadedStale = false // of this incarnation: its resync is its own
		}
	} else if r.loadedStale {
		r.lost = true // declared up to date for an earlier incarnation (loadedStale)
	} else if old.Stale[r.seg] && rec.AcceptedEpoch > old.Epoch && r.super.Incomplete && !r.target && !r.lost {
		// Declared up to date by an operator's accept-stale since the
		// record this replica last saw (not by a resync's end, whose
		// table it may have missed: outside review 78). An incomplete
		// segment holds nothing to serve (outside review 77: it served
		// zeros as up to date).
		r.lost = true
		return append([]any{r.e.logf(3, "rldev segment declared up to date while incomplete (an operator's accept-stale of a copy that holds nothing): it serves nothing", "rldev", rec.ID)},
			r.takeRecordRest(env, old, rec)...)
	}
	return r.takeRecordRest(env, old, rec)
}

// takeRecordRest is takeRecord once the replica's lost and stale flags
// follow rec (r.rec); old is the record before.
func (r *replica) takeRecordRest(env Env, old, rec *Record) []any {
	if r.target {
		return r.targetRecord(env)
	}
	if r.state == repJoining && r.named(rec) {
		return r.join(env)
	}
	if r.state == repReady && !r.named(rec) && !r.e.cfg.Unsafe.NoJoin {
		// Another incarnation of this node holds the segment: this one
		// is a past life that should have fenced itself.
		r.state = repJoining
		out := []any{r.e.logf(3, "rldev another incarnation serves the segment: this one stops", "rldev", rec.ID, "incarnation", rec.Inc[r.seg])}
		return append(out, r.abort(fmt.Errorf("%w: another incarnation serves the segment", ErrNotServing))...)
	}
	if rec.Epoch == old.Epoch {
		return nil // progress only
	}
	var out []any
	if r.state != repReady {
		return nil
	}
	becameStale := rec.Stale[r.seg] && !old.Stale[r.seg]
	if becameStale {
		out = append(out, r.e.logf(2, "rldev replica now stale", "rldev", rec.ID, "epoch", rec.Epoch))
		for _, w := range r.sortedWrites() {
			out = append(out, w.finish(fmt.Errorf("%w: this replica is stale", ErrNotServing))...)
		}
		out = append(out, r.dropRecovery()...)
	}
	if old.Stale[r.seg] && !rec.Stale[r.seg] {
		// Resynced: whole again, and the logs of its past are obsolete.
		if (r.super.Incomplete || r.super.Overwritten || r.super.TargetInc != 0) && !r.lost {
			out = append(out, r.writeSuper(func(s *Super) { s.Incomplete, s.Overwritten, s.TargetInc = false, false, 0 }, func(error) []any { return nil })...)
		}
		for _, x := range r.drl.durable.List() {
			r.drl.unmark(x)
		}
		for _, x := range r.deg.durable.List() {
			r.deg.unmark(x)
		}
		out = append(out, r.drl.flush()...)
		out = append(out, r.deg.flush()...)
		out = append(out, r.e.logf(1, "rldev replica up to date", "rldev", rec.ID, "epoch", rec.Epoch))
	}
	if old.Primary == r.seg && rec.Primary != r.seg && !becameStale {
		for _, w := range r.sortedWrites() {
			if !w.only {
				out = append(out, w.finish(fmt.Errorf("%w: the primary moved", ErrNotPrimary))...)
			}
		}
	}
	if r.isPrimary() && !r.stale() {
		switch {
		case rec.State == Resyncing && old.State != Resyncing:
			out = append(out, r.startResync(env)...)
		case rec.State != Resyncing && r.resync != nil:
			out = append(out, r.stopResync("the RLDev left the resyncing state")...)
		}
		// Back to normal, the degraded-mode log is done with: lazyClear
		// clears its regions once no write is in flight in them.
	}
	if r.stale() {
		out = append(out, r.askResync(env)...)
	}
	if r.recovering() > 0 && old.Segs[r.peer()] != rec.Segs[r.peer()] {
		// The copy this one owed ranges to is no longer the RLDev's
		// (re-placed: forget-node --re-place, a move's target after its
		// disk failed): they are this copy's now, without waiting for
		// the new segment to answer that it is not whole.
		for _, q := range append([]*recover{}, r.recoverQ...) {
			out = append(out, r.owedGiveUp(q, "rldev owed range: the copy it was owed by was re-placed; this copy stands")...)
		}
	}
	if r.recovering() > 0 && rec.Stale[r.peer()] {
		out = append(out, r.abandonRecovery()...)
	}
	out = append(out, r.moveTick(env)...)
	// Writes in progress re-evaluate what they need in the new epoch (a
	// peer dropped by degraded mode, a resync or move target to forward
	// to).
	for _, w := range r.sortedWrites() {
		out = append(out, w.progress(env)...)
	}
	return out
}

// want returns the record this replica needs the table to hold instead of
// rec (a clone it may change), with why, or nil.
func (r *replica) want(env Env, rec *Record) (*Record, string) {
	if r.target {
		return r.targetWant(env, rec)
	}
	if nr, why := r.moveWant(env, rec); nr != nil {
		return nr, why
	}
	me, peer := r.seg, r.peer()
	switch {
	case (r.state == repFailed || r.lost) && !rec.Stale[me] && !rec.Stale[peer]:
		wasPrimary := rec.Primary == me
		rec.Primary, rec.State, rec.Stale[me], rec.FullCopy = peer, Degraded, true, true
		rec.Epoch++
		if wasPrimary {
			// A moving primary is replaced by the move's target at once:
			// the new primary, its peer, owes this copy nothing (only a
			// primary pulls ranges back).
			rec.Owed = false
			if rec.moveDegraded(me, true) {
				return rec, "segment failed on node " + fmt.Sprint(r.e.cfg.Node) + ": replaced by the move's target"
			}
		} else if m := rec.Move; m != nil && m.Seg == me {
			// A moving secondary is kept, stale, the move waiting; the
			// primary replaces it by the target once it owes it nothing
			// (Record.MovingFailed): only it knows (outside reviews 90 to
			// 92: a restarting primary, or one pulling back a refused
			// write, could owe this copy ranges whose only good copy it
			// is, and the replace gave them up).
			rec.moveDegraded(me, false)
			rec.MovingFailed = true
		} else {
			rec.moveDegraded(me, false)
		}
		if r.lost {
			return rec, "segment lost with its disk on node " + fmt.Sprint(r.e.cfg.Node)
		}
		return rec, "segment failed on node " + fmt.Sprint(r.e.cfg.Node)
	case r.state == repJoining && rec.Inc[me] < r.e.cfg.Inc:
		rec.Inc[me] = r.e.cfg.Inc
		if rec.Primary == me && !rec.Stale[me] && !rec.StaleGivenUp && len(r.owedAtLoad) > 0 {
			// Durable already (loaded): the table says so from the
			// moment it names this incarnation, so that the peer's own
			// failure cannot replace its copy by a move's target
			// meanwhile (outside review 91; Record.Owed).
			rec.Owed = true
		}
		rec.Epoch++
		return rec, fmt.Sprintf("segment %d served by incarnation %d", me, r.e.cfg.Inc)
	case r.state != repReady:
		return nil, ""
	case rec.State == Normal && !rec.Stale[me] && r.recoveryOwed() && r.e.peerDead(rec.Segs[peer].Node, rec.Inc[peer]):
		// While recovering, only once every range still to pull is
		// durably owed (owed.go): such a range may hold a block torn at
		// this copy's crash, or a write the peer refused for its token,
		// which only the peer's copy repairs. Degraded, this copy serves
		// every other block and answers Unavailable for those, which
		// wait for the peer's copy; without the owed page it would
		// serve them, and the resync would copy them over the peer's
		// good blocks (outside review 86: an acknowledged write lost, a
		// fenced-out write served).
		dead := rec.Segs[peer].Node
		if m := rec.Move; m != nil && m.Seg == peer && m.Switch && r.isPrimary() && r.moveCopied() {
			// The moving replica died after the copy was complete: the
			// target has every write this primary acknowledged, and
			// takes its place at once.
			rec.switchMove()
			return rec, fmt.Sprintf("peer node %d dead while its segment moved: switched to the target", dead)
		}
		rec.Primary, rec.State, rec.Stale[peer] = me, Degraded, true
		rec.Owed = r.owedCount() > 0 // (Record.Owed)
		rec.Epoch++
		rec.moveDegraded(peer, false) // a move waits, its moving segment kept (moveDegraded)
		return rec, fmt.Sprintf("peer node %d dead: degraded", dead)
	case rec.Primary != me || rec.Stale[me]:
		return nil, ""
	case rec.State != Resyncing && rec.Owed != (r.owedCount() > 0 && !rec.StaleGivenUp) && r.recoveryOwed():
		// The table says whether this primary owes ranges to its peer's
		// copy (Record.Owed: a re-place, or a move replacing that copy
		// after its disk failed, would give them up), in the normal
		// state too (outside review 90: the peer's own failure replaced
		// it by its move's target); cleared once they are pulled, or
		// given up.
		rec.Owed = !rec.Owed
		if rec.Owed {
			return rec, fmt.Sprintf("ranges owed to the copy on node %d", rec.Segs[peer].Node)
		}
		return rec, "no range owed to the peer's copy any more"
	case rec.MovingFailed && rec.State == Degraded && rec.Stale[peer] && rec.Move != nil && rec.Move.Seg == peer && r.recovering() == 0 && !rec.Owed &&
		r.e.up[NodeID(rec.Move.To.Node)]:
		// The moving secondary failed on its disk, and this primary owes
		// it nothing: the move's target takes its place, to be copied
		// whole (Record.MovingFailed). Not while the target's node is
		// unreachable (outside review 93: the RLDev stayed on one copy
		// until it came back, the failed copy, back after a transient
		// error, retiring): the failed copy may be resynced meanwhile,
		// which ends the flag.
		gone := rec.Segs[peer].Node
		rec.moveDegraded(peer, true)
		rec.MovingFailed = false
		rec.Epoch++
		return rec, fmt.Sprintf("moving segment failed on node %d: replaced by the move's target", gone)
	case rec.State == Degraded && r.resyncReq != nil && r.e.up[rec.Segs[peer].Node] && (!env.Now.Before(r.resyncHeld) || rec.Inc[peer] != r.resyncHeldInc) && r.recovering() == 0:
		// (Not while a range is owed: it is pulled from the stale peer
		// first, whose copy of it must be what it was when it went
		// stale, not a resync's half-written copy.)
		rec.State, rec.Progress, rec.ProgressTotal, rec.Owed = Resyncing, 0, 0, false
		if r.resyncReq.Blank {
			rec.FullCopy = true
		}
		rec.Epoch++
		return rec, "resync"
	case rec.State == Resyncing && (r.resync == nil || r.resync.failed):
		rec.State, rec.Progress, rec.ProgressTotal = Degraded, 0, 0
		rec.Epoch++
		return rec, "resync stopped"
	case rec.State == Resyncing && r.resync.done() && rec.Inc[peer] == r.resync.peerInc:
		rec.State, rec.Stale, rec.FullCopy, rec.Progress, rec.ProgressTotal = Normal, [2]bool{}, false, 0, 0
		rec.Owed, rec.StaleGivenUp, rec.MovingFailed = false, false, false
		rec.Epoch++
		return rec, "resynced"
	case rec.State == Resyncing && r.resync.copied != rec.Progress && env.Now.Sub(r.resync.reported) >= r.e.cfg.ProgressEvery:
		r.resync.reported = env.Now
		rec.Progress, rec.ProgressTotal = r.resync.copied, r.resync.total
		return rec, "resync progress"
	}
	return nil, ""
}

// ------------------------------------------------------------------ peers

func (r *replica) peerUp(env Env, node NodeID) []any {
	if m := r.rec.Move; m != nil && node == m.To.Node {
		// The move's target is back: its stall clock stops now, not
		// when decide next runs (it does not while a decree of this
		// engine is out: a target away again later was parked at once
		// on the first loss's clock, outside review 71).
		r.tgtDown = time.Time{}
	}
	if node != r.peerNode() && (r.rec.Move == nil || node != r.rec.Move.To.Node) {
		return nil
	}
	return r.retry(env)
}

// retry resends what is unanswered and asks again for what is awaited. A
// replica whose disk failed loads again, ReloadEvery after the failure (an
// error may have been transient), once the table has it stale (it is then
// resynced), or if it is the only up-to-date copy (its peer stale: nothing
// was written anywhere else meanwhile, and its logs say what it owes the
// peer) — and once nothing of its failed life is still in progress: no
// disk write (one landing after a write of the new life would undo it,
// review 37), no disk read (a read repair's or a scrub's, completing
// after the reload, would write the peer's data it holds over what was
// written since, review 38), no range held or awaited (its operation
// would act in the new life under a lock the new life does not know, or
// never end: a read never answered, a move that never switches), no
// decree of its engine in flight (say, the resync done: committing after
// the reload it would make the table say what the new life no longer
// holds, and so would one decided but not yet seen in a linearizable
// table, review 38). An I/O that never ends keeps the replica failed, and
// so does a hung disk (Config.DiskTimeout) until it answers again: a
// replica loaded on it would only fail again, after its peer had begun to
// resync it and its writes to wait for it.
func (r *replica) retry(env Env) []any {
	if r.state == repLoading && r.dropAgain && !r.busy() && env.Now.Sub(r.droppedAt) >= r.e.cfg.RetryEvery {
		r.dropAgain = false
		return r.load(env)
	}
	if r.state == repFailed && !r.target && (r.rec.Stale[r.seg] || r.rec.Stale[r.peer()]) && env.Now.Sub(r.failedAt) >= r.e.cfg.ReloadEvery &&
		!r.busy() && !r.e.decreeOut && !r.e.awaitTable && !r.e.diskHung(r.disk) {
		// What still waits for the peer (pulls issued since the failure)
		// is answered first, in the failed life, so that it ends there
		// (a pullNewer's peerChanges count, a scrub's busy flag).
		out := r.abort(fmt.Errorf("%w: the segment is loaded again", ErrDiskFailed))
		if r.busy() || !r.locks.idle() || r.peerChanges != 0 {
			// An operation of the failed life still holds or awaits a
			// range: dropping it would let it act in the new life, or
			// never end (a read never answered, a move that never
			// switches). It ends in the failed life first.
			if !r.reloadHeld {
				r.reloadHeld = true
				out = append(out, r.e.logf(2, "rldev failed segment: an operation of its failed life is still in progress; loading it again later", "rldev", r.rec.ID,
					"locks held", len(r.locks.held), "locks awaited", len(r.locks.waiting), "taking from the peer", r.peerChanges))
			}
			return out
		}
		r.reloadHeld = false
		r.state, r.err, r.failedAt = repLoading, nil, env.Now
		r.blank, r.dropAgain, r.dropTries = false, false, 0
		r.staleSeen = r.rec.Stale[r.seg] // (a new life)
		r.inflight, r.touched = map[uint64]int{}, map[uint64]bool{}
		r.writes, r.fwd, r.pulls, r.copies = map[*writeOp]bool{}, map[uint64]*writeOp{}, map[uint64]*pullWait{}, map[uint64]*copyChunk{}
		r.tfwd, r.mv, r.fwdIn = map[uint64]*writeOp{}, nil, nil
		r.resync, r.resyncReq, r.recoverQ = nil, nil, nil
		r.owedW, r.owedLogged, r.owedAtLoad, r.owedWaiters = owedWriter{}, false, nil, nil
		r.scrub.busy = false
		out = append(out, r.e.logf(1, "rldev failed segment: loading it again", "rldev", r.rec.ID))
		return append(out, r.load(env)...)
	}
	if r.state != repReady {
		return nil
	}
	var out []any
	if r.peerStale() {
		// A read repair's or the scrubber's pull still waiting for a
		// peer that turned stale meanwhile: nothing will answer it
		// (outside review 61: the read hung until its client's timeout,
		// the pull sent again for ever). Its read fails as not served;
		// asked again, repair finds the peer stale: ErrCorrupt at once.
		// A copy's pull is answered when its copy stops (stopCopy); one
		// of a copy stopped already is answered here.
		for _, seq := range sortedSeqs(r.pulls) {
			if p := r.pulls[seq]; p.q == nil && (p.src == nil || !r.live(p.src)) {
				delete(r.pulls, seq)
				out = append(out, p.then(PullData{Code: NotServing})...)
			}
		}
	}
	if r.peerReachable() {
		for _, seq := range sortedSeqs(r.fwd) {
			w := r.fwd[seq]
			if w.peer.due(env.Now, r.rec.Epoch, r.e.cfg.RetryEvery) {
				out = append(out, w.send(env, &w.peer, true)...)
			}
		}
		for _, seq := range sortedSeqs(r.pulls) {
			p := r.pulls[seq]
			if env.Now.Sub(p.sentAt) >= r.e.cfg.RetryEvery {
				delete(r.pulls, seq)
				out = append(out, r.sendPull(env, p)...)
			}
		}
	}
	if s := r.resync; s != nil && !s.failed {
		for _, c := range r.copies {
			if c.src == s && !c.since.IsZero() && env.Now.Sub(maxTime(c.since, c.answeredAt)) > copyStall {
				// Up, its session too, and silent for copyStall: every
				// write waits for its answer. Given up (the RLDev is
				// degraded again), and this incarnation's next request
				// held (resyncHold). A target that keeps refusing is
				// given up by copyAcked, not held.
				r.resyncHeld, r.resyncHeldInc = env.Now.Add(resyncHold), s.peerInc
				out = append(out, r.stopResync(fmt.Sprintf("the target has answered no copy for %v", copyStall))...)
				break
			}
		}
	}
	for _, seq := range sortedSeqs(r.copies) {
		c := r.copies[seq]
		// Sent again, backing off as forwards do (resendAfter): only the
		// last send's answer counts (an earlier copy landing after the
		// chunk's range is released could overwrite a later write), so a
		// target slower per chunk than the interval -- each send one more
		// write in its queue -- never had an answer counted, and the
		// resync never ended (outside review 87: 486 copies answered, 4
		// counted).
		if r.e.up[c.src.to] && env.Now.Sub(c.sentAt) >= resendAfter(r.e.cfg.RetryEvery, c.resends) {
			delete(r.copies, seq)
			c.resends++
			out = append(out, r.sendCopy(env, c)...)
		}
	}
	if m := r.rec.Move; m != nil && r.e.up[m.To.Node] {
		for _, seq := range sortedSeqs(r.tfwd) {
			w := r.tfwd[seq]
			if w.tgt.due(env.Now, r.rec.Epoch, r.e.cfg.RetryEvery) {
				out = append(out, w.send(env, &w.tgt, true)...)
			}
		}
	}
	out = append(out, r.moveTick(env)...)
	if r.stale() && !r.target {
		out = append(out, r.askResync(env)...)
	}
	if r.recovering() > 0 {
		out = append(out, r.pumpRecovery(env)...)
	}
	return out
}

func (r *replica) nextSeq() uint64 { r.e.seq++; return r.e.seq }

// deliver handles a peer message for this RLDev.
func (r *replica) deliver(env Env, from NodeID, msg any) []any {
	switch m := msg.(type) {
	case Forward:
		return r.onForward(env, from, m)
	case Ack:
		if w := r.tfwd[m.Seq]; w != nil {
			delete(r.tfwd, m.Seq)
			return w.targetAcked(env, m)
		}
		if w := r.fwd[m.Seq]; w != nil {
			delete(r.fwd, m.Seq)
			return w.acked(env, m)
		}
		if c := r.copies[m.Seq]; c != nil {
			delete(r.copies, m.Seq)
			return r.copyAcked(env, c, m)
		}
	case Pull:
		return r.onPull(env, from, m)
	case PullData:
		if p := r.pulls[m.Seq]; p != nil {
			delete(r.pulls, m.Seq)
			if from != p.to || from != r.peerNode() || m.Code == WrongEpoch || m.Code == NotServing || m.Code == Unknown {
				// Another node's, or a former peer's answer (say a
				// secondary moved away, which may be wiping its
				// extent); or the peer is not ready, or acts in
				// another epoch: ask the peer again later (retry).
				p.sentAt = env.Now
				r.pulls[r.nextSeq()] = p
				return []any{Refresh{}}
			}
			return p.then(m)
		}
	case ResyncMe:
		return r.onResyncMe(env, from, m)
	case Copy:
		return r.onCopy(env, from, m)
	}
	return nil
}

// epochCheck answers a peer that acts in another epoch.
func (r *replica) epochCheck(epoch uint64) (Code, []any) {
	switch {
	case epoch == r.rec.Epoch:
		return OK, nil
	case epoch > r.rec.Epoch:
		return WrongEpoch, []any{Refresh{}} // this replica is behind: catch up
	}
	return WrongEpoch, nil
}

// ------------------------------------------------------------------ generations and tokens

// gen takes the next write generation (above every one taken before,
// across restarts and failovers), then runs then with it.
func (r *replica) gen(then func(g uint64, err error) []any) []any {
	g := max(r.nextGen, r.rec.Epoch<<40)
	if g < r.super.GenFloor {
		r.nextGen = g + 1
		return then(g, nil)
	}
	// Raise the floor, durably, before using generations at or above it.
	return r.writeSuper(func(s *Super) { s.GenFloor = max(s.GenFloor, g+1<<20) }, func(err error) []any {
		if err != nil {
			return then(0, err)
		}
		return r.gen(then)
	})
}

// writeSuper changes the superblock durably (one write in flight; changes
// asked meanwhile go into the next), then runs then.
func (r *replica) writeSuper(change func(*Super), then func(error) []any) []any {
	r.superQ = append(r.superQ, func(err error) []any { return then(err) })
	r.superChanges = append(r.superChanges, change)
	if r.superW {
		return nil
	}
	return r.flushSuper()
}

func (r *replica) flushSuper() []any {
	if r.superW || len(r.superQ) == 0 {
		return nil
	}
	r.superW = true
	ns := r.super
	for _, c := range r.superChanges {
		c(&ns)
	}
	r.superChanges = nil
	q := r.superQ
	r.superQ = nil
	seq := r.superSeq + 1
	p, err := EncodePage(PageSuper, seq, encodeSuper(ns), PageSize)
	if err != nil {
		panic(err)
	}
	off, _ := pageSlot(PageSuper, seq%2)
	return r.writeDurable(r.base+off, p, func(err error) []any {
		r.superW = false
		if err == nil {
			r.super, r.superSeq = ns, seq
		}
		var out []any
		if err != nil {
			out = append(out, r.fail(err)...)
		}
		for _, fn := range q {
			out = append(out, fn(err)...)
		}
		return append(out, r.flushSuper()...)
	})
}

// admit checks a fence against the newest token admitted for its lock and
// makes a newer one durable before then runs (lock.TokenGuard's contract,
// kept across restarts).
func (r *replica) admit(f *Fence, then func(error) []any) []any {
	if f == nil {
		return then(nil)
	}
	cur, ok := r.tokNext[f.Name]
	if !ok {
		cur = r.tokens[f.Name]
	}
	if f.Token.Less(cur) {
		return then(fmt.Errorf("%w: %v on %q is older than %v", ErrStaleToken, f.Token, f.Name, cur))
	}
	if d, ok := r.tokens[f.Name]; ok && !d.Less(f.Token) {
		return then(nil) // already durable
	}
	if _, ok := r.tokens[f.Name]; !ok && len(r.tokens)+len(r.tokNext) >= MaxTokenNames {
		if _, pending := r.tokNext[f.Name]; !pending {
			return then(fmt.Errorf("%w: %w", ErrBadRequest, ErrTooManyTokens))
		}
	}
	r.tokNext[f.Name] = f.Token
	r.tokQ = append(r.tokQ, then)
	return r.flushTokens()
}

// tokenList is the durable token table as fences, by name.
func (r *replica) tokenList() []Fence {
	out := make([]Fence, 0, len(r.tokens))
	for n, t := range r.tokens {
		out = append(out, Fence{Name: n, Token: t})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// mergeTokens makes the newer of each token here and in fs durable (a
// resync's source passes its table on), then runs then. Past the table's
// bound, the source's names win.
func (r *replica) mergeTokens(fs []Fence, then func(error) []any) []any {
	changed := false
	for _, f := range fs {
		cur, ok := r.tokNext[f.Name]
		if !ok {
			cur = r.tokens[f.Name]
		}
		if _, known := r.tokens[f.Name]; cur.Less(f.Token) || !known && !ok {
			r.tokNext[f.Name] = f.Token
			changed = true
		}
	}
	if !changed {
		return then(nil)
	}
	if len(r.tokens)+len(r.tokNext) > MaxTokenNames {
		keep := map[string]bool{}
		for _, f := range fs {
			keep[f.Name] = true
		}
		for n := range r.tokens {
			if !keep[n] && len(r.tokens)+len(r.tokNext) > MaxTokenNames {
				delete(r.tokens, n)
			}
		}
	}
	r.tokQ = append(r.tokQ, then)
	return r.flushTokens()
}

func (r *replica) flushTokens() []any {
	if r.tokW || len(r.tokQ) == 0 {
		return nil
	}
	m := map[string]lock.Token{}
	for n, t := range r.tokens {
		m[n] = t
	}
	for n, t := range r.tokNext {
		if m[n].Less(t) {
			m[n] = t
		}
	}
	r.tokNext = map[string]lock.Token{}
	r.tokCur, r.tokQ = r.tokQ, nil
	r.tokW = true
	payload, err := encodeTokens(m)
	if err != nil {
		panic(err) // bounded in admit
	}
	seq := r.tokSeq + 1
	p, err := EncodePage(PageTokens, seq, payload, tokenArea)
	if err != nil {
		panic(err)
	}
	off, _ := pageSlot(PageTokens, seq%2)
	return r.writeDurable(r.base+off, p, func(err error) []any {
		r.tokW = false
		if err == nil {
			r.tokens, r.tokSeq = m, seq
		}
		q := r.tokCur
		r.tokCur = nil
		var out []any
		if err != nil {
			out = append(out, r.fail(err)...)
		}
		for _, fn := range q {
			out = append(out, fn(err)...)
		}
		return append(out, r.flushTokens()...)
	})
}

// ------------------------------------------------------------------ block I/O

// encodeRun turns data (whole blocks from block on) into physical blocks.
func (r *replica) encodeRun(block uint64, data []byte, gens []uint64, gen uint64) []byte {
	return encodeBlocks(r.rec.ID, block, data, gens, gen)
}

// encodeBlocks is encodeRun for RLDev id: a pure function of its
// arguments, safe off the engine's lock.
func encodeBlocks(id, block uint64, data []byte, gens []uint64, gen uint64) []byte {
	n := len(data) / BlockSize
	out := getPhys(n) // every byte written below; DoWrite gives it back
	for i := 0; i < n; i++ {
		g := gen
		if gens != nil {
			g = gens[i]
		}
		dst := out[i*PhysBlockSize : (i+1)*PhysBlockSize]
		if g == badGen {
			markCorrupt(dst) // the source had no valid copy of this block
			continue
		}
		EncodeBlock(dst, id, block+uint64(i), g, data[i*BlockSize:(i+1)*BlockSize])
	}
	return out
}

// Encoded is a block write as the disk gets it: each block's header, then
// its data, in order (Vec), the data not copied (a 1 MiB write's copy into
// a buffer of physical blocks was a sixth of the CPU of 1 MiB writes: the
// profile of BenchmarkServiceWrite1M). DoWrite writes it with one vectored
// write, or, to a device that writes no vectors, gathers it first. Its
// headers come from hdrBufs, given back (release) once the write
// returned.
type Encoded struct {
	Vec  [][]byte
	hdrs []byte
}

// encodeBlocksVec is encodeBlocks without the data's copy: the same bytes
// on disk (TestEncodeBlocksVecMatches), a pure function of its arguments,
// safe off the engine's lock. Vec holds data's blocks, which must not
// change until the write returned (the engine's writes keep their data
// unchanged for good).
func encodeBlocksVec(id, block uint64, data []byte, gens []uint64, gen uint64) Encoded {
	n := len(data) / BlockSize
	hdrs := getHdrs(n) // every byte written below
	vec := make([][]byte, 0, 2*n)
	for i := 0; i < n; i++ {
		g := gen
		if gens != nil {
			g = gens[i]
		}
		h, d := hdrs[i*HeaderSize:(i+1)*HeaderSize], data[i*BlockSize:(i+1)*BlockSize]
		if g == badGen {
			copy(h, corruptBlock[:HeaderSize])
			d = corruptBlock[HeaderSize:] // read only
		} else {
			EncodeHeader(h, id, block+uint64(i), g, d)
		}
		vec = append(vec, h, d)
	}
	return Encoded{Vec: vec, hdrs: hdrs}
}

// Len is the bytes the write covers.
func (e Encoded) Len() int { return len(e.Vec) / 2 * PhysBlockSize }

// gather returns the write's bytes in one buffer of physBufs (putPhys it).
func (e Encoded) gather() []byte {
	out := getPhys(len(e.Vec) / 2)
	k := 0
	for _, b := range e.Vec {
		k += copy(out[k:], b)
	}
	return out
}

// release gives the headers back; e is not used again.
func (e Encoded) release() { putHdrs(e.hdrs) }

// corruptBlock is the physical block markCorrupt writes (read only).
var corruptBlock = func() []byte {
	b := make([]byte, PhysBlockSize)
	markCorrupt(b)
	return b
}()

// badGen marks, in a copy's generations, a block the source could not read
// (its only copy is corrupt): the target writes a block that fails its
// check, so that the loss is reported rather than old data served.
const badGen = ^uint64(0)

func markCorrupt(dst []byte) {
	clear(dst)
	copy(dst, []byte{0x47, 0x52, 0x56, 0x42}) // magic, no valid checksum
	dst[HeaderSize] = 0xff
}

// readRun reads blocks [block, block+n) and decodes them: data, their
// generations, and the blocks that failed their checks. The runtime reads
// them vectored and checks them off the engine's lock (ReadRun).
func (r *replica) readRun(block, n uint64, then func(data []byte, gens []uint64, bad []uint64, err error) []any) []any {
	return r.readRunFor(0, block, n, then)
}

// readRunFor is readRun for client request req, whose reply alone then
// may give the data to (DiskRead.Lend); 0 for any other read.
func (r *replica) readRunFor(req ReqID, block, n uint64, then func(data []byte, gens []uint64, bad []uint64, err error) []any) []any {
	r.reading++
	return r.e.readRun(r.disk, r.base+blockOff(block), BlockRun{ID: r.rec.ID, First: block, N: n}, req, func(res RunData, err error) []any {
		r.reading--
		if err != nil {
			return then(nil, nil, nil, err)
		}
		r.e.stats.CorruptFound += uint64(len(res.Bad))
		return then(res.Data, res.Gens, res.Bad, nil)
	})
}
