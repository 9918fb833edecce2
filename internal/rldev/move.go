package rldev

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// Segment moves (Boxwood §3.4's reconfiguration): a segment of an RLDev
// goes to another place, online, for load balancing or to empty a disk.
//
//  1. An operator's decree (Clerk.Move) sets Record.Move: the segment,
//     its new place (the target) on a node that does not hold the other
//     segment: another node, or another disk of the segment's node (to
//     empty a disk). A node holding both the moving segment and the
//     target runs them as two replicas (Engine.reps and Engine.tgts) and
//     delivers to itself what the one sends the other (messages for the
//     target say so: Forward.Target, Copy.Target); the protocol below is
//     the same.
//  2. The target node formats the new extent as a segment that serves
//     nothing (a replica with target set, its superblock incomplete) and
//     asks, by decree, to be named: Move.Inc = its incarnation.
//  3. The primary then forwards every write to the target as well as to
//     the secondary (a write is acknowledged only when all three copies
//     are durable), and copies every block to it under range locks (the
//     resync machinery, resync.go). A copied range is never older than the
//     writes acknowledged in it: a write holds its range from start to
//     acknowledgement, and a copy holds it from read to acknowledgement.
//     A block that fails its check at the primary is repaired from the
//     secondary before it is copied; when the secondary is the segment
//     that moves, each chunk's generations are first compared with its
//     copy and blocks it holds newer (a write the primary lost, not yet
//     found by the scrubber) are taken from it: its copy is about to be
//     dropped. The target mirrors the primary's
//     fences (keeps the newest token, refuses none: the primary judged
//     them). Any range the primary takes from its peer meanwhile (a write
//     the secondary refused with a stale token, pulled back; a newer
//     block the scrubber found there) holds the switch while it is
//     taken and makes the copy start again once it landed.
//  4. Copy complete, the primary passes a decree: Move.Switch. From the
//     moment the moving replica knows it, it serves no read and (if it is
//     the primary) takes no new write.
//  5. The primary passes the switch -- the target takes the segment's
//     place and the table names its incarnation -- once the moving
//     replica serves nothing more: itself, once its writes in flight are
//     done; the secondary, once it has answered a probe in the switching
//     epoch (it knows of Switch). No write is acknowledged without the
//     moving replica before it stopped serving, so a reader never sees it
//     return data older than the new pair holds. Only the primary
//     incarnation that copied everything (and took nothing from its peer
//     since) switches; another first copies again.
//  6. The old extent is listed in Record.Retiring; its node, once no disk
//     operation of the retired replica can still land, zeroes the extent
//     (an all-zero block is a block never written) and removes it from the
//     table by decree. Until then nothing else is placed there.
//
// Crashes, at any point, and what follows (the move is resumable: it goes
// on by itself once the participants are back, and the command that asked
// for it can be run again to follow it):
//   - The target dies: the primary, once the failure detector declares the
//     target's incarnation dead (or after moveStall without reaching it:
//     it serves nothing, so giving it up is safe, and writes do not wait
//     for it longer), sets Move.Inc back to 0. The target's next
//     incarnation (or, after a partition, the same one once it reaches the
//     primary again) asks to be named again and the copy starts over (it
//     may have missed writes meanwhile).
//     A target whose disk fails abandons the move (Move cleared, its
//     extent retiring); `grove rldev list` says so, and the operator picks
//     another place.
//   - The moving replica's disk fails: the RLDev degrades as always, and
//     the target takes the segment's place at once, stale and due for a
//     full copy (the resync path) -- the move completes as a rebuild.
//   - The moving replica's node dies: if the copy was already complete
//     (Switch) and the survivor is the primary, every write it
//     acknowledged is on the target: the survivor switches to it with no
//     degraded period. Otherwise the RLDev degrades as always, the
//     segment stays in place, stale, and the move waits (Move.Inc 0):
//     that copy is kept (outside review 80: replaced by the target, its
//     extent wiped, a death of the other copy before the target's rebuild
//     ended left nothing). If the node never returns, the operator
//     cancels the move and asks again: a stale segment of a degraded
//     RLDev is re-placed at once (StartMove), rebuilt at its new place by
//     a full copy, its old copy given up.
//   - The other replica dies: the RLDev degrades, and the move waits
//     (Move.Inc 0) until it is normal again; then it starts over.
//   - The primary restarts (before a verdict): its new incarnation copies
//     again, Switch cleared first if it was set (its dirty-region recovery
//     may have changed ranges the target holds).
//   - An RLDev whose client keeps the replicas itself (dirty-region log
//     off: WriteReplica, ReadReplica) is not moved: a copy of the primary
//     would not be the segment that moves.
//   - A cancel (Clerk.CancelMove) clears Move; the target's extent
//     retires. Moves and resyncs never run at once: a move copies only in
//     the normal state, and Record.Progress is the one that runs.

