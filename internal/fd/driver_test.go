package fd

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/disk"
)

// registry is an in-memory stand-in for the config service's membership:
// registrations (refusing an incarnation not newer than the registered one)
// and the membership pushed to every driver, as a watch would.
type registry struct {
	mu      sync.Mutex
	version uint64
	incs    map[NodeID]Incarnation
	addrs   map[NodeID]string
	drivers []*Driver
}

func (r *registry) registered(id NodeID) func(context.Context) (Incarnation, error) {
	return func(context.Context) (Incarnation, error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.incs[id], nil
	}
}

func (r *registry) register(id NodeID) func(context.Context, Incarnation) error {
	return func(_ context.Context, inc Incarnation) error {
		r.mu.Lock()
		if r.incs[id] >= inc {
			r.mu.Unlock()
			return ErrIncarnationTaken
		}
		r.incs[id] = inc
		r.version++
		r.mu.Unlock()
		r.push()
		return nil
	}
}

func (r *registry) push() {
	r.mu.Lock()
	regs := map[NodeID]Registration{}
	for id, inc := range r.incs {
		regs[id] = Registration{Incarnation: inc, BeaconAddr: r.addrs[id]}
	}
	ds := append([]*Driver(nil), r.drivers...)
	v := r.version
	r.mu.Unlock()
	for _, d := range ds {
		d.SetMembership(v, regs)
	}
}

