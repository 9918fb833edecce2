package chunk

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"sort"

	"github.com/grovestore/grove/internal/lock"
)

// The map RLDev: a pair's handle -> extent map, stored as a checkpoint and
// a log of the changes since (Boxwood §3.5), in 4 KiB blocks:
//
//	block 0                 fence block: written with the map lock's token
//	                        each time a manager becomes primary, so that the
//	                        RLDev refuses the writes of every earlier holder
//	                        before the new one reads the map
//	blocks 1, 2             superblock A, B (written alternately; the valid
//	                        one with the higher seq is current)
//	blocks [3, 3+L)         the log: frames from block 3 on, one after the
//	                        other, each starting on a block boundary
//	blocks [3+L, 3+L+C)     checkpoint slot 0
//	blocks [3+L+C, 3+L+2C)  checkpoint slot 1
//
// L and C are fixed when the map is formatted and recorded in the
// superblock (Layout). All integers are little endian; every structure
// carries a CRC-32C (Castagnoli). The RLDev under the map checksums each
// block and repairs one bad copy from the other; the CRCs here find what
// that cannot: a frame that was being written when both copies crashed
// (torn, or never written), and the end of the log.
//
// Superblock (one block):
//
//	0 magic "GRCS" u32   4 version u16   6 zero u16   8 cm u32   12 zero u32
//	16 seq u64           24 slot u32     28 checkpoint blocks u32
//	32 checkpoint bytes u64               40 checkpoint CRC u32   44 zero u32
//	48 log generation u64                 56 log first LSN u64
//	64 high-water id u64 72 log blocks u32 76 slot blocks u32     80 CRC u32
//
// Checkpoint (in a slot, CheckpointBytes long): a 48-byte header {magic
// "GRCK" u32, version u16, zero u16, cm u32, reservations u32, through LSN
// u64, high-water id u64, count u64, quarantined u64}, then count entries
// sorted by id, 32 bytes each {id u64, RLDev u64, block u64, length in
// bytes u64}, then quarantined runs, 24 bytes each {RLDev u64, block u64,
// blocks u64}: space freed recently, not reused until a late write of
// its past can no longer land (Manager); then the open reservations, 40
// bytes each {id u64, RLDev u64, block u64, count u64, size u64} (a
// checkpoint written before reservations existed has 0 there); then, only
// if some chunk has an owner or some owner was retired (a checkpoint
// written before owners existed ends before it), {owned u64, retired
// u64}, the owned chunks sorted by id, 32 bytes each {id u64, owner log
// u64, owner token epoch u64, seq u64}, and the retired logs sorted, 24
// bytes each {log u64, token epoch u64, seq u64}.
//
// Log frame (Frame blocks long, from a block boundary): a 40-byte header
// {magic "GRCL" u32, version u16, blocks u16, generation u64, first LSN u64,
// count u32, payload bytes u32, CRC u32 over the header (this field zero)
// and the payload, zero u32}, then count records: a type byte and its
// fields (Alloc: id, RLDev, block, length, u64 each; Free: id u64;
// Reserve: high-water id u64; Resv: id, RLDev, block, count, size, u64
// each; ResvClose: id u64; AllocOwned: Alloc's fields, then the owner's
// log, token epoch and seq, u64 each; Disown: id u64; Retire: log, token
// epoch, seq, u64 each). Record i has LSN first+i. The log of a
// generation is the frames from block 3 whose generation is the
// superblock's and whose LSNs follow on; the first frame that is not ends
// it (a torn or unwritten frame was never acknowledged: frames are written
// one at a time, each durable before the next is begun and before anything
// it records is acknowledged).

