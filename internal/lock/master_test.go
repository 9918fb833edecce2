package lock

import (
	"reflect"
	"testing"
)

var (
	cA = ClerkID{Node: 1, Inc: 1, Seq: 1}
	cB = ClerkID{Node: 2, Inc: 1, Seq: 1}
	cC = ClerkID{Node: 3, Inc: 1, Seq: 1}
	cD = ClerkID{Node: 4, Inc: 1, Seq: 1}
)

// sends filters a master's outputs to the messages for one clerk.
func sends(out []any, to ClerkID) []any {
	var r []any
	for _, o := range out {
		if s, ok := o.(Send); ok && s.To == to {
			r = append(r, s.Msg)
		}
	}
	return r
}

func has[T any](out []any) (T, bool) {
	for _, o := range out {
		if v, ok := o.(T); ok {
			return v, true
		}
		if s, ok := o.(Send); ok {
			if v, ok := s.Msg.(T); ok {
				return v, true
			}
		}
	}
	var zero T
	return zero, false
}

func hello(m *Master, c ClerkID, kind string, held map[string]Mode) []any {
	return m.Hello(Hello{Clerk: c, Kind: kind, Epoch: m.Epoch(), Held: held})
}

func TestGrantRevokeDowngrade(t *testing.T) {
	m := NewMaster(1, []ClerkInfo{{cA, ""}, {cB, ""}}, nil)
	hello(m, cA, "", nil)
	hello(m, cB, "", nil)
	out := m.Handle(cA, Acquire{"x", Exclusive})
	g, ok := has[Grant](sends(out, cA))
	if !ok || g.Mode != Exclusive || g.Seq != 1 {
		t.Fatalf("A's grant: %v", out)
	}
	// B wants shared: A is asked to come down to shared, B waits.
	out = m.Handle(cB, Acquire{"x", Shared})
	if r, ok := has[Revoke](sends(out, cA)); !ok || r.Keep != Shared {
		t.Fatalf("revoke to A: %v", out)
	}
	if _, ok := has[Grant](sends(out, cB)); ok {
		t.Fatal("B granted shared while A holds exclusive")
	}
	out = m.Handle(cA, Release{"x", Shared, 1})
	if g, ok := has[Grant](sends(out, cB)); !ok || g.Mode != Shared {
		t.Fatalf("B not granted after A downgraded: %v", out)
	}
	if got := m.Locks()[0].Holders; !reflect.DeepEqual(got, map[ClerkID]Mode{cA: Shared, cB: Shared}) {
		t.Fatalf("holders %v", got)
	}
}

// A release that crossed a newer grant on the wire must not free it.
func TestStaleReleaseIgnored(t *testing.T) {
	m := NewMaster(1, []ClerkInfo{{cA, ""}, {cB, ""}}, nil)
	hello(m, cA, "", nil)
	hello(m, cB, "", nil)
	m.Handle(cA, Acquire{"x", Shared})    // grant seq 1
	m.Handle(cA, Acquire{"x", Exclusive}) // upgrade: grant seq 2
	m.Handle(cA, Release{"x", None, 1})   // refers to grant 1: stale
	out := m.Handle(cB, Acquire{"x", Exclusive})
	if _, ok := has[Grant](sends(out, cB)); ok {
		t.Fatal("stale release freed A's newer exclusive grant")
	}
	out = m.Handle(cA, Release{"x", None, 2})
	if _, ok := has[Grant](sends(out, cB)); !ok {
		t.Fatalf("current release did not free the lock: %v", out)
	}
}

// A dead clerk of a recovery kind keeps its leases until recovery has run,
// on a live clerk of its kind; a failed run is retried.
func TestRecoveryBeforeRegrant(t *testing.T) {
	m := NewMaster(1, []ClerkInfo{{cA, "wal"}, {cB, ""}, {cC, "wal"}}, nil)
	hello(m, cA, "wal", nil)
	hello(m, cB, "", nil)
	hello(m, cC, "wal", nil)
	m.Handle(cA, Acquire{"x", Exclusive})
	m.Handle(cB, Acquire{"x", Exclusive}) // waits; A is revoked but is dying
	out := m.Verdict(cA, true)
	if p, ok := has[Persist](out); !ok || !reflect.DeepEqual(p.Record.Names, []string{"x"}) {
		t.Fatalf("no recovery record: %v", out)
	}
	r, ok := has[Recover](sends(out, cC))
	if !ok || r.Dead != cA {
		t.Fatalf("recovery not sent to C: %v", out)
	}
	if _, ok := has[Grant](out); ok {
		t.Fatal("granted before recovery")
	}
	out = m.Handle(cC, RecoveryDone{cA, false})
	if _, ok := has[Recover](sends(out, cC)); !ok {
		t.Fatalf("failed recovery not retried: %v", out)
	}
	if _, ok := has[Grant](out); ok {
		t.Fatal("granted after a failed recovery")
	}
	out = m.Handle(cC, RecoveryDone{cA, true})
	if _, ok := has[Forget](out); !ok {
		t.Fatalf("dead clerk not forgotten: %v", out)
	}
	if _, ok := has[Grant](sends(out, cB)); !ok {
		t.Fatalf("B not granted after recovery: %v", out)
	}
}

