package fd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/grovestore/grove/internal/disk"
	"github.com/grovestore/grove/internal/metrics"
	"github.com/grovestore/grove/internal/ratelog"
)

// Clock is the driver's time source. Real nodes use the monotonic clock
// inside time.Now; tests inject their own.
type Clock interface{ Now() time.Time }

// RealClock reads time.Now (whose monotonic reading only moves forward).
type RealClock struct{}

func (RealClock) Now() time.Time { return time.Now() }

// DriverConfig wires the Engine to a node's socket, disk and config service.
type DriverConfig struct {
	Engine EngineConfig
	// ObserverAddrs maps each observer to its beacon (UDP) address.
	ObserverAddrs map[NodeID]string
	Conn          net.PacketConn // the node's beacon socket
	Clock         Clock
	Log           *slog.Logger
	Disk          disk.FS // where incarnations and tombstones persist (default disk.OS)
	// IncarnationFile holds the node's last incarnation; TombstoneFile the
	// observer's verdicts.
	IncarnationFile string
	TombstoneFile   string
	// Registered reads (linearizably) the incarnation the config service
	// has registered for this node (0 if none). Register records a new one;
	// it must return an error wrapping ErrIncarnationTaken when the
	// config service already holds that incarnation (from another life) or
	// a newer one.
	Registered func(ctx context.Context) (Incarnation, error)
	Register   func(ctx context.Context, inc Incarnation) error
	// OnFence runs, synchronously and before the next incarnation starts,
	// when incarnation inc fences itself. Lease-protected services stop here.
	// It runs without the driver's lock held.
	OnFence func(inc Incarnation)
	// OnIncarnation runs when a new incarnation is registered and starts.
	OnIncarnation func(inc Incarnation)
	// OnDriver receives the driver before the first incarnation starts, so
	// that callbacks can reach it (for Alive) before StartDriver returns.
	OnDriver func(*Driver)
	// Metrics counts datagrams, fences, answers and tombstone writes (nil:
	// none).
	Metrics *metrics.Node
	// Clocks reads the clocks a ClockGuard compares. Nil: ReadClocks if
	// Clock is RealClock (or nil) on Linux, else no guard (a test's own
	// clock).
	Clocks func() (ClockSample, bool)
}

// kindLabel names a datagram's kind for metrics (byte 4 of the format).
func kindLabel(b []byte) string {
	if len(b) > 4 {
		switch Kind(b[4]) {
		case KindBeacon:
			return "beacon"
		case KindEcho:
			return "echo"
		}
	}
	return "other"
}

// Registration is what the driver needs to know of one registered node.
type Registration struct {
	Incarnation Incarnation
	BeaconAddr  string
}

// Driver runs the failure detector for one node: it carries out its
// Engine's effects (UDP, disk, config service) and feeds it packets, ticks
// and completions. Beacon and echo handling never waits for the disk or the
// config service: those run on their own goroutines.
type Driver struct {
	cfg  DriverConfig
	log  *slog.Logger
	done chan struct{}
	wg   sync.WaitGroup
	// wgMu orders async's Add after a Close's Wait began (a resignation
	// from another role can reach async from outside the driver's
	// goroutines): Close closes done under it, async adds only before.
	wgMu     sync.Mutex
	rejected *ratelog.Limiter       // "datagram dropped" lines, per reason
	writes   chan PersistTombstones // the tombstone writer's queue (one in flight)
	mu       struct {
		sync.Mutex
		e       *Engine
		addrs   map[NodeID]*net.UDPAddr // where to send: observers and registered nodes
		byAddr  map[string]NodeID       // who sent: source address → node
		answers map[QueryID]chan Answer
		nextQID QueryID
		// guard checks the clock's rate (nil: no guard); resigned is
		// the last untrusted episode whose incarnation was given up.
		guard    *ClockGuard
		resigned uint64
		// read is when the guard last had a reading (its Mono).
		read time.Time
	}
}

