package ddstable

import (
	"errors"
	"fmt"
	"strings"
)

// MaxPartitions bounds the leaves of one table's DP map, so that a decoded
// map (from the config service or a brick's "repair" answer) cannot ask for
// unbounded memory. DDS's largest table had 512 partitions.
const MaxPartitions = 1 << 16

// Partition names a leaf of a DP map: the keys whose Depth low-order bits
// equal Bits (DDS §4.2, Figure 3). It is also the name of the partition's
// replica group. Written as a bit string with the least significant bit
// rightmost, as in the paper: partition "10" holds the keys with bit 1 set
// and bit 0 clear; the root partition (every key) is written "*".
//
// Invariant: Depth ≤ 64 and Bits < 1<<Depth.
type Partition struct {
	Bits  uint64
	Depth uint8
}

// Root is the partition of a table that has never split: every key.
var Root = Partition{}

func mask(depth uint8) uint64 {
	if depth >= 64 {
		return ^uint64(0)
	}
	return 1<<depth - 1
}

// Valid reports whether p satisfies the invariant.
func (p Partition) Valid() bool {
	return p.Depth <= 64 && p.Bits&^mask(p.Depth) == 0
}

// Contains reports whether key falls in p.
func (p Partition) Contains(key uint64) bool {
	return key&mask(p.Depth) == p.Bits
}

// Children are the two partitions a split of p makes (DDS: "partition 10
// could split into partitions 010 and 110"): the next-higher key bit is
// prepended. ok is false at depth 64, where no bit is left.
func (p Partition) Children() (zero, one Partition, ok bool) {
	if p.Depth >= 64 {
		return Partition{}, Partition{}, false
	}
	zero = Partition{Bits: p.Bits, Depth: p.Depth + 1}
	one = Partition{Bits: p.Bits | 1<<p.Depth, Depth: p.Depth + 1}
	return zero, one, true
}

// Parent is the partition a merge of p with its sibling makes ("000 and
// 100 could be merged into a single partition 00"). ok is false for Root.
func (p Partition) Parent() (Partition, bool) {
	if p.Depth == 0 {
		return Partition{}, false
	}
	d := p.Depth - 1
	return Partition{Bits: p.Bits & mask(d), Depth: d}, true
}

// Sibling is the partition p merges with: p's parent's other child. ok
// is false for Root.
func (p Partition) Sibling() (Partition, bool) {
	if p.Depth == 0 {
		return Partition{}, false
	}
	return Partition{Bits: p.Bits ^ 1<<(p.Depth-1), Depth: p.Depth}, true
}

func (p Partition) String() string {
	if p.Depth == 0 {
		return "*"
	}
	var b strings.Builder
	for i := int(p.Depth) - 1; i >= 0; i-- {
		if p.Bits>>uint(i)&1 == 1 {
			b.WriteByte('1')
		} else {
			b.WriteByte('0')
		}
	}
	return b.String()
}

// ParsePartition reads a partition written as String writes it.
func ParsePartition(s string) (Partition, error) {
	if s == "*" {
		return Root, nil
	}
	if s == "" || len(s) > 64 {
		return Partition{}, fmt.Errorf("ddstable: partition %q: want 1 to 64 binary digits, or * for the root", s)
	}
	var p Partition
	for _, c := range s {
		p.Bits <<= 1
		switch c {
		case '0':
		case '1':
			p.Bits |= 1
		default:
			return Partition{}, fmt.Errorf("ddstable: partition %q: %q is not a binary digit", s, c)
		}
	}
	p.Depth = uint8(len(s))
	return p, nil
}

// DPMap is a table's data partitioning map (DDS §4.2): a binary trie over
// keys walked from the least significant key bit down to a leaf, which
// names the key's partition. A split turns a leaf into an internal node
// with two leaves; a merge turns an internal node whose children are both
// leaves back into a leaf.
//
// Invariant: every internal node has exactly two children, so every key
// reaches exactly one leaf; there are at most MaxPartitions leaves.
//
// A DPMap is not safe for concurrent mutation; Lookup may run concurrently
// with other Lookups.
type DPMap struct {
	root   *dpNode
	leaves int
}

