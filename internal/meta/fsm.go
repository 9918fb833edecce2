// Package meta is the config service (Boxwood's "Paxos service", §3.1): a
// replicated state machine on hashicorp/raft holding one namespace of state
// per internal service, changed only by decrees that are applied one at a
// time, in one order, and only if the namespace is still at the version the
// proposer read. Only joins, failures and reconfigurations go through it.
package meta

import (
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
}

// FSM is the replicated state machine. Apply runs on raft's goroutine;
// readers take the lock.
type FSM struct {
	log *slog.Logger
	mu  struct {
		sync.Mutex
		ns      map[string]*nsState
		changed chan struct{} // closed and replaced on every applied decree
	}
}

type nsState struct {
	version uint64
	entries map[string][]byte
}

// NewFSM returns an empty state machine.
func NewFSM(log *slog.Logger) *FSM {
	f := &FSM{log: log}
	f.mu.ns = map[string]*nsState{}
	f.mu.changed = make(chan struct{})
	return f
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
		return ApplyResult{Err: err}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	ns := f.mu.ns[d.Namespace]
	if ns == nil {
		ns = &nsState{entries: map[string][]byte{}}
	}
	if d.ExpectedVersion != ns.version {
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
	f.mu.ns[d.Namespace] = ns
	close(f.mu.changed)
	f.mu.changed = make(chan struct{})
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
// was never written) and a channel closed at the next applied decree.
func (f *FSM) Namespace(name string) (*pb.Namespace, <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.copyLocked(name), f.mu.changed
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
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mu.ns = m
	close(f.mu.changed)
	f.mu.changed = make(chan struct{})
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
