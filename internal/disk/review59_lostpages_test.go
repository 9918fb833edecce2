package disk

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Outside review 59 (of DropCache): a real failed writeback on this
// kernel, made with a loop device whose backing file lives on a small,
// full tmpfs: a write-back into a punched hole of the backing file cannot
// allocate, the loop device fails the bio, and the page cache above it
// keeps the lost pages clean and up to date.
//
// lostPagesRig sets the rig up: a tmpfs of 24 MiB holding img (64 MiB,
// sparse) behind a loop device. fill fills the tmpfs; punch frees a
// range of img (so that writing it again needs space the tmpfs has not).
type lostPagesRig struct {
	t    *testing.T
	img  string
	back string
	loop string
}

func newLostPagesRig(t *testing.T) *lostPagesRig {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("needs root (mount, losetup)")
	}
	if _, err := exec.LookPath("losetup"); err != nil {
		t.Skip("no losetup")
	}
	back := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", back).CombinedOutput(); err != nil {
		t.Skipf("mount tmpfs: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", back).Run() })
	img := filepath.Join(back, "img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, 64<<20); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("losetup", "--find", "--show", img).CombinedOutput()
	if err != nil {
		t.Skipf("losetup: %v %s", err, out)
	}
	loop := strings.TrimSpace(string(out))
	t.Cleanup(func() { exec.Command("losetup", "-d", loop).Run() })
	return &lostPagesRig{t: t, img: img, back: back, loop: loop}
}

// punch frees [off, off+n) of the backing file.
func (r *lostPagesRig) punch(off, n int64) {
	f, err := os.OpenFile(r.img, os.O_RDWR, 0)
	if err != nil {
		r.t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n); err != nil {
		r.t.Fatal(err)
	}
}

// fill takes every free byte of the tmpfs (undone at cleanup).
func (r *lostPagesRig) fill() {
	p := filepath.Join(r.back, "filler")
	f, err := os.Create(p)
	if err != nil {
		r.t.Fatal(err)
	}
	defer f.Close()
	buf := bytes.Repeat([]byte{1}, 4096)
	for {
		if _, err := f.Write(buf); err != nil {
			if errors.Is(err, syscall.ENOSPC) {
				return
			}
			r.t.Fatal(err)
		}
	}
}

func (r *lostPagesRig) unfill() { os.Remove(filepath.Join(r.back, "filler")) }

// open opens the rig's loop device (closed at the test's end).
func (r *lostPagesRig) open() *FileDevice {
	d, err := OpenFile(r.loop, 0)
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { d.Close() })
	return d
}

// durableThenDoomed writes 0xA over [off, off+n) of d durably, then frees
// that range of the backing file (at phys) and fills the tmpfs, then
// writes 0xB over it: the next write-back of it fails. The caller unfills.
func (r *lostPagesRig) durableThenDoomed(d *FileDevice, off, phys, n int64) {
	if _, err := d.WriteAt(bytes.Repeat([]byte{0xA}, int(n)), off); err != nil {
		r.t.Fatal(err)
	}
	if err := d.Sync(); err != nil {
		r.t.Fatal(err)
	}
	r.punch(phys, n)
	r.fill()
	if _, err := d.WriteAt(bytes.Repeat([]byte{0xB}, int(n)), off); err != nil {
		r.t.Fatal(err)
	}
}

// lostWrite opens the loop device and makes [off, off+n) a lost write:
// 0xA durable, 0xB written and its Sync failed (skips the test if the
// write-back did not fail); the disk works again afterwards.
func (r *lostPagesRig) lostWrite(off, n int64) *FileDevice {
	d := r.open()
	r.durableThenDoomed(d, off, off, n)
	if d.Sync() == nil {
		r.t.Skip("the write-back did not fail")
	}
	r.unfill()
	return d
}

// directByte reads the byte at off of path past the page cache: what the
// disk holds.
func directByte(t *testing.T, path string, off int64) byte {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p := AlignedBytes(4096, 4096, 4096)
	if _, err := f.ReadAt(p, off/4096*4096); err != nil {
		t.Fatal(err)
	}
	return p[off%4096]
}