// With no live clerk of the kind, the leases stay held; recovery runs when
// the first one registers, before the lease is granted again.
func TestDeferredRecovery(t *testing.T) {
	m := NewMaster(1, []ClerkInfo{{cA, "wal"}, {cB, ""}}, nil)
	hello(m, cA, "wal", nil)
	hello(m, cB, "", nil)
	m.Handle(cA, Acquire{"x", Shared})
	m.Verdict(cA, true)
	out := m.Handle(cB, Acquire{"x", Exclusive})
	if _, ok := has[Grant](out); ok {
		t.Fatal("granted with recovery deferred")
	}
	if _, ok := has[Recover](out); ok {
		t.Fatal("recovery sent to a clerk of another kind")
	}
	m.ClerkRegistered(ClerkInfo{cD, "wal"})
	out = hello(m, cD, "wal", nil)
	if r, ok := has[Recover](sends(out, cD)); !ok || r.Dead != cA {
		t.Fatalf("recovery not run on the new clerk: %v", out)
	}
	if _, ok := has[Grant](sends(out, cB)); ok {
		t.Fatal("granted before the deferred recovery finished")
	}
	out = m.Handle(cD, RecoveryDone{cA, true})
	if _, ok := has[Grant](sends(out, cB)); !ok {
		t.Fatalf("B not granted after deferred recovery: %v", out)
	}
}

// A clerk without a recovery function simply loses its leases.
func TestNoRecoveryFreesAtOnce(t *testing.T) {
	m := NewMaster(1, []ClerkInfo{{cA, ""}, {cB, ""}}, nil)
	hello(m, cA, "", nil)
	hello(m, cB, "", nil)
	m.Handle(cA, Acquire{"x", Exclusive})
	m.Handle(cB, Acquire{"x", Exclusive})
	out := m.Verdict(cA, true)
	if _, ok := has[Grant](sends(out, cB)); !ok {
		t.Fatalf("B not granted when A died: %v", out)
	}
	if _, ok := has[Persist](out); ok {
		t.Fatal("recovery record for a clerk without a kind")
	}
}

// A new master grants nothing until every listed clerk has reported or died;
// it keeps reported leases, and recovers a dead wal clerk whose leases it
// cannot know before granting anything at all.
func TestFailoverRebuild(t *testing.T) {
	m := NewMaster(2, []ClerkInfo{{cA, ""}, {cB, "wal"}, {cC, "wal"}}, nil)
	if m.Serving() {
		t.Fatal("serving before clerks reported")
	}
	out := hello(m, cA, "", map[string]Mode{"x": Exclusive})
	if _, ok := has[Welcome](sends(out, cA)); !ok {
		t.Fatalf("no welcome: %v", out)
	}
	hello(m, cB, "wal", nil)
	out = m.Handle(cB, Acquire{"x", Shared})
	if _, ok := has[Grant](out); ok {
		t.Fatal("granted before C reported or died")
	}
	out = m.Verdict(cC, true) // C never reported: its leases are unknown
	if p, ok := has[Persist](out); !ok || !p.Record.All {
		t.Fatalf("no all-recovery for unknown leases: %v", out)
	}
	if _, ok := has[Grant](out); ok {
		t.Fatal("granted with an all-recovery pending")
	}
	if r, ok := has[Recover](sends(out, cB)); !ok || !r.All {
		t.Fatalf("all-recovery not sent to B: %v", out)
	}
	out = m.Handle(cB, RecoveryDone{cC, true})
	// A's reported exclusive lease survived the failover: B must wait for it.
	if _, ok := has[Grant](sends(out, cB)); ok {
		t.Fatal("new master granted over a lease the old master granted")
	}
	if _, ok := has[Revoke](sends(out, cA)); !ok {
		t.Fatalf("A not revoked: %v", out)
	}
}

