package rldev

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// writeOp is a write in progress on the replica that orders it: the
// primary (or, for WriteReplica, the named replica alone). It holds its
// block range exclusively from start to acknowledgement, and progresses
// through what the current epoch requires (progress): the fence admitted;
// the dirty regions durable (normal state, before anything is written or
// forwarded); the local copy durable; the peer's acknowledgement in this
// epoch (normal: the secondary; resyncing: the target); the degraded-mode
// log durable (degraded and resyncing). When the epoch changes mid-way
// (the peer declared dead, a resync starting), the requirements are
// evaluated again.
type writeOp struct {
	id       uint64 // order of arrival
	r        *replica
	req      ReqID
	wid      WriteID // the client's write (landed.go)
	block, n uint64
	data     []byte
	fence    *Fence
	only     bool // WriteReplica: this replica alone
	seqWrite bool // it begins where the write before it here ended
	lock     *rangeLock
	locked   bool

	admitted, admitting bool
	drlDone, drlWaiting bool
	degDone, degWaiting bool
	gen                 uint64
	genWaiting          bool
	local               int // 0 not started, 1 writing, 2 durable
	// rewrite: the write landed here before, with generation landedGen
	// (an earlier attempt, its WriteID remembered when the range was
	// granted): it writes the range's current content instead of its
	// data, read once the logs are marked (reread), and answers
	// LandedBefore.
	rewrite, reread, rereading bool
	landedGen                  uint64

	peer leg // the forward to the peer
	tgt  leg // the forward to a move's target (move.go)

	done bool
	// A write that ends while its local disk write is still in flight
	// keeps its range (and its regions counted in flight) until that
	// write lands: the disk runs writes in any order, so a later write of
	// the range -- or the pull-back of a write the peer refused -- issued
	// meanwhile could land first and be overwritten by this one.
	held     bool
	pullBack *rangeLock // the range to pull back from the peer once the local write landed
}

// regions of the two logs the write touches.
func (w *writeOp) drlSpan() (uint64, uint64) { return w.r.drl.durable.Span(w.block, w.n) }
func (w *writeOp) degSpan() (uint64, uint64) { return w.r.deg.durable.Span(w.block, w.n) }

func (r *replica) clientWrite(env Env, req ReqID, wid WriteID, block uint64, data []byte, fence *Fence, only bool) []any {
	r.e.seq++
	w := &writeOp{id: r.e.seq, r: r, req: req, wid: wid, block: block, n: uint64(len(data)) / BlockSize, data: data, fence: fence, only: only, tgt: leg{target: true}}
	w.seqWrite = block == r.lastEnd && block > 0
	r.lastEnd = block + w.n
	r.writes[w] = true
	var out []any
	w.lock, out = r.locks.acquire(block, w.n, true, func(lk *rangeLock) []any {
		r.owedUnwait(lk)
		if w.done {
			return r.locks.release(lk)
		}
		w.lock, w.locked = lk, true
		// Looked up once the range is granted: an earlier attempt still
		// in progress here has landed, or failed, by then.
		if !w.only && !r.e.cfg.Unsafe.ApplyRetries {
			w.landedGen, w.rewrite = r.landed.landed(w.wid, w.block, w.n, r.e.env.Now)
		}
		a, b := w.drlSpan()
		for x := a; x <= b; x++ {
			r.inflight[x]++
			r.touched[x] = true
		}
		c, d := w.degSpan()
		for x := c; x <= d; x++ {
			r.inflightDeg(x, 1)
		}
		return w.progress(r.e.env)
	})
	if !w.locked && !w.done {
		r.owedAwait(w.lock, block, w.n, func(err error) []any { return w.finish(err) })
	}
	return out
}

func (r *replica) inflightDeg(x uint64, d int) {
	// Degraded-mode regions are tracked in the same map, offset past the
	// dirty-region ids (a region id space per log).
	k := 1<<62 | x
	r.inflight[k] += d
	if r.inflight[k] == 0 {
		delete(r.inflight, k)
	}
}

