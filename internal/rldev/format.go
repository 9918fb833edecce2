package rldev

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// On-disk format. A segment is one contiguous extent of a node's disk:
//
//	offset 0       metadata area (MetaSize = 256 KiB), 4 KiB pages in A/B pairs:
//	  0 KiB          superblock A            4 KiB  superblock B
//	  8 KiB          dirty-region log A     12 KiB  dirty-region log B
//	 16 KiB          degraded-mode log A    20 KiB  degraded-mode log B
//	 24 KiB          token table A (64 KiB) 88 KiB  token table B (64 KiB)
//	152 KiB          owed ranges A (8 KiB) 160 KiB  owed ranges B (8 KiB)
//	256 KiB        physical blocks, PhysBlockSize (4608) bytes each:
//	  +0             header (HeaderSize = 512 bytes, little endian):
//	                   0  magic "GRVB" (u32)    4  version (u16)   6  flags (u16, 0)
//	                   8  RLDev id (u64)       16  block number (u64)
//	                  24  generation (u64)     32  CRC-32C (u32)   36..511 zero
//	  +512           data (BlockSize = 4096 bytes)
//
// The CRC covers the whole header (its own field taken as zero) and the
// data, so a torn write (some sectors old, some new), a flipped bit, and a
// block of another RLDev or another block number (a misdirected write) are
// all detected when the block is read. An all-zero physical block is a
// block never written: it reads as zeros. (A written block that becomes all
// zeros is indistinguishable from an unwritten one on that replica; the
// scrubber finds it by comparing generations with the peer.)
//
// The generation is the write's sequence number from the primary (its
// config epoch in the high 24 bits, a counter in the low 40), so that of
// two copies of a block the newer is known.
//
// Metadata pages are written in A/B pairs, alternately, each with a
// sequence number and a CRC: a torn page write leaves the other copy, and
// loading takes the valid copy with the higher sequence number.
const (
	BlockSize     = 4096
	HeaderSize    = 512
	PhysBlockSize = HeaderSize + BlockSize
	PageSize      = 4096
	MetaSize      = 256 << 10

	offSuper    = 0
	offDRL      = 8 << 10
	offDegraded = 16 << 10
	offTokens   = 24 << 10
	tokenArea   = 64 << 10
	offOwed     = 152 << 10
	owedArea    = 8 << 10
)

