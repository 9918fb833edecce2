package fd

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// Wire format of a failure-detector datagram (beacons and echoes), fixed size,
// big-endian:
//
//	off len field
//	  0   4 magic "GFD1"
//	  4   1 kind (1 = beacon, 2 = echo)
//	  5   8 subject: id of the node whose liveness the packet is about
//	 13   8 incarnation of the subject
//	 21   8 seq: the subject's beacon sequence number
//	 29   8 observer: id of the echoing observer (0 in a beacon)
//	 37   4 CRC-32C of bytes 0..36
//
// UDP already carries a checksum; the CRC guards against datagrams that are
// not ours (a stray packet to the beacon port) more than against corruption.
const (
	PacketSize = 41
	magic      = "GFD1"
)

// Kind distinguishes beacons from echoes.
type Kind uint8

const (
	KindBeacon Kind = 1
	KindEcho   Kind = 2
)

func (k Kind) String() string {
	switch k {
	case KindBeacon:
		return "beacon"
	case KindEcho:
		return "echo"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Packet is a decoded beacon or echo.
type Packet struct {
	Kind        Kind
	Subject     NodeID
	Incarnation Incarnation
	Seq         uint64
	Observer    NodeID // set only in echoes
}

// Decoding errors. They are values: a bad datagram is dropped with a logged
// reason and never changes state.
var (
	ErrShortPacket = errors.New("fd: packet has the wrong length")
	ErrBadMagic    = errors.New("fd: packet has a bad magic number")
	ErrBadChecksum = errors.New("fd: packet checksum mismatch")
	ErrBadKind     = errors.New("fd: packet has an unknown kind")
	ErrBadField    = errors.New("fd: packet has an invalid field")
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Encode appends the wire form of p to dst.
func (p Packet) Encode(dst []byte) []byte {
	var b [PacketSize]byte
	copy(b[0:4], magic)
	b[4] = byte(p.Kind)
	binary.BigEndian.PutUint64(b[5:], uint64(p.Subject))
	binary.BigEndian.PutUint64(b[13:], uint64(p.Incarnation))
	binary.BigEndian.PutUint64(b[21:], p.Seq)
	binary.BigEndian.PutUint64(b[29:], uint64(p.Observer))
	binary.BigEndian.PutUint32(b[37:], crc32.Checksum(b[:37], castagnoli))
	return append(dst, b[:]...)
}

// Decode parses one datagram. It never panics; any malformed input yields an
// error naming the reason.
func Decode(b []byte) (Packet, error) {
	if len(b) != PacketSize {
		return Packet{}, fmt.Errorf("%w: %d bytes, want %d", ErrShortPacket, len(b), PacketSize)
	}
	if string(b[0:4]) != magic {
		return Packet{}, ErrBadMagic
	}
	if crc32.Checksum(b[:37], castagnoli) != binary.BigEndian.Uint32(b[37:]) {
		return Packet{}, ErrBadChecksum
	}
	p := Packet{
		Kind:        Kind(b[4]),
		Subject:     NodeID(binary.BigEndian.Uint64(b[5:])),
		Incarnation: Incarnation(binary.BigEndian.Uint64(b[13:])),
		Seq:         binary.BigEndian.Uint64(b[21:]),
		Observer:    NodeID(binary.BigEndian.Uint64(b[29:])),
	}
	switch p.Kind {
	case KindBeacon:
		if p.Observer != 0 {
			return Packet{}, fmt.Errorf("%w: beacon names observer %d", ErrBadField, p.Observer)
		}
	case KindEcho:
		if p.Observer == 0 {
			return Packet{}, fmt.Errorf("%w: echo without observer", ErrBadField)
		}
	default:
		return Packet{}, fmt.Errorf("%w: %d", ErrBadKind, b[4])
	}
	if p.Subject == 0 || p.Incarnation == 0 {
		return Packet{}, fmt.Errorf("%w: zero subject or incarnation", ErrBadField)
	}
	return p, nil
}
