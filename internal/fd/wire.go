package fd

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// Wire format of a failure-detector datagram (beacons and echoes), fixed size,
// big-endian:
//
//	off len field
//	  0   4 magic "GFD2"
//	  4   1 kind (1 = beacon, 2 = echo)
//	  5   8 subject: id of the node whose liveness the packet is about
//	 13   8 incarnation of the subject
//	 21   8 seq: the subject's beacon sequence number
//	 29   8 observer: id of the echoing observer (0 in a beacon)
//	 37  16 MAC: the first 16 bytes of HMAC-SHA256(cluster key, bytes 0..36)
//
// The MAC authenticates every datagram with the cluster key: without the key
// nobody can make an observer believe a node is alive (a forged beacon), make
// a node believe it is acknowledged (a forged echo), or announce an
// incarnation (which would make observers report the real one dead).
// Replays of captured datagrams cannot break safety: a subject takes an echo
// only for a beacon in its recent window (Subject.Echo), and observers ignore
// a beacon whose sequence number is not newer than the last one they heard
// from that incarnation (Observer.Beacon). That memory is not persisted: after
// an observer restarts, a host that captured a node's beacons can replay them
// to that observer and delay (never cause) a dead verdict for as long as its
// capture lasts.
const (
	PacketSize = 53
	macOffset  = 37
	macSize    = 16
	magic      = "GFD2"
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
	ErrBadMAC      = errors.New("fd: packet is not authenticated by a cluster key")
	ErrBadKind     = errors.New("fd: packet has an unknown kind")
	ErrBadField    = errors.New("fd: packet has an invalid field")
)

// MinKeyLen is the shortest cluster key accepted (128 bits).
const MinKeyLen = 16

// Key is a cluster key: the secret every node of a cluster shares, with
// which failure-detector datagrams are authenticated.
type Key []byte

// ParseKey reads a key written in hexadecimal (as in node config files).
func ParseKey(s string) (Key, error) {
	b, err := hex.DecodeString(strings.TrimSpace(s))
	if err != nil {
		return nil, fmt.Errorf("fd: cluster key is not hexadecimal: %v", err)
	}
	if len(b) < MinKeyLen {
		return nil, fmt.Errorf("fd: cluster key has %d bytes; at least %d are required", len(b), MinKeyLen)
	}
	return Key(b), nil
}

// String is the key in hexadecimal.
func (k Key) String() string { return hex.EncodeToString(k) }

// Keyring holds the key that signs outgoing datagrams and the keys accepted
// on incoming ones (the signing key and, during a rotation, the others).
type Keyring struct {
	Sign   Key
	Accept []Key
}

// Validate checks the keys' lengths.
func (r Keyring) Validate() error {
	if len(r.Sign) < MinKeyLen {
		return fmt.Errorf("fd: the cluster key must have at least %d bytes", MinKeyLen)
	}
	for _, k := range r.Accept {
		if len(k) < MinKeyLen {
			return fmt.Errorf("fd: an accepted cluster key has %d bytes; at least %d are required", len(k), MinKeyLen)
		}
	}
	return nil
}

func mac(key Key, body []byte) []byte {
	h := hmac.New(sha256.New, key)
	h.Write(body)
	return h.Sum(nil)[:macSize]
}

func (p Packet) body() [macOffset]byte {
	var b [macOffset]byte
	copy(b[0:4], magic)
	b[4] = byte(p.Kind)
	binary.BigEndian.PutUint64(b[5:], uint64(p.Subject))
	binary.BigEndian.PutUint64(b[13:], uint64(p.Incarnation))
	binary.BigEndian.PutUint64(b[21:], p.Seq)
	binary.BigEndian.PutUint64(b[29:], uint64(p.Observer))
	return b
}

// Seal appends the wire form of p, authenticated with key, to dst.
func (p Packet) Seal(dst []byte, key Key) []byte {
	b := p.body()
	dst = append(dst, b[:]...)
	return append(dst, mac(key, b[:])...)
}

// Decode parses one datagram's structure without checking its MAC (Open
// does both). It never panics; any malformed input yields an error naming
// the reason.
func Decode(b []byte) (Packet, error) {
	if len(b) != PacketSize {
		return Packet{}, fmt.Errorf("%w: %d bytes, want %d", ErrShortPacket, len(b), PacketSize)
	}
	if string(b[0:4]) != magic {
		return Packet{}, ErrBadMagic
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
	if p.Subject == 0 || p.Incarnation == 0 || p.Seq == 0 {
		return Packet{}, fmt.Errorf("%w: zero subject, incarnation or sequence number", ErrBadField)
	}
	return p, nil
}

// Open decodes a datagram and checks that one of the accepted keys
// authenticated it.
func Open(b []byte, keys Keyring) (Packet, error) {
	p, err := Decode(b)
	if err != nil {
		return Packet{}, err
	}
	got := b[macOffset:]
	if hmac.Equal(got, mac(keys.Sign, b[:macOffset])) {
		return p, nil
	}
	for _, k := range keys.Accept {
		if hmac.Equal(got, mac(k, b[:macOffset])) {
			return p, nil
		}
	}
	return Packet{}, ErrBadMAC
}
