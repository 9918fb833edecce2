package lock

import (
	"errors"
	"testing"
	"time"
)

// review9Rig wires a real clerk-side Engine (node 3: clerk C of kind "wal")
// to a master core by hand, so that a test decides which message is lost.
type review9Rig struct {
	t    *testing.T
	now  time.Time
	e    *Engine
	m    *Master
	id   ClerkID
	sess uint64
	hint uint64
}

func (r *review9Rig) env() Env {
	r.now = r.now.Add(10 * time.Second) // past any dial backoff
	return Env{Now: r.now, Alive: true}
}

// eng carries out an engine's effects: it notes a dial's session and sends
// the clerk's messages to the master (Hello included); it returns the
// master's messages for the clerk and the engine's other effects.
func (r *review9Rig) eng(out []any) (toClerk []any, fx []any) {
	for _, o := range out {
		switch x := o.(type) {
		case Dial:
			r.sess = x.Session
		case SessionSend:
			if x.Session != r.sess {
				r.t.Fatalf("a send on session %d, the current one is %d", x.Session, r.sess)
			}
			if h, ok := x.Msg.(Hello); ok {
				toClerk = append(toClerk, sends(r.m.Hello(h), r.id)...)
			} else {
				toClerk = append(toClerk, sends(r.m.Handle(r.id, x.Msg), r.id)...)
			}
		default:
			fx = append(fx, o)
		}
	}
	return toClerk, fx
}

// deliver gives the master's messages to the clerk on its session.
func (r *review9Rig) deliver(msgs []any) (fx []any) {
	for _, msg := range msgs {
		more, f := r.eng(r.e.SessionRecv(r.env(), r.sess, msg))
		fx = append(fx, f...)
		fx = append(fx, r.deliver(more)...)
	}
	return fx
}

// pump: engine effects through the master and back, to a fixpoint.
func (r *review9Rig) pump(out []any) (fx []any) {
	msgs, f := r.eng(out)
	return append(f, r.deliver(msgs)...)
}

func (r *review9Rig) namespace(epoch Epoch) []any {
	r.hint++
	return r.e.LockNamespace(r.env(), &State{Version: r.hint, Master: &MasterRecord{Node: 9, Inc: 1, Epoch: epoch, Addr: "m"},
		Clerks: []ClerkInfo{{ID: cA, Kind: "wal"}, {ID: cB}, {ID: r.id, Kind: "wal"}}})
}

func newReview9Rig(t *testing.T, m *Master) *review9Rig {
	r := &review9Rig{t: t, now: time.Unix(1000, 0), m: m}
	r.e = NewEngine(EngineConfig{Node: 3, Inc: 1, Addr: "c"})
	id, out, err := r.e.NewClerk(r.env(), "wal")
	if err != nil || id != cC {
		t.Fatalf("clerk %v: %v", id, err)
	}
	r.id = id
	for _, o := range out {
		if u, ok := o.(Update); ok {
			r.pump(r.e.Updated(r.env(), u.ID, 1, nil))
		}
	}
	r.hint = 1
	return r
}

// review9Run: master 1 knows clerks A and C (kind "wal") and B; A holds
// "x", B waits for it, A is declared dead, and the rig's clerk C is asked
// to run A's recovery (its StartRecovery).
func review9Run(t *testing.T) (*review9Rig, *Master, StartRecovery) {
	t.Helper()
	m := NewMaster(1, []ClerkInfo{{ID: cA, Kind: "wal"}, {ID: cB}, {ID: cC, Kind: "wal"}}, nil)
	r := newReview9Rig(t, m)
	hello(m, cA, "wal", nil)
	hello(m, cB, "", nil)
	r.pump(r.namespace(1))
	m.Handle(cA, Acquire{"x", Exclusive})
	m.Handle(cB, Acquire{"x", Exclusive})
	m.Verdict(cA, true)
	return r, m, review9Find[StartRecovery](t, r.deliver(sends(m.Persisted(cA), cC)), "StartRecovery")
}

