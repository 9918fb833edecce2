package rldev

import (
	"fmt"
	"sort"
	"time"
)

// resyncSrc is a resync in progress on the up-to-date replica (the
// primary of a resyncing RLDev): the block ranges still to copy to the
// stale replica, in chunks of CopyBlocks, CopyWindow of them in flight.
//
// A move's copy (move.go) is the same machinery with another destination:
// the move's target, every block, bound to the target's incarnation.
type resyncSrc struct {
	to       NodeID // where the copies go
	peerInc  uint64 // a resync's: the peer incarnation the table named when it started (only it is declared resynced)
	move     bool   // a move's copy (to the target) rather than a resync
	inc      uint64 // a move's: the target incarnation it copies to
	epoch    uint64
	chunks   []run
	next     int
	inflight int
	copied   uint64
	total    uint64
	failed   bool
	reported time.Time
}

func (s *resyncSrc) done() bool { return !s.failed && s.next == len(s.chunks) && s.inflight == 0 }

// copyChunk is one chunk in flight: read under an exclusive range lock
// (no write interleaves until the target has it), sent, acknowledged.
type copyChunk struct {
	src     *resyncSrc
	first   uint64
	n       uint64
	lock    *rangeLock
	data    []byte
	gens    []uint64
	sentAt  time.Time
	since   time.Time // first sent: a target that refuses it for CopyStall stops the resync
	resends int       // times sent again (resendAfter)
	// answeredAt: the target's last answer to it (a refusal): silence is
	// counted from then (a target that refused, then went silent, is
	// given up as silent: outside review 88).
	answeredAt time.Time
	// repaired: a move's chunk had blocks failing their check, repaired
	// from the peer once before it is read again; compared: its
	// generations were compared with the moving secondary's.
	repaired, compared bool
}

// copyStall is how long a resync target may refuse a copy (not serving,
// another epoch) before the source gives the resync up; the RLDev goes
// back to degraded and the target asks again when it can.
const copyStall = 30 * time.Second

// resyncHold: a resync given up because its target answered no copy for
// copyStall (up, its session too, but silent: its engine wedged) is not
// started again before this has passed: every write waits for a resync
// target's answer, and without the hold a target that asks again at once
// would hold them up again and again.
const resyncHold = 2 * copyStall

// askResync: a stale replica asks the up-to-date one, every RetryEvery,
// to bring it up to date, while the RLDev is degraded (while it is
// resyncing, the source is at work; if it stops, the RLDev goes back to
// degraded and the replica asks again).
func (r *replica) askResync(env Env) []any {
	if !r.ready() || !r.stale() || r.rec.State != Degraded || !r.peerReachable() || env.Now.Sub(r.askedAt) < r.e.cfg.RetryEvery {
		return nil
	}
	r.askedAt = env.Now
	return []any{Send{To: r.peerNode(), Msg: ResyncMe{RLDev: r.rec.ID, Epoch: r.rec.Epoch, Dirty: r.drl.durable.List(), Blank: r.blank || r.super.Incomplete}}}
}

// onResyncMe: the up-to-date replica takes a stale one's request; decide
// proposes the resyncing state, and the copy starts when it commits.
func (r *replica) onResyncMe(env Env, from NodeID, m ResyncMe) []any {
	if !r.ready() || !r.isPrimary() || r.stale() || from != r.peerNode() || !r.peerStale() {
		return nil
	}
	if r.rec.State == Resyncing && r.resync != nil && !r.resync.failed {
		return nil // already at it
	}
	mm := m
	r.resyncReq = &mm
	return nil
}