type dpNode struct {
	child [2]*dpNode // both nil for a leaf, both set for an internal node
}

func (n *dpNode) leaf() bool { return n.child[0] == nil }

// NewDPMap is a map of one partition, Root.
func NewDPMap() *DPMap { return &DPMap{root: &dpNode{}, leaves: 1} }

// NewDPMapUniform is a map of 2^depth partitions of equal depth, the shape
// a table created with that many partitions starts with.
func NewDPMapUniform(depth uint8) (*DPMap, error) {
	if depth > 16 {
		return nil, fmt.Errorf("ddstable: %d initial partitions is too many (at most %d)", uint64(1)<<depth, MaxPartitions)
	}
	var build func(d uint8) *dpNode
	build = func(d uint8) *dpNode {
		if d == depth {
			return &dpNode{}
		}
		return &dpNode{child: [2]*dpNode{build(d + 1), build(d + 1)}}
	}
	return &DPMap{root: build(0), leaves: 1 << depth}, nil
}

// Lookup is the partition of key: the leaf reached by walking the trie from
// key bit 0 upward.
func (m *DPMap) Lookup(key uint64) Partition {
	n, p := m.root, Partition{}
	for !n.leaf() {
		bit := key >> p.Depth & 1
		p.Bits |= bit << p.Depth
		p.Depth++
		n = n.child[bit]
	}
	return p
}

// Len is the number of partitions.
func (m *DPMap) Len() int { return m.leaves }

// Leaves are the partitions in trie order (the 0 child before the 1 child at
// each level).
func (m *DPMap) Leaves() []Partition {
	out := make([]Partition, 0, m.leaves)
	var walk func(n *dpNode, p Partition)
	walk = func(n *dpNode, p Partition) {
		if n.leaf() {
			out = append(out, p)
			return
		}
		z, o, _ := p.Children()
		walk(n.child[0], z)
		walk(n.child[1], o)
	}
	walk(m.root, Partition{})
	return out
}

// find is the trie node named p, or nil.
func (m *DPMap) find(p Partition) *dpNode {
	if !p.Valid() {
		return nil
	}
	n := m.root
	for d := uint8(0); d < p.Depth; d++ {
		if n.leaf() {
			return nil
		}
		n = n.child[p.Bits>>d&1]
	}
	return n
}

// Errors of Split and Merge.
var (
	ErrNotLeaf      = errors.New("ddstable: not a partition of this map")
	ErrNotMergeable = errors.New("ddstable: not the parent of two partitions")
	ErrTooDeep      = errors.New("ddstable: a partition of depth 64 cannot split")
	ErrTooMany      = fmt.Errorf("ddstable: a table has at most %d partitions", MaxPartitions)
)

// Split replaces partition p by its two children.
func (m *DPMap) Split(p Partition) error {
	n := m.find(p)
	if n == nil || !n.leaf() {
		return fmt.Errorf("split %v: %w", p, ErrNotLeaf)
	}
	if p.Depth >= 64 {
		return fmt.Errorf("split %v: %w", p, ErrTooDeep)
	}
	if m.leaves >= MaxPartitions {
		return fmt.Errorf("split %v: %w", p, ErrTooMany)
	}
	n.child = [2]*dpNode{{}, {}}
	m.leaves++
	return nil
}

// Merge replaces the two children of parent, both partitions, by parent.
func (m *DPMap) Merge(parent Partition) error {
	n := m.find(parent)
	if n == nil || n.leaf() || !n.child[0].leaf() || !n.child[1].leaf() {
		return fmt.Errorf("merge into %v: %w", parent, ErrNotMergeable)
	}
	n.child = [2]*dpNode{}
	m.leaves--
	return nil
}

