// Package btree is Sagiv's B-link tree (Boxwood §2.2, §3.7) over a store
// of node images that are coherent across servers: lookups take no locks,
// an insert holds one node lock at a time even when a split climbs several
// levels, a delete holds one, and compression merges or rebalances
// under-full nodes holding three.
//
// This file is the node: its fields, its size accounting and its on-chunk
// encoding. It does no I/O (the lint test keeps it so).
package btree

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

	"github.com/grovestore/grove/internal/chunk"
	"github.com/grovestore/grove/internal/lock"
)

// Handle names a node: the chunk that holds its image.
type Handle = chunk.Handle

// Limits. Keys are 1..MaxKey bytes (the empty key is reserved: it is the
// low bound of a level's leftmost node, below every key).
const (
	MaxKey = 1024
	// MinNodeSize bounds NodeSize from below: a node must hold its two
	// bounds (at most MaxKey each) and two entries of the largest size
	// (see Config.MaxEntry), so that every split leaves two legal halves.
	MinNodeSize = 8 << 10
	// MaxNodeSize bounds NodeSize from above (one log record per image).
	MaxNodeSize = 256 << 10
	// MaxGarbage bounds the removed nodes one node keeps until their
	// grace period ends (compression declines to merge into a full list).
	MaxGarbage = 32
)

// Node is one node of a B-link tree, as an immutable image: a change makes
// a new image (copy on write), so a lock-free reader always sees a whole
// one.
//
// A node at Level covers the keys k with Low <= k < High (High unbounded
// when HighInf); the empty Low is the leftmost node's (below every key).
// Invariant: at each level, following Right from the leftmost node visits
// live nodes in key order, each one's High equal to the next one's Low, the
// last one HighInf.
//
// A leaf holds Keys and Vals. An internal node holds separators and
// children: Kids[i] covers [Keys[i], Keys[i+1]) and Keys[0] == Low.
//
// A node removed by compression (Deleted) keeps its image, with Onward
// naming the node its keys went to (the left one of the merged pair), so
// that an operation holding a stale pointer to it finds its way on; the
// chunk is freed once its grace period is over (the absorbing node lists it
// in Garbage until then).
type Node struct {
	Self    Handle
	Tree    uint64 // the tree's id (its anchor chunk's ID): an image of another tree is refused
	Level   uint8  // 0: leaf
	Deleted bool
	// Version counts the node's images: each change makes the next one,
	// whichever server makes it (it holds the node's lock, and the latest
	// image). Recovery writes a logged image only over an older version.
	Version uint64
	LSN     uint64     // the log position of the change that made this image (0: none)
	Token   lock.Token // the node lock's token when this image was written (diagnostic)
	Low     []byte
	High    []byte
	HighInf bool
	Right   Handle // the next node at this level (zero: none)
	Onward  Handle // Deleted: the node that took its keys
	Keys    [][]byte
	Vals    [][]byte // leaves
	// Ext marks the leaf values kept in chunks of their own (value.go):
	// Vals[i] is then the value's encoded ValueRef. nil when none is;
	// otherwise as long as Keys.
	Ext     []bool
	Kids    []Handle // internal nodes
	Garbage []Garbage
	// Done holds a leaf's completion records of tokened writes to keys
	// it covers (completion.go), sorted by key; Horizon is the newest
	// stamp of a record evicted for room. Both only in format version 2
	// images: a node without them is written as version 1.
	Done    []Completion
	Horizon int64
	// Floors: the floors of clients whose records below them this leaf
	// dropped (completion.go), in no order; also only in version 2.
	Floors []Floor
}

// Garbage is a removed node waiting for the end of its grace period: no
// operation that could still hold a pointer to it runs past Deadline
// (nanoseconds of the tree's clock).
type Garbage struct {
	Node     Handle
	Deadline int64
}

// Leaf reports whether n is a leaf.
func (n *Node) Leaf() bool { return n.Level == 0 }

// Covers reports whether key falls in [Low, High).
func (n *Node) Covers(key []byte) bool {
	return bytes.Compare(key, n.Low) >= 0 && (n.HighInf || bytes.Compare(key, n.High) < 0)
}

