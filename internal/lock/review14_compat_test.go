package lock

import (
	"testing"
)

// Review 14 of d1c4baf, compatibility: a record an older master wrote has
// no Started mark, though that master may have sent runs of it. When this
// master learns of such a run (a clerk's Hello lists it, or it goes to
// m.others) it adopts the run but does not record the mark; once the run
// ends without success, "its writes may still land" lives only in this
// master's memory again (the defect of review 13) until the recovery's
// next run is assigned (the mark goes out only with a run: with no clerk
// to run it, never). If this master dies in that window, the next one
// runs the other "all" recovery first.
//
// Reachable only in an upgrade (or mixed-version standby) window. Fixed:
// the master records the mark when it learns of such a run
// (Master.markStarted).
func TestReview14AdoptedLegacyRunNotRecorded(t *testing.T) {
	clerks := []ClerkInfo{{ID: cB, Kind: "wal"}, {ID: cC, Kind: "wal"}}
	clerks3 := []ClerkInfo{{ID: cB, Kind: "wal"}} // C's Forget committed
	// Both records as an older version wrote them: no Started field.
	recA := RecoveryRecord{Dead: cA, Kind: "wal", All: true}
	recD := RecoveryRecord{Dead: cD, Kind: "wal", All: true}
	m2 := NewMaster(2, clerks, []RecoveryRecord{recA, recD})
	persisted := map[ClerkID]RecoveryRecord{cA: recA, cD: recD} // the config service
	apply := func(out []any) {
		for _, o := range out {
			if p, ok := o.(Persist); ok {
				persisted[p.Record.Dead] = p.Record // committed, and then the master dies
			}
		}
	}
	apply(m2.Hello(Hello{Clerk: cB, Kind: "wal", Epoch: 2}))
	// C runs D's recovery for the older master (epoch 1): adopted.
	apply(m2.Hello(Hello{Clerk: cC, Kind: "wal", Epoch: 2, Recovering: map[ClerkID]Token{cD: {1, 1}}}))
	// B's session breaks (a network blip), and C is declared dead: its
	// run's last write may still land. Epoch 2 takes D for unsettled, but
	// with no clerk to run it, no run and so no Started mark goes out,
	// however many ticks pass.
	apply(m2.Disconnected(cB))
	apply(m2.Verdict(cC, true))
	for i := 0; i < 3; i++ {
		m2.Tick()
		apply(m2.Pending())
	}
	// Epoch 2 knows D is unsettled (it would run D first) ...
	// ... but it dies now, and epoch 3 reads:
	var recs []RecoveryRecord
	for _, id := range []ClerkID{cA, cD} {
		recs = append(recs, persisted[id])
	}
	t.Logf("records epoch 3 reads: %+v", recs)
	if !persisted[cD].Started {
		m3 := NewMaster(3, clerks3, recs)
		out := persistAll(m3, m3.Hello(Hello{Clerk: cB, Kind: "wal", Epoch: 3}))
		t.Logf("epoch 3: %v", out)
		if r, ok := find[Recover](out); ok && r.Dead != cD {
			t.Fatalf("epoch 2 adopted a legacy run of %s's \"all\" recovery and saw its runner die, but never recorded it Started; "+
				"epoch 3 starts %s's \"all\" recovery while that run's write may still land (records %+v)", cD, r.Dead, recs)
		}
	}
}
