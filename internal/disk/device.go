package disk

import (
	"errors"
	"fmt"
	"io"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Device is a block device: a fixed-size array of bytes, read and written
// at offsets and lengths that are multiples of SectorSize. It is what an
// RLDev segment lives on (a file or a block device named in a node's
// config, or a simulated disk).
//
// Durability contract: a WriteAt that returned nil is visible to later
// reads at once, but survives a crash only once a Sync that started after
// it has returned nil. A crash may keep any subset of the sectors written
// since the last Sync, in any order (so a multi-sector write can be torn);
// sectors are atomic. A Sync that fails leaves the state of every write
// since the previous successful Sync unknown: the caller must not
// acknowledge any of them.
//
// Safe for concurrent use; concurrent writes to the same sectors are
// ordered by the caller, not by the device.
type Device interface {
	// ReadAt fills p whole or fails (io.ReaderAt's contract).
	ReadAt(p []byte, off int64) (int, error)
	// WriteAt holds no reference to p once it returned: its caller may
	// use p again at once (the RLDev runtime recycles its buffers so).
	WriteAt(p []byte, off int64) (int, error)
	// Sync makes durable every write that returned before Sync began.
	Sync() error
	// DropCache makes reads of [off, off+n) see what the disk holds. After
	// a failed writeback Linux may keep the lost pages cached, clean and
	// up to date, and report the error once: reads then return writes
	// that a crash will not keep, and so may a later process. A reader
	// that must see only what survives (an RLDev replica loading its
	// segment) syncs, then drops the range. DropCache evicts the range's
	// clean pages; it fails with ErrStillCached if any page of the range
	// is still cached afterwards (dirty, under writeback, or in use at
	// that moment, as a large folio shared with a neighbour being written
	// may be): sync and try again. Writes not yet synced stay visible.
	DropCache(off, n int64) error
	// Size is the device's size in bytes (a multiple of SectorSize).
	Size() int64
	Close() error
}

// SectorSize is the unit of atomicity and alignment of a Device.
const SectorSize = 512

// ErrUnaligned: an offset or a length that is not a multiple of SectorSize.
var ErrUnaligned = errors.New("disk: offset or length not a multiple of the sector size")

// ErrOutOfRange: an access past the end of the device.
var ErrOutOfRange = errors.New("disk: access past the end of the device")

// CheckAccess validates an access of n bytes at off on a device of size.
func CheckAccess(off int64, n int, size int64) error {
	if off%SectorSize != 0 || n%SectorSize != 0 {
		return fmt.Errorf("%w (offset %d, length %d)", ErrUnaligned, off, n)
	}
	if off < 0 || off+int64(n) > size {
		return fmt.Errorf("%w (offset %d, length %d, size %d)", ErrOutOfRange, off, n, size)
	}
	return nil
}

// FileDevice is a Device on a file (sparse: space is taken as it is
// written) or on a block device. Sync is fdatasync(2): data and the
// metadata needed to read it back, not timestamps.
type FileDevice struct {
	f    *os.File
	size int64
	// direct, if not nil, is the device opened again with O_DIRECT
	// (FileOptions.DirectWrites): writes of up to DirectMax bytes, and
	// the parts of larger ones that cover a page in part, go through it,
	// past the page cache (from a copy aligned as the file system asks,
	// memAlign, if theirs is not); the pages a large write covers whole
	// go through f. Both reach the same file: Sync (fdatasync, per file:
	// it flushes the device's cache whatever wrote to it) covers both, and
	// the kernel writes back and drops the cached pages a direct write
	// covers.
	direct   *os.File
	memAlign int
}

var _ Device = (*FileDevice)(nil)

// OpenFile opens the device at path. If the file does not exist and size is
// positive, it is created as a sparse file of that size (and the directory
// entry made durable); an existing file keeps its size, and a smaller one
// than size is refused (a device never shrinks under its segments).
func OpenFile(path string, size int64) (*FileDevice, error) {
	return OpenFileWith(path, size, FileOptions{})
}

// FileOptions are a FileDevice's choices.
type FileOptions struct {
	// DirectWrites sends writes of up to DirectMax bytes, and the parts
	// of larger ones that cover a page in part, past the page cache
	// (O_DIRECT), on a file whose file system supports it (statx's
	// STATX_DIOALIGN; not on a block device: openDirect); the pages larger
	// writes cover whole, and every read, go through the page cache.
	// Direct says whether it is on. Measured (README): on a disk
	// whose blocks are not in the page cache (larger than memory), 3.5x
	// the 4 KiB random writes at queue depth 32 of buffered writes, which
	// read the two pages an RLDev's 4 608-byte block covers in part
	// first; with the blocks cached, a quarter fewer, and reads of blocks
	// written so then miss the cache. Off by default.
	DirectWrites bool
}

// OpenFileWith is OpenFile with opts.
func OpenFileWith(path string, size int64, opts FileOptions) (*FileDevice, error) {
	if size%SectorSize != 0 {
		return nil, fmt.Errorf("disk %s: size %d is not a multiple of %d", path, size, SectorSize)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) && size > 0 {
		f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		if err == nil {
			if err = f.Truncate(size); err == nil {
				err = f.Sync()
			}
			if err == nil {
				err = syncDir(path)
			}
			if err != nil {
				f.Close()
				os.Remove(path)
				return nil, fmt.Errorf("disk %s: create: %w", path, err)
			}
		}
	}
	if err != nil {
		return nil, fmt.Errorf("disk %s: %w", path, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	got := st.Size()
	if st.Mode()&os.ModeDevice != 0 {
		// A block device reports size 0 in stat: ask it.
		if got, err = f.Seek(0, 2); err != nil {
			f.Close()
			return nil, err
		}
	}
	if got < size {
		f.Close()
		return nil, fmt.Errorf("disk %s: %d bytes, smaller than the %d configured", path, got, size)
	}
	if got%SectorSize != 0 {
		got -= got % SectorSize
	}
	d := &FileDevice{f: f, size: got}
	if opts.DirectWrites && st.Mode()&os.ModeDevice == 0 {
		d.openDirect(path)
	}
	return d, nil
}

// DirectMax is the largest write that goes past the page cache whole
// (FileOptions.DirectWrites): a small write of a block that does not fill
// whole pages makes a buffered write read the pages it covers in part
// first when they are not cached; a large one covers whole pages but at
// its ends, and those are faster buffered (1 MiB writes: 2.3 ms against
// 3.9 ms direct, in-process); its ends still go direct (WriteAt).
const DirectMax = 64 << 10

// openDirect opens the device for direct writes if its file system says
// how (statx's STATX_DIOALIGN; none on tmpfs, for one). Only for a file:
// a block device's page cache takes no inode lock, so its buffered and
// direct writes of neighbouring sectors run at once, and its large folios
// may span a page one write covers whole and one another writes direct;
// outside review 43 showed a direct write undone there by a buffered
// neighbour's write-back (Linux 6.11 and later report STATX_DIOALIGN for
// block devices). A block device's disk stays buffered.
func (d *FileDevice) openDirect(path string) {
	var st unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, path, 0, unix.STATX_DIOALIGN, &st); err != nil || st.Mask&unix.STATX_DIOALIGN == 0 ||
		st.Dio_mem_align == 0 || st.Dio_offset_align == 0 || SectorSize%st.Dio_offset_align != 0 {
		return
	}
	f, err := os.OpenFile(path, os.O_WRONLY|unix.O_DIRECT, 0)
	if err != nil {
		return
	}
	// The same file as d.f (not one renamed into its place meanwhile).
	var a, b unix.Stat_t
	if unix.Fstat(int(d.f.Fd()), &a) != nil || unix.Fstat(int(f.Fd()), &b) != nil || a.Dev != b.Dev || a.Ino != b.Ino {
		f.Close()
		return
	}
	d.direct, d.memAlign = f, int(st.Dio_mem_align)
}

// Direct reports whether d writes small writes, and the partial pages of
// large ones, past the page cache (FileOptions.DirectWrites was asked, the
// device is a file, and its file system supports it).
func (d *FileDevice) Direct() bool { return d.direct != nil }

func syncDir(path string) error {
	d, err := os.Open(dirOf(path))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

func dirOf(path string) string {
	for i := len(path) - 1; i >= 0; i-- {
		if path[i] == '/' {
			if i == 0 {
				return "/"
			}
			return path[:i]
		}
	}
	return "."
}

func (d *FileDevice) ReadAt(p []byte, off int64) (int, error) {
	if err := CheckAccess(off, len(p), d.size); err != nil {
		return 0, err
	}
	return d.f.ReadAt(p, off)
}

// WriteChunk is the largest write FileDevice passes to the kernel at
// once. The page cache keeps the size of folio a write made it create:
// ext4 (Linux 6.x) makes folios as large as the write (up to 2 MiB), and
// every later small write into a large folio walks all of its buffer heads,
// as does writeback. An RLDev written in 1 MiB requests and then in 4 KiB
// random ones spent a sixth of all CPU there (perf), so large writes go
// in 64 KiB pieces: measured, 4 KiB writes at queue depth 32 rose from
// 10.3k-11.8k to 14.3k replicated ops/s and 1 MiB writes did not change
// (a system call per 64 KiB).
const WriteChunk = 64 << 10

func (d *FileDevice) WriteAt(p []byte, off int64) (int, error) {
	if err := CheckAccess(off, len(p), d.size); err != nil {
		return 0, err
	}
	if d.direct == nil || len(p) == 0 {
		return writeChunks(d.f, p, off)
	}
	if len(p) <= DirectMax {
		return d.writeDirect(p, off)
	}
	// A large write: the pages it covers whole through the page cache,
	// its ends, which cover a page in part, direct. With direct writes on,
	// a page that two blocks share may be written by two writes at once
	// (their ranges do not overlap, so nothing orders them): written
	// buffered, one would read the page, the other land on the disk past
	// it, and the first's write-back put the other's old bytes back over
	// it. So a page is written buffered only by a write that covers it
	// whole, which nothing else writes meanwhile (the caller orders
	// writes to the same sectors); every part of a page goes direct.
	ps := int64(pageSize)
	end := off + int64(len(p))
	lo := min((off+ps-1)/ps*ps, end) // the first page boundary at or after off
	hi := max(end/ps*ps, lo)         // the last at or before end
	n := 0
	if lo > off {
		k, err := d.writeDirect(p[:lo-off], off)
		if n += k; err != nil {
			return n, err
		}
	}
	if hi > lo {
		k, err := writeChunks(d.f, p[lo-off:hi-off], lo)
		if n += k; err != nil {
			return n, err
		}
	}
	if end > hi {
		k, err := d.writeDirect(p[hi-off:], hi)
		if n += k; err != nil {
			return n, err
		}
	}
	return n, nil
}

// pageSize is the page cache's unit.
var pageSize = os.Getpagesize()

// writeDirect writes p (not empty) at off past the page cache, through an
// aligned copy if p's memory is not aligned as the file system asks
// (offsets and lengths are: they are multiples of SectorSize, which the
// file system's offset alignment divides, or openDirect opened nothing).
func (d *FileDevice) writeDirect(p []byte, off int64) (int, error) {
	if int(uintptr(unsafe.Pointer(&p[0])))%d.memAlign != 0 {
		b := AlignedBytes(len(p), len(p), max(d.memAlign, SectorSize))
		copy(b, p)
		p = b
	}
	return writeChunks(d.direct, p, off)
}

// AlignedBytes returns n bytes, of capacity c (>= n), starting at a
// multiple of align in memory (what a direct write's buffer needs).
func AlignedBytes(n, c, align int) []byte {
	b := make([]byte, c+align)
	skip := (align - int(uintptr(unsafe.Pointer(&b[0])))%align) % align
	return b[skip : skip+n : skip+c]
}

// writeChunks writes p at off to f, WriteChunk bytes at a time.
func writeChunks(f *os.File, p []byte, off int64) (int, error) {
	n := 0
	for n < len(p) {
		k, err := f.WriteAt(p[n:min(len(p), n+WriteChunk)], off+int64(n))
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// VecWriter is a Device that writes several buffers at once, as one
// write of their concatenation, without concatenating them (pwritev(2)):
// an RLDev block's header and its data go to the disk from where each
// is, and a 1 MiB write's data is not copied once more in user space.
// WritesVec says whether it does so now; a caller that gets false writes
// a concatenation with WriteAt instead.
type VecWriter interface {
	WritesVec() bool
	// WriteAtVec is WriteAt of the concatenation of bufs, under its
	// contract: it holds no reference to bufs once it returned.
	WriteAtVec(bufs [][]byte, off int64) (int, error)
}

var _ VecWriter = (*FileDevice)(nil)

// WritesVec: buffered writes are vectored; direct ones (DirectWrites)
// need their buffers aligned and go through WriteAt.
func (d *FileDevice) WritesVec() bool { return d.direct == nil }

// maxIOV bounds the buffers of one pwritev(2) (Linux's IOV_MAX is 1024).
const maxIOV = 1024

// WriteAtVec writes bufs at off as WriteAt writes their concatenation: in
// pieces of WriteChunk bytes at most (the page cache's folios stay as
// WriteAt's leave them), each piece one pwritev, a short one continued.
// With direct writes on it writes an aligned concatenation with WriteAt.
func (d *FileDevice) WriteAtVec(bufs [][]byte, off int64) (int, error) {
	total := 0
	for _, b := range bufs {
		total += len(b)
	}
	if err := CheckAccess(off, total, d.size); err != nil {
		return 0, err
	}
	if d.direct != nil {
		p := AlignedBytes(total, total, max(d.memAlign, SectorSize))
		k := 0
		for _, b := range bufs {
			k += copy(p[k:], b)
		}
		return d.WriteAt(p, off)
	}
	rc, err := d.f.SyscallConn()
	if err != nil {
		return 0, err
	}
	n := 0
	var iov [][]byte
	for i, at := 0, 0; n < total; { // bufs[i][at:] is the next byte to write
		iov = iov[:0]
		for size := 0; i < len(bufs) && size < WriteChunk && len(iov) < maxIOV; {
			b := bufs[i][at:]
			if len(b) > WriteChunk-size {
				b = b[:WriteChunk-size]
			}
			if len(b) > 0 {
				iov = append(iov, b)
				size += len(b)
			}
			if at += len(b); at == len(bufs[i]) {
				i, at = i+1, 0
			}
		}
		var k int
		var werr error
		// Control holds a reference on the descriptor while the call runs
		// (a concurrent Close waits for it, and its number is not reused
		// meanwhile), as WriteAt's pwrite does, and no lock: RawConn.Write
		// would take the file's write lock, and a disk's writes would run
		// one at a time (outside review 95; on a block device, whose
		// buffered writes the kernel does not serialize, its workers
		// would no longer write in parallel).
		if err := rc.Control(func(fd uintptr) {
			k, werr = pwritevFull(int(fd), iov, off+int64(n))
		}); err != nil {
			return n, &os.PathError{Op: "pwritev", Path: d.f.Name(), Err: os.ErrClosed} // Control fails only on a closed file
		}
		n += k
		if werr != nil {
			return n, &os.PathError{Op: "pwritev", Path: d.f.Name(), Err: werr}
		}
	}
	return n, nil
}

// pwritevFull writes iov at off whole, continuing a short write where it
// stopped; it fails with io.ErrShortWrite if a write makes no progress.
func pwritevFull(fd int, iov [][]byte, off int64) (int, error) {
	n := 0
	for len(iov) > 0 {
		k, err := unix.Pwritev(fd, iov, off+int64(n))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return n, err
		}
		if k <= 0 {
			return n, io.ErrShortWrite
		}
		n += k
		for k > 0 && len(iov) > 0 { // drop what was written
			if k >= len(iov[0]) {
				k -= len(iov[0])
				iov = iov[1:]
			} else {
				iov[0] = iov[0][k:]
				k = 0
			}
		}
	}
	return n, nil
}

// Sync is fdatasync(2).
func (d *FileDevice) Sync() error { return unix.Fdatasync(int(d.f.Fd())) }

// maxFolio bounds the page cache's folios: a PMD's worth (2 MiB with 4 KiB
// pages on x86-64 and arm64, 32 MiB with 16 KiB pages), twice over for
// margin.
var maxFolio = 2 * int64(pageSize) * int64(pageSize/8)

// ErrStillCached: DropCache left pages of its range in the page cache.
var ErrStillCached = errors.New("disk: pages of the range are still cached")

// DropCache is posix_fadvise(POSIX_FADV_DONTNEED) over the range, which
// evicts the clean pages that nothing maps, locks, references or writes
// back at that moment, and reports nothing per page; so cachestat(2) then
// checks that no page of the range is left (outside review 59: on Linux
// 6.18 a failed writeback's page stayed cached after fadvise returned 0,
// its large folio shared with a neighbour's dirty sector); mincore(2)
// where cachestat is missing or denied (cachedIn).
func (d *FileDevice) DropCache(off, n int64) error {
	if n <= 0 || off < 0 || off+n > d.size {
		return fmt.Errorf("%w: drop [%d, +%d) of %d bytes", ErrOutOfRange, off, n, d.size)
	}
	fd := int(d.f.Fd())
	// The kernel evicts no large folio that lies partly outside the range
	// it is given (find_lock_entries): the range is widened to the
	// largest folio's alignment, so that one shared with a neighbour goes
	// too (if that neighbour's part is clean). The neighbours' clean pages
	// go with it: a cost in reads, nothing else.
	lo, hi := off/maxFolio*maxFolio, min((off+n+maxFolio-1)/maxFolio*maxFolio, d.size)
	if err := unix.Fadvise(fd, lo, hi-lo, unix.FADV_DONTNEED); err != nil {
		return fmt.Errorf("disk: dropping cached pages: %w", err)
	}
	left, dirty, wb, err := cachedIn(fd, off, n)
	if err != nil {
		return err
	}
	if left > 0 {
		return fmt.Errorf("%w: %d pages of [%d, +%d) (%d dirty, %d under writeback)", ErrStillCached, left, off, n, dirty, wb)
	}
	return nil
}

// cachedIn counts the pages of [off, off+n) of file fd in the page cache
// (and, where cachestat(2) tells, how many are dirty or under writeback).
// Where cachestat is missing (Linux before 6.5) or denied (a sandbox's
// seccomp filter, outside review 60), mincore(2) over a mapping of the
// range counts them: mapping touches no page, so it neither brings any in
// nor keeps any from eviction.
func cachedIn(fd int, off, n int64) (cached, dirty, writeback uint64, err error) {
	var st unix.Cachestat_t
	if err := unix.Cachestat(uint(fd), &unix.CachestatRange{Off: uint64(off), Len: uint64(n)}, &st, 0); err == nil {
		return st.Cache, st.Dirty, st.Writeback, nil
	}
	ps := int64(pageSize)
	lo := off / ps * ps
	hi := (off + n + ps - 1) / ps * ps
	m, err := unix.Mmap(fd, lo, int(hi-lo), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("disk: counting cached pages (cachestat unavailable, mmap): %w", err)
	}
	defer unix.Munmap(m)
	vec := make([]byte, (hi-lo)/ps)
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		return 0, 0, 0, fmt.Errorf("disk: counting cached pages (cachestat unavailable, mincore): %w", e)
	}
	for _, v := range vec {
		cached += uint64(v & 1)
	}
	return cached, 0, 0, nil
}

func (d *FileDevice) Size() int64 { return d.size }
func (d *FileDevice) Close() error {
	if d.direct != nil {
		d.direct.Close()
	}
	return d.f.Close()
}
