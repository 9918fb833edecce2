package ddstable

import (
	"errors"
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

// Outside review 122, finding 1: a copy taken once the source alone was
// settled could miss a write a peer committed later, by rule 4, after the
// source (which had aborted it) was removed. Every member must be settled
// first: here the peer, still prepared when the lease lands, is not, and
// settles only by asking the source, whose abort it then follows.
func TestReview122CopyWaitsForEveryMember(t *testing.T) {
	t0 := time.Unix(1000, 0)
	A, B, C := br(1), br(2), br(3)
	m0 := &Maps{Table: "t", Epoch: 1, Replicas: 3, DP: NewDPMap(), RG: map[Partition][]BrickID{Root: {A, B}}}
	pa, _ := NewParticipant(DefaultParticipantConfig(A), m0, Root)
	pb, _ := NewParticipant(DefaultParticipantConfig(B), m0, Root)
	co, _ := NewCoordinator(DefaultCoordinatorConfig(0xfeed), m0)
	op, e, _ := co.Begin(t0, Update{Key: 7, Value: []byte("v1")})
	for _, s := range e.Sends {
		pt := map[BrickID]*Participant{A: pa, B: pb}[s.To]
		v := pt.Prepare(t0, *s.Prepare)
		if s.To == A {
			co.OnVote(t0, A, op, v) // B's vote is lost
		}
	}
	t1 := t0.Add(1100 * time.Millisecond) // the vote timeout: abort, heard by A alone
	for _, s := range co.Tick(t1).Sends {
		if s.To == A && s.Decide != nil {
			pa.Decide(t1, *s.Decide)
		}
	}
	m1, err := WithLease(m0, Root, C)
	if err != nil {
		t.Fatal(err)
	}
	pa.SetMaps(t1, m1)
	pb.SetMaps(t1, m1)
	if pa.CopyReady(C) != nil {
		t.Fatal("the source, settled, refuses the copy")
	}
	if !errors.Is(pb.CopyReady(C), ErrInDoubt) {
		t.Fatal("the peer, still prepared, says it is settled: a copy now could miss its later commit")
	}
	// The peer settles by asking the source: abort, as the source did.
	t2 := t0.Add(3 * time.Second)
	reg := register{}
	for _, q := range pb.Tick(t2).Queries {
		for _, p := range pb.Answer(t2, q.To, q.Query, pa.Query(t2, q.Query)).Proposals {
			pb.Outcome(t2, p.Op, reg.put(p))
		}
	}
	if pb.StateOf(op) != Aborted || pb.CopyReady(C) != nil {
		t.Fatalf("the peer: %v, settled: %v", pb.StateOf(op), pb.CopyReady(C))
	}
}

// Outside review 122, finding 3: a recovering brick that died before
// joining kept its lease for good; its node's next incarnation takes it
// over (and the janitor asks the detector about joiners too).
func TestReview122NextIncarnationTakesTheLease(t *testing.T) {
	A, B := br(1), br(2)
	m0 := &Maps{Table: "t", Epoch: 1, Replicas: 3, DP: NewDPMap(), RG: map[Partition][]BrickID{Root: {A, B}}}
	m1, _ := WithLease(m0, Root, BrickID{Node: 3, Inc: 2})
	if _, err := WithLease(m1, Root, BrickID{Node: 3, Inc: 3}); err != nil {
		t.Fatalf("the node's next incarnation: %v", err)
	}
	if _, err := WithLease(m1, Root, BrickID{Node: 4, Inc: 1}); !errors.Is(err, ErrLeaseHeld) {
		t.Fatalf("another node: %v", err)
	}
	if _, err := WithLease(m1, Root, BrickID{Node: 3, Inc: 1}); !errors.Is(err, ErrLeaseHeld) {
		t.Fatalf("an older incarnation: %v", err)
	}
}
