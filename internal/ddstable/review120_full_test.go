package ddstable

import (
	"testing"
	"time"
)

// A brick at MaxOps refuses an abort without a tombstone but acks it
// Aborted; the coordinator reports Failed; a duplicate prepare delivered
// later is accepted: an orphan Prepared that never resolves (its peers
// answer Absent once Done passed it) and that commits if its peers are
// removed.
func TestReview120FullOrphan(t *testing.T) {
	t0 := time.Unix(1000, 0)
	m, pts := r120setup(t, 1, 2, 3)
	b1, b2, b3 := br(1), br(2), br(3)
	// Brick 3 admits 2 records.
	cfg3 := DefaultParticipantConfig(b3)
	cfg3.MaxOps = 2
	pts[b3], _ = NewParticipant(cfg3, m, Root)

	// Another library's session fills brick 3: op W1 (seq 1) finished
	// and op W2 (seq 2, key 5) prepared.
	c2, _ := NewCoordinator(DefaultCoordinatorConfig(0x222), m)
	drive := func(now time.Time, c *Coordinator, e CoordEffects, to map[BrickID]bool) (res []Result, held []Send) {
		for len(e.Sends) > 0 {
			var next CoordEffects
			for _, s := range e.Sends {
				if !to[s.To] {
					held = append(held, s)
					continue
				}
				if s.Prepare != nil {
					v := pts[s.To].Prepare(now, *s.Prepare)
					ce := c.OnVote(now, s.To, s.Prepare.Op, v)
					next.Sends = append(next.Sends, ce.Sends...)
					res = append(res, ce.Results...)
				} else {
					a, _ := pts[s.To].Decide(now, *s.Decide)
					ce := c.OnAck(now, s.To, s.Decide.Op, a)
					next.Sends = append(next.Sends, ce.Sends...)
					res = append(res, ce.Results...)
				}
			}
			res = append(res, e.Results...)
			e = next
		}
		return res, held
	}
	all := map[BrickID]bool{b1: true, b2: true, b3: true}
	only3 := map[BrickID]bool{b3: true}
	w1, e, _ := c2.Begin(t0, Update{Key: 4, Value: []byte("w1")})
	_, w1held := drive(t0, c2, e, only3) // W1's prepares to 1 and 2 are slow
	w2, e, _ := c2.Begin(t0, Update{Key: 5, Value: []byte("w2")})
	_, w2held := drive(t0, c2, e, only3)
	t.Logf("brick 3 holds %d records (W1 %v, W2 %v)", len(pts[b3].ops), pts[b3].StateOf(w1), pts[b3].StateOf(w2))

	// Our library's op X on key 7: brick 3 is busy.
	c, _ := NewCoordinator(DefaultCoordinatorConfig(0xabc), m)
	x, e, _ := c.Begin(t0, Update{Key: 7, Value: []byte("x")})
	var dupPrepare3 Prepare
	for _, s := range e.Sends {
		if s.To == b3 {
			dupPrepare3 = *s.Prepare // a retry/duplicate of it is still in the network
		}
	}
	res, _ := drive(t0, c, e, all)
	t.Logf("X: %+v; states 1:%v 2:%v 3:%v", res, pts[b1].StateOf(x), pts[b2].StateOf(x), pts[b3].StateOf(x))
	if len(res) != 1 || res[0].Outcome != Failed {
		t.Fatalf("expected X Failed, got %+v", res)
	}
	// W1 then W2 finish; W2's decision carries Done=2, which frees W1's record at brick 3.
	drive(t0, c2, CoordEffects{Sends: w1held}, all)
	drive(t0, c2, CoordEffects{Sends: w2held}, all)
	t.Logf("brick 3 holds %d records (W1 %v, W2 %v); library 2 in flight %d", len(pts[b3].ops), pts[b3].StateOf(w1), pts[b3].StateOf(w2), c2.InFlight())
	t1 := t0.Add(10 * time.Millisecond)
	v := pts[b3].Prepare(t1, dupPrepare3) // the late duplicate
	t.Logf("late duplicate prepare of X at brick 3: %+v; in doubt %d", v, pts[b3].InDoubt())
	// The library's next op carries Done=2 to bricks 1 and 2: X forgotten there.
	_, e, _ = c.Begin(t1, Update{Key: 8, Value: []byte("y")})
	drive(t1, c, e, map[BrickID]bool{b1: true, b2: true, b3: true})

	// Brick 3 times out on X and asks its peers, for an hour.
	reg := r120reg{}
	now := t1
	for i := 0; i < 3600*10; i++ {
		now = now.Add(100 * time.Millisecond)
		eff := pts[b3].Tick(now)
		for _, q := range eff.Queries {
			st := pts[q.To].Query(now, q.Query)
			if i < 30 {
				t.Logf("brick 3 asks %v about %v (sweep %v): %v", q.To, q.Query.Op, q.Query.Sweep, st)
			}
			a := pts[b3].Answer(now, q.To, q.Query, st)
			for _, p := range a.Proposals {
				pts[b3].Outcome(now, p.Op, reg.put(p))
			}
		}
		pts[b1].Tick(now)
		pts[b2].Tick(now)
	}
	t.Logf("after 1 h: brick 3 X %v, in doubt %d, read key 7: %v", pts[b3].StateOf(x), pts[b3].InDoubt(), pts[b3].Read(7, pts[b3].Stamp()))
	if pts[b3].InDoubt() != 0 {
		t.Errorf("liveness: X (reported Failed) still prepared at brick 3 after an hour; key 7 reads ErrBusy there")
	}
	// Bricks 1 and 2 die and are removed (a 3-replica group may lose 2).
	m2 := m.Clone()
	m2.Epoch = 2
	m2.RG[Root] = []BrickID{b3}
	eff, _ := pts[b3].SetMaps(now, m2)
	for _, p := range eff.Proposals {
		v := reg.put(p)
		t.Logf("brick 3 proposes commit=%v for %v: decreed %v", p.Commit, p.Op, v)
		eff.add(pts[b3].Outcome(now, p.Op, v))
	}
	for _, a := range eff.Applied {
		if a.Op == x {
			t.Errorf("safety: X, reported Failed, is applied at brick 3: %q", a.Update.Value)
		}
	}
}
