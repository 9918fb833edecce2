package ddstable

import (
	"errors"
	"fmt"
	"maps"
	"slices"
)

// Splits and merges of partitions (DDS §4.2-4.3), as transitions of a
// table's maps and as what a brick's replicas become.
//
// DDS: "A similar technique [to recovery] is used for DP map split and
// merge operations, except that all replicas must be modified and both the
// RG and DP maps are updated at the end of the operation." Here, as for a
// recovery (participant.go, rule 6):
//
//  1. A decree gives the partition (for a merge, both siblings, which must
//     have the same group) a reshape lease held by one member, the
//     holder: from that epoch on the members refuse prepares (reads go on).
//  2. The holder waits until every member is settled under the lease
//     (Participant.ReshapeReady: the lease in its maps and nothing in
//     doubt), which no member leaves while the lease lasts. Then every
//     operation on the partition is decided at every member, the same way,
//     for good, and every replica holds the same data.
//  3. A decree replaces the partition by its two children (a split) or the
//     two siblings by their parent (a merge), with the same group, and
//     ends the lease. Each member then retires its old participants, whose
//     records go with them, and starts the new partitions' participants
//     from its own data (Inherit): a split hands each child the keys it
//     contains, a merge hands the parent both halves. No data moves over
//     the network: "all replicas must be modified" in place.
//
// Retiring a participant is safe once settled: a late prepare for the old
// partition finds no participant (a "no" not recorded, which no commit can
// follow, since the new participants refuse another partition's
// prepares); no termination is left to answer, since nothing is in doubt
// at any member; a late decision for a settled operation changes nothing.
// Copying what is in doubt is what the settling rules out
// (UnsafeParticipant.ReshapeInDoubt; the simulator catches it).
//
// A split changes no placement: both children keep the parent's group, as
// in DDS, and a later recovery or move spreads them. Its use is to bound a
// partition's size (what a recovery copies in one piece: DDS kept
// partitions "relatively small (~100MB)") and to give recoveries finer
// grain; a merge undoes splits of partitions left small.

// Errors of the reshape transitions.
var (
	ErrReshaping    = errors.New("ddstable: a split or merge holds the partition's write lease")
	ErrReshapeLost  = errors.New("ddstable: the split's or merge's write lease is gone")
	ErrRecovering   = errors.New("ddstable: a brick is recovering into the partition")
	ErrNotMember    = errors.New("ddstable: the holder is not a member of the partition's group")
	ErrGroupsDiffer = errors.New("ddstable: the two partitions' groups differ (a merge needs one group)")
)

// reshapable checks that holder may take p's reshape lease in m.
func reshapable(m *Maps, p Partition, holder BrickID) error {
	g, ok := m.RG[p]
	switch {
	case !ok:
		return fmt.Errorf("%w: %v", ErrNoSuchPart, p)
	case !slices.Contains(g, holder):
		return fmt.Errorf("%w: %v, group of %v: %v", ErrNotMember, holder, p, g)
	case m.Joining[p] != (BrickID{}):
		return fmt.Errorf("%w: %v", ErrRecovering, p)
	case m.Reshaping[p] != (Reshape{}):
		return fmt.Errorf("%w: %v", ErrReshaping, p)
	case m.Freeze.ID != 0:
		return ErrCheckpointing
	}
	return nil
}

// WithSplitLease is m with holder, a member of p's group, holding p's
// reshape lease for a split (step 1), the epoch bumped. It fails if the
// split's maps would be too large or too deep.
func WithSplitLease(m *Maps, p Partition, holder BrickID) (*Maps, error) {
	if err := reshapable(m, p, holder); err != nil {
		return nil, err
	}
	c := m.Clone()
	if c.Reshaping == nil {
		c.Reshaping = map[Partition]Reshape{}
	}
	c.Reshaping[p] = Reshape{Holder: holder}
	c.Epoch++
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if _, err := Split(c, p, holder); err != nil {
		return nil, err // the split itself would fail: no lease for it
	}
	return c, nil
}

// WithMergeLease is m with holder holding the reshape lease of both
// children of parent, for their merge into parent (step 1). Both must be
// partitions with the same group (in the same order), holder in it.
func WithMergeLease(m *Maps, parent Partition, holder BrickID) (*Maps, error) {
	zero, one, ok := parent.Children()
	if !ok || !m.DP.Has(zero) || !m.DP.Has(one) {
		return nil, fmt.Errorf("merge into %v: %w", parent, ErrNotMergeable)
	}
	for _, p := range []Partition{zero, one} {
		if err := reshapable(m, p, holder); err != nil {
			return nil, err
		}
	}
	if !slices.Equal(m.RG[zero], m.RG[one]) {
		return nil, fmt.Errorf("%w: %v %v, %v %v", ErrGroupsDiffer, zero, m.RG[zero], one, m.RG[one])
	}
	c := m.Clone()
	if c.Reshaping == nil {
		c.Reshaping = map[Partition]Reshape{}
	}
	r := Reshape{Holder: holder, Merge: true}
	c.Reshaping[zero], c.Reshaping[one] = r, r
	c.Epoch++
	return c, c.Validate()
}

