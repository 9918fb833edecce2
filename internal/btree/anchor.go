package btree

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
)

// MaxLevels bounds a tree's height (a tree of 8 KiB nodes holding only
// 1 KiB keys reaches a billion keys in 16 levels).
const MaxLevels = 32

// Anchor is a tree's fixed entry point, in the chunk that names the tree
// (the tree's id is that chunk's ID): the root and the leftmost node of
// every level (Lehman and Yao's "prime block"). Leftmost nodes are never
// removed (compression merges a node into its left neighbour), so the
// anchor changes only when the root splits.
//
// Invariant: Leftmost[len(Leftmost)-1] == Root, and the root's level is
// len(Leftmost)-1.
type Anchor struct {
	Self     Handle
	Version  uint64 // as a node's
	LSN      uint64
	Root     Handle
	Leftmost []Handle
	// Dropped: the tree is dropped (its drop's first step, under the
	// anchor's lock): no operation starts on it any more; the structure
	// stays, for the drop to free it.
	Dropped bool
}

// RootLevel is the root's level.
func (a *Anchor) RootLevel() int { return len(a.Leftmost) - 1 }

// Clone copies a.
func (a *Anchor) Clone() *Anchor {
	c := *a
	c.Leftmost = append([]Handle(nil), a.Leftmost...)
	return &c
}

// Layout (little-endian): [4] magic "GBA1", u32 length, u32 CRC-32C of
// 12..length, u32 self CM, u64 self ID, u64 version, u16 levels, then each
// level's leftmost node (u32 CM, u64 ID), then the CRC again. (The LSN is
// the cache's, not stored.)
const anchorMagic = "GBA1"

// droppedMagic starts a dropped tree's anchor (otherwise the same layout).
const droppedMagic = "GBAX"

// Encode appends a's image to b.
func (a *Anchor) Encode(b []byte) []byte {
	start := len(b)
	if a.Dropped {
		b = append(b, droppedMagic...)
	} else {
		b = append(b, anchorMagic...)
	}
	b = append(b, make([]byte, 8)...)
	b = binary.LittleEndian.AppendUint32(b, a.Self.CM)
	b = binary.LittleEndian.AppendUint64(b, a.Self.ID)
	b = binary.LittleEndian.AppendUint64(b, a.Version)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(a.Leftmost)))
	for _, h := range a.Leftmost {
		b = binary.LittleEndian.AppendUint32(b, h.CM)
		b = binary.LittleEndian.AppendUint64(b, h.ID)
	}
	b = binary.LittleEndian.AppendUint32(b, 0)
	img := b[start:]
	binary.LittleEndian.PutUint32(img[4:], uint32(len(img)))
	sum := crc32.Checksum(img[12:len(img)-4], castagnoli)
	binary.LittleEndian.PutUint32(img[8:], sum)
	binary.LittleEndian.PutUint32(img[len(img)-4:], sum)
	return b
}

// DecodeAnchor decodes the anchor image at the start of b, which must be
// chunk self's.
func DecodeAnchor(b []byte, self Handle) (*Anchor, error) {
	if err := formatVersionError(b, anchorMagic, "tree anchor"); err != nil {
		return nil, err
	}
	if len(b) < 34+4 || string(b[:4]) != anchorMagic && string(b[:4]) != droppedMagic {
		return nil, fmt.Errorf("%w: no anchor header", ErrCorrupt)
	}
	dropped := string(b[:4]) == droppedMagic
	length := int(binary.LittleEndian.Uint32(b[4:]))
	if length < 34+4 || length > len(b) {
		return nil, fmt.Errorf("%w: anchor length %d of a %d-byte chunk", ErrCorrupt, length, len(b))
	}
	b = b[:length]
	sum := crc32.Checksum(b[12:length-4], castagnoli)
	if sum != binary.LittleEndian.Uint32(b[8:]) || sum != binary.LittleEndian.Uint32(b[length-4:]) {
		return nil, fmt.Errorf("%w: anchor checksum mismatch", ErrCorrupt)
	}
	a := &Anchor{Self: getHandle(b[12:]), Version: binary.LittleEndian.Uint64(b[24:]), Dropped: dropped}
	levels := int(binary.LittleEndian.Uint16(b[32:]))
	if levels < 1 || levels > MaxLevels || 34+levels*12+4 != length {
		return nil, fmt.Errorf("%w: anchor of %d levels in %d bytes", ErrCorrupt, levels, length)
	}
	for i := 0; i < levels; i++ {
		h := getHandle(b[34+i*12:])
		if h.IsZero() {
			return nil, fmt.Errorf("%w: anchor level %d has no leftmost node", ErrCorrupt, i)
		}
		a.Leftmost = append(a.Leftmost, h)
	}
	a.Root = a.Leftmost[levels-1]
	if a.Self != self {
		return nil, fmt.Errorf("%w: chunk %v holds the anchor of %v: a misdirected write", ErrCorrupt, self, a.Self)
	}
	return a, nil
}
