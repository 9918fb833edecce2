package disk

import (
	"errors"
	"math/rand"
	"sync"
	"syscall"
)

// MemDevice is an in-memory Device for simulations and tests, with the
// failures real disks have, each under the caller's control so that a
// seeded simulation replays exactly:
//
//   - Crash keeps what was synced, plus any subset of the sectors written
//     since (torn writes: part of a multi-sector write lands);
//   - FlipBit corrupts a byte on the platter (bit rot);
//   - a misdirected write lands at another offset and reports success;
//   - writes, reads and syncs fail with EIO, or writes with ENOSPC (full);
//   - a lying device acknowledges syncs it does not perform.
//
// Latency is the simulator's business (it decides when an operation
// completes); the device applies each operation when called.
type MemDevice struct {
	mu       sync.Mutex
	platter  []byte     // what survives a crash
	visible  []byte     // what reads see: platter plus the writes since Sync
	pending  []memWrite // writes since the last Sync, in order
	r        *rand.Rand // for faults; nil: none at random
	faults   MemFaults
	misdirec int // misdirected writes so far
	closed   bool
	// lost: a failed sync lost writes that reads still see (visible is
	// more than platter plus pending) until a crash or DropCache.
	lost bool
}

type memWrite struct {
	off  int64
	data []byte
}

// MemFaults are the failure rates of a MemDevice (probabilities per
// operation, drawn from the device's random source).
type MemFaults struct {
	WriteEIO float64 // a write fails with EIO (and lands nowhere)
	ReadEIO  float64 // a read fails with EIO
	SyncEIO  float64 // a sync fails with EIO (the writes since the last one stay unsynced)
	// SyncLoses: a sync fails with EIO and the writes since the last one
	// never reach the platter (visible until a crash), as Linux may leave
	// them after a failed writeback: the pages marked clean and the error
	// reported once, so that the next sync succeeds without them.
	SyncLoses float64
	Full      bool // every write fails with ENOSPC
	// Misdirect: a write reports success but lands at another offset, a
	// multiple of MisdirectStride away (the caller's block size).
	Misdirect       float64
	MisdirectStride int64
	// Lying: syncs report success without making anything durable.
	Lying bool
	// StillCached: DropCache fails with ErrStillCached.
	StillCached bool
}

var _ Device = (*MemDevice)(nil)

// NewMemDevice returns a zeroed device of size bytes whose random faults
// are drawn from r (nil: no random faults).
func NewMemDevice(size int64, r *rand.Rand) *MemDevice {
	if size%SectorSize != 0 {
		panic("disk: MemDevice size not a multiple of the sector size")
	}
	return &MemDevice{platter: make([]byte, size), visible: make([]byte, size), r: r}
}

// SetFaults replaces the device's failure rates.
func (d *MemDevice) SetFaults(f MemFaults) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.faults = f
}

// ErrClosed: an operation on a closed device.
var ErrClosed = errors.New("disk: device closed")

func (d *MemDevice) chance(p float64) bool { return p > 0 && d.r != nil && d.r.Float64() < p }

func (d *MemDevice) ReadAt(p []byte, off int64) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return 0, ErrClosed
	}
	if err := CheckAccess(off, len(p), int64(len(d.visible))); err != nil {
		return 0, err
	}
	if d.chance(d.faults.ReadEIO) {
		return 0, syscall.EIO
	}
	return copy(p, d.visible[off:]), nil
}

func (d *MemDevice) WriteAt(p []byte, off int64) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return 0, ErrClosed
	}
	if err := CheckAccess(off, len(p), int64(len(d.visible))); err != nil {
		return 0, err
	}
	if d.faults.Full {
		return 0, syscall.ENOSPC
	}
	if d.chance(d.faults.WriteEIO) {
		return 0, syscall.EIO
	}
	at := off
	if st := d.faults.MisdirectStride; st > 0 && d.chance(d.faults.Misdirect) {
		// Land a whole number of strides away, inside the device.
		span := (int64(len(d.visible)) - int64(len(p))) / st
		if span > 0 {
			k := d.r.Int63n(span + 1)
			if cand := k * st; cand != off && cand%SectorSize == 0 {
				at = cand
				d.misdirec++
			}
		}
	}
	data := append([]byte(nil), p...)
	copy(d.visible[at:], data)
	d.pending = append(d.pending, memWrite{off: at, data: data})
	return len(p), nil
}

