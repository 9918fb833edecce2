package lock

import (
	"errors"
	"testing"
)

// Outside review 13 of b5c1f24 (Master.overlapping, recovery.unsettled),
// with its fix: an "all" record is marked Started, durably, before its
// first run, and a new master takes a Started record for unsettled.
//
// Before the fix, "unsettled" lived only in the master's memory. A new master learns of an
// older master's runs only from the Hellos of live clerks, and a Hello lists
// only runs still going: a run that ended while its clerk had no session
// (RecoveryFinished drops the end when sess == 0), or whose clerk is
// declared dead before it says Hello, leaves no trace. The new master then
// takes the recovery for settled and may run an overlapping "all"
// recovery first, while the failed run's writes may still land under its
// dead clerk's fence name, which the other run's writes do not fence out:
// the lost-update of TestEndToEndTreeKillAll again.

// setupTwoAll: epoch 1 with an "all" record for D (node 4) and clerk A
// (node 1, wal) that never reports and is declared dead before the master
// serves (so its record is "all" too). The master runs D's recovery at C
// (the rig's engine); A's waits for it (overlapping).
func setupTwoAll(t *testing.T) (*review9Rig, *Master, StartRecovery, []ClerkInfo) {
	t.Helper()
	clerks := []ClerkInfo{{ID: cA, Kind: "wal"}, {ID: cB}, {ID: cC, Kind: "wal"}}
	recD := RecoveryRecord{Dead: cD, Kind: "wal", All: true}
	m1 := NewMaster(1, clerks, []RecoveryRecord{recD})
	r := newReview9Rig(t, m1)
	hello(m1, cB, "", nil)
	r.pump(r.namespace(1)) // C says Hello; A has not: not serving yet
	out := persistAll(m1, m1.Verdict(cA, true))
	if p, ok := find[Persist](out); !ok || !p.Record.All {
		t.Fatalf("A's record is not \"all\": %v", out)
	}
	st := review9Find[StartRecovery](t, r.deliver(sends(out, cC)), "D's run")
	if st.Req.Dead != cD || !st.Req.All {
		t.Fatalf("first run %+v", st.Req)
	}
	if _, ok := find[Recover](m1.Persisted(cA)); ok {
		t.Fatal("A's \"all\" run started while D's runs")
	}
	return r, m1, st, clerks
}

// Control: without a failover the master does what the fix says: D's run
// ended unreported (its clerk comes back without it), D is unsettled, and D
// runs again before A.
func TestReviewOverlapUnreportedEndSameMaster(t *testing.T) {
	r, m1, st, _ := setupTwoAll(t)
	m1.Disconnected(cC)
	r.e.SessionClosed(r.env(), r.sess)
	// A write of the run had its answer lost: the run renews, which fails
	// without a session, and the run fails with that write maybe in flight.
	if x := review9Find[RecoveryRenewal](t, r.e.RenewRun(r.env(), st.Run), "renewal"); x.Err == nil {
		t.Fatal("renewed without a session")
	}
	if out := r.e.RecoveryFinished(r.env(), st.Run, errors.New("write outcome unknown; renewal refused")); len(out) != 0 {
		t.Fatalf("the end was reported without a session: %#v", out)
	}
	fx := r.pump(r.e.Tick(r.env())) // C says Hello to epoch 1 again, without D's run
	if s, ok := find[StartRecovery](fx); !ok || s.Req.Dead != cD {
		t.Fatalf("epoch 1 after D's run ended unreported: want D's run again first, got %+v (ok=%v)", s.Req, ok)
	}
}

// The defect: the same history, but epoch 1 dies when C's session breaks
// and epoch 2 takes over with the records. C's Hello to epoch 2 lists no
// run; epoch 2 runs A's "all" recovery first while D's failed run's write
// may still land under D's fence name.
func TestReviewOverlapUnsettledLostAcrossFailover(t *testing.T) {
	r, m1, st, clerks := setupTwoAll(t)
	r.e.SessionClosed(r.env(), r.sess) // epoch 1's master dies
	if x := review9Find[RecoveryRenewal](t, r.e.RenewRun(r.env(), st.Run), "renewal"); x.Err == nil {
		t.Fatal("renewed without a session")
	}
	if out := r.e.RecoveryFinished(r.env(), st.Run, errors.New("write outcome unknown; renewal refused")); len(out) != 0 {
		t.Fatalf("the end was reported without a session: %#v", out)
	}
	m2 := NewMaster(2, clerks, m1.Recoveries())
	r.m = m2
	hello(m2, cB, "", nil)
	out := r.namespace(2) // C dials epoch 2 (its session is already down)
	if _, ok := find[SessionSend](out); !ok {
		r.pump(out)
		out = r.e.Tick(r.env())
	}
	if h := review9Hello(t, r, out); len(h.Recovering) != 0 {
		t.Fatalf("Hello lists runs %v", h.Recovering)
	}
	fx := r.pump(out)
	s, ok := find[StartRecovery](fx)
	if !ok {
		m2.Tick()
		s, ok = find[StartRecovery](r.deliver(sends(m2.Pending(), cC)))
	}
	if !ok {
		t.Fatal("epoch 2 runs nothing")
	}
	if s.Req.Dead != cD {
		t.Fatalf("epoch 2 started %s's \"all\" recovery (token %v) while %s's run of epoch 1 ended without success, unreported: "+
			"its write may still land under %s's fence name, which this run's writes do not fence out (epoch 1 would have run %s first)",
			s.Req.Dead, s.Req.Token, cD, cD, cD)
	}
}

