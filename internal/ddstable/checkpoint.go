package ddstable

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
)

// Checkpoints (DDS §4.1, footnote 1): "a checkpoint mechanism … that
// allows us to force the on-disk image of all partitions to be consistent;
// the disk images can then be backed up for disaster recovery", and
// "during the checkpointing of a hash table, no state-changing operations
// are allowed". Replicas live in memory, so without one a table does not
// survive the loss of every replica of a partition (a power loss of the
// whole cluster); with one, it comes back as of the checkpoint.
//
//  1. A decree freezes the whole table (Maps.Freeze), held by a member
//     brick that drives the checkpoint: from that epoch every member
//     refuses prepares (reads go on).
//  2. The holder waits until every member of every group is settled
//     under the freeze (FreezeReady at each of its replicas: the freeze in
//     its maps, nothing in doubt), then decrees Freeze.Write. From the
//     first of those states on, nothing commits anywhere until the freeze
//     ends: no member accepts a prepare, and nothing is prepared. Each
//     brick, seeing Write, writes each replica to its disk
//     (EncodeCheckpoint, one file per partition, synced): every replica of
//     a partition holds the same data, so every copy of the image is the
//     same. Writing as soon as the brick alone is settled is not enough:
//     members that have not seen the freeze yet may still prepare a write,
//     and commit it once the settled member that refused it dies and is
//     removed (rule 4); its image then lacks a write the others' have
//     (the simulator found this).
//  3. Once every member of every group has written its files, the holder
//     decrees the freeze over and the checkpoint done (Maps.Checkpoint).
//     A holder that dies loses the freeze to the janitor; one whose
//     members do not all write in time gives it up.
//
// Restore: a partition whose every member is dead (the failure detector's
// verdict) may be restarted from the last checkpoint by a live brick whose
// disk holds that partition's file: it loads the file and decrees itself
// the group's only member (Restored); recovery then brings the group back
// to the table's degree. What was written after the checkpoint is lost, as
// in DDS ("all state changes that happen after the last checkpoint will be
// lost"): an operator asks for it (grove table restore).

// Errors of checkpoints and restores.
var (
	ErrCheckpointing = errors.New("ddstable: a checkpoint of the table is in progress")
	ErrFreezeLost    = errors.New("ddstable: the checkpoint's freeze is gone")
	ErrNoCheckpoint  = errors.New("ddstable: no such checkpoint of the table")
	ErrLive          = errors.New("ddstable: the partition has a member not declared dead")
	// ErrVerdictPending: every member of the partition's group is an
	// incarnation its node has replaced (the node restarted), but the
	// failure detector has not declared them all dead yet: try again.
	ErrVerdictPending = errors.New("ddstable: the partition's replicas are gone with their nodes' restarts, but not yet declared dead")
	ErrLayout         = errors.New("ddstable: the partition is not one of the table's partitions any more (split or merged since the checkpoint)")
)

// WithFreeze is m frozen for a new checkpoint, driven by holder, a member of some group (step 1). A table being
// recovered into, split or merged is not frozen: those end first.
func WithFreeze(m *Maps, holder BrickID) (*Maps, error) {
	switch {
	case m.Freeze.ID != 0:
		return nil, ErrCheckpointing
	case len(m.Joining) > 0:
		return nil, fmt.Errorf("%w: a brick is recovering into the table", ErrRecovering)
	case len(m.Reshaping) > 0:
		return nil, fmt.Errorf("%w: a split or merge is running", ErrReshaping)
	}
	c := m.Clone()
	c.Epoch++
	// The checkpoint's id is its freeze's epoch: never the id of an
	// earlier attempt given up, whose files some bricks may have written
	// (the simulator caught ids reused: the next after the last done).
	c.Freeze = Freeze{ID: c.Epoch, Holder: holder}
	return c, c.Validate()
}

