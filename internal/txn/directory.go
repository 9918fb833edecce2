package txn

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/lock"
	"github.com/grovestore/grove/internal/meta"
	"github.com/grovestore/grove/internal/rldev"
)

// A log is found after a crash through the config service: namespace
// "txn" maps "log/NAME" to the RLDev that holds it. Its owner holds the
// lock LockName(NAME) exclusively and fences every write of the log with
// that lock's token; whoever recovers it takes the same lock, so its
// token is newer than every earlier owner's and the RLDev refuses their
// writes from the moment recovery writes its fence block.

// Namespace is the config-service namespace of the logs.
const Namespace = "txn"

// MaxNameLen bounds a log's name.
const MaxNameLen = 200

// LockName is the lock a log's owner holds.
func LockName(name string) string { return "txn/log/" + name }

// Entry is a log as the config service records it.
type Entry struct {
	Name   string
	RLDev  uint64
	Blocks uint64 // the RLDev's size, in blocks
}

// Errors of the directory.
var (
	ErrNoLog     = errors.New("txn: no such log")
	ErrLogExists = errors.New("txn: a log of that name exists")
)

// CheckName reports a name a log may not have.
func CheckName(name string) error {
	if name == "" || len(name) > MaxNameLen {
		return fmt.Errorf("txn: a log name of %d bytes (1 to %d)", len(name), MaxNameLen)
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("._-", r)) {
			return fmt.Errorf("txn: log name %q: letters, digits, '.', '_' and '-' only", name)
		}
	}
	return nil
}

var entryMagic = [4]byte{'G', 'T', 'X', 'L'}

// EncodeEntry is e as the config service stores it.
func EncodeEntry(e Entry) []byte {
	b := append([]byte(nil), entryMagic[:]...)
	b = binary.LittleEndian.AppendUint32(b, 1) // version
	b = binary.LittleEndian.AppendUint64(b, e.RLDev)
	b = binary.LittleEndian.AppendUint64(b, e.Blocks)
	return append(b, e.Name...)
}

