package chunk

import (
	"fmt"
	"sort"
)

// Namespace is the config-service namespace of the chunk manager pairs.
const Namespace = "chunk"

// Pair is a chunk manager pair as the config service records it: the two
// nodes that run its managers, which of them was last decreed primary
// (clerks' hint; the map lock is the authority), the RLDev that holds its
// map and those whose space it allocates. Every change is a decree.
//
// Invariants (Check): two different nodes; Primary 0 or 1; a map RLDev;
// at least one data RLDev, none repeated, none the map's.
type Pair struct {
	ID    uint32
	Nodes [2]uint64
	// Primary is the index in Nodes of the manager last decreed primary,
	// and PrimaryInc the incarnation of its node that was (0: none yet:
	// the named node formats the map and becomes primary).
	Primary    int
	PrimaryInc uint64
	Epoch      uint64 // bumped by every change of primary
	Formatted  bool   // the map was formatted (a blank map RLDev is then a lost one, never reformatted)
	MapRLDev   uint64
	MapBlocks  uint64
	Data       []DataRLDev
}

// DataRLDev is an RLDev whose space a pair allocates.
type DataRLDev struct {
	ID     uint64
	Blocks uint64
}

// Check verifies the invariants.
func (p *Pair) Check() error {
	switch {
	case p.ID == 0:
		return fmt.Errorf("chunk: pair id 0")
	case p.Nodes[0] == 0 || p.Nodes[1] == 0 || p.Nodes[0] == p.Nodes[1]:
		return fmt.Errorf("chunk: pair %d on nodes %v: two different nodes needed", p.ID, p.Nodes)
	case p.Primary != 0 && p.Primary != 1:
		return fmt.Errorf("chunk: pair %d: primary %d", p.ID, p.Primary)
	case p.MapRLDev == 0 || p.MapBlocks == 0:
		return fmt.Errorf("chunk: pair %d has no map RLDev", p.ID)
	case len(p.Data) == 0:
		return fmt.Errorf("chunk: pair %d has no data RLDev", p.ID)
	}
	seen := map[uint64]bool{p.MapRLDev: true}
	for _, d := range p.Data {
		if d.ID == 0 || d.Blocks == 0 || seen[d.ID] {
			return fmt.Errorf("chunk: pair %d: data RLDev %d (%d blocks) repeated, the map's, or empty", p.ID, d.ID, d.Blocks)
		}
		seen[d.ID] = true
	}
	return nil
}

// Clone returns a deep copy.
func (p *Pair) Clone() *Pair {
	c := *p
	c.Data = append([]DataRLDev(nil), p.Data...)
	return &c
}

// PrimaryNode is the node last decreed primary.
func (p *Pair) PrimaryNode() uint64 { return p.Nodes[p.Primary] }

// Has reports whether node runs one of the pair's managers.
func (p *Pair) Has(node uint64) bool { return p.Nodes[0] == node || p.Nodes[1] == node }

// Peer is the other node of the pair.
func (p *Pair) Peer(node uint64) uint64 {
	if p.Nodes[0] == node {
		return p.Nodes[1]
	}
	return p.Nodes[0]
}

// Table is the chunk namespace: every pair, and the namespace version it
// was read at (decrees are conditional on it).
type Table struct {
	Version uint64
	Pairs   map[uint32]*Pair
}

// IDs returns the pair ids in order.
func (t *Table) IDs() []uint32 {
	ids := make([]uint32, 0, len(t.Pairs))
	for id := range t.Pairs {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids
}

// MapLock is the name of pair cm's map lock.
func MapLock(cm uint32) string { return fmt.Sprintf("chunk/%d/map", cm) }
