// Package meta is the config service (Boxwood's "Paxos service", §3.1): a
// replicated state machine on hashicorp/raft holding one namespace of state
// per internal service, changed only by decrees that are applied one at a
// time, in one order, and only if the namespace is still at the version the
// proposer read. Only joins, failures and reconfigurations go through it.
package meta

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"sync"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	pb "github.com/grovestore/grove/api/grovepb"
)

// Limits on decrees. A decree over a limit is rejected whole.
const (
	MaxNamespaceLen = 64
	MaxKeyLen       = 256
	MaxValueLen     = 64 << 10
	MaxOps          = 1024
	MaxDecreeSize   = 1 << 20
	MaxDecreeIDLen  = 64
)

// Errors a decree can meet. They are values, returned to the proposer.
var (
	ErrStaleVersion = errors.New("meta: stale version: the namespace changed since it was read; re-read and retry")
	ErrBadDecree    = errors.New("meta: malformed decree")
	ErrNotLeader    = errors.New("meta: not the leader")
)

// ApplyResult is what FSM.Apply returns for each log entry.
type ApplyResult struct {
	Version uint64 // namespace version after the decree (current one if stale)
	Err     error  // nil, ErrStaleVersion, or ErrBadDecree-wrapped
	// Duplicate: the decree had been applied already (a resend of one
	// whose answer was lost); Version is the version it produced then,
	// and nothing changed now.
	Duplicate bool
}

// RecentDecreeIDs bounds the decree ids an FSM remembers per namespace:
// a resent decree is recognised as applied if at most this many decrees
// of its namespace followed it (a client's resend comes within seconds;
// the busiest namespaces see a few decrees per second). Beyond that the
// resend is answered "stale" as before, and its proposer re-reads.
const RecentDecreeIDs = 256

// History bounds the recent decrees an FSM keeps per namespace so that a
// watch can send each change as its ops rather than the whole namespace: at
// most HistoryDecrees decrees and HistoryBytes of ops. A watcher further
// behind gets the whole namespace again.
const (
	HistoryDecrees = 256
	HistoryBytes   = 4 << 20
)

// FSM is the replicated state machine. Apply runs on raft's goroutine;
// readers take the lock.
type FSM struct {
	log *slog.Logger
	mu  struct {
		sync.Mutex
		ns map[string]*nsState
		// changed: per namespace, closed and removed at the namespace's
		// next applied decree (or a restore). Only namespaces someone
		// waits on have one, so a decree wakes only its own watchers.
		changed map[string]chan struct{}
		// applied is the index of the last command entry Apply took
		// (whatever its outcome); advanced is closed and replaced when
		// it moves. restores counts Restore calls; learned is the count
		// at which a restored snapshot's index, which the FSM is not
		// told, was last learned (Server.awaitApplied).
		applied           uint64
		advanced          chan struct{}
		restores, learned uint64
	}
}

type nsState struct {
	version uint64
	entries map[string][]byte
	// history holds the ops of decrees version-len(history)+1..version.
	history      [][]*pb.Op
	historyBytes int
	// ids holds the ids of the decrees that made versions
	// version-len(ids)+1..version (nil: a decree without an id).
	ids [][]byte
}

// appliedAs reports whether d is a resend of the decree that made the
// namespace's version d.ExpectedVersion+1, and that version. Only a
// decree with an id can be recognised; ids are unique per proposal, and
// the decree conditions on its expected version, so that version was
// made by this very proposal and no other copy of it can apply again.
func (ns *nsState) appliedAs(d *pb.Decree) (uint64, bool) {
	if len(d.Id) == 0 || d.ExpectedVersion >= ns.version {
		return 0, false
	}
	back := ns.version - d.ExpectedVersion // >= 1: the decree that made expected+1 is back-1 before the last
	if back > uint64(len(ns.ids)) {
		return 0, false
	}
	if !bytes.Equal(ns.ids[uint64(len(ns.ids))-back], d.Id) {
		return 0, false
	}
	return d.ExpectedVersion + 1, true
}

// NewFSM returns an empty state machine.
func NewFSM(log *slog.Logger) *FSM {
	f := &FSM{log: log}
	f.mu.ns = map[string]*nsState{}
	f.mu.changed = map[string]chan struct{}{}
	f.mu.advanced = make(chan struct{})
	return f
}

// Applied returns the index of the last command entry applied, the
// restore whose snapshot index is not yet learned (0: none), and a
// channel closed when the index next moves.
func (f *FSM) Applied() (uint64, uint64, <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	pending := uint64(0)
	if f.mu.restores != f.mu.learned {
		pending = f.mu.restores
	}
	return f.mu.applied, pending, f.mu.advanced
}