// ErrMove: a move that cannot start (or be cancelled) as asked.
var ErrMove = errors.New("rldev: move")

// StartMove returns RLDev id's record with a move of segment seg to a
// disk of node (disk < 0: the first of its disks with room), for a decree
// conditional on t's version. A move already going to that node is
// returned as it is (moving is idempotent: the command can be run again
// to follow it).
func (t *Table) StartMove(id uint64, seg int, node uint64, disk int) (*Record, error) {
	return t.startMove(id, seg, node, disk, false)
}

// startMove is StartMove; giveUpOwed re-places a stale segment the
// primary owes ranges to (Record.Owed) all the same: Evacuate's, for a
// node gone for good, whose copy of them is gone with it.
func (t *Table) startMove(id uint64, seg int, node uint64, disk int, giveUpOwed bool) (*Record, error) {
	rec := t.RLDevs[id]
	switch {
	case rec == nil:
		return nil, fmt.Errorf("%w: no rldev %d", ErrMove, id)
	case seg != 0 && seg != 1:
		return nil, fmt.Errorf("%w: segment %d: want 0 or 1", ErrMove, seg)
	case rec.Move != nil && rec.Move.Seg == seg && rec.Move.To.Node == node && (disk < 0 || rec.Move.To.Disk == uint32(disk)):
		return rec.Clone(), nil
	case rec.DRLOff && !(rec.State == Degraded && rec.Stale[seg]):
		// Its client writes and reads each replica on its own (and
		// reconciles them from its log): a copy of the primary would not
		// be the segment that moves. A stale segment of a degraded one
		// is re-placed (below) as after a disk loss: rebuilt whole from
		// the primary, the only copy serving (outside review 85: refused,
		// a transaction log's RLDev on a node lost for good stayed on one
		// copy, and the node could never be forgotten).
		return nil, fmt.Errorf("%w: rldev %d has its dirty-region log off (its client keeps the replicas itself): it cannot be moved", ErrMove, id)
	case rec.Move != nil:
		return nil, fmt.Errorf("%w: rldev %d is already moving segment %d to %v (cancel it first)", ErrMove, id, rec.Move.Seg, rec.Move.To)
	case rec.Segs[1-seg].Node == node:
		return nil, fmt.Errorf("%w: node %d holds rldev %d's other segment (the two copies must be on two nodes)", ErrMove, node, id)
	case rec.Segs[seg].Node == node && disk < 0:
		// Named, so that the command run again to follow the move does
		// not, once it ended, start another one back.
		return nil, fmt.Errorf("%w: rldev %d's segment %d is on node %d: name the disk to move it to (%d:DISK)", ErrMove, id, seg, node, node)
	case rec.Segs[seg].Node == node && rec.Segs[seg].Disk == uint32(disk):
		return nil, fmt.Errorf("%w: rldev %d's segment %d is on disk %d of node %d already", ErrMove, id, seg, disk, node)
	case len(rec.Retiring) >= MaxRetiring:
		return nil, fmt.Errorf("%w: rldev %d has %d extents still to free (their node is down?)", ErrMove, id, len(rec.Retiring))
	case rec.Owed && rec.State == Degraded && rec.Stale[seg] && !giveUpOwed:
		// Re-placed, its copy would be given up: the up-to-date copy of
		// the ranges the primary owes it (outside review 89: the
		// primary's torn block then stood, the good copy on a node
		// merely down wiped).
		return nil, fmt.Errorf("%w: rldev %d's primary owes ranges to its %s on node %d (it was pulling them from it after a crash): re-placing that copy gives them up; wait for node %d, or if it is gone for good: grove rldev forget-node %d --re-place --gone-for-good",
			ErrMove, id, rec.SegmentName(seg), rec.Segs[seg].Node, rec.Segs[seg].Node, rec.Segs[seg].Node)
	}
	var to Segment
	if disk < 0 {
		var err error
		if to, err = t.placeOn(node, rec.Blocks); err != nil {
			return nil, err
		}
	} else {
		k := DiskKey{node, uint32(disk)}
		if t.Disks[k] == nil {
			return nil, fmt.Errorf("%w: node %d has no disk %d in the table", ErrMove, node, disk)
		}
		off, ok := t.FreeExtent(k, rec.Blocks)
		if !ok {
			return nil, fmt.Errorf("%w: disk %d of node %d has no %d bytes free", ErrNoSpace, disk, node, SegmentSize(rec.Blocks))
		}
		to = Segment{Node: node, Disk: uint32(disk), Offset: off}
	}
	nr := rec.Clone()
	if rec.State == Degraded && rec.Stale[seg] {
		// Re-placed at once: a stale segment of a degraded RLDev (its
		// node down, perhaps for good) cannot move by copy and switch (a
		// move copies in the normal state, which needs that node back),
		// so its new place is the segment now, stale, rebuilt by a full
		// copy from the primary, as after a disk loss; its old extent
		// retires (wiped when its node is back, once the RLDev is normal
		// again: wipeTick). Its copy is given up: until the rebuild ends
		// the primary is the only copy, and no command puts the old
		// extent back (outside review 81: a moving segment whose node
		// died for good kept the RLDev on one copy for ever). What the
		// primary owed that copy (giveUpOwed) is its own copy's now: the
		// new segment answers that it is not whole.
		nr.retire(nr.Segs[seg], false)
		nr.Owed = false
		nr.Segs[seg], nr.Inc[seg] = to, 0
		nr.FullCopy = true
		nr.Progress, nr.ProgressTotal = 0, 0
		nr.Epoch++
		return nr, nr.Check()
	}
	nr.Move = &Move{Seg: seg, To: to}
	return nr, nr.Check()
}

