package lock

import (
	"testing"
	"time"
)

// Found by review: a clerk that said Goodbye is forgotten by decree, but a
// hint older than that decree (a watch or read already under way) still
// lists it; the master took it for a live clerk that had not reported and,
// right after a takeover, waited for its hello forever (a closed clerk
// never dials again): the lock service granted nothing. Hints older than
// the newest Forget are skipped.
func TestGoodbyeNotRevivedByOlderHint(t *testing.T) {
	now := time.Unix(1000, 0)
	env := func() Env { now = now.Add(300 * time.Millisecond); return Env{Now: now, Alive: true} }
	e := NewEngine(EngineConfig{Node: 9, Inc: 1, Addr: "m", Candidate: true})
	var rid, pid, uid uint64
	for _, o := range e.Tick(env()) {
		if r, ok := o.(ReadLock); ok {
			rid = r.ID
		}
	}
	for _, o := range e.LockRead(env(), rid, &State{Version: 10, Clerks: []ClerkInfo{{ID: cA, Kind: ""}, {ID: cB, Kind: ""}}}, nil) {
		if p, ok := o.(Propose); ok {
			pid = p.ID
		}
	}
	if rid == 0 || pid == 0 {
		t.Fatalf("no takeover: read %d propose %d", rid, pid)
	}
	e.Proposed(env(), pid, 11, nil)
	rec := MasterRecord{Node: 9, Inc: 1, Epoch: 1, Addr: "m"}
	e.LockNamespace(env(), &State{Version: 11, Master: &rec, Clerks: []ClerkInfo{{ID: cA, Kind: ""}, {ID: cB, Kind: ""}}})
	e.Accept(env(), 100, Hello{Clerk: cA, Epoch: 1})
	for _, o := range e.MasterRecv(env(), 100, Goodbye{}) {
		if u, ok := o.(Update); ok {
			uid = u.ID
		}
	}
	if uid == 0 {
		t.Fatal("Goodbye asked for no Forget decree")
	}
	e.Updated(env(), uid, 13, nil) // Forget(A) committed at version 13
	// A late hint at version 12 still lists A (and a new clerk D).
	e.LockNamespace(env(), &State{Version: 12, Master: &rec, Clerks: []ClerkInfo{{ID: cA, Kind: ""}, {ID: cB, Kind: ""}, {ID: cD, Kind: ""}}})
	e.Tick(env())
	e.LockNamespace(env(), &State{Version: 13, Master: &rec, Clerks: []ClerkInfo{{ID: cB, Kind: ""}, {ID: cD, Kind: ""}}})
	e.Tick(env())
	m, _ := e.Master()
	if m == nil {
		t.Fatal("no master")
	}
	e.Accept(env(), 101, Hello{Clerk: cB, Epoch: 1})
	e.Accept(env(), 102, Hello{Clerk: cD, Epoch: 1})
	if !m.Serving() {
		t.Fatal("the master does not serve: it waits for the clerk that left")
	}
}
