package fd

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/grovestore/grove/internal/disk"
)

// Clock is the driver's time source. Real nodes use the monotonic clock
// inside time.Now; tests inject their own.
type Clock interface{ Now() time.Time }

// RealClock reads time.Now (whose monotonic reading only moves forward).
type RealClock struct{}

func (RealClock) Now() time.Time { return time.Now() }

// DriverConfig wires the protocol core to a node.
type DriverConfig struct {
	Config Config
	Self   NodeID
	// ObserverAddrs maps each observer to its beacon (UDP) address.
	ObserverAddrs map[NodeID]string
	Conn          net.PacketConn // the node's beacon socket
	Clock         Clock
	Log           *slog.Logger
	// Observe makes this node an observer. Known tells which node ids are
	// cluster members; TombstoneFile is where verdicts are persisted.
	Observe       bool
	Known         func(NodeID) bool
	TombstoneFile string
	Disk          disk.FS // where tombstones are persisted (default disk.OS)
	// NewIncarnation returns the next incarnation, already persisted. It is
	// called at start and after every self-fence.
	NewIncarnation func() (Incarnation, error)
	// OnFence runs, synchronously and before the next incarnation starts,
	// when incarnation inc fences itself. Lease-protected services stop here.
	// It runs on the driver's goroutine without the driver's lock held.
	OnFence func(inc Incarnation)
	// OnIncarnation runs when a new incarnation starts (to register it).
	OnIncarnation func(inc Incarnation)
	// OnDriver receives the driver before the first incarnation starts, so
	// that callbacks can reach it (for Alive) before StartDriver returns.
	OnDriver func(*Driver)
}

// Driver runs the failure detector for one node: it beacons, echoes (when an
// observer), answers queries, and fences the node when it must.
type Driver struct {
	cfg   DriverConfig
	log   *slog.Logger
	addrs map[NodeID]net.Addr
	done  chan struct{}
	wg    sync.WaitGroup
	// rejected rate-limits "rejected datagram" log lines per reason.
	rejected struct {
		sync.Mutex
		last map[string]time.Time
	}
	mu struct {
		sync.Mutex
		subj *Subject
		obs  *Observer
	}
}

// StartDriver starts beaconing (and observing) at once.
func StartDriver(cfg DriverConfig) (*Driver, error) {
	if err := cfg.Config.Validate(); err != nil {
		return nil, err
	}
	if cfg.Clock == nil {
		cfg.Clock = RealClock{}
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Disk == nil {
		cfg.Disk = disk.OS{}
	}
	d := &Driver{cfg: cfg, log: cfg.Log.With("layer", "fd", "node", cfg.Self), addrs: map[NodeID]net.Addr{}, done: make(chan struct{})}
	for _, o := range cfg.Config.Observers {
		a, err := net.ResolveUDPAddr("udp", cfg.ObserverAddrs[o])
		if err != nil {
			return nil, fmt.Errorf("fd: observer %d address %q: %w", o, cfg.ObserverAddrs[o], err)
		}
		d.addrs[o] = a
	}
	inc, err := cfg.NewIncarnation()
	if err != nil {
		return nil, err
	}
	now := cfg.Clock.Now()
	d.mu.subj = NewSubject(cfg.Config, cfg.Self, inc, now)
	if cfg.Observe {
		tomb, err := loadTombstones(cfg.Disk, cfg.TombstoneFile)
		if err != nil {
			return nil, err
		}
		d.mu.obs = NewObserver(cfg.Self, cfg.Config.GracePeriod, now, tomb, cfg.Known)
	}
	if cfg.OnDriver != nil {
		cfg.OnDriver(d)
	}
	if cfg.OnIncarnation != nil {
		cfg.OnIncarnation(inc)
	}
	d.wg.Add(2)
	go d.tickLoop()
	go d.readLoop()
	return d, nil
}

// Close stops the driver. The node stops beaconing; observers will declare
// it dead after GracePeriod.
func (d *Driver) Close() {
	select {
	case <-d.done:
		return
	default:
	}
	close(d.done)
	d.cfg.Conn.Close()
	d.wg.Wait()
}

// Alive reports whether this node may act under its leases now. It reads the
// clock itself: a process that was paused past its deadline sees itself dead
// on the first check after it wakes.
func (d *Driver) Alive() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.mu.subj.Alive(d.cfg.Clock.Now())
}

// Incarnation is the current incarnation and its phase.
func (d *Driver) Incarnation() (Incarnation, Phase) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.mu.subj.Incarnation(), d.mu.subj.Phase(d.cfg.Clock.Now())
}

// ErrNotObserver is returned by Query on a node that does not observe.
var ErrNotObserver = errors.New("fd: this node is not an observer")

