package ddstable

import (
	"testing"
	"time"
)

// Outside review 120 of the two-phase commit cores: each test failed
// before its fix.

type register map[OpID]bool // the config service's outcome registers: first proposal wins

func (r register) put(p Proposal) bool {
	if v, ok := r[p.Op]; ok {
		return v
	}
	r[p.Op] = p.Commit
	return p.Commit
}

func oneGroup(t *testing.T, cfg func(*ParticipantConfig), ids ...uint64) (*Maps, map[BrickID]*Participant) {
	t.Helper()
	var g []BrickID
	for _, id := range ids {
		g = append(g, br(id))
	}
	m := &Maps{Table: "t", Epoch: 1, Replicas: len(g), DP: NewDPMap(), RG: map[Partition][]BrickID{Root: g}}
	pts := map[BrickID]*Participant{}
	for _, b := range g {
		pc := DefaultParticipantConfig(b)
		if cfg != nil {
			cfg(&pc)
		}
		pt, err := NewParticipant(pc, m, Root)
		if err != nil {
			t.Fatal(err)
		}
		pts[b] = pt
	}
	return m, pts
}

// drive delivers sends to the participants in to (all if nil) and feeds
// the answers back, until the coordinator is quiet; it returns the results.
func drive(c *Coordinator, pts map[BrickID]*Participant, now time.Time, e CoordEffects, to map[BrickID]bool) []Result {
	res := e.Results
	q := e.Sends
	for len(q) > 0 {
		s := q[0]
		q = q[1:]
		pt := pts[s.To]
		if pt == nil || (to != nil && !to[s.To]) {
			continue
		}
		var ce CoordEffects
		if s.Prepare != nil {
			ce = c.OnVote(now, s.To, s.Prepare.Op, pt.Prepare(now, *s.Prepare))
		} else {
			a, _ := pt.Decide(now, *s.Decide)
			ce = c.OnAck(now, s.To, s.Decide.Op, a)
		}
		q = append(q, ce.Sends...)
		res = append(res, ce.Results...)
	}
	return res
}

// Finding 1: the coordinator decided commit from the votes of the members
// left after a removal decree, while a peer had abort decreed on the
// removed member's "aborted" answer: two live replicas disagreed.
func TestReview120CommitNeedsEveryVote(t *testing.T) {
	t0 := time.Unix(1000, 0)
	m, pts := oneGroup(t, nil, 1, 2, 3)
	b1, b2, b3 := br(1), br(2), br(3)
	c, _ := NewCoordinator(DefaultCoordinatorConfig(0xabc), m)
	op, e, _ := c.Begin(t0, Update{Key: 7, Value: []byte("x")})
	for _, s := range e.Sends {
		if s.To != b3 { // the prepare to 3 is delayed
			c.OnVote(t0, s.To, op, pts[s.To].Prepare(t0, *s.Prepare))
		}
	}
	t1 := t0.Add(2 * time.Second) // the library stalls; brick 1 resolves
	reg := register{}
	for _, q := range pts[b1].Tick(t1).Queries {
		st := pts[q.To].Query(t1, q.Query)
		for _, p := range pts[b1].Answer(t1, q.To, q.Query, st).Proposals {
			pts[b1].Outcome(t1, p.Op, reg.put(p))
		}
	}
	if pts[b1].StateOf(op) != Aborted {
		t.Fatalf("brick 1: %v, want aborted (brick 3 answered aborted)", pts[b1].StateOf(op))
	}
	m2 := m.Clone() // brick 3 dies and is decreed out
	m2.Epoch = 2
	m2.RG[Root] = []BrickID{b1, b2}
	t2 := t1.Add(500 * time.Millisecond)
	for _, pt := range []*Participant{pts[b1], pts[b2]} {
		pt.SetMaps(t2, m2)
	}
	res := drive(c, pts, t2, c.SetMaps(t2, m2), map[BrickID]bool{b1: true, b2: true})
	for i := range 50 {
		res = append(res, drive(c, pts, t2, c.Tick(t2.Add(time.Duration(i)*time.Second)), map[BrickID]bool{b1: true, b2: true})...)
		for _, q := range pts[b2].Tick(t2.Add(time.Duration(i) * time.Second)).Queries {
			st := pts[q.To].Query(t2, q.Query)
			for _, p := range pts[b2].Answer(t2, q.To, q.Query, st).Proposals {
				pts[b2].Outcome(t2, p.Op, reg.put(p))
			}
		}
	}
	if s1, s2 := pts[b1].StateOf(op), pts[b2].StateOf(op); s1 != s2 {
		t.Fatalf("live replicas disagree: brick 1 %v, brick 2 %v", s1, s2)
	}
	for _, r := range res {
		if r.Outcome == Succeeded {
			t.Fatalf("reported %v for a write both live replicas aborted", r)
		}
	}
}

