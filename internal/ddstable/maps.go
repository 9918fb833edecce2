package ddstable

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"maps"
	"slices"
	"strings"
)

// BrickID names a brick: the Grove node that runs it (one brick per node;
// DDS ran one per CPU) and the node's incarnation when the brick joined
// the group. A node that restarts lost its replicas (they live in memory,
// as DDS's do): its new incarnation is another brick, which serves only
// groups it joins by recovery, and the operations of its past life never
// take it for the member they prepared at.
type BrickID struct {
	Node, Inc uint64
}

func (b BrickID) String() string { return fmt.Sprintf("%d.%d", b.Node, b.Inc) }

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Limits of a table's maps.
const (
	MaxReplicas  = 8   // members of one replica group
	MaxTableName = 128 // bytes of a table's name
)

// ErrBadName: a table name is 1 to MaxTableName bytes of letters, digits
// and . _ - (it is part of config-service keys).
var ErrBadName = errors.New("ddstable: a table name is 1 to 128 bytes of letters, digits and . _ -")

// CheckName validates a table name.
func CheckName(name string) error {
	if name == "" || len(name) > MaxTableName {
		return ErrBadName
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("._-", c)) {
			return ErrBadName
		}
	}
	return nil
}

// Maps are one table's pair of metadata maps (DDS §4.2): the DP map
// (key → partition) and the RG map (partition → the bricks serving as its
// replicas), with the epoch of the decree that last changed either.
//
// Departure from DDS: the authoritative maps live in the config service
// (DDS kept them only on the nodes). Every change (a brick removed from
// replica groups after the failure detector declared it dead, a brick
// joining a group after recovery, a split or a merge) is a decree that
// bumps Epoch; bricks and libraries hold copies and repair them lazily, as
// DDS does, from the Stamp piggybacked on every call.
//
// Invariants (Validate): every partition of DP has an RG entry and every
// RG entry is a partition of DP; every group has 1 to MaxReplicas distinct
// members (DDS: "the replica group membership maps for all partitions in
// the hash table must have at least one member").
type Maps struct {
	Table string
	// Gen tells this table from an earlier one of the same name (dropped,
	// then created again): drawn at random at creation, never changed.
	// Epochs start again at 1 in a new generation; Stamp covers Gen.
	Gen      uint64
	Epoch    uint64
	Replicas int // the replication degree groups are brought back to
	DP       *DPMap
	RG       map[Partition][]BrickID
	// Joining: the partitions a brick is recovering into (DDS §4.3's write
	// lease): their members refuse prepares until the brick joins the
	// group or gives up, or dies (the janitor then ends the lease, or the
	// node's next incarnation takes it over); reads go on. Absent for most
	// partitions.
	Joining map[Partition]BrickID
	// Reshaping: the partitions a split or a merge holds the write lease
	// of (DDS §4.3: "A similar technique is used for DP map split and
	// merge operations, except that all replicas must be modified and both
	// the RG and DP maps are updated at the end of the operation"). Their
	// members refuse prepares, as under a recovery's lease, until the
	// holder decrees the new partitions or gives up, or is removed. Absent
	// for most partitions.
	Reshaping map[Partition]Reshape
	// Freeze: a checkpoint of the whole table in progress (DDS §4.1,
	// footnote 1: "during the checkpointing of a hash table, no
	// state-changing operations are allowed"): every member refuses
	// prepares until the holder decrees it over (checkpoint.go). ID 0:
	// none.
	Freeze Freeze
	// Checkpoint is the last checkpoint every replica wrote to its disk.
	// ID 0: none yet.
	Checkpoint Checkpoint
	// Replacing: the member a write lease's holder replaces (a move, DDS
	// §3.1: "When nodes are added, this partitioning is altered so that
	// data is spread onto the new node"; rebalance.go): the holder copies
	// the partition as a recovering brick does, the replaced member stops
	// serving reads (hands off), and the join decree puts the holder in
	// its place. Set only beside Joining; absent for most partitions.
	Replacing map[Partition]BrickID
}

// Freeze is a checkpoint's write lease on a whole table.
type Freeze struct {
	ID     uint64  // the checkpoint's: the epoch of the freeze's decree
	Holder BrickID // the brick that drives it: a member of some group
	// Write: every member was settled under the freeze (checkpoint.go,
	// step 2): bricks write their images now, not before.
	Write bool
}