func (d *MemDevice) Sync() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return ErrClosed
	}
	if d.chance(d.faults.SyncEIO) {
		return syscall.EIO
	}
	if d.chance(d.faults.SyncLoses) {
		return d.loseUnsyncedLocked()
	}
	if d.faults.Lying {
		return nil
	}
	for _, w := range d.pending {
		copy(d.platter[w.off:], w.data)
	}
	d.pending = nil
	return nil
}

// FailSync is a Sync that fails as a failed writeback may on Linux: with
// EIO, the writes since the last sync never reaching the platter though
// reads still see them (the pages left cached and clean) until a crash or
// DropCache.
func (d *MemDevice) FailSync() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.loseUnsyncedLocked()
}

func (d *MemDevice) loseUnsyncedLocked() error {
	d.lost = true
	d.pending = nil
	return syscall.EIO
}

// DropCache makes reads of [off, off+n) see the platter plus the writes
// not yet synced: what a failed sync lost is gone from them too. With
// StillCached set it fails, changing nothing (a page in use). It draws
// nothing from the device's random source, and changes nothing a crash
// keeps.
func (d *MemDevice) DropCache(off, n int64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return ErrClosed
	}
	if n <= 0 || off < 0 || off+n > int64(len(d.visible)) {
		return ErrOutOfRange
	}
	if d.faults.StillCached {
		return ErrStillCached
	}
	if !d.lost {
		return nil // reads see the platter and the pending writes already
	}
	end := off + n
	copy(d.visible[off:end], d.platter[off:end])
	for _, w := range d.pending {
		lo, hi := max(w.off, off), min(w.off+int64(len(w.data)), end)
		if lo < hi {
			copy(d.visible[lo:hi], w.data[lo-w.off:hi-w.off])
		}
	}
	return nil
}

func (d *MemDevice) Size() int64 { return int64(len(d.platter)) }

func (d *MemDevice) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	return nil
}

// Crash models a power cut: what was synced stays; of each write since the
// last sync, all, none or (if torn) a random subset of its sectors lands,
// drawn from r. The device is usable again afterwards (a restart).
func (d *MemDevice) Crash(r *rand.Rand, torn bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, w := range d.pending {
		if r == nil {
			break // nothing unsynced survives
		}
		switch {
		case !torn || len(w.data) <= SectorSize:
			if r.Intn(2) == 0 {
				copy(d.platter[w.off:], w.data)
			}
		default:
			for s := 0; s < len(w.data); s += SectorSize {
				if r.Intn(2) == 0 {
					copy(d.platter[w.off+int64(s):], w.data[s:s+SectorSize])
				}
			}
		}
	}
	// Reads now see the platter. Without a lost sync, visible differs
	// from it only where a pending write went, so only those ranges are
	// copied back (a whole copy of every simulated disk at every crash
	// was a seventh of the RLDev simulator's time).
	if d.lost {
		copy(d.visible, d.platter)
	} else {
		for _, w := range d.pending {
			end := w.off + int64(len(w.data))
			copy(d.visible[w.off:end], d.platter[w.off:end])
		}
	}
	d.pending = nil
	d.lost = false
	d.closed = false
}

// FlipBit flips one bit of the byte at off, on the platter and in what
// reads see (bit rot, found only by checksums).
func (d *MemDevice) FlipBit(off int64, bit uint) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.platter[off] ^= 1 << (bit % 8)
	d.visible[off] ^= 1 << (bit % 8)
}

// Platter returns a copy of what would survive a crash now (for checkers).
func (d *MemDevice) Platter(off int64, n int) []byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]byte(nil), d.platter[off:off+int64(n)]...)
}

// Misdirected counts the writes that landed elsewhere.
func (d *MemDevice) Misdirected() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.misdirec
}

// Wipe replaces the device's contents with zeros (a disk replaced after a
// permanent failure).
func (d *MemDevice) Wipe() {
	d.mu.Lock()
	defer d.mu.Unlock()
	clear(d.platter)
	clear(d.visible)
	d.pending = nil
	d.lost = false
}