// FreezeSettled is m with freeze id's images to be written (step 2); the
// holder decrees it once every member is settled under the freeze.
func FreezeSettled(m *Maps, id uint64, holder BrickID) (*Maps, error) {
	if m.Freeze != (Freeze{ID: id, Holder: holder}) {
		return nil, ErrFreezeLost
	}
	c := m.Clone()
	c.Freeze.Write = true
	c.Epoch++
	return c, c.Validate()
}

// Checkpointed is m with freeze id over and the checkpoint recorded
// (step 3); the holder decrees it once every member wrote its files.
func Checkpointed(m *Maps, id uint64, holder BrickID) (*Maps, error) {
	if m.Freeze != (Freeze{ID: id, Holder: holder, Write: true}) {
		return nil, ErrFreezeLost
	}
	c := m.Clone()
	c.Freeze = Freeze{}
	c.Epoch++
	c.Checkpoint = Checkpoint{ID: id, Epoch: c.Epoch}
	return c, c.Validate()
}

// WithoutFreeze is m with holder's freeze ended without a checkpoint.
func WithoutFreeze(m *Maps, holder BrickID) (*Maps, bool) {
	if m.Freeze.ID == 0 || m.Freeze.Holder != holder {
		return m, false
	}
	c := m.Clone()
	c.Freeze = Freeze{}
	c.Epoch++
	return c, true
}

// Restored is m with brick b the only member of partition p, in place of
// group dead, every member of which the failure detector declared dead;
// b holds p's image of checkpoint id, the table's last. It fails if p's
// group is no longer dead, or p is leased.
func Restored(m *Maps, p Partition, dead []BrickID, id uint64, b BrickID) (*Maps, error) {
	g, ok := m.RG[p]
	switch {
	case !ok:
		return nil, fmt.Errorf("%w: %v", ErrLayout, p)
	case id == 0 || m.Checkpoint.ID != id:
		return nil, fmt.Errorf("%w: %d (the last is %d)", ErrNoCheckpoint, id, m.Checkpoint.ID)
	case !slices.Equal(g, dead):
		return nil, fmt.Errorf("%w: group %v changed (was %v)", ErrLive, g, dead)
	case m.Freeze.ID != 0:
		return nil, ErrCheckpointing
	case m.Joining[p] != (BrickID{}):
		return nil, ErrRecovering
	case m.Reshaping[p] != (Reshape{}):
		return nil, ErrReshaping
	}
	c := m.Clone()
	c.RG[p] = []BrickID{b}
	c.Epoch++
	return c, c.Validate()
}

// CheckpointImage is one replica's image in a checkpoint: what one file
// holds.
type CheckpointImage struct {
	Table     string
	Gen       uint64
	ID        uint64
	Partition Partition
	Entries   map[uint64][]byte
}

const checkpointMagic = "GRVDDSC1"

// MaxCheckpointBytes bounds one checkpoint file as a decoder reads it.
const MaxCheckpointBytes int64 = 1 << 34

