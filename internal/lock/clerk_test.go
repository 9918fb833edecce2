package lock

import "testing"

func toMaster(out []any) []any {
	var r []any
	for _, o := range out {
		if t, ok := o.(ToMaster); ok {
			r = append(r, t.Msg)
		}
	}
	return r
}

// A cached lease is re-acquired without a message; a revocation waits for
// local holders and then downgrades; a fence fails every waiter.
func TestClerkCacheRevokeFence(t *testing.T) {
	c := NewClerk(cA, "")
	c.Connect(1)
	c.Handle(Welcome{1})
	w, out := c.Acquire("x", Exclusive)
	if w.Granted || len(toMaster(out)) != 1 {
		t.Fatalf("first acquire: granted=%v out=%v", w.Granted, out)
	}
	if _, ok := find[Woken](c.Handle(Grant{"x", Exclusive, Token{1, 1}})); !ok || !w.Granted {
		t.Fatal("grant did not wake the waiter")
	}
	c.Release(w)
	w2, out := c.Acquire("x", Shared)
	if !w2.Granted || len(toMaster(out)) != 0 {
		t.Fatalf("cached re-acquire sent %v", out)
	}
	// Revoke to shared while a shared holder is inside: immediate downgrade.
	out = c.Handle(Revoke{"x", Shared})
	if r, ok := find[Release](toMaster(out)); !ok || r.Mode != Shared || r.Token != (Token{1, 1}) {
		t.Fatalf("downgrade: %v", out)
	}
	if _, ok := find[Revoking](out); ok {
		t.Fatal("a revocation that completed at once was noticed as pending")
	}
	// Revoke to none: waits for the holder, and says so (a cache's pin
	// gives its hold up on this notice).
	out = c.Handle(Revoke{"x", None})
	if len(toMaster(out)) != 0 {
		t.Fatalf("released under a local holder: %v", out)
	}
	if r, ok := find[Revoking](out); !ok || r.Name != "x" || !c.Revoking("x") {
		t.Fatalf("no notice of the pending revocation: %v", out)
	}
	w3, _ := c.Acquire("x", Shared) // not admitted past the pending revocation
	if w3.Granted {
		t.Fatal("new holder admitted past a pending revocation")
	}
	out, _ = c.Release(w2)
	if r, ok := find[Release](toMaster(out)); !ok || r.Mode != None {
		t.Fatalf("release after last holder: %v", out)
	}
	if a, ok := find[Acquire](toMaster(out)); !ok || a.Mode != Shared {
		t.Fatalf("waiter not re-requested: %v", out)
	}
	if c.Held("x") != None {
		t.Fatal("lease kept after release")
	}
	failed := c.Fence()
	if len(failed) != 1 || !w3.Failed {
		t.Fatalf("fence failed %d waiters", len(failed))
	}
	if w4, _ := c.Acquire("y", Shared); !w4.Failed {
		t.Fatal("fenced clerk accepted an acquire")
	}
}

// Hello reports what is held and wanted, with grant tokens.
func TestClerkHello(t *testing.T) {
	c := NewClerk(cA, "wal")
	c.Connect(1)
	c.Handle(Grant{"x", Shared, Token{1, 4}})
	c.Acquire("y", Exclusive)
	h := c.Connect(2)
	if h.Held["x"] != Shared || h.Tokens["x"] != (Token{1, 4}) || h.Want["y"] != Exclusive || h.Kind != "wal" || h.Epoch != 2 {
		t.Fatalf("hello %+v", h)
	}
}

// Close refuses under a holder; then it gives every cached lease back with
// its token and fails the waiters; until its Goodbye is taken a closed
// clerk gives back a grant that still reaches it and declines a recovery
// (found by review: it ignored both, and the master waited on it).
func TestClerkCloseGivesBack(t *testing.T) {
	c := NewClerk(cA, "wal")
	c.Connect(1)
	c.Handle(Welcome{1})
	w, _ := c.Acquire("x", Exclusive)
	c.Handle(Grant{"x", Exclusive, Token{1, 4}})
	if _, _, err := c.Close(); err != ErrStillHeld {
		t.Fatalf("close under a holder: %v", err)
	}
	c.Release(w)
	wy, _ := c.Acquire("y", Shared) // waits: the master has not granted y
	failed, out, err := c.Close()
	if err != nil || len(failed) != 1 || failed[0] != wy || !wy.Failed {
		t.Fatalf("close: failed %v err %v", failed, err)
	}
	if r, ok := find[Release](toMaster(out)); !ok || r.Name != "x" || r.Mode != None || r.Token != (Token{1, 4}) {
		t.Fatalf("close did not give x back with its token: %v", out)
	}
	out = c.Handle(Grant{"y", Shared, Token{1, 5}})
	if r, ok := find[Release](toMaster(out)); !ok || r.Name != "y" || r.Mode != None || r.Token != (Token{1, 5}) {
		t.Fatalf("a grant after the close was kept: %v", out)
	}
	out = c.Handle(Recover{Dead: cB, Names: []string{"z"}, Token: Token{1, 6}})
	if d, ok := find[RecoveryDone](toMaster(out)); !ok || d.OK || d.Dead != cB || d.Token != (Token{1, 6}) {
		t.Fatalf("a recovery asked of a closed clerk: %v", out)
	}
	if _, ok := find[RunRecovery](out); ok {
		t.Fatal("a closed clerk started a recovery")
	}
	if w, _ := c.Acquire("z", Shared); !w.Failed {
		t.Fatal("a closed clerk accepted an acquire")
	}
}
