package txn

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

	"github.com/grovestore/grove/internal/lock"
)

// On-disk layout of a log on its RLDev (the RLDev's dirty-region log is
// off: the log reconciles the two replicas itself, at recovery).
//
//	block 0, block 1   two copies of the header, written alternately (a
//	                   torn header write leaves the other copy whole)
//	block 2            the fence block: each recovery writes its token
//	                   here before it reads anything (magic "GRVTXNF1",
//	                   token epoch and seq; read by nobody)
//	block 3 ...        the ring: log block with sequence number s lives at
//	                   block 3 + s mod (blocks − 3)
//
// Header block (all integers little-endian, the rest of the block zero):
//
//	0   [8]  magic "GRVTXNH1"
//	8   u32  CRC-32C of bytes 12..HeaderSize
//	12  u32  format version (2; 1 is read too)
//	16  u64  generation (each header write: the previous best + 1)
//	24  u64  floor token epoch } blocks written with an older token than
//	32  u64  floor token seq   } the floor are not the log (see Scanner)
//	40  u64  head LSN: the oldest record recovery needs
//	48  u64  ring blocks (a check against the RLDev's size)
//	56  u64  writer's token epoch } the owner or recovery that wrote this
//	64  u64  writer's token seq   } header: headers are ordered by it first
//	72       end (HeaderSize)
//
// Log block (the ring):
//
//	0   u32  magic "GLB1"
//	4   u32  CRC-32C of bytes 8..BlockSize (the whole block after it)
//	8   u64  sequence number s (absolute; the ring position is derived)
//	16  u64  writer's token epoch
//	24  u64  writer's token seq
//	32  u16  payload bytes used (Payload for a full block; less ends a flush)
//	34  u16  offset of the first record that starts in this block, or NoRecord
//	36  [4]  zero
//	40       payload (Payload bytes): the record stream
//
// The log is a stream of records; a record may run on into the next block
// only when this block is full, because every flush (group commit) starts
// on a fresh block and ends at a record boundary, padding the rest of its
// last block. So the owner never writes again a block that holds records
// some commit was acknowledged for, while the log needs it (no in-place
// rewrite of the tail: a torn write of the owner can only hurt records
// nobody was told are durable). Recovery does write such blocks again,
// with the same bytes (repairing the other replica, or rewriting the log
// through the RLDev when it read one replica only): it relies on the RLDev
// keeping a block whole on a replica (old or new; the RLDev's per-block
// checksums and generation numbers) when a write of it is cut.
//
// Record (in the stream):
//
//	0   u32  body length n
//	4   u32  CRC-32C of the body
//	8   body: u8 kind, u64 transaction id, then for an update or a
//	    compensation: u16 target length, target, u64 offset, u32 redo length,
//	    redo, u32 undo length, undo
//
// An LSN (log sequence number) is a byte position in the stream:
// s × Payload + offset in block s's payload. LSNs grow with every record
// and are never reused (sequence numbers only grow, across laps of the ring
// and across owners).
const (
	BlockSize  = 4096
	blockHdr   = 40
	Payload    = BlockSize - blockHdr
	HeaderSize = 72
	// NoRecord marks a block in which no record starts.
	NoRecord = 0xFFFF
	// HeaderBlocks precede the ring: two header copies and the fence
	// block.
	HeaderBlocks = 3
	// FenceBlock is where recovery writes its token first.
	FenceBlock = 2
	// MaxRecord bounds one record's encoded size (a record must also fit in
	// a quarter of the ring).
	MaxRecord = 4 << 20
	// MaxTarget bounds a target's name.
	MaxTarget = 1024
	recHdr    = 8
	// version is what headers are written with. Version 2 logs may hold
	// redo-only updates (KindUpdate): a build that reads only version 1
	// would take the first such record for the end of the log and drop
	// every record after it, committed ones included, so it must refuse
	// the log instead. Every Open writes headers (recovery's), so a log
	// this build has opened is version 2 before it appends anything.
	// Version 1 logs (an older build's) hold no redo-only record and read
	// the same.
	version    = 2
	minVersion = 1
)

var (
	headerMagic = [8]byte{'G', 'R', 'V', 'T', 'X', 'N', 'H', '1'}
	blockMagic  = uint32(0x31424c47) // "GLB1"
	castagnoli  = crc32.MakeTable(crc32.Castagnoli)
)

// ErrCorrupt: a header, block or record failed its checks.
var ErrCorrupt = errors.New("txn: corrupt log data")

// LSN is a log sequence number: a byte position in the record stream.
type LSN uint64

// Kind is a record's kind.
type Kind uint8

