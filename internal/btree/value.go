package btree

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
)

// Values in chunks of their own. A leaf entry whose key and value together
// pass the tree's inline limit (Config.MaxInline) keeps only a reference
// in the leaf (Node.Ext marks it); the value is in a chunk written whole,
// durably, before the change that names it commits, and never written
// again: an overwrite writes a new chunk. The old one is freed once the
// change that replaced it is durable, with no grace period: a lock-free
// reader that took the old reference from an image current at some instant
// of its call reads either the value of that instant, or a freed chunk
// (chunk.ErrUnallocated: the chunk manager never hands an id out twice),
// and then starts again from the root, like a reader that meets a freed
// node.
//
// This file is the encoding of both: it does no I/O (the lint test keeps
// it so).

// MaxValue bounds a value (1 MiB): larger ones are refused with ErrTooLarge.
const MaxValue = 1 << 20

// ValueRef names a value in a chunk of its own, with its length and
// CRC-32C (a reader checks the chunk against both).
type ValueRef struct {
	Chunk  Handle
	Length uint32
	CRC    uint32
}

// refSize is the size of an encoded ValueRef in a leaf: u32 CM, u64 ID,
// u32 length, u32 CRC.
const refSize = 20

// extFlag marks a leaf value's length word (on the chunk) as a reference's.
const extFlag = 1 << 31

// Encode returns r as stored in a leaf.
func (r ValueRef) Encode() []byte {
	b := make([]byte, refSize)
	putHandle(b, r.Chunk)
	binary.LittleEndian.PutUint32(b[12:], r.Length)
	binary.LittleEndian.PutUint32(b[16:], r.CRC)
	return b
}

// DecodeRef decodes a leaf's stored reference.
func DecodeRef(b []byte) (ValueRef, error) {
	if len(b) != refSize {
		return ValueRef{}, fmt.Errorf("%w: a value reference of %d bytes", ErrCorrupt, len(b))
	}
	r := ValueRef{Chunk: getHandle(b), Length: binary.LittleEndian.Uint32(b[12:]), CRC: binary.LittleEndian.Uint32(b[16:])}
	if r.Chunk.IsZero() || r.Length > MaxValue {
		return ValueRef{}, fmt.Errorf("%w: value reference %v of %d bytes", ErrCorrupt, r.Chunk, r.Length)
	}
	return r, nil
}

// On-chunk layout of a value (little-endian):
//
//	0   [4]  magic "GBV1"
//	4   u32  value length
//	8   u32  CRC-32C of bytes 12.. (the rest of the header and the value)
//	12  u64  tree id
//	20  u32  self CM  } the chunk this value belongs in: a value read from
//	24  u64  self ID  } another chunk (a misdirected write) is refused
//	32       the value
const (
	valueMagic  = "GBV1"
	valueHeader = 32
)

// ValueChunkSize is the chunk size a value of n bytes needs.
func ValueChunkSize(n int) uint64 { return uint64(valueHeader + n) }

// EncodeValue returns the chunk image of val, for chunk self of tree, and
// the reference a leaf keeps.
func EncodeValue(tree uint64, self Handle, val []byte) ([]byte, ValueRef) {
	b := make([]byte, valueHeader+len(val))
	copy(b, valueMagic)
	binary.LittleEndian.PutUint32(b[4:], uint32(len(val)))
	binary.LittleEndian.PutUint64(b[12:], tree)
	putHandle(b[20:], self)
	copy(b[valueHeader:], val)
	sum := crc32.Checksum(b[12:], castagnoli)
	binary.LittleEndian.PutUint32(b[8:], sum)
	return b, ValueRef{Chunk: self, Length: uint32(len(val)), CRC: crc32.Checksum(val, castagnoli)}
}

// DecodeValue checks the chunk image b (at least ValueChunkSize of r's
// length) against tree and r, and returns the value (sharing no memory
// with b).
func DecodeValue(b []byte, tree uint64, r ValueRef) ([]byte, error) {
	if err := formatVersionError(b, valueMagic, "value chunk"); err != nil {
		return nil, fmt.Errorf("value chunk %v: %w", r.Chunk, err)
	}
	if len(b) < valueHeader || string(b[:4]) != valueMagic {
		return nil, fmt.Errorf("%w: value chunk %v has no value header", ErrCorrupt, r.Chunk)
	}
	n := binary.LittleEndian.Uint32(b[4:])
	if n != r.Length || uint64(len(b)) < ValueChunkSize(int(n)) {
		return nil, fmt.Errorf("%w: value chunk %v holds %d bytes (%d read), its reference says %d", ErrCorrupt, r.Chunk, n, len(b), r.Length)
	}
	b = b[:valueHeader+int(n)]
	if crc32.Checksum(b[12:], castagnoli) != binary.LittleEndian.Uint32(b[8:]) {
		return nil, fmt.Errorf("%w: value chunk %v: checksum mismatch (torn or flipped)", ErrCorrupt, r.Chunk)
	}
	if t, self := binary.LittleEndian.Uint64(b[12:]), getHandle(b[20:]); t != tree || self != r.Chunk {
		return nil, fmt.Errorf("%w: chunk %v holds the value of chunk %v of tree %d (wanted tree %d): a misdirected write", ErrCorrupt, r.Chunk, self, t, tree)
	}
	v := append([]byte(nil), b[valueHeader:]...)
	if crc32.Checksum(v, castagnoli) != r.CRC {
		return nil, fmt.Errorf("%w: value chunk %v is not the value its reference names (checksum)", ErrCorrupt, r.Chunk)
	}
	return v, nil
}