const (
	superMagic = 0x53435247 // "GRCS"
	ckMagic    = 0x4b435247 // "GRCK"
	frameMagic = 0x4c435247 // "GRCL"
	fenceMagic = 0x46435247 // "GRCF"
	formatVer  = 1

	blockFence = 0
	blockSuper = 1 // and 2
	blockLog   = 3

	superLen    = 84
	ckHeader    = 48
	ckEntry     = 32
	ckResv      = 40
	ckOwnHeader = 16
	ckOwned     = 32
	ckRetired   = 24
	frameHeader = 40
	// MaxFrameBlocks bounds a frame (256 KiB): a flush with more records
	// is split.
	MaxFrameBlocks = 64
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Layout is where a map's log and checkpoint slots are, in blocks.
type Layout struct {
	LogBlocks  uint32
	SlotBlocks uint32
}

// NewLayout divides a map RLDev of blocks blocks: an eighth for the log
// (at least 64 blocks, at most 16 MiB), the rest in two checkpoint slots.
func NewLayout(blocks uint64) (Layout, error) {
	logB := min(max(blocks/8, 64), 4096)
	if blocks < blockLog+logB+2*2 {
		return Layout{}, fmt.Errorf("chunk: a map RLDev of %d blocks is too small (at least %d)", blocks, blockLog+logB+4)
	}
	slot := (blocks - blockLog - logB) / 2
	if slot > 1<<31 {
		slot = 1 << 31
	}
	return Layout{LogBlocks: uint32(logB), SlotBlocks: uint32(slot)}, nil
}

func (l Layout) slotStart(slot uint32) uint64 {
	return blockLog + uint64(l.LogBlocks) + uint64(slot)*uint64(l.SlotBlocks)
}

// MaxEntries is how many chunks a checkpoint slot holds.
func (l Layout) MaxEntries() uint64 {
	return (uint64(l.SlotBlocks)*BlockSize - ckHeader) / ckEntry
}

// Super is the superblock.
type Super struct {
	CM        uint32
	Seq       uint64
	Slot      uint32 // the active checkpoint slot
	CkBlocks  uint32 // blocks the checkpoint takes (0: none: the map was empty)
	CkBytes   uint64
	CkCRC     uint32
	LogGen    uint64 // frames of another generation are not this log's
	LogFirst  uint64 // LSN of the log's first frame (the checkpoint covers what is before)
	HighWater uint64 // ids at or above it were never handed out
	Layout    Layout
}

// EncodeSuper returns s as a block.
func EncodeSuper(s Super) []byte {
	b := make([]byte, BlockSize)
	le := binary.LittleEndian
	le.PutUint32(b[0:], superMagic)
	le.PutUint16(b[4:], formatVer)
	le.PutUint32(b[8:], s.CM)
	le.PutUint64(b[16:], s.Seq)
	le.PutUint32(b[24:], s.Slot)
	le.PutUint32(b[28:], s.CkBlocks)
	le.PutUint64(b[32:], s.CkBytes)
	le.PutUint32(b[40:], s.CkCRC)
	le.PutUint64(b[48:], s.LogGen)
	le.PutUint64(b[56:], s.LogFirst)
	le.PutUint64(b[64:], s.HighWater)
	le.PutUint32(b[72:], s.Layout.LogBlocks)
	le.PutUint32(b[76:], s.Layout.SlotBlocks)
	le.PutUint32(b[80:], crc32.Checksum(b[:80], castagnoli))
	return b
}

// errNoSuper: a superblock copy that does not decode (never written, torn,
// or not a superblock).
var errNoSuper = errors.New("chunk: no valid superblock")

// DecodeSuper decodes a superblock copy.
func DecodeSuper(b []byte) (Super, error) {
	le := binary.LittleEndian
	if len(b) < superLen || le.Uint32(b[0:]) != superMagic {
		return Super{}, errNoSuper
	}
	if le.Uint32(b[80:]) != crc32.Checksum(b[:80], castagnoli) {
		return Super{}, fmt.Errorf("%w: checksum", errNoSuper)
	}
	if v := le.Uint16(b[4:]); v != formatVer {
		return Super{}, fmt.Errorf("%w: format version %d (this build reads %d)", ErrCorrupt, v, formatVer)
	}
	s := Super{CM: le.Uint32(b[8:]), Seq: le.Uint64(b[16:]), Slot: le.Uint32(b[24:]), CkBlocks: le.Uint32(b[28:]),
		CkBytes: le.Uint64(b[32:]), CkCRC: le.Uint32(b[40:]), LogGen: le.Uint64(b[48:]), LogFirst: le.Uint64(b[56:]),
		HighWater: le.Uint64(b[64:]), Layout: Layout{LogBlocks: le.Uint32(b[72:]), SlotBlocks: le.Uint32(b[76:])}}
	switch {
	case s.Slot > 1, s.CkBlocks > s.Layout.SlotBlocks, uint64(s.CkBlocks)*BlockSize < s.CkBytes,
		s.CkBlocks == 0 && s.CkBytes != 0, s.Layout.LogBlocks == 0, s.LogFirst == 0:
		return Super{}, fmt.Errorf("%w: superblock fields out of range (%+v)", ErrCorrupt, s)
	}
	return s, nil
}

// PickSuper returns the current superblock of two copies: the valid one
// with the higher seq. Neither valid: errNoSuper if both are blank (a map
// never formatted), ErrCorrupt otherwise.
func PickSuper(a, b []byte) (Super, error) {
	sa, ea := DecodeSuper(a)
	sb, eb := DecodeSuper(b)
	switch {
	case ea == nil && eb == nil:
		if sb.Seq > sa.Seq {
			return sb, nil
		}
		return sa, nil
	case ea == nil:
		return sa, nil
	case eb == nil:
		return sb, nil
	case allZero(a) && allZero(b):
		return Super{}, errNoSuper
	}
	return Super{}, fmt.Errorf("%w: neither superblock copy is valid (%v; %v)", ErrCorrupt, ea, eb)
}

func allZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}

