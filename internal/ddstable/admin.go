package ddstable

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/bits"
	"slices"
	"strings"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/meta"
)

// The config service's namespaces.
const (
	// Namespace holds one record per table, key TableKey(name), value
	// Maps.AppendBinary: the authoritative maps (departure from DDS, which
	// kept them only on the nodes).
	Namespace = "dds"
	// OutcomeNamespace holds the outcome registers of operations whose
	// coordinator failed between its phases: key outcomeKey, value
	// "commit" or "abort", written once (participant.go, rule 2).
	OutcomeNamespace = "dds-outcome"
)

// TableKey is table name's record in Namespace.
func TableKey(name string) string { return "table/" + name }

func outcomeKey(table string, p Partition, op OpID) string {
	return fmt.Sprintf("%s/%v/%016x/%d", table, p, op.Session, op.Seq)
}

// Errors of the table administration.
var (
	ErrExists       = errors.New("ddstable: a table of that name exists")
	ErrNoTable      = errors.New("ddstable: no such table")
	ErrTooFewBricks = errors.New("ddstable: fewer live bricks than the replication degree")
)

// DecodeTables reads every table's maps from Namespace. A record that
// does not decode (a newer format, during an upgrade) is left out and
// reported: one table's record must not stop every other (review 121).
func DecodeTables(ns *pb.Namespace) (map[string]*Maps, []error) {
	out, named := decodeTablesNamed(ns)
	var bad []error
	for _, name := range slices.Sorted(maps.Keys(named)) {
		bad = append(bad, named[name])
	}
	return out, bad
}

// decodeTablesNamed is DecodeTables with the errors by table name.
func decodeTablesNamed(ns *pb.Namespace) (map[string]*Maps, map[string]error) {
	out := map[string]*Maps{}
	bad := map[string]error{}
	for _, e := range ns.GetEntries() {
		name, ok := strings.CutPrefix(e.Key, "table/")
		if !ok {
			continue
		}
		m, err := DecodeMaps(e.Value)
		if err == nil && m.Table != name {
			err = fmt.Errorf("ddstable: record %q holds table %q", e.Key, m.Table)
		}
		if err != nil {
			bad[name] = fmt.Errorf("table %q: %w", name, err)
			continue
		}
		out[name] = m
	}
	return out, bad
}

// Bricks are the bricks a new table's groups may use: every registered
// node's current incarnation, in node order.
func Bricks(ns *pb.Namespace) ([]BrickID, error) {
	nodes, err := meta.DecodeNodes(ns)
	if err != nil {
		return nil, err
	}
	var out []BrickID
	for _, n := range nodes {
		if n.Incarnation != 0 {
			out = append(out, BrickID{Node: n.Id, Inc: n.Incarnation})
		}
	}
	return out, nil
}

// NewTableMaps places a new table of partitions (a power of two) groups of
// replicas bricks: partition i's group is bricks i, i+1, ... (mod the
// count), so every brick serves about as many partitions, and first
// members rotate (DDS §3.1 balances by spreading partitions evenly).
func NewTableMaps(name string, partitions, replicas int, bricks []BrickID) (*Maps, error) {
	if err := CheckName(name); err != nil {
		return nil, err
	}
	if partitions < 1 || partitions > MaxPartitions || partitions&(partitions-1) != 0 {
		return nil, fmt.Errorf("ddstable: %d partitions: a power of two from 1 to %d", partitions, MaxPartitions)
	}
	if replicas < 1 || replicas > MaxReplicas {
		return nil, fmt.Errorf("ddstable: replication degree %d (1 to %d)", replicas, MaxReplicas)
	}
	if len(bricks) < replicas {
		return nil, fmt.Errorf("%w: %d bricks, %d replicas", ErrTooFewBricks, len(bricks), replicas)
	}
	dp, err := NewDPMapUniform(uint8(bits.TrailingZeros(uint(partitions))))
	if err != nil {
		return nil, err
	}
	m := &Maps{Table: name, Gen: newSession(), Epoch: 1, Replicas: replicas, DP: dp, RG: map[Partition][]BrickID{}}
	for i, p := range dp.Leaves() {
		g := make([]BrickID, replicas)
		for j := range g {
			g[j] = bricks[(i+j)%len(bricks)]
		}
		m.RG[p] = g
	}
	if n := len(m.AppendBinary(nil)); n > MaxMapsBytes {
		return nil, fmt.Errorf("%w: %d partitions of %d replicas take %d bytes of maps (at most %d: fewer partitions or replicas)", ErrTooBig, partitions, replicas, n, MaxMapsBytes)
	}
	return m, m.Validate()
}

// MaxMapsBytes bounds a new table's encoded maps: they are one
// config-service value (at most 64 KiB), with room for write leases.
const MaxMapsBytes = 48 << 10