// A new master keeps a dead clerk's recorded leases held.
func TestFailoverKeepsRecordedRecovery(t *testing.T) {
	rec := RecoveryRecord{Dead: cC, Kind: "wal", Names: []string{"x"}}
	m := NewMaster(3, []ClerkInfo{{cB, "wal"}, {cC, "wal"}}, []RecoveryRecord{rec})
	out := hello(m, cB, "wal", nil)
	if r, ok := has[Recover](sends(out, cB)); !ok || r.Dead != cC {
		t.Fatalf("recorded recovery not resumed: %v", out)
	}
	out = m.Handle(cB, Acquire{"x", Shared})
	if _, ok := has[Grant](out); ok {
		t.Fatal("granted a lease held by a pending recovery")
	}
	out = m.Handle(cB, Acquire{"y", Shared})
	if _, ok := has[Grant](out); !ok {
		t.Fatal("an unrelated lock was blocked by a named recovery")
	}
}

func TestRejects(t *testing.T) {
	m := NewMaster(1, []ClerkInfo{{cA, ""}}, nil)
	if r, ok := has[Reject](hello(m, cB, "", nil)); !ok || r.Dead {
		t.Fatal("unregistered clerk accepted")
	}
	if r, ok := has[Reject](m.Hello(Hello{Clerk: cA, Epoch: 7})); !ok || r.Dead {
		t.Fatal("hello to the wrong epoch accepted")
	}
	hello(m, cA, "", nil)
	for _, bad := range []any{Acquire{"", Shared}, Acquire{string(make([]byte, MaxNameLen+1)), Shared}, Acquire{"x", None}, Acquire{"x", 9}, Release{"x", Exclusive, 0}} {
		if out := m.Handle(cA, bad); len(out) != 0 || len(m.Locks()) != 0 {
			t.Fatalf("bad message %v changed state: %v", bad, out)
		}
	}
	m.Verdict(cA, true)
	if r, ok := has[Reject](hello(m, cA, "", nil)); !ok || !r.Dead {
		t.Fatal("dead clerk accepted back")
	}
	if out := m.Handle(cB, Acquire{"x", Shared}); out != nil {
		t.Fatal("message from an unknown clerk acted on")
	}
}

// A revocation outstanding when the master grants the same clerk a newer
// lease is void: the clerk's answer to it carries the older sequence number
// and is ignored, so the next conflicting waiter must trigger a new one.
// (Found by the simulator: seed 756 of an earlier build starved waiters.)
func TestRevokeVoidedByNewerGrant(t *testing.T) {
	m := NewMaster(1, []ClerkInfo{{cA, ""}, {cB, ""}, {cC, ""}}, nil)
	hello(m, cA, "", nil)
	hello(m, cB, "", nil)
	hello(m, cC, "", nil)
	m.Handle(cA, Acquire{"x", Shared}) // seq 1
	out := m.Handle(cB, Acquire{"x", Exclusive})
	if _, ok := has[Revoke](sends(out, cA)); !ok {
		t.Fatalf("no revoke to A: %v", out)
	}
	m.Handle(cA, Acquire{"x", Exclusive}) // A wants to upgrade: queued behind B
	out = m.Disconnected(cB)              // B goes away: A is at the head
	out = append(out, m.Handle(cA, Acquire{"x", Exclusive})...)
	m.Handle(cA, Release{"x", None, 1}) // A's answer to the old revoke: stale
	out = m.Handle(cC, Acquire{"x", Exclusive})
	if _, ok := has[Revoke](sends(out, cA)); !ok {
		t.Fatalf("C's request does not revoke A's newer grant: %v", out)
	}
	if got := m.Locks()[0].Holders[cA]; got != Exclusive {
		t.Fatalf("A holds %v, want exclusive (granted after B left)", got)
	}
	out = m.Handle(cA, Release{"x", None, 2})
	if _, ok := has[Grant](sends(out, cC)); !ok {
		t.Fatalf("C starves: %v", out)
	}
}

// A clerk that left without leases is still asked about, and forgotten once
// dead: the clerk list does not grow with every restart.
func TestDeadIdleClerkForgotten(t *testing.T) {
	m := NewMaster(1, []ClerkInfo{{cA, ""}, {cB, "wal"}}, nil)
	hello(m, cA, "", nil)
	hello(m, cB, "wal", nil)
	m.Disconnected(cA)
	m.Disconnected(cB)
	if got := m.Tick(); len(got) != 2 {
		t.Fatalf("suspects %v, want both idle disconnected clerks", got)
	}
	for _, c := range []ClerkID{cA, cB} {
		if _, ok := has[Forget](m.Verdict(c, true)); !ok {
			t.Fatalf("dead idle clerk %v not forgotten", c)
		}
	}
}