func review9Find[T any](t *testing.T, fx []any, what string) T {
	t.Helper()
	v, ok := find[T](fx)
	if !ok {
		t.Fatalf("no %s in %#v", what, fx)
	}
	return v
}

func review9Hello(t *testing.T, r *review9Rig, out []any) Hello {
	t.Helper()
	for _, o := range out {
		if s, ok := o.(SessionSend); ok {
			if h, ok := s.Msg.(Hello); ok {
				return h
			}
		}
	}
	t.Fatalf("no Hello in %#v", out)
	return Hello{}
}

// Review 9, question 2: the master renews a run's token and the session
// breaks before the clerk hears of it. The clerk's engine keeps the
// renewal (since 2026-11-27: a session break no longer costs the whole
// run); its next Hello reports the token it had, the master takes that
// back, and the renewal, sent again on the welcomed session, gets a token
// above the lost one; the lost answer, should it still reach the clerk,
// is ignored; a renewal under the lost token is refused; the run's end
// under its renewed token completes the recovery; the dead clerk's name is
// granted above everything.
func TestReview9RenewalAnswerLostWithSession(t *testing.T) {
	m := NewMaster(1, []ClerkInfo{{ID: cA, Kind: "wal"}, {ID: cB}, {ID: cC, Kind: "wal"}}, nil)
	r := newReview9Rig(t, m)
	hello(m, cA, "wal", nil)
	hello(m, cB, "", nil)
	r.pump(r.namespace(1)) // C dials, says Hello, is welcomed
	m.Handle(cA, Acquire{"x", Exclusive})
	m.Handle(cB, Acquire{"x", Exclusive})
	m.Verdict(cA, true)
	fx := r.deliver(sends(m.Persisted(cA), cC))
	st := review9Find[StartRecovery](t, fx, "StartRecovery")
	t1 := st.Req.Token

	// The renewal reaches the master; its answer is lost with the session.
	out := r.e.RenewRun(r.env(), st.Run)
	var lost []any
	for _, o := range out {
		if s, ok := o.(SessionSend); ok {
			lost = append(lost, sends(m.Handle(cC, s.Msg), cC)...)
		}
	}
	t2 := review9Find[RecoveryRenewed](t, lost, "RecoveryRenewed").Token
	if !t1.Less(t2) {
		t.Fatalf("renewed %v to %v", t1, t2)
	}
	m.Disconnected(cC)
	fx = r.e.SessionClosed(r.env(), r.sess)
	if x, ok := find[RecoveryRenewal](fx); ok {
		t.Fatalf("the renewal failed with its session (it waits for the next): %+v", x)
	}
	// Asked again meanwhile: one is out already.
	if x := review9Find[RecoveryRenewal](t, r.e.RenewRun(r.env(), st.Run), "a second renewal"); !errors.Is(x.Err, ErrRenewRefused) {
		t.Fatalf("a second renewal while one waits: %+v", x)
	}
	out = r.e.Tick(r.env())
	if h := review9Hello(t, r, out); h.Recovering[cA] != t1 {
		t.Fatalf("the next Hello reports %v, the clerk has %v", h.Recovering[cA], t1)
	}
	// Welcomed: the renewal goes out again under t1 and is answered.
	t3 := review9Find[RecoveryRenewal](t, r.pump(out), "the renewal sent again")
	if t3.Err != nil || !t2.Less(t3.Token) {
		t.Fatalf("the renewal sent again: %+v (the lost one was %v)", t3, t2)
	}
	// The lost answer turns up on the new session: ignored.
	if fx := r.deliver(lost); len(fx) != 0 {
		if _, ok := find[RecoveryRenewal](fx); ok {
			t.Fatalf("the lost answer was taken on the next session: %#v", fx)
		}
	}
	// Renewing under the lost token is refused by the master.
	if y := review9Find[RecoveryRenewed](t, sends(m.Handle(cC, RenewRecovery{cA, t2}), cC), "RecoveryRenewed"); !y.Token.IsZero() {
		t.Fatalf("a renewal under the token the master took back: %+v", y)
	}
	// The run succeeds under t3; its end completes the recovery.
	out = r.e.RecoveryFinished(r.env(), st.Run, nil)
	var done RecoveryDone
	for _, o := range out {
		if s, ok := o.(SessionSend); ok {
			done, _ = s.Msg.(RecoveryDone)
		}
	}
	if !done.OK || done.Token != t3.Token {
		t.Fatalf("the run's end: %+v (renewed to %v)", done, t3.Token)
	}
	r.eng(out)
	if got := m.Recoveries(); len(got) != 1 {
		t.Fatalf("recoveries %v", got)
	}
	g, ok := find[Grant](sends(m.Forgotten(cA), cB))
	if !ok || !t3.Token.Less(g.Token) {
		t.Fatalf("B granted %+v, the run's last token %v", g, t3.Token)
	}
}

