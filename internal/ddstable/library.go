package ddstable

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	mrand "math/rand/v2"
	"sync"
	"time"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/meta"
	"github.com/grovestore/grove/internal/transport"
)

// MaxValue bounds one value (DDS's values were up to 8 KB in its
// benchmarks; a value travels in one message to every replica).
const MaxValue = 1 << 20

// Errors of the library's calls.
var (
	// ErrOutcomeUnknown: the put or remove may or may not have taken
	// effect (its deadline passed, or the caller's context ended, while
	// the two-phase commit was unfinished). The library does not retry
	// it: a second attempt could take effect after a later write.
	ErrOutcomeUnknown = errors.New("ddstable: the write's outcome is unknown")
	ErrTooLarge       = fmt.Errorf("ddstable: a value is at most %d bytes", MaxValue)
	ErrUnavailable    = errors.New("ddstable: no replica of the key's partition answered")
)

// LibraryConfig tunes a Library.
type LibraryConfig struct {
	Meta *meta.Client
	// Coordinator tunes each table's coordinator (Session drawn at random).
	Coordinator CoordinatorConfig
	// Tick is how often coordinators are ticked (default 20 ms).
	Tick time.Duration
	// CallTimeout bounds one message to a brick (default 1 s).
	CallTimeout time.Duration
}

// Library is DDS's library (§4: "the DDS library … acts as the two-phase
// commit coordinator for state-changing operations"): it holds soft state
// only — each table's maps, cached from the config service and repaired
// when a brick says they differ — and runs one Coordinator per table. A
// put or remove that fails (a brick said no: a conflicting write, a stale
// map, admission control) is retried until the context ends; one whose
// outcome is unknown is not. Safe for concurrent use.
type Library struct {
	cfg   LibraryConfig
	ctx   context.Context
	stop  context.CancelFunc
	wg    sync.WaitGroup
	conns transport.Pool
	book  *meta.AddressBook
	seed  maphash.Seed
	mu    struct {
		sync.Mutex
		tables map[string]*libTable
	}
}

type libTable struct {
	name    string
	coord   *Coordinator
	waiters map[OpID]chan Result
	dropped bool // the table was dropped: writes in flight can have no effect anyone sees
}

// NewLibrary starts a library.
func NewLibrary(cfg LibraryConfig) *Library {
	if cfg.Tick == 0 {
		cfg.Tick = 20 * time.Millisecond
	}
	if cfg.CallTimeout == 0 {
		cfg.CallTimeout = time.Second
	}
	if cfg.Coordinator.RetryEvery == 0 {
		cfg.Coordinator = DefaultCoordinatorConfig(0)
	}
	l := &Library{cfg: cfg, book: meta.NewAddressBook(cfg.Meta), seed: maphash.MakeSeed()}
	l.ctx, l.stop = context.WithCancel(context.Background())
	l.mu.tables = map[string]*libTable{}
	l.wg.Add(2)
	go l.ticker()
	go l.watch()
	return l
}

// watch hands the coordinators every change of the maps: an operation
// waiting for a member the detector declared dead finishes once the decree
// removing it arrives, without waiting for a brick to ask for a repair.
func (l *Library) watch() {
	defer l.wg.Done()
	for ns := range l.cfg.Meta.Watch(l.ctx, Namespace, 0) {
		ts, _ := DecodeTables(ns)
		present := map[string]bool{}
		for _, e := range ns.GetEntries() {
			present[e.Key] = true
		}
		l.mu.Lock()
		now := time.Now()
		for name, t := range l.mu.tables {
			if m, ok := ts[name]; ok {
				l.effectsLocked(t, t.coord.SetMaps(now, m))
			} else if !present[TableKey(name)] {
				l.dropLocked(t) // dropped
			}
		}
		l.mu.Unlock()
	}
}

// Close stops the library; writes in flight end with ErrOutcomeUnknown.
func (l *Library) Close() {
	l.mu.Lock()
	l.stop() // under mu: effectsLocked adds no goroutine after it
	l.mu.Unlock()
	l.wg.Wait()
	l.conns.Close()
	l.book.Close()
}

func newSession() uint64 {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return binary.LittleEndian.Uint64(b[:]) | 1
}

// table is name's coordinator, reading the maps on first use.
func (l *Library) table(ctx context.Context, name string) (*libTable, error) {
	l.mu.Lock()
	t := l.mu.tables[name]
	l.mu.Unlock()
	if t != nil {
		return t, nil
	}
	m, err := l.readMaps(ctx, name)
	if err != nil {
		return nil, err
	}
	cfg := l.cfg.Coordinator
	cfg.Session = newSession()
	co, err := NewCoordinator(cfg, m)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if t := l.mu.tables[name]; t != nil {
		return t, nil
	}
	t = &libTable{name: name, coord: co, waiters: map[OpID]chan Result{}}
	l.mu.tables[name] = t
	return t, nil
}