// Checkpoint names a table's image on the bricks' disks.
type Checkpoint struct {
	ID    uint64
	Epoch uint64 // the epoch of the decree that recorded it done
}

// Reshape is a split's or a merge's write lease on a partition.
type Reshape struct {
	// Holder drives it: a member of the partition's group (the first, as
	// a rule), whose removal from the group ends the lease.
	Holder BrickID
	// Merge: the partition merges with its sibling, which holds the same
	// lease; else it splits in two.
	Merge bool
}

// Stamp is what a call piggybacks so that a brick can tell whether the
// caller's maps are its own: the epoch, and a 32-bit hash of the encoded
// maps (DDS footnote 2: "we currently use 32 bits"). The epoch orders two
// stamps; the hash catches two copies of one epoch that differ, which
// would be a bug.
type Stamp struct {
	Epoch uint64
	Hash  uint32
}

// Stamp of m.
func (m *Maps) Stamp() Stamp {
	return Stamp{Epoch: m.Epoch, Hash: crc32.Checksum(m.AppendBinary(nil), crc32.MakeTable(crc32.Castagnoli))}
}

// Group is the replica group of the partition holding key.
func (m *Maps) Group(key uint64) (Partition, []BrickID) {
	p := m.DP.Lookup(key)
	return p, m.RG[p]
}

// Validate checks the invariants.
func (m *Maps) Validate() error {
	if err := CheckName(m.Table); err != nil {
		return fmt.Errorf("%w: %q", err, m.Table)
	}
	if m.Replicas < 1 || m.Replicas > MaxReplicas {
		return fmt.Errorf("ddstable: table %q: replication degree %d (1 to %d)", m.Table, m.Replicas, MaxReplicas)
	}
	if m.DP == nil {
		return fmt.Errorf("ddstable: table %q: no DP map", m.Table)
	}
	leaves := m.DP.Leaves()
	if len(leaves) != len(m.RG) {
		return fmt.Errorf("ddstable: table %q: %d partitions but %d replica groups", m.Table, len(leaves), len(m.RG))
	}
	for p, b := range m.Joining {
		if !m.DP.Has(p) {
			return fmt.Errorf("ddstable: table %q: brick %v joins partition %v, which the DP map lacks", m.Table, b, p)
		}
		if b.Node == 0 || b.Inc == 0 {
			return fmt.Errorf("ddstable: table %q: joining brick %v: node and incarnation must be non-zero", m.Table, b)
		}
		for _, o := range m.RG[p] {
			if o.Node == b.Node {
				return fmt.Errorf("ddstable: table %q: node %d joins partition %v, whose group lists it", m.Table, b.Node, p)
			}
		}
		if len(m.RG[p]) >= m.Replicas && !slices.Contains(m.RG[p], m.Replacing[p]) {
			return fmt.Errorf("ddstable: table %q: brick %v joins partition %v, whose group is full", m.Table, b, p)
		}
	}
	for p, r := range m.Replacing {
		if j := m.Joining[p]; j == (BrickID{}) || r.Node == j.Node || r.Node == 0 || r.Inc == 0 {
			return fmt.Errorf("ddstable: table %q: partition %v: brick %v replaced by %v, which holds no lease there", m.Table, p, r, j)
		}
	}
	for p, r := range m.Reshaping {
		g := m.RG[p]
		switch {
		case !m.DP.Has(p):
			return fmt.Errorf("ddstable: table %q: a reshape of partition %v, which the DP map lacks", m.Table, p)
		case !slices.Contains(g, r.Holder) || r.Holder.Inc == 0:
			return fmt.Errorf("ddstable: table %q: reshape of %v held by %v, not a member of its group %v", m.Table, p, r.Holder, g)
		case m.Joining[p] != (BrickID{}):
			return fmt.Errorf("ddstable: table %q: partition %v is reshaped and recovered into at once", m.Table, p)
		case !r.Merge && p.Depth >= 64:
			return fmt.Errorf("ddstable: table %q: %v: %w", m.Table, p, ErrTooDeep)
		case r.Merge:
			sib, ok := p.Sibling()
			if !ok || m.Reshaping[sib] != r || !slices.Equal(m.RG[sib], g) {
				return fmt.Errorf("ddstable: table %q: a merge of %v without its sibling under the same lease and group", m.Table, p)
			}
		}
	}
	if m.Freeze.ID != 0 {
		member := false
		for _, g := range m.RG {
			member = member || slices.Contains(g, m.Freeze.Holder)
		}
		if !member || m.Freeze.Holder.Inc == 0 || m.Freeze.ID <= m.Checkpoint.ID {
			return fmt.Errorf("ddstable: table %q: checkpoint %d held by %v (a member; after checkpoint %d)", m.Table, m.Freeze.ID, m.Freeze.Holder, m.Checkpoint.ID)
		}
	}
	if (m.Checkpoint.ID == 0) != (m.Checkpoint.Epoch == 0) || m.Checkpoint.Epoch > m.Epoch {
		return fmt.Errorf("ddstable: table %q: checkpoint %d of epoch %d (at %d)", m.Table, m.Checkpoint.ID, m.Checkpoint.Epoch, m.Epoch)
	}
	for _, p := range leaves {
		g, ok := m.RG[p]
		if !ok {
			return fmt.Errorf("ddstable: table %q: partition %v has no replica group", m.Table, p)
		}
		if len(g) < 1 || len(g) > m.Replicas {
			return fmt.Errorf("ddstable: table %q: replica group %v has %d members (1 to the replication degree, %d)", m.Table, p, len(g), m.Replicas)
		}
		for i, b := range g {
			if b.Node == 0 || b.Inc == 0 {
				return fmt.Errorf("ddstable: table %q: brick %v in replica group %v: node and incarnation must be non-zero", m.Table, b, p)
			}
			for _, o := range g[:i] {
				if o.Node == b.Node {
					return fmt.Errorf("ddstable: table %q: node %d twice in replica group %v", m.Table, b.Node, p)
				}
			}
		}
	}
	return nil
}