// progress does the next steps the write needs, or finishes it.
func (w *writeOp) progress(env Env) []any {
	r := w.r
	if w.done || !w.locked {
		return nil
	}
	rec := r.rec
	switch {
	case r.state != repReady:
		return w.finish(fmt.Errorf("%w: replica not ready", ErrNotServing))
	case r.stale():
		return w.finish(fmt.Errorf("%w: this replica is stale", ErrNotServing))
	case !w.only && !r.isPrimary():
		return w.finish(fmt.Errorf("%w (rldev %d)", ErrNotPrimary, rec.ID))
	}
	// The fence first: a write with a stale token must never land.
	if !w.admitted {
		if w.admitting {
			return nil
		}
		w.admitting = true
		return r.admit(w.fence, func(err error) []any {
			w.admitting = false
			if err != nil {
				return w.finish(err)
			}
			w.admitted = true
			return w.progress(r.e.env)
		})
	}
	// The dirty-region log covers a write whenever it goes to the peer
	// (normal and resyncing): a write of the resyncing epoch still in
	// flight when the RLDev returns to normal must be found after a crash
	// as surely as one of the normal epoch.
	needDRL := !w.only && (rec.State == Normal || rec.State == Resyncing) && !rec.DRLOff && !r.e.cfg.Unsafe.NoDirtyLog
	needPeer := !w.only && (rec.State == Normal || rec.State == Resyncing)
	needDeg := !w.only && (rec.State == Degraded || rec.State == Resyncing)
	// A move's target gets every write while it receives the copy (a
	// range not copied yet is copied later, with this write in it).
	needTgt := !w.only && r.moveSource()
	var out []any
	// Dirty regions durable before anything is written or forwarded: after
	// a crash the replica finds them and pulls them from its peer.
	if needDRL && !w.drlDone {
		if !w.drlWaiting {
			w.drlWaiting = true
			a, b := w.drlSpan()
			// A sequential writer's next region is marked ahead, in the
			// log write this one needs or in one of its own that no write
			// waits for: a stream of writes then never waits for a mark
			// (1 MiB sequential writes each began with a log write and a
			// sync of their own).
			if w.seqWrite {
				r.drl.markAhead(b + 1)
				r.touched[b+1] = true // kept through the next lazy clear
			}
			out = append(out, r.drl.mark(a, b, func(err error) []any {
				w.drlWaiting = false
				if err != nil {
					return w.finish(err)
				}
				w.drlDone = true
				return w.progress(r.e.env)
			})...)
			out = append(out, r.drl.flush()...) // a mark ahead alone
		}
		return out
	}
	// The degraded-mode log, likewise, before anything is written: a
	// block that lands without its region in the log would be missed by
	// the resync.
	if needDeg && !w.degDone {
		if !w.degWaiting {
			w.degWaiting = true
			a, b := w.degSpan()
			out = append(out, r.deg.mark(a, b, func(err error) []any {
				w.degWaiting = false
				if err != nil {
					return w.finish(err)
				}
				w.degDone = true
				return w.progress(r.e.env)
			})...)
		}
		return out
	}
	// A write that landed here before writes what the range holds now
	// (landed.go): its own data again could land over a later write.
	if w.rewrite && !w.reread {
		if !w.rereading {
			w.rereading = true
			out = append(out, r.readRun(w.block, w.n, func(data []byte, gens []uint64, bad []uint64, err error) []any {
				switch {
				case w.done:
					return nil
				case err != nil:
					w.rereading = false
					return append(r.fail(err), w.finish(err)...) // fail ends the write first
				}
				// Per block, the newest sound copy of this one's and (normal
				// state) the peer's: a block lost or rotten here, or a later
				// write this disk lost, is taken from the peer; only a block
				// older than the write on both copies gets the write's own
				// data (review 115).
				merge := func(pd *PullData) []any {
					w.reread, w.rereading = true, false
					own, merged := 0, make([]byte, len(data))
					for i := uint64(0); i < w.n; i++ {
						b := w.block + i
						best, src := uint64(0), []byte(nil)
						if !slices.Contains(bad, b) {
							best, src = gens[i], data[i*BlockSize:(i+1)*BlockSize]
						}
						if pd != nil && !slices.Contains(pd.Bad, b) && (src == nil || pd.Gens[i] > best) {
							best, src = pd.Gens[i], pd.Data[i*BlockSize:(i+1)*BlockSize]
						}
						if src == nil || best < w.landedGen {
							own++
							src = w.data[i*BlockSize : (i+1)*BlockSize]
						}
						copy(merged[i*BlockSize:], src)
					}
					if own > 0 {
						w.rewrite = false // applied again, in part: the clerk counts it
						r.e.stats.LandedStale++
					}
					w.data = merged
					return w.progress(r.e.env)
				}
				if r.rec.State != Normal || r.peerStale() {
					return merge(nil)
				}
				return r.pull(w.block, w.n, func(pd PullData) []any {
					if w.done {
						return nil
					}
					if !pd.usable(w.n) {
						return merge(nil)
					}
					return merge(&pd)
				})
			})...)
		}
		return out
	}
	if w.gen == 0 {
		if !w.genWaiting {
			w.genWaiting = true
			out = append(out, r.gen(func(g uint64, err error) []any {
				w.genWaiting = false
				if err != nil {
					return w.finish(err)
				}
				w.gen = g
				return w.progress(r.e.env)
			})...)
		}
		return out
	}
	// The forwards first: the copies are written in parallel, and the
	// peer's (the longer way) starts as early as it can.
	if needPeer && w.peer.epoch != rec.Epoch {
		out = append(out, w.send(env, &w.peer, false)...)
	}
	if needTgt && w.tgt.epoch != rec.Epoch {
		out = append(out, w.send(env, &w.tgt, false)...)
	}
	if w.local == 0 {
		w.local = 1
		out = append(out, r.writeBlocks(w.block, w.data, nil, w.gen, func(err error) []any {
			w.local = 2
			if err == nil && w.pullBack == nil && !w.only {
				// Before a held range is let go: a retry waiting for it
				// finds the write landed (outside review 114).
				r.rememberLanded(w.wid, w.block, w.n, w.gen)
			}
			var out []any
			if w.held {
				w.held = false
				out = w.release()
			}
			if err != nil {
				if w.pullBack != nil {
					out = append(out, r.locks.release(w.pullBack)...)
					w.pullBack = nil
				}
				return append(out, r.fail(err)...) // aborts this write with the others
			}
			if lk := w.pullBack; lk != nil {
				w.pullBack = nil
				return append(out, r.startRecoveryOf(r.e.env, w.block, w.n, lk)...)
			}
			return append(out, w.progress(r.e.env)...)
		})...)
	}
	if w.local == 2 && (!needPeer || w.peer.answered(rec.Epoch)) && (!needTgt || w.tgt.answered(rec.Epoch)) &&
		(!needDeg || w.degDone) && (!needDRL || w.drlDone) {
		out = append(out, w.finish(nil)...)
	}
	return out
}

// leg is a write's forward to one other copy: the peer, or a move's
// target. The two are alike but for where they go and the map their
// answers are found in (replica.fwd, replica.tfwd).
type leg struct {
	target  bool   // the move's target, not the peer
	epoch   uint64 // epoch of the forward in flight (0: none)
	acked   bool   // that forward was answered OK
	seq     uint64 // its key in the replica's map (0: none)
	sentAt  time.Time
	resends int // times sent again in this epoch
}

// answered reports whether the leg's forward in epoch was answered OK.
func (l *leg) answered(epoch uint64) bool { return l.acked && l.epoch == epoch }

// due reports whether the leg's forward in epoch awaits its answer past
// resendAfter (sent again on the replica's tick).
func (l *leg) due(now time.Time, epoch uint64, every time.Duration) bool {
	return l.epoch == epoch && !l.acked && now.Sub(l.sentAt) >= resendAfter(every, l.resends)
}

