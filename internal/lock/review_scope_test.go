package lock

// Review of the scope change (HEAD): an "all" recovery blocks only the
// names in the dead clerk's scope.

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/meta"
)

// nsFrom applies ops to a namespace (puts and deletes only).
func reviewApply(ns *pb.Namespace, ops []*pb.Op) {
	for _, o := range ops {
		kept := ns.Entries[:0]
		for _, e := range ns.Entries {
			if e.Key != o.Key {
				kept = append(kept, e)
			}
		}
		ns.Entries = kept
		if o.Kind == pb.Op_KIND_PUT {
			ns.Entries = append(ns.Entries, &pb.Entry{Key: o.Key, Value: o.Value})
		}
	}
}

func noGrant(t *testing.T, what string, out []any) {
	t.Helper()
	if g, ok := find[Grant](out); ok && strings.HasPrefix(g.Name, "bt/") {
		t.Fatalf("%s: granted %q (in the dead clerk's scope) while its all-recovery is pending: %v", what, g.Name, out)
	}
}

// Every grant path of the master, exercised while a scoped all-recovery is
// pending: nothing in the scope is granted (expected to PASS).
func TestReviewScopeNoInScopeGrantOnAnyPath(t *testing.T) {
	scope := []string{"bt/"}
	// B (kind "") held bt/x shared and C (bt) held bt/y shared under the
	// old master; D (bt) never reports.
	m := NewMaster(2, []ClerkInfo{{ID: cB, Kind: ""}, {ID: cC, Kind: "bt", Scope: scope}, {ID: cD, Kind: "bt", Scope: scope}}, nil)
	noGrant(t, "hello B", m.Hello(Hello{Clerk: cB, Epoch: 2, Held: map[string]Mode{"bt/x": Shared}, Want: map[string]Mode{"bt/w": Exclusive}}))
	noGrant(t, "hello C", m.Hello(Hello{Clerk: cC, Kind: "bt", Epoch: 2, Held: map[string]Mode{"bt/y": Shared}, Want: map[string]Mode{"bt/x": Shared}}))
	noGrant(t, "verdict D", m.Verdict(cD, true))
	// Upgrades, new acquires, shared-with-shared.
	noGrant(t, "upgrade", m.Handle(cB, Acquire{"bt/x", Exclusive}))
	noGrant(t, "shared", m.Handle(cB, Acquire{"bt/y", Shared}))
	noGrant(t, "fresh", m.Handle(cC, Acquire{"bt/z", Exclusive}))
	// Releases, withdrawals, disconnects and reconnects call try.
	noGrant(t, "release", m.Handle(cC, Release{"bt/y", None, Token{}}))
	noGrant(t, "withdraw", m.Handle(cB, Withdraw{"bt/w"}))
	noGrant(t, "disconnect", m.Disconnected(cB))
	noGrant(t, "reconnect", m.Hello(Hello{Clerk: cB, Epoch: 2, Held: map[string]Mode{"bt/x": Shared}, Want: map[string]Mode{"bt/x": Exclusive, "bt/q": Shared}}))
	noGrant(t, "tick", append(func() []any { m.Tick(); return nil }(), m.Pending()...))
	out := m.Persisted(cD)
	noGrant(t, "persisted", out)
	if p, ok := find[Persist](out); ok && p.Record.Started {
		out = m.Persisted(cD) // the Started mark goes in before the run
		noGrant(t, "started mark persisted", out)
	}
	r, ok := find[Recover](sends(out, cC))
	if !ok || !r.All {
		t.Fatalf("all-recovery not assigned: %v", out)
	}
	noGrant(t, "stale forgotten", m.Forgotten(cD)) // not forgetting yet: ignored
	noGrant(t, "recovery done", m.Handle(cC, RecoveryDone{cD, true, r.Token}))
	// The record read back by a new master blocks the same names, and one
	// written by an older version (no scope) blocks every name.
	rec := m.Recoveries()[0]
	ns := &pb.Namespace{}
	ops, _ := persistOps(&pb.Namespace{Entries: []*pb.Entry{{Key: "master", Value: put("master", &pb.LockMasterRecord{Epoch: 2}).Value}}}, 2, rec)
	reviewApply(ns, ops)
	st, err := DecodeState(ns)
	if err != nil || len(st.Records) != 1 || fmt.Sprint(st.Records[0].Scope) != fmt.Sprint(scope) {
		t.Fatalf("record round trip: %+v %v", st, err)
	}
	for _, old := range []bool{false, true} {
		rr := st.Records[0]
		if old {
			rr.Scope = nil
		}
		// Clerk record gone, recovery record left.
		m2 := NewMaster(3, []ClerkInfo{{ID: cB, Kind: ""}}, []RecoveryRecord{rr})
		hello(m2, cB, "", nil)
		noGrant(t, "new master", m2.Handle(cB, Acquire{"bt/x", Exclusive}))
		_, g := find[Grant](m2.Handle(cB, Acquire{"chunk/1", Exclusive}))
		if g == old {
			t.Fatalf("old-format record (%v): chunk/1 granted=%v", old, g)
		}
	}
	// Only the Forget's commit frees the scope.
	if _, ok := find[Grant](m.Forgotten(cD)); !ok {
		t.Fatal("nothing granted after the recovery's records were removed")
	}
}