func (l *Library) readMaps(ctx context.Context, name string) (*Maps, error) {
	if err := CheckName(name); err != nil {
		return nil, err
	}
	ns, err := l.cfg.Meta.Read(ctx, Namespace)
	if err != nil {
		return nil, err
	}
	for _, e := range ns.GetEntries() {
		if e.Key == TableKey(name) {
			return DecodeMaps(e.Value)
		}
	}
	return nil, fmt.Errorf("%w: %q", ErrNoTable, name)
}

// repair reads name's maps again (DDS §4.2's lazy repair) and hands them
// to the coordinator. A table dropped meanwhile is forgotten.
func (l *Library) repair(ctx context.Context, t *libTable) error {
	m, err := l.readMaps(ctx, t.name)
	if errors.Is(err, ErrNoTable) {
		l.mu.Lock()
		l.dropLocked(t)
		l.mu.Unlock()
	}
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.effectsLocked(t, t.coord.SetMaps(time.Now(), m))
	return nil
}

// dropLocked forgets a dropped table: its writes in flight end Unknown.
func (l *Library) dropLocked(t *libTable) {
	if l.mu.tables[t.name] == t {
		delete(l.mu.tables, t.name)
	}
	t.dropped = true
	l.effectsLocked(t, t.coord.Drop())
}

// Drop drops table name (DropTable) and forgets it here at once: this
// library's later writes to it end "no such table" rather than landing on
// bricks whose watch has not yet seen the drop. (Another library's write
// racing with a drop may still report success there and be discarded
// with the table: see the README's limits.)
func (l *Library) Drop(ctx context.Context, name string) error {
	err := DropTable(ctx, l.cfg.Meta, name)
	if err == nil || errors.Is(err, ErrNoTable) {
		l.mu.Lock()
		if t := l.mu.tables[name]; t != nil {
			l.dropLocked(t)
		}
		l.mu.Unlock()
	}
	return err
}

// Maps are the library's copy of name's maps.
func (l *Library) Maps(ctx context.Context, name string) (*Maps, error) {
	t, err := l.table(ctx, name)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return t.coord.Maps().Clone(), nil
}

// Put sets key to value.
func (l *Library) Put(ctx context.Context, table string, key uint64, value []byte) error {
	if len(value) > MaxValue {
		return ErrTooLarge
	}
	return l.write(ctx, table, Update{Key: key, Value: value})
}

// Remove deletes key (removing an absent key succeeds).
func (l *Library) Remove(ctx context.Context, table string, key uint64) error {
	return l.write(ctx, table, Update{Key: key, Remove: true})
}

// ErrClosed: the library was closed before the call (nothing was sent).
var ErrClosed = errors.New("ddstable: the library is closed")

func (l *Library) write(ctx context.Context, table string, u Update) error {
	if l.ctx.Err() != nil {
		return ErrClosed
	}
	t, err := l.table(ctx, table)
	if err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		l.mu.Lock()
		id, e, err := t.coord.Begin(time.Now(), u)
		var ch chan Result
		if err == nil {
			ch = make(chan Result, 1)
			t.waiters[id] = ch
			l.effectsLocked(t, e)
		}
		l.mu.Unlock()
		if err != nil {
			if !l.sleep(ctx, backoff(attempt)) {
				return fmt.Errorf("%w: %w", err, ctx.Err())
			}
			continue
		}
		var r Result
		select {
		case r = <-ch:
		case <-ctx.Done():
			l.mu.Lock()
			delete(t.waiters, id)
			l.mu.Unlock()
			return fmt.Errorf("%w (%w)", ErrOutcomeUnknown, ctx.Err())
		case <-l.ctx.Done():
			return fmt.Errorf("%w (the library closed while it was in flight)", ErrOutcomeUnknown)
		}
		switch r.Outcome {
		case Succeeded:
			return nil
		case Unknown:
			l.mu.Lock()
			dropped := t.dropped
			l.mu.Unlock()
			if dropped {
				// Whatever it did went with the table's replicas: no read of
				// any table sees it.
				return fmt.Errorf("%w: %q (dropped while the write was in flight)", ErrNoTable, table)
			}
			return ErrOutcomeUnknown
		}
		// Failed: applied nowhere; try again, with the maps read again if
		// a brick's differ (newer, or none: the table dropped).
		if r.Reason == ReasonRepair || r.Reason == ReasonNotServing {
			if err := l.repair(ctx, t); err != nil {
				return err
			}
			l.mu.Lock()
			gone := l.mu.tables[table] != t
			l.mu.Unlock()
			if gone { // created again: another table, another coordinator
				if t, err = l.table(ctx, table); err != nil {
					return err
				}
			}
		}
		if !l.sleep(ctx, backoff(attempt)) {
			return fmt.Errorf("ddstable: the write was refused (%v) until the deadline: %w", r.Reason, ctx.Err())
		}
	}
}

