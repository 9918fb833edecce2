package ddstable

import (
	"testing"
	"time"
)

// A split decree retires a partition while an operation is prepared there
// and its commit is decided: the participants are dropped (SetMaps false)
// with the Prepared record; the coordinator reports Succeeded at the
// deadline, and drives the operation forever (members() keeps the whole
// group of a retired partition), pinning its session's Done.
func TestReview120SplitRetires(t *testing.T) {
	t0 := time.Unix(1000, 0)
	m, pts := r120setup(t, 1, 2, 3)
	c, _ := NewCoordinator(DefaultCoordinatorConfig(0xabc), m)
	x, e, _ := c.Begin(t0, Update{Key: 7, Value: []byte("x")})
	var decides []Send
	for _, s := range e.Sends {
		ce := c.OnVote(t0, s.To, x, pts[s.To].Prepare(t0, *s.Prepare))
		decides = append(decides, ce.Sends...)
	}
	// The split decree reaches every brick before the commit does.
	m2 := m.Clone()
	m2.Epoch = 2
	if err := m2.DP.Split(Root); err != nil {
		t.Fatal(err)
	}
	delete(m2.RG, Root)
	z, o, _ := Root.Children()
	m2.RG[z], m2.RG[o] = m.RG[Root], m.RG[Root]
	for b, pt := range pts {
		if pt.InDoubt() != 1 {
			t.Fatalf("not prepared at %v", b)
		}
		if _, member := pt.SetMaps(t0, m2); !member {
			delete(pts, b) // the runtime stops serving the partition; the Prepared record goes with it
		}
	}
	c.SetMaps(t0, m2)
	t.Logf("%d decides to participants that are gone", len(decides))
	var res []Result
	for i := 1; i <= 600; i++ {
		res = append(res, c.Tick(t0.Add(time.Duration(i)*100*time.Millisecond)).Results...)
	}
	t.Logf("after 60 s: results %+v, in flight %d, Done %d", res, c.InFlight(), c.Done())
	if len(res) == 1 && res[0].Outcome == Succeeded {
		t.Errorf("Succeeded for an update no participant applied")
	}
	if c.InFlight() != 0 {
		t.Errorf("liveness: the operation is driven forever; Done stays %d", c.Done())
	}
}
