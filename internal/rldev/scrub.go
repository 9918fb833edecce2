package rldev

import (
	"fmt"
	"slices"
	"time"
)

// The scrubber walks every segment of the node, ScrubBlocks at a time, at
// ScrubRate bytes per second over all of them (round robin): it reads the
// blocks (a block failing its check is repaired from the peer, as a read
// repairs it), then, while the RLDev is normal, asks the peer for the
// generations of the same blocks and pulls those the peer holds a newer
// generation of. The second step finds what no checksum can: a block a
// misdirected write should have replaced still holds its old, well-formed
// content (its generation is older than the peer's).
//
// The scrubber holds no range lock while it waits for the peer (a replica
// that holds a lock while waiting for its peer can deadlock against the
// peer's writes in flight, which wait for this replica). A generation that
// looks older because the peer's write is still on its way here is pulled
// early, or found current when the range is held: a write's data reaches
// both copies either way.

// scrubState is one replica's scrubber: where it is in the segment.
type scrubState struct {
	next     uint64 // the first block of the next chunk
	busy     bool   // a chunk is being checked
	passes   uint64 // whole passes over the segment
	repaired uint64 // blocks repaired (both steps)
}

// scrub starts the next chunk, if the rate allows one now.
func (e *Engine) scrub(env Env) []any {
	if e.cfg.ScrubRate < 0 || env.Now.Before(e.scrubAt) || len(e.reps) == 0 {
		return nil
	}
	ids := sortedIDs(e.reps)
	for i := range ids {
		id := ids[(int(e.scrubNext)+i)%len(ids)]
		r := e.reps[id]
		if r.scrub.busy || !r.ready() || r.stale() || r.recovering() > 0 {
			continue
		}
		e.scrubNext = uint64((int(e.scrubNext) + i + 1) % len(ids))
		n := min(e.cfg.ScrubBlocks, r.rec.Blocks-r.scrub.next)
		// The next chunk may start when this one's bytes are paid for.
		e.scrubAt = env.Now.Add(timePerBytes(int64(n)*BlockSize, e.cfg.ScrubRate))
		return r.scrubChunk(r.scrub.next, n)
	}
	return nil
}

// scrubChunk checks blocks [first, first+n) (step one, then two).
func (r *replica) scrubChunk(first, n uint64) []any {
	r.scrub.busy = true
	done := func(err error) []any {
		r.scrub.busy = false
		r.e.stats.ScrubbedBlocks += n
		var out []any
		if err != nil {
			out = append(out, r.e.logf(3, "rldev scrub: blocks not repaired", "rldev", r.rec.ID,
				"blocks", fmt.Sprintf("[%d, %d)", first, first+n), "err", err))
		}
		if r.scrub.next = first + n; r.scrub.next >= r.rec.Blocks {
			r.scrub.next = 0
			r.scrub.passes++
			r.e.stats.ScrubPasses++
			out = append(out, r.e.logf(1, "rldev scrub: pass over the segment done", "rldev", r.rec.ID,
				"passes", r.scrub.passes, "repaired", r.scrub.repaired))
		}
		return out
	}
	var out []any
	_, out = r.locks.acquire(first, n, false, func(lk *rangeLock) []any {
		return r.readRun(first, n, func(_ []byte, gens []uint64, bad []uint64, err error) []any {
			out := r.locks.release(lk)
			switch {
			case err != nil:
				out = append(out, r.fail(err)...)
				return append(out, done(err)...)
			case r.state != repReady:
				return append(out, done(nil)...)
			case len(bad) > 0:
				out = append(out, r.e.logf(2, "rldev scrub: blocks fail their check: repairing them from the peer", "rldev", r.rec.ID, "blocks", bad))
				r.scrub.repaired += uint64(len(bad))
				r.e.stats.ScrubRepairs += uint64(len(bad))
				return append(out, r.repair(bad, func(err error) []any {
					if err != nil {
						return done(err)
					}
					return r.scrubGens(first, n, done)
				})...)
			}
			return append(out, r.scrubGens(first, n, done)...)
		})
	})
	return out
}