const (
	blockMagic  = 0x42565247 // "GRVB" little endian
	pageMagic   = 0x4d565247 // "GRVM"
	formatVer   = 1
	pageHdrSize = 32
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// SegmentSize is the bytes a segment of blocks logical blocks takes on
// disk, a multiple of 4 KiB.
func SegmentSize(blocks uint64) int64 {
	n := int64(MetaSize) + int64(blocks)*PhysBlockSize
	return (n + PageSize - 1) / PageSize * PageSize
}

// blockOff is the offset of block b's physical block within its segment.
func blockOff(b uint64) int64 { return MetaSize + int64(b)*PhysBlockSize }

// BlockStatus is what decoding a physical block found.
type BlockStatus int

const (
	BlockOK        BlockStatus = iota
	BlockEmpty                 // never written: reads as zeros
	BlockCorrupt               // bad magic, version or checksum: torn or rotten
	BlockMisplaced             // a valid block of another RLDev or block number
)

func (s BlockStatus) String() string {
	return [...]string{"ok", "empty", "corrupt", "misplaced"}[s]
}

// EncodeBlock fills dst (PhysBlockSize bytes) with block b of RLDev id at
// generation gen holding data (BlockSize bytes).
func EncodeBlock(dst []byte, id uint64, b uint64, gen uint64, data []byte) {
	if len(dst) != PhysBlockSize || len(data) != BlockSize {
		panic(fmt.Sprintf("rldev: EncodeBlock of %d bytes with %d of data", len(dst), len(data)))
	}
	copy(dst[HeaderSize:], data)
	EncodeHeader(dst[:HeaderSize], id, b, gen, dst[HeaderSize:])
}

// EncodeHeader fills hdr (HeaderSize bytes) with the header of block b of
// RLDev id at generation gen holding data (BlockSize bytes), which is
// written right after it on disk: EncodeBlock without the data's copy
// (the runtime writes the header and the data from where each is, in one
// vectored write: encodeBlocksVec).
func EncodeHeader(hdr []byte, id uint64, b uint64, gen uint64, data []byte) {
	if len(hdr) != HeaderSize || len(data) != BlockSize {
		panic(fmt.Sprintf("rldev: EncodeHeader of %d bytes with %d of data", len(hdr), len(data)))
	}
	clear(hdr)
	binary.LittleEndian.PutUint32(hdr[0:], blockMagic)
	binary.LittleEndian.PutUint16(hdr[4:], formatVer)
	binary.LittleEndian.PutUint64(hdr[8:], id)
	binary.LittleEndian.PutUint64(hdr[16:], b)
	binary.LittleEndian.PutUint64(hdr[24:], gen)
	binary.LittleEndian.PutUint32(hdr[32:], headerCRC(hdr, data))
}

// blockCRC is the CRC of a physical block (header and data together).
func blockCRC(p []byte) uint32 { return headerCRC(p[:HeaderSize], p[HeaderSize:]) }

// headerCRC is the CRC of a block whose header is hdr and data data: over
// the header with its CRC field taken as zero, then the data.
func headerCRC(hdr, data []byte) uint32 {
	var zero [4]byte
	c := crc32.Update(0, castagnoli, hdr[:32])
	c = crc32.Update(c, castagnoli, zero[:])
	c = crc32.Update(c, castagnoli, hdr[36:])
	return crc32.Update(c, castagnoli, data)
}

// DecodeBlock checks a physical block read from where block b of RLDev id
// lives and returns its data (aliasing src) and generation.
func DecodeBlock(src []byte, id uint64, b uint64) (data []byte, gen uint64, st BlockStatus) {
	if len(src) != PhysBlockSize {
		return nil, 0, BlockCorrupt
	}
	if binary.LittleEndian.Uint32(src[0:]) != blockMagic {
		if allZero(src) {
			return src[HeaderSize:], 0, BlockEmpty
		}
		return nil, 0, BlockCorrupt
	}
	if binary.LittleEndian.Uint16(src[4:]) != formatVer || binary.LittleEndian.Uint32(src[32:]) != blockCRC(src) {
		return nil, 0, BlockCorrupt
	}
	if binary.LittleEndian.Uint64(src[8:]) != id || binary.LittleEndian.Uint64(src[16:]) != b {
		return nil, 0, BlockMisplaced
	}
	return src[HeaderSize:], binary.LittleEndian.Uint64(src[24:]), BlockOK
}

// zeroPage is compared against (bytes.Equal is vectorized: a byte loop
// over every empty block a read meets cost a seventh of a read's CPU).
var zeroPage [PhysBlockSize]byte

func allZero(p []byte) bool {
	for len(p) > 0 {
		n := min(len(p), len(zeroPage))
		if !bytes.Equal(p[:n], zeroPage[:n]) {
			return false
		}
		p = p[n:]
	}
	return true
}

// Page kinds.
const (
	PageSuper    = 1
	PageDRL      = 2
	PageDegraded = 3
	PageTokens   = 4
	PageOwed     = 5 // owed.go
)

// ErrBadPage: neither copy of a metadata page is valid.
var ErrBadPage = errors.New("rldev: metadata page corrupt or missing")

// EncodePage returns a metadata page of size bytes (PageSize, or tokenArea
// for the token table): header {magic, kind (u16), version (u16), seq
// (u64), payload length (u32), CRC-32C (u32)} padded to 32 bytes, then the
// payload, zero padded.
func EncodePage(kind uint16, seq uint64, payload []byte, size int) ([]byte, error) {
	if len(payload) > size-pageHdrSize {
		return nil, fmt.Errorf("rldev: %d-byte payload over the %d-byte page", len(payload), size-pageHdrSize)
	}
	p := make([]byte, size)
	binary.LittleEndian.PutUint32(p[0:], pageMagic)
	binary.LittleEndian.PutUint16(p[4:], kind)
	binary.LittleEndian.PutUint16(p[6:], formatVer)
	binary.LittleEndian.PutUint64(p[8:], seq)
	binary.LittleEndian.PutUint32(p[16:], uint32(len(payload)))
	copy(p[pageHdrSize:], payload)
	binary.LittleEndian.PutUint32(p[20:], pageCRC(p))
	return p, nil
}

func pageCRC(p []byte) uint32 {
	var zero [4]byte
	c := crc32.Update(0, castagnoli, p[:20])
	c = crc32.Update(c, castagnoli, zero[:])
	return crc32.Update(c, castagnoli, p[24:])
}

// DecodePage checks one copy of a page of kind and returns its sequence
// number and payload (aliasing p); ok is false for an invalid or blank
// copy.
func DecodePage(p []byte, kind uint16) (seq uint64, payload []byte, ok bool) {
	if len(p) < pageHdrSize || binary.LittleEndian.Uint32(p[0:]) != pageMagic ||
		binary.LittleEndian.Uint16(p[4:]) != kind || binary.LittleEndian.Uint16(p[6:]) != formatVer {
		return 0, nil, false
	}
	n := binary.LittleEndian.Uint32(p[16:])
	if int64(n) > int64(len(p)-pageHdrSize) || binary.LittleEndian.Uint32(p[20:]) != pageCRC(p) {
		return 0, nil, false
	}
	return binary.LittleEndian.Uint64(p[8:]), p[pageHdrSize : pageHdrSize+int(n)], true
}

// NewestPage picks the valid copy with the higher sequence number of an
// A/B pair; ok is false if neither copy is valid (never written, or both
// corrupt).
func NewestPage(a, b []byte, kind uint16) (seq uint64, payload []byte, ok bool) {
	sa, pa, oka := DecodePage(a, kind)
	sb, pb, okb := DecodePage(b, kind)
	switch {
	case oka && (!okb || sa >= sb):
		return sa, pa, true
	case okb:
		return sb, pb, true
	}
	return 0, nil, false
}

// pageSlot is the offset within a segment of copy (0 = A, 1 = B) of a
// page of kind, and the page's size.
func pageSlot(kind uint16, copyIdx uint64) (off int64, size int) {
	switch kind {
	case PageSuper:
		return offSuper + int64(copyIdx)*PageSize, PageSize
	case PageDRL:
		return offDRL + int64(copyIdx)*PageSize, PageSize
	case PageDegraded:
		return offDegraded + int64(copyIdx)*PageSize, PageSize
	case PageTokens:
		return offTokens + int64(copyIdx)*tokenArea, tokenArea
	case PageOwed:
		return offOwed + int64(copyIdx)*owedArea, owedArea
	}
	panic(fmt.Sprintf("rldev: unknown page kind %d", kind))
}

// BlockRun names N consecutive physical blocks of RLDev ID from block
// First, as a DiskRead asks for them.
type BlockRun struct{ ID, First, N uint64 }

// RunData is a run of blocks read and checked: the blocks' data (zeros for
// a block that failed its check), their generations, and the blocks that
// failed (corrupt or misplaced).
type RunData struct {
	Data []byte
	Gens []uint64
	Bad  []uint64
}

// Decode checks every block of the run read into raw (N physical blocks)
// and returns their data, in raw's memory: block i's data is moved down
// over the headers, to where block i-1's physical block ended, so no
// block's data is overwritten before it is checked (and a 1 MiB read
// allocates, zeroes and copies one buffer, not two). Measured against a
// vectored read that puts the headers apart (preadv into 512-byte and 4
// KiB buffers, no move): the kernel's copy into many small buffers cost
// more than the move saves (1 MiB reads 1.0 -> 1.1 ms, in-process).
func (run BlockRun) Decode(raw []byte) RunData {
	res := RunData{Data: raw[:int(run.N)*BlockSize], Gens: make([]uint64, run.N)}
	for i := uint64(0); i < run.N; i++ {
		dst := res.Data[i*BlockSize : (i+1)*BlockSize]
		d, g, st := DecodeBlock(raw[i*PhysBlockSize:(i+1)*PhysBlockSize], run.ID, run.First+i)
		if st == BlockCorrupt || st == BlockMisplaced {
			res.Bad = append(res.Bad, run.First+i)
			clear(dst)
			continue
		}
		copy(dst, d)
		res.Gens[i] = g
	}
	return res
}