// inFlight is the replica's map of forwards awaiting an answer on l.
func (w *writeOp) inFlight(l *leg) map[uint64]*writeOp {
	if l.target {
		return w.r.tfwd
	}
	return w.r.fwd
}

// send sends the write on l in the current epoch: for the first time
// (again false), or again in the same epoch, its last forward unanswered
// for resendAfter: the session, or the answer's, may have lost it. Only
// the last forward's answer counts: the peer takes a node's messages in
// the order sent and their ranges in order of arrival, so once the last
// is answered every earlier copy has been written there or lost, and
// none can land later, over a write that reached the peer another way
// (WriteReplica, outside review 79: an earlier copy's answer counted, and
// the last copy, slow on the link, landed over a client's later
// WriteReplica). A peer whose disk is behind answers the copies it
// receives while it writes the first with the first (onForward), so the
// last one's answer is not later for it. A move's target is sent the
// write the same way.
func (w *writeOp) send(env Env, l *leg, again bool) []any {
	w.drop(l)
	r := w.r
	if again {
		l.resends++
		r.e.stats.Resends++
	} else {
		l.resends = 0
	}
	l.seq = r.nextSeq()
	l.epoch, l.acked, l.sentAt = r.rec.Epoch, false, env.Now
	w.inFlight(l)[l.seq] = w
	r.e.stats.Forwards++
	to, reachable := r.peerNode(), r.peerReachable()
	if l.target {
		to = r.rec.Move.To.Node
		reachable = r.e.up[to]
	}
	if !reachable {
		// Sent again when it is back (the replica's tick), or dropped:
		// the peer's by degraded mode, the target's once it is declared
		// dead.
		return nil
	}
	return []any{Send{To: to, Msg: Forward{RLDev: r.rec.ID, Epoch: r.rec.Epoch, Seq: l.seq, Block: w.block, Gen: w.gen, Data: w.data, Fence: w.fence, Target: l.target, WID: w.wid}}}
}

// resendAfter is how long a forward sent again n times waits for its
// answer before it is sent again: RetryEvery, doubling with each resend up
// to 8 times that, so that a peer behind its disk is not sent each write
// more and more often.
func resendAfter(every time.Duration, n int) time.Duration {
	return every << min(n, 3)
}

// drop forgets the write's forward on l.
func (w *writeOp) drop(l *leg) {
	if l.seq != 0 {
		delete(w.inFlight(l), l.seq)
		l.seq = 0
	}
}

// acked handles the peer's answer to a forward.
func (w *writeOp) acked(env Env, a Ack) []any {
	r := w.r
	switch a.Code {
	case OK:
		if w.peer.epoch == r.rec.Epoch {
			w.peer.acked = true
		}
		return w.progress(env)
	case StaleToken:
		// The peer admitted a newer token than this replica knows of: the
		// write must not be acknowledged, and this replica's copy of the
		// range (already written) is pulled back from the peer under the
		// write's own range lock, so no read here sees it meanwhile.
		lk := w.lock
		w.lock = nil
		out := w.finish(fmt.Errorf("%w (refused by the peer)", ErrStaleToken))
		if w.local == 1 { // pulled back once the local write landed (held)
			w.pullBack = lk
			return out
		}
		return append(out, r.startRecoveryOf(env, w.block, w.n, lk)...)
	}
	// A resync target whose disk failed cannot leave by decree (it is
	// stale already): the source gives the resync up, and the RLDev goes
	// back to degraded, where writes do not wait for it.
	var out []any
	if a.Code == DiskFailed && r.resync != nil && r.rec.State == Resyncing {
		out = r.stopResync("the target's disk failed")
	}
	// Another epoch there, not ready there yet, or its disk failed (a
	// secondary leaves by decree): sent again on the next retry (the
	// write stays registered as awaiting an answer).
	w.peer.sentAt = env.Now
	r.fwd[w.peer.seq] = w
	if a.Code == WrongEpoch && a.Epoch > r.rec.Epoch {
		return append(out, Refresh{})
	}
	return out
}

// finish ends the write (once): reply, release.
func (w *writeOp) finish(err error) []any {
	if w.done {
		return nil
	}
	w.done = true
	r := w.r
	if err == nil && !r.e.env.alive() {
		// Durable where it must be, but this node's lease ran out
		// meanwhile (it was paused): it may have been declared dead and
		// its segment made stale, and a fenced node acknowledges
		// nothing. Told "maybe written" (below), the client asks again
		// (default seed 6400070: a primary paused past its lease
		// acknowledged, once it ran again, a write its peer had
		// acknowledged before the RLDev degraded).
		err = fmt.Errorf("%w: this node's lease ran out before the write was acknowledged", ErrNotServing)
	}
	delete(r.writes, w)
	w.drop(&w.peer)
	w.drop(&w.tgt)
	if err != nil && w.local != 0 && !r.e.cfg.Unsafe.NoMaybe && !errors.Is(err, ErrMaybeWritten) {
		err = fmt.Errorf("%w (%w)", err, ErrMaybeWritten)
	}
	if err == nil && w.rewrite {
		r.e.stats.LandedBefore++
	}
	out := r.e.replyWith(Reply{Req: w.req, Err: err, LandedBefore: err == nil && w.rewrite})
	if w.local == 1 {
		w.held = true // released when the local write lands
		return out
	}
	return append(out, w.release()...)
}

// release gives up the write's range and its regions' in-flight counts.
func (w *writeOp) release() []any {
	r := w.r
	if w.locked {
		w.locked = false
		a, b := w.drlSpan()
		for x := a; x <= b; x++ {
			if r.inflight[x]--; r.inflight[x] <= 0 {
				delete(r.inflight, x)
			}
		}
		c, d := w.degSpan()
		for x := c; x <= d; x++ {
			r.inflightDeg(x, -1)
		}
	}
	lk := w.lock
	w.lock = nil
	return r.locks.release(lk)
}

// fwdKey names a forwarded write (its generation is the writer's own,
// taken once per write) from a node.
type fwdKey struct {
	from          NodeID
	gen, block, n uint64
}