// startResync computes what the target lacks and starts copying it: the
// regions of the degraded-mode log, those of either replica's dirty-region
// log, or everything if the target's segment was lost.
func (r *replica) startResync(env Env) []any {
	req := r.resyncReq
	r.resyncReq = nil
	if req == nil || !r.peerReachable() {
		// No request of the peer's present incarnation (peerDown drops
		// them), or no session to it: decide proposes going back to
		// degraded, and the peer asks again when it is back.
		return nil
	}
	blocks := r.rec.Blocks
	need := map[uint64]bool{} // block ranges by first block, CopyBlocks-aligned chunks
	addRange := func(first, n uint64) {
		cb := r.e.cfg.CopyBlocks
		for c := first / cb * cb; c < first+n && c < blocks; c += cb {
			need[c] = true
		}
	}
	if r.rec.FullCopy || req.Blank {
		addRange(0, blocks)
	} else {
		dgb := r.deg.durable.RegionBlocks
		for x := uint64(0); x < r.deg.durable.Regions(); x++ {
			if r.deg.durable.Has(x) || r.deg.set.Has(x) {
				addRange(x*dgb, dgb)
			}
		}
		drb := r.drl.durable.RegionBlocks
		for x := uint64(0); x < r.drl.durable.Regions(); x++ {
			if r.drl.durable.Has(x) || r.drl.set.Has(x) {
				addRange(x*drb, drb)
			}
		}
		for _, x := range req.Dirty {
			addRange(x*drb, drb)
		}
	}
	if len(need) == 0 && len(r.tokens) > 0 {
		addRange(0, 1) // one copy at least: it carries the fencing tokens
	}
	firsts := make([]uint64, 0, len(need))
	for f := range need {
		firsts = append(firsts, f)
	}
	sort.Slice(firsts, func(i, j int) bool { return firsts[i] < firsts[j] })
	s := &resyncSrc{to: r.peerNode(), peerInc: r.rec.Inc[r.peer()], epoch: r.rec.Epoch, reported: env.Now}
	for _, f := range firsts {
		n := min(r.e.cfg.CopyBlocks, blocks-f)
		s.chunks = append(s.chunks, run{f, n})
		s.total += n
	}
	r.resync = s
	out := []any{r.e.logf(1, "rldev resync started", "rldev", r.rec.ID, "epoch", r.rec.Epoch, "blocks", s.total,
		"full", r.rec.FullCopy || req.Blank)}
	return append(out, r.pump(env, s)...)
}

// live reports whether s is this replica's resync or move copy, going on.
func (r *replica) live(s *resyncSrc) bool {
	return s != nil && !s.failed && (s == r.resync || s == r.mv)
}

// pump keeps CopyWindow chunks of s in flight.
func (r *replica) pump(env Env, s *resyncSrc) []any {
	var out []any
	for r.live(s) && s.inflight < r.e.cfg.CopyWindow && s.next < len(s.chunks) {
		ch := s.chunks[s.next]
		if rate := r.e.cfg.CopyRate; rate > 0 {
			if env.Now.Before(r.e.copyAt) {
				break // Tick pumps again
			}
			r.e.copyAt = maxTime(r.e.copyAt, env.Now).Add(timePerBytes(int64(ch.n*BlockSize), rate))
		}
		s.next++
		s.inflight++
		out = append(out, r.readChunk(&copyChunk{src: s, first: ch.first, n: ch.n})...)
	}
	return out
}

// readChunk reads a chunk to copy under an exclusive range lock (held
// until the target has it) and sends it. A block that fails its check
// here is, for a move (the other replica is up to date too), repaired
// from the peer first, the range released meanwhile, then read again;
// for a resync this is the only copy: the target is told it is lost.
func (r *replica) readChunk(c *copyChunk) []any {
	if !r.live(c.src) {
		return nil
	}
	var out []any
	c.lock, out = r.locks.acquire(c.first, c.n, true, func(lk *rangeLock) []any {
		c.lock = lk
		return r.readRun(c.first, c.n, func(data []byte, gens []uint64, bad []uint64, err error) []any {
			if err != nil {
				return append(r.locks.release(c.lock), r.fail(err)...)
			}
			if !r.live(c.src) {
				// Stopped while the chunk waited for its range or read
				// it: nothing more. A move's comparison asked of the peer
				// now would hold the range until the peer answered, which
				// a peer turned stale never does: the resync that follows
				// waited behind it for ever (the simulator, seed 5084 of
				// the as-run stream; TestStoppedMoveChunkReleasesItsRange).
				return r.locks.release(c.lock)
			}
			send := func() []any {
				for _, b := range bad {
					gens[b-c.first] = badGen // the only copy is gone: the target says so too
				}
				c.data, c.gens = data, gens
				return r.sendCopy(r.e.env, c)
			}
			if len(bad) > 0 && c.src.move && !c.repaired && !r.peerStale() {
				c.repaired = true
				out := r.locks.release(c.lock)
				return append(out, r.repair(bad, func(error) []any { return r.readChunk(c) })...)
			}
			if m := r.rec.Move; c.src.move && m != nil && m.Seg != r.seg && !c.compared && !r.peerStale() {
				// The secondary moves away: its copy is about to be
				// dropped. A block it holds newer than this one (a write
				// this replica lost, say misdirected, and no scrub pass
				// found yet) is taken from it first, or it would be lost.
				c.compared = true
				return r.sendPull(r.e.env, &pullWait{first: c.first, n: c.n, gensOnly: true, src: c.src, then: func(pd PullData) []any {
					if !r.live(c.src) {
						return r.locks.release(c.lock)
					}
					if pd.Code != OK && pd.Code != Corrupt || uint64(len(pd.Gens)) != c.n {
						r.mvStale = true // not compared: the copy runs again
						return send()
					}
					if newer := olderHere(c.first, gens, bad, pd); len(newer) > 0 {
						out := r.locks.release(c.lock)
						return append(out, r.pullNewer(newer, func(error) []any { return r.readChunk(c) })...)
					}
					return send()
				}})
			}
			return send()
		})
	})
	return out
}