// Split is m with partition p, whose split lease holder holds, replaced
// by its two children, each with p's group, and the lease ended (step 3).
// The holder decrees it only once every member is settled under the lease.
func Split(m *Maps, p Partition, holder BrickID) (*Maps, error) {
	if m.Reshaping[p] != (Reshape{Holder: holder}) {
		return nil, ErrReshapeLost
	}
	zero, one, ok := p.Children()
	if !ok {
		return nil, fmt.Errorf("split %v: %w", p, ErrTooDeep)
	}
	c := m.Clone()
	delete(c.Reshaping, p)
	if err := c.DP.Split(p); err != nil {
		return nil, err
	}
	g := c.RG[p]
	delete(c.RG, p)
	c.RG[zero], c.RG[one] = g, slices.Clone(g)
	c.Epoch++
	if n := len(c.AppendBinary(nil)); n > MaxMapsBytes {
		return nil, fmt.Errorf("%w: split %v: the maps would take %d bytes (at most %d)", ErrTooBig, p, n, MaxMapsBytes)
	}
	return c, c.Validate()
}

// Merged is m with the two children of parent, whose merge lease holder
// holds, replaced by parent with their group, and the leases ended
// (step 3).
func Merged(m *Maps, parent Partition, holder BrickID) (*Maps, error) {
	zero, one, ok := parent.Children()
	r := Reshape{Holder: holder, Merge: true}
	if !ok || m.Reshaping[zero] != r || m.Reshaping[one] != r {
		return nil, ErrReshapeLost
	}
	c := m.Clone()
	delete(c.Reshaping, zero)
	delete(c.Reshaping, one)
	if err := c.DP.Merge(parent); err != nil {
		return nil, err
	}
	c.RG[parent] = c.RG[zero]
	delete(c.RG, zero)
	delete(c.RG, one)
	c.Epoch++
	return c, c.Validate()
}

// WithoutReshape is m with holder's reshape lease on p ended (a split or
// merge given up; for a merge, on both siblings).
func WithoutReshape(m *Maps, p Partition, holder BrickID) (*Maps, bool) {
	r, ok := m.Reshaping[p]
	if !ok || r.Holder != holder {
		return m, false
	}
	c := m.Clone()
	delete(c.Reshaping, p)
	if sib, ok := p.Sibling(); ok && r.Merge {
		delete(c.Reshaping, sib)
	}
	c.Epoch++
	return c, true
}

// Retiree is the replica a brick held of a partition that newer maps no
// longer list it in: its store, and whether its participant was settled
// (nothing in doubt) when it retired.
type Retiree[V any] struct {
	Store   map[uint64]V
	Settled bool
}

// Inherit is step 3 at one brick: given the replicas that maps m retired
// at brick self in one pass, it returns the stores the new partitions
// listing self start from (a split's children: the keys each contains; a
// merge's parent: both halves), and the new partitions listing self that
// descend from a retired replica but cannot be served here: a half of a
// merge missing, or a replica retired with operations in doubt (which the
// settling rules out; the caller reports it). Replicas retired for any
// other reason (the brick left the group, the table is gone) inherit
// nothing.
//
// A brick sees every reshape of a partition it serves: the holder decrees
// the new partitions only after every member answered settled under the
// lease, which it can do only with the lease's maps installed. So one pass
// retires at most one step of splits and merges, and both halves of a
// merge retire together.
func Inherit[V any](m *Maps, self BrickID, retired map[Partition]Retiree[V]) (stores map[Partition]map[uint64]V, lost []Partition) {
	stores = map[Partition]map[uint64]V{}
	lose := func(p Partition) {
		if !slices.Contains(lost, p) {
			lost = append(lost, p)
		}
	}
	for p, r := range retired {
		if zero, one, ok := p.Children(); ok && m.DP.Has(zero) && m.DP.Has(one) {
			for _, c := range []Partition{zero, one} {
				if !slices.Contains(m.RG[c], self) {
					continue
				}
				if !r.Settled {
					lose(c)
					continue
				}
				s := map[uint64]V{}
				for k, v := range r.Store {
					if c.Contains(k) {
						s[k] = v
					}
				}
				stores[c] = s
			}
			continue
		}
		parent, ok := p.Parent()
		if !ok || !m.DP.Has(parent) || !slices.Contains(m.RG[parent], self) {
			continue
		}
		sib, _ := p.Sibling()
		o, both := retired[sib]
		if !both || !r.Settled || !o.Settled {
			lose(parent)
			continue
		}
		s := make(map[uint64]V, len(r.Store)+len(o.Store))
		maps.Copy(s, r.Store)
		maps.Copy(s, o.Store)
		stores[parent] = s
	}
	for _, p := range lost {
		delete(stores, p)
	}
	return stores, lost
}