// CancelMove returns RLDev id's record without its move (the target's
// extent retiring), for a decree conditional on t's version.
func (t *Table) CancelMove(id uint64) (*Record, error) {
	rec := t.RLDevs[id]
	switch {
	case rec == nil:
		return nil, fmt.Errorf("%w: no rldev %d", ErrMove, id)
	case rec.Move == nil:
		return nil, fmt.Errorf("%w: rldev %d is not moving", ErrMove, id)
	case len(rec.Retiring) >= MaxRetiring:
		return nil, fmt.Errorf("%w: rldev %d has %d extents still to free", ErrMove, id, len(rec.Retiring))
	}
	nr := rec.Clone()
	nr.retire(nr.Move.To, true)
	nr.Move, nr.MovingFailed = nil, false
	nr.Progress, nr.ProgressTotal = 0, 0
	nr.Epoch++
	return nr, nr.Check()
}

// place is where the replica's segment is.
func (r *replica) place() Segment { return Segment{Node: r.e.cfg.Node, Disk: r.disk, Offset: r.base} }

// named reports whether rec names this incarnation for the replica: as
// the segment's (Inc) or as the move's target (Move.Inc).
func (r *replica) named(rec *Record) bool {
	if r.target {
		return rec.Move != nil && rec.Move.To == r.place() && rec.Move.Inc == r.e.cfg.Inc
	}
	return rec.Inc[r.seg] == r.e.cfg.Inc
}

// receiving: a move's target takes forwards and copies from the primary.
func (r *replica) receiving() bool {
	return r.target && r.ready() && r.rec.State == Normal && r.named(r.rec)
}

// switching: this replica's segment is moving and its copy is complete:
// it serves nothing more (and passes the switch).
func (r *replica) switching() bool {
	m := r.rec.Move
	return !r.target && m != nil && m.Switch && m.Seg == r.seg
}

// moveSource: this replica is the primary of an RLDev whose move target
// is named: it forwards writes and copies to the target.
func (r *replica) moveSource() bool {
	m := r.rec.Move
	return m != nil && m.Inc != 0 && !r.target && r.ready() && r.isPrimary() && !r.stale() && r.rec.State == Normal
}

// idle: no write ordered here is in progress.
func (r *replica) idle() bool {
	for w := range r.writes {
		if !w.only {
			return false
		}
	}
	return true
}