// Has reports whether p is a partition (a leaf) of m.
func (m *DPMap) Has(p Partition) bool {
	n := m.find(p)
	return n != nil && n.leaf()
}

// Clone is a deep copy.
func (m *DPMap) Clone() *DPMap {
	var cp func(n *dpNode) *dpNode
	cp = func(n *dpNode) *dpNode {
		if n.leaf() {
			return &dpNode{}
		}
		return &dpNode{child: [2]*dpNode{cp(n.child[0]), cp(n.child[1])}}
	}
	return &DPMap{root: cp(m.root), leaves: m.leaves}
}

// Equal reports whether m and o have the same partitions.
func (m *DPMap) Equal(o *DPMap) bool {
	var eq func(a, b *dpNode) bool
	eq = func(a, b *dpNode) bool {
		if a.leaf() || b.leaf() {
			return a.leaf() == b.leaf()
		}
		return eq(a.child[0], b.child[0]) && eq(a.child[1], b.child[1])
	}
	return eq(m.root, o.root)
}

// AppendBinary appends the trie's canonical encoding: its nodes in preorder,
// one bit each (1 internal, 0 leaf), packed least significant bit first,
// after a uvarint count of the bits. Equal maps encode equally, so the
// encoding is what a map's hash covers.
func (m *DPMap) AppendBinary(b []byte) []byte {
	var bits []bool
	var walk func(n *dpNode)
	walk = func(n *dpNode) {
		bits = append(bits, !n.leaf())
		if !n.leaf() {
			walk(n.child[0])
			walk(n.child[1])
		}
	}
	walk(m.root)
	b = appendUvarint(b, uint64(len(bits)))
	packed := make([]byte, (len(bits)+7)/8)
	for i, v := range bits {
		if v {
			packed[i/8] |= 1 << (i % 8)
		}
	}
	return append(b, packed...)
}

// decodeDPMap reads what AppendBinary wrote and returns the rest of b. It
// refuses a trie deeper than 64, with more than MaxPartitions leaves, with
// nodes missing or left over, or with nonzero padding bits.
func decodeDPMap(b []byte) (*DPMap, []byte, error) {
	n, b, err := readUvarint(b, "DP map size")
	if err != nil {
		return nil, nil, err
	}
	if n == 0 || n > 2*MaxPartitions-1 {
		return nil, nil, fmt.Errorf("ddstable: DP map of %d trie nodes (1 to %d)", n, 2*MaxPartitions-1)
	}
	nb := int((n + 7) / 8)
	if len(b) < nb {
		return nil, nil, fmt.Errorf("ddstable: DP map truncated: %d trie nodes need %d bytes, %d left", n, nb, len(b))
	}
	packed, rest := b[:nb], b[nb:]
	if pad := n % 8; pad != 0 && packed[nb-1]>>pad != 0 {
		return nil, nil, errors.New("ddstable: DP map: padding bits set")
	}
	i, leaves := 0, 0
	var build func(depth int) (*dpNode, error)
	build = func(depth int) (*dpNode, error) {
		if i >= int(n) {
			return nil, errors.New("ddstable: DP map: the trie ends early")
		}
		internal := packed[i/8]>>(i%8)&1 == 1
		i++
		if !internal {
			leaves++
			return &dpNode{}, nil
		}
		if depth >= 64 {
			return nil, errors.New("ddstable: DP map deeper than 64 key bits")
		}
		z, err := build(depth + 1)
		if err != nil {
			return nil, err
		}
		o, err := build(depth + 1)
		if err != nil {
			return nil, err
		}
		return &dpNode{child: [2]*dpNode{z, o}}, nil
	}
	root, err := build(0)
	if err != nil {
		return nil, nil, err
	}
	if i != int(n) {
		return nil, nil, fmt.Errorf("ddstable: DP map: %d trie nodes left over", int(n)-i)
	}
	if leaves > MaxPartitions {
		return nil, nil, ErrTooMany
	}
	return &DPMap{root: root, leaves: leaves}, rest, nil
}
