package disk

import (
	"bytes"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// Outside review 43 (of the direct writes, at 1ff720c): on a block device
// (statx reports STATX_DIOALIGN for block devices since Linux 6.11), a
// buffered write of one 4 608-byte block and a concurrent direct write of
// the next block share a page of the block device's page cache. Block
// devices take no i_rwsem, so the two are not serialized as on ext4/xfs:
// the buffered write may read the shared page from the disk before the
// direct write lands (the next block's old head), dirty it, and the
// direct write's page-cache invalidation then fails; writeback puts the
// old head back over the direct write (shown on a loop device: 1 block
// wrong on the disk, and thousands of Syncs failed with EIO, in 87k
// pairs). Fixed twice: every part of a page now goes direct (WriteAt), and
// a block device takes no direct writes at all (openDirect), which this
// test checks.
func TestReview43BlockDeviceTakesNoDirectWrites(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root (losetup)")
	}
	if _, err := exec.LookPath("losetup"); err != nil {
		t.Skip("no losetup")
	}
	back := filepath.Join(t.TempDir(), "back.img")
	if err := os.WriteFile(back, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(back, 64<<20); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("losetup", "--find", "--show", back).CombinedOutput()
	if err != nil {
		t.Skipf("losetup: %v %s", err, out)
	}
	loop := strings.TrimSpace(string(out))
	defer exec.Command("losetup", "-d", loop).Run()
	d, err := OpenFileWith(loop, 0, FileOptions{DirectWrites: true})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.Direct() {
		t.Fatalf("%s: a block device opened for direct writes", loop)
	}
}

// The review's pattern on a regular file: pairs of neighbouring blocks
// sharing a page written at once, one from a buffer not aligned in memory
// (buffered at 1ff720c, an aligned copy direct since), one aligned
// (direct), a Sync after every pair: every pair whose Sync returned nil
// must be on the disk (read past the page cache) and read back through
// the page cache, and no Sync may fail.
func TestReview43RegularFileMixedWritesSharePage(t *testing.T) {
	const size = 64 << 20
	p := filepath.Join(t.TempDir(), "disk")
	d, err := OpenFileWith(p, size, FileOptions{DirectWrites: true})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if !d.Direct() {
		t.Skipf("%s: no STATX_DIOALIGN on this file system", p)
	}
	const syncEvery, rounds = 1, 1
	badDisk, badCache, lost, syncErrs := 0, 0, 0, 0
	for round := 0; round < rounds; round++ {
		// Old contents everywhere: 0xEE, written directly (nothing cached).
		old := AlignedBytes(DirectMax, DirectMax, 4096)
		for i := range old {
			old[i] = 0xEE
		}
		for off := int64(0); off < size; off += DirectMax {
			if _, err := d.WriteAt(old, off); err != nil {
				t.Fatal(err)
			}
		}
		if err := d.Sync(); err != nil {
			t.Fatal(err)
		}

		const phys = 4608
		pairs := size / (2 * phys)
		r := rand.New(rand.NewSource(int64(round)))
		type pair struct{ a, b []byte }
		ps := make([]pair, pairs)
		for j := range ps {
			ps[j].a = AlignedBytes(phys+1, phys+1, 4096)[1:] // not aligned in memory
			ps[j].b = AlignedBytes(phys, phys, 4096)         // aligned: direct
			r.Read(ps[j].a)
			r.Read(ps[j].b)
		}
		acked := make([]bool, pairs)
		const workers = 2
		var wg sync.WaitGroup
		var mu sync.Mutex
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				for j := w; j < pairs; j += workers {
					off := int64(j) * 2 * phys
					var inner sync.WaitGroup
					inner.Add(2)
					go func() { defer inner.Done(); d.WriteAt(ps[j].a, off) }()
					go func() { defer inner.Done(); d.WriteAt(ps[j].b, off+phys) }()
					inner.Wait()
					if j%syncEvery == 0 {
						err := d.Sync()
						mu.Lock()
						if err != nil {
							syncErrs++
						} else if syncEvery == 1 {
							acked[j] = true
						}
						mu.Unlock()
					}
				}
			}(w)
		}
		wg.Wait()
		if err := d.Sync(); err != nil {
			syncErrs++
		}
		// The disk, read past the page cache.
		rd, err := os.OpenFile(p, os.O_RDONLY|unix.O_DIRECT, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer rd.Close()
		onDisk := AlignedBytes(2*phys, 2*phys, 4096)
		cached := make([]byte, 2*phys)
		for j := 0; j < pairs; j++ {
			off := int64(j) * 2 * phys
			if _, err := rd.ReadAt(onDisk, off); err != nil {
				t.Fatal(err)
			}
			if _, err := d.ReadAt(cached, off); err != nil {
				t.Fatal(err)
			}
			want := append(append([]byte{}, ps[j].a...), ps[j].b...)
			if !bytes.Equal(onDisk, want) {
				if badDisk < 3 {
					i := 0
					for onDisk[i] == want[i] {
						i++
					}
					t.Logf("pair %d: disk differs from byte %d (block %s) on: %x... want %x...", j, i, map[bool]string{true: "a", false: "b (direct)"}[i < phys], onDisk[i:i+8], want[i:i+8])
				}
				badDisk++
				if acked[j] {
					lost++
				}
			}
			if !bytes.Equal(cached, want) {
				badCache++
			}
		}
	}
	t.Logf("%d rounds of %d pairs: %d wrong on disk (%d of them acknowledged by a Sync that returned nil), %d wrong through the page cache, %d syncs failed", rounds, size/(2*4608), badDisk, lost, badCache, syncErrs)
	if badDisk > 0 || badCache > 0 || syncErrs > 0 {
		t.Fatalf("writes of neighbouring blocks sharing a page: %d pairs wrong on disk, %d through the page cache, %d syncs failed (EIO)", badDisk, badCache, syncErrs)
	}
}