// Clone returns a copy that shares the keys' and values' bytes (which are
// never written in place) but not the slices.
func (n *Node) Clone() *Node {
	c := *n
	c.Keys = append([][]byte(nil), n.Keys...)
	c.Vals = append([][]byte(nil), n.Vals...)
	c.Kids = append([]Handle(nil), n.Kids...)
	c.Garbage = append([]Garbage(nil), n.Garbage...)
	c.Ext = nil
	if n.Ext != nil {
		c.Ext = append([]bool(nil), n.Ext...)
	}
	c.Done = append([]Completion(nil), n.Done...)
	c.Floors = append([]Floor(nil), n.Floors...)
	if n.Leaf() {
		c.Kids = nil
	} else {
		c.Vals = nil
	}
	return &c
}

// IsExt reports whether leaf entry i's value is in a chunk of its own
// (Vals[i] is its reference).
func (n *Node) IsExt(i int) bool { return n.Ext != nil && n.Ext[i] }

// Refs returns the references of the leaf's values in chunks of their own.
func (n *Node) Refs() []ValueRef {
	var out []ValueRef
	for i := range n.Ext {
		if n.Ext[i] {
			if r, err := DecodeRef(n.Vals[i]); err == nil {
				out = append(out, r)
			}
		}
	}
	return out
}

// setVal sets leaf entry i's stored value (a reference if ext).
func (n *Node) setVal(i int, val []byte, ext bool) {
	n.Vals[i] = val
	if ext && n.Ext == nil {
		n.Ext = make([]bool, len(n.Keys))
	}
	if n.Ext != nil {
		n.Ext[i] = ext
	}
}

// insertEntry inserts a leaf entry at i.
func (n *Node) insertEntry(i int, key, val []byte, ext bool) {
	n.Keys = insertAt(n.Keys, i, key)
	n.Vals = insertAt(n.Vals, i, val)
	if ext && n.Ext == nil {
		n.Ext = make([]bool, len(n.Keys)-1)
	}
	if n.Ext != nil {
		n.Ext = insertAt(n.Ext, i, ext)
	}
}

// removeEntry removes leaf entry i.
func (n *Node) removeEntry(i int) {
	n.Keys = removeAt(n.Keys, i)
	n.Vals = removeAt(n.Vals, i)
	if n.Ext != nil {
		n.Ext = removeAt(n.Ext, i)
		n.compactExt()
	}
}

// compactExt sets Ext to nil when no entry is external.
func (n *Node) compactExt() {
	for _, e := range n.Ext {
		if e {
			return
		}
	}
	n.Ext = nil
}

// extRange returns Ext[lo:hi] of a leaf as a new slice (nil if none is
// external).
func (n *Node) extRange(lo, hi int) []bool {
	if n.Ext == nil {
		return nil
	}
	out := append([]bool(nil), n.Ext[lo:hi]...)
	for _, e := range out {
		if e {
			return out
		}
	}
	return nil
}

// appendEntries appends leaf b's entries to leaf n's.
func (n *Node) appendEntries(b *Node) {
	if n.Ext != nil || b.Ext != nil {
		ext := n.Ext
		if ext == nil {
			ext = make([]bool, len(n.Keys))
		}
		if b.Ext != nil {
			ext = append(ext, b.Ext...)
		} else {
			ext = append(ext, make([]bool, len(b.Keys))...)
		}
		n.Ext = ext
	}
	n.Keys = append(n.Keys, b.Keys...)
	n.Vals = append(n.Vals, b.Vals...)
}