// The master checks a clerk's scope itself: a clerk that (through any bug
// or another binary) asks for a name outside its recorded scope is not
// granted it (an anomaly is reported), so that after a failover the
// clerk's all-recovery, which blocks only its scope, covers everything it
// could hold. (Failed before: the scope was enforced on the clerk side
// only.)
func TestReviewScopeMasterDoesNotEnforceScope(t *testing.T) {
	scope := []string{"bt/"}
	infos := []ClerkInfo{{ID: cB, Kind: ""}, {ID: cD, Kind: "bt", Scope: scope}}
	m1 := NewMaster(1, infos, nil)
	hello(m1, cB, "", nil)
	hello(m1, cD, "bt", nil)
	out := m1.Handle(cD, Acquire{"chunk/7", Exclusive})
	if _, ok := find[Grant](out); ok {
		t.Fatal("master 1 granted chunk/7, outside D's scope [bt/], to D")
	}
	if _, ok := find[Anomaly](out); !ok {
		t.Fatalf("no anomaly for an acquire outside the scope: %v", out)
	}
	out = m1.Hello(Hello{Clerk: cD, Kind: "bt", Epoch: m1.Epoch(), Want: map[string]Mode{"chunk/8": Exclusive}})
	if _, ok := find[Grant](out); ok {
		t.Fatal("master 1 granted chunk/8, outside D's scope, wanted in a Hello")
	}
	// Master 1 dies; D dies before reporting to master 2: B may have
	// chunk/7 (D never held it).
	m2 := NewMaster(2, infos, nil)
	hello(m2, cB, "", nil)
	m2.Verdict(cD, true)
	if _, ok := find[Grant](m2.Handle(cB, Acquire{"chunk/7", Exclusive})); !ok {
		t.Fatal("chunk/7, outside D's scope, waits for D's all-recovery")
	}
}

// The engine copies the caller's scope slice (variadic scope...): mutating
// it after registration must not change what the engine lets the clerk
// lock (the recorded scope the master uses does not change). (Failed
// before: no defensive copy.)
func TestReviewScopeSliceAliasing(t *testing.T) {
	now := time.Unix(1000, 0)
	env := Env{Now: now, Alive: true}
	e := NewEngine(EngineConfig{Node: 9, Inc: 1, Addr: "m"})
	scope := []string{"bt/"} // like btree.Scope, an exported package var
	id, out, err := e.NewClerk(env, "bt", scope...)
	if err != nil {
		t.Fatal(err)
	}
	u, _ := find[Update](out)
	ops, _ := u.Build(&pb.Namespace{})
	ns := &pb.Namespace{}
	reviewApply(ns, ops)
	st, _ := DecodeState(ns)
	recorded := st.Clerks[0].Scope
	scope[0] = "chunk/" // any later write to the caller's slice
	if _, _, err := e.Acquire(env, id, "chunk/7", Exclusive); !errors.Is(err, ErrOutOfScope) {
		t.Fatalf("clerk recorded with scope %q may now lock chunk/7 (err %v): the engine aliases the caller's slice", recorded, err)
	}
}

// The record-size guard counts the scope as well as the held names: a
// per-lease record it accepts fits the config service's value limit (else
// the Persist decree is refused as malformed and the master halts).
// (Failed before: the guard counted held names only.)
func TestReviewScopeRecordSizeIgnoresScope(t *testing.T) {
	scope := []string{"n/"} // the names below; then 7 prefixes as long as names get
	for i := 1; i < MaxScopePrefixes; i++ {
		scope = append(scope, fmt.Sprintf("%d", i)+strings.Repeat("p", MaxNameLen-1))
	}
	// Around the guard's limit: every per-lease record must fit.
	for count := 50; count <= 64; count++ {
		m := NewMaster(1, []ClerkInfo{{ID: cA, Kind: "wal", Scope: scope}, {ID: cB, Kind: "wal", Scope: scope}}, nil)
		hello(m, cA, "wal", nil)
		hello(m, cB, "wal", nil)
		for i := 0; i < count; i++ {
			n := scope[0] + strings.Repeat("n", MaxNameLen-len(scope[0])-4) + fmt.Sprintf("%04d", i)
			if _, ok := find[Grant](m.Handle(cA, Acquire{n, Exclusive})); !ok {
				t.Fatalf("no grant of %d", i)
			}
		}
		p, ok := find[Persist](m.Verdict(cA, true))
		if !ok {
			t.Fatal("no recovery record")
		}
		if p.Record.All {
			continue // the guard turned it into "all": it fits
		}
		ops, err := persistOps(&pb.Namespace{Entries: []*pb.Entry{{Key: "master", Value: put("master", &pb.LockMasterRecord{Epoch: 1}).Value}}}, 1, p.Record)
		if err != nil {
			t.Fatal(err)
		}
		if n := len(ops[0].Value); n > meta.MaxValueLen {
			t.Fatalf("%d leases: a recovery record of %d bytes > meta.MaxValueLen %d passed the MaxRecordBytes guard", count, n, meta.MaxValueLen)
		}
	}
}
