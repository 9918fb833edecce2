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
	// deltaMagic2 is the two-part delta of a version 2 image (a leaf with
	// completion records: completion.go): a put changes an entry and adds
	// a record at the other end of the image, so one middle would carry
	// most of the leaf; the delta cuts both images at their records
	// section (its offset is in the image's trailer) and keeps a prefix
	// and a suffix of each part; the trailer (the horizon, the records'
	// count and the section's offset, which most changes move) is carried
	// whole, as the header is. Layout: as GBD1's to byte 20, then
	//
	//	20  u32  P1, 24 u32 S1: bytes of the base's first part kept
	//	28  u32  P2, 32 u32 S2: bytes of its second part (the records)
	//	         kept
	//	36  u32  the first part's middle's length
	//	40  [96] the new image's header
	//	136 [14] the new image's trailer
	//	150      the first middle, the second, then the trailing CRC [4]
	deltaMagic2 = "GBD2"
	deltaHdr2   = 40
	doneTrailer = doneOverhead // a version 2 image's horizon, records count and section offset
	// deltaOff is the record offset that marks a delta (a whole image is
	// logged at offset 0). A build from before deltas refuses a record
	// at any other offset (replayApplier.Apply), so it fails a replay
	// of a log that holds deltas instead of misreading it.
	deltaOff = 1
)

// common returns the lengths of b's and n's common prefix and, in what
// is left, common suffix.
func common(b, n []byte) (p, s int) {
	for p < len(b) && p < len(n) && b[p] == n[p] {
		p++
	}
	for s < len(b)-p && s < len(n)-p && b[len(b)-1-s] == n[len(n)-1-s] {
		s++
	}
	return p, s
}

