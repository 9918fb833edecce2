package fd

import (
	"errors"
	"testing"
	"time"
)

func testEngine(t *testing.T, self NodeID, observe bool, last Incarnation) *Engine {
	t.Helper()
	cfg := EngineConfig{Config: Config{Interval: DefaultInterval, GracePeriod: DefaultGracePeriod, MaxDrift: DefaultMaxDrift, Observers: []NodeID{1, 2, 3}},
		Self: self, Observe: observe, Keys: Keyring{Sign: testKey}}
	e, err := NewEngine(cfg, simNow(), last, nil)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func only[T any](t *testing.T, out []any) T {
	t.Helper()
	for _, o := range out {
		if x, ok := o.(T); ok {
			return x
		}
	}
	var zero T
	t.Fatalf("no %T in %#v", zero, out)
	return zero
}

func none[T any](t *testing.T, out []any) {
	t.Helper()
	for _, o := range out {
		if _, ok := o.(T); ok {
			t.Fatalf("unexpected %T in %#v", o, out)
		}
	}
}

// A node whose data directory was lost (no local incarnation) takes an
// incarnation above the one the config service has registered, so that no
// incarnation or clerk id of an earlier life is reused.
func TestEngineIncarnationAboveRegistered(t *testing.T) {
	now := simNow()
	e := testEngine(t, 2, false, 0)
	only[ReadRegistered](t, e.Start(now))
	p := only[PersistIncarnation](t, e.RegisteredRead(now, 7, nil))
	if p.Inc != 8 {
		t.Fatalf("wiped node takes incarnation %d, want 8", p.Inc)
	}
	// And a local file ahead of the config service (registration lost in
	// flight) wins.
	e = testEngine(t, 2, false, 12)
	e.Start(now)
	if p := only[PersistIncarnation](t, e.RegisteredRead(now, 7, nil)); p.Inc != 13 {
		t.Fatalf("incarnation %d, want 13", p.Inc)
	}
}

// Without a durable incarnation the node stays down (retrying with backoff);
// a registration refused because the incarnation is taken starts over from
// the registered one; only a registered incarnation beacons.
func TestEngineIncarnationSteps(t *testing.T) {
	now := simNow()
	e := testEngine(t, 2, false, 3)
	e.Start(now)
	only[PersistIncarnation](t, e.RegisteredRead(now, 3, nil))
	if out := e.IncarnationPersisted(now, 4, errors.New("ENOSPC")); len(out) != 0 {
		t.Fatalf("after a failed persist: %v", out)
	}
	if out := e.Tick(now.Add(minRetry / 2)); len(out) != 0 {
		t.Fatalf("retried before the backoff: %v", out)
	}
	now = now.Add(minRetry)
	only[PersistIncarnation](t, e.Tick(now))
	only[Register](t, e.IncarnationPersisted(now, 4, nil))
	if _, ph := e.Incarnation(now); ph != Fenced || e.Alive(now) {
		t.Fatal("unregistered incarnation runs")
	}
	only[ReadRegistered](t, e.RegisterDone(now, 4, ErrIncarnationTaken))
	p := only[PersistIncarnation](t, e.RegisteredRead(now, 9, nil))
	if p.Inc != 10 {
		t.Fatalf("after a taken registration: %d, want 10", p.Inc)
	}
	only[Register](t, e.IncarnationPersisted(now, 10, nil))
	out := e.RegisterDone(now, 10, nil)
	if s := only[Started](t, out); s.Inc != 10 {
		t.Fatalf("started %d", s.Inc)
	}
	only[Send](t, out) // beacons at once
	// The deadline passes without echoes: fence, then a new incarnation.
	out = e.Tick(now.Add(2 * DefaultGracePeriod))
	if f := only[SelfFence](t, out); f.Inc != 10 {
		t.Fatalf("fenced %d", f.Inc)
	}
	only[ReadRegistered](t, out)
}

// A query that condemns answers only after the tombstone is durable; a
// failed write answers with an error and the next query tries again.
func TestEngineAnswersAfterDurableTombstone(t *testing.T) {
	now := simNow()
	e := testEngine(t, 1, true, 0)
	e.Start(now)
	e.RegisteredRead(now, 0, nil)
	e.IncarnationPersisted(now, 1, nil)
	e.RegisterDone(now, 1, nil)
	e.SetRegistered(now, 1, map[NodeID]Incarnation{1: 1, 2: 1, 3: 1, 4: 1})
	// Node 1's subject is acknowledged by itself and observer 2.
	for _, obs := range []NodeID{1, 2} {
		if err := e.subj.Echo(now, Packet{Kind: KindEcho, Subject: 1, Incarnation: 1, Seq: 1, Observer: obs}); err != nil {
			t.Fatal(err)
		}
	}
	later := now.Add(DefaultGracePeriod + 100*time.Millisecond)
	// Keep the subject fresh: beacons and echoes at later.
	for i := 0; i < 8; i++ {
		for _, o := range e.Tick(now.Add(time.Duration(i+1) * DefaultInterval)) {
			if s, ok := o.(Send); ok && s.To == 2 {
				p, _ := Open(s.Bytes, e.cfg.Keys)
				e.subj.Echo(now.Add(time.Duration(i+1)*DefaultInterval), Packet{Kind: KindEcho, Subject: 1, Incarnation: 1, Seq: p.Seq, Observer: 2})
				e.subj.Echo(now.Add(time.Duration(i+1)*DefaultInterval), Packet{Kind: KindEcho, Subject: 1, Incarnation: 1, Seq: p.Seq, Observer: 1})
			}
		}
	}
	if !e.Alive(later) {
		t.Fatal("observer's own node not alive")
	}
	out := e.Query(later, 1, []Question{{4, 1}})
	none[Answer](t, out)
	p := only[PersistTombstones](t, out)
	out = e.TombstonesPersisted(later, p, errors.New("EIO"))
	if a := only[Answer](t, out); a.Err == nil || !errors.Is(a.Err, ErrVerdictNotDurable) {
		t.Fatalf("answer after a failed write: %+v", a)
	}
	out = e.Query(later, 2, []Question{{4, 1}})
	none[Answer](t, out)
	p = only[PersistTombstones](t, out)
	a := only[Answer](t, e.TombstonesPersisted(later, p, nil))
	if a.Err != nil || !a.Dead[0] {
		t.Fatalf("answer after the write: %+v", a)
	}
	// Now durable: answered at once.
	if a := only[Answer](t, e.Query(later, 3, []Question{{4, 1}})); !a.Dead[0] {
		t.Fatalf("durable verdict: %+v", a)
	}
}

// A node gives its running incarnation up (a role that cannot go on nor
// give its leases back): it fences at once, before the deadline, with the
// reason, and takes a new incarnation; a resignation of another
// incarnation than the running one does nothing.
func TestEngineResign(t *testing.T) {
	now := simNow()
	e := testEngine(t, 2, false, 3)
	e.Start(now)
	only[PersistIncarnation](t, e.RegisteredRead(now, 3, nil))
	only[Register](t, e.IncarnationPersisted(now, 4, nil))
	only[Started](t, e.RegisterDone(now, 4, nil))
	if out := e.Resign(now, 3, "old"); len(out) != 0 {
		t.Fatalf("resigning an incarnation that is not running: %v", out)
	}
	out := e.Resign(now, 4, "its log failed")
	if f := only[SelfFence](t, out); f.Inc != 4 || f.Why != "its log failed" {
		t.Fatalf("self-fence %+v", f)
	}
	only[ReadRegistered](t, out)
	if e.Alive(now) {
		t.Fatal("alive after resigning")
	}
	if out := e.Resign(now, 4, "again"); len(out) != 0 {
		t.Fatalf("a second resignation: %v", out)
	}
}