func cachedPages(t *testing.T, f *os.File, off, n int64) unix.Cachestat_t {
	var st unix.Cachestat_t
	if err := unix.Cachestat(uint(f.Fd()), &unix.CachestatRange{Off: uint64(off), Len: uint64(n)}, &st, 0); err != nil {
		t.Skipf("cachestat: %v", err)
	}
	return st
}

func readByte(t *testing.T, d Device, off int64) byte {
	p := make([]byte, SectorSize)
	if _, err := d.ReadAt(p, off); err != nil {
		t.Fatal(err)
	}
	return p[0]
}

// TestReview59BlockDeviceLostPages: on a block device, the lost write is
// read back after the failed Sync, and DropCache alone (nothing else dirty
// in its folio) makes reads see the disk. The baseline the next tests
// build on.
func TestReview59BlockDeviceLostPages(t *testing.T) {
	r := newLostPagesRig(t)
	d := r.open()
	const off, n = 1 << 20, 64 << 10
	r.durableThenDoomed(d, off, off, n)
	defer r.unfill()
	serr := d.Sync()
	t.Logf("Sync after the write into the hole: %v", serr)
	if serr == nil {
		t.Skip("the write-back did not fail on this kernel")
	}
	st := cachedPages(t, d.f, off, n)
	t.Logf("after the failed Sync: read %#x, cachestat %+v", readByte(t, d, off), st)
	if err := d.Sync(); err != nil {
		t.Logf("second Sync: %v", err)
	} else {
		t.Logf("second Sync: nil (the error was reported once)")
	}
	// A new process (a new open file description) sees the lost write
	// too, and its Sync is told nothing: why the Service starts suspect.
	if d2, err := OpenFile(r.loop, 0); err == nil {
		t.Logf("reopened: read %#x, Sync %v", readByte(t, d2, off), d2.Sync())
		d2.Close()
	}
	if err := d.DropCache(off, n); err != nil {
		t.Fatal(err)
	}
	t.Logf("after DropCache: read %#x, cachestat %+v", readByte(t, d, off), cachedPages(t, d.f, off, n))
	if b := readByte(t, d, off); b == 0xB {
		t.Fatalf("DropCache left the lost write readable")
	}
	// Evicting the lost pages reports nothing again (no spurious failed
	// Sync after a drop).
	if err := d.Sync(); err != nil {
		t.Errorf("the Sync after DropCache: %v", err)
	}
}

// lostThenDirtyNeighbour: on d (at path; its bytes [off, off+n) sit at
// phys in the backing file), a durable write, then a write whose Sync
// fails (lost, still cached), then a write of the range's last page (a
// neighbour in the same folio: another replica's write in flight, say),
// then DropCache of the rest of the range. On Linux 6.18 fadvise returned
// 0 and left the lost pages cached (their folio holds the dirty
// neighbour): DropCache must then say ErrStillCached. After the
// neighbour's Sync a DropCache succeeds, and reads then agree with an
// O_DIRECT read (what the disk holds).
func lostThenDirtyNeighbour(t *testing.T, r *lostPagesRig, d *FileDevice, path string, off, phys int64) {
	const n = 64 << 10
	const mine = n - 4096 // the range read; the last page is the neighbour's
	if _, err := d.WriteAt(bytes.Repeat([]byte{0xA}, n), off); err != nil {
		t.Fatal(err)
	}
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
	// Not cached: the lost write then makes the folios, as a write of a
	// block not read lately does.
	if err := d.DropCache(off, n); err != nil {
		t.Fatal(err)
	}
	r.punch(phys, n)
	r.fill()
	if _, err := d.WriteAt(bytes.Repeat([]byte{0xB}, n), off); err != nil {
		t.Fatal(err)
	}
	serr := d.Sync()
	if serr == nil {
		t.Skip("the write-back did not fail on this kernel")
	}
	r.unfill() // the disk works again
	t.Logf("failed Sync: %v; read %#x", serr, readByte(t, d, off))
	if _, err := d.WriteAt(bytes.Repeat([]byte{0xC}, 4096), off+mine); err != nil {
		t.Fatal(err)
	}
	direct := func() byte { return directByte(t, path, off) }
	err := d.DropCache(off, mine)
	got := readByte(t, d, off)
	t.Logf("after a neighbour's write, DropCache: %v; cachestat %+v, read %#x, on the disk %#x", err, cachedPages(t, d.f, off, mine), got, direct())
	if err == nil && got != direct() {
		t.Errorf("DropCache returned nil but reads see %#x where the disk holds %#x", got, direct())
	}
	if err := d.Sync(); err != nil {
		t.Fatalf("the neighbour's Sync: %v", err)
	}
	if err := d.DropCache(off, mine); err != nil {
		t.Fatalf("DropCache after the neighbour's Sync: %v", err)
	}
	if got, disk := readByte(t, d, off), direct(); got != disk {
		t.Errorf("after the neighbour's Sync and a DropCache: reads see %#x, the disk holds %#x", got, disk)
	}
}