// Query answers "is (node, inc) dead?" for each subject, persisting any new
// tombstone before returning (the durability contract of Observer.Query).
func (d *Driver) Query(nodes []NodeID, incs []Incarnation) ([]bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.mu.obs == nil {
		return nil, ErrNotObserver
	}
	now := d.cfg.Clock.Now()
	out := make([]bool, len(nodes))
	persist := false
	for i := range nodes {
		var p bool
		out[i], p = d.mu.obs.Query(now, nodes[i], incs[i])
		persist = persist || p
	}
	if persist {
		if err := saveTombstones(d.cfg.Disk, d.cfg.TombstoneFile, d.mu.obs.Tombstones()); err != nil {
			return nil, fmt.Errorf("fd: persist verdict: %w", err)
		}
	}
	return out, nil
}

// Views returns this observer's view of every node (nil if not observing).
func (d *Driver) Views() []View {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.mu.obs == nil {
		return nil
	}
	return d.mu.obs.Views(d.cfg.Clock.Now())
}

// tickLoop beacons every Interval and notices the deadline. It wakes four
// times per interval so that a fence takes effect promptly; Alive() does not
// depend on it, since it reads the clock.
func (d *Driver) tickLoop() {
	defer d.wg.Done()
	t := time.NewTicker(d.cfg.Config.Interval / 4)
	defer t.Stop()
	for {
		d.tick()
		select {
		case <-d.done:
			return
		case <-t.C:
		}
	}
}

func (d *Driver) tick() {
	d.mu.Lock()
	b, send, fenced := d.mu.subj.Tick(d.cfg.Clock.Now())
	old := d.mu.subj.Incarnation()
	d.mu.Unlock()
	if fenced {
		// Callbacks run without d.mu: fence hooks take their own locks and
		// may call Alive (which takes d.mu) from other goroutines. The
		// subject is fenced already, so Alive is false throughout.
		d.log.Warn("self-fence: no acknowledgement from a majority of observers within the grace period", "incarnation", old)
		if d.cfg.OnFence != nil {
			d.cfg.OnFence(old)
		}
		inc, err := d.cfg.NewIncarnation()
		if err != nil {
			// Without a persisted incarnation the node must not come back.
			d.log.Error("cannot persist a new incarnation; staying fenced", "err", err)
			return
		}
		d.mu.Lock()
		d.mu.subj = NewSubject(d.cfg.Config, d.cfg.Self, inc, d.cfg.Clock.Now())
		b, send, _ = d.mu.subj.Tick(d.cfg.Clock.Now())
		d.mu.Unlock()
		d.log.Info("back with a new incarnation", "incarnation", inc)
		if d.cfg.OnIncarnation != nil {
			d.cfg.OnIncarnation(inc)
		}
	}
	if send {
		buf := b.Encode(nil)
		for _, a := range d.addrs {
			d.cfg.Conn.WriteTo(buf, a)
		}
	}
}

func (d *Driver) readLoop() {
	defer d.wg.Done()
	buf := make([]byte, 2*PacketSize)
	for {
		n, from, err := d.cfg.Conn.ReadFrom(buf)
		if err != nil {
			select {
			case <-d.done:
				return
			default:
			}
			d.log.Warn("beacon socket read", "err", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		p, err := Decode(buf[:n])
		if err != nil {
			d.reject("malformed datagram", from, err)
			continue
		}
		d.handle(p, from)
	}
}

func (d *Driver) handle(p Packet, from net.Addr) {
	d.mu.Lock()
	now := d.cfg.Clock.Now()
	switch p.Kind {
	case KindBeacon:
		if d.mu.obs == nil {
			d.mu.Unlock()
			d.log.Debug("beacon to a non-observer", "from", from)
			return
		}
		e, err := d.mu.obs.Beacon(now, p)
		d.mu.Unlock()
		if err != nil {
			d.reject("beacon refused", from, err)
			return
		}
		d.cfg.Conn.WriteTo(e.Encode(nil), from)
	case KindEcho:
		err := d.mu.subj.Echo(now, p)
		d.mu.Unlock()
		if err != nil && !errors.Is(err, ErrUnknownSeq) {
			d.reject("echo ignored", from, err)
		}
	default:
		d.mu.Unlock()
	}
}

// reject logs a rejected datagram with its reason, at most once a second
// per reason, so that a flood of bad packets cannot flood the log.
func (d *Driver) reject(what string, from net.Addr, err error) {
	root := err // rate-limit by the innermost (sentinel) error
	for u := errors.Unwrap(root); u != nil; u = errors.Unwrap(root) {
		root = u
	}
	key := what + ": " + root.Error()
	d.rejected.Lock()
	if d.rejected.last == nil {
		d.rejected.last = map[string]time.Time{}
	}
	now := time.Now()
	if now.Sub(d.rejected.last[key]) < time.Second {
		d.rejected.Unlock()
		return
	}
	d.rejected.last[key] = now
	d.rejected.Unlock()
	d.log.Warn(what, "from", from, "reason", err)
}

func loadTombstones(d disk.FS, path string) (map[NodeID]Incarnation, error) {
	b, err := d.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var m map[NodeID]Incarnation
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("fd: tombstone file %s is corrupt: %w", path, err)
	}
	return m, nil
}

// saveTombstones persists the verdicts atomically and durably.
func saveTombstones(d disk.FS, path string, m map[NodeID]Incarnation) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return d.WriteFileSync(path, b)
}
