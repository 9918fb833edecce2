package rldev

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/grovestore/grove/internal/disk"
)

// The disk header: one page at offset 0 of every disk that holds segments
// (its copy B at 4 KiB), written when the disk is first used. Its UUID is
// registered in the RLDev table: a disk whose header is blank, or names
// another UUID than the table, was replaced (or wiped), and every segment
// the table places on it is lost and must be copied whole from its peer.
//
// payload: UUID (16 bytes), node (u64), disk index (u32).
const PageDisk = 5

// DiskHeader is what a disk's header says.
type DiskHeader struct {
	UUID  string // 32 hex digits
	Node  uint64
	Index uint32
}

// ReadDiskHeader reads a disk's header: ok is false for a disk never used
// (or whose header is unreadable: it is then taken as a new disk).
func ReadDiskHeader(dev disk.Device) (h DiskHeader, ok bool, err error) {
	buf := make([]byte, 2*PageSize)
	if _, err := dev.ReadAt(buf, 0); err != nil {
		return h, false, err
	}
	_, payload, ok := NewestPage(buf[:PageSize], buf[PageSize:], PageDisk)
	if !ok || len(payload) != 28 {
		return h, false, nil
	}
	return DiskHeader{UUID: hex.EncodeToString(payload[:16]), Node: binary.LittleEndian.Uint64(payload[16:]),
		Index: binary.LittleEndian.Uint32(payload[24:])}, true, nil
}

// FormatDisk writes a new header (a fresh UUID) on a disk, durably.
func FormatDisk(dev disk.Device, node uint64, index uint32) (DiskHeader, error) {
	if dev.Size() < DiskReserved+MetaSize {
		return DiskHeader{}, fmt.Errorf("rldev: a %d-byte disk is too small", dev.Size())
	}
	var id [16]byte
	if _, err := rand.Read(id[:]); err != nil {
		return DiskHeader{}, err
	}
	payload := make([]byte, 28)
	copy(payload, id[:])
	binary.LittleEndian.PutUint64(payload[16:], node)
	binary.LittleEndian.PutUint32(payload[24:], index)
	p, err := EncodePage(PageDisk, 1, payload, PageSize)
	if err != nil {
		return DiskHeader{}, err
	}
	buf := append(p, p...) // both copies
	if _, err := dev.WriteAt(buf, 0); err != nil {
		return DiskHeader{}, err
	}
	if err := dev.Sync(); err != nil {
		return DiskHeader{}, err
	}
	return DiskHeader{UUID: hex.EncodeToString(id[:]), Node: node, Index: index}, nil
}

// OpenDisk reads a disk's header and formats it if it has none. fresh is
// true when it was formatted now.
//
// The header is read as the disk holds it, not as the page cache may: a
// process whose FormatDisk sync failed may have left the lost header
// cached (Linux reports the failure once, to it), and a header taken from
// there would be gone after a power cut, the disk then formatted anew and
// every segment on it taken as lost (outside review 59).
func OpenDisk(dev disk.Device, node uint64, index uint32) (h DiskHeader, fresh bool, err error) {
	err = dev.DropCache(0, 2*PageSize)
	for i := 0; i < 3 && errors.Is(err, disk.ErrStillCached); i++ {
		// Dirty (a format whose process died before its sync): a sync
		// writes it back, or fails and leaves it clean (and lost); the
		// drop takes it either way. A failure here may also be an
		// earlier process's, never reported (review 60): not this
		// disk's end.
		_ = dev.Sync()
		err = dev.DropCache(0, 2*PageSize)
	}
	if err != nil {
		return h, false, fmt.Errorf("rldev: reading the disk's header from the disk: %w", err)
	}
	h, ok, err := ReadDiskHeader(dev)
	if err != nil {
		return h, false, err
	}
	if ok {
		if h.Node != node || h.Index != index {
			return h, false, fmt.Errorf("rldev: the disk belongs to node %d (disk %d), not node %d (disk %d)", h.Node, h.Index, node, index)
		}
		return h, false, nil
	}
	h, err = FormatDisk(dev, node, index)
	return h, true, err
}