// StartDriver loads the node's persisted state and starts taking its first
// incarnation at once; it beacons once that incarnation is registered.
func StartDriver(cfg DriverConfig) (*Driver, error) {
	if cfg.Clock == nil {
		cfg.Clock = RealClock{}
	}
	if _, real := cfg.Clock.(RealClock); cfg.Clocks == nil && real && clocksReadable {
		cfg.Clocks = ReadClocks
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Disk == nil {
		cfg.Disk = disk.OS{}
	}
	if cfg.Registered == nil || cfg.Register == nil {
		return nil, errors.New("fd: driver needs Registered and Register")
	}
	last, err := LoadIncarnation(cfg.Disk, cfg.IncarnationFile)
	if err != nil {
		return nil, err
	}
	var tomb map[NodeID]Incarnation
	if cfg.Engine.Observe {
		if tomb, err = loadTombstones(cfg.Disk, cfg.TombstoneFile); err != nil {
			return nil, err
		}
	}
	e, err := NewEngine(cfg.Engine, cfg.Clock.Now(), last, tomb)
	if err != nil {
		return nil, err
	}
	d := &Driver{cfg: cfg, log: cfg.Log.With("layer", "fd"), done: make(chan struct{}), writes: make(chan PersistTombstones, 1),
		rejected: ratelog.New(time.Second)}
	d.mu.e = e
	d.mu.addrs = map[NodeID]*net.UDPAddr{}
	d.mu.byAddr = map[string]NodeID{}
	d.mu.answers = map[QueryID]chan Answer{}
	if cfg.Clocks != nil {
		// A host whose clocks cannot be read together within 20 µs
		// (system calls that slow) runs without the guard, said once.
		read := false
		for i := 0; i < 10 && !read; i++ {
			_, read = cfg.Clocks()
		}
		if read {
			d.mu.guard = NewClockGuard(cfg.Engine.MaxDrift, 2*cfg.Engine.GracePeriod)
		} else {
			d.log.Warn("clock guard off: CLOCK_MONOTONIC, CLOCK_MONOTONIC_RAW and CLOCK_BOOTTIME cannot be read within 20 µs of each other here; the clock's rate is assumed within max_drift")
		}
	}
	for _, o := range cfg.Engine.Observers {
		a, err := net.ResolveUDPAddr("udp", cfg.ObserverAddrs[o])
		if err != nil {
			return nil, fmt.Errorf("fd: observer %d address %q: %w", o, cfg.ObserverAddrs[o], err)
		}
		d.mu.addrs[o] = a
		d.mu.byAddr[a.String()] = o
	}
	if cfg.OnDriver != nil {
		cfg.OnDriver(d)
	}
	d.wg.Add(3)
	go d.tickLoop()
	go d.readLoop()
	go d.writer()
	d.step(func(e *Engine, now time.Time) []any { return e.Start(now) })
	return d, nil
}

// Close stops the driver. The node stops beaconing; observers will declare
// it dead after GracePeriod.
func (d *Driver) Close() {
	d.wgMu.Lock()
	if d.closed() {
		d.wgMu.Unlock()
		return
	}
	close(d.done)
	d.wgMu.Unlock()
	d.cfg.Conn.Close()
	d.wg.Wait()
}

func (d *Driver) closed() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

// step runs fn on the engine under the lock, then carries out its effects in
// order without the lock.
func (d *Driver) step(fn func(e *Engine, now time.Time) []any) {
	d.mu.Lock()
	out := fn(d.mu.e, d.cfg.Clock.Now())
	d.mu.Unlock()
	d.exec(out)
}

func (d *Driver) exec(out []any) {
	for _, o := range out {
		switch x := o.(type) {
		case Send:
			d.mu.Lock()
			a := d.mu.addrs[x.To]
			d.mu.Unlock()
			if a != nil {
				d.cfg.Conn.WriteTo(x.Bytes, a)
				if m := d.cfg.Metrics; m != nil {
					metrics.IncL(m.FDSent, kindLabel(x.Bytes))
				}
			}
		case Answer:
			d.mu.Lock()
			ch := d.mu.answers[x.Query]
			delete(d.mu.answers, x.Query)
			d.mu.Unlock()
			if ch != nil {
				ch <- x
			}
			if m := d.cfg.Metrics; m != nil {
				switch {
				case x.Err != nil:
					metrics.IncL(m.FDVerdicts, "refused")
				default:
					for _, dead := range x.Dead {
						if dead {
							metrics.IncL(m.FDVerdicts, "dead")
						} else {
							metrics.IncL(m.FDVerdicts, "alive")
						}
					}
				}
			}
		case PersistTombstones:
			d.writes <- x // the engine has at most one in flight: never blocks
		case SelfFence:
			// The subject is fenced already, so Alive is false throughout.
			if x.Why != "" {
				d.log.Warn("self-fence: the node gives its incarnation up", "incarnation", x.Inc, "why", x.Why)
			} else {
				d.log.Warn("self-fence: no acknowledgement from a majority of observers within the grace period", "incarnation", x.Inc)
			}
			if m := d.cfg.Metrics; m != nil {
				metrics.Inc(m.FDSelfFences)
				metrics.Set(m.FDIncarnation, 0)
			}
			if d.cfg.OnFence != nil {
				d.cfg.OnFence(x.Inc)
			}
		case Acknowledged:
			d.log.Info("incarnation acknowledged by a majority of observers", "incarnation", x.Inc)
		case Started:
			d.log.Info("incarnation registered and beaconing", "incarnation", x.Inc)
			if m := d.cfg.Metrics; m != nil {
				metrics.Set(m.FDIncarnation, float64(x.Inc))
			}
			if d.cfg.OnIncarnation != nil {
				d.cfg.OnIncarnation(x.Inc)
			}
		case ReadRegistered:
			d.async(func(ctx context.Context) func(*Engine, time.Time) []any {
				inc, err := d.cfg.Registered(ctx)
				if err != nil {
					d.log.Warn("cannot read this node's registration; will retry", "err", err)
				}
				return func(e *Engine, now time.Time) []any { return e.RegisteredRead(now, inc, err) }
			})
		case PersistIncarnation:
			d.async(func(ctx context.Context) func(*Engine, time.Time) []any {
				err := SaveIncarnation(d.cfg.Disk, d.cfg.IncarnationFile, x.Inc)
				if err != nil {
					d.log.Error("cannot persist a new incarnation; the node stays down until it can", "incarnation", x.Inc, "err", err)
				}
				return func(e *Engine, now time.Time) []any { return e.IncarnationPersisted(now, x.Inc, err) }
			})
		case Register:
			d.async(func(ctx context.Context) func(*Engine, time.Time) []any {
				err := d.cfg.Register(ctx, x.Inc)
				if err != nil && !errors.Is(err, ErrIncarnationTaken) {
					d.log.Warn("registration failed; will retry", "incarnation", x.Inc, "err", err)
				}
				return func(e *Engine, now time.Time) []any { return e.RegisterDone(now, x.Inc, err) }
			})
		}
	}
}

// async runs one incarnation step's I/O off the driver's lock, then feeds
// its completion to the engine.
func (d *Driver) async(io func(ctx context.Context) func(*Engine, time.Time) []any) {
	d.wgMu.Lock()
	if d.closed() {
		d.wgMu.Unlock()
		return
	}
	d.wg.Add(1)
	d.wgMu.Unlock()
	go func() {
		defer d.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		go func() {
			select {
			case <-d.done:
				cancel()
			case <-ctx.Done():
			}
		}()
		k := io(ctx)
		if !d.closed() {
			d.step(k)
		}
	}()
}

// writer persists tombstones, one write at a time, off the beacon path.
func (d *Driver) writer() {
	defer d.wg.Done()
	for {
		select {
		case <-d.done:
			return
		case p := <-d.writes:
			err := saveTombstones(d.cfg.Disk, d.cfg.TombstoneFile, p.Tombstones)
			if m := d.cfg.Metrics; m != nil && err == nil {
				metrics.Inc(m.FDTombstones)
			}
			if err != nil {
				d.log.Error("cannot persist a verdict; not answering dead until it is durable", "err", err)
			}
			d.step(func(e *Engine, now time.Time) []any { return e.TombstonesPersisted(now, p, err) })
		}
	}
}

// Alive reports whether this node may act under its leases now. It reads the
// clock itself: a process that was paused past its deadline sees itself dead
// on the first check after it wakes.
func (d *Driver) Alive() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.clockTrustedLocked(false) && d.mu.e.Alive(d.cfg.Clock.Now())
}