// appliedAtLeast raises the applied index to idx, the snapshot index
// learned for restore number restore, unless another restore came since
// (its index is then still to learn).
func (f *FSM) appliedAtLeast(idx, restore uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if restore != f.mu.restores {
		return
	}
	f.mu.learned = restore
	f.advanceLocked(idx)
}

func (f *FSM) advanceLocked(idx uint64) {
	if idx > f.mu.applied {
		f.mu.applied = idx
		close(f.mu.advanced)
		f.mu.advanced = make(chan struct{})
	}
}

func opsSize(ops []*pb.Op) int {
	n := 0
	for _, op := range ops {
		n += len(op.Key) + len(op.Value) + 8
	}
	return n
}

// signalLocked wakes the watchers of one namespace.
func (f *FSM) signalLocked(name string) {
	if ch := f.mu.changed[name]; ch != nil {
		close(ch)
		delete(f.mu.changed, name)
	}
}

func (f *FSM) changedLocked(name string) <-chan struct{} {
	ch := f.mu.changed[name]
	if ch == nil {
		ch = make(chan struct{})
		f.mu.changed[name] = ch
	}
	return ch
}

// DecodeDecree parses and validates a decree as it comes out of the log.
// Any input is safe: malformed bytes give an error, never a panic.
func DecodeDecree(b []byte) (*pb.Decree, error) {
	if len(b) > MaxDecreeSize {
		return nil, fmt.Errorf("%w: %d bytes > %d", ErrBadDecree, len(b), MaxDecreeSize)
	}
	d := &pb.Decree{}
	if err := proto.Unmarshal(b, d); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadDecree, err)
	}
	if len(d.Id) > MaxDecreeIDLen {
		// Refused at proposal (ValidateDecree), but a log entry is judged
		// as a build without ids judged it (one such may have led and
		// let it in): the entry applies, its id is ignored, so that every
		// replica, of any build, applies the same entries.
		d.Id = nil
	}
	if err := ValidateDecree(d); err != nil {
		return nil, err
	}
	return d, nil
}

// ValidateDecree checks a decree against the limits.
func ValidateDecree(d *pb.Decree) error {
	switch {
	case d.GetNamespace() == "" || len(d.GetNamespace()) > MaxNamespaceLen:
		return fmt.Errorf("%w: namespace name must be 1..%d bytes", ErrBadDecree, MaxNamespaceLen)
	case len(d.GetOps()) == 0 || len(d.GetOps()) > MaxOps:
		return fmt.Errorf("%w: %d ops, want 1..%d", ErrBadDecree, len(d.GetOps()), MaxOps)
	}
	for _, op := range d.GetOps() {
		switch {
		case op.GetKey() == "" || len(op.GetKey()) > MaxKeyLen:
			return fmt.Errorf("%w: key must be 1..%d bytes", ErrBadDecree, MaxKeyLen)
		case len(op.GetValue()) > MaxValueLen:
			return fmt.Errorf("%w: value of %q is %d bytes > %d", ErrBadDecree, op.GetKey(), len(op.GetValue()), MaxValueLen)
		case op.GetKind() != pb.Op_KIND_PUT && op.GetKind() != pb.Op_KIND_DELETE:
			return fmt.Errorf("%w: op kind %v", ErrBadDecree, op.GetKind())
		case op.GetKind() == pb.Op_KIND_DELETE && len(op.GetValue()) != 0:
			return fmt.Errorf("%w: delete of %q carries a value", ErrBadDecree, op.GetKey())
		}
	}
	if len(d.GetId()) > MaxDecreeIDLen {
		return fmt.Errorf("%w: an id of %d bytes > %d", ErrBadDecree, len(d.GetId()), MaxDecreeIDLen)
	}
	return nil
}

// Apply applies one committed log entry. A decree that does not decode, or
// whose version is stale, changes nothing; the reason goes to the proposer
// and the log.
func (f *FSM) Apply(l *raft.Log) any {
	if l.Type != raft.LogCommand {
		return nil
	}
	d, err := DecodeDecree(l.Data)
	if err != nil {
		f.log.Warn("rejected decree", "index", l.Index, "err", err)
		f.mu.Lock()
		f.advanceLocked(l.Index)
		f.mu.Unlock()
		return ApplyResult{Err: err}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.advanceLocked(l.Index)
	ns := f.mu.ns[d.Namespace]
	if ns == nil {
		ns = &nsState{entries: map[string][]byte{}}
	}
	if d.ExpectedVersion != ns.version {
		if v, ok := ns.appliedAs(d); ok {
			return ApplyResult{Version: v, Duplicate: true}
		}
		return ApplyResult{Version: ns.version, Err: ErrStaleVersion}
	}
	for _, op := range d.Ops {
		if op.Kind == pb.Op_KIND_PUT {
			ns.entries[op.Key] = op.Value
		} else {
			delete(ns.entries, op.Key)
		}
	}
	ns.version++
	ns.history = append(ns.history, d.Ops)
	ns.historyBytes += opsSize(d.Ops)
	for len(ns.history) > HistoryDecrees || ns.historyBytes > HistoryBytes && len(ns.history) > 1 {
		ns.historyBytes -= opsSize(ns.history[0])
		ns.history[0] = nil
		ns.history = ns.history[1:]
	}
	ns.ids = append(ns.ids, d.Id)
	if len(ns.ids) > RecentDecreeIDs {
		ns.ids[0] = nil
		ns.ids = ns.ids[1:]
	}
	f.mu.ns[d.Namespace] = ns
	f.signalLocked(d.Namespace)
	return ApplyResult{Version: ns.version}
}

// Version returns a namespace's version (0 if it was never written).
func (f *FSM) Version(name string) uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	if ns := f.mu.ns[name]; ns != nil {
		return ns.version
	}
	return 0
}