func (r *replica) sendCopy(env Env, c *copyChunk) []any {
	if !r.live(c.src) {
		return r.locks.release(c.lock)
	}
	seq := r.nextSeq()
	c.sentAt = env.Now
	if c.since.IsZero() {
		c.since = env.Now
	}
	r.copies[seq] = c
	if !r.e.up[c.src.to] {
		return nil
	}
	// Every copy carries the source's fencing tokens: what it admitted
	// while the target was away must hold at the target after a failover.
	return []any{Send{To: c.src.to, Msg: Copy{RLDev: r.rec.ID, Epoch: r.rec.Epoch, Seq: seq, Block: c.first, Data: c.data, Gens: c.gens,
		Tokens: r.tokenList(), Target: c.src.move}}}
}

func (r *replica) copyAcked(env Env, c *copyChunk, a Ack) []any {
	s := c.src
	if !r.live(s) {
		return r.locks.release(c.lock)
	}
	switch a.Code {
	case OK:
		s.inflight--
		s.copied += c.n
		r.e.stats.CopiedBlocks += c.n
		out := r.locks.release(c.lock)
		out = append(out, r.pump(env, s)...)
		if s.done() {
			what := "rldev resync copied everything"
			if s.move {
				what = "rldev move copied everything"
			}
			out = append(out, r.e.logf(1, what, "rldev", r.rec.ID, "blocks", s.copied))
		}
		return out
	case WrongEpoch, NotServing, Unknown:
		// A move's target that stays away is declared dead (its copy then
		// starts again when it is back): the move does not give up.
		if !s.move && env.Now.Sub(c.since) > copyStall {
			out := r.locks.release(c.lock)
			return append(out, r.stopResync(fmt.Sprintf("the target has refused a copy for %v: %v", copyStall, a.Code.Err()))...)
		}
		// The target has not caught up with this epoch yet: again soon.
		c.sentAt, c.answeredAt = env.Now, env.Now
		r.copies[r.nextSeq()] = c
		if a.Code == WrongEpoch && a.Epoch > r.rec.Epoch {
			return []any{Refresh{}}
		}
		return nil
	}
	out := r.locks.release(c.lock) // no longer in r.copies: stopResync would not see it
	if s.move {
		return append(out, r.stopCopy(s, "the move's target refused a copy: "+a.Code.Err().Error())...)
	}
	return append(out, r.stopResync("the target refused a copy: "+a.Code.Err().Error())...)
}

// stopResync abandons the resync (the target went away, or the state
// changed); decide takes the RLDev back to degraded, and the target asks
// again when it can.
func (r *replica) stopResync(why string) []any {
	return r.stopCopy(r.resync, why)
}

// stopCopy abandons the resync or move copy s.
func (r *replica) stopCopy(s *resyncSrc, why string) []any {
	if s == nil || s.failed {
		return nil
	}
	s.failed = true
	var out []any
	for _, seq := range sortedSeqs(r.copies) {
		c := r.copies[seq]
		if c.src == s {
			delete(r.copies, seq)
			out = append(out, r.locks.release(c.lock)...)
		}
	}
	// Chunks still waiting for their range or reading it release it in
	// sendCopy, which drops them; those waiting for the peer's
	// generations (a move's comparison) are answered now (the peer may
	// never answer: it may be the one the move replaced).
	for _, seq := range sortedSeqs(r.pulls) {
		if p := r.pulls[seq]; p.src == s {
			delete(r.pulls, seq)
			out = append(out, p.then(PullData{Code: NotServing})...)
		}
	}
	what := "rldev resync"
	if s.move {
		what = "rldev move copy"
	}
	if s.done() || s.copied == s.total {
		return append(out, r.e.logf(1, what+" over", "rldev", r.rec.ID, "copied", s.copied))
	}
	return append(out, r.e.logf(2, what+" stopped", "rldev", r.rec.ID, "why", why, "copied", s.copied, "of", s.total))
}

