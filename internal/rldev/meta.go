package rldev

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sort"

	"github.com/grovestore/grove/internal/lock"
)

// Region granularity of the two logs. A dirty-region log bit covers
// DRLRegionBlocks blocks (1 MiB): one log write is amortised over every
// write to a region while it stays dirty, and a crash costs at most the
// regions in flight to copy. A degraded-mode log bit covers
// DegradedRegionBlocks (64 KiB): resync copies what was written, not much
// more. Both grow for RLDevs too large for one page of bits.
const (
	DRLRegionBlocks      = 256
	DegradedRegionBlocks = 16
	maxPageBits          = (PageSize - pageHdrSize - 8) * 8
)

// regionBlocks is the region size of a log with at least min blocks per
// region for an RLDev of blocks blocks.
func regionBlocks(min, blocks uint64) uint64 {
	need := (blocks + maxPageBits - 1) / maxPageBits
	return max(min, need)
}

// Bitmap is a set of regions.
type Bitmap struct {
	RegionBlocks uint64
	Bits         []byte
}

// NewBitmap returns an empty bitmap over blocks blocks.
func NewBitmap(regionBlocks, blocks uint64) Bitmap {
	n := (blocks + regionBlocks - 1) / regionBlocks
	return Bitmap{RegionBlocks: regionBlocks, Bits: make([]byte, (n+7)/8)}
}

// Regions is the number of regions.
func (b Bitmap) Regions() uint64 { return uint64(len(b.Bits)) * 8 }

func (b Bitmap) Has(r uint64) bool { return r/8 < uint64(len(b.Bits)) && b.Bits[r/8]&(1<<(r%8)) != 0 }
func (b Bitmap) Set(r uint64)      { b.Bits[r/8] |= 1 << (r % 8) }
func (b Bitmap) Clear(r uint64)    { b.Bits[r/8] &^= 1 << (r % 8) }

// Empty reports whether no region is set.
func (b Bitmap) Empty() bool { return allZero(b.Bits) }

// Count is the number of regions set.
func (b Bitmap) Count() int {
	n := 0
	for _, c := range b.Bits {
		for ; c != 0; c &= c - 1 {
			n++
		}
	}
	return n
}

// Clone returns a copy.
func (b Bitmap) Clone() Bitmap {
	return Bitmap{RegionBlocks: b.RegionBlocks, Bits: append([]byte(nil), b.Bits...)}
}

// Span returns the regions that blocks [block, block+n) touch.
func (b Bitmap) Span(block, n uint64) (first, last uint64) {
	return block / b.RegionBlocks, (block + n - 1) / b.RegionBlocks
}

// List returns the set regions in order.
func (b Bitmap) List() []uint64 {
	var out []uint64
	for r := uint64(0); r < b.Regions(); r++ {
		if b.Has(r) {
			out = append(out, r)
		}
	}
	return out
}

func encodeBitmap(b Bitmap) []byte {
	p := make([]byte, 8+len(b.Bits))
	binary.LittleEndian.PutUint64(p, b.RegionBlocks)
	copy(p[8:], b.Bits)
	return p
}

// decodeBitmap checks a bitmap payload against the region size and block
// count the segment must have.
func decodeBitmap(p []byte, regionBlocks, blocks uint64) (Bitmap, error) {
	want := NewBitmap(regionBlocks, blocks)
	if len(p) != 8+len(want.Bits) || binary.LittleEndian.Uint64(p) != regionBlocks {
		return Bitmap{}, fmt.Errorf("rldev: bitmap of %d bytes (region %d), want %d bytes (region %d)",
			len(p), binary.LittleEndian.Uint64(append(append([]byte(nil), p[:min(len(p), 8)]...), make([]byte, 8)...)), 8+len(want.Bits), regionBlocks)
	}
	copy(want.Bits, p[8:])
	return want, nil
}