// A renewal waiting for the next session fails if that session is a newer
// master's (the run is cancelled: a new epoch runs the recovery again).
func TestRenewalWaitingFailsAtFailover(t *testing.T) {
	r, m, st := review9Run(t)
	out := r.e.RenewRun(r.env(), st.Run)
	if _, ok := find[SessionSend](out); !ok {
		t.Fatalf("the renewal was not sent: %#v", out)
	}
	m.Disconnected(cC)
	if fx := r.e.SessionClosed(r.env(), r.sess); len(fx) > 0 {
		if x, ok := find[RecoveryRenewal](fx); ok {
			t.Fatalf("failed with its session: %+v", x)
		}
	}
	// Master 2 (epoch 2) takes over, with A's record.
	r.m = NewMaster(2, []ClerkInfo{{ID: cA, Kind: "wal"}, {ID: cB}, {ID: cC, Kind: "wal"}}, m.Recoveries())
	fx := r.pump(r.namespace(2))
	x := review9Find[RecoveryRenewal](t, fx, "the waiting renewal's end")
	if !errors.Is(x.Err, ErrRenewRefused) {
		t.Fatalf("the waiting renewal at a newer master's session: %+v", x)
	}
	if _, ok := find[CancelRecovery](fx); !ok {
		t.Fatalf("the older epoch's run was not cancelled: %#v", fx)
	}
}

// Review 9: the run ends (here: its renewal's waiter gave up and it returned
// anyway) while a renewal the master granted is still on its way. The end
// carries the engine's token, which the master no longer holds, and (since
// review 18) says not OK, a renewal being out: the recovery is not
// completed, and it runs again above the renewed token.
func TestReview9RunEndsWhileRenewalOut(t *testing.T) {
	r, m, st := review9Run(t)
	var answer []any
	for _, o := range r.e.RenewRun(r.env(), st.Run) {
		if s, ok := o.(SessionSend); ok {
			answer = sends(m.Handle(cC, s.Msg), cC)
		}
	}
	t2 := review9Find[RecoveryRenewed](t, answer, "RecoveryRenewed").Token
	out := r.e.RecoveryFinished(r.env(), st.Run, nil) // the function says OK
	if x, ok := find[RecoveryRenewal](out); !ok || !errors.Is(x.Err, ErrRenewRefused) {
		t.Fatalf("the renewal's waiter is not answered as the run ends: %#v", out)
	}
	var mout []any
	for _, o := range out {
		if s, ok := o.(SessionSend); ok {
			if d, _ := s.Msg.(RecoveryDone); d.Token != st.Req.Token || d.OK {
				t.Fatalf("the run's end: %+v", d)
			}
			mout = m.Handle(cC, s.Msg)
		}
	}
	if _, ok := find[Forget](mout); ok {
		t.Fatal("a run's end under a token the master had renewed completed the recovery")
	}
	if fx := r.deliver(answer); len(fx) != 0 {
		if _, ok := find[RecoveryRenewal](fx); ok {
			t.Fatalf("the answer for a finished run was taken: %#v", fx)
		}
	}
	st2, ok := find[StartRecovery](r.deliver(sends(mout, cC)))
	if !ok {
		m.Tick()
		st2 = review9Find[StartRecovery](t, r.deliver(sends(m.Pending(), cC)), "the second run")
	}
	if !t2.Less(st2.Req.Token) {
		t.Fatalf("the second run's token %v is not above %v", st2.Req.Token, t2)
	}
}