// Extent is where a chunk lives: Len bytes from block Block of RLDev
// RLDev (it takes blocksFor(Len) blocks).
type Extent struct {
	RLDev uint64
	Block uint64
	Len   uint64
}

// Checkpoint is a map as of an LSN.
type Checkpoint struct {
	CM           uint32
	Through      uint64 // the last LSN it includes
	HighWater    uint64
	Chunks       map[uint64]Extent
	Quarantined  []Run  // freed space not to reuse yet
	Reservations []Resv // open reservations, by id
	// Owned: the chunks that have an owner (each in Chunks); Retired: the
	// owners' logs whose tokens below the one given are retired.
	Owned   map[uint64]Owner
	Retired map[uint64]lock.Token
}

// Owner tags an allocation with the log that will link the chunk into
// something durable (Boxwood §4.3: "we log the allocation locally"): a
// B-tree server allocates a node or a value chunk, writes it, and commits
// a record naming it; if it dies in between, the chunk is named by
// nothing. The tag stays on the chunk until the owner disowns it (once its
// linking record is durable, before its log may forget that record), so
// that whoever recovers the owner's log can find every chunk the owner
// allocated and had not linked (Owned) and free it; Retire first makes
// the pair refuse the dead owner's allocations still in flight.
//
// Log is a number the owners' kind gives each log (0: no owner); Token is
// the token of the lock under which the owner holds that log: a later
// holder of the log has a newer one, so that a retirement of every token
// below a recovery run's spares the log's next holder.
type Owner struct {
	Log   uint64
	Token lock.Token
}

// IsZero reports whether o is no owner.
func (o Owner) IsZero() bool { return o.Log == 0 }

func (o Owner) String() string { return fmt.Sprintf("log %d under %v", o.Log, o.Token) }

// Resv is a reservation: ids ID+1..ID+Count set aside for one clerk, each
// for a chunk of Size bytes at slot i of Run (slot i: blocksFor(Size)
// blocks from Run.Block + (i-1)·blocksFor(Size)), zeroed, handed out by
// the clerk without asking and sent back in a batch (Manager.Commit).
type Resv struct {
	ID    uint64
	Run   Run
	Count uint64
	Size  uint64
}

// MaxReserve bounds a reservation's chunks.
const MaxReserve = 1000

// check verifies a reservation's shape.
func (r Resv) check() error {
	switch {
	case r.ID == 0 || r.Count == 0 || r.Count > MaxReserve || r.Size == 0 || r.Size > MaxChunk || r.Run.RLDev == 0:
		return fmt.Errorf("%w: reservation %+v", ErrCorrupt, r)
	case r.Run.Blocks != r.Count*blocksFor(r.Size):
		return fmt.Errorf("%w: reservation %d of %d chunks of %d bytes over %d blocks", ErrCorrupt, r.ID, r.Count, r.Size, r.Run.Blocks)
	}
	return nil
}