// clockTrustedLocked reads the clocks and asks the guard whether the
// clock is trusted now (always, without a guard). keep: a tick's reading,
// kept by the guard. A check between ticks reuses the last answer if the
// guard had a reading less than clockRecheck ago: the services ask at
// every step of their engines (an RLDev's, a chunk manager's), and a
// reading costs two system calls (about 1.3 µs a check with them, under
// the lock). A reading that could not be taken (ReadClocks preempted
// three times) is skipped, and the last answer stands: the ticks are
// what catch a fault, the checks between them only sooner.
func (d *Driver) clockTrustedLocked(keep bool) bool {
	g := d.mu.guard
	if g == nil {
		return true
	}
	if !keep && !d.mu.read.IsZero() && d.cfg.Clock.Now().Sub(d.mu.read) < clockRecheck {
		return g.trusted
	}
	s, ok := d.cfg.Clocks()
	if !ok {
		if keep {
			if ok, n := d.rejected.Allow("clock reading"); ok {
				d.log.Warn("clock guard: the clocks could not be read together (preempted between them); reading skipped", "skipped before", n)
			}
		}
		return g.trusted
	}
	d.mu.read = s.Mono
	ok, _ = g.Check(s, keep)
	return ok
}

// clockRecheck is how long a check between ticks reuses the guard's last
// answer: a slew at MaxSlewRate moves the clock 0.1 ms in it, well inside
// LeaseMargin.
const clockRecheck = time.Millisecond