const (
	// KindUpdate changes bytes [Off, Off+len(Redo)) of Target from Undo to
	// Redo (physical images: applying one twice leaves the same bytes). An
	// update with no Undo (and some Redo) is redo-only: for a no-steal
	// user, whose targets never hold an uncommitted change, so that a loser
	// has nothing to roll back (no compensation is logged for it, and
	// recovery undoes nothing of it). It halves such a user's log.
	KindUpdate Kind = 1
	// KindCommit ends a transaction: its updates are to survive.
	KindCommit Kind = 2
	// KindAbort ends a transaction that was rolled back live: its
	// compensations are in the log before this record.
	KindAbort Kind = 3
	// KindCompensation records an undo done live by Abort (redo-only:
	// Redo is the update's before-image).
	KindCompensation Kind = 4
)

func (k Kind) String() string {
	switch k {
	case KindUpdate:
		return "update"
	case KindCommit:
		return "commit"
	case KindAbort:
		return "abort"
	case KindCompensation:
		return "compensation"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Record is one log record.
type Record struct {
	LSN    LSN // where it starts (set by the log)
	Kind   Kind
	Txn    uint64
	Target []byte // what the bytes belong to (a chunk handle, for ChunkApplier)
	Off    uint64
	Redo   []byte
	Undo   []byte
}

// RedoOnly reports an update without an undo image (see KindUpdate).
func (r *Record) RedoOnly() bool {
	return r.Kind == KindUpdate && len(r.Undo) == 0 && len(r.Redo) > 0
}

// Size is the record's encoded size in the stream.
func (r *Record) Size() int {
	n := recHdr + 1 + 8
	if r.Kind == KindUpdate || r.Kind == KindCompensation {
		n += 2 + len(r.Target) + 8 + 4 + len(r.Redo) + 4 + len(r.Undo)
	}
	return n
}

// Check reports a record the log must refuse.
func (r *Record) Check() error {
	switch r.Kind {
	case KindUpdate, KindCompensation:
		if len(r.Target) == 0 || len(r.Target) > MaxTarget {
			return fmt.Errorf("txn: a target of %d bytes (1 to %d)", len(r.Target), MaxTarget)
		}
		if r.Kind == KindUpdate && len(r.Undo) != len(r.Redo) && !r.RedoOnly() {
			return fmt.Errorf("txn: redo of %d bytes, undo of %d: images of one range must be equal in size (or no undo)", len(r.Redo), len(r.Undo))
		}
		if r.Kind == KindCompensation && len(r.Undo) != 0 {
			return errors.New("txn: a compensation has no undo")
		}
		if r.Off+uint64(len(r.Redo)) < r.Off {
			return errors.New("txn: range wraps")
		}
	case KindCommit, KindAbort:
		if len(r.Target) != 0 || len(r.Redo) != 0 || len(r.Undo) != 0 {
			return fmt.Errorf("txn: a %s record carries data", r.Kind)
		}
	default:
		return fmt.Errorf("txn: record kind %d", r.Kind)
	}
	if r.Size() > MaxRecord {
		return fmt.Errorf("txn: a record of %d bytes (at most %d)", r.Size(), MaxRecord)
	}
	return nil
}

// AppendRecord appends r's encoding to b. r must have passed Check.
func AppendRecord(b []byte, r *Record) []byte {
	start := len(b)
	b = binary.LittleEndian.AppendUint32(b, 0)
	b = binary.LittleEndian.AppendUint32(b, 0)
	b = append(b, byte(r.Kind))
	b = binary.LittleEndian.AppendUint64(b, r.Txn)
	if r.Kind == KindUpdate || r.Kind == KindCompensation {
		b = binary.LittleEndian.AppendUint16(b, uint16(len(r.Target)))
		b = append(b, r.Target...)
		b = binary.LittleEndian.AppendUint64(b, r.Off)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(r.Redo)))
		b = append(b, r.Redo...)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(r.Undo)))
		b = append(b, r.Undo...)
	}
	body := b[start+recHdr:]
	binary.LittleEndian.PutUint32(b[start:], uint32(len(body)))
	binary.LittleEndian.PutUint32(b[start+4:], crc32.Checksum(body, castagnoli))
	return b
}

// recordLen returns the encoded length of the record starting at b, if b
// holds at least its length prefix (ok false: fewer than 8 bytes), or an
// error for a length no record has.
func recordLen(b []byte) (n int, ok bool, err error) {
	if len(b) < recHdr {
		return 0, false, nil
	}
	body := binary.LittleEndian.Uint32(b)
	if body < 9 || body > MaxRecord {
		return 0, true, fmt.Errorf("%w: a record body of %d bytes", ErrCorrupt, body)
	}
	return recHdr + int(body), true, nil
}