// ErrTooBig: the table's maps would not fit in one config-service value.
var ErrTooBig = errors.New("ddstable: too many partitions for one table")

// CreateTable decrees a new table over the registered nodes.
func CreateTable(ctx context.Context, mc *meta.Client, name string, partitions, replicas int) (*Maps, error) {
	if err := CheckName(name); err != nil {
		return nil, err
	}
	nodes, err := mc.Read(ctx, meta.NodesNamespace)
	if err != nil {
		return nil, err
	}
	bricks, err := Bricks(nodes)
	if err != nil {
		return nil, err
	}
	m, err := NewTableMaps(name, partitions, replicas, bricks)
	if err != nil {
		return nil, err
	}
	_, err = mc.Update(ctx, Namespace, "dds-create", func(ns *pb.Namespace) ([]*pb.Op, error) {
		for _, e := range ns.GetEntries() {
			if e.Key == TableKey(name) {
				// (A resend of this very decree is answered by meta.Client's
				// decree id, not seen here.)
				return nil, fmt.Errorf("%w: %q", ErrExists, name)
			}
		}
		return []*pb.Op{{Kind: pb.Op_KIND_PUT, Key: TableKey(name), Value: m.AppendBinary(nil)}}, nil
	})
	return m, err
}

// DropTable decrees a table away; its bricks drop their replicas.
func DropTable(ctx context.Context, mc *meta.Client, name string) error {
	found := false
	_, err := mc.Update(ctx, Namespace, "dds-drop", func(ns *pb.Namespace) ([]*pb.Op, error) {
		for _, e := range ns.GetEntries() {
			if e.Key == TableKey(name) {
				found = true
				return []*pb.Op{{Kind: pb.Op_KIND_DELETE, Key: e.Key}}, nil
			}
		}
		return nil, nil
	})
	if err == nil && !found {
		err = fmt.Errorf("%w: %q", ErrNoTable, name)
	}
	return err
}

// ListTables reads every table's maps, in name order.
func ListTables(ctx context.Context, mc *meta.Client) ([]*Maps, error) {
	ns, err := mc.Read(ctx, Namespace)
	if err != nil {
		return nil, err
	}
	ts, bad := DecodeTables(ns)
	if len(bad) > 0 {
		return nil, errors.Join(bad...)
	}
	out := make([]*Maps, 0, len(ts))
	for _, m := range ts {
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b *Maps) int { return strings.Compare(a.Table, b.Table) })
	return out, nil
}

// withoutDead is m less the dead bricks (and their write leases), in every
// group that keeps another member (DDS: "the replica group membership maps for all partitions in
// the hash table must have at least one member"; a group whose every
// member died is lost, and stays listed so that its loss shows). It
// reports whether anything changed; the epoch is bumped if so.
func withoutDead(m *Maps, dead map[BrickID]bool) (*Maps, bool) {
	c := m.Clone()
	changed := false
	for p, g := range c.RG {
		keep := slices.DeleteFunc(slices.Clone(g), func(b BrickID) bool { return dead[b] })
		if len(keep) > 0 && len(keep) < len(g) {
			c.RG[p] = keep
			changed = true
		}
	}
	for p, j := range c.Joining {
		if dead[j] {
			// DDS-F9: a recovering brick that dies loses its write lease
			// (a move's too).
			delete(c.Joining, p)
			delete(c.Replacing, p)
			changed = true
		}
	}
	if dead[c.Freeze.Holder] {
		// A checkpoint's holder that dies loses its freeze too.
		c.Freeze = Freeze{}
		changed = true
	}
	for p, r := range c.Reshaping {
		if dead[r.Holder] {
			// A split's or merge's holder that dies loses its lease too
			// (for a merge, both siblings'); another member may ask again.
			delete(c.Reshaping, p)
			changed = true
		}
	}
	if changed {
		c.Epoch++
	}
	return c, changed
}

