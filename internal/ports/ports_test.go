package ports

import (
	"fmt"
	"net"
	"testing"
)

// Free's ports are distinct, below the ephemeral range, and bindable.
func TestFree(t *testing.T) {
	ps, err := Free(20)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ps {
		if p < lo || p >= hi || seen[p] {
			t.Fatalf("port %d: out of [%d, %d) or handed out twice (%v)", p, lo, hi, ps)
		}
		seen[p] = true
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			t.Fatalf("port %d handed out, not bindable: %v", p, err)
		}
		l.Close()
	}
	as, err := FreeAddrs(2)
	if err != nil || len(as) != 2 {
		t.Fatalf("FreeAddrs: %v, %v", as, err)
	}
}