// fwdDup is a forward being written: the seqs of its copies sent again
// meanwhile, answered with it.
type fwdDup struct {
	epoch uint64
	seqs  []uint64
}

// onForward applies a write forwarded by the replica that orders writes
// (the primary; a resync's source to its target), in that replica's epoch.
func (r *replica) onForward(env Env, from NodeID, m Forward) []any {
	ack := func(c Code) []any {
		return []any{Send{To: from, Msg: Ack{RLDev: m.RLDev, Seq: m.Seq, Code: c, Epoch: r.rec.Epoch}}}
	}
	if c, out := r.epochCheck(m.Epoch); c != OK {
		return append(out, ack(c)...)
	}
	rec := r.rec
	switch {
	case r.state == repFailed:
		return ack(DiskFailed)
	case r.state != repReady:
		return ack(NotServing)
	case r.target:
		if from != r.peerNode() || !r.receiving() {
			return ack(NotServing)
		}
	case from != r.peerNode() || r.isPrimary():
		return ack(NotServing)
	case rec.State == Degraded:
		return ack(NotServing) // nobody forwards in degraded state
	case rec.State == Normal && r.stale():
		return ack(NotServing)
	}
	n := uint64(len(m.Data)) / BlockSize
	if len(m.Data)%BlockSize != 0 || n == 0 || r.checkRange(m.Block, n) != nil {
		return ack(BadRequest)
	}
	if !r.target && rec.FullCopy && r.stale() && !r.super.Overwritten {
		// A write forwarded to the target of a full copy lands, as the
		// copy's blocks do, only once its superblock says a full copy
		// began (Super.Overwritten; outside review 81: a forward landing
		// first left a mix of histories unmarked).
		return r.writeSuper(func(s *Super) { s.Overwritten = true }, func(err error) []any {
			if err != nil {
				return append(r.fail(fmt.Errorf("marking the segment overwritten by a full copy: %w", err)), ack(DiskFailed)...)
			}
			return r.onForward(r.e.env, from, m)
		})
	}
	// A forward sent again while the first is being written here (this
	// disk answers more slowly than the sender's RetryEvery) waits for
	// it: the same write (data, generation, fence) in the same epoch,
	// answered with it. Written again, each copy would queue one more
	// write on a disk already behind, and the sender send it again still
	// more (TestDiskWatchdogOverloadedDiskIsNotHung: 30 writes queued on a
	// secondary answering one a second were written 164-180 times, and
	// none was acknowledged).
	k := fwdKey{from: from, gen: m.Gen, block: m.Block, n: n}
	if d := r.fwdIn[k]; d != nil && d.epoch == rec.Epoch {
		d.seqs = append(d.seqs, m.Seq)
		r.e.stats.Duplicates++
		return nil
	}
	dup := &fwdDup{epoch: rec.Epoch}
	if r.fwdIn == nil {
		r.fwdIn = map[fwdKey]*fwdDup{}
	}
	r.fwdIn[k] = dup
	ack = func(c Code) []any {
		if r.fwdIn[k] == dup {
			delete(r.fwdIn, k)
		}
		out := []any{Send{To: from, Msg: Ack{RLDev: m.RLDev, Seq: m.Seq, Code: c, Epoch: r.rec.Epoch}}}
		for _, seq := range dup.seqs {
			out = append(out, Send{To: from, Msg: Ack{RLDev: m.RLDev, Seq: seq, Code: c, Epoch: r.rec.Epoch}})
		}
		return out
	}
	var out []any
	// A move's target mirrors the primary, which judged the write's
	// fence already: it keeps the newest token it is shown (so that it
	// refuses stale ones once it serves) but refuses nothing (the primary
	// orders overlapping writes: one with an older token on a range comes
	// before a newer one there, never after).
	admit := r.admit
	if r.target {
		admit = func(f *Fence, then func(error) []any) []any {
			if f == nil {
				return then(nil)
			}
			return r.mergeTokens([]Fence{*f}, then)
		}
	}
	_, out = r.locks.acquire(m.Block, n, true, func(lk *rangeLock) []any {
		return admit(m.Fence, func(err error) []any {
			if err != nil {
				return append(ack(CodeOf(err)), r.locks.release(lk)...)
			}
			return r.writeBlocks(m.Block, m.Data, nil, m.Gen, func(err error) []any {
				if err == nil {
					r.rememberLanded(m.WID, m.Block, n, m.Gen)
					// This copy's own generations (WriteReplica) stay above
					// every one landed here (review 115); gen raises the
					// durable floor before using them.
					r.nextGen = max(r.nextGen, m.Gen+1)
				}
				out := r.locks.release(lk)
				if err != nil {
					out = append(out, r.fail(err)...)
					return append(out, ack(DiskFailed)...)
				}
				return append(out, ack(OK)...)
			})
		})
	})
	return out
}

// ------------------------------------------------------------------ reads

func (r *replica) clientRead(env Env, req ReqID, block, n uint64) []any {
	return r.readServed(req, block, n, false, func(data []byte, err error) []any {
		return r.e.reply(req, data, err)
	})
}