// The same loss through a verdict: the clerk running epoch 1's run of D is
// declared dead by epoch 2 before its Hello. Epoch 1 would have marked D
// unsettled (Verdict); epoch 2 never knew the run existed.
func TestReviewOverlapRunnerDiesBeforeHello(t *testing.T) {
	clerks := []ClerkInfo{{ID: cB, Kind: "wal"}, {ID: cC, Kind: "wal"}}
	recA := RecoveryRecord{Dead: cA, Kind: "wal", All: true}
	recD := RecoveryRecord{Dead: cD, Kind: "wal", All: true}

	// Control: a master that knows C runs D's recovery, and hears that C
	// died: D is unsettled and runs first.
	ctl := NewMaster(1, clerks, []RecoveryRecord{recD, recA})
	ctl.Hello(Hello{Clerk: cB, Kind: "wal", Epoch: 1})
	hout := ctl.Hello(Hello{Clerk: cC, Kind: "wal", Epoch: 1, Recovering: map[ClerkID]Token{cD: {1, 1}}}) // C runs D's (its mark goes in)
	out := append(hout, ctl.Verdict(cC, true)...)
	out = persistAll(ctl, append(out, ctl.Persisted(cC)...))
	if r, ok := find[Recover](sends(out, cB)); !ok || r.Dead != cD {
		t.Fatalf("control: after the runner's death epoch 1 runs %+v (ok=%v), want D", r, ok)
	}

	// Epoch 2: C never says Hello; it is declared dead (its node fenced,
	// a write of its run maybe still in flight). Epoch 1 recorded D's
	// Started mark before it sent the run.
	recD.Started = true
	m2 := NewMaster(2, clerks, []RecoveryRecord{recD, recA})
	m2.Hello(Hello{Clerk: cB, Kind: "wal", Epoch: 2})
	out = m2.Verdict(cC, true)
	out = persistAll(m2, append(out, m2.Persisted(cC)...))
	r, ok := find[Recover](sends(out, cB))
	if ok && r.Dead != cD {
		t.Fatalf("epoch 2 started %s's \"all\" recovery while %s's run of epoch 1 (at %s, declared dead before its Hello) may still have writes landing",
			r.Dead, cD, cC)
	}
}

// persistAll answers every Persist among a master's outputs (and those its
// answers bring) as the engine does once the decree commits.
func persistAll(m *Master, out []any) []any {
	all := append([]any(nil), out...)
	for i := 0; i < len(all); i++ {
		if p, ok := all[i].(Persist); ok {
			all = append(all, m.Persisted(p.Record.Dead)...)
		}
	}
	return all
}

// TestStartedMarkBeforeFirstRun: an "all" recovery's first run goes out
// only once its Started mark is persisted; a second "all" recovery of the
// kind waits meanwhile, and the records a new master reads say which one
// may have run.
func TestStartedMarkBeforeFirstRun(t *testing.T) {
	clerks := []ClerkInfo{{ID: cB, Kind: "wal"}}
	m := NewMaster(1, clerks, []RecoveryRecord{{Dead: cA, Kind: "wal", All: true}, {Dead: cD, Kind: "wal", All: true}})
	out := m.Hello(Hello{Clerk: cB, Kind: "wal", Epoch: 1})
	if _, ok := find[Recover](out); ok {
		t.Fatalf("a run went out before its Started mark was persisted: %v", out)
	}
	p, ok := find[Persist](out)
	if !ok || p.Record.Dead != cA || !p.Record.Started {
		t.Fatalf("want A's Started mark persisted first, got %+v (ok=%v)", p, ok)
	}
	for _, r := range m.Recoveries() {
		if r.Dead == cD && r.Started {
			t.Fatal("D marked Started while A's run is about to go")
		}
	}
	out = m.Persisted(cA)
	if r, ok := find[Recover](sends(out, cB)); !ok || r.Dead != cA {
		t.Fatalf("A's run did not go once its mark was in: %v", out)
	}
	if _, ok := find[Persist](out); ok {
		t.Fatalf("D's mark went out while A runs: %v", out)
	}
}
