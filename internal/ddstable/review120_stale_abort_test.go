package ddstable

import (
	"testing"
	"time"
)

// An abort decision delayed in the network, reaching a brick after the
// operation committed there and was forgotten under Done, records an
// Aborted tombstone for a committed operation.
func TestReview120StaleAbortTombstone(t *testing.T) {
	t0 := time.Unix(1000, 0)
	m, pts := r120setup(t, 1, 2, 3)
	b1, b2, b3 := br(1), br(2), br(3)
	c, _ := NewCoordinator(DefaultCoordinatorConfig(0xabc), m)
	x, e, _ := c.Begin(t0, Update{Key: 7, Value: []byte("x")})
	for _, s := range e.Sends {
		pts[s.To].Prepare(t0, *s.Prepare) // votes lost
	}
	// The library stalls; the bricks time out and resolve commit.
	t1 := t0.Add(2 * time.Second)
	reg := r120reg{}
	for _, b := range []BrickID{b1, b2, b3} {
		for _, q := range pts[b].Tick(t1).Queries {
			pts[q.To].Query(t1, q.Query)
		}
	}
	for _, b := range []BrickID{b1, b2, b3} {
		for _, q := range pts[b].Tick(t1.Add(time.Second)).Queries {
			st := pts[q.To].Query(t1, q.Query)
			for _, p := range pts[b].Answer(t1, q.To, q.Query, st).Proposals {
				pts[b].Outcome(t1, p.Op, reg.put(p))
			}
		}
	}
	t.Logf("after termination: %v %v %v", pts[b1].StateOf(x), pts[b2].StateOf(x), pts[b3].StateOf(x))
	// The library wakes: vote timeout, abort to all; brick 1 answers Committed, it follows.
	t2 := t1.Add(2 * time.Second)
	ce := c.Tick(t2)
	var abortTo3 Decide
	var follow []Send
	for _, s := range ce.Sends {
		if s.To == b3 {
			abortTo3 = *s.Decide // delayed
		}
		if s.To == b1 {
			a, _ := pts[b1].Decide(t2, *s.Decide)
			follow = append(follow, c.OnAck(t2, b1, x, a).Sends...)
		}
	}
	res, _ := r120drive(t2, pts, c, CoordEffects{Sends: follow})
	t.Logf("library: %+v in flight %d", res, c.InFlight())
	// The library's next op reaches brick 3 with Done=2: X forgotten there.
	_, e, _ = c.Begin(t2, Update{Key: 8, Value: []byte("y")})
	pts[b3].Prepare(t2, *e.Sends[2].Prepare)
	// The delayed abort arrives.
	a, _ := pts[b3].Decide(t2, abortTo3)
	t.Logf("late abort at brick 3: ack %v; states %v %v %v", a.State, pts[b1].StateOf(x), pts[b2].StateOf(x), pts[b3].StateOf(x))
	if pts[b3].StateOf(x) == Aborted && pts[b1].StateOf(x) == Committed {
		t.Errorf("brick 3 records X aborted; bricks 1 and 2 committed it (the sim's agreement check would flag this)")
	}
	// The register's answer to brick 3's re-sent proposal arrives late.
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Errorf("brick 3 panics (its process dies): %v", r)
			}
		}()
		pts[b3].Outcome(t2, x, true)
	}()
}