// scrubGens is step two: pull the blocks the peer holds newer generations
// of. Only while the RLDev is normal (otherwise one copy is stale and the
// resync's business) and the copies are kept alike by this layer (not
// with the dirty-region log off, where the client reconciles them).
func (r *replica) scrubGens(first, n uint64, done func(error) []any) []any {
	if r.rec.State != Normal || r.stale() || r.peerStale() || r.rec.DRLOff || !r.peerReachable() {
		return done(nil)
	}
	return r.sendPull(r.e.env, &pullWait{first: first, n: n, gensOnly: true, then: func(pd PullData) []any {
		if pd.Code != OK && pd.Code != Corrupt || uint64(len(pd.Gens)) != n || pd.Data != nil {
			return done(nil) // the peer is busy or gone: the next pass will do
		}
		return r.readRun(first, n, func(_ []byte, mine []uint64, bad []uint64, err error) []any {
			if err != nil {
				return append(r.fail(err), done(err)...)
			}
			if r.state != repReady {
				return done(nil) // failed (or retired) meanwhile: it takes nothing more from the peer
			}
			older := olderHere(first, mine, bad, pd)
			if len(older) == 0 {
				return done(nil)
			}
			return r.pullNewer(older, done)
		})
	}})
}

// olderHere lists the blocks from first whose generation here (mine)
// is older than the peer's (pd, a generations-only answer), leaving out
// those that fail their check on either side (repaired otherwise).
func olderHere(first uint64, mine, bad []uint64, pd PullData) []uint64 {
	var older []uint64
	for i := range mine {
		b := first + uint64(i)
		if pd.Gens[i] > mine[i] && !slices.Contains(bad, b) && !slices.Contains(pd.Bad, b) {
			older = append(older, b)
		}
	}
	return older
}

// pullNewer pulls blocks the peer holds a newer generation of and, under
// an exclusive range lock, rewrites those that are still older here.
func (r *replica) pullNewer(blocks []uint64, done0 func(error) []any) []any {
	// While it runs a move does not switch (moveCopied); what it writes
	// makes the move's copy run again (moveStale).
	r.peerChanges++
	done := func(err error) []any {
		r.peerChanges--
		return done0(err)
	}
	runs := toRuns(blocks)
	left := len(runs)
	var failed error
	var out []any
	for _, g := range runs {
		g := g
		out = append(out, r.pull(g.first, g.n, func(pd PullData) []any {
			finish := func(err error) []any {
				if err != nil && failed == nil {
					failed = err
				}
				if left--; left > 0 {
					return nil
				}
				return done(failed)
			}
			if !pd.usable(g.n) || r.state != repReady {
				return finish(nil) // next pass (this replica failed or retired meanwhile: none)
			}
			var out []any
			_, out = r.locks.acquire(g.first, g.n, true, func(lk *rangeLock) []any {
				return r.readRun(g.first, g.n, func(_ []byte, mine []uint64, bad []uint64, err error) []any {
					if err != nil {
						return append(append(r.locks.release(lk), r.fail(err)...), finish(err)...)
					}
					var write []uint64
					for i := uint64(0); i < g.n; i++ {
						b := g.first + i
						if pd.Gens[i] > mine[i] && !slices.Contains(pd.Bad, b) || slices.Contains(bad, b) && !slices.Contains(pd.Bad, b) {
							write = append(write, b)
						}
					}
					if len(write) == 0 {
						return append(r.locks.release(lk), finish(nil)...)
					}
					left := len(write)
					var werr error
					var out []any
					r.forgetLanded() // the peer's blocks land here
					for _, b := range write {
						i := b - g.first
						r.scrub.repaired++
						r.e.stats.ScrubRepairs++
						out = append(out, r.writeDurable(r.base+blockOff(b), r.encodeRun(b, pd.Data[i*BlockSize:(i+1)*BlockSize], pd.Gens[i:i+1], 0), func(err error) []any {
							if err != nil && werr == nil {
								werr = err
							}
							if left--; left > 0 {
								return nil
							}
							out := r.locks.release(lk)
							if werr != nil {
								return append(append(out, r.fail(werr)...), finish(werr)...)
							}
							r.moveStale()
							out = append(out, r.e.logf(2, "rldev scrub: blocks older than the peer's copy (a misdirected or lost write) rewritten from it", "rldev", r.rec.ID, "blocks", write))
							return append(out, finish(nil)...)
						})...)
					}
					return out
				})
			})
			return out
		})...)
	}
	return out
}

// timePerBytes is how long n bytes take at rate bytes per second.
func timePerBytes(n, rate int64) time.Duration {
	return time.Duration(float64(n) / float64(rate) * float64(time.Second))
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