// DecodeEntry decodes an entry.
func DecodeEntry(b []byte) (Entry, error) {
	var e Entry
	if len(b) < 24 || [4]byte(b[:4]) != entryMagic {
		return e, fmt.Errorf("%w: not a log entry", ErrCorrupt)
	}
	if v := binary.LittleEndian.Uint32(b[4:]); v != 1 {
		return e, fmt.Errorf("%w: log entry version %d (this build reads 1)", ErrCorrupt, v)
	}
	e.RLDev = binary.LittleEndian.Uint64(b[8:])
	e.Blocks = binary.LittleEndian.Uint64(b[16:])
	e.Name = string(b[24:])
	if err := CheckName(e.Name); err != nil {
		return e, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	if e.RLDev == 0 || e.Blocks < HeaderBlocks+8 {
		return e, fmt.Errorf("%w: log %q on RLDev %d of %d blocks", ErrCorrupt, e.Name, e.RLDev, e.Blocks)
	}
	return e, nil
}

func entryKey(name string) string { return "log/" + name }

// Logs decodes the namespace.
func Logs(ns *pb.Namespace) (map[string]Entry, error) {
	out := map[string]Entry{}
	for _, kv := range ns.GetEntries() {
		e, err := DecodeEntry(kv.Value)
		if err != nil {
			return nil, fmt.Errorf("txn: config entry %q: %w", kv.Key, err)
		}
		if kv.Key != entryKey(e.Name) {
			return nil, fmt.Errorf("txn: config entry %q holds log %q", kv.Key, e.Name)
		}
		out[e.Name] = e
	}
	return out, nil
}

// ListLogs returns every log, by name.
func ListLogs(ctx context.Context, m *meta.Client) ([]Entry, error) {
	ns, err := m.Read(ctx, Namespace)
	if err != nil {
		return nil, err
	}
	logs, err := Logs(ns)
	if err != nil {
		return nil, err
	}
	out := make([]Entry, 0, len(logs))
	for _, e := range logs {
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// LookupLog finds the log name.
func LookupLog(ctx context.Context, m *meta.Client, name string) (Entry, error) {
	ns, err := m.Read(ctx, Namespace)
	if err != nil {
		return Entry{}, err
	}
	logs, err := Logs(ns)
	if err != nil {
		return Entry{}, err
	}
	e, ok := logs[name]
	if !ok {
		return Entry{}, fmt.Errorf("%w: %q", ErrNoLog, name)
	}
	return e, nil
}

// CreateLog makes a log of size bytes, by decree: an RLDev with its
// dirty-region log off (the log reconciles its replicas itself), placed
// as the RLDev table places any, then the log's entry. A log of that
// name already there is returned with ErrLogExists. As with the chunk
// manager's pairs, the two decrees are in two namespaces: a crash
// between them leaves the RLDev unused (grove rldev list shows it).
func CreateLog(ctx context.Context, m *meta.Client, rl *rldev.Clerk, name string, size uint64) (Entry, error) {
	if err := CheckName(name); err != nil {
		return Entry{}, err
	}
	blocks := (size + BlockSize - 1) / BlockSize
	if blocks < HeaderBlocks+8 {
		return Entry{}, fmt.Errorf("txn: a log of %d bytes (at least %d)", size, (HeaderBlocks+8)*BlockSize)
	}
	if e, err := LookupLog(ctx, m, name); err == nil {
		return e, fmt.Errorf("%w: %q", ErrLogExists, name)
	} else if !errors.Is(err, ErrNoLog) {
		return Entry{}, err
	}
	recs, err := rl.Create(ctx, blocks*BlockSize, 1, true)
	if err != nil {
		return Entry{}, fmt.Errorf("txn: creating the RLDev of log %q: %w", name, err)
	}
	e := Entry{Name: name, RLDev: recs[0].ID, Blocks: blocks}
	var existing *Entry
	_, err = m.Update(ctx, Namespace, "log "+name, func(ns *pb.Namespace) ([]*pb.Op, error) {
		logs, err := Logs(ns)
		if err != nil {
			return nil, err
		}
		if x, ok := logs[name]; ok {
			if x.RLDev == e.RLDev {
				// This call's own entry (an RLDev is named by one log
				// only): an earlier attempt of this decree committed.
				existing = nil
				return nil, nil
			}
			existing = &x
			return nil, nil
		}
		existing = nil
		return []*pb.Op{{Kind: pb.Op_KIND_PUT, Key: entryKey(name), Value: EncodeEntry(e)}}, nil
	})
	if err != nil {
		return Entry{}, fmt.Errorf("txn: recording log %q (its RLDev %d was made): %w", name, e.RLDev, err)
	}
	if existing != nil {
		return *existing, fmt.Errorf("%w: %q (made at the same time; RLDev %d is unused)", ErrLogExists, name, e.RLDev)
	}
	return e, nil
}

// LockHold is the log's lock, held (lock.Held, lock.RemoteHeld).
type LockHold interface {
	Token() lock.Token
	Release()
	Lost() <-chan struct{}
	LostReason() error
}

// Locker takes a lock exclusively, waiting until it is granted or ctx
// ends, with a token newer than any the lock had before (a recovery must
// outrank every earlier writer of the log, its own earlier sessions
// included: a cached lease is given back first).
type Locker func(ctx context.Context, name string) (LockHold, error)

// ClerkLocker takes locks through a node's clerk (a log owned by a node).
func ClerkLocker(c *lock.ClerkRT) Locker {
	return func(ctx context.Context, name string) (LockHold, error) {
		c.Drop(name)
		h, err := c.Acquire(ctx, name, lock.Exclusive)
		if err != nil {
			return nil, err
		}
		return h, nil
	}
}

// RemoteLocker takes locks through the node at conn, for a process that is
// not a node (lock.HoldRemote). A node that cannot take the request now
// (starting, or fenced and coming back as a new incarnation) is asked
// again until ctx ends.
func RemoteLocker(conn grpc.ClientConnInterface) Locker {
	return func(ctx context.Context, name string) (LockHold, error) {
		for {
			h, err := lock.HoldRemote(ctx, conn, name, lock.Exclusive, true)
			if err == nil {
				return h, nil
			}
			if status.Code(err) != codes.Unavailable || ctx.Err() != nil {
				return nil, err
			}
			select {
			case <-ctx.Done():
				return nil, fmt.Errorf("%w (last: %v)", ctx.Err(), err)
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
}

// NamedConfig opens a log found through the config service.
type NamedConfig struct {
	Meta  *meta.Client
	RLDev *rldev.Clerk
	// Lock takes the log's lock; the log fails once the hold is lost.
	Lock Locker
	Name string
	// Config is the rest (Device and Fence are filled in here).
	Config
}

// OpenNamed takes the log's lock exclusively (waiting for a dead owner's
// lease to be resolved), recovers the log on its RLDev under the lock's
// token, and returns it. Close releases the lock.
func OpenNamed(ctx context.Context, nc NamedConfig) (*Log, error) {
	e, err := LookupLog(ctx, nc.Meta, nc.Name)
	if err != nil {
		return nil, err
	}
	held, err := nc.Lock(ctx, LockName(nc.Name))
	if err != nil {
		return nil, fmt.Errorf("txn: taking the lock of log %q: %w", nc.Name, err)
	}
	cfg := nc.Config
	cfg.Device = &RLDevDevice{Clerk: nc.RLDev, ID: e.RLDev, Size: e.Blocks}
	cfg.Fence = rldev.Fence{Name: LockName(nc.Name), Token: held.Token()}
	l, err := Open(ctx, cfg)
	if err != nil {
		held.Release()
		return nil, fmt.Errorf("txn: recovering log %q: %w", nc.Name, err)
	}
	l.release = held.Release
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		select {
		case <-held.Lost():
			l.mu.Lock()
			l.failLocked(fmt.Errorf("%w: the lock of log %q was lost: %v", ErrFenced, nc.Name, held.LostReason()))
			l.mu.Unlock()
		case <-l.ctx.Done():
		}
	}()
	return l, nil
}
