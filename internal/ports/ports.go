// Package ports hands out loopback TCP ports for the clusters that tests
// and benchmarks start on this machine, when an address must be known
// before the listener that will bind it exists (a raft replica's address
// is in every member's configuration before any replica starts).
package ports

import (
	"fmt"
	"math/rand/v2"
	"net"
)

// Below the kernel's ephemeral range (net.ipv4.ip_local_port_range,
// 32768-60999 by default on Linux) and above the fixed ports Grove's
// tools default to (grove up's 7100 and 9300 ranges): a port handed out
// here is never the local port of an outgoing connection nor a listener's
// on port 0, which the kernel takes from the ephemeral range. Handing out
// ports that were checked and closed (the usual :0 trick) lost races
// there when packages ran side by side ("bind: address already in use").
const lo, hi = 20000, 32000

// Free returns n distinct ports on 127.0.0.1, chosen at random in
// [20000, 32000) and each free when checked (bound for TCP and for UDP,
// and closed). Another
// process that picks ports the same way can still take one before its
// owner binds it, rarely: callers that start clusters retry on
// "address already in use".
func Free(n int) ([]int, error) {
	var out []int
	seen := map[int]bool{}
	for tries := 0; len(out) < n; tries++ {
		if tries > 100*n {
			return nil, fmt.Errorf("ports: no %d free loopback ports found in [%d, %d) after %d tries", n, lo, hi, tries)
		}
		p := lo + rand.IntN(hi-lo)
		if seen[p] {
			continue
		}
		seen[p] = true
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue
		}
		l.Close()
		// Some are bound for UDP too (a node's failure-detector beacon):
		// one taken there is not free either (seen in CI: "listen udp
		// 127.0.0.1:20663: bind: address already in use").
		u, err := net.ListenPacket("udp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue
		}
		u.Close()
		out = append(out, p)
	}
	return out, nil
}

// FreeAddrs is Free as 127.0.0.1:PORT addresses.
func FreeAddrs(n int) ([]string, error) {
	ps, err := Free(n)
	if err != nil {
		return nil, err
	}
	out := make([]string, n)
	for i, p := range ps {
		out[i] = fmt.Sprintf("127.0.0.1:%d", p)
	}
	return out, nil
}
