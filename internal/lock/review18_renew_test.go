package lock

import (
	"errors"
	"testing"
)

// review18Setup: C runs A's recovery under t1 and asks for a renewal; the
// master renews to t2 and the answer is lost with the session; C dials
// again (Hello under t1), the master takes t1 back; the Welcome has not
// reached C yet. Returns the run, t1, t2 and the Welcome still in flight.
func review18Setup(t *testing.T) (r *review9Rig, m *Master, st StartRecovery, welcome, fx []any) {
	r, m, st = review9Run(t)
	for _, o := range r.e.RenewRun(r.env(), st.Run) {
		if s, ok := o.(SessionSend); ok {
			sends(m.Handle(cC, s.Msg), cC) // answered with t2; the answer is lost
		}
	}
	m.Disconnected(cC)
	fx = r.e.SessionClosed(r.env(), r.sess)
	welcome, f := r.eng(r.e.Tick(r.env())) // the new Hello reaches the master
	return r, m, st, welcome, append(fx, f...)
}

// The run's function returns (success) while its renewal waits to be sent
// again, after the new session's Hello and before its Welcome. The end goes
// out as OK under t1, the token the master took back: the master counts the
// recovery done although the run's renewal (asked because a write may land
// late under t1) was never answered, and B is granted A's name. Before the
// change the session break failed the renewal (renewFailed) and the end was
// not OK; on a live session the RenewRecovery precedes the RecoveryDone and
// the token mismatch keeps the recovery from counting.
// The renewal's waiter is never answered either (no RecoveryRenewal).
func TestReview18FinishWhileResendPendingCountsDone(t *testing.T) {
	r, m, st, welcome, fx := review18Setup(t)
	out := r.e.RecoveryFinished(r.env(), st.Run, nil)
	if _, ok := find[RecoveryRenewal](append(fx, out...)); !ok {
		t.Errorf("the waiting renewal got no answer, at the break nor when its run ended (renewRun waits for its ctx)")
	}
	var done RecoveryDone
	for _, o := range out {
		if s, ok := o.(SessionSend); ok {
			done, _ = s.Msg.(RecoveryDone)
		}
	}
	r.eng(out)
	r.deliver(welcome)
	if done.OK {
		t.Errorf("a run that ended with its renewal unanswered was reported OK under %v", done.Token)
	}
	if len(m.Recoveries()) == 0 || func() bool { _, ok := find[Grant](sends(m.Forgotten(cA), cB)); return ok }() {
		t.Errorf("the recovery counted done with a renewal out: B is granted A's name (records %v)", m.Recoveries())
	}
}

// Control: the same on a live session (no break) does not count.
func TestReview18FinishWhileRenewingLiveSessionControl(t *testing.T) {
	r, m, st := review9Run(t)
	out := r.e.RenewRun(r.env(), st.Run)
	out = append(out, r.e.RecoveryFinished(r.env(), st.Run, nil)...)
	r.eng(out) // RenewRecovery then RecoveryDone{OK, t1}: token mismatch
	if _, ok := find[Grant](sends(m.Forgotten(cA), cB)); ok {
		t.Fatalf("counted done on a live session")
	}
}

// AbandonRenewal and CloseClerk while the resend is pending: no resend,
// the end is not OK, the waiter is answered (close).
func TestReview18AbandonAndCloseWhileResendPending(t *testing.T) {
	r, m, st, welcome, _ := review18Setup(t)
	r.e.AbandonRenewal(st.Run)
	fx := r.deliver(welcome)
	_ = fx
	out := r.e.RecoveryFinished(r.env(), st.Run, nil)
	for _, o := range out {
		if s, ok := o.(SessionSend); ok {
			if _, ok := s.Msg.(RenewRecovery); ok {
				t.Fatalf("resent after abandon")
			}
			if d, ok := s.Msg.(RecoveryDone); ok && d.OK {
				t.Fatalf("abandoned run reported OK")
			}
		}
	}
	r.eng(out)
	if _, ok := find[Grant](sends(m.Forgotten(cA), cB)); ok {
		t.Fatalf("counted done")
	}

	r2, _, st2, _, _ := review18Setup(t)
	fx2, err := r2.e.CloseClerk(r2.env(), cC)
	if err != nil {
		t.Fatal(err)
	}
	x := review9Find[RecoveryRenewal](t, fx2, "renewal end at close")
	if !errors.Is(x.Err, ErrRenewRefused) {
		t.Fatalf("%+v", x)
	}
	_ = st2
}

// Fence while the resend is pending: the waiter is answered.
func TestReview18FenceWhileResendPending(t *testing.T) {
	r, _, _, _, _ := review18Setup(t)
	x := review9Find[RecoveryRenewal](t, r.e.Fence(r.env(), ErrFenced), "renewal end at fence")
	if !errors.Is(x.Err, ErrRenewRefused) {
		t.Fatalf("%+v", x)
	}
}

// The resent renewal's answer is lost with a second session: sent again
// under t1 on the third; the end under the newest token completes, and B's
// grant is above it.
func TestReview18SecondBreakWhileResent(t *testing.T) {
	r, m, st, welcome, _ := review18Setup(t)
	toClerk, _ := []any(nil), []any(nil)
	for _, msg := range welcome {
		o := r.e.SessionRecv(r.env(), r.sess, msg)
		for _, e := range o {
			if s, ok := e.(SessionSend); ok {
				if _, ok := s.Msg.(RenewRecovery); ok {
					toClerk = append(toClerk, sends(m.Handle(cC, s.Msg), cC)...) // answered, lost
				}
			}
		}
	}
	lost := review9Find[RecoveryRenewed](t, toClerk, "second answer").Token
	m.Disconnected(cC)
	if x, ok := find[RecoveryRenewal](r.e.SessionClosed(r.env(), r.sess)); ok {
		t.Fatalf("%+v", x)
	}
	out := r.e.Tick(r.env())
	if h := review9Hello(t, r, out); h.Recovering[cA] != st.Req.Token {
		t.Fatalf("Hello reports %v", h.Recovering[cA])
	}
	y := review9Find[RecoveryRenewal](t, r.pump(out), "third renewal")
	if y.Err != nil || !lost.Less(y.Token) {
		t.Fatalf("%+v (lost %v)", y, lost)
	}
	r.eng(r.e.RecoveryFinished(r.env(), st.Run, nil))
	g, ok := find[Grant](sends(m.Forgotten(cA), cB))
	if !ok || !y.Token.Less(g.Token) {
		t.Fatalf("B %+v, run's token %v", g, y.Token)
	}
}
