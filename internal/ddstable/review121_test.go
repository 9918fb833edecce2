package ddstable

import (
	"testing"
	"time"
)

// Outside review 121 (of the runtime), the cores' part: each failed before
// its fix.

// Finding 1: a brick with no replica of the partition yet (its watch
// behind a new table) said "repair" without a record, and the coordinator
// took it for the brick's abort: Failed was reported, and a later copy of
// the prepare, finding the replica, committed the write.
func TestReview121NotServingIsNoAbort(t *testing.T) {
	t0 := time.Unix(1000, 0)
	m, pts := oneGroup(t, nil, 1)
	c, _ := NewCoordinator(DefaultCoordinatorConfig(0xabc1), m)
	x, e, _ := c.Begin(t0, Update{Key: 7, Value: []byte("v1")})
	ce := c.OnVote(t0, br(1), x, Vote{Reason: ReasonNotServing, Stamp: Stamp{}})
	if len(ce.Results) != 0 {
		t.Fatalf("reported %v on a vote the brick did not record", ce.Results)
	}
	// The brick's replica appears; the decision (abort) reaches it and is
	// recorded there: only now is the write Failed, and a late copy of
	// the prepare is refused.
	res := drive(c, pts, t0, ce, nil)
	if len(res) != 1 || res[0].Outcome != Failed || pts[br(1)].StateOf(x) != Aborted {
		t.Fatalf("results %v, brick: %v", res, pts[br(1)].StateOf(x))
	}
	if v := pts[br(1)].Prepare(t0, *e.Sends[0].Prepare); v.Yes {
		t.Fatal("the late prepare was taken")
	}
}

// Finding 2: a table dropped and created again with the same layout had
// the same stamp, and a brick that saw both decrees at once kept the old
// table's replica: the new table served the old one's data. A new
// generation retires every participant of the old one.
func TestReview121NewGenerationRetires(t *testing.T) {
	t0 := time.Unix(1000, 0)
	m, pts := oneGroup(t, nil, 1, 2)
	again := m.Clone()
	again.Gen = m.Gen + 1
	if again.Stamp() == m.Stamp() {
		t.Fatal("two generations, one stamp")
	}
	if _, member := pts[br(1)].SetMaps(t0, again); member {
		t.Fatal("a participant of the dropped table serves the new one")
	}
	c, _ := NewCoordinator(DefaultCoordinatorConfig(0xabc), m)
	x, _, _ := c.Begin(t0, Update{Key: 7, Value: []byte("x")})
	res := c.SetMaps(t0, again).Results
	if len(res) != 1 || res[0].Op != x || res[0].Outcome != Unknown || c.InFlight() != 0 {
		t.Fatalf("an operation on the dropped table: %v, %d in flight", res, c.InFlight())
	}
}