// moveTick starts the copy to a move's target (again, if the target
// changed incarnation or the copy failed) or stops one no longer wanted.
func (r *replica) moveTick(env Env) []any {
	m := r.rec.Move
	if !r.moveSource() {
		if r.mv != nil {
			out := r.stopCopy(r.mv, "no longer the source of a move")
			r.mv = nil
			return out
		}
		return nil
	}
	if m.Switch {
		return r.probeStop(env)
	}
	if r.mvStale && r.mv != nil {
		out := r.stopCopy(r.mv, "a range changed here from the peer: copying again")
		r.mv, r.mvStale = nil, false
		return append(out, r.moveTick(env)...)
	}
	r.mvStale = false
	if r.mv != nil && r.mv.inc == m.Inc && !r.mv.failed || !r.e.up[m.To.Node] {
		return nil
	}
	var out []any
	if r.mv != nil {
		out = r.stopCopy(r.mv, "the target changed")
	}
	s := &resyncSrc{to: m.To.Node, move: true, inc: m.Inc, epoch: r.rec.Epoch, reported: env.Now}
	for f := uint64(0); f < r.rec.Blocks; f += r.e.cfg.CopyBlocks {
		n := min(r.e.cfg.CopyBlocks, r.rec.Blocks-f)
		s.chunks = append(s.chunks, run{f, n})
		s.total += n
	}
	r.mv = s
	out = append(out, r.e.logf(1, "rldev move copy started", "rldev", r.rec.ID, "segment", m.Seg, "to", m.To.String(),
		"target_incarnation", m.Inc, "blocks", s.total))
	return append(out, r.pump(env, s)...)
}

// probeStop asks the moving secondary, in the switching epoch, for
// anything (the generation of block 0): an answer in that epoch means it
// knows of Switch, and so serves nothing more.
func (r *replica) probeStop(env Env) []any {
	m := r.rec.Move
	if m.Seg == r.seg || r.stopConfirmed == r.rec.Epoch || r.probing || !r.peerReachable() {
		return nil
	}
	r.probing = true
	epoch := r.rec.Epoch
	return r.sendPull(env, &pullWait{first: 0, n: 1, gensOnly: true, then: func(pd PullData) []any {
		r.probing = false
		if pd.Code == OK && r.rec.Epoch == epoch {
			r.stopConfirmed = epoch
		}
		return nil
	}})
}

// targetAcked handles the move target's answer to a forward; anything but
// OK in this epoch is sent again on the next retry.
func (w *writeOp) targetAcked(env Env, a Ack) []any {
	r := w.r
	if a.Code == OK {
		if w.tgt.epoch == r.rec.Epoch {
			w.tgt.acked = true
		}
		return w.progress(env)
	}
	w.tgt.sentAt = env.Now
	r.tfwd[w.tgt.seq] = w
	if a.Code == WrongEpoch && a.Epoch > r.rec.Epoch {
		return []any{Refresh{}}
	}
	return nil
}

// targetRecord: a move's target takes a new version of its record.
func (r *replica) targetRecord(env Env) []any {
	switch {
	case r.state == repJoining && r.named(r.rec):
		return r.join(env)
	case r.state == repReady && !r.named(r.rec):
		// The move waits (the RLDev left the normal state) or the
		// primary gave this incarnation up: it is named again, and
		// copied to from the start, when it can be.
		r.state = repJoining
		return []any{r.e.logf(2, "rldev move target no longer receiving: asking to be named again", "rldev", r.rec.ID)}
	}
	return nil
}

// targetWant is what a move's target needs of the table.
func (r *replica) targetWant(env Env, rec *Record) (*Record, string) {
	m := rec.Move
	if m == nil || m.To != r.place() {
		return nil, ""
	}
	switch {
	case r.state == repFailed && len(rec.Retiring) < MaxRetiring:
		rec.Move, rec.MovingFailed = nil, false
		rec.retire(m.To, true)
		rec.Progress, rec.ProgressTotal = 0, 0
		rec.Epoch++
		return rec, fmt.Sprintf("move abandoned: the target's disk failed on node %d (%v)", r.e.cfg.Node, r.err)
	case r.state == repJoining && rec.State == Normal && m.Inc < r.e.cfg.Inc && r.e.up[r.peerNode()]:
		m.Inc, m.Switch = r.e.cfg.Inc, false
		rec.Progress, rec.ProgressTotal = 0, rec.Blocks
		rec.Epoch++
		return rec, fmt.Sprintf("move target on node %d receiving (incarnation %d)", r.e.cfg.Node, r.e.cfg.Inc)
	}
	return nil, ""
}