// readServed reads blocks as a serving replica: under a shared range lock
// (no write in progress on them here), checked, repaired from the peer if
// a block fails its check (once), and only while this replica may serve.
// The data read goes to then alone, and then to req's reply alone (the
// runtime lends the read its buffer on that promise: DiskRead.Lend).
func (r *replica) readServed(req ReqID, block, n uint64, repaired bool, then func([]byte, error) []any) []any {
	granted := false
	lk, out := r.locks.acquire(block, n, false, func(lk *rangeLock) []any {
		granted = true
		r.owedUnwait(lk)
		return r.readRunFor(req, block, n, func(data []byte, _ []uint64, bad []uint64, err error) []any {
			out := r.locks.release(lk)
			switch {
			case err != nil:
				out = append(out, r.fail(err)...)
				return append(out, then(nil, fmt.Errorf("%w: %v", ErrDiskFailed, err))...)
			case r.state != repReady || r.stale() && !r.e.cfg.Unsafe.ServeStale || !r.e.env.alive() || r.target || r.switching():
				return append(out, then(nil, fmt.Errorf("%w (rldev %d)", ErrNotServing, r.rec.ID))...)
			case len(bad) > 0 && repaired:
				return append(out, then(nil, fmt.Errorf("%w: blocks %v of rldev %d", ErrCorrupt, bad, r.rec.ID))...)
			case len(bad) > 0:
				return append(out, r.repair(bad, func(err error) []any {
					if err != nil {
						return then(nil, err)
					}
					return r.readServed(req, block, n, true, then)
				})...)
			}
			return append(out, then(data, nil)...)
		})
	})
	if !granted {
		r.owedAwait(lk, block, n, func(err error) []any { return append(r.locks.release(lk), then(nil, err)...) })
	}
	return out
}

// ------------------------------------------------------------------ repair

// repair rewrites blocks that failed their check with the peer's copy
// (read repair, the scrubber). A block is rewritten only if it still fails
// when the range is held: one that a write replaced meanwhile is newer
// than the peer's copy was.
func (r *replica) repair(bad []uint64, then func(error) []any) []any {
	if r.peerStale() {
		return then(fmt.Errorf("%w: blocks %v of rldev %d on node %d, the only up-to-date copy", ErrCorrupt, bad, r.rec.ID, r.e.cfg.Node))
	}
	runs := toRuns(bad)
	left := len(runs)
	var failed error
	var out []any
	for _, run := range runs {
		run := run
		out = append(out, r.pull(run.first, run.n, func(pd PullData) []any {
			finish := func(err error) []any {
				if err != nil && failed == nil {
					failed = err
				}
				if left--; left > 0 {
					return nil
				}
				return then(failed)
			}
			if !pd.usable(run.n) {
				if pd.Code == Corrupt {
					return finish(fmt.Errorf("%w: blocks [%d, %d) of rldev %d: the peer's copy: %v", ErrCorrupt, run.first, run.first+run.n, r.rec.ID, pd.Code.Err()))
				}
				// The peer's copy could not be had (its read failed:
				// DiskFailed; or this replica failed or retired during
				// the repair, which answers its pulls NotServing: abort;
				// the peer's own NotServing, WrongEpoch and Unknown are
				// asked again, replica.deliver): nothing says the copy
				// is bad, so the block is not known lost. The read fails
				// as one this replica cannot serve now, and the clerk
				// tries again; once the peer is stale, repair says
				// ErrCorrupt at once. (ErrCorrupt here told a client its
				// data was gone while the peer and a move's target held
				// it: the simulator, seed 197 with GROVE_RLDEV_SUSPECT.)
				return finish(fmt.Errorf("%w: blocks [%d, %d) of rldev %d fail their check here, and the peer's copy could not be had: %v", ErrNotServing, run.first, run.first+run.n, r.rec.ID, pd.Code.Err()))
			}
			return r.rewriteBad(run.first, run.n, pd.Data, pd.Gens, pd.Bad, finish)
		})...)
	}
	return out
}

// rewriteBad writes, under an exclusive range lock, the blocks of
// [first, first+n) that still fail their check, from data and gens; those
// in peerBad (bad at the peer too) stay as they are and are reported.
func (r *replica) rewriteBad(first, n uint64, data []byte, gens []uint64, peerBad []uint64, then func(error) []any) []any {
	var out []any
	_, out = r.locks.acquire(first, n, true, func(lk *rangeLock) []any {
		return r.readRun(first, n, func(_ []byte, _ []uint64, bad []uint64, err error) []any {
			if err != nil {
				out := r.locks.release(lk)
				out = append(out, r.fail(err)...)
				return append(out, then(err)...)
			}
			var both []uint64
			bad = slices.DeleteFunc(bad, func(b uint64) bool {
				if slices.Contains(peerBad, b) {
					both = append(both, b)
					return true
				}
				return false
			})
			var lost error
			if len(both) > 0 {
				lost = fmt.Errorf("%w: blocks %v of rldev %d fail their check on both replicas", ErrCorrupt, both, r.rec.ID)
			}
			if len(bad) == 0 {
				return append(r.locks.release(lk), then(lost)...)
			}
			left := len(bad)
			var werr error
			var out []any
			r.forgetLanded() // the peer's blocks land here
			for _, b := range bad {
				i := b - first
				phys := r.encodeRun(b, data[i*BlockSize:(i+1)*BlockSize], gens[i:i+1], 0)
				r.e.stats.Repairs++
				out = append(out, r.writeDurable(r.base+blockOff(b), phys, func(err error) []any {
					if err != nil && werr == nil {
						werr = err
					}
					if left--; left > 0 {
						return nil
					}
					out := r.locks.release(lk)
					if werr != nil {
						out = append(out, r.fail(werr)...)
						return append(out, then(werr)...)
					}
					out = append(out, r.e.logf(2, "rldev blocks repaired from the peer", "rldev", r.rec.ID, "blocks", bad))
					return append(out, then(lost)...)
				})...)
			}
			return out
		})
	})
	return out
}

type run struct{ first, n uint64 }

// goodRuns is [first, first+n) without the sorted blocks of bad, as runs.
func goodRuns(first, n uint64, bad []uint64) []run {
	var out []run
	at := first
	for _, b := range append(append([]uint64{}, bad...), first+n) {
		if b > at {
			out = append(out, run{at, b - at})
		}
		at = b + 1
	}
	return out
}

// toRuns groups sorted block numbers into contiguous runs.
func toRuns(blocks []uint64) []run {
	var out []run
	for _, b := range blocks {
		if len(out) > 0 && out[len(out)-1].first+out[len(out)-1].n == b {
			out[len(out)-1].n++
			continue
		}
		out = append(out, run{b, 1})
	}
	return out
}

// ------------------------------------------------------------------ pulls