// Resign gives incarnation inc up now (Engine.Resign).
func (d *Driver) Resign(inc Incarnation, why string) {
	d.step(func(e *Engine, now time.Time) []any { return e.Resign(now, inc, why) })
}

// AliveAs reports whether incarnation inc is the node's running incarnation
// and alive now.
func (d *Driver) AliveAs(inc Incarnation) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.clockTrustedLocked(false) && d.mu.e.AliveAs(d.cfg.Clock.Now(), inc)
}

// Deadline returns the local time until which incarnation inc is
// guaranteed alive (no dead verdict on it can come before), if it is the
// running incarnation and alive now.
func (d *Driver) Deadline(inc Incarnation) (time.Time, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.clockTrustedLocked(false) {
		return time.Time{}, false
	}
	dl, ok := d.mu.e.Deadline(d.cfg.Clock.Now(), inc)
	if ok && d.mu.guard != nil {
		dl = dl.Add(-LeaseMargin(d.cfg.Engine.Interval)) // see MaxSlewRate
	}
	return dl, ok
}

// Incarnation is the current incarnation and its phase.
func (d *Driver) Incarnation() (Incarnation, Phase) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.mu.e.Incarnation(d.cfg.Clock.Now())
}

// SetMembership gives the driver the registered nodes as of a version of the
// config service's membership namespace (older versions are ignored): the observer echoes only their registered
// incarnations, to their registered beacon addresses, and accepts beacons
// only from those addresses.
func (d *Driver) SetMembership(version uint64, regs map[NodeID]Registration) {
	// The addresses are resolved before the lock is taken: a beacon
	// address may be a host name, and a slow resolver must not hold up
	// the ticks, beacons, echoes and Alive checks that take the lock (a
	// healthy node fenced itself in outside review 110's test).
	incs := map[NodeID]Incarnation{}
	addrs := map[NodeID]*net.UDPAddr{}
	for n, r := range regs {
		incs[n] = r.Incarnation
		if a, err := net.ResolveUDPAddr("udp", r.BeaconAddr); err == nil {
			addrs[n] = a
		}
	}
	d.mu.Lock()
	if version <= d.mu.e.MembershipVersion() {
		d.mu.Unlock() // not newer than the one installed (perhaps while this one resolved)
		return
	}
	for n, a := range addrs {
		if old := d.mu.addrs[n]; old != nil && d.mu.byAddr[old.String()] == n {
			delete(d.mu.byAddr, old.String())
		}
		d.mu.addrs[n] = a
		d.mu.byAddr[a.String()] = n
	}
	d.mu.e.SetRegistered(d.cfg.Clock.Now(), version, incs)
	d.mu.Unlock()
}

// Query answers "is (node, inc) dead?" for each subject. A new "dead" answer
// is returned only once its tombstone is durable (the durability contract of
// Observer.Query); ErrNoMajority means this observer does not answer.
func (d *Driver) Query(ctx context.Context, qs []Question) (dead, heard []bool, err error) {
	ch := make(chan Answer, 1)
	d.mu.Lock()
	d.mu.nextQID++
	id := d.mu.nextQID
	d.mu.answers[id] = ch
	d.mu.Unlock()
	d.step(func(e *Engine, now time.Time) []any {
		if !d.clockTrustedLocked(false) {
			// The silences it would judge were measured on a clock
			// that ran outside the drift bound.
			return []any{Answer{Query: id, Err: ErrClockUntrusted}}
		}
		return e.Query(now, id, qs)
	})
	select {
	case a := <-ch:
		return a.Dead, a.Heard, a.Err
	case <-ctx.Done():
		d.mu.Lock()
		delete(d.mu.answers, id)
		d.mu.e.CancelQuery(id)
		d.mu.Unlock()
		return nil, nil, ctx.Err()
	case <-d.done:
		return nil, nil, errors.New("fd: driver stopped")
	}
}

