package rldev

import "time"

// WriteID names a client's write, the same in each of its attempts: the
// clerk's own random Writer and its sequence number (0, 0: none named, a
// caller or a clerk of an earlier build).
//
// Why: the clerk sends a write again when it could not learn an
// attempt's outcome (its answer lost, or ErrMaybeWritten: the node failed
// over mid-way). Applied again, the retry could land over a write of
// another writer that came after the first attempt, which a reader may
// have seen: the first value, the other's, then the first again (CI,
// 2026-12-02, seed 62704: a read on the secondary saw a write forwarded
// before the primary was paused past its lease, another client's write
// was acknowledged by the new primary, then the retry landed over it).
//
// So every copy remembers, for a while, the writes that landed on it in
// this engine (landedWrites) and their generation, and a write whose
// WriteID it remembers is not applied again: it writes the range's
// current content instead, under the write's own range lock, through the
// ordinary path (the dirty regions, the degraded-mode log, the peer and a
// move's target, as the state requires), so that every copy the state
// requires holds what the write left or what came after it, and answers
// the write done (Reply.LandedBefore). The current content is the
// write's or newer: a remembered write landed on this copy, and since
// then only writes ordered after it (by a primary's range lock) have
// landed there, as whatever lands otherwise -- another copy's blocks, in
// a repair, a pull, a resync's or a move's copy -- makes the copy forget
// every write it remembers (forgetLanded). The disk is not trusted with
// it: each block written is the newest sound copy, by generation, of
// this copy's and (in the normal state) the peer's, pulled under the
// write's range lock; only a block older than the write on both (a disk
// that lost or misplaced the write), or sound on neither, gets the
// write's own data, and the write then counts as applied again (outside
// review 114: the rewrite copied a lost write's older block over the
// peer's good copy, and a rotted block failed the retry for good; review
// 115: a later write this disk lost, a rotten block, or one block of
// several older made the retry land over a later write the peer held).
// Generations grow with every write a copy takes, its own or forwarded,
// across epochs too, so a later write never carries an older one
// (review 115: a forward now raises the copy's own counter, which a
// WriteReplica of the same epoch took from below it).
//
// What it does not cover: a retry of a write that landed on a copy whose
// engine has ended since (a crash, a restart, a fence), that is older
// than LandedFor, past LandedMax writes of the copy since, or that finds
// its blocks older or corrupt, is applied again, as before: the clerk
// counts it (WriteResult.Applied).
type WriteID struct{ Writer, Seq uint64 }

// How long, and how many, a copy remembers the writes that landed on it.
// A clerk sends a write again within seconds (the failure detector's
// grace period and a decree). About 100 bytes a write: a node remembers
// at most its write rate times LandedFor (30 s of 20 000 writes a second:
// 60 MB), and a copy at most LandedMax (3 MB); the engine's tick expires
// an idle copy's.
const (
	LandedFor = 30 * time.Second
	LandedMax = 1 << 15
)

type landedWrite struct {
	block, n uint64
	gen      uint64 // the generation it landed with
	at       time.Time
}

// landedWrites is a copy's memory of the client writes that landed on it
// in this engine, by WriteID, oldest first in order.
type landedWrites struct {
	m     map[WriteID]landedWrite
	order []WriteID
}

// remember records that write id, of n blocks at block, landed on the
// copy at now with generation gen.
func (l *landedWrites) remember(id WriteID, block, n, gen uint64, now time.Time) {
	if id == (WriteID{}) {
		return
	}
	if l.m == nil {
		l.m = map[WriteID]landedWrite{}
	}
	if _, ok := l.m[id]; !ok {
		l.order = append(l.order, id)
	}
	l.m[id] = landedWrite{block: block, n: n, gen: gen, at: now}
	l.expire(now)
}

// expire forgets the writes older than LandedFor, and the oldest past
// LandedMax.
func (l *landedWrites) expire(now time.Time) {
	i := 0
	for ; i < len(l.order); i++ {
		w, ok := l.m[l.order[i]]
		if ok && len(l.order)-i <= LandedMax && now.Sub(w.at) < LandedFor {
			break
		}
		delete(l.m, l.order[i])
	}
	l.order = l.order[i:] // append moves it to a new array once full: the front is freed then
}

// landed reports whether write id, of n blocks at block, landed on the
// copy, and its generation (a WriteID named for other blocks is another
// write: a clerk's writes are numbered once each).
func (l *landedWrites) landed(id WriteID, block, n uint64, now time.Time) (uint64, bool) {
	if id == (WriteID{}) {
		return 0, false
	}
	w, ok := l.m[id]
	if !ok || w.block != block || w.n != n || now.Sub(w.at) >= LandedFor {
		return 0, false
	}
	return w.gen, true
}

// forget forgets every write: blocks of another copy are landing on this
// one, which may then hold older data than a write it remembers.
func (l *landedWrites) forget() {
	l.m, l.order = nil, nil
}

// rememberLanded is landedWrites.remember for the replica, while it is
// live: a disk write of a failed copy that lands afterwards is not
// remembered into its next life (review 115).
func (r *replica) rememberLanded(id WriteID, block, n, gen uint64) {
	if r.state == repFailed || r.state == repRetired {
		return
	}
	r.landed.remember(id, block, n, gen, r.e.env.Now)
}

// forgetLanded is landedWrites.forget for the replica: blocks of another
// copy land on it (a repair, a pull, a resync's or a move's copy).
func (r *replica) forgetLanded() {
	if len(r.landed.order) > 0 {
		r.e.stats.LandedForgotten++
	}
	r.landed.forget()
}
