package ddstable

import (
	"testing"
	"time"
)

// Outside review 123 of splits and merges, finding 1: a partition split
// and merged back is served under its old name by new participants with
// no records; a library that missed both decrees resent its abort of a
// write its group had committed by termination, the new participants
// acknowledged it, and the library reported Failed for a write every
// replica held. Now a participant gives no acknowledgement of an abort of
// an operation prepared before it was born (Decide.Epoch).
func TestReview123MergeBackLateAbort(t *testing.T) {
	t0 := time.Unix(1000, 0)
	m, pts := oneGroup(t, nil, 1, 2, 3)
	g := m.RG[Root]
	c, _ := NewCoordinator(DefaultCoordinatorConfig(0xabc), m)
	op, e, _ := c.Begin(t0, Update{Key: 7, Value: []byte("v1")})
	for _, s := range e.Sends { // every member votes yes; every vote is lost
		if v := pts[s.To].Prepare(t0, *s.Prepare); !v.Yes {
			t.Fatalf("vote %+v", v)
		}
	}
	// The library times out and decides abort; those messages are lost.
	c.Tick(t0.Add(time.Second))
	// The members terminate: every peer prepared, so commit is decreed.
	t1 := t0.Add(3 * time.Second)
	reg := register{}
	for _, b := range g {
		for _, q := range pts[b].Tick(t1).Queries {
			st := pts[q.To].Query(t1, q.Query)
			for _, p := range pts[b].Answer(t1, q.To, q.Query, st).Proposals {
				pts[b].Outcome(t1, p.Op, reg.put(p))
			}
		}
	}
	for _, b := range g {
		for _, q := range pts[b].Tick(t1.Add(time.Second)).Queries {
			st := pts[q.To].Query(t1, q.Query)
			for _, p := range pts[b].Answer(t1, q.To, q.Query, st).Proposals {
				pts[b].Outcome(t1, p.Op, reg.put(p))
			}
		}
	}
	for _, b := range g {
		if st := pts[b].StateOf(op); st != Committed {
			t.Fatalf("brick %v: %v, want committed", b, st)
		}
	}
	// Split, then merged back: each member settled under each lease.
	step := func(m *Maps, err error) *Maps {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	m = step(WithSplitLease(m, Root, g[0]))
	m = step(Split(m, Root, g[0]))
	m = step(WithMergeLease(m, Root, g[0]))
	m = step(Merged(m, Root, g[0]))
	for _, b := range g {
		pc := DefaultParticipantConfig(b)
		pt, err := NewParticipant(pc, m, Root)
		if err != nil {
			t.Fatal(err)
		}
		pts[b] = pt
	}
	// The library, which saw none of it, resends its abort.
	var res []Result
	for i := range 20 {
		now := t1.Add(time.Duration(2+i) * time.Second)
		res = append(res, drive(c, pts, now, c.Tick(now), nil)...)
	}
	for _, r := range res {
		if r.Op == op && r.Outcome == Failed {
			t.Fatalf("reported Failed for a write every replica committed")
		}
	}
	// Review 124, finding 3: and it ends (Unknown), not left in flight
	// for good with the session's Done mark stuck behind it.
	if len(res) != 1 || res[0].Outcome != Unknown || c.InFlight() != 0 || c.Done() != 2 {
		t.Fatalf("results %+v, %d in flight, Done %d", res, c.InFlight(), c.Done())
	}
}