// Review 9: a master failover while a run holds a renewed token. The clerk's
// Hello carries the renewed old-epoch token, which the new master adopts;
// the engine cancels the old epoch's run, so its renewal fails at once and
// its end is reported not OK; the new master runs the recovery again under
// its own epoch (renewable), and grants the name above that run's last token.
func TestReview9RenewAcrossFailover(t *testing.T) {
	m1 := NewMaster(1, []ClerkInfo{{ID: cA, Kind: "wal"}, {ID: cB}, {ID: cC, Kind: "wal"}}, nil)
	r := newReview9Rig(t, m1)
	hello(m1, cA, "wal", nil)
	hello(m1, cB, "", nil)
	r.pump(r.namespace(1))
	m1.Handle(cA, Acquire{"x", Exclusive})
	m1.Verdict(cA, true)
	st := review9Find[StartRecovery](t, r.deliver(sends(m1.Persisted(cA), cC)), "StartRecovery")
	rn := review9Find[RecoveryRenewal](t, r.pump(r.e.RenewRun(r.env(), st.Run)), "renewal")
	if rn.Err != nil {
		t.Fatal(rn.Err)
	}
	// Epoch 2 takes over with the persisted record.
	recs := m1.Recoveries()
	m2 := NewMaster(2, []ClerkInfo{{ID: cA, Kind: "wal"}, {ID: cB}, {ID: cC, Kind: "wal"}}, recs)
	r.m = m2
	m2.Verdict(cA, true)
	hello(m2, cB, "", nil)
	r.pump(r.namespace(2))   // hangs up on epoch 1
	out := r.e.Tick(r.env()) // dials epoch 2
	if h := review9Hello(t, r, out); h.Recovering[cA] != rn.Token {
		t.Fatalf("Hello reports %v, the run has %v", h.Recovering[cA], rn.Token)
	}
	fx := r.pump(out)
	if _, ok := find[CancelRecovery](fx); !ok {
		t.Fatalf("the old epoch's run was not cancelled: %#v", fx)
	}
	if x := review9Find[RecoveryRenewal](t, r.pump(r.e.RenewRun(r.env(), st.Run)), "renewal after failover"); x.Err == nil {
		t.Fatalf("an old epoch's run renewed under the new master: %+v", x)
	}
	// Even sent by hand, the master refuses to renew an adopted old-epoch token.
	if y := review9Find[RecoveryRenewed](t, sends(m2.Handle(cC, RenewRecovery{cA, rn.Token}), cC), "RecoveryRenewed"); !y.Token.IsZero() {
		t.Fatalf("the new master renewed an old epoch's token: %+v", y)
	}
	out = r.e.RecoveryFinished(r.env(), st.Run, nil)
	for _, o := range out {
		if s, ok := o.(SessionSend); ok {
			if d, _ := s.Msg.(RecoveryDone); d.OK {
				t.Fatalf("a cancelled old-epoch run reported OK: %+v", d)
			}
		}
	}
	fx = r.pump(out)
	st2, ok := find[StartRecovery](fx)
	if !ok {
		m2.Tick()
		st2 = review9Find[StartRecovery](t, r.deliver(sends(m2.Pending(), cC)), "the new epoch's run")
	}
	if st2.Req.Token.Epoch != 2 {
		t.Fatalf("new run under %v", st2.Req.Token)
	}
	x := review9Find[RecoveryRenewal](t, r.pump(r.e.RenewRun(r.env(), st2.Run)), "renewal in epoch 2")
	if x.Err != nil || !st2.Req.Token.Less(x.Token) {
		t.Fatalf("renewal in epoch 2: %+v", x)
	}
	r.pump(r.e.RecoveryFinished(r.env(), st2.Run, nil))
	m2.Handle(cB, Acquire{"x", Exclusive})
	g, ok := find[Grant](sends(m2.Forgotten(cA), cB))
	if !ok || !x.Token.Less(g.Token) {
		t.Fatalf("B granted %+v, the run's last token %v", g, x.Token)
	}
}

