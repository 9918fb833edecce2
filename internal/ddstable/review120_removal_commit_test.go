package ddstable

import (
	"testing"
	"time"
)

type r120reg map[OpID]bool // the config service's outcome registers

func (r r120reg) put(p Proposal) bool {
	if v, ok := r[p.Op]; ok {
		return v
	}
	r[p.Op] = p.Commit
	return p.Commit
}

func r120setup(t *testing.T, ids ...uint64) (*Maps, map[BrickID]*Participant) {
	t.Helper()
	var g []BrickID
	for _, id := range ids {
		g = append(g, br(id))
	}
	m := &Maps{Table: "t", Epoch: 1, Replicas: len(g), DP: NewDPMap(), RG: map[Partition][]BrickID{Root: g}}
	pts := map[BrickID]*Participant{}
	for _, b := range g {
		pt, err := NewParticipant(DefaultParticipantConfig(b), m, Root)
		if err != nil {
			t.Fatal(err)
		}
		pts[b] = pt
	}
	return m, pts
}

// The coordinator decides commit on a removal decree without the removed
// member's vote, after a peer concluded abort through the register from
// that member's Aborted answer.
func TestReview120RemovalCommit(t *testing.T) {
	t0 := time.Unix(1000, 0)
	m, pts := r120setup(t, 1, 2, 3)
	b1, b2, b3 := br(1), br(2), br(3)
	c, err := NewCoordinator(DefaultCoordinatorConfig(0xabc), m)
	if err != nil {
		t.Fatal(err)
	}
	op, e, _ := c.Begin(t0, Update{Key: 7, Value: []byte("x")})
	for _, s := range e.Sends {
		if s.To == b3 {
			continue // the prepare to brick 3 is delayed (and never arrives: 3 dies)
		}
		v := pts[s.To].Prepare(t0, *s.Prepare)
		c.OnVote(t0, s.To, op, v) // yes, yes
	}
	// The library stalls (GC, VM pause): no Tick. Brick 1 times out.
	t1 := t0.Add(2 * time.Second)
	reg := r120reg{}
	e1 := pts[b1].Tick(t1)
	for _, q := range e1.Queries {
		st := pts[q.To].Query(t1, q.Query) // 2: Prepared (freezes); 3: no record → Aborted tombstone
		t.Logf("brick 1 asks %v: %v", q.To, st)
		eff := pts[b1].Answer(t1, q.To, q.Query, st)
		for _, p := range eff.Proposals {
			v := reg.put(p)
			t.Logf("brick 1 proposes commit=%v, decreed commit=%v", p.Commit, v)
			pts[b1].Outcome(t1, p.Op, v)
		}
	}
	// Brick 3 dies; the detector declares it; a decree removes it.
	m2 := m.Clone()
	m2.Epoch = 2
	m2.RG[Root] = []BrickID{b1, b2}
	t2 := t1.Add(500 * time.Millisecond)
	// The decree reaches the library before its (late) Tick runs.
	ce := c.SetMaps(t2, m2)
	for _, s := range ce.Sends {
		if s.To == b3 || s.Decide == nil {
			continue
		}
		a, applied := pts[s.To].Decide(t2, *s.Decide)
		t.Logf("decide commit=%v at %v: %v applied=%d", s.Decide.Commit, s.To, a.State, len(applied))
		c.OnAck(t2, s.To, op, a)
	}
	var res []Result
	for i := 0; i < 200; i++ {
		now := t2.Add(time.Duration(i) * 200 * time.Millisecond)
		ce := c.Tick(now)
		res = append(res, ce.Results...)
	}
	t.Logf("register: %v; brick1 %v, brick2 %v; coordinator results %+v; in flight %d",
		reg[op], pts[b1].StateOf(op), pts[b2].StateOf(op), res, c.InFlight())
	if pts[b1].StateOf(op) != pts[b2].StateOf(op) {
		t.Errorf("live replicas disagree: brick 1 %v, brick 2 %v", pts[b1].StateOf(op), pts[b2].StateOf(op))
	}
}
