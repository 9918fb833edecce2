package ddstable

import (
	"errors"
	"fmt"
	"slices"
)

// Moves: spreading a table's replicas onto bricks added to the cluster
// (DDS §3.1: "When nodes are added, this partitioning is altered so that
// data is spread onto the new node"; §4.3's recovery does the copying).
// Pure transitions; the runtime's recoverer drives them (service.go).
//
// A move of partition p from member A to brick B, driven by B:
//
//  1. A decree gives B p's write lease with Replacing[p] = A (WithMoveLease;
//     B asks it for itself when the plan says so, PlanMove). From its
//     epoch on the members refuse prepares; reads go on.
//  2. As in a recovery, B waits until every member is settled under the
//     lease (CopyReady) and copies the whole partition from one of them.
//  3. Hand-off: B asks A to stop serving reads (Participant.HandOff), and
//     waits for its yes — or for A to be removed from the group as dead.
//     Without it a library whose maps are as old as A's could read at A
//     after the next step let a write commit at the new group: A would
//     answer with the value before it (TestHandOff; the simulator's
//     random runs did not reach that window in 2 000 seeds with 20 moves
//     each, so its teeth do not cover it).
//  4. The join decree puts B in A's place and ends the lease (Joined); A,
//     seeing maps that do not list it, drops its replica.
//
// The replication degree never falls below the table's during a move: the
// group has its members and the copy until the last decree swaps them.

// Errors of the move transitions.
var (
	ErrNotReplaceable = errors.New("ddstable: the replaced brick is not a member of the partition's group")
	// ErrGroupShort: a move of a short group would be a recovery, with a
	// needless hand-off; recovery refills it first (review 126).
	ErrGroupShort = errors.New("ddstable: the partition's group is short; recovery refills it first")
)

// WithMoveLease is m with brick b holding partition p's write lease to
// replace member from (step 1), the epoch bumped.
func WithMoveLease(m *Maps, p Partition, b, from BrickID) (*Maps, error) {
	g, ok := m.RG[p]
	switch {
	case !ok:
		return nil, fmt.Errorf("%w: %v", ErrNoSuchPart, p)
	case !slices.Contains(g, from):
		return nil, fmt.Errorf("%w: %v in %v", ErrNotReplaceable, from, g)
	case len(g) < m.Replicas:
		return nil, fmt.Errorf("%w: %v", ErrGroupShort, g)
	case slices.ContainsFunc(g, func(o BrickID) bool { return o.Node == b.Node }):
		return nil, ErrInGroup
	case m.Joining[p] != (BrickID{}):
		return nil, fmt.Errorf("%w: %v", ErrLeaseHeld, m.Joining[p])
	case m.Reshaping[p] != (Reshape{}):
		return nil, ErrReshaping
	case m.Freeze.ID != 0:
		return nil, ErrCheckpointing
	}
	c := m.Clone()
	if c.Joining == nil {
		c.Joining = map[Partition]BrickID{}
	}
	if c.Replacing == nil {
		c.Replacing = map[Partition]BrickID{}
	}
	c.Joining[p], c.Replacing[p] = b, from
	c.Epoch++
	return c, c.Validate()
}

// ReplicaCounts is how many of m's groups list each brick, a lease's
// holder counted where it will be and a move's replaced member where it
// will no longer be.
func ReplicaCounts(m *Maps) map[BrickID]int {
	n := map[BrickID]int{}
	for p, g := range m.RG {
		for _, b := range g {
			if b != m.Replacing[p] {
				n[b]++
			}
		}
		if j, ok := m.Joining[p]; ok {
			n[j]++
		}
	}
	return n
}

// PlanMove says which move, if any, would bring brick self (one of live,
// the bricks alive now) closer to its share of m's replicas: a partition
// of the live brick with the most (ties: the lowest node), of which self
// holds no replica, when that brick has at least two more than self. Each
// such move lowers the sum of the squares of the counts, so bricks that
// each take such moves for themselves, one at a time and each checked on
// the latest maps (in the decree), stop once no two differ by more than
// one. Dead bricks are left to the janitor; partitions under any lease are
// not moved, nor those skip names (nil: none).
func PlanMove(m *Maps, live []BrickID, self BrickID, skip func(Partition) bool) (Partition, BrickID, bool) {
	if !slices.Contains(live, self) || m.Freeze.ID != 0 {
		return Partition{}, BrickID{}, false
	}
	n := ReplicaCounts(m)
	from := BrickID{}
	for _, b := range live {
		if n[b] >= n[self]+2 && (from == (BrickID{}) || n[b] > n[from] || (n[b] == n[from] && b.Node < from.Node)) {
			from = b
		}
	}
	if from == (BrickID{}) {
		return Partition{}, BrickID{}, false
	}
	for _, p := range m.DP.Leaves() {
		g := m.RG[p]
		if !slices.Contains(g, from) || len(g) < m.Replicas || slices.ContainsFunc(g, func(o BrickID) bool { return o.Node == self.Node }) ||
			m.Joining[p] != (BrickID{}) || m.Reshaping[p] != (Reshape{}) || (skip != nil && skip(p)) {
			continue
		}
		return p, from, true
	}
	return Partition{}, BrickID{}, false
}
