package lock

import "testing"

// The master's comment says a newer grant voids a revocation in flight; the
// clerk does not void it: it completes it later with the new token, which
// the master accepts, giving up the lease it was just granted.
func TestReviewClerkDoesNotVoidRevocation(t *testing.T) {
	c := NewClerk(cA, "")
	c.Handle(Welcome{})
	w1, _ := c.Acquire("x", Shared)
	c.Handle(Grant{Name: "x", Mode: Shared, Token: Token{1, 1}})
	if !w1.Granted {
		t.Fatal("no shared")
	}
	c.Handle(Revoke{Name: "x", Keep: None}) // waits for w1
	w2, out := c.Acquire("x", Exclusive)
	t.Logf("acquire excl: %v", out)
	out = c.Handle(Grant{Name: "x", Mode: Exclusive, Token: Token{1, 3}})
	t.Logf("grant excl t3: %v held=%v", out, c.Held("x"))
	out, _ = c.Release(w1)
	t.Logf("release shared: %v held=%v w2.Granted=%v", out, c.Held("x"), w2.Granted)
}