// Clone is a deep copy.
func (m *Maps) Clone() *Maps {
	c := *m
	c.DP = m.DP.Clone()
	c.RG = make(map[Partition][]BrickID, len(m.RG))
	for p, g := range m.RG {
		c.RG[p] = slices.Clone(g)
	}
	c.Joining = maps.Clone(m.Joining)
	c.Reshaping = maps.Clone(m.Reshaping)
	c.Replacing = maps.Clone(m.Replacing)
	return &c
}

// Format versions of the maps' encoding: version 2 is version 1 with
// extensions after it (reshape leases, a checkpoint's freeze, the last
// checkpoint), and is written only when one is set, so that maps without
// them encode as they did before they existed.
const (
	mapsVersion           = 1
	mapsVersionExtensions = 2
)

func (m *Maps) extended() bool {
	return len(m.Reshaping) > 0 || m.Freeze != (Freeze{}) || m.Checkpoint != (Checkpoint{}) || len(m.Replacing) > 0
}

// AppendBinary appends the canonical encoding of m:
//
//	byte      format version (1)
//	uvarint   len(Table), then Table's bytes
//	8 bytes   Gen, little-endian
//	uvarint   Epoch
//	uvarint   Replicas
//	...       the DP map (DPMap.AppendBinary)
//	per partition, in the DP map's trie order:
//	  uvarint   group size, then each member as two uvarints (node,
//	            incarnation), in group order
//	  uvarint   the joining brick's node, 0 if none; if not 0, its
//	            incarnation as a uvarint
//	version 2 only (at least one extension is set):
//	uvarint   the number of reshape leases
//	per lease, in the DP map's trie order of its partition:
//	  uvarint   the partition's index in that order (increasing)
//	  byte      1 for a merge, 0 for a split
//	  uvarint   ×2 the holder's node and incarnation
//	uvarint   the freeze's checkpoint id, 0 if none; if not 0, the
//	          holder's node and incarnation as uvarints, then a byte: 1
//	          if its images are being written (Write), else 0
//	uvarint   the last checkpoint's id, 0 if none; if not 0, its epoch
//	uvarint   the number of moves (Replacing); per move, in the DP map's
//	          trie order: the partition's index (increasing), then the
//	          replaced member's node and incarnation as uvarints
//
// A group's order is kept (it is not sorted): the first member is the one a
// recovering brick asks first, so it is part of what the hash covers.
func (m *Maps) AppendBinary(b []byte) []byte {
	if m.extended() {
		b = append(b, mapsVersionExtensions)
	} else {
		b = append(b, mapsVersion)
	}
	b = appendUvarint(b, uint64(len(m.Table)))
	b = append(b, m.Table...)
	b = binary.LittleEndian.AppendUint64(b, m.Gen)
	b = appendUvarint(b, m.Epoch)
	b = appendUvarint(b, uint64(m.Replicas))
	b = m.DP.AppendBinary(b)
	for _, p := range m.DP.Leaves() {
		g := m.RG[p]
		b = appendUvarint(b, uint64(len(g)))
		for _, id := range g {
			b = appendUvarint(b, id.Node)
			b = appendUvarint(b, id.Inc)
		}
		j, ok := m.Joining[p]
		if !ok {
			b = appendUvarint(b, 0)
			continue
		}
		b = appendUvarint(b, j.Node)
		b = appendUvarint(b, j.Inc)
	}
	if !m.extended() {
		return b
	}
	b = appendUvarint(b, uint64(len(m.Reshaping)))
	for i, p := range m.DP.Leaves() {
		r, ok := m.Reshaping[p]
		if !ok {
			continue
		}
		b = appendUvarint(b, uint64(i))
		if r.Merge {
			b = append(b, 1)
		} else {
			b = append(b, 0)
		}
		b = appendUvarint(b, r.Holder.Node)
		b = appendUvarint(b, r.Holder.Inc)
	}
	b = appendUvarint(b, m.Freeze.ID)
	if m.Freeze.ID != 0 {
		b = appendUvarint(b, m.Freeze.Holder.Node)
		b = appendUvarint(b, m.Freeze.Holder.Inc)
		if m.Freeze.Write {
			b = append(b, 1)
		} else {
			b = append(b, 0)
		}
	}
	b = appendUvarint(b, m.Checkpoint.ID)
	if m.Checkpoint.ID != 0 {
		b = appendUvarint(b, m.Checkpoint.Epoch)
	}
	b = appendUvarint(b, uint64(len(m.Replacing)))
	for i, p := range m.DP.Leaves() {
		if r, ok := m.Replacing[p]; ok {
			b = appendUvarint(b, uint64(i))
			b = appendUvarint(b, r.Node)
			b = appendUvarint(b, r.Inc)
		}
	}
	return b
}

