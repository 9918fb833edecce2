package fd

// Outside review 110: the failure detector's runtime (driver.go) against
// the invariant. Each test failed while the defect it names was present.
// The third finding (a replacement observer's first membership taken from
// a watch that may lag) is node.TestReview110ReplacementFirstMembershipIsRead.

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"
)

// TestReview110DNSUnderDriverLock: Driver.SetMembership resolves every
// registered BeaconAddr (net.ResolveUDPAddr: a DNS lookup for a host name,
// which config.checkAddr allows) while holding d.mu, the lock every beacon,
// echo, tick, Alive and Query takes. A slow resolver therefore stalls the
// beacon path of every node on each membership change: healthy nodes fence.
func TestReview110DNSUnderDriverLock(t *testing.T) {
	nodes, reg := startReal(t, 3, nil)
	eventually(t, "all alive", allAlive(nodes))
	const lookup = 1500 * time.Millisecond // > GracePeriod 600 ms
	old := net.DefaultResolver
	net.DefaultResolver = &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		select {
		case <-time.After(lookup):
		case <-ctx.Done():
		}
		return nil, errors.New("review110: DNS server does not answer")
	}}
	defer func() { net.DefaultResolver = old }()

	// A membership update in which one node's beacon address is a name.
	reg.mu.Lock()
	regs := map[NodeID]Registration{}
	for id, inc := range reg.incs {
		regs[id] = Registration{Incarnation: inc, BeaconAddr: reg.addrs[id]}
	}
	regs[3] = Registration{Incarnation: reg.incs[3], BeaconAddr: "grove-review110-node3.example:7412"}
	v := reg.version + 1000
	reg.mu.Unlock()
	done := make(chan struct{})
	go func() { nodes[0].d.SetMembership(v, regs); close(done) }()
	time.Sleep(50 * time.Millisecond)
	t0 := time.Now()
	alive := nodes[0].d.Alive()
	blocked := time.Since(t0)
	t.Logf("Alive() on node 1 blocked %v and returned %v", blocked, alive)
	<-done
	time.Sleep(100 * time.Millisecond) // a tick or two after the lock is free
	if f := nodes[0].fences.Load(); f > 0 || blocked > testCfg.GracePeriod/2 {
		t.Fatalf("node 1 (network healthy) fenced %d time(s) and its Alive() blocked %v: a DNS lookup ran under the driver's lock", f, blocked)
	}
}