// Review 9's findings 1 and 2: a pending renewal fails when its run is
// cancelled (here: the node fences itself), not only when the function's
// context ends; and a run whose renewal failed — refused, or abandoned by
// its waiter before a late answer — ends as a failure whatever the
// recovery function returns.
func TestRenewalFailureFailsTheRun(t *testing.T) {
	setup := func(t *testing.T) (*review9Rig, *Master, StartRecovery) {
		m := NewMaster(1, []ClerkInfo{{ID: cA, Kind: "wal"}, {ID: cB}, {ID: cC, Kind: "wal"}}, nil)
		r := newReview9Rig(t, m)
		hello(m, cA, "wal", nil)
		hello(m, cB, "", nil)
		r.pump(r.namespace(1))
		m.Handle(cA, Acquire{"x", Exclusive})
		m.Verdict(cA, true)
		return r, m, review9Find[StartRecovery](t, r.deliver(sends(m.Persisted(cA), cC)), "StartRecovery")
	}
	// renew sends a renewal and returns the master's answer, undelivered.
	renew := func(r *review9Rig, m *Master, run uint64) []any {
		var answer []any
		for _, o := range r.e.RenewRun(r.env(), run) {
			if s, ok := o.(SessionSend); ok {
				answer = sends(m.Handle(cC, s.Msg), cC)
			}
		}
		return answer
	}
	ended := func(t *testing.T, r *review9Rig, run uint64) RecoveryDone {
		t.Helper()
		for _, o := range r.e.RecoveryFinished(r.env(), run, nil) {
			if s, ok := o.(SessionSend); ok {
				if d, ok := s.Msg.(RecoveryDone); ok {
					return d
				}
			}
		}
		t.Fatal("no RecoveryDone")
		return RecoveryDone{}
	}
	t.Run("cancelled", func(t *testing.T) {
		r, m, st := setup(t)
		renew(r, m, st.Run)
		x := review9Find[RecoveryRenewal](t, r.e.Fence(r.env(), ErrFenced), "a failed renewal at the fence")
		if x.Run != st.Run || !errors.Is(x.Err, ErrRenewRefused) {
			t.Fatalf("%+v", x)
		}
	})
	t.Run("refused", func(t *testing.T) {
		r, m, st := setup(t)
		answer := renew(r, m, st.Run)
		x := review9Find[RecoveryRenewed](t, answer, "RecoveryRenewed")
		x.Token = Token{} // as if the master had refused
		if f := review9Find[RecoveryRenewal](t, r.deliver([]any{x}), "the refusal"); f.Err == nil {
			t.Fatalf("a refused renewal succeeded: %+v", f)
		}
		if d := ended(t, r, st.Run); d.OK {
			t.Fatalf("a run whose renewal was refused ended OK: %+v", d)
		}
	})
	t.Run("abandoned", func(t *testing.T) {
		r, m, st := setup(t)
		answer := renew(r, m, st.Run)
		r.e.AbandonRenewal(st.Run)
		if fx := r.deliver(answer); len(fx) > 0 {
			if _, ok := find[RecoveryRenewal](fx); ok {
				t.Fatalf("a late answer to an abandoned renewal was taken: %#v", fx)
			}
		}
		if d := ended(t, r, st.Run); d.OK || d.Token != st.Req.Token {
			t.Fatalf("a run that abandoned its renewal ended %+v", d)
		}
	})
}