func backoff(attempt int) time.Duration {
	d := time.Duration(2+mrand.IntN(8)) * time.Millisecond << min(attempt, 5)
	return min(d, 300*time.Millisecond)
}

func (l *Library) sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	case <-l.ctx.Done():
		return false
	}
}

// Get reads key from one replica of its group: first the key's preferred
// replica (a hash of the key over the group, so that replicas' caches
// hold different keys, as DDS's LARD does), then the others.
func (l *Library) Get(ctx context.Context, table string, key uint64) ([]byte, bool, error) {
	t, err := l.table(ctx, table)
	if err != nil {
		return nil, false, err
	}
	for attempt := 0; ; attempt++ {
		l.mu.Lock()
		m := t.coord.Maps()
		stamp := t.coord.Stamp() // (encoding the maps per read cost the whole table's size)
		_, g := m.Group(key)
		g = append([]BrickID(nil), g...)
		l.mu.Unlock()
		first := int(maphash.Comparable(l.seed, key) % uint64(len(g)))
		repair := false
		for i := range g {
			b := g[(first+i)%len(g)]
			r, err := l.get(ctx, table, b, key, stamp)
			if err != nil {
				continue
			}
			switch r.Result {
			case pb.TableGetResponse_RESULT_OK:
				return r.Value, r.Found, nil
			case pb.TableGetResponse_RESULT_REPAIR, pb.TableGetResponse_RESULT_NOT_SERVING:
				if st := stampOf(r.Stamp); st.Epoch > stamp.Epoch || st == (Stamp{}) {
					repair = true // newer maps there, or none: read them again
				}
			}
		}
		if !l.sleep(ctx, backoff(attempt)) {
			return nil, false, fmt.Errorf("%w: %w", ErrUnavailable, ctx.Err())
		}
		if repair || attempt%4 == 3 { // a decree may have moved the group
			if err := l.repair(ctx, t); err != nil {
				return nil, false, err
			}
			l.mu.Lock()
			gone := l.mu.tables[table] != t
			l.mu.Unlock()
			if gone {
				if t, err = l.table(ctx, table); err != nil {
					return nil, false, err
				}
			}
		}
	}
}

func (l *Library) get(ctx context.Context, table string, b BrickID, key uint64, stamp Stamp) (*pb.TableGetResponse, error) {
	cl, err := l.client(ctx, b.Node)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, l.cfg.CallTimeout)
	defer cancel()
	return cl.Get(cctx, &pb.TableGetRequest{Table: table, To: brickPB(b), Key: key, Stamp: stampPB(stamp)})
}

func (l *Library) client(ctx context.Context, node uint64) (pb.TableServiceClient, error) {
	return dialBrick(ctx, l.book, &l.conns, node)
}

// effectsLocked sends the coordinator's messages and hands out results.
func (l *Library) effectsLocked(t *libTable, e CoordEffects) {
	for _, snd := range e.Sends {
		if l.ctx.Err() != nil {
			break
		}
		l.wg.Add(1)
		go l.send(t, snd)
	}
	for _, r := range e.Results {
		if ch, ok := t.waiters[r.Op]; ok {
			ch <- r
			delete(t.waiters, r.Op)
		}
	}
}

func (l *Library) send(t *libTable, snd Send) {
	defer l.wg.Done()
	ctx, cancel := context.WithTimeout(l.ctx, l.cfg.CallTimeout)
	defer cancel()
	cl, err := l.client(ctx, snd.To.Node)
	if err != nil {
		return // sent again at a later tick
	}
	if p := snd.Prepare; p != nil {
		v, err := cl.Prepare(ctx, PrepareRequest(t.name, snd.To, p))
		if err != nil {
			return
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		l.effectsLocked(t, t.coord.OnVote(time.Now(), snd.To, p.Op, Vote{Yes: v.Yes, Reason: reasonOf(v.Reason), Stamp: stampOf(v.Stamp)}))
		return
	}
	d := snd.Decide
	a, err := cl.Decide(ctx, &pb.TableDecideRequest{Table: t.name, To: brickPB(snd.To), Op: opPB(d.Op), Partition: partPB(d.Partition),
		Commit: d.Commit, Done: d.Done, Digest: d.Digest, Epoch: d.Epoch})
	if err != nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.effectsLocked(t, t.coord.OnAck(time.Now(), snd.To, d.Op, Ack{State: stateOf(a.State), Later: a.Later}))
}

func (l *Library) ticker() {
	defer l.wg.Done()
	tk := time.NewTicker(l.cfg.Tick)
	defer tk.Stop()
	for {
		select {
		case <-l.ctx.Done():
			return
		case <-tk.C:
		}
		l.mu.Lock()
		now := time.Now()
		for _, t := range l.mu.tables {
			l.effectsLocked(t, t.coord.Tick(now))
		}
		l.mu.Unlock()
	}
}
