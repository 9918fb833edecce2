package lock

import "testing"

// A failed run is reassigned at once, with no backoff, to the same
// lowest-id clerk: a clerk whose recovery keeps failing starves the others.
func TestReviewFailedRecoveryAlwaysSameClerk(t *testing.T) {
	m := NewMaster(1, []ClerkInfo{{cA, "wal"}, {cB, "wal"}, {cD, "wal"}}, nil)
	hello(m, cA, "wal", nil)
	hello(m, cB, "wal", nil)
	hello(m, cD, "wal", nil)
	m.Handle(cD, Acquire{"x", Exclusive})
	out := m.Verdict(cD, true)
	for i := 0; i < 5; i++ {
		r, ok := find[Recover](sends(out, cA))
		if !ok {
			t.Fatalf("round %d: not to A: %v", i, out)
		}
		out = m.Handle(cA, RecoveryDone{cD, false, r.Token})
	}
	t.Logf("after 5 failures on A, still: %v (B never tried)", out)
}