// Super is a segment's superblock: which RLDev it belongs to, the
// primary's generation floor (generations are taken below it, and it is
// raised, durably, before they reach it, so that they never repeat across
// a restart within one epoch), and whether the segment is incomplete (it
// was formatted as a stale replica, or lost with its disk: only a full
// copy makes it whole, whatever the degraded-mode log says; kept across
// restarts until a resync completes).
//
// TargetInc: the segment was formatted as a move's target by this
// incarnation of its node (0: not a target), and is incomplete until the
// move switches to it. The switch names the target's incarnation that
// received the whole copy (Move.Inc), so a later incarnation that finds
// its segment incomplete with TargetInc the one the table names holds the
// whole copy: that target died between the copy's end and the switch,
// before it could mark the segment complete itself (promote). Without it
// such a segment counted as lost, and a fault of its peer then left the
// RLDev nothing to serve (simulator seed 2000316).
//
// Overwritten: a full copy from the peer began writing onto this stale
// segment, which held writes of its own (a copy given up by an accept):
// until the copy ends it holds parts of two histories, writes the accept
// gave up beside the accepted copy's later ones, and grove rldev
// accept-stale refuses it without --mixed (outside review 80: the copy
// stopped, the RLDev back to degraded, nothing else said so).
//
// On disk, little-endian: RLDev, Blocks, GenFloor (8 bytes each), then
// Incomplete and Overwritten (1 byte each: 0 or 1), 6 zero bytes;
// TargetInc (8 bytes) follows only when not 0, so that a build before it
// reads every segment without it. A build before Overwritten refuses a
// superblock that has it (a cluster's nodes run one version).
type Super struct {
	RLDev       uint64
	Blocks      uint64
	GenFloor    uint64
	Incomplete  bool
	Overwritten bool
	TargetInc   uint64
}

const (
	superLen       = 32
	superTargetLen = 40 // with TargetInc
)

func encodeSuper(s Super) []byte {
	n := superLen
	if s.TargetInc != 0 {
		n = superTargetLen
	}
	p := make([]byte, n)
	binary.LittleEndian.PutUint64(p[0:], s.RLDev)
	binary.LittleEndian.PutUint64(p[8:], s.Blocks)
	binary.LittleEndian.PutUint64(p[16:], s.GenFloor)
	if s.Incomplete {
		p[24] = 1
	}
	if s.Overwritten {
		p[25] = 1
	}
	if s.TargetInc != 0 {
		binary.LittleEndian.PutUint64(p[32:], s.TargetInc)
	}
	return p
}

func decodeSuper(p []byte) (Super, error) {
	if (len(p) != superLen && len(p) != superTargetLen) || p[24] > 1 || p[25] > 1 || !allZero(p[26:32]) {
		return Super{}, fmt.Errorf("rldev: superblock of %d bytes does not decode", len(p))
	}
	s := Super{RLDev: binary.LittleEndian.Uint64(p[0:]), Blocks: binary.LittleEndian.Uint64(p[8:]),
		GenFloor: binary.LittleEndian.Uint64(p[16:]), Incomplete: p[24] == 1, Overwritten: p[25] == 1}
	if len(p) == superTargetLen {
		s.TargetInc = binary.LittleEndian.Uint64(p[32:])
		if s.TargetInc == 0 {
			return Super{}, fmt.Errorf("rldev: superblock of %d bytes names no target incarnation", len(p))
		}
	}
	return s, nil
}

// MaxTokenNames bounds the lock names a segment keeps tokens for (their
// table must fit one token page).
const MaxTokenNames = 56

// ErrTooManyTokens: a write's lock name would not fit the token table.
var ErrTooManyTokens = errors.New("rldev: too many lock names fence this RLDev")

func encodeTokens(m map[string]lock.Token) ([]byte, error) {
	if len(m) > MaxTokenNames {
		return nil, ErrTooManyTokens
	}
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	sort.Strings(names)
	p := binary.LittleEndian.AppendUint32(nil, uint32(len(names)))
	for _, n := range names {
		t := m[n]
		p = binary.LittleEndian.AppendUint16(p, uint16(len(n)))
		p = append(p, n...)
		p = binary.LittleEndian.AppendUint64(p, uint64(t.Epoch))
		p = binary.LittleEndian.AppendUint64(p, t.Seq)
	}
	if len(p) > tokenArea-pageHdrSize {
		return nil, ErrTooManyTokens
	}
	return p, nil
}

func decodeTokens(p []byte) (map[string]lock.Token, error) {
	bad := errors.New("rldev: token table does not decode")
	if len(p) < 4 {
		return nil, bad
	}
	n := binary.LittleEndian.Uint32(p)
	if n > MaxTokenNames {
		return nil, bad
	}
	p = p[4:]
	m := map[string]lock.Token{}
	for i := uint32(0); i < n; i++ {
		if len(p) < 2 {
			return nil, bad
		}
		l := int(binary.LittleEndian.Uint16(p))
		if l == 0 || l > lock.MaxNameLen || len(p) < 2+l+16 {
			return nil, bad
		}
		name := string(p[2 : 2+l])
		p = p[2+l:]
		m[name] = lock.Token{Epoch: lock.Epoch(binary.LittleEndian.Uint64(p)), Seq: binary.LittleEndian.Uint64(p[8:])}
		p = p[16:]
	}
	if len(p) != 0 {
		return nil, bad
	}
	return m, nil
}