// Finding 2: a brick full of records refused without a tombstone but
// acknowledged the abort; the library reported Failed, and a late
// duplicate prepare was accepted, stayed in doubt for good, and could be
// committed once the peers were removed. Now a brick promises only what
// it records: full, it votes busy and acknowledges no abort (the library
// reports nothing yet); with room, its busy vote is recorded, Failed is
// reported, and the late duplicate is refused.
func TestReview120NoPromiseWithoutRecord(t *testing.T) {
	for _, tc := range []struct {
		name       string
		maxRecords int
	}{{"full", 1}, {"room", 2}} {
		t.Run(tc.name, func(t *testing.T) {
			t0 := time.Unix(1000, 0)
			m, pts := oneGroup(t, func(pc *ParticipantConfig) { pc.MaxOps, pc.MaxRecords = 1, tc.maxRecords }, 1, 2, 3)
			b3 := br(3)
			// Another session's write, prepared at brick 3 alone, fills it.
			c2, _ := NewCoordinator(DefaultCoordinatorConfig(0x222), m)
			_, e2, _ := c2.Begin(t0, Update{Key: 1, Value: []byte("w")})
			drive(c2, pts, t0, CoordEffects{Sends: e2.Sends}, map[BrickID]bool{b3: true})
			c, _ := NewCoordinator(DefaultCoordinatorConfig(0xabc), m)
			x, e, _ := c.Begin(t0, Update{Key: 7, Value: []byte("x")})
			var dup Prepare
			for _, s := range e.Sends {
				if s.To == b3 {
					dup = *s.Prepare
				}
			}
			res := drive(c, pts, t0, e, nil)
			for i := 1; i <= 3; i++ {
				now := t0.Add(time.Duration(i) * time.Second)
				res = append(res, drive(c, pts, now, c.Tick(now), nil)...)
			}
			failed := len(res) == 1 && res[0].Op == x && res[0].Outcome == Failed
			v := pts[b3].Prepare(t0.Add(4*time.Second), dup)
			switch tc.name {
			case "full":
				if len(res) != 0 || pts[b3].StateOf(x) != Absent {
					t.Fatalf("reported %v with brick 3's no unrecorded (%v)", res, pts[b3].StateOf(x))
				}
			case "room":
				if !failed || pts[b3].StateOf(x) != Aborted {
					t.Fatalf("results %v; brick 3: %v", res, pts[b3].StateOf(x))
				}
			}
			if v.Yes || pts[b3].StateOf(x) == Prepared {
				t.Fatalf("the late duplicate prepare was taken: %+v", v)
			}
		})
	}
}

// Finding 3: an abort arriving after its operation finished (committed)
// and was forgotten recorded a tombstone for a committed operation, and
// the register's late answer then crashed the brick.
func TestReview120LateAbortAfterDone(t *testing.T) {
	t0 := time.Unix(1000, 0)
	m, pts := oneGroup(t, nil, 1, 2, 3)
	b3 := br(3)
	c, _ := NewCoordinator(DefaultCoordinatorConfig(0xabc), m)
	x, e, _ := c.Begin(t0, Update{Key: 7, Value: []byte("x")})
	drive(c, pts, t0, e, nil) // committed everywhere, finished
	_, e, _ = c.Begin(t0, Update{Key: 8, Value: []byte("y")})
	drive(c, pts, t0, e, nil) // Done=2 reaches every brick: x forgotten
	if pts[b3].StateOf(x) != Absent {
		t.Fatalf("x not forgotten: %v", pts[b3].StateOf(x))
	}
	a, _ := pts[b3].Decide(t0, Decide{Op: x, Partition: Root, Commit: false, Done: 1})
	if a.State == Aborted || pts[b3].StateOf(x) == Aborted {
		t.Fatalf("a late abort of a finished operation was recorded: ack %v, state %v", a.State, pts[b3].StateOf(x))
	}
	if st := pts[b3].Query(t0, Query{Op: x}); st != Aborted || pts[b3].StateOf(x) != Absent {
		t.Fatalf("query about a finished operation: %v, recorded %v", st, pts[b3].StateOf(x))
	}
	pts[b3].Outcome(t0, x, true) // no record: nothing, no panic
}