// testLog sends the drivers' warnings to the test log.
func testLog(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// realNode runs a driver on a real loopback UDP socket with a short
// GracePeriod, for driver-level tests of what the simulator cannot reach:
// sockets, goroutines, the fence callback and the files on disk.
type realNode struct {
	d      *Driver
	fences atomic.Int32
	starts atomic.Int32
	disk   disk.FS
	conn   net.PacketConn
}

// Real time on a possibly loaded machine: a GracePeriod long enough that a
// scheduling stall does not fence a node, short enough to keep tests quick.
var testCfg = Config{Interval: 50 * time.Millisecond, GracePeriod: 600 * time.Millisecond, MaxDrift: DefaultMaxDrift}

func startReal(t *testing.T, n int, disks []disk.FS) ([]*realNode, *registry) {
	return startRealObs(t, n, n, disks)
}

// startRealObs runs n nodes, the first obs of them observers.
func startRealObs(t *testing.T, n, obs int, disks []disk.FS) ([]*realNode, *registry) {
	t.Helper()
	return startRealClocks(t, n, obs, disks, nil)
}

// startRealClocks is startRealObs with each node's clock readings for its
// ClockGuard (clocks[i] nil: the real ones).
func startRealClocks(t *testing.T, n, obs int, disks []disk.FS, clocks []func() (ClockSample, bool)) ([]*realNode, *registry) {
	t.Helper()
	reg := &registry{incs: map[NodeID]Incarnation{}, addrs: map[NodeID]string{}}
	addrs := map[NodeID]string{}
	cfg := testCfg
	nodes := make([]*realNode, n)
	for i := range nodes {
		c, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		id := NodeID(i + 1)
		addrs[id] = c.LocalAddr().String()
		reg.addrs[id] = c.LocalAddr().String()
		if i < obs {
			cfg.Observers = append(cfg.Observers, id)
		}
		nodes[i] = &realNode{conn: c, disk: disk.NewMem()}
		if disks != nil && disks[i] != nil {
			nodes[i].disk = disks[i]
		}
	}
	dir := t.TempDir()
	for i, rn := range nodes {
		id := NodeID(i + 1)
		var cl func() (ClockSample, bool)
		if clocks != nil {
			cl = clocks[i]
		}
		d, err := StartDriver(DriverConfig{
			Clocks: cl,
			Engine: EngineConfig{Config: cfg, Self: id, Observe: i < obs, Keys: Keyring{Sign: testKey}}, ObserverAddrs: addrs,
			Conn: rn.conn, Disk: rn.disk, Log: testLog(t),
			IncarnationFile: filepath.Join(dir, "inc"+string(rune('a'+i))),
			TombstoneFile:   filepath.Join(dir, "tomb"+string(rune('a'+i))),
			Registered:      reg.registered(id), Register: reg.register(id),
			OnFence:       func(Incarnation) { rn.fences.Add(1) },
			OnIncarnation: func(Incarnation) { rn.starts.Add(1) },
			OnDriver: func(d *Driver) {
				reg.mu.Lock()
				reg.drivers = append(reg.drivers, d)
				reg.mu.Unlock()
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		rn.d = d
	}
	reg.push()
	t.Cleanup(func() {
		for _, rn := range nodes {
			rn.d.Close()
		}
	})
	return nodes, reg
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

func allAlive(nodes []*realNode) func() bool {
	return func() bool {
		for _, n := range nodes {
			if !n.d.Alive() {
				return false
			}
		}
		return true
	}
}

func query(d *Driver, n NodeID, inc Incarnation) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	dead, _, err := d.Query(ctx, []Question{{n, inc}})
	if err != nil {
		return false, err
	}
	return dead[0], nil
}

// TestDriverGarbageAndFence: malformed, forged (wrong key), replayed and
// foreign datagrams never crash a node or disturb liveness; when a node
// loses a majority of its observers it fences itself (the callback runs) and
// comes back with a higher, registered incarnation, and the observers report
// the old one dead.
func TestDriverGarbageAndFence(t *testing.T) {
	nodes, _ := startReal(t, 3, nil)
	eventually(t, "all alive", allAlive(nodes))
	junk, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer junk.Close()
	wrong := Key("not-the-cluster-key-0123456789ab")
	bad := [][]byte{nil, {1}, []byte("GFD2"), make([]byte, PacketSize), make([]byte, 2000),
		Packet{Kind: KindBeacon, Subject: 99, Incarnation: 1, Seq: 1}.Seal(nil, testKey),         // unknown node, foreign address
		Packet{Kind: KindEcho, Subject: 1, Incarnation: 1, Seq: 1, Observer: 9}.Seal(nil, wrong), // forged echo
		Packet{Kind: KindBeacon, Subject: 2, Incarnation: 1_000_000, Seq: 1}.Seal(nil, wrong),    // forged incarnation
		Packet{Kind: KindBeacon, Subject: 2, Incarnation: 1_000_000, Seq: 1}.Seal(nil, testKey),  // right key, wrong address
		Packet{Kind: KindBeacon, Subject: 2, Incarnation: 0xffff, Seq: 1}.Seal(nil, testKey)[:PacketSize-1],
	}
	var wg sync.WaitGroup
	for _, rn := range nodes {
		wg.Add(1)
		go func(a net.Addr) {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				junk.WriteTo(bad[i%len(bad)], a)
			}
		}(rn.conn.LocalAddr())
	}
	wg.Wait()
	time.Sleep(700 * time.Millisecond) // > GracePeriod: garbage must not fence anyone
	for i, n := range nodes {
		if n.fences.Load() != 0 || !n.d.Alive() {
			t.Fatalf("node %d disturbed by garbage: fences=%d alive=%v", i+1, n.fences.Load(), n.d.Alive())
		}
		if dead, err := query(nodes[0].d, NodeID(i+1), 1); err != nil || dead {
			t.Fatalf("node %d reported dead=%v (%v) after garbage", i+1, dead, err)
		}
	}
	if v := nodes[0].d.Views(); len(v) != 3 || v[1].Incarnation != 1 {
		t.Fatalf("observer 1 views %v: garbage created or changed entries", v)
	}
	// Node 1 loses observers 2 and 3: it must fence and take incarnation 2.
	nodes[1].d.Close()
	nodes[2].d.Close()
	eventually(t, "node 1 fences", func() bool { return nodes[0].fences.Load() >= 1 })
	if nodes[0].d.Alive() {
		t.Fatal("node 1 alive without a majority of observers")
	}
	eventually(t, "node 1 registers a new incarnation", func() bool { return nodes[0].starts.Load() >= 2 })
	inc, _ := nodes[0].d.Incarnation()
	if inc < 2 {
		t.Fatalf("node 1 incarnation %d after fence, want ≥ 2", inc)
	}
	// Observer 1 is alone: it is not in contact with a majority and must not
	// answer (its view of the others may be the stale one).
	if _, err := query(nodes[0].d, 2, 1); !errors.Is(err, ErrNoMajority) {
		t.Fatalf("isolated observer answered: %v", err)
	}
}

// slowFS delays writes (a slow disk) and can fail them.
type slowFS struct {
	*disk.Mem
	delay atomic.Int64
}

func (s *slowFS) WriteFileSync(path string, data []byte) error {
	time.Sleep(time.Duration(s.delay.Load()))
	return s.Mem.WriteFileSync(path, data)
}

// TestDriverVerdictNeedsDurableTombstone: an observer whose disk refuses
// the tombstone must not answer "dead", however often it is asked (it used
// to keep the verdict in memory and answer the retry); once the disk
// heals it answers, and a restart from that disk keeps the verdict.
func TestDriverVerdictNeedsDurableTombstone(t *testing.T) {
	disks := []*slowFS{{Mem: disk.NewMem()}, {Mem: disk.NewMem()}, {Mem: disk.NewMem()}}
	nodes, _ := startReal(t, 3, []disk.FS{disks[0], disks[1], disks[2]})
	eventually(t, "all alive", allAlive(nodes))
	disks[0].FailWrites(disk.ErrFull)
	nodes[2].d.Close() // node 3 dies; observers 1 and 2 keep a majority
	eventually(t, "observer 1 decides node 3 is dead", func() bool {
		dead, err := query(nodes[0].d, 3, 1)
		if dead {
			t.Fatal("observer 1 answered dead with a full disk")
		}
		return errors.Is(err, ErrVerdictNotDurable)
	})
	for i := 0; i < 3; i++ {
		if dead, err := query(nodes[0].d, 3, 1); dead || !errors.Is(err, ErrVerdictNotDurable) {
			t.Fatalf("attempt %d with a full disk: dead=%v err=%v", i, dead, err)
		}
	}
	disks[0].FailWrites(nil)
	if dead, err := query(nodes[0].d, 3, 1); !dead || err != nil {
		t.Fatalf("after the disk healed: dead=%v err=%v", dead, err)
	}
	tomb, err := loadTombstones(disks[0], nodes[0].d.cfg.TombstoneFile)
	if err != nil || tomb[3] != 1 {
		t.Fatalf("tombstone on disk: %v %v", tomb, err)
	}
}

// TestDriverSlowDiskKeepsBeaconing: a verdict that takes 1.5 s to persist
// (longer than GracePeriod) delays only its own answer; beacons and echoes
// never wait for the disk, so no node fences.
func TestDriverSlowDiskKeepsBeaconing(t *testing.T) {
	disks := []*slowFS{{Mem: disk.NewMem()}, {Mem: disk.NewMem()}, {Mem: disk.NewMem()}, {Mem: disk.NewMem()}}
	nodes, _ := startRealObs(t, 4, 3, []disk.FS{disks[0], disks[1], disks[2], disks[3]})
	eventually(t, "all alive", allAlive(nodes))
	nodes[3].d.Close()
	t.Log("node 4 closed")
	time.Sleep(testCfg.GracePeriod + 200*time.Millisecond)
	t.Log("disks slow")
	for _, d := range disks {
		d.delay.Store(int64(1500 * time.Millisecond))
	}
	var wg sync.WaitGroup
	for _, rn := range nodes[:3] {
		wg.Add(1)
		go func() { defer wg.Done(); query(rn.d, 4, 1) }()
	}
	wg.Wait()
	for i, n := range nodes[:3] {
		if n.fences.Load() != 0 {
			t.Fatalf("node %d fenced while its observer's disk was slow", i+1)
		}
	}
}