// Slot is the extent of id (one of ID+1..ID+Count).
func (r Resv) Slot(id uint64) Extent {
	k := blocksFor(r.Size)
	return Extent{RLDev: r.Run.RLDev, Block: r.Run.Block + (id-r.ID-1)*k, Len: r.Size}
}

// Holds reports whether id is one of the reservation's.
func (r Resv) Holds(id uint64) bool { return id > r.ID && id <= r.ID+r.Count }

// Run is a run of blocks of an RLDev.
type Run struct{ RLDev, Block, Blocks uint64 }

// EncodeCheckpoint returns c's bytes (entries sorted by id).
func EncodeCheckpoint(c Checkpoint) []byte {
	ids := make([]uint64, 0, len(c.Chunks))
	for id := range c.Chunks {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	base := ckHeader + ckEntry*len(ids) + 24*len(c.Quarantined) + ckResv*len(c.Reservations)
	size := base
	if len(c.Owned)+len(c.Retired) > 0 {
		size += ckOwnHeader + ckOwned*len(c.Owned) + ckRetired*len(c.Retired)
	}
	b := make([]byte, size)
	le := binary.LittleEndian
	if size > base {
		t := b[base:]
		le.PutUint64(t[0:], uint64(len(c.Owned)))
		le.PutUint64(t[8:], uint64(len(c.Retired)))
		owned := make([]uint64, 0, len(c.Owned))
		for id := range c.Owned {
			owned = append(owned, id)
		}
		slices.Sort(owned)
		p := t[ckOwnHeader:]
		for _, id := range owned {
			o := c.Owned[id]
			le.PutUint64(p[0:], id)
			le.PutUint64(p[8:], o.Log)
			le.PutUint64(p[16:], uint64(o.Token.Epoch))
			le.PutUint64(p[24:], o.Token.Seq)
			p = p[ckOwned:]
		}
		logs := make([]uint64, 0, len(c.Retired))
		for l := range c.Retired {
			logs = append(logs, l)
		}
		slices.Sort(logs)
		for _, l := range logs {
			le.PutUint64(p[0:], l)
			le.PutUint64(p[8:], uint64(c.Retired[l].Epoch))
			le.PutUint64(p[16:], c.Retired[l].Seq)
			p = p[ckRetired:]
		}
	}
	le.PutUint32(b[0:], ckMagic)
	le.PutUint16(b[4:], formatVer)
	le.PutUint32(b[8:], c.CM)
	le.PutUint32(b[12:], uint32(len(c.Reservations)))
	rs := b[ckHeader+ckEntry*len(ids)+24*len(c.Quarantined):]
	for i, r := range c.Reservations {
		p := rs[ckResv*i:]
		le.PutUint64(p[0:], r.ID)
		le.PutUint64(p[8:], r.Run.RLDev)
		le.PutUint64(p[16:], r.Run.Block)
		le.PutUint64(p[24:], r.Count)
		le.PutUint64(p[32:], r.Size)
	}
	le.PutUint64(b[16:], c.Through)
	le.PutUint64(b[24:], c.HighWater)
	le.PutUint64(b[32:], uint64(len(ids)))
	le.PutUint64(b[40:], uint64(len(c.Quarantined)))
	for i, q := range c.Quarantined {
		p := b[ckHeader+ckEntry*len(ids)+24*i:]
		le.PutUint64(p[0:], q.RLDev)
		le.PutUint64(p[8:], q.Block)
		le.PutUint64(p[16:], q.Blocks)
	}
	for i, id := range ids {
		e := c.Chunks[id]
		p := b[ckHeader+ckEntry*i:]
		le.PutUint64(p[0:], id)
		le.PutUint64(p[8:], e.RLDev)
		le.PutUint64(p[16:], e.Block)
		le.PutUint64(p[24:], e.Len)
	}
	return b
}

// DecodeCheckpoint decodes a checkpoint's bytes (CRC checked by the caller
// against the superblock's). Entries must be sorted, unique, of valid
// length and ids below the high-water mark.
func DecodeCheckpoint(b []byte) (Checkpoint, error) {
	le := binary.LittleEndian
	if len(b) < ckHeader || le.Uint32(b[0:]) != ckMagic || le.Uint16(b[4:]) != formatVer {
		return Checkpoint{}, fmt.Errorf("%w: checkpoint header", ErrCorrupt)
	}
	c := Checkpoint{CM: le.Uint32(b[8:]), Through: le.Uint64(b[16:]), HighWater: le.Uint64(b[24:]), Chunks: map[uint64]Extent{}}
	n, nq, nr := le.Uint64(b[32:]), le.Uint64(b[40:]), uint64(le.Uint32(b[12:]))
	if n > uint64(len(b)-ckHeader)/ckEntry || nq > uint64(len(b))/24 || nr > uint64(len(b))/ckResv || uint64(len(b)) < ckHeader+ckEntry*n+24*nq+ckResv*nr {
		return Checkpoint{}, fmt.Errorf("%w: checkpoint of %d bytes says %d entries, %d quarantined runs and %d reservations", ErrCorrupt, len(b), n, nq, nr)
	}
	tail := b[ckHeader+ckEntry*n+24*nq+ckResv*nr:]
	if len(tail) > 0 {
		if len(tail) < ckOwnHeader {
			return Checkpoint{}, fmt.Errorf("%w: checkpoint of %d bytes ends %d bytes into its owners' header", ErrCorrupt, len(b), len(tail))
		}
		no, nt := le.Uint64(tail[0:]), le.Uint64(tail[8:])
		if no > uint64(len(tail))/ckOwned || nt > uint64(len(tail))/ckRetired || uint64(len(tail)) != ckOwnHeader+ckOwned*no+ckRetired*nt || no+nt == 0 {
			return Checkpoint{}, fmt.Errorf("%w: checkpoint's %d bytes of owners say %d owned chunks and %d retired logs", ErrCorrupt, len(tail), no, nt)
		}
		c.Owned, c.Retired = map[uint64]Owner{}, map[uint64]lock.Token{}
		p := tail[ckOwnHeader:]
		var prev uint64
		for i := uint64(0); i < no; i++ {
			id := le.Uint64(p[0:])
			o := Owner{Log: le.Uint64(p[8:]), Token: lock.Token{Epoch: lock.Epoch(le.Uint64(p[16:])), Seq: le.Uint64(p[24:])}}
			if id <= prev || o.IsZero() {
				return Checkpoint{}, fmt.Errorf("%w: checkpoint owned chunk %d (id %d, %v)", ErrCorrupt, i, id, o)
			}
			c.Owned[id] = o
			prev = id
			p = p[ckOwned:]
		}
		prev = 0
		for i := uint64(0); i < nt; i++ {
			l := le.Uint64(p[0:])
			if l <= prev {
				return Checkpoint{}, fmt.Errorf("%w: checkpoint retired log %d (%d) out of order", ErrCorrupt, i, l)
			}
			c.Retired[l] = lock.Token{Epoch: lock.Epoch(le.Uint64(p[8:])), Seq: le.Uint64(p[16:])}
			prev = l
			p = p[ckRetired:]
		}
	}
	var prevR uint64
	for i := uint64(0); i < nr; i++ {
		p := b[ckHeader+ckEntry*n+24*nq+ckResv*i:]
		r := Resv{ID: le.Uint64(p[0:]), Run: Run{RLDev: le.Uint64(p[8:]), Block: le.Uint64(p[16:])}, Count: le.Uint64(p[24:]), Size: le.Uint64(p[32:])}
		if r.Count <= MaxReserve && r.Size <= MaxChunk {
			r.Run.Blocks = r.Count * blocksFor(r.Size)
		}
		if err := r.check(); err != nil || r.ID <= prevR || r.ID+r.Count >= c.HighWater {
			return Checkpoint{}, fmt.Errorf("%w: checkpoint reservation %d (%+v, high-water %d)", ErrCorrupt, i, r, c.HighWater)
		}
		c.Reservations = append(c.Reservations, r)
		prevR = r.ID
	}
	for i := uint64(0); i < nq; i++ {
		p := b[ckHeader+ckEntry*n+24*i:]
		q := Run{RLDev: le.Uint64(p[0:]), Block: le.Uint64(p[8:]), Blocks: le.Uint64(p[16:])}
		// Usually at most MaxChunk; longer in maps written before
		// outside review 70 (a reservation's whole run), and when the
		// runs are written coarsely to fit the slot (Manager.checkpoint):
		// bounded by the RLDev's size at load, which splits it.
		if q.RLDev == 0 || q.Blocks == 0 || q.Block+q.Blocks < q.Block {
			return Checkpoint{}, fmt.Errorf("%w: checkpoint quarantined run %d (%+v)", ErrCorrupt, i, q)
		}
		c.Quarantined = append(c.Quarantined, q)
	}
	var prev uint64
	for i := uint64(0); i < n; i++ {
		p := b[ckHeader+ckEntry*i:]
		id := le.Uint64(p[0:])
		e := Extent{RLDev: le.Uint64(p[8:]), Block: le.Uint64(p[16:]), Len: le.Uint64(p[24:])}
		if id <= prev || id >= c.HighWater || e.Len == 0 || e.Len > MaxChunk || e.RLDev == 0 {
			return Checkpoint{}, fmt.Errorf("%w: checkpoint entry %d (id %d, %+v, high-water %d)", ErrCorrupt, i, id, e, c.HighWater)
		}
		c.Chunks[id] = e
		prev = id
	}
	for id := range c.Owned {
		if _, ok := c.Chunks[id]; !ok {
			return Checkpoint{}, fmt.Errorf("%w: checkpoint gives chunk %d an owner, and has no such chunk", ErrCorrupt, id)
		}
	}
	return c, nil
}

// Record kinds of the log.
const (
	RecAlloc   = 1
	RecFree    = 2
	RecReserve = 3
	// RecResv opens a reservation (Resv); RecResvClose closes one: its
	// slots allocated by RecAlloc records before it (in the same frame)
	// are chunks, the rest of its space is freed.
	RecResv      = 4
	RecResvClose = 5
	// RecAllocOwned is RecAlloc with an owner (Owner); RecDisown takes a
	// chunk's owner away; RecRetire retires every owner of a log whose
	// token is below the record's (Owner).
	RecAllocOwned = 6
	RecDisown     = 7
	RecRetire     = 8
)

// Record is one change of the map.
type Record struct {
	Kind   byte
	ID     uint64 // Alloc, Free
	Extent Extent // Alloc
	HW     uint64 // Reserve: ids below it may be handed out
	Resv   Resv   // Resv (ID is Resv.ID)
	Owner  Owner  // AllocOwned; Retire (the log, and the token below which its owners are retired)
}

// isAlloc: the record allocates chunk ID at Extent.
func (r Record) isAlloc() bool { return r.Kind == RecAlloc || r.Kind == RecAllocOwned }

func (r Record) size() int {
	switch r.Kind {
	case RecAlloc:
		return 1 + 32
	case RecResv:
		return 1 + 40
	case RecAllocOwned:
		return 1 + 56
	case RecRetire:
		return 1 + 24
	default:
		return 1 + 8
	}
}

func (r Record) String() string {
	switch r.Kind {
	case RecAlloc:
		return fmt.Sprintf("alloc %d -> rldev %d block %d len %d", r.ID, r.Extent.RLDev, r.Extent.Block, r.Extent.Len)
	case RecFree:
		return fmt.Sprintf("free %d", r.ID)
	case RecReserve:
		return fmt.Sprintf("reserve ids below %d", r.HW)
	case RecResv:
		return fmt.Sprintf("reservation %d: %d chunks of %d bytes on rldev %d from block %d", r.ID, r.Resv.Count, r.Resv.Size, r.Resv.Run.RLDev, r.Resv.Run.Block)
	case RecResvClose:
		return fmt.Sprintf("close reservation %d", r.ID)
	case RecAllocOwned:
		return fmt.Sprintf("alloc %d -> rldev %d block %d len %d, owner %v", r.ID, r.Extent.RLDev, r.Extent.Block, r.Extent.Len, r.Owner)
	case RecDisown:
		return fmt.Sprintf("disown %d", r.ID)
	case RecRetire:
		return fmt.Sprintf("retire the owners of log %d below %v", r.Owner.Log, r.Owner.Token)
	}
	return fmt.Sprintf("record kind %d", r.Kind)
}

// Frame is a flush of the log: records with consecutive LSNs from First.
type Frame struct {
	Gen     uint64
	First   uint64
	Records []Record
}

// frameBlocks is the blocks a frame of these records takes.
func frameBlocks(recs []Record) int {
	n := frameHeader
	for _, r := range recs {
		n += r.size()
	}
	return (n + BlockSize - 1) / BlockSize
}

// EncodeFrame returns f as whole blocks.
func EncodeFrame(f Frame) []byte {
	k := frameBlocks(f.Records)
	if k > MaxFrameBlocks {
		panic(fmt.Sprintf("chunk: a frame of %d blocks (at most %d)", k, MaxFrameBlocks))
	}
	b := make([]byte, k*BlockSize)
	le := binary.LittleEndian
	p := b[frameHeader:]
	for _, r := range f.Records {
		p[0] = r.Kind
		switch r.Kind {
		case RecAlloc, RecAllocOwned:
			le.PutUint64(p[1:], r.ID)
			le.PutUint64(p[9:], r.Extent.RLDev)
			le.PutUint64(p[17:], r.Extent.Block)
			le.PutUint64(p[25:], r.Extent.Len)
			if r.Kind == RecAllocOwned {
				putOwner(p[33:], r.Owner)
			}
		case RecRetire:
			putOwner(p[1:], r.Owner)
		case RecFree, RecResvClose, RecDisown:
			le.PutUint64(p[1:], r.ID)
		case RecReserve:
			le.PutUint64(p[1:], r.HW)
		case RecResv:
			le.PutUint64(p[1:], r.ID)
			le.PutUint64(p[9:], r.Resv.Run.RLDev)
			le.PutUint64(p[17:], r.Resv.Run.Block)
			le.PutUint64(p[25:], r.Resv.Count)
			le.PutUint64(p[33:], r.Resv.Size)
		default:
			panic(fmt.Sprintf("chunk: encoding a record of kind %d", r.Kind))
		}
		p = p[r.size():]
	}
	payload := len(b) - frameHeader - len(p)
	le.PutUint32(b[0:], frameMagic)
	le.PutUint16(b[4:], formatVer)
	le.PutUint16(b[6:], uint16(k))
	le.PutUint64(b[8:], f.Gen)
	le.PutUint64(b[16:], f.First)
	le.PutUint32(b[24:], uint32(len(f.Records)))
	le.PutUint32(b[28:], uint32(payload))
	le.PutUint32(b[32:], crc32.Checksum(b[:frameHeader+payload], castagnoli))
	return b
}

// FrameLen reads a frame's length in blocks from its first block (0 if it
// is not a frame's first block).
func FrameLen(first []byte) int {
	le := binary.LittleEndian
	if len(first) < frameHeader || le.Uint32(first[0:]) != frameMagic {
		return 0
	}
	k := int(le.Uint16(first[6:]))
	if k < 1 || k > MaxFrameBlocks {
		return 0
	}
	return k
}

// errNotFrame: the bytes are not a whole valid frame (the end of the log).
var errNotFrame = errors.New("chunk: not a log frame")

// DecodeFrame decodes a frame (FrameLen(b) blocks of b).
func DecodeFrame(b []byte) (Frame, error) {
	le := binary.LittleEndian
	k := FrameLen(b)
	if k == 0 || len(b) < k*BlockSize || le.Uint16(b[4:]) != formatVer {
		return Frame{}, errNotFrame
	}
	n, payload := int(le.Uint32(b[24:])), int(le.Uint32(b[28:]))
	if payload > k*BlockSize-frameHeader {
		return Frame{}, errNotFrame
	}
	var crcField [4]byte
	crc := crc32.Update(0, castagnoli, b[:32])
	crc = crc32.Update(crc, castagnoli, crcField[:])
	crc = crc32.Update(crc, castagnoli, b[36:frameHeader+payload])
	if le.Uint32(b[32:]) != crc {
		return Frame{}, fmt.Errorf("%w: checksum", errNotFrame)
	}
	f := Frame{Gen: le.Uint64(b[8:]), First: le.Uint64(b[16:])}
	p := b[frameHeader : frameHeader+payload]
	for i := 0; i < n; i++ {
		if len(p) < 1 {
			return Frame{}, fmt.Errorf("%w: %d records promised, %d found", ErrCorrupt, n, i)
		}
		r := Record{Kind: p[0]}
		if len(p) < r.size() {
			return Frame{}, fmt.Errorf("%w: record %d cut short", ErrCorrupt, i)
		}
		switch r.Kind {
		case RecAlloc, RecAllocOwned:
			r.ID = le.Uint64(p[1:])
			r.Extent = Extent{RLDev: le.Uint64(p[9:]), Block: le.Uint64(p[17:]), Len: le.Uint64(p[25:])}
			if r.Kind == RecAllocOwned {
				r.Owner = getOwner(p[33:])
			}
			if r.ID == 0 || r.Extent.RLDev == 0 || r.Extent.Len == 0 || r.Extent.Len > MaxChunk || r.Kind == RecAllocOwned && r.Owner.IsZero() {
				return Frame{}, fmt.Errorf("%w: record %d: %v", ErrCorrupt, i, r)
			}
		case RecRetire:
			r.Owner = getOwner(p[1:])
			if r.Owner.IsZero() {
				return Frame{}, fmt.Errorf("%w: record %d retires log 0", ErrCorrupt, i)
			}
		case RecFree, RecResvClose, RecDisown:
			r.ID = le.Uint64(p[1:])
			if r.ID == 0 {
				return Frame{}, fmt.Errorf("%w: record %d names id 0", ErrCorrupt, i)
			}
		case RecReserve:
			r.HW = le.Uint64(p[1:])
		case RecResv:
			r.ID = le.Uint64(p[1:])
			r.Resv = Resv{ID: r.ID, Run: Run{RLDev: le.Uint64(p[9:]), Block: le.Uint64(p[17:])}, Count: le.Uint64(p[25:]), Size: le.Uint64(p[33:])}
			if r.Resv.Count <= MaxReserve && r.Resv.Size <= MaxChunk {
				r.Resv.Run.Blocks = r.Resv.Count * blocksFor(r.Resv.Size)
			}
			if err := r.Resv.check(); err != nil {
				return Frame{}, fmt.Errorf("record %d: %w", i, err)
			}
		default:
			return Frame{}, fmt.Errorf("%w: record %d of unknown kind %d", ErrCorrupt, i, r.Kind)
		}
		f.Records = append(f.Records, r)
		p = p[r.size():]
	}
	if len(p) != 0 {
		return Frame{}, fmt.Errorf("%w: %d bytes after the frame's records", ErrCorrupt, len(p))
	}
	return f, nil
}

func putOwner(p []byte, o Owner) {
	le := binary.LittleEndian
	le.PutUint64(p[0:], o.Log)
	le.PutUint64(p[8:], uint64(o.Token.Epoch))
	le.PutUint64(p[16:], o.Token.Seq)
}

func getOwner(p []byte) Owner {
	le := binary.LittleEndian
	return Owner{Log: le.Uint64(p[0:]), Token: lock.Token{Epoch: lock.Epoch(le.Uint64(p[8:])), Seq: le.Uint64(p[16:])}}
}

// Fence is the fence block's content (informational: the write itself,
// with the map lock's token, is what fences earlier holders out).
func EncodeFence(cm uint32, node, inc uint64) []byte {
	b := make([]byte, BlockSize)
	le := binary.LittleEndian
	le.PutUint32(b[0:], fenceMagic)
	le.PutUint16(b[4:], formatVer)
	le.PutUint32(b[8:], cm)
	le.PutUint64(b[16:], node)
	le.PutUint64(b[24:], inc)
	le.PutUint32(b[32:], crc32.Checksum(b[:32], castagnoli))
	return b
}
