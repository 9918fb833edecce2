package btree

// This file is the node delta: a log record that carries the change from
// one image of a node to the next instead of the next whole image. It does
// no I/O (the lint test keeps it so).
//
// Why: a put changes one entry of a leaf, but a whole image costs the log
// the leaf's size (about 5 KB for 256-byte values in 8 KiB nodes, written
// on both replicas of the log's RLDev). A delta costs the entry and a
// header.
//
// The rule that keeps deltas recoverable (the full-page-write rule, as in
// PostgreSQL): a delta replays only onto its base, and a node's chunk can
// be torn by a write-back that a crash cut off (its CRC catches that, but
// then only a whole image can repair it), so the first record of a node
// after each write-back snapshot of it is a whole image, and deltas follow
// only while that image is in the log (Cache.commit and Cache.writeBack
// keep it; replayChains uses it).
//
// Layout of a delta (a redo-only update of the node's chunk target at
// offset deltaOff; integers little-endian):
//
//	0   [4]  magic "GBD1"
//	4   u64  the base image's version
//	12  u32  the base image's length
//	16  u32  the base image's CRC (its bytes 8..12)
//	20  u32  P: bytes of the base kept after its header
//	24  u32  S: bytes of the base kept before its trailing CRC
//	28  [96] the new image's header
//	124      the new image's middle bytes, then its trailing CRC [4]
//
// The new image is its header, the base's bytes [96, 96+P), the middle,
// the base's S bytes before its trailing CRC, and its trailing CRC; it
// must decode (its CRC covers every byte but the first 12), so a delta
// applied to anything but its base is refused, never half-applied.

import (
	"encoding/binary"
	"fmt"
)

const (
	deltaMagic = "GBD1"
	deltaHdr   = 28
	// deltaOff is the record offset that marks a delta (a whole image is
	// logged at offset 0). A build from before deltas refuses a record
	// at any other offset (replayApplier.Apply), so it fails a replay
	// of a log that holds deltas instead of misreading it.
	deltaOff = 1
)

// makeDelta returns the delta from node image base to node image next,
// if it is smaller than next (a whole image is logged then).
func makeDelta(base, next []byte) ([]byte, bool) {
	if len(base) < headerSize+4 || len(next) < headerSize+4 ||
		!isNodeImage(base) || !isNodeImage(next) {
		return nil, false
	}
	bb := base[headerSize : len(base)-4]
	nb := next[headerSize : len(next)-4]
	p := 0
	for p < len(bb) && p < len(nb) && bb[p] == nb[p] {
		p++
	}
	s := 0
	for s < len(bb)-p && s < len(nb)-p && bb[len(bb)-1-s] == nb[len(nb)-1-s] {
		s++
	}
	mid := nb[p : len(nb)-s]
	size := deltaHdr + headerSize + len(mid) + 4
	if size >= len(next) {
		return nil, false
	}
	d := make([]byte, 0, size)
	d = append(d, deltaMagic...)
	d = binary.LittleEndian.AppendUint64(d, binary.LittleEndian.Uint64(base[84:]))
	d = binary.LittleEndian.AppendUint32(d, uint32(len(base)))
	d = append(d, base[8:12]...)
	d = binary.LittleEndian.AppendUint32(d, uint32(p))
	d = binary.LittleEndian.AppendUint32(d, uint32(s))
	d = append(d, next[:headerSize]...)
	d = append(d, mid...)
	d = append(d, next[len(next)-4:]...)
	return d, true
}

// deltaVersions returns a delta's base version and the version of the
// image it makes (ok false: not a delta).
func deltaVersions(d []byte) (base, next uint64, ok bool) {
	if len(d) < deltaHdr+headerSize+4 || string(d[:4]) != deltaMagic {
		return 0, 0, false
	}
	return binary.LittleEndian.Uint64(d[4:]), binary.LittleEndian.Uint64(d[deltaHdr+84:]), true
}

// applyDelta returns the image delta d makes of image base, checked: base
// must have d's base version and length (and, with exact, its bytes: the
// CRC), and the result must decode as a node of d's new version. Without
// exact, base may differ from the image the delta was made from in its
// header's LSN and token (a chunk's image of that version, which its
// write-back wrote with the commit's LSN and the pin's token): the delta
// carries the new header whole, and the new image's CRC, over every byte
// of its body, refuses a base whose body is not the delta's.
func applyDelta(base, d []byte, exact bool) ([]byte, error) {
	bv, nv, ok := deltaVersions(d)
	if !ok {
		return nil, fmt.Errorf("%w: not a node delta", ErrCorrupt)
	}
	blen := int(binary.LittleEndian.Uint32(d[12:]))
	p := int(binary.LittleEndian.Uint32(d[20:]))
	s := int(binary.LittleEndian.Uint32(d[24:]))
	if blen < headerSize+4 || blen > len(base) || !isNodeImage(base) ||
		int(binary.LittleEndian.Uint32(base[4:])) != blen ||
		binary.LittleEndian.Uint64(base[84:]) != bv || exact && string(base[8:12]) != string(d[16:20]) {
		return nil, fmt.Errorf("%w: a delta of node version %d applied to another image", ErrCorrupt, bv)
	}
	body := blen - headerSize - 4
	if p < 0 || s < 0 || p > body || s > body-p {
		return nil, fmt.Errorf("%w: a delta keeps %d+%d bytes of a %d-byte body", ErrCorrupt, p, s, body)
	}
	mid := d[deltaHdr+headerSize : len(d)-4]
	n := headerSize + p + len(mid) + s + 4
	if n > MaxNodeSize {
		return nil, fmt.Errorf("%w: a delta makes a %d-byte node", ErrCorrupt, n)
	}
	out := make([]byte, 0, n)
	out = append(out, d[deltaHdr:deltaHdr+headerSize]...)
	out = append(out, base[headerSize:headerSize+p]...)
	out = append(out, mid...)
	out = append(out, base[blen-4-s:blen-4]...)
	out = append(out, d[len(d)-4:]...)
	if int(binary.LittleEndian.Uint32(out[4:])) != n {
		return nil, fmt.Errorf("%w: a delta's header gives another length than it makes", ErrCorrupt)
	}
	nd, err := decode(out)
	if err != nil {
		return nil, fmt.Errorf("btree: a delta to node version %d: %w", nv, err)
	}
	if nd.Version != nv {
		return nil, fmt.Errorf("%w: a delta to version %d made version %d", ErrCorrupt, nv, nd.Version)
	}
	return out, nil
}
