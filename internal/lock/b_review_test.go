package lock

import (
	"fmt"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
)

// Finding: a clerk caches leases without bound, but its Hello is refused
// above MaxHelloLeases (and gRPC refuses messages above 4 MiB by default).
func TestReviewHelloTooBig(t *testing.T) {
	c := NewClerk(cA, "")
	c.Handle(Welcome{Epoch: 1})
	for i := 0; i < MaxHelloLeases+1; i++ {
		n := fmt.Sprintf("n%d", i)
		c.Acquire(n, Shared)
		c.Handle(Grant{Name: n, Mode: Shared, Token: Token{1, uint64(i + 1)}})
	}
	h := c.Connect(2)
	if _, err := DecodeClerkMessage(EncodeClerkMessage(h)); err != nil {
		t.Errorf("BUG: a clerk caching %d leases can never say Hello again: %v", len(h.Held), err)
	}
	c2 := NewClerk(cB, "")
	long := strings.Repeat("x", 1000)
	for i := 0; i < 4200; i++ {
		n := fmt.Sprintf("%s%d", long, i)
		c2.Acquire(n, Shared)
		c2.Handle(Grant{Name: n, Mode: Shared, Token: Token{1, uint64(i + 1)}})
	}
	if sz := proto.Size(EncodeClerkMessage(c2.Connect(2))); sz > 4<<20 {
		t.Errorf("BUG: Hello of a clerk with 4200 cached 1000-byte leases is %d bytes > gRPC's default 4 MiB receive limit", sz)
	}
}
