package lock

import "testing"

// Finding A: a run reported in Hello for a dead clerk the new master has no
// recovery entry for yet is silently dropped; when the verdict later creates
// the (All) obligation, it is assigned to another clerk while the old run is
// still in progress.
func TestReviewRunNotAdoptedWhenRecordCreatedLater(t *testing.T) {
	// Epoch 1: D holds x; A is disconnected when D dies, so B gets the run.
	m1 := NewMaster(1, []ClerkInfo{{cA, "wal"}, {cB, "wal"}, {cD, "wal"}}, nil)
	hello(m1, cA, "wal", nil)
	hello(m1, cB, "wal", nil)
	hello(m1, cD, "wal", nil)
	m1.Handle(cD, Acquire{"x", Exclusive})
	m1.Disconnected(cA)
	out := m1.Verdict(cD, true)
	if _, ok := find[Persist](out); !ok {
		t.Fatal("no persist")
	}
	r1, ok := find[Recover](sends(out, cB))
	if !ok {
		t.Fatalf("no recover to B: %v", out)
	}
	t.Logf("M1 emitted Persist and Recover(%v) to B in the same step (before the record is durable)", r1.Token)
	// M1 dies before the Persist commits: M2 reads D in the clerk list, no record.
	m2 := NewMaster(2, []ClerkInfo{{cA, "wal"}, {cB, "wal"}, {cD, "wal"}}, nil)
	hello(m2, cA, "wal", nil)
	// B reports the run it is still doing for M1 (cancelled, not yet returned).
	m2.Hello(Hello{Clerk: cB, Kind: "wal", Epoch: 2, Recovering: map[ClerkID]Token{cD: r1.Token}})
	out = m2.Verdict(cD, true)
	if r2, ok := find[Recover](sends(out, cA)); ok {
		t.Errorf("BUG: M2 assigned D's recovery (%v, all=%v) to A while B still runs M1's run %v", r2.Token, r2.All, r1.Token)
	}
}