// pullWait is a Pull awaiting its data.
type pullWait struct {
	first, n uint64
	q        *recover   // the recovery it is for (nil: a read repair, the scrubber)
	src      *resyncSrc // the copy it is for (a move's comparison), ended with it
	gensOnly bool
	then     func(PullData) []any
	sentAt   time.Time
	to       NodeID // the node it was last sent to (its answer counts from it alone)
}

// pull asks the peer for its copy of blocks; then runs with the answer.
func (r *replica) pull(first, n uint64, then func(PullData) []any) []any {
	return r.sendPull(r.e.env, &pullWait{first: first, n: n, then: then})
}

func (r *replica) sendPull(env Env, p *pullWait) []any {
	seq := r.nextSeq()
	p.sentAt, p.to = env.Now, r.peerNode()
	r.pulls[seq] = p
	if !p.gensOnly {
		r.e.stats.PulledBlocks += p.n
	}
	if !r.peerReachable() {
		return nil // sent again when the peer is back (retry)
	}
	// An owed range's pull goes to the peer even when it is stale: its
	// copy of the range is the up-to-date one if it is whole (owed.go).
	owed := p.q != nil && p.q.owe && r.peerStale()
	return []any{Send{To: r.peerNode(), Msg: Pull{RLDev: r.rec.ID, Epoch: r.rec.Epoch, Seq: seq, Block: p.first, Count: p.n, GensOnly: p.gensOnly, Owed: owed}}}
}

// onPull serves the peer this replica's copy of blocks, as a serving
// replica serves a read (a copy that fails its check here is refused:
// never repaired from the one asking).
func (r *replica) onPull(env Env, from NodeID, m Pull) []any {
	reply := func(pd PullData) []any {
		pd.RLDev, pd.Seq = m.RLDev, m.Seq
		return []any{Send{To: from, Msg: pd}}
	}
	if c, out := r.epochCheck(m.Epoch); c != OK {
		return append(out, reply(PullData{Code: c})...)
	}
	if r.state != repReady || r.stale() && !m.Owed || from != r.peerNode() {
		return reply(PullData{Code: NotServing})
	}
	if m.Count == 0 || m.Count > 4096 || r.checkRange(m.Block, m.Count) != nil {
		return reply(PullData{Code: BadRequest})
	}
	if c := r.owedServe(m); c != OK {
		return reply(PullData{Code: c})
	}
	var out []any
	_, out = r.locks.acquire(m.Block, m.Count, false, func(lk *rangeLock) []any {
		return r.readRun(m.Block, m.Count, func(data []byte, gens []uint64, bad []uint64, err error) []any {
			out := r.locks.release(lk)
			switch {
			case err != nil:
				out = append(out, r.fail(err)...)
				return append(out, reply(PullData{Code: DiskFailed})...)
			case r.state != repReady || r.rec.Epoch != m.Epoch || r.stale() && !m.Owed || from != r.peerNode() || r.owedServe(m) != OK:
				// No longer serving it in the epoch asked (retired and
				// maybe wiped meanwhile, failed, stale, another
				// peer): what was read answers nothing.
				return append(out, reply(PullData{Code: NotServing})...)
			case m.GensOnly:
				code := OK
				if len(bad) > 0 {
					code = Corrupt
				}
				return append(out, reply(PullData{Code: code, Gens: gens, Bad: bad})...)
			case len(bad) > 0:
				// The good blocks still travel: the puller takes them
				// and keeps its own copy of the bad ones.
				for _, b := range bad {
					i := b - m.Block
					clear(data[i*BlockSize : (i+1)*BlockSize])
				}
				return append(out, reply(PullData{Code: Corrupt, Data: data, Gens: gens, Bad: bad})...)
			}
			return append(out, reply(PullData{Code: OK, Data: data, Gens: gens})...)
		})
	})
	return out
}

// ------------------------------------------------------------------ recovery after a crash

// recover is a dirty region pulled from the peer after a crash.
type recover struct {
	x        uint64 // its dirty-region id (-1: not a region of the log)
	first, n uint64
	lock     *rangeLock
	pulling  bool
	// writing: the pulled data's disk writes are in flight. The range
	// stays held until they land, whatever ends the recovery: a write of
	// the range ordered after it could land first and be undone.
	writing bool
	// landed: blocks from first pulled and written (a range larger than
	// a pull goes in parts).
	landed uint64
	// givingUp: owedGiveUp let it go to this copy (its degraded-mode
	// mark being written): no longer served as owed, nor pulled.
	givingUp bool
	// owe: the range is (to be) in the owed page (owed.go); owed: the
	// page that names it is durable; clearing: its removal from the page
	// is being written (the range is let go once it is durable).
	owe, owed, clearing bool
}

const noRegion = ^uint64(0)

// startRecovery holds every dirty region of the log, and every range the
// owed page named at load (owed), at once (nothing is served from them
// meanwhile), records them as owed, then pulls them from the peer.
func (r *replica) startRecovery(env Env, owed []*recover) []any {
	rb := r.drl.durable.RegionBlocks
	var out, fresh []any
	var news []*recover
	for _, x := range r.drl.durable.List() {
		first := x * rb
		if first >= r.rec.Blocks {
			r.drl.unmark(x)
			continue
		}
		if hasOwedRegion(owed, x) {
			continue
		}
		news = append(news, &recover{x: x, first: first, n: min(rb, r.rec.Blocks-first)})
	}
	out = append(out, r.holdRecover(append(owed, news...))...)
	fresh = r.owe(news)
	out = append(out, fresh...)
	out = append(out, r.e.logf(2, "rldev pulling dirty regions from the peer after a crash", "rldev", r.rec.ID, "regions", r.recovering(), "owed_at_load", len(owed)))
	return append(out, r.pumpRecovery(env)...)
}

