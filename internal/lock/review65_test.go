package lock

import "testing"

// Outside review 65 (of 00a5f3c, "dial and say hello before failing the
// renewal"). The fix's rule: a renewal failure whose run is listed in a
// Hello of the same batch must come after that Hello's Dial, because a
// driver may carry the failure out at once (the simulator ends the run and
// calls RecoveryFinished re-entrantly), and the run's RecoveryDone then
// goes out on c.sess, which the engine has already set to the new session.
//
// review65Drive carries out a batch the way the simulator does: in order,
// a failed renewal of run ends that run at once (nested RecoveryFinished),
// and a send on a session not dialled yet is lost. It reports every lost
// send.
func review65Drive(t *testing.T, r *review9Rig, run uint64, dialled map[uint64]bool, out []any) (lost []any, hello *Hello) {
	t.Helper()
	for _, o := range out {
		switch x := o.(type) {
		case Dial:
			dialled[x.Session] = true
		case SessionSend:
			if !dialled[x.Session] {
				lost = append(lost, x.Msg)
			}
			if h, ok := x.Msg.(Hello); ok {
				hello = &h
			}
		case RecoveryRenewal:
			if x.Run == run && x.Err != nil {
				l, h := review65Drive(t, r, run, dialled, r.e.RecoveryFinished(r.env(), run, x.Err))
				lost = append(lost, l...)
				if h != nil {
					hello = h
				}
			}
		}
	}
	return lost, hello
}

// review65Waiting: C runs A's recovery under t1 and asks for a renewal;
// the answer is lost with the session, so the renewal waits to be sent
// again (resend) on C's next session.
func review65Waiting(t *testing.T) (*review9Rig, StartRecovery, map[uint64]bool) {
	r, m, st := review9Run(t)
	for _, o := range r.e.RenewRun(r.env(), st.Run) {
		if s, ok := o.(SessionSend); ok {
			sends(m.Handle(cC, s.Msg), cC) // answered; the answer is lost
		}
	}
	m.Disconnected(cC)
	dialled := map[uint64]bool{r.sess: true}
	if lost, _ := review65Drive(t, r, st.Run, dialled, r.e.SessionClosed(r.env(), r.sess)); len(lost) > 0 {
		t.Fatalf("setup lost %v", lost)
	}
	return r, st, dialled
}

// Control: the path 00a5f3c fixed. A newer master is found while the
// renewal waits: Dial and Hello come first, the run's end follows on the
// new session.
func TestReview65NewerMasterDialsFirstControl(t *testing.T) {
	r, st, dialled := review65Waiting(t)
	lost, h := review65Drive(t, r, st.Run, dialled, r.namespace(2))
	if h == nil {
		t.Fatal("no Hello to the newer master")
	}
	if len(lost) > 0 {
		t.Errorf("sent before their session's Dial: %#v", lost)
	}
}

// Same class, another caller: CloseClerk cancels the run (r.cancel fails
// the waiting renewal) and then runs step, whose dialAll dials (the
// backoff after the break has passed) with a Hello that still lists the
// run. The failure precedes the Dial in the batch, so a driver that ends
// the run at once sends its RecoveryDone on the session before it is
// dialled, and it is lost, while the master adopts the run from the Hello.
// (Bounded: the closing clerk's Goodbye, sent once the Welcome comes and
// no run is left, unassigns the run at the master; the real Service ends
// runs on another goroutine after the batch, so it is not affected.)
func TestReview65CloseClerkFailsRenewalBeforeDial(t *testing.T) {
	r, st, dialled := review65Waiting(t)
	out, err := r.e.CloseClerk(r.env(), cC)
	if err != nil {
		t.Fatal(err)
	}
	lost, h := review65Drive(t, r, st.Run, dialled, out)
	if h == nil {
		t.Skip("CloseClerk did not dial (the scenario needs the dial in the same batch)")
	}
	if _, listed := h.Recovering[cA]; listed && len(lost) > 0 {
		t.Errorf("the Hello lists A's run (token %v) but the run's end was sent before the session's Dial and lost: %#v",
			h.Recovering[cA], lost)
	}
}