// moveStall is how long the primary waits for a move's target it cannot
// reach (or that refuses its copies) before it parks the move: writes do
// not wait for a target longer (it serves nothing: dropping it is safe).
const moveStall = 5 * time.Second

// moveWant is what the primary of a moving RLDev needs of the table: it
// passes every step of a move after the target is named (the moving
// secondary only stops serving when it learns of Switch).
func (r *replica) moveWant(env Env, rec *Record) (*Record, string) {
	m := rec.Move
	if m == nil || m.Inc == 0 {
		r.tgtDown, r.tgtDownInc = time.Time{}, 0 // the next naming starts a clock of its own
	}
	if m == nil || r.state != repReady || r.stale() || rec.State != Normal || !r.isPrimary() || m.Inc == 0 {
		return nil, ""
	}
	switch {
	case r.e.peerDead(m.To.Node, m.Inc):
		rec.parkMove()
		return rec, fmt.Sprintf("move target node %d dead: the move waits for it", m.To.Node)
	case r.targetStalled(env):
		rec.parkMove()
		// The target may be named again, with the same incarnation,
		// before this replica sees the park in a table.
		r.tgtDown, r.tgtDownInc = time.Time{}, 0
		return rec, fmt.Sprintf("move target node %d unreachable for %v: the move waits for it", m.To.Node, moveStall)
	case !m.Switch && r.moveCopied() && r.e.cfg.Unsafe.MoveEarly:
		rec.switchMove()
		return rec, "move copied: switched at once (unsafe)"
	case m.Switch && !r.moveCopied():
		// This incarnation did not copy it all, or a range changed here
		// from the peer since (a write refused there pulled back, a newer
		// block the scrubber found): the target may lack it.
		m.Switch = false
		rec.Progress, rec.ProgressTotal = 0, rec.Blocks
		rec.Epoch++
		r.mv, r.mvStale = nil, false
		return rec, "move: copying again (the target may lack what changed here)"
	case m.Switch && (m.Seg == r.seg && r.idle() || m.Seg != r.seg && r.stopConfirmed == rec.Epoch):
		// The moving replica serves nothing any more: this one, or the
		// secondary, which answered in the switching epoch.
		from := rec.Segs[m.Seg]
		rec.switchMove()
		return rec, fmt.Sprintf("segment %d moved from %v to %v", m.Seg, from, rec.Segs[m.Seg])
	case !m.Switch && r.moveCopied():
		m.Switch = true
		rec.Progress, rec.ProgressTotal = r.mv.copied, r.mv.total
		rec.Epoch++
		return rec, "move copied: switching"
	case !m.Switch && r.mv != nil && r.mv.inc == m.Inc && !r.mv.failed && r.mv.copied != rec.Progress && env.Now.Sub(r.mv.reported) >= r.e.cfg.ProgressEvery:
		r.mv.reported = env.Now
		rec.Progress, rec.ProgressTotal = r.mv.copied, r.mv.total
		return rec, "move progress"
	}
	return nil, ""
}

// moveCopied: this incarnation copied every block to the named target
// and nothing changed here behind the target's back since.
func (r *replica) moveCopied() bool {
	m := r.rec.Move
	return m != nil && r.mv != nil && r.mv.inc == m.Inc && !r.mv.failed && r.mv.done() && !r.mvStale && r.recovering() == 0 && r.peerChanges == 0
}

// moveStale: this replica's content changes from its peer (not by a
// write it orders), so a move's target may lack it: copied again.
func (r *replica) moveStale() {
	if r.rec.Move != nil {
		r.mvStale = true
	}
}

// targetStalled: the move's target has been unreachable, or has refused
// a copy, for moveStall. The clock is the named incarnation's: one named
// again after it restarted is given moveStall of its own, or the primary
// would park it at once (the session to it is not up yet, or not up in
// this direction) and the target ask again at once, a decree each, as
// fast as the config service takes them (TestMoveTargetBackNotParkedAtOnce).
func (r *replica) targetStalled(env Env) bool {
	m := r.rec.Move
	if r.tgtDownInc != m.Inc {
		r.tgtDown, r.tgtDownInc = time.Time{}, m.Inc
	}
	if r.e.up[m.To.Node] {
		r.tgtDown = time.Time{}
	} else if r.tgtDown.IsZero() {
		r.tgtDown = env.Now
	}
	if !r.tgtDown.IsZero() && env.Now.Sub(r.tgtDown) >= moveStall {
		return true
	}
	for _, c := range r.copies {
		if c.src == r.mv && !c.since.IsZero() && env.Now.Sub(c.since) >= moveStall {
			return true
		}
	}
	return false
}