// EncodeCheckpoint is the file of image c:
//
//	8 bytes   "GRVDDSC1"
//	uvarint   len(Table), then Table's bytes
//	8 bytes   Gen, little-endian
//	uvarint   ID
//	uvarint   the partition's bits; byte: its depth
//	uvarint   the number of entries
//	per entry, in increasing key order:
//	  8 bytes   key, little-endian
//	  uvarint   len(value), then the value's bytes
//	4 bytes   CRC-32C of everything before, little-endian
//
// One image, one encoding: keys strictly increasing, every key in the
// partition. The file is written whole and synced, then renamed into
// place (disk.FS.WriteFileSync), so a torn write leaves no file; the
// checksum catches bit rot.
func EncodeCheckpoint(c *CheckpointImage) []byte {
	size := 64 + len(c.Table)
	for _, v := range c.Entries {
		size += 8 + 10 + len(v)
	}
	b := make([]byte, 0, size)
	b = append(b, checkpointMagic...)
	b = appendUvarint(b, uint64(len(c.Table)))
	b = append(b, c.Table...)
	b = binary.LittleEndian.AppendUint64(b, c.Gen)
	b = appendUvarint(b, c.ID)
	b = appendUvarint(b, c.Partition.Bits)
	b = append(b, c.Partition.Depth)
	keys := make([]uint64, 0, len(c.Entries))
	for k := range c.Entries {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	b = appendUvarint(b, uint64(len(keys)))
	for _, k := range keys {
		b = binary.LittleEndian.AppendUint64(b, k)
		b = appendUvarint(b, uint64(len(c.Entries[k])))
		b = append(b, c.Entries[k]...)
	}
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// DecodeCheckpoint reads a checkpoint file, all of b.
func DecodeCheckpoint(b []byte) (*CheckpointImage, error) {
	if len(b) < len(checkpointMagic)+4 || !bytes.Equal(b[:len(checkpointMagic)], []byte(checkpointMagic)) {
		return nil, errors.New("ddstable: checkpoint: not a checkpoint file (magic)")
	}
	if int64(len(b)) > MaxCheckpointBytes {
		return nil, fmt.Errorf("ddstable: checkpoint: %d bytes (at most %d)", len(b), MaxCheckpointBytes)
	}
	body, sum := b[:len(b)-4], binary.LittleEndian.Uint32(b[len(b)-4:])
	if crc32.Checksum(body, castagnoli) != sum {
		return nil, errors.New("ddstable: checkpoint: checksum mismatch (a damaged file)")
	}
	b = body[len(checkpointMagic):]
	n, b, err := readUvarint(b, "checkpoint table name length")
	if err != nil {
		return nil, err
	}
	if n == 0 || n > MaxTableName || n > uint64(len(b)) {
		return nil, fmt.Errorf("ddstable: checkpoint: table name of %d bytes", n)
	}
	c := &CheckpointImage{Table: string(b[:n])}
	b = b[n:]
	if err := CheckName(c.Table); err != nil {
		return nil, err
	}
	if len(b) < 8 {
		return nil, errors.New("ddstable: checkpoint: truncated before the generation")
	}
	c.Gen, b = binary.LittleEndian.Uint64(b), b[8:]
	if c.ID, b, err = readUvarint(b, "checkpoint id"); err != nil {
		return nil, err
	}
	if c.Partition.Bits, b, err = readUvarint(b, "checkpoint partition"); err != nil {
		return nil, err
	}
	if len(b) == 0 {
		return nil, errors.New("ddstable: checkpoint: truncated before the partition's depth")
	}
	c.Partition.Depth, b = b[0], b[1:]
	if !c.Partition.Valid() || c.ID == 0 {
		return nil, fmt.Errorf("ddstable: checkpoint: partition %d/%d, id %d", c.Partition.Bits, c.Partition.Depth, c.ID)
	}
	if n, b, err = readUvarint(b, "checkpoint entry count"); err != nil {
		return nil, err
	}
	if n > uint64(len(b))/9 {
		return nil, fmt.Errorf("ddstable: checkpoint: %d entries in %d bytes", n, len(b))
	}
	c.Entries = make(map[uint64][]byte, n)
	var last uint64
	for i := range n {
		if len(b) < 8 {
			return nil, errors.New("ddstable: checkpoint: truncated entry")
		}
		k := binary.LittleEndian.Uint64(b)
		b = b[8:]
		if (i > 0 && k <= last) || !c.Partition.Contains(k) {
			return nil, fmt.Errorf("ddstable: checkpoint: key %d out of order or not in partition %v", k, c.Partition)
		}
		last = k
		var l uint64
		if l, b, err = readUvarint(b, "checkpoint value length"); err != nil {
			return nil, err
		}
		if l > MaxValue || l > uint64(len(b)) {
			return nil, fmt.Errorf("ddstable: checkpoint: a value of %d bytes (%d left, at most %d)", l, len(b), MaxValue)
		}
		c.Entries[k] = bytes.Clone(b[:l])
		b = b[l:]
	}
	if len(b) != 0 {
		return nil, fmt.Errorf("ddstable: checkpoint: %d bytes left over", len(b))
	}
	return c, nil
}
