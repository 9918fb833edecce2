package fd

import (
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// realCluster runs drivers on real loopback UDP sockets with a short
// GracePeriod, for driver-level tests of what the simulator cannot reach:
// sockets, goroutines, the fence callback and incarnation persistence.
type realNode struct {
	d      *Driver
	fences atomic.Int32
	incs   atomic.Uint64
}

func startReal(t *testing.T, n int) ([]*realNode, []net.PacketConn) {
	t.Helper()
	conns := make([]net.PacketConn, n)
	addrs := map[NodeID]string{}
	var obs []NodeID
	for i := range conns {
		c, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c
		addrs[NodeID(i+1)] = c.LocalAddr().String()
		obs = append(obs, NodeID(i+1))
	}
	// Real time on a possibly loaded machine: a GracePeriod long enough that
	// a scheduling stall does not fence a node, short enough to keep the
	// test quick.
	cfg := Config{Interval: 50 * time.Millisecond, GracePeriod: 600 * time.Millisecond, MaxDrift: DefaultMaxDrift, Observers: obs}
	nodes := make([]*realNode, n)
	dir := t.TempDir()
	for i := range nodes {
		rn := &realNode{}
		nodes[i] = rn
		d, err := StartDriver(DriverConfig{
			Config: cfg, Self: NodeID(i + 1), ObserverAddrs: addrs, Conn: conns[i], Observe: true,
			Known:          func(id NodeID) bool { return id >= 1 && int(id) <= n },
			TombstoneFile:  filepath.Join(dir, "tomb"+string(rune('a'+i))),
			NewIncarnation: func() (Incarnation, error) { return Incarnation(rn.incs.Add(1)), nil },
			OnFence:        func(Incarnation) { rn.fences.Add(1) },
		})
		if err != nil {
			t.Fatal(err)
		}
		rn.d = d
	}
	t.Cleanup(func() {
		for _, rn := range nodes {
			rn.d.Close()
		}
	})
	return nodes, conns
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestDriverGarbageAndFence: malformed, truncated and foreign datagrams never
// crash a node or disturb liveness; when a node loses a majority of its
// observers it fences itself (the callback runs) and comes back with a
// higher incarnation, and the observers report the old one dead.
func TestDriverGarbageAndFence(t *testing.T) {
	nodes, conns := startReal(t, 3)
	eventually(t, "all alive", func() bool {
		for _, n := range nodes {
			if !n.d.Alive() {
				return false
			}
		}
		return true
	})
	// Garbage from a stranger at every node, while they keep running.
	junk, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer junk.Close()
	bad := [][]byte{nil, {1}, []byte("GFD1"), make([]byte, PacketSize), make([]byte, 2000),
		Packet{Kind: KindBeacon, Subject: 99, Incarnation: 1, Seq: 1}.Encode(nil),           // unknown node
		Packet{Kind: KindEcho, Subject: 1, Incarnation: 1, Seq: 1, Observer: 9}.Encode(nil), // forged echo
		Packet{Kind: KindBeacon, Subject: 2, Incarnation: 0xffff, Seq: 1}.Encode(nil)[:PacketSize-1],
	}
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Add(1)
		go func(a net.Addr) {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				junk.WriteTo(bad[i%len(bad)], a)
			}
		}(c.LocalAddr())
	}
	wg.Wait()
	time.Sleep(700 * time.Millisecond) // > GracePeriod: garbage must not fence anyone
	for i, n := range nodes {
		if n.fences.Load() != 0 || !n.d.Alive() {
			t.Fatalf("node %d disturbed by garbage: fences=%d alive=%v", i+1, n.fences.Load(), n.d.Alive())
		}
	}
	if v := nodes[0].d.Views(); len(v) != 3 {
		t.Fatalf("observer 1 views %v: garbage created or changed entries", v)
	}
	// Node 1 loses observers 2 and 3: it must fence and take incarnation 2.
	nodes[1].d.Close()
	nodes[2].d.Close()
	eventually(t, "node 1 fences", func() bool { return nodes[0].fences.Load() >= 1 })
	if nodes[0].d.Alive() {
		t.Fatal("node 1 alive without a majority of observers")
	}
	inc, _ := nodes[0].d.Incarnation()
	if inc < 2 {
		t.Fatalf("node 1 incarnation %d after fence, want ≥ 2", inc)
	}
	// Observer 1 reports node 2's incarnation 1 dead after its silence.
	eventually(t, "node 2 dead at observer 1", func() bool {
		dead, err := nodes[0].d.Query([]NodeID{2}, []Incarnation{1})
		return err == nil && dead[0]
	})
}