// holdRecover queues ranges to pull, each holding its range exclusively.
func (r *replica) holdRecover(qs []*recover) []any {
	var out []any
	for _, q := range qs {
		var o []any
		q.lock, o = r.locks.acquire(q.first, q.n, true, func(*rangeLock) []any { return nil })
		out = append(out, o...)
		r.recoverQ = append(r.recoverQ, q)
	}
	return out
}

// startRecoveryOf pulls one range back from the peer (a write the peer
// refused landed here), holding it with lk (the write's exclusive lock).
// It is owed (owed.go) if the peer's copy is whole (not stale) and the
// page has room.
func (r *replica) startRecoveryOf(env Env, block, n uint64, lk *rangeLock) []any {
	q := &recover{x: noRegion, first: block, n: n, lock: lk}
	r.moveStale()
	r.recoverQ = append(r.recoverQ, q)
	var out []any
	if !r.peerStale() && r.owedRuns() < maxOwedRuns {
		out = r.owe([]*recover{q})
	}
	return append(out, r.pumpRecovery(env)...)
}

func (r *replica) pumpRecovery(env Env) []any {
	var out []any
	for _, q := range r.recoverQ {
		if q.pulling || q.givingUp || !r.heldNow(q.lock) {
			continue
		}
		q.pulling = true
		// A range larger than a pull (a dirty region of an RLDev over
		// about 500 GiB: regionBlocks) is pulled in parts, one after the
		// other, each written before the next is asked (outside review
		// 89: the peer refused the one pull, and the range was asked
		// again for ever).
		first, n := q.first+q.landed, min(q.n-q.landed, MaxPullBlocks)
		out = append(out, r.sendPull(env, &pullWait{first: first, n: n, q: q, then: func(pd PullData) []any {
			if !slices.Contains(r.recoverQ, q) || q.givingUp {
				// Let go meanwhile (given up, dropped): its range is no
				// longer held, and this answer must not land on it
				// (outside review 91: it undid a write acknowledged
				// since).
				return nil
			}
			switch {
			case q.owe && pd.Code == NotWhole:
				return r.owedNotWhole(q)
			case q.owe && !pd.usable(n):
				// The peer could not read its copy (its disk failing:
				// it leaves the RLDev, and the range waits for it as
				// owed): this copy may hold a block torn at the crash
				// or a refused write, and is not taken (outside review
				// 86). Asked again on the next tick.
				q.pulling = false
				return []any{r.e.logf(2, "rldev owed range not pulled: the peer could not read it; asking again", "rldev", r.rec.ID,
					"blocks", fmt.Sprintf("[%d, %d)", first, first+n), "peer", pd.Code.Err())}
			case !pd.usable(n):
				// The peer's copy is unreadable: this one is all there is.
				return append([]any{r.e.logf(3, "rldev dirty region not pulled: keeping this copy", "rldev", r.rec.ID,
					"blocks", fmt.Sprintf("[%d, %d)", first, first+n), "peer", pd.Code.Err())}, r.recovered(q)...)
			}
			// Take every block the peer could read; keep this copy of
			// those it could not (the peer repairs them from here on
			// its next read of them, or the scrubber does).
			var log []any
			if len(pd.Bad) > 0 {
				log = append(log, r.e.logf(3, "rldev dirty region pulled except blocks corrupt at the peer: keeping this copy of those", "rldev", r.rec.ID,
					"blocks", pd.Bad))
			}
			partDone := func() []any {
				q.landed += n
				q.pulling = false
				if q.landed < q.n && q.owe && r.rec.StaleGivenUp {
					// The rest is owed to a copy given up since: this
					// copy of it stands (outside review 91).
					return r.owedGiveUp(q, "rldev owed range: the stale copy was given up (accept-stale); this copy stands")
				}
				if q.landed < q.n && !q.owe && r.peerStale() {
					// Abandoned while this part landed: the rest is this
					// copy's, as abandonRecovery leaves it, once its
					// regions are durably in the degraded-mode log.
					// No part is asked meanwhile (givingUp; outside review
					// 94: the next part, pulled and landing, was undone by
					// nothing and the range let go while it landed).
					q.givingUp = true
					r.forgetPulls(q)
					a, b := r.deg.durable.Span(q.first, q.n)
					return r.deg.mark(a, b, func(err error) []any {
						if err != nil || q.writing {
							return nil // the replica failed; (writing: cannot be, givingUp)
						}
						return r.recovered(q)
					})
				}
				if q.landed < q.n {
					out := r.pumpRecovery(r.e.env) // the next part
					if q.owe && r.peerStale() {
						out = append(out, r.owedFail()...) // it waits for the peer now
					}
					return out
				}
				if q.owe && r.peerStale() {
					r.e.stats.OwedPulled++
				}
				return r.recovered(q)
			}
			runs := goodRuns(first, n, pd.Bad)
			if len(runs) == 0 {
				return append(log, partDone()...)
			}
			left := len(runs)
			var werr error
			q.writing = true
			r.forgetLanded() // the peer's blocks land here
			for _, g := range runs {
				i := g.first - first
				phys := r.encodeRun(g.first, pd.Data[i*BlockSize:(i+g.n)*BlockSize], pd.Gens[i:i+g.n], 0)
				log = append(log, r.writeDurable(r.base+blockOff(g.first), phys, func(err error) []any {
					if err != nil && werr == nil {
						werr = err
					}
					if left--; left > 0 {
						return nil
					}
					q.writing = false
					if werr != nil {
						return r.fail(werr)
					}
					r.moveStale() // landed: a move's target may lack it
					return partDone()
				})...)
			}
			return log
		}})...)
	}
	return out
}

// forgetPulls drops q's pull, if one is out: not sent again, and an
// answer would find no pullWait (one already delivered finds q let go:
// pumpRecovery's callback checks).
func (r *replica) forgetPulls(q *recover) {
	for seq, p := range r.pulls {
		if p.q == q {
			delete(r.pulls, seq)
		}
	}
}

func (r *replica) heldNow(lk *rangeLock) bool {
	for _, h := range r.locks.held {
		if h == lk {
			return true
		}
	}
	return false
}