// DecodeMaps reads what AppendBinary wrote, all of b, and validates it.
func DecodeMaps(b []byte) (*Maps, error) {
	if len(b) == 0 {
		return nil, errors.New("ddstable: maps: empty")
	}
	version := b[0]
	if version != mapsVersion && version != mapsVersionExtensions {
		return nil, fmt.Errorf("ddstable: maps: format version %d, this build reads %d and %d", b[0], mapsVersion, mapsVersionExtensions)
	}
	b = b[1:]
	n, b, err := readUvarint(b, "table name length")
	if err != nil {
		return nil, err
	}
	if n == 0 || n > MaxTableName || n > uint64(len(b)) {
		return nil, fmt.Errorf("ddstable: maps: table name of %d bytes (1 to %d, %d left)", n, MaxTableName, len(b))
	}
	m := &Maps{Table: string(b[:n])}
	b = b[n:]
	if len(b) < 8 {
		return nil, errors.New("ddstable: maps: truncated before the generation")
	}
	m.Gen, b = binary.LittleEndian.Uint64(b), b[8:]
	if m.Epoch, b, err = readUvarint(b, "epoch"); err != nil {
		return nil, err
	}
	r, b, err := readUvarint(b, "replication degree")
	if err != nil {
		return nil, err
	}
	if r < 1 || r > MaxReplicas {
		return nil, fmt.Errorf("ddstable: maps: replication degree %d (1 to %d)", r, MaxReplicas)
	}
	m.Replicas = int(r)
	if m.DP, b, err = decodeDPMap(b); err != nil {
		return nil, err
	}
	m.RG = make(map[Partition][]BrickID, m.DP.Len())
	for _, p := range m.DP.Leaves() {
		var k uint64
		if k, b, err = readUvarint(b, "group size"); err != nil {
			return nil, err
		}
		if k < 1 || k > MaxReplicas {
			return nil, fmt.Errorf("ddstable: maps: replica group %v of %d members (1 to %d)", p, k, MaxReplicas)
		}
		g := make([]BrickID, k)
		for i := range g {
			if g[i].Node, b, err = readUvarint(b, "brick node"); err != nil {
				return nil, err
			}
			if g[i].Inc, b, err = readUvarint(b, "brick incarnation"); err != nil {
				return nil, err
			}
		}
		m.RG[p] = g
		var j BrickID
		if j.Node, b, err = readUvarint(b, "joining node"); err != nil {
			return nil, err
		}
		if j.Node != 0 {
			if j.Inc, b, err = readUvarint(b, "joining incarnation"); err != nil {
				return nil, err
			}
			if m.Joining == nil {
				m.Joining = map[Partition]BrickID{}
			}
			m.Joining[p] = j
		}
	}
	if version == mapsVersionExtensions {
		if b, err = m.decodeExtensions(b); err != nil {
			return nil, err
		}
		if !m.extended() {
			return nil, errors.New("ddstable: maps: format version 2 with no extension (one map, one encoding: version 1)")
		}
	}
	if len(b) != 0 {
		return nil, fmt.Errorf("ddstable: maps: %d bytes left over", len(b))
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return m, nil
}

// decodeExtensions reads version 2's extensions into m.
func (m *Maps) decodeExtensions(b []byte) ([]byte, error) {
	leaves := m.DP.Leaves()
	n, b, err := readUvarint(b, "reshape count")
	if err != nil {
		return nil, err
	}
	if n > uint64(len(leaves)) {
		return nil, fmt.Errorf("ddstable: maps: %d reshape leases over %d partitions", n, len(leaves))
	}
	if n > 0 {
		m.Reshaping = make(map[Partition]Reshape, n)
	}
	next := uint64(0)
	for range n {
		var i uint64
		if i, b, err = readUvarint(b, "reshape partition"); err != nil {
			return nil, err
		}
		if i < next || i >= uint64(len(leaves)) {
			return nil, fmt.Errorf("ddstable: maps: reshape of partition index %d (from %d, of %d)", i, next, len(leaves))
		}
		next = i + 1
		if len(b) == 0 || b[0] > 1 {
			return nil, errors.New("ddstable: maps: a reshape's kind is truncated or not 0 or 1")
		}
		r := Reshape{Merge: b[0] == 1}
		b = b[1:]
		if r.Holder.Node, b, err = readUvarint(b, "reshape holder node"); err != nil {
			return nil, err
		}
		if r.Holder.Inc, b, err = readUvarint(b, "reshape holder incarnation"); err != nil {
			return nil, err
		}
		m.Reshaping[leaves[i]] = r
	}
	if m.Freeze.ID, b, err = readUvarint(b, "freeze id"); err != nil {
		return nil, err
	}
	if m.Freeze.ID != 0 {
		if m.Freeze.Holder.Node, b, err = readUvarint(b, "freeze holder node"); err != nil {
			return nil, err
		}
		if m.Freeze.Holder.Inc, b, err = readUvarint(b, "freeze holder incarnation"); err != nil {
			return nil, err
		}
		if len(b) == 0 || b[0] > 1 {
			return nil, errors.New("ddstable: maps: a freeze's write flag is truncated or not 0 or 1")
		}
		m.Freeze.Write, b = b[0] == 1, b[1:]
	}
	if m.Checkpoint.ID, b, err = readUvarint(b, "checkpoint id"); err != nil {
		return nil, err
	}
	if m.Checkpoint.ID != 0 {
		if m.Checkpoint.Epoch, b, err = readUvarint(b, "checkpoint epoch"); err != nil {
			return nil, err
		}
	}
	if n, b, err = readUvarint(b, "move count"); err != nil {
		return nil, err
	}
	if n > uint64(len(leaves)) {
		return nil, fmt.Errorf("ddstable: maps: %d moves over %d partitions", n, len(leaves))
	}
	if n > 0 {
		m.Replacing = make(map[Partition]BrickID, n)
	}
	next = 0
	for range n {
		var i uint64
		if i, b, err = readUvarint(b, "move partition"); err != nil {
			return nil, err
		}
		if i < next || i >= uint64(len(leaves)) {
			return nil, fmt.Errorf("ddstable: maps: move of partition index %d (from %d, of %d)", i, next, len(leaves))
		}
		next = i + 1
		var r BrickID
		if r.Node, b, err = readUvarint(b, "replaced node"); err != nil {
			return nil, err
		}
		if r.Inc, b, err = readUvarint(b, "replaced incarnation"); err != nil {
			return nil, err
		}
		m.Replacing[leaves[i]] = r
	}
	return b, nil
}

func appendUvarint(b []byte, v uint64) []byte { return binary.AppendUvarint(b, v) }

func readUvarint(b []byte, what string) (uint64, []byte, error) {
	v, n := binary.Uvarint(b)
	if n <= 0 {
		return 0, nil, fmt.Errorf("ddstable: %s: a truncated or overlong varint", what)
	}
	if n != len(binary.AppendUvarint(nil, v)) {
		// One value, one encoding: the encoding is what the hash covers.
		return 0, nil, fmt.Errorf("ddstable: %s: a varint of %d bytes for %d", what, n, v)
	}
	return v, b[n:], nil
}

// Errors of the recovery transitions.
var (
	ErrNotShort   = errors.New("ddstable: the partition's group is full")
	ErrLeaseHeld  = errors.New("ddstable: another brick is recovering into the partition")
	ErrLeaseLost  = errors.New("ddstable: the brick's write lease on the partition is gone")
	ErrInGroup    = errors.New("ddstable: the brick's node is in the partition's group")
	ErrNoSuchPart = errors.New("ddstable: no such partition")
)

// WithLease is m with brick b holding partition p's write lease for its
// recovery into p's group (DDS §4.3, step 1), the epoch bumped: the
// members refuse prepares from the new epoch on.
func WithLease(m *Maps, p Partition, b BrickID) (*Maps, error) {
	g, ok := m.RG[p]
	switch {
	case !ok:
		return nil, fmt.Errorf("%w: %v", ErrNoSuchPart, p)
	case len(g) >= m.Replicas:
		return nil, ErrNotShort
	case slices.ContainsFunc(g, func(o BrickID) bool { return o.Node == b.Node }):
		return nil, ErrInGroup
	case m.Reshaping[p] != (Reshape{}):
		return nil, ErrReshaping
	case m.Freeze.ID != 0:
		return nil, ErrCheckpointing
	}
	if j, ok := m.Joining[p]; ok && j != b && (j.Node != b.Node || j.Inc > b.Inc) {
		// (An earlier incarnation of b's node held it: that one has died
		// or will fence itself before it can join — its join decree names
		// it, and fails once the lease is b's; review 122.)
		return nil, fmt.Errorf("%w: %v", ErrLeaseHeld, j)
	}
	c := m.Clone()
	if c.Joining == nil {
		c.Joining = map[Partition]BrickID{}
	}
	c.Joining[p] = b
	c.Epoch++
	return c, c.Validate()
}

// Joined is m with brick b, which holds p's write lease and has copied the
// whole partition, in p's group and the lease released (DDS §4.3: "a
// recovering node only joins the replica group after it has successfully
// copied over the entire partition's data but before it release its
// write lease").
func Joined(m *Maps, p Partition, b BrickID) (*Maps, error) {
	if j, ok := m.Joining[p]; !ok || j != b {
		return nil, ErrLeaseLost
	}
	c := m.Clone()
	if r, ok := c.Replacing[p]; ok {
		// A move: the holder takes the replaced member's place (which
		// handed off first, or was removed as dead meanwhile) — unless a
		// member died meanwhile and the group is short: then the replaced
		// member stays, and the move has been a recovery (a swap then would
		// leave the partition on fewer live copies: the simulator's seed
		// 143 lost one so, the holder dying just after its join).
		if len(c.RG[p]) >= c.Replicas {
			c.RG[p] = slices.DeleteFunc(c.RG[p], func(o BrickID) bool { return o == r })
		}
		delete(c.Replacing, p)
	}
	c.RG[p] = append(c.RG[p], b)
	delete(c.Joining, p)
	c.Epoch++
	return c, c.Validate()
}

// WithoutLease is m with b's lease on p released (a recovery given up).
func WithoutLease(m *Maps, p Partition, b BrickID) (*Maps, bool) {
	if j, ok := m.Joining[p]; !ok || j != b {
		return m, false
	}
	c := m.Clone()
	delete(c.Joining, p)
	delete(c.Replacing, p)
	c.Epoch++
	return c, true
}