// Finding 5: a commit answered "absent" (committed, then swept while the
// library stalled) was never counted: the operation stayed in flight.
func TestReview120SweptCommitCounts(t *testing.T) {
	t0 := time.Unix(1000, 0)
	m, pts := oneGroup(t, nil, 1, 2)
	c, _ := NewCoordinator(DefaultCoordinatorConfig(0xabc), m)
	x, e, _ := c.Begin(t0, Update{Key: 7, Value: []byte("x")})
	var decides []Send
	for _, s := range e.Sends {
		decides = append(decides, c.OnVote(t0, s.To, x, pts[s.To].Prepare(t0, *s.Prepare)).Sends...)
	}
	for _, s := range decides {
		pts[s.To].Decide(t0, *s.Decide) // applied; the acks are lost
	}
	// Ten minutes of brick ticks: the records are swept.
	for i := range 700 {
		now := t0.Add(time.Duration(i) * time.Second)
		for _, b := range []BrickID{br(1), br(2)} {
			for _, q := range pts[b].Tick(now).Queries {
				pts[b].Answer(now, q.To, q.Query, pts[q.To].Query(now, q.Query))
			}
		}
	}
	if pts[br(1)].StateOf(x) != Absent {
		t.Fatal("not swept")
	}
	now := t0.Add(701 * time.Second)
	res := drive(c, pts, now, c.Tick(now), nil)
	if c.InFlight() != 0 || len(res) != 1 || res[0].Outcome != Succeeded {
		t.Fatalf("results %v, %d in flight", res, c.InFlight())
	}
}

// Finding 6: a library reusing a session id had its new write taken for a
// duplicate of the old one: reported Succeeded, applied nowhere.
func TestReview120ReusedSessionRefused(t *testing.T) {
	t0 := time.Unix(1000, 0)
	m, pts := oneGroup(t, nil, 1, 2)
	for i, v := range []string{"old", "new"} {
		c, _ := NewCoordinator(DefaultCoordinatorConfig(0x5e55), m)
		_, e, _ := c.Begin(t0, Update{Key: 7, Value: []byte(v)})
		res := drive(c, pts, t0, e, nil)
		want := Succeeded
		if i == 1 {
			want = Failed
		}
		if len(res) != 1 || res[0].Outcome != want {
			t.Fatalf("%s: %v, want %v", v, res, want)
		}
	}
}

// Finding 4 (the coordinator's part): an operation whose partition was
// split away while its decision was in flight was reported Succeeded at
// the deadline with no participant left to apply it. Splits now drain
// the partition first (reshape.go: every member settled under a lease),
// so a decided commit is applied at every member before the split: since
// review 123, an operation committed and split away is Succeeded, and one
// undecided (here: aborted, its decision lost) ends Unknown.
func TestReview120RetiredPartitionUnknown(t *testing.T) {
	t0 := time.Unix(1000, 0)
	m, pts := oneGroup(t, nil, 1, 2)
	c, _ := NewCoordinator(DefaultCoordinatorConfig(0xabc), m)
	x, e, _ := c.Begin(t0, Update{Key: 7, Value: []byte("x")})
	for _, s := range e.Sends {
		if s.To == br(1) { // brick 2's vote is lost: abort at the vote timeout; decisions lost
			c.OnVote(t0, s.To, x, pts[s.To].Prepare(t0, *s.Prepare))
		}
	}
	c.Tick(t0.Add(time.Second))
	m2 := m.Clone()
	m2.Epoch = 2
	if err := m2.DP.Split(Root); err != nil {
		t.Fatal(err)
	}
	z, o, _ := Root.Children()
	m2.RG = map[Partition][]BrickID{z: {br(1), br(2)}, o: {br(1), br(2)}}
	res := c.SetMaps(t0, m2).Results
	for i := range 30 {
		res = append(res, c.Tick(t0.Add(time.Duration(i)*time.Second)).Results...)
	}
	if len(res) != 1 || res[0].Outcome != Unknown || c.InFlight() != 0 {
		t.Fatalf("results %v, %d in flight", res, c.InFlight())
	}
}