// abandonRecovery: the peer became stale while this replica was pulling
// from it. An owed range (owed.go) waits for the peer's copy, unserved. A
// range that is not owed -- pulled back after a refusal from a peer stale
// already, or beyond the page's room -- is this copy's now: it goes into
// the degraded-mode log (the resync copies it to the peer) before it is
// served.
func (r *replica) abandonRecovery() []any {
	var out []any
	owed := 0
	for _, q := range append([]*recover{}, r.recoverQ...) {
		q := q
		if q.givingUp {
			continue
		}
		if q.owe && r.rec.StaleGivenUp {
			// An operator gave the stale copy up for this one: what this
			// one owed it is its own now (Record.StaleGivenUp).
			out = append(out, r.owedGiveUp(q, "rldev owed range: the stale copy was given up (accept-stale); this copy stands")...)
			continue
		}
		if q.owe {
			owed++
			continue
		}
		a, b := r.deg.durable.Span(q.first, q.n)
		out = append(out, r.deg.mark(a, b, func(err error) []any {
			if err != nil {
				return nil // the replica failed (deg.flush did it)
			}
			if q.writing {
				// Its pulled data is being written: the range is
				// released when that lands (pumpRecovery), not now. A
				// client write let in now and acknowledged could be
				// undone by it landing later (outside review 71).
				return nil
			}
			return r.recovered(q)
		})...)
	}
	if owed > 0 {
		out = append(out, r.owedFail()...)
	}
	if owed > 0 && !r.owedLogged {
		r.owedLogged = true
		r.e.stats.OwedWaits++
		out = append(out, r.e.logf(2, "rldev peer stale while ranges were being pulled from it: they wait for its copy, unserved (Unavailable)", "rldev", r.rec.ID, "ranges", owed, "peer", r.peerNode()))
	}
	if len(r.recoverQ) > owed {
		out = append(out, r.e.logf(2, "rldev dirty regions not pulled: the peer is stale; they go to it by resync", "rldev", r.rec.ID))
	}
	return out
}

// recovered ends one range's recovery (once: a region abandoned while its
// pulled data was being written ends by whichever comes first). An owed
// range is taken out of the owed page first, durably, and only then let
// go: a write let in before, acknowledged, would be pulled over again
// after a restart that still found the range owed.
func (r *replica) recovered(q *recover) []any {
	if !slices.Contains(r.recoverQ, q) || q.clearing {
		return nil
	}
	if q.owe {
		q.owe, q.clearing = false, true
		return r.syncOwed(func(err error) []any {
			if err != nil {
				return nil // the replica failed: abort lets the range go
			}
			q.owed = false
			return r.recoveredNow(q)
		})
	}
	return r.recoveredNow(q)
}

func (r *replica) recoveredNow(q *recover) []any {
	i := slices.Index(r.recoverQ, q)
	if i < 0 {
		return nil
	}
	r.recoverQ = append(r.recoverQ[:i], r.recoverQ[i+1:]...)
	r.forgetPulls(q)
	if q.x != noRegion {
		r.drl.unmark(q.x)
	}
	out := r.locks.release(q.lock)
	if r.recovering() == 0 {
		r.owedLogged = false
		out = append(out, r.drl.flush()...)
		out = append(out, r.e.logf(1, "rldev dirty regions recovered from the peer", "rldev", r.rec.ID))
	}
	return out
}

// ------------------------------------------------------------------ lazy clearing

// lazyClear clears dirty regions with no write in flight (and, once the
// RLDev is normal again, degraded-mode regions), in one log write each.
func (r *replica) lazyClear(env Env) []any {
	if r.state != repReady {
		return nil
	}
	// Every region a recovery in progress covers stays marked (a range
	// pulled back after the peer refused a write has no region of its
	// own: its write has ended, and only this keeps its region's mark
	// until the range is whole again).
	held := map[uint64]bool{}
	for _, q := range r.recoverQ {
		a, b := r.drl.durable.Span(q.first, q.n)
		for x := a; x <= b; x++ {
			held[x] = true
		}
	}
	// A stale replica keeps its dirty regions until it is resynced: they
	// name blocks it may hold differently from the peer (a write of its
	// past that never reached the peer), which the resync must copy. One
	// whose peer is stale moves them into the degraded-mode log (the
	// resync's list) rather than drop them.
	// A region written since the last flush stays marked for one more:
	// under steady writes its mark (a log write and a sync before the
	// write it covers) is not paid again every FlushEvery.
	touched := r.touched
	r.touched = map[uint64]bool{}
	var move []uint64
	for _, x := range r.drl.durable.List() {
		switch {
		case r.inflight[x] != 0 || held[x] || r.stale() || touched[x] && !r.peerStale():
		case r.peerStale():
			move = append(move, x)
		default:
			r.drl.unmark(x)
		}
	}
	out := r.drlToDeg(move)
	if r.rec.State == Normal && !r.stale() {
		for _, x := range r.deg.durable.List() {
			if r.inflight[1<<62|x] == 0 {
				r.deg.unmark(x)
			}
		}
	}
	out = append(out, r.drl.flush()...)
	return append(out, r.deg.flush()...)
}

// drlToDeg moves dirty regions into the degraded-mode log: each is cleared
// once its blocks are durably in the degraded-mode log.
func (r *replica) drlToDeg(xs []uint64) []any {
	var out []any
	rb := r.drl.durable.RegionBlocks
	for _, x := range xs {
		x := x
		first := x * rb
		if first >= r.rec.Blocks {
			r.drl.unmark(x)
			continue
		}
		a, b := r.deg.durable.Span(first, min(rb, r.rec.Blocks-first))
		out = append(out, r.deg.mark(a, b, func(err error) []any {
			if err != nil {
				return nil // the replica failed (deg.flush did it)
			}
			r.drl.unmark(x)
			return r.drl.flush()
		})...)
	}
	return out
}

// recovering is how many dirty regions are still to pull from the peer
// (after a crash).
func (r *replica) recovering() int { return len(r.recoverQ) }
