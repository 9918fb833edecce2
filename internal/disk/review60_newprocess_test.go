package disk

import (
	"bytes"
	"testing"

	"golang.org/x/sys/unix"
)

// Outside review 60: a process writes, the write-back fails in the
// background (the flusher, or a global sync(2), which keeps the error
// for fsync), and the process dies before its own fdatasync. The next
// process opens the disk: its first Sync reports that old failure (the
// error was never seen: errseq_sample gives it to a new opener). In the
// engine, that first Sync is the drop's sync that every replica's first
// load joins (replica.dropCache): every replica on the disk fails at once
// ("syncing its disk before dropping its cached pages"), is marked stale
// with FullCopy, and is copied whole, though none of them had anything in
// flight and the drop that follows would have evicted the lost pages.
func TestReview60NewProcessDropAfterUnheardFailure(t *testing.T) {
	r := newLostPagesRig(t)
	const off, n = 1 << 20, 64 << 10
	old, err := OpenFile(r.loop, 0) // the process that dies
	if err != nil {
		t.Fatal(err)
	}
	if _, err := old.WriteAt(bytes.Repeat([]byte{0xA}, n), off); err != nil {
		t.Fatal(err)
	}
	if err := old.Sync(); err != nil {
		t.Fatal(err)
	}
	r.punch(off, n)
	r.fill()
	if _, err := old.WriteAt(bytes.Repeat([]byte{0xB}, n), off); err != nil {
		t.Fatal(err)
	}
	unix.Sync() // background write-back: fails, nobody's fsync hears it yet
	r.unfill()
	old.Close()                   // dies without fdatasync
	d, err := OpenFile(r.loop, 0) // the next process
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	t.Logf("next process: read %#x (a block device's last close dropped its cache), cachestat %+v", readByte(t, d, off), cachedPages(t, d.f, off, n))
	first := d.Sync()
	second := d.Sync()
	// On Linux 6.18: the first fails, the second succeeds. The engine's
	// drop therefore goes on after a failed sync (replica.dropCache), and
	// so does OpenDisk: the pages it lost are clean, and the drop takes
	// them (TestReview60FirstSyncFailureAtStartFailsAReplica).
	t.Logf("next process's first Sync: %v; second: %v", first, second)
	if err := d.DropCache(off, n); err != nil {
		t.Fatal(err)
	}
	if got, disk := readByte(t, d, off), directByte(t, r.loop, off); got != disk {
		t.Fatalf("after the drop reads see %#x, the disk holds %#x", got, disk)
	}
}
