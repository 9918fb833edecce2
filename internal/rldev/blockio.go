package rldev

import (
	"math/bits"
	"sync"

	"github.com/grovestore/grove/internal/disk"
)

// The I/O of the engine's block effects, shared by the runtime and the
// simulators (the engine's files do no I/O).

// ReadRun carries out a DiskRead of a run of blocks at off of dev: one
// read, then the checks (BlockRun.Decode).
func ReadRun(dev disk.Device, off int64, run BlockRun) (RunData, error) {
	return readRunInto(dev, off, run, make([]byte, int(run.N)*PhysBlockSize), false)
}

// ReadRunLent is ReadRun into a buffer of physBufs (a read the engine
// lends: DiskRead.Lend), which whoever knows that nothing else holds it
// may give back (putPhys). Only lent reads are pooled: a buffer that is
// never given back would cost its size class's rounding for nothing.
func ReadRunLent(dev disk.Device, off int64, run BlockRun) (RunData, error) {
	return readRunInto(dev, off, run, getPhys(int(run.N)), true)
}

func readRunInto(dev disk.Device, off int64, run BlockRun, raw []byte, pooled bool) (RunData, error) {
	if _, err := dev.ReadAt(raw, off); err != nil {
		if pooled {
			putPhys(raw) // only the pool's: its buffers are page-aligned
		}
		return RunData{}, err
	}
	return run.Decode(raw), nil
}

// DoWrite carries out a DiskWrite on dev: its data, or Encode's blocks,
// in one vectored write where dev writes them so (disk.VecWriter: a
// buffered file), else gathered into a buffer of physBufs (the simulator's
// devices, and direct writes, whose buffers must be aligned). What Encode
// made is only this write's: its headers, and the gathered buffer, go back
// to their pools once the write returned, which the disk.Device contract
// says no longer holds them.
func DoWrite(dev disk.Device, w DiskWrite) error {
	if w.Encode == nil {
		_, err := dev.WriteAt(w.Data, w.Off)
		return err
	}
	enc := w.Encode()
	defer enc.release()
	if vw, ok := dev.(disk.VecWriter); ok && vw.WritesVec() {
		_, err := vw.WriteAtVec(enc.Vec, w.Off)
		return err
	}
	buf := enc.gather()
	defer putPhys(buf)
	_, err := dev.WriteAt(buf, w.Off)
	return err
}

// physBufs recycles buffers of physical blocks, by size class: class k
// holds buffers of 2^k blocks. A Go allocation is zeroed, and zeroing a 1
// MiB request's 1.1 MiB of physical blocks took a tenth of the CPU of 1
// MiB reads and of 1 MiB writes (profiles of BenchmarkServiceRead1M and
// BenchmarkServiceWrite1M), before the data was even read or encoded. Every
// byte of a buffer handed out is written before it is used (a read fills
// it whole or fails; EncodeBlock and markCorrupt write whole blocks), so
// what a buffer held before never leaks. A buffer goes back only from
// where nothing else can hold it: DoWrite's encoded blocks after WriteAt,
// and a client read's blocks once its reply frame is written (the node's
// runtime: Service's loans, DiskRead.Lend).
var physBufs = sizedPool{unit: PhysBlockSize, alloc: func(n, c int) []byte { return disk.AlignedBytes(n, c, physAlign) }}

// physClasses bounds the pooled sizes: up to 2^(physClasses-1) blocks (8
// MiB of data); larger runs are allocated each time.
const physClasses = 12

// physAlign is the memory alignment of physBufs' buffers: a page, which
// meets every file system's alignment for direct I/O (disk.FileDevice
// writes an aligned buffer past the page cache).
const physAlign = 4096

// getPhys returns a buffer of n physical blocks.
func getPhys(n int) []byte { return physBufs.get(n) }

// putPhys gives back a buffer getPhys returned (b may be any slice of it
// that starts where it starts). Anything else is left to the collector.
func putPhys(b []byte) { physBufs.put(b) }

// hdrBufs recycles the block headers of vectored writes (Encoded), by
// size class: class k holds room for 2^k headers. Every byte of a buffer
// handed out is written before it is used (EncodeHeader, or a copy of
// corruptBlock's), and one goes back only once its write returned.
var hdrBufs = sizedPool{unit: HeaderSize, alloc: func(n, c int) []byte { return make([]byte, n, c) }}

// getHdrs returns a buffer of n headers.
func getHdrs(n int) []byte { return hdrBufs.get(n) }

// putHdrs gives back a buffer getHdrs returned.
func putHdrs(b []byte) { hdrBufs.put(b) }

// sizedPool recycles buffers of a whole number of units by size class:
// class k holds buffers of 2^k units (physClasses classes; larger ones
// are allocated each time and never kept).
type sizedPool struct {
	unit  int
	pools [physClasses]sync.Pool
	alloc func(n, c int) []byte // a new buffer of n bytes and capacity c
}

// get returns a buffer of n units.
func (p *sizedPool) get(n int) []byte {
	if n <= 0 {
		return nil
	}
	k := bits.Len(uint(n - 1)) // the smallest k with 2^k >= n
	if k >= physClasses {
		return make([]byte, n*p.unit)
	}
	if b, _ := p.pools[k].Get().(*[]byte); b != nil {
		return (*b)[:n*p.unit]
	}
	return p.alloc(n*p.unit, (1<<k)*p.unit)
}

// put gives back a buffer get returned (any slice of it that starts
// where it starts); anything else is left to the collector.
func (p *sizedPool) put(b []byte) {
	c := cap(b) / p.unit
	if c == 0 || cap(b)%p.unit != 0 || c&(c-1) != 0 {
		return
	}
	k := bits.Len(uint(c)) - 1
	if k >= physClasses {
		return
	}
	b = b[:cap(b)]
	p.pools[k].Put(&b)
}
