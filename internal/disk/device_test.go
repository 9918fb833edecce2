package disk

import (
	"bytes"
	"errors"
	"math/rand"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

func TestFileDevice(t *testing.T) {
	p := filepath.Join(t.TempDir(), "disk")
	d, err := OpenFile(p, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if d.Size() != 1<<20 {
		t.Fatalf("size %d", d.Size())
	}
	if st, _ := os.Stat(p); st.Size() != 1<<20 {
		t.Fatalf("file size %d", st.Size())
	}
	buf := bytes.Repeat([]byte{7}, 4096)
	if _, err := d.WriteAt(buf, 8192); err != nil {
		t.Fatal(err)
	}
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []struct {
		off int64
		n   int
		err error
	}{{100, 512, ErrUnaligned}, {0, 100, ErrUnaligned}, {1 << 20, 512, ErrOutOfRange}, {-512, 512, ErrOutOfRange}} {
		if _, err := d.WriteAt(make([]byte, bad.n), bad.off); !errors.Is(err, bad.err) {
			t.Errorf("write %d at %d: %v, want %v", bad.n, bad.off, err, bad.err)
		}
	}
	d.Close()
	// Reopened: same size, the data is there; a larger configured size is
	// refused (a device never shrinks under its segments).
	d, err = OpenFile(p, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4096)
	if _, err := d.ReadAt(got, 8192); err != nil || !bytes.Equal(got, buf) {
		t.Fatalf("read back: %v", err)
	}
	d.Close()
	if _, err := OpenFile(p, 2<<20); err == nil {
		t.Fatal("a device smaller than configured was accepted")
	}
}

// A crash keeps what was synced; of what was not, whole writes or (torn)
// sectors of them, never anything else.
func TestMemDeviceCrash(t *testing.T) {
	for seed := int64(1); seed <= 50; seed++ {
		r := rand.New(rand.NewSource(seed))
		d := NewMemDevice(64*SectorSize, nil)
		old := bytes.Repeat([]byte{1}, 8*SectorSize)
		d.WriteAt(old, 0)
		d.Sync()
		next := bytes.Repeat([]byte{2}, 8*SectorSize)
		d.WriteAt(next, 0)
		d.Crash(r, true)
		got := make([]byte, 8*SectorSize)
		d.ReadAt(got, 0)
		for s := 0; s < 8; s++ {
			sec := got[s*SectorSize : (s+1)*SectorSize]
			if !bytes.Equal(sec, old[:SectorSize]) && !bytes.Equal(sec, next[:SectorSize]) {
				t.Fatalf("seed %d: sector %d is neither the old nor the new data", seed, s)
			}
		}
	}
	d := NewMemDevice(8*SectorSize, nil)
	d.WriteAt(bytes.Repeat([]byte{3}, SectorSize), 0)
	d.Crash(nil, false)
	got := make([]byte, SectorSize)
	d.ReadAt(got, 0)
	if got[0] != 0 {
		t.Fatal("an unsynced write survived a crash that keeps nothing unsynced")
	}
}

func TestMemDeviceFaults(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	d := NewMemDevice(64*SectorSize, r)
	d.SetFaults(MemFaults{Full: true})
	if _, err := d.WriteAt(make([]byte, SectorSize), 0); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("full: %v", err)
	}
	d.SetFaults(MemFaults{WriteEIO: 1})
	if _, err := d.WriteAt(make([]byte, SectorSize), 0); !errors.Is(err, syscall.EIO) {
		t.Fatalf("EIO: %v", err)
	}
	d.SetFaults(MemFaults{Lying: true})
	d.WriteAt(bytes.Repeat([]byte{9}, SectorSize), 0)
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
	d.Crash(nil, false)
	b := make([]byte, SectorSize)
	d.ReadAt(b, 0)
	if b[0] == 9 {
		t.Fatal("a lying device's write survived the crash")
	}
	d.SetFaults(MemFaults{Misdirect: 1, MisdirectStride: 4 * SectorSize})
	d.WriteAt(bytes.Repeat([]byte{5}, SectorSize), 0)
	d.ReadAt(b, 0)
	if b[0] == 5 || d.Misdirected() != 1 {
		t.Fatalf("misdirected write landed where it was sent (misdirected %d)", d.Misdirected())
	}
	d.SetFaults(MemFaults{})
	d.WriteAt(bytes.Repeat([]byte{4}, SectorSize), 0)
	d.Sync()
	d.FlipBit(3, 0)
	d.ReadAt(b, 0)
	if b[3] != 5 {
		t.Fatalf("flipped byte: %d", b[3])
	}
}

// Direct writes (FileOptions.DirectWrites): small writes go past the
// page cache (through an aligned copy if their buffer is not aligned),
// large ones through it but for their ends; reads (through the page cache)
// see each write at once, whichever way it went. Random writes of random
// sizes, offsets and buffer alignments, checked against a model after each
// and, at the end, on the disk itself (read past the page cache).
func TestFileDeviceDirectWrites(t *testing.T) {
	p := filepath.Join(t.TempDir(), "disk")
	const size = 4 << 20
	d, err := OpenFileWith(p, size, FileOptions{DirectWrites: true})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if !d.Direct() {
		t.Skipf("the file system under %s does not take direct writes (statx: no STATX_DIOALIGN)", p)
	}
	if n, err := d.WriteAt(nil, 0); n != 0 || err != nil {
		t.Fatalf("an empty write: %d, %v", n, err)
	}
	r := rand.New(rand.NewSource(1))
	model := make([]byte, size)
	arena := make([]byte, 2*DirectMax+8192)
	for i := 0; i < 400; i++ {
		n := (1 + r.Intn(2*DirectMax/SectorSize)) * SectorSize
		off := int64(r.Intn((size-n)/SectorSize)) * SectorSize
		start := r.Intn(8192/SectorSize) * SectorSize // page-aligned or not
		if r.Intn(2) == 0 {
			start++ // not even sector-aligned in memory
		}
		buf := arena[start : start+n]
		r.Read(buf)
		if _, err := d.WriteAt(buf, off); err != nil {
			t.Fatalf("write %d of %d bytes at %d (buffer at +%d): %v", i, n, off, start, err)
		}
		copy(model[off:], buf)
		got := make([]byte, n)
		if _, err := d.ReadAt(got, off); err != nil || !bytes.Equal(got, buf) {
			t.Fatalf("write %d of %d bytes at %d read back wrong (%v)", i, n, off, err)
		}
	}
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
	if off, ok := onDiskEquals(t, p, model); !ok {
		t.Fatalf("the disk differs from the model at byte %d", off)
	}
}

// onDiskEquals reads the file at p past the page cache and compares it
// with want; false and the first differing offset if they differ.
func onDiskEquals(t *testing.T, p string, want []byte) (int, bool) {
	t.Helper()
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got := AlignedBytes(len(want), len(want), 4096)
	if _, err := f.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	for i := range want {
		if got[i] != want[i] {
			return i, false
		}
	}
	return 0, true
}

// With direct writes on, two writes at once of neighbouring blocks that
// share a page (RLDev blocks are 4 608 bytes: most pages hold parts of
// two) must both land: a large write (past DirectMax) beside a small one,
// over and over, the disk itself checked after every round. Written
// buffered, the large write's partial page could carry the small write's
// old bytes back over its new ones at write-back (the page read before the
// direct write landed); WriteAt writes every part of a page direct.
func TestFileDeviceDirectWritesSharedPages(t *testing.T) {
	p := filepath.Join(t.TempDir(), "disk")
	const blk = 4608
	const big = 16 // blocks of the large write: 73 728 bytes
	const slots = 32
	const size = slots * (big + 1) * blk / SectorSize * SectorSize
	d, err := OpenFileWith(p, size, FileOptions{DirectWrites: true})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if !d.Direct() {
		t.Skipf("the file system under %s does not take direct writes", p)
	}
	model := make([]byte, size)
	r := rand.New(rand.NewSource(2))
	for round := 0; round < 100; round++ {
		var wg sync.WaitGroup
		errs := make(chan error, 2*slots)
		for s := 0; s < slots; s++ {
			base := int64(s * (big + 1) * blk)
			large := make([]byte, big*blk)
			small := AlignedBytes(blk, blk, 4096)
			r.Read(large)
			r.Read(small)
			copy(model[base:], large)
			copy(model[base+big*blk:], small)
			wg.Add(2)
			go func() { defer wg.Done(); _, err := d.WriteAt(large, base); errs <- err }()
			go func() { defer wg.Done(); _, err := d.WriteAt(small, base+big*blk); errs <- err }()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		if err := d.Sync(); err != nil {
			t.Fatal(err)
		}
		if off, ok := onDiskEquals(t, p, model); !ok {
			t.Fatalf("round %d: the disk differs from what was written at byte %d (block %d of its slot)", round, off, off%((big+1)*blk)/blk)
		}
		// Out of the page cache: a buffered write of part of a page
		// then reads it from the disk, which widens the race.
		unix.Fadvise(int(d.f.Fd()), 0, 0, unix.FADV_DONTNEED)
	}
}

// TestMemDeviceFailSyncAndDropCache: a failed sync's writes stay readable
// (as the pages a failed writeback leaves cached) but not durable; after
// DropCache reads see the platter plus the writes made since.
func TestMemDeviceFailSyncAndDropCache(t *testing.T) {
	d := NewMemDevice(8*SectorSize, nil)
	fill := func(b byte) []byte { return bytes.Repeat([]byte{b}, SectorSize) }
	read := func(off int64) byte {
		p := make([]byte, SectorSize)
		if _, err := d.ReadAt(p, off); err != nil {
			t.Fatal(err)
		}
		return p[0]
	}
	d.WriteAt(fill(1), 0)
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
	d.WriteAt(fill(2), 0)
	if err := d.FailSync(); !errors.Is(err, syscall.EIO) {
		t.Fatalf("FailSync: %v", err)
	}
	if read(0) != 2 {
		t.Fatal("the lost write is not readable before DropCache")
	}
	if d.Platter(0, 1)[0] != 1 {
		t.Fatal("the lost write reached the platter")
	}
	d.WriteAt(fill(3), SectorSize) // not synced: stays visible across DropCache
	d.SetFaults(MemFaults{StillCached: true})
	if err := d.DropCache(0, 2*SectorSize); !errors.Is(err, ErrStillCached) || read(0) != 2 {
		t.Fatalf("DropCache with StillCached: %v, read %d", err, read(0))
	}
	d.SetFaults(MemFaults{})
	if err := d.DropCache(SectorSize, SectorSize); err != nil || read(0) != 2 {
		t.Fatalf("DropCache of another range: %v, read %d (want the lost 2: not dropped)", err, read(0))
	}
	if err := d.DropCache(0, 2*SectorSize); err != nil {
		t.Fatal(err)
	}
	if read(0) != 1 || read(SectorSize) != 3 {
		t.Fatalf("after DropCache: %d %d, want 1 3", read(0), read(SectorSize))
	}
}

// TestFileDeviceDropCache: DropCache evicts the clean pages of its range
// (the state a failed writeback leaves its pages in), so that reads go to
// the disk, and fails with ErrStillCached while a page of the range is
// dirty. Checked with cachestat(2) (Linux 6.5 and later).
func TestFileDeviceDropCache(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dev")
	d, err := OpenFile(path, 4<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	cached := func(off, n uint64) uint64 {
		var st unix.Cachestat_t
		if err := unix.Cachestat(uint(d.f.Fd()), &unix.CachestatRange{Off: off, Len: n}, &st, 0); err != nil {
			t.Skipf("cachestat: %v", err)
		}
		return st.Cache
	}
	// One large write: the page cache may hold it in large folios, of
	// which the drops below take parts.
	if _, err := d.WriteAt(bytes.Repeat([]byte{7}, 2<<20), 0); err != nil {
		t.Fatal(err)
	}
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
	if cached(0, 2<<20) == 0 {
		t.Skip("the file system keeps no pages of the file cached")
	}
	// A range inside a folio, then the rest.
	if err := d.DropCache(1<<20+4096, 8192); err != nil {
		t.Fatal(err)
	}
	if n := cached(1<<20+4096, 8192); n != 0 {
		t.Fatalf("%d pages of the range still cached after DropCache", n)
	}
	if err := d.DropCache(0, 2<<20); err != nil {
		t.Fatal(err)
	}
	if n := cached(0, 2<<20); n != 0 {
		t.Fatalf("%d pages still cached after DropCache", n)
	}
	p := make([]byte, 4096)
	if _, err := d.ReadAt(p, 4096); err != nil || p[0] != 7 {
		t.Fatalf("read after DropCache: %v %d", err, p[0])
	}
	// A dirty page stays, and says so.
	if _, err := d.WriteAt(bytes.Repeat([]byte{8}, 4096), 3<<20); err != nil {
		t.Fatal(err)
	}
	if err := d.DropCache(3<<20, 4096); !errors.Is(err, ErrStillCached) {
		t.Logf("DropCache of a dirty page: %v (writeback may have been quick)", err)
	}
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := d.DropCache(3<<20, 4096); err != nil {
		t.Fatalf("after a sync: %v", err)
	}
	if err := d.DropCache(4<<20-4096, 8192); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("a range past the end: %v", err)
	}
}