// Views returns this observer's view of every node (nil if not observing).
func (d *Driver) Views() []View {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.mu.e.Views(d.cfg.Clock.Now())
}

// tickLoop drives beacons four times per interval, so that a fence takes
// effect promptly; Alive() does not depend on it, since it reads the clock.
func (d *Driver) tickLoop() {
	defer d.wg.Done()
	t := time.NewTicker(d.cfg.Engine.Interval / 4)
	defer t.Stop()
	for {
		select {
		case <-d.done:
			return
		case <-t.C:
		}
		d.step(func(e *Engine, now time.Time) []any {
			out := e.Tick(now)
			if g := d.mu.guard; g != nil {
				was := g.trusted
				ok := d.clockTrustedLocked(true)
				switch {
				case !ok && g.Episode() > d.mu.resigned:
					// Its deadlines were measured on that clock:
					// every role stops, and the next incarnation's
					// leases count once the clock is trusted again.
					d.mu.resigned = g.Episode()
					if m := d.cfg.Metrics; m != nil {
						metrics.Inc(m.FDClockBad)
					}
					inc, _ := e.Incarnation(now)
					d.log.Error("clock untrusted: giving the incarnation up; no lease and no verdict until it is trusted again",
						"incarnation", inc, "why", g.why, "for", g.window)
					out = append(out, e.Resign(now, inc, "clock untrusted: "+g.why)...)
				case ok && !was:
					d.log.Warn("clock trusted again")
				}
			}
			return out
		})
	}
}

func (d *Driver) readLoop() {
	defer d.wg.Done()
	buf := make([]byte, 2*PacketSize)
	for {
		n, from, err := d.cfg.Conn.ReadFrom(buf)
		if err != nil {
			if d.closed() {
				return
			}
			d.log.Warn("beacon socket read", "err", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		var rerr error
		b := buf[:n]
		d.step(func(e *Engine, now time.Time) []any {
			src := d.mu.byAddr[from.String()]
			out, err := e.Receive(now, src, b)
			rerr = err
			return out
		})
		if m := d.cfg.Metrics; m != nil {
			if rerr == nil {
				metrics.IncL(m.FDReceived, kindLabel(b))
			} else {
				metrics.IncL(m.FDDropped, rootError(rerr))
			}
		}
		switch {
		case rerr == nil, errors.Is(rerr, ErrUnknownSeq), errors.Is(rerr, ErrStaleSeq):
		case errors.Is(rerr, ErrUnknownNode), errors.Is(rerr, ErrUnregistered), errors.Is(rerr, ErrOldIncarnation),
			errors.Is(rerr, ErrDeclaredDead), errors.Is(rerr, ErrNotMine), errors.Is(rerr, ErrPreexisting):
			// Membership moves: a registration this observer has not seen
			// yet, a life that just ended. Expected; not worth a warning.
			d.log.Debug("datagram dropped", "from", from, "reason", rerr)
		default:
			d.reject(from, rerr) // malformed, forged, or from the wrong address
		}
	}
}

// reject logs a rejected datagram with its reason, at most once a second
// per reason, so that a flood of bad packets cannot flood the log.
func (d *Driver) reject(from net.Addr, err error) {
	if ok, n := d.rejected.Allow(rootError(err)); ok { // by the innermost (sentinel) error
		d.log.Warn("datagram dropped", "from", from, "reason", err, "suppressed", n)
	}
}

// rootError is the innermost error's text: the sentinel that names a
// datagram's rejection reason (a small, fixed set, fit for a metric label).
func rootError(err error) string {
	for u := errors.Unwrap(err); u != nil; u = errors.Unwrap(err) {
		err = u
	}
	return err.Error()
}

// LoadIncarnation reads the last persisted incarnation (0 if none).
func LoadIncarnation(d disk.FS, path string) (Incarnation, error) {
	b, err := d.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("incarnation file %s is corrupt: %w", path, err)
	}
	return Incarnation(v), nil
}

// SaveIncarnation persists inc durably before it is used: an incarnation is
// never used twice, even across crashes.
func SaveIncarnation(d disk.FS, path string, inc Incarnation) error {
	if err := d.WriteFileSync(path, []byte(strconv.FormatUint(uint64(inc), 10)+"\n")); err != nil {
		return fmt.Errorf("persist incarnation: %w", err)
	}
	return nil
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