// Namespace returns a copy of one namespace (version 0 and no entries if it
// was never written) and a channel closed at its next applied decree.
func (f *FSM) Namespace(name string) (*pb.Namespace, <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.copyLocked(name), f.changedLocked(name)
}

// Since returns what a watcher at version after needs to reach the
// namespace's current version: the ops of the decrees since (delta, with
// the current version), or, when the history no longer reaches back to
// after (or after is 0), the whole namespace (full). Both are nil when
// nothing is new. changed is closed at the namespace's next decree.
func (f *FSM) Since(name string, after uint64) (version uint64, delta []*pb.Op, full *pb.Namespace, changed <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	changed = f.changedLocked(name)
	ns := f.mu.ns[name]
	switch {
	case ns == nil:
		return 0, nil, nil, changed
	case ns.version <= after:
		// Nothing new (a watcher that comes from a replica further ahead
		// waits until this one catches up: versions never go backwards).
		return ns.version, nil, nil, changed
	case after == 0 || ns.version-after > uint64(len(ns.history)):
		return ns.version, nil, f.copyLocked(name), changed
	}
	for _, ops := range ns.history[uint64(len(ns.history))-(ns.version-after):] {
		delta = append(delta, ops...)
	}
	return ns.version, delta, nil, changed
}

func (f *FSM) copyLocked(name string) *pb.Namespace {
	out := &pb.Namespace{Name: name}
	ns := f.mu.ns[name]
	if ns == nil {
		return out
	}
	out.Version = ns.version
	keys := make([]string, 0, len(ns.entries))
	for k := range ns.entries {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		out.Entries = append(out.Entries, &pb.Entry{Key: k, Value: ns.entries[k]})
	}
	return out
}

// Snapshot captures the whole state; raft persists it off the apply path.
func (f *FSM) Snapshot() (raft.FSMSnapshot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	names := make([]string, 0, len(f.mu.ns))
	for n := range f.mu.ns {
		names = append(names, n)
	}
	sort.Strings(names)
	s := &pb.ConfigSnapshot{}
	for _, n := range names {
		s.Namespaces = append(s.Namespaces, f.copyLocked(n))
		if ns := f.mu.ns[n]; len(ns.ids) > 0 {
			s.Recent = append(s.Recent, &pb.RecentDecrees{Namespace: n, Version: ns.version, Ids: ns.ids})
		}
	}
	b, err := proto.Marshal(s)
	if err != nil {
		return nil, err
	}
	return snapshot(b), nil
}

// Restore replaces the state with a snapshot.
func (f *FSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return err
	}
	s := &pb.ConfigSnapshot{}
	if err := proto.Unmarshal(b, s); err != nil {
		return fmt.Errorf("meta: snapshot does not decode: %w", err)
	}
	m := map[string]*nsState{}
	for _, n := range s.Namespaces {
		ns := &nsState{version: n.Version, entries: map[string][]byte{}}
		for _, e := range n.Entries {
			ns.entries[e.Key] = e.Value
		}
		m[n.Name] = ns
	}
	for _, r := range s.Recent {
		// Only ids that end at the namespace's version (a snapshot writes
		// them so), never more than the bound.
		ns := m[r.Namespace]
		if ns == nil || r.Version != ns.version || uint64(len(r.Ids)) > ns.version {
			return fmt.Errorf("meta: snapshot's recent decree ids of %q do not match the namespace", r.Namespace)
		}
		ids := r.Ids
		if len(ids) > RecentDecreeIDs {
			ids = ids[len(ids)-RecentDecreeIDs:]
		}
		ns.ids = ids
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mu.ns = m
	f.mu.restores++
	for name, ch := range f.mu.changed {
		close(ch)
		delete(f.mu.changed, name)
	}
	return nil
}

type snapshot []byte

func (s snapshot) Persist(sink raft.SnapshotSink) error {
	if _, err := sink.Write(s); err != nil {
		sink.Cancel()
		return err
	}
	return sink.Close()
}

func (s snapshot) Release() {}