// RemoveDead decrees the dead bricks out of every table's groups (DDS
// §4.3: "if a brick fails, it is removed from all RG maps that contain
// it"), one decree per table (one decree for all could pass the config
// service's bounds on a decree; review 121). Only bricks the failure
// detector declared dead may be passed: a declared brick has stopped, so
// no replica it held serves again. It returns how many tables changed.
func RemoveDead(ctx context.Context, mc *meta.Client, dead map[BrickID]bool) (int, error) {
	ns, err := mc.Read(ctx, Namespace)
	if err != nil {
		return 0, err
	}
	ts, _ := DecodeTables(ns)
	n := 0
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(ts)) {
		if _, changed := withoutDead(ts[name], dead); !changed {
			continue
		}
		_, err := mc.Update(ctx, Namespace, "dds-janitor", func(ns *pb.Namespace) ([]*pb.Op, error) {
			for _, e := range ns.GetEntries() {
				if e.Key != TableKey(name) {
					continue
				}
				m, err := DecodeMaps(e.Value)
				if err != nil {
					return nil, nil // not this build's to change
				}
				if c, changed := withoutDead(m, dead); changed {
					return []*pb.Op{{Kind: pb.Op_KIND_PUT, Key: e.Key, Value: c.AppendBinary(nil)}}, nil
				}
			}
			return nil, nil
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("table %q: %w", name, err))
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}

// RequestSplit asks for partition p of table name to split: it decrees the
// split's lease, held by the first member of p's group, whose brick then
// waits until every member is settled and decrees the split (reshape.go).
// Watch the maps for its end: p gone from the DP map, or the lease gone.
func RequestSplit(ctx context.Context, mc *meta.Client, name string, p Partition) (*Maps, error) {
	return reshapeRequest(ctx, mc, name, func(m *Maps) (*Maps, error) {
		g, ok := m.RG[p]
		if !ok {
			return nil, fmt.Errorf("%w: %v", ErrNoSuchPart, p)
		}
		return WithSplitLease(m, p, g[0])
	})
}

// RequestMerge asks for the two children of parent to merge into it, as
// RequestSplit does; they must have the same group.
func RequestMerge(ctx context.Context, mc *meta.Client, name string, parent Partition) (*Maps, error) {
	return reshapeRequest(ctx, mc, name, func(m *Maps) (*Maps, error) {
		zero, _, ok := parent.Children()
		g := m.RG[zero]
		if !ok || len(g) == 0 {
			return nil, fmt.Errorf("merge into %v: %w", parent, ErrNotMergeable)
		}
		return WithMergeLease(m, parent, g[0])
	})
}

// ErrNoBrick: a move's target node runs no registered incarnation.
var ErrNoBrick = errors.New("ddstable: the node runs no registered brick")

// RequestMove asks for the replica of partition p on node from to move to
// node to (rebalance.go): it decrees the move's lease for to's running
// incarnation, whose brick then copies the partition, has the replaced
// member hand off, and joins in its place. Watch the maps for its end: to
// in p's group, or the lease gone.
func RequestMove(ctx context.Context, mc *meta.Client, name string, p Partition, from, to uint64) (*Maps, error) {
	nodes, err := mc.Read(ctx, meta.NodesNamespace)
	if err != nil {
		return nil, err
	}
	bricks, err := Bricks(nodes)
	if err != nil {
		return nil, err
	}
	i := slices.IndexFunc(bricks, func(b BrickID) bool { return b.Node == to })
	if i < 0 {
		return nil, fmt.Errorf("%w: node %d", ErrNoBrick, to)
	}
	return reshapeRequest(ctx, mc, name, func(m *Maps) (*Maps, error) {
		g, ok := m.RG[p]
		if !ok {
			return nil, fmt.Errorf("%w: %v", ErrNoSuchPart, p)
		}
		j := slices.IndexFunc(g, func(b BrickID) bool { return b.Node == from })
		if j < 0 {
			return nil, fmt.Errorf("%w: node %d is not in %v's group %v", ErrNotReplaceable, from, p, g)
		}
		return WithMoveLease(m, p, bricks[i], g[j])
	})
}

func reshapeRequest(ctx context.Context, mc *meta.Client, name string, fn func(*Maps) (*Maps, error)) (*Maps, error) {
	var out *Maps
	_, err := mc.Update(ctx, Namespace, "dds-reshape", func(ns *pb.Namespace) ([]*pb.Op, error) {
		for _, e := range ns.GetEntries() {
			if e.Key != TableKey(name) {
				continue
			}
			m, err := DecodeMaps(e.Value)
			if err != nil {
				return nil, err
			}
			c, err := fn(m)
			if err != nil {
				return nil, err
			}
			out = c
			return []*pb.Op{{Kind: pb.Op_KIND_PUT, Key: e.Key, Value: c.AppendBinary(nil)}}, nil
		}
		return nil, fmt.Errorf("%w: %q", ErrNoTable, name)
	})
	return out, err
}

// RequestCheckpoint asks for a checkpoint of table name (checkpoint.go):
// it decrees the table frozen, the freeze held by the first member of its
// first partition's group, whose brick then waits until every member has
// written its files and decrees the checkpoint done. Watch the maps for
// its end: Checkpoint.ID reaching the freeze's, or the freeze gone.
func RequestCheckpoint(ctx context.Context, mc *meta.Client, name string) (*Maps, error) {
	return reshapeRequest(ctx, mc, name, func(m *Maps) (*Maps, error) {
		return WithFreeze(m, m.RG[m.DP.Leaves()[0]][0])
	})
}