// peerDown: a resync whose target went away stops (writes must not wait
// for a stale replica: decide takes the RLDev back to degraded). A stale
// peer's request to be resynced is dropped too: it was its incarnation's,
// and one that comes back (with its disk replaced, say: blank) asks
// again. A "resync" decree planned from it that commits after the break
// then starts nothing, and decide takes the RLDev back to degraded
// (outside review 71: the resync started toward a node that was down
// never stopped, and one planned from the previous incarnation's request
// declared a blank segment up to date).
func (r *replica) peerDown(env Env, node NodeID) []any {
	if m := r.rec.Move; m != nil && m.Inc != 0 && node == m.To.Node && r.tgtDown.IsZero() {
		// The move's target: the stall clock starts now, whether or not
		// decide runs now (not while a decree of this engine is out).
		r.tgtDown, r.tgtDownInc = env.Now, m.Inc
	}
	if node != r.peerNode() {
		return nil
	}
	r.resyncReq = nil
	if r.resync == nil {
		return nil
	}
	return r.stopResync("the target's session broke")
}

// onCopy writes a resync chunk on the target, overwriting what is there.
func (r *replica) onCopy(env Env, from NodeID, m Copy) []any {
	ack := func(c Code) []any {
		return []any{Send{To: from, Msg: Ack{RLDev: m.RLDev, Seq: m.Seq, Code: c, Epoch: r.rec.Epoch}}}
	}
	if c, out := r.epochCheck(m.Epoch); c != OK {
		return append(out, ack(c)...)
	}
	n := uint64(len(m.Data)) / BlockSize
	switch {
	case r.state == repFailed:
		return ack(DiskFailed)
	case r.target && (r.state != repReady || from != r.peerNode() || !r.receiving()):
		return ack(NotServing)
	case !r.target && (r.state != repReady || from != r.peerNode() || r.rec.State != Resyncing || !r.stale()):
		return ack(NotServing)
	case len(m.Data)%BlockSize != 0 || n == 0 || uint64(len(m.Gens)) != n || r.checkRange(m.Block, n) != nil:
		return ack(BadRequest)
	case !r.target && r.rec.FullCopy && (!r.super.Overwritten || r.super.Incomplete && r.super.TargetInc != r.e.cfg.Inc):
		// The first block of a full copy lands only once the superblock
		// says that one began (Super.Overwritten); the copy is taken
		// again then, its checks with it. An incomplete segment's
		// superblock also names the incarnation the copy goes to
		// (TargetInc, as a move's target does): the "resynced" decree
		// is for that incarnation alone (resyncSrc.peerInc), so one that
		// finds its segment incomplete, the table naming that
		// incarnation and saying it up to date, holds the whole copy --
		// it died between the decree and clearing Incomplete -- and is
		// not taken for lost (loaded).
		return r.writeSuper(func(s *Super) {
			s.Overwritten = true
			if s.Incomplete {
				s.TargetInc = r.e.cfg.Inc
			}
		}, func(err error) []any {
			if err != nil {
				return append(r.fail(fmt.Errorf("marking the segment overwritten by a full copy: %w", err)), ack(DiskFailed)...)
			}
			return r.onCopy(r.e.env, from, m)
		})
	}
	var out []any
	_, out = r.locks.acquire(m.Block, n, true, func(lk *rangeLock) []any {
		r.forgetLanded() // the source's blocks land here
		return r.writeBlocks(m.Block, m.Data, m.Gens, 0, func(err error) []any {
			if err != nil {
				out := r.locks.release(lk)
				out = append(out, r.fail(err)...)
				return append(out, ack(DiskFailed)...)
			}
			// The source's tokens, durable before the ack.
			return r.mergeTokens(m.Tokens, func(err error) []any {
				out := r.locks.release(lk)
				if err != nil {
					return append(out, ack(DiskFailed)...)
				}
				return append(out, ack(OK)...)
			})
		})
	})
	return out
}