// TestReview59BlockDeviceDirtyNeighbour: lostThenDirtyNeighbour on the
// loop device itself (a disk that is a block device).
func TestReview59BlockDeviceDirtyNeighbour(t *testing.T) {
	r := newLostPagesRig(t)
	d := r.open()
	lostThenDirtyNeighbour(t, r, d, r.loop, 1<<20, 1<<20)
}

// TestReview59Ext4FileDirtyNeighbour: lostThenDirtyNeighbour on a file of
// an ext4 (no journal) on the loop device.
func TestReview59Ext4FileDirtyNeighbour(t *testing.T) {
	r := newLostPagesRig(t)
	if out, err := exec.Command("mkfs.ext4", "-F", "-q", "-b", "4096", "-O", "^has_journal", "-E", "lazy_itable_init=0", r.loop).CombinedOutput(); err != nil {
		t.Skipf("mkfs.ext4: %v %s", err, out)
	}
	mnt := t.TempDir()
	if out, err := exec.Command("mount", r.loop, mnt).CombinedOutput(); err != nil {
		t.Skipf("mount: %v %s", err, out)
	}
	defer exec.Command("umount", "-l", mnt).Run()
	path := filepath.Join(mnt, "dev")
	d, err := OpenFile(path, 8<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	const off, n = 1 << 20, 64 << 10
	// Allocate the blocks, then find them on the loop device (FIBMAP).
	if _, err := d.WriteAt(bytes.Repeat([]byte{0xA}, n), off); err != nil {
		t.Fatal(err)
	}
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
	var phys int64 = -1
	for i := int64(0); i < n/4096; i++ {
		blk := uint32((off / 4096) + i)
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, d.f.Fd(), 1 /* FIBMAP */, uintptr(unsafe.Pointer(&blk))); e != 0 {
			t.Skipf("FIBMAP: %v", e)
		}
		if i == 0 {
			phys = int64(blk) * 4096
		} else if int64(blk)*4096 != phys+i*4096 {
			t.Skip("the file's blocks are not contiguous")
		}
	}
	lostThenDirtyNeighbour(t, r, d, path, off, phys)
}

// TestReview59DirectReadSeesTheDisk: what a fix can lean on. An O_DIRECT
// read sees what the disk holds whatever the page cache keeps (the lost
// folio shares a dirty neighbour here, as in lostThenDirtyNeighbour, which
// defeats DropCache).
func TestReview59DirectReadSeesTheDisk(t *testing.T) {
	r := newLostPagesRig(t)
	const off, n = 1 << 20, 64 << 10
	d := r.lostWrite(off, n)
	if _, err := d.WriteAt(bytes.Repeat([]byte{0xC}, SectorSize), off+n-SectorSize); err != nil {
		t.Fatal(err)
	}
	disk := directByte(t, r.loop, off)
	t.Logf("buffered read %#x, O_DIRECT read %#x", readByte(t, d, off), disk)
	if disk == 0xB {
		t.Fatal("an O_DIRECT read saw the lost write")
	}
}
