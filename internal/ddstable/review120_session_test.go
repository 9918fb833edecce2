package ddstable

import (
	"testing"
	"time"
)

func r120drive(now time.Time, pts map[BrickID]*Participant, c *Coordinator, e CoordEffects) (res []Result, applied []Applied) {
	for len(e.Sends) > 0 || len(e.Results) > 0 {
		res = append(res, e.Results...)
		var next CoordEffects
		for _, s := range e.Sends {
			pt := pts[s.To]
			if pt == nil {
				continue
			}
			var ce CoordEffects
			if s.Prepare != nil {
				ce = c.OnVote(now, s.To, s.Prepare.Op, pt.Prepare(now, *s.Prepare))
			} else {
				a, ap := pt.Decide(now, *s.Decide)
				applied = append(applied, ap...)
				ce = c.OnAck(now, s.To, s.Decide.Op, a)
			}
			next.Sends = append(next.Sends, ce.Sends...)
			next.Results = append(next.Results, ce.Results...)
		}
		e = next
	}
	return res, applied
}

// A library that restarts with the session id of a previous one (a bad
// random source, a restored VM snapshot) gets Succeeded for writes that
// were never applied: the bricks take its prepare for a duplicate.
func TestReview120SessionReuse(t *testing.T) {
	t0 := time.Unix(1000, 0)
	m, pts := r120setup(t, 1, 2, 3)
	old, _ := NewCoordinator(DefaultCoordinatorConfig(0x5e55), m)
	_, e, _ := old.Begin(t0, Update{Key: 7, Value: []byte("old")})
	res, ap := r120drive(t0, pts, old, e)
	t.Logf("old incarnation: %+v, applied %d", res, len(ap))
	// The library restarts with the same session id, within RecordLife.
	t1 := t0.Add(time.Second)
	neu, _ := NewCoordinator(DefaultCoordinatorConfig(0x5e55), m)
	_, e, _ = neu.Begin(t1, Update{Key: 7, Value: []byte("new")})
	res, ap = r120drive(t1, pts, neu, e)
	t.Logf("new incarnation: %+v, applied %d", res, len(ap))
	if len(res) == 1 && res[0].Outcome == Succeeded && len(ap) == 0 {
		t.Errorf("put(7, new) reported Succeeded, applied at no brick")
	}
}