// parkMove: the target is given up (the move waits for it to be named
// again, and copies from the start).
func (rec *Record) parkMove() {
	rec.Move.Inc, rec.Move.Switch = 0, false
	rec.Progress, rec.ProgressTotal = 0, 0
	rec.Epoch++
}

// switchMove puts the move's target in its segment's place (the caller
// knows it holds every write acknowledged), the old extent retiring.
func (rec *Record) switchMove() {
	m := rec.Move
	rec.retire(rec.Segs[m.Seg], false)
	rec.Segs[m.Seg] = m.To
	rec.Inc[m.Seg] = m.Inc
	rec.Move = nil
	rec.Progress, rec.ProgressTotal = 0, 0
	rec.Epoch++
}

// moveDegraded adjusts a move as rec leaves the normal state because
// segment gone is made stale: a moving segment whose disk failed
// (replace) is replaced by the target, stale and due for a full copy (the
// move empties a failing disk); otherwise the move waits. Reports whether
// the segment was replaced.
//
// A moving segment whose node died is not replaced: its disk is likely
// intact, a copy the operator may still accept (grove rldev
// accept-stale) or resync by its logs alone, where the target holds only
// part of a copy. Replaced, and its extent wiped as it retired, a death
// of the other copy's node before the target's full copy ended left
// nothing of the RLDev (outside review 80).
func (rec *Record) moveDegraded(gone int, replace bool) bool {
	m := rec.Move
	if m == nil {
		return false
	}
	rec.Progress, rec.ProgressTotal = 0, 0
	if m.Seg == gone && replace {
		rec.retire(rec.Segs[gone], false)
		rec.Segs[gone] = m.To
		rec.Inc[gone] = m.Inc
		rec.Stale[gone], rec.FullCopy = true, true
		rec.Move = nil
		return true
	}
	m.Inc, m.Switch = 0, false
	return false
}

// promote makes a move's target the segment the table now puts at its
// place: switched (complete: its superblock says so, durably, before it
// serves) or, after the moving replica was lost, a stale segment to be
// copied whole.
func (r *replica) promote(env Env, rec *Record) []any {
	r.target, r.rec, r.lost = false, rec, false
	r.state = repLoading
	out := []any{r.e.logf(1, "rldev move target now the segment", "rldev", rec.ID, "segment", r.seg, "stale", rec.Stale[r.seg])}
	if rec.Stale[r.seg] {
		return append(out, r.join(env)...)
	}
	return append(out, r.writeSuper(func(s *Super) { s.Incomplete, s.TargetInc = false, 0 }, func(err error) []any {
		if r.state != repLoading {
			return nil
		}
		if err != nil {
			return r.fail(fmt.Errorf("marking the moved segment complete: %w", err))
		}
		return r.join(r.e.env)
	})...)
}

// ------------------------------------------------------------------ retiring extents

// retireReplica retires r; its extent is wiped only once none of its
// writes is in progress (a retired replica starts none: writeDurable),
// nor its reads: a read that completed after the wipe would find zeroed
// blocks, which decode as never written, not as lost.
func (e *Engine) retireReplica(env Env, r *replica, why string) []any {
	out := r.retire(env, why)
	if r.busy() {
		e.retired = append(e.retired, r)
	}
	return out
}

// busy: a disk write or read of the replica's is in progress.
func (r *replica) busy() bool { return r.pending > 0 || r.reading > 0 }

// writeDurable is the replica's disk write (the engine's writeDurable in
// its segment), counted so that its extent is not wiped while one is in
// progress; a retired replica writes nothing more.
func (r *replica) writeDurable(off int64, data []byte, then func(error) []any) []any {
	return r.writeDurableEnc(off, data, nil, then)
}

// writeBlocks writes blocks [block, block+len(data)/BlockSize) durably,
// encoded (checksummed) by the runtime off the engine's lock: generation
// gens[i] for block i, or gen for all if gens is nil.
func (r *replica) writeBlocks(block uint64, data []byte, gens []uint64, gen uint64, then func(error) []any) []any {
	id := r.rec.ID
	return r.writeDurableEnc(r.base+blockOff(block), nil, func() Encoded { return encodeBlocksVec(id, block, data, gens, gen) }, then)
}