// makeDelta returns the delta from node image base to node image next,
// if it is smaller than next (a whole image is logged then).
func makeDelta(base, next []byte) ([]byte, bool) {
	if len(base) < headerSize+4 || len(next) < headerSize+4 ||
		!isNodeImage(base) || !isNodeImage(next) {
		return nil, false
	}
	d2, ok2 := makeDelta2(base, next)
	bb := base[headerSize : len(base)-4]
	nb := next[headerSize : len(next)-4]
	p, s := common(bb, nb)
	mid := nb[p : len(nb)-s]
	size := deltaHdr + headerSize + len(mid) + 4
	if ok2 && len(d2) <= size {
		return d2, true
	}
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

// makeDelta2 is the two-part delta between version 2 images, if both are
// and it is smaller than the next image.
func makeDelta2(base, next []byte) ([]byte, bool) {
	ob, on := doneOffset(base), doneOffset(next)
	if ob == 0 || on == 0 || len(base) != int(binary.LittleEndian.Uint32(base[4:])) || len(next) != int(binary.LittleEndian.Uint32(next[4:])) {
		return nil, false
	}
	b1, n1 := base[headerSize:ob], next[headerSize:on]
	b2, n2 := base[ob:len(base)-4-doneTrailer], next[on:len(next)-4-doneTrailer]
	p1, s1 := common(b1, n1)
	p2, s2 := common(b2, n2)
	mid1, mid2 := n1[p1:len(n1)-s1], n2[p2:len(n2)-s2]
	size := deltaHdr2 + headerSize + doneTrailer + len(mid1) + len(mid2) + 4
	if size >= len(next) {
		return nil, false
	}
	d := make([]byte, 0, size)
	d = append(d, deltaMagic2...)
	d = binary.LittleEndian.AppendUint64(d, binary.LittleEndian.Uint64(base[84:]))
	d = binary.LittleEndian.AppendUint32(d, uint32(len(base)))
	d = append(d, base[8:12]...)
	for _, v := range []int{p1, s1, p2, s2, len(mid1)} {
		d = binary.LittleEndian.AppendUint32(d, uint32(v))
	}
	d = append(d, next[:headerSize]...)
	d = append(d, next[len(next)-4-doneTrailer:len(next)-4]...)
	d = append(d, mid1...)
	d = append(d, mid2...)
	d = append(d, next[len(next)-4:]...)
	return d, true
}

// deltaVersions returns a delta's base version and the version of the
// image it makes (ok false: not a delta).
func deltaVersions(d []byte) (base, next uint64, ok bool) {
	hdr := deltaHdr
	switch {
	case len(d) >= 4 && string(d[:4]) == deltaMagic:
	case len(d) >= 4 && string(d[:4]) == deltaMagic2:
		hdr = deltaHdr2
	default:
		return 0, 0, false
	}
	if len(d) < hdr+headerSize+4 {
		return 0, 0, false
	}
	return binary.LittleEndian.Uint64(d[4:]), binary.LittleEndian.Uint64(d[hdr+84:]), true
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
	if blen < headerSize+4 || blen > len(base) || !isNodeImage(base) ||
		int(binary.LittleEndian.Uint32(base[4:])) != blen ||
		binary.LittleEndian.Uint64(base[84:]) != bv || exact && string(base[8:12]) != string(d[16:20]) {
		return nil, fmt.Errorf("%w: a delta of node version %d applied to another image", ErrCorrupt, bv)
	}
	// The base's parts, and what the delta keeps of each, with the middles.
	type part struct {
		b    []byte
		p, s int
		mid  []byte
	}
	var parts []part
	var trailer []byte // carried whole (GBD2)
	hdr := deltaHdr
	if string(d[:4]) == deltaMagic2 {
		hdr = deltaHdr2
		ob := doneOffset(base[:blen])
		m1 := int(binary.LittleEndian.Uint32(d[36:]))
		if len(d) < hdr+headerSize+doneTrailer+4 {
			return nil, fmt.Errorf("%w: a two-part delta too short", ErrCorrupt)
		}
		trailer = d[hdr+headerSize : hdr+headerSize+doneTrailer]
		mids := d[hdr+headerSize+doneTrailer : len(d)-4]
		if ob == 0 || m1 < 0 || m1 > len(mids) || ob > blen-4-doneTrailer {
			return nil, fmt.Errorf("%w: a two-part delta of node version %d applied to an image without records, or cut wrong", ErrCorrupt, bv)
		}
		parts = []part{
			{b: base[headerSize:ob], p: int(binary.LittleEndian.Uint32(d[20:])), s: int(binary.LittleEndian.Uint32(d[24:])), mid: mids[:m1]},
			{b: base[ob : blen-4-doneTrailer], p: int(binary.LittleEndian.Uint32(d[28:])), s: int(binary.LittleEndian.Uint32(d[32:])), mid: mids[m1:]},
		}
	} else {
		parts = []part{{b: base[headerSize : blen-4], p: int(binary.LittleEndian.Uint32(d[20:])), s: int(binary.LittleEndian.Uint32(d[24:])), mid: d[hdr+headerSize : len(d)-4]}}
	}
	n := headerSize + len(trailer) + 4
	for _, pt := range parts {
		if pt.p < 0 || pt.s < 0 || pt.p > len(pt.b) || pt.s > len(pt.b)-pt.p {
			return nil, fmt.Errorf("%w: a delta keeps %d+%d bytes of a %d-byte part", ErrCorrupt, pt.p, pt.s, len(pt.b))
		}
		n += pt.p + len(pt.mid) + pt.s
	}
	if n > MaxNodeSize {
		return nil, fmt.Errorf("%w: a delta makes a %d-byte node", ErrCorrupt, n)
	}
	out := make([]byte, 0, n)
	out = append(out, d[hdr:hdr+headerSize]...)
	for _, pt := range parts {
		out = append(out, pt.b[:pt.p]...)
		out = append(out, pt.mid...)
		out = append(out, pt.b[len(pt.b)-pt.s:]...)
	}
	out = append(out, trailer...)
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