// DecodeRecord decodes one whole record (as AppendRecord wrote it, exactly
// len(b) bytes). The returned slices alias b.
func DecodeRecord(b []byte) (Record, error) {
	var r Record
	n, ok, err := recordLen(b)
	if err != nil {
		return r, err
	}
	if !ok || n != len(b) {
		return r, fmt.Errorf("%w: a record of %d bytes in %d", ErrCorrupt, n, len(b))
	}
	body := b[recHdr:]
	if crc32.Checksum(body, castagnoli) != binary.LittleEndian.Uint32(b[4:]) {
		return r, fmt.Errorf("%w: record checksum", ErrCorrupt)
	}
	r.Kind = Kind(body[0])
	r.Txn = binary.LittleEndian.Uint64(body[1:])
	p := body[9:]
	take := func(n int) ([]byte, bool) {
		if n < 0 || len(p) < n {
			return nil, false
		}
		x := p[:n:n]
		p = p[n:]
		return x, true
	}
	if r.Kind == KindUpdate || r.Kind == KindCompensation {
		var x []byte
		if x, ok = take(2); !ok {
			return r, fmt.Errorf("%w: short update", ErrCorrupt)
		}
		if r.Target, ok = take(int(binary.LittleEndian.Uint16(x))); !ok {
			return r, fmt.Errorf("%w: short target", ErrCorrupt)
		}
		if x, ok = take(8); !ok {
			return r, fmt.Errorf("%w: short update", ErrCorrupt)
		}
		r.Off = binary.LittleEndian.Uint64(x)
		if x, ok = take(4); !ok {
			return r, fmt.Errorf("%w: short update", ErrCorrupt)
		}
		if r.Redo, ok = take(int(binary.LittleEndian.Uint32(x))); !ok {
			return r, fmt.Errorf("%w: short redo image", ErrCorrupt)
		}
		if x, ok = take(4); !ok {
			return r, fmt.Errorf("%w: short update", ErrCorrupt)
		}
		if r.Undo, ok = take(int(binary.LittleEndian.Uint32(x))); !ok {
			return r, fmt.Errorf("%w: short undo image", ErrCorrupt)
		}
	}
	if len(p) != 0 {
		return r, fmt.Errorf("%w: %d bytes after the record", ErrCorrupt, len(p))
	}
	if err := r.Check(); err != nil {
		return r, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	return r, nil
}

// Header is the log's header.
type Header struct {
	Gen   uint64
	Floor lock.Token // blocks written under an older token are not the log
	Head  LSN        // the oldest record recovery needs
	Ring  uint64     // ring blocks
	// Writer is the token of the owner or recovery that wrote the header.
	// It equals Floor except in the header a recovery writes before it
	// acts (Recover), which keeps the floor it found.
	Writer lock.Token
}

// newer orders headers: a newer writer first (a newer owner's or
// recovery's header supersedes anything an older one wrote, on either
// replica), then the generation.
func (h Header) newer(o Header) bool {
	if h.Writer != o.Writer {
		return o.Writer.Less(h.Writer)
	}
	return h.Gen > o.Gen
}

// EncodeHeader returns h as a whole block.
func EncodeHeader(h Header) []byte {
	b := make([]byte, BlockSize)
	copy(b, headerMagic[:])
	binary.LittleEndian.PutUint32(b[12:], version)
	binary.LittleEndian.PutUint64(b[16:], h.Gen)
	binary.LittleEndian.PutUint64(b[24:], uint64(h.Floor.Epoch))
	binary.LittleEndian.PutUint64(b[32:], h.Floor.Seq)
	binary.LittleEndian.PutUint64(b[40:], uint64(h.Head))
	binary.LittleEndian.PutUint64(b[48:], h.Ring)
	binary.LittleEndian.PutUint64(b[56:], uint64(h.Writer.Epoch))
	binary.LittleEndian.PutUint64(b[64:], h.Writer.Seq)
	binary.LittleEndian.PutUint32(b[8:], crc32.Checksum(b[12:HeaderSize], castagnoli))
	return b
}

// DecodeHeader decodes a header block. An all-zero block (a log never
// written) is ErrNoHeader.
func DecodeHeader(b []byte) (Header, error) {
	var h Header
	if len(b) < HeaderSize {
		return h, fmt.Errorf("%w: a header of %d bytes", ErrCorrupt, len(b))
	}
	if [8]byte(b[:8]) != headerMagic {
		for _, x := range b[:HeaderSize] {
			if x != 0 {
				return h, fmt.Errorf("%w: header magic", ErrCorrupt)
			}
		}
		return h, ErrNoHeader
	}
	if crc32.Checksum(b[12:HeaderSize], castagnoli) != binary.LittleEndian.Uint32(b[8:]) {
		return h, fmt.Errorf("%w: header checksum", ErrCorrupt)
	}
	if v := binary.LittleEndian.Uint32(b[12:]); v < minVersion || v > version {
		return h, fmt.Errorf("%w: header version %d (this build reads %d to %d)", ErrCorrupt, v, minVersion, version)
	}
	h.Gen = binary.LittleEndian.Uint64(b[16:])
	h.Floor = lock.Token{Epoch: lock.Epoch(binary.LittleEndian.Uint64(b[24:])), Seq: binary.LittleEndian.Uint64(b[32:])}
	h.Head = LSN(binary.LittleEndian.Uint64(b[40:]))
	h.Ring = binary.LittleEndian.Uint64(b[48:])
	h.Writer = lock.Token{Epoch: lock.Epoch(binary.LittleEndian.Uint64(b[56:])), Seq: binary.LittleEndian.Uint64(b[64:])}
	if h.Ring == 0 {
		return h, fmt.Errorf("%w: a ring of 0 blocks", ErrCorrupt)
	}
	if h.Writer.Less(h.Floor) {
		return h, fmt.Errorf("%w: a header written under %v with floor %v", ErrCorrupt, h.Writer, h.Floor)
	}
	return h, nil
}

// EncodeFence returns the fence block of a recovery under tok.
func EncodeFence(tok lock.Token) []byte {
	b := make([]byte, BlockSize)
	copy(b, "GRVTXNF1")
	binary.LittleEndian.PutUint64(b[8:], uint64(tok.Epoch))
	binary.LittleEndian.PutUint64(b[16:], tok.Seq)
	return b
}

// ErrNoHeader: the header block was never written.
var ErrNoHeader = errors.New("txn: no log header (a new log)")

// Block is a decoded log block.
type Block struct {
	Seq   uint64
	Token lock.Token
	Used  int // payload bytes used
	First int // offset of the first record starting here, or NoRecord
	Data  []byte
}

// EncodeBlock returns a whole log block holding payload (at most Payload
// bytes; the rest is zero).
func EncodeBlock(seq uint64, tok lock.Token, first int, payload []byte) []byte {
	if len(payload) > Payload || (first != NoRecord && (first < 0 || first >= len(payload))) {
		panic(fmt.Sprintf("txn: a block of %d payload bytes, first record at %d", len(payload), first))
	}
	b := make([]byte, BlockSize)
	binary.LittleEndian.PutUint32(b[0:], blockMagic)
	binary.LittleEndian.PutUint64(b[8:], seq)
	binary.LittleEndian.PutUint64(b[16:], uint64(tok.Epoch))
	binary.LittleEndian.PutUint64(b[24:], tok.Seq)
	binary.LittleEndian.PutUint16(b[32:], uint16(len(payload)))
	binary.LittleEndian.PutUint16(b[34:], uint16(first))
	copy(b[blockHdr:], payload)
	binary.LittleEndian.PutUint32(b[4:], crc32.Checksum(b[8:], castagnoli))
	return b
}

// DecodeBlock decodes a log block (Data aliases b).
func DecodeBlock(b []byte) (Block, error) {
	var k Block
	if len(b) != BlockSize {
		return k, fmt.Errorf("%w: a block of %d bytes", ErrCorrupt, len(b))
	}
	if binary.LittleEndian.Uint32(b) != blockMagic {
		return k, fmt.Errorf("%w: block magic", ErrCorrupt)
	}
	if crc32.Checksum(b[8:], castagnoli) != binary.LittleEndian.Uint32(b[4:]) {
		return k, fmt.Errorf("%w: block checksum", ErrCorrupt)
	}
	k.Seq = binary.LittleEndian.Uint64(b[8:])
	k.Token = lock.Token{Epoch: lock.Epoch(binary.LittleEndian.Uint64(b[16:])), Seq: binary.LittleEndian.Uint64(b[24:])}
	k.Used = int(binary.LittleEndian.Uint16(b[32:]))
	k.First = int(binary.LittleEndian.Uint16(b[34:]))
	if k.Used > Payload || (k.First != NoRecord && k.First >= k.Used) {
		return k, fmt.Errorf("%w: block %d uses %d bytes, first record at %d", ErrCorrupt, k.Seq, k.Used, k.First)
	}
	k.Data = b[blockHdr : blockHdr+k.Used]
	return k, nil
}

// RingBlock is where log block seq lives on the RLDev.
func RingBlock(seq, ring uint64) uint64 { return HeaderBlocks + seq%ring }

// SeqOf is the block an LSN falls in, and its offset there.
func SeqOf(l LSN) (seq uint64, off int) { return uint64(l) / Payload, int(uint64(l) % Payload) }

// LSNOf is the LSN of offset off of block seq.
func LSNOf(seq uint64, off int) LSN { return LSN(seq*Payload + uint64(off)) }