func (r *replica) writeDurableEnc(off int64, data []byte, encode func() Encoded, then func(error) []any) []any {
	if r.state == repRetired {
		return then(fmt.Errorf("%w: the replica is retired", ErrNotServing))
	}
	r.pending++
	return r.e.writeDurableEnc(r.disk, off, data, encode, func(err error) []any {
		r.pending--
		return then(err)
	})
}

// wipeChunk is the bytes zeroed per disk write when a retiring extent is
// wiped.
const wipeChunk = 1 << 20

// wipeTick starts wiping this node's retiring extents that nothing can
// write to any more: zeroes from the end of the extent to its start, the
// metadata area last, each write durable before the next.
func (e *Engine) wipeTick() []any {
	if !e.fresh {
		return nil
	}
	live := map[Segment]bool{}
	var out []any
	for _, id := range e.retiringIDs() { // every tick: not the whole table
		rec := e.table.RLDevs[id]
		for _, sg := range rec.Retiring {
			if sg.Node != e.cfg.Node || e.disks[sg.Disk] == nil {
				continue
			}
			live[sg] = true
			if e.wiping[sg] || e.wiped[sg] || e.inUse(sg) {
				continue
			}
			if rec.State != Normal && !rec.isRetiringTarget(sg) {
				// Not before the RLDev has both its copies again: the
				// extent may hold the only other copy there is (a stale
				// segment re-placed, or replaced by a move's target, and
				// the primary lost before the rebuild ended; outside
				// review 82: its node, back, wiped it at once). A move's
				// target given up never held such a copy (outside review
				// 83: kept, they filled MaxRetiring).
				continue
			}
			e.wiping[sg] = true
			out = append(out, e.logf(1, "rldev wiping a retired extent", "rldev", id, "extent", sg.String()))
			out = append(out, e.wipeFrom(sg, SegmentSize(rec.Blocks))...)
		}
	}
	for sg := range e.wiped { // removed from the table: forgotten
		if !live[sg] {
			delete(e.wiped, sg)
		}
	}
	return out
}

// wipeFrom zeroes the extent below end, one chunk at a time.
func (e *Engine) wipeFrom(sg Segment, end int64) []any {
	if end <= 0 {
		delete(e.wiping, sg)
		e.wiped[sg] = true
		return []any{e.logf(1, "rldev retired extent wiped", "extent", sg.String())}
	}
	at := max(0, end-wipeChunk)
	return e.writeDurable(sg.Disk, sg.Offset+at, make([]byte, end-at), func(err error) []any {
		if err != nil {
			delete(e.wiping, sg) // again on a later tick
			return []any{e.logf(3, "rldev wiping a retired extent failed", "extent", sg.String(), "err", err)}
		}
		return e.wipeFrom(sg, at)
	})
}

// inUse: a replica here still holds the extent, or a retired one still
// has a disk write or read of it in progress.
func (e *Engine) inUse(sg Segment) bool {
	for _, r := range e.replicas() {
		if r.place() == sg && (r.state != repRetired || r.busy()) {
			return true
		}
	}
	return e.retiredBusy(sg)
}

// retiredBusy: a retired replica's disk I/O on the extent at place is
// still in progress.
func (e *Engine) retiredBusy(place Segment) bool {
	e.retired = slices.DeleteFunc(e.retired, func(r *replica) bool { return !r.busy() })
	for _, r := range e.retired {
		if r.place() == place {
			return true
		}
	}
	return false
}

// wipeRetiring removes from rec (or nr, the change already wanted) the
// retiring extents of this node that are wiped, or on a disk it no longer
// has.
func (e *Engine) wipeRetiring(env Env, rec, nr *Record) (*Record, string) {
	base := rec
	if nr != nil {
		base = nr
	}
	var keep, keepTargets []Segment
	var gone []string
	for _, sg := range base.Retiring {
		if sg.Node == e.cfg.Node && (e.wiped[sg] || e.disks[sg.Disk] == nil) {
			gone = append(gone, sg.String())
			continue
		}
		keep = append(keep, sg)
		if base.isRetiringTarget(sg) {
			keepTargets = append(keepTargets, sg)
		}
	}
	if len(gone) == 0 {
		return nil, ""
	}
	if nr == nil {
		nr = rec.Clone()
	}
	nr.Retiring, nr.RetiringTargets = keep, keepTargets
	return nr, fmt.Sprintf("extents %v freed", gone)
}