// Search returns the position of key among n.Keys: the index of the first
// key >= key, and whether it is equal.
func (n *Node) Search(key []byte) (int, bool) {
	lo, hi := 0, len(n.Keys)
	for lo < hi {
		m := (lo + hi) / 2
		if bytes.Compare(n.Keys[m], key) < 0 {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo, lo < len(n.Keys) && bytes.Equal(n.Keys[lo], key)
}

// Child returns the index of the child of internal node n that covers key
// (key must be covered by n).
func (n *Node) Child(key []byte) int {
	i, eq := n.Search(key)
	if eq {
		return i
	}
	if i == 0 {
		panic(fmt.Sprintf("btree: key %q below node %v's first separator %q", key, n.Self, n.Keys[0]))
	}
	return i - 1
}

// ChildBelow returns the index of the child that covers the keys just
// below key (the largest keys < key), for reverse scans: the last child
// whose separator is < key. key must be > n.Low.
func (n *Node) ChildBelow(key []byte) int {
	i, _ := n.Search(key) // first separator >= key
	if i == 0 {
		panic(fmt.Sprintf("btree: key %q not above node %v's low bound", key, n.Self))
	}
	return i - 1
}

// IndexOf returns the index of child h in internal node n, or -1.
func (n *Node) IndexOf(h Handle) int {
	for i, k := range n.Kids {
		if k == h {
			return i
		}
	}
	return -1
}

// Entries counts n's entries (keys of a leaf, children of an internal node).
func (n *Node) Entries() int { return len(n.Keys) }

// On-chunk layout of a node (all integers little-endian; the rest of the
// chunk, past Length, is not read). The magic's last byte is the format's
// version (as for values, "GBV1", and anchors, "GBA1"): a change to a
// layout takes the next digit, and its build reads both; an image of a
// version this build does not know is refused as such (formatVersionError),
// not as corruption.
//
//	0   [4]  magic "GBN1"
//	4   u32  Length: bytes of the image, this header and the CRC included
//	8   u32  CRC-32C of bytes 12..Length
//	12  u8   level
//	13  u8   flags: 1 deleted, 2 high unbounded
//	14  u16  number of entries
//	16  u64  tree id
//	24  u32  self CM   } the chunk this image belongs in: an image read
//	28  u64  self ID   } from another chunk (a misdirected write) is refused
//	36  u64  LSN
//	44  u64  token epoch
//	52  u64  token seq
//	60  u32  right CM,  64 u64 right ID
//	72  u32  onward CM, 76 u64 onward ID
//	84  u64  version
//	92  u16  garbage entries
//	94  u16  low key length,  then the low key
//	    u16  high key length, then the high key
//	    entries: u16 key length, key, then
//	             a leaf's: u32 value length, value
//	             an internal node's: u32 child CM, u64 child ID
//	    garbage: u32 CM, u64 ID, i64 deadline, each
//
// Version 2 ("GBN2", a leaf with completion records or a horizon:
// completion.go) adds, before the trailing CRC:
//
//	     the completion records, each:
//	     u16 key length, key, [16] client, u64 seq, u64 fingerprint,
//	     i64 stamp, u8 flags (1 applied, 2 found)
//	i64  horizon
//	u16  the number of records
//	u32  the offset of the horizon in the image (a node delta cuts
//	     the image there: delta.go)
//
// A node without either is written as version 1, so that only tokened
// writes (which a cluster sends only once every member reads version 2)
// make version 2 images.
const (
	nodeMagic   = "GBN1"
	nodeMagic2  = "GBN2"
	headerSize  = 96
	leafExtra   = 2 + 4 // key and value lengths
	innerExtra  = 2 + 12
	garbageSize = 20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrCorrupt: a node, anchor or value image does not decode (torn,
// flipped, misdirected, or not such an image at all).
var ErrCorrupt = errors.New("btree: chunk image is corrupt")

// ErrFormatVersion: an image in a format version this build does not read
// (see the node layout). It is an ErrCorrupt too, for callers that only
// tell good images from bad ones.
var ErrFormatVersion = fmt.Errorf("%w: unknown format version", ErrCorrupt)

// isNodeImage reports whether b starts with a node image's magic, of a
// version this build reads.
func isNodeImage(b []byte) bool {
	return len(b) >= 4 && (string(b[:4]) == nodeMagic || string(b[:4]) == nodeMagic2)
}

// Size is the length of n's encoding.
func (n *Node) Size() int {
	return n.entriesSize() + n.doneSize()
}

// entriesSize is the length of n's encoding without its completion
// records: what splits, merges and rebalances go by (fits, underfull,
// mergeable), since records make room for entries (trimDone), never the
// reverse.
func (n *Node) entriesSize() int {
	s := headerSize + len(n.Low) + 2 + len(n.High) + len(n.Garbage)*garbageSize + 4
	for i, k := range n.Keys {
		s += EntrySize(n.Leaf(), k, n.val(i))
	}
	return s
}

func (n *Node) val(i int) []byte {
	if n.Leaf() {
		return n.Vals[i]
	}
	return nil
}

// EntrySize is the encoded size of one entry.
func EntrySize(leaf bool, key, val []byte) int {
	if leaf {
		return leafExtra + len(key) + len(val)
	}
	return innerExtra + len(key)
}

// Encode appends n's image to b.
func (n *Node) Encode(b []byte) []byte {
	start := len(b)
	var h [headerSize]byte
	copy(h[0:], nodeMagic)
	v2 := n.version2()
	if v2 {
		copy(h[0:], nodeMagic2)
	}
	h[12] = n.Level
	if n.Deleted {
		h[13] |= 1
	}
	if n.HighInf {
		h[13] |= 2
	}
	binary.LittleEndian.PutUint16(h[14:], uint16(len(n.Keys)))
	binary.LittleEndian.PutUint64(h[16:], n.Tree)
	putHandle(h[24:], n.Self)
	binary.LittleEndian.PutUint64(h[36:], n.LSN)
	binary.LittleEndian.PutUint64(h[44:], uint64(n.Token.Epoch))
	binary.LittleEndian.PutUint64(h[52:], n.Token.Seq)
	putHandle(h[60:], n.Right)
	putHandle(h[72:], n.Onward)
	binary.LittleEndian.PutUint64(h[84:], n.Version)
	binary.LittleEndian.PutUint16(h[92:], uint16(len(n.Garbage)))
	binary.LittleEndian.PutUint16(h[94:], uint16(len(n.Low)))
	b = append(b, h[:]...)
	b = append(b, n.Low...)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(n.High)))
	b = append(b, n.High...)
	for i, k := range n.Keys {
		b = binary.LittleEndian.AppendUint16(b, uint16(len(k)))
		b = append(b, k...)
		if n.Leaf() {
			l := uint32(len(n.Vals[i]))
			if n.IsExt(i) {
				l |= extFlag
			}
			b = binary.LittleEndian.AppendUint32(b, l)
			b = append(b, n.Vals[i]...)
		} else {
			b = binary.LittleEndian.AppendUint32(b, n.Kids[i].CM)
			b = binary.LittleEndian.AppendUint64(b, n.Kids[i].ID)
		}
	}
	for _, g := range n.Garbage {
		b = binary.LittleEndian.AppendUint32(b, g.Node.CM)
		b = binary.LittleEndian.AppendUint64(b, g.Node.ID)
		b = binary.LittleEndian.AppendUint64(b, uint64(g.Deadline))
	}
	if v2 {
		b = n.appendDone(b, start)
	}
	b = binary.LittleEndian.AppendUint32(b, 0) // room for the CRC, then fill in the length and CRC
	img := b[start:]
	binary.LittleEndian.PutUint32(img[4:], uint32(len(img)))
	// The CRC covers 12..Length-4 and the trailing word holds it too: the
	// header's copy is the one checked; the trailer makes a torn tail fail.
	sum := crc32.Checksum(img[12:len(img)-4], castagnoli)
	binary.LittleEndian.PutUint32(img[8:], sum)
	binary.LittleEndian.PutUint32(img[len(img)-4:], sum)
	return b
}

func putHandle(b []byte, h Handle) {
	binary.LittleEndian.PutUint32(b, h.CM)
	binary.LittleEndian.PutUint64(b[4:], h.ID)
}

func getHandle(b []byte) Handle {
	return Handle{CM: binary.LittleEndian.Uint32(b), ID: binary.LittleEndian.Uint64(b[4:])}
}

// Decode decodes the image at the start of b (a chunk's bytes), checking
// that it is whole and belongs in chunk self of tree. The node shares no
// memory with b.
func Decode(b []byte, tree uint64, self Handle) (*Node, error) {
	n, err := decode(b)
	if err != nil {
		return nil, err
	}
	if n.Tree != tree || n.Self != self {
		return nil, fmt.Errorf("%w: chunk %v holds the image of node %v of tree %d (wanted tree %d): a misdirected write", ErrCorrupt, self, n.Self, n.Tree, tree)
	}
	return n, nil
}

// formatVersionError is the error for an image whose magic is magic's
// but for its version byte (nil otherwise): written by a build with
// another format version of what (a newer Grove, a downgrade).
func formatVersionError(b []byte, magic, what string) error {
	if len(b) < 4 || string(b[:3]) != magic[:3] || b[3] == magic[3] || b[3] < '0' || b[3] > '9' {
		return nil
	}
	return fmt.Errorf("%w: a %s image of format version %c; this build reads version %c (written by another Grove version?)", ErrFormatVersion, what, b[3], magic[3])
}

func decode(b []byte) (*Node, error) {
	if len(b) >= 4 && string(b[:4]) != nodeMagic2 && formatVersionError(b, nodeMagic, "node") != nil {
		return nil, fmt.Errorf("%w: a node image of format version %c; this build reads versions 1 and 2 (written by another Grove version?)", ErrFormatVersion, b[3])
	}
	if len(b) < headerSize+6 || !isNodeImage(b) {
		return nil, fmt.Errorf("%w: no node header", ErrCorrupt)
	}
	length := int(binary.LittleEndian.Uint32(b[4:]))
	if length < headerSize+6 || length > len(b) || length > MaxNodeSize {
		return nil, fmt.Errorf("%w: length %d of a %d-byte chunk", ErrCorrupt, length, len(b))
	}
	b = b[:length]
	sum := crc32.Checksum(b[12:length-4], castagnoli)
	if sum != binary.LittleEndian.Uint32(b[8:]) || sum != binary.LittleEndian.Uint32(b[length-4:]) {
		return nil, fmt.Errorf("%w: checksum mismatch (torn or flipped)", ErrCorrupt)
	}
	n := &Node{
		Level:   b[12],
		Deleted: b[13]&1 != 0,
		HighInf: b[13]&2 != 0,
		Tree:    binary.LittleEndian.Uint64(b[16:]),
		Self:    getHandle(b[24:]),
		LSN:     binary.LittleEndian.Uint64(b[36:]),
		Token:   lock.Token{Epoch: lock.Epoch(binary.LittleEndian.Uint64(b[44:])), Seq: binary.LittleEndian.Uint64(b[52:])},
		Right:   getHandle(b[60:]),
		Onward:  getHandle(b[72:]),
		Version: binary.LittleEndian.Uint64(b[84:]),
	}
	if b[13]&^3 != 0 {
		return nil, fmt.Errorf("%w: unknown flags %#x", ErrCorrupt, b[13])
	}
	entries := int(binary.LittleEndian.Uint16(b[14:]))
	garbage := int(binary.LittleEndian.Uint16(b[92:]))
	r := reader{b: b[:length-4], off: 94}
	n.Low = r.bytes16()
	n.High = r.bytes16()
	if entries > 0 {
		n.Keys = make([][]byte, 0, entries)
		if n.Leaf() {
			n.Vals = make([][]byte, 0, entries)
		} else {
			n.Kids = make([]Handle, 0, entries)
		}
	}
	for i := 0; i < entries && r.err == nil; i++ {
		n.Keys = append(n.Keys, r.bytes16())
		if n.Leaf() {
			v, ext := r.value()
			n.Vals = append(n.Vals, v)
			if ext && n.Ext == nil {
				n.Ext = make([]bool, i, entries)
			}
			if n.Ext != nil {
				n.Ext = append(n.Ext, ext)
			}
		} else {
			n.Kids = append(n.Kids, r.handle())
		}
	}
	for i := 0; i < garbage && r.err == nil; i++ {
		g := Garbage{Node: r.handle()}
		g.Deadline = int64(r.u64())
		n.Garbage = append(n.Garbage, g)
	}
	if string(b[:4]) == nodeMagic2 {
		r.done(n)
	}
	if r.err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorrupt, r.err)
	}
	if r.off != len(r.b) {
		return nil, fmt.Errorf("%w: %d bytes past the last entry", ErrCorrupt, len(r.b)-r.off)
	}
	if err := n.Check(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	return n, nil
}

// Check verifies what one image alone must satisfy: keys within limits,
// sorted, inside the bounds; an internal node's first separator is its low
// bound; children and links are real handles.
func (n *Node) Check() error {
	if n.Self.IsZero() {
		return errors.New("no self handle")
	}
	if len(n.Low) > MaxKey || len(n.High) > MaxKey {
		return errors.New("a bound is longer than MaxKey")
	}
	if !n.HighInf && bytes.Compare(n.Low, n.High) >= 0 && !(n.Deleted && len(n.Keys) == 0) {
		return fmt.Errorf("low bound %q not below high bound %q", n.Low, n.High)
	}
	if n.HighInf && len(n.High) != 0 {
		return errors.New("an unbounded node with a high key")
	}
	if n.Deleted && n.Onward.IsZero() {
		return errors.New("a removed node without an onward link")
	}
	if n.Leaf() && len(n.Vals) != len(n.Keys) || !n.Leaf() && len(n.Kids) != len(n.Keys) {
		return errors.New("entries and values (or children) differ in number")
	}
	if n.Ext != nil && (!n.Leaf() || len(n.Ext) != len(n.Keys)) {
		return errors.New("value-chunk marks do not match the entries")
	}
	for i := range n.Ext {
		if n.Ext[i] {
			if _, err := DecodeRef(n.Vals[i]); err != nil {
				return fmt.Errorf("entry %d: %v", i, err)
			}
		}
	}
	if !n.Leaf() && !n.Deleted {
		if len(n.Keys) == 0 {
			return errors.New("an internal node without children")
		}
		if !bytes.Equal(n.Keys[0], n.Low) {
			return fmt.Errorf("first separator %q is not the low bound %q", n.Keys[0], n.Low)
		}
	}
	for i, k := range n.Keys {
		if len(k) > MaxKey || len(k) == 0 && (n.Leaf() || i > 0) {
			return fmt.Errorf("key %d has %d bytes", i, len(k))
		}
		if i > 0 && bytes.Compare(n.Keys[i-1], k) >= 0 {
			return fmt.Errorf("keys %d and %d out of order", i-1, i)
		}
		if !n.Deleted && !n.Covers(k) {
			return fmt.Errorf("key %q outside [%q, %q)", k, n.Low, n.High)
		}
		if !n.Leaf() && n.Kids[i].IsZero() {
			return fmt.Errorf("child %d is the zero handle", i)
		}
	}
	if len(n.Garbage) > MaxGarbage {
		return fmt.Errorf("%d garbage entries", len(n.Garbage))
	}
	return n.checkDone()
}

type reader struct {
	b   []byte
	off int
	err error
}

func (r *reader) take(k int) []byte {
	if r.err != nil {
		return nil
	}
	if k < 0 || r.off+k > len(r.b) {
		r.err = fmt.Errorf("truncated at byte %d", r.off)
		return nil
	}
	p := r.b[r.off : r.off+k]
	r.off += k
	return p
}

func (r *reader) bytes16() []byte {
	l := r.take(2)
	if l == nil {
		return nil
	}
	p := r.take(int(binary.LittleEndian.Uint16(l)))
	if p == nil || len(p) == 0 {
		return nil
	}
	return bytes.Clone(p)
}

func (r *reader) bytes32() []byte {
	l := r.take(4)
	if l == nil {
		return nil
	}
	p := r.take(int(binary.LittleEndian.Uint32(l)))
	if p == nil {
		return nil
	}
	return bytes.Clone(p)
}

// value reads a leaf's value: its length word's top bit marks a reference
// to a value in a chunk of its own.
func (r *reader) value() ([]byte, bool) {
	l := r.take(4)
	if l == nil {
		return nil, false
	}
	w := binary.LittleEndian.Uint32(l)
	p := r.take(int(w &^ extFlag))
	if p == nil {
		return nil, false
	}
	return bytes.Clone(p), w&extFlag != 0
}

func (r *reader) handle() Handle {
	p := r.take(12)
	if p == nil {
		return Handle{}
	}
	return getHandle(p)
}

func (r *reader) u64() uint64 {
	p := r.take(8)
	if p == nil {
		return 0
	}
	return binary.LittleEndian.Uint64(p)
}
