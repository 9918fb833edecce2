package meta

import (
	"bytes"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/raft-wal/fs"
	"github.com/hashicorp/raft-wal/segment"
	"github.com/hashicorp/raft-wal/types"
)

// Outside review 49 of the second GROVE PATCH in third_party/raft-wal
// (segment.Writer.recoverTail keeps a seal only if the accepted commit
// follows the index frame). Segment-level, byte-exact: 4 KiB segment, ten
// entries of 200 bytes (frames of 208, one commit each), then the batches
// below. Frame sizes: entry 8+pad8(len), index 8+pad8(4n), commit 8.

var r49Info = types.SegmentInfo{ID: 1, BaseIndex: 1, MinIndex: 1, Codec: 1,
	SizeLimit: 4096, CreateTime: time.Unix(1700000000, 0)}

func r49Entry(idx uint64, n int, b byte) types.LogEntry {
	return types.LogEntry{Index: idx, Data: bytes.Repeat([]byte{b}, n)}
}

func r49Seg(t *testing.T, small int) (*segment.Filer, string, types.SegmentWriter) {
	t.Helper()
	dir := t.TempDir()
	f := segment.NewFiler(dir, fs.New())
	w, err := f.Create(r49Info)
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= small; i++ {
		if err := w.Append([]types.LogEntry{r49Entry(uint64(i), 200, 'a')}); err != nil {
			t.Fatal(err)
		}
	}
	return f, filepath.Join(dir, segment.FileName(r49Info)), w
}

func r49Recover(t *testing.T, f *segment.Filer) types.SegmentWriter {
	t.Helper()
	w, err := f.RecoverTail(r49Info)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func r49Get(t *testing.T, w types.SegmentWriter, idx uint64, n int, b byte) {
	t.Helper()
	buf, err := w.GetLog(idx)
	if err != nil {
		t.Fatalf("GetLog(%d): %v", idx, err)
	}
	defer buf.Close()
	if !bytes.Equal(buf.Bs, bytes.Repeat([]byte{b}, n)) {
		t.Fatalf("GetLog(%d): %d bytes %.8q, want %d of %q", idx, len(buf.Bs), buf.Bs, n, b)
	}
}

// TestReview49TornSealThenShorterSeal: the sealing append of entry 11 (2000
// bytes, at 2192: entry frame 2008, index frame at 4200, commit at 4256) is
// torn as in TestReview48WALTornSealIndex: the index array and commit never
// reach the disk, the index frame's header (at 4200) does. Recovery rightly
// rewinds to 2192, not sealed. The retried entry 11 is 1936 bytes (frame
// 1944): its append also seals (2192+1944+56 > 4096) and commits: index frame
// at 4136 (IndexStart 4144), commit at 4192, ending at 4200, where the stale
// index header of the torn seal starts. A crash before the rotation's meta
// commit, and recoverTail reads both index frames, keeps the LAST one in
// indexFrame (4200, after the accepted commit at 4192) and drops the good
// seal: Sealed() is false, Open does not rotate, and the tail takes more
// appends past its size limit after its index block. The rule is "the index
// frame before the accepted commit"; the patch checks only the last index
// frame scanned, which the torn seal it discards leaves on disk. Fixed:
// each commitInfo records the index frame read before it, and the seal is
// the accepted commit's.
func TestReview49TornSealThenShorterSeal(t *testing.T) {
	f, path, w := r49Seg(t, 10)
	if err := w.Append([]types.LogEntry{r49Entry(11, 2000, 'b')}); err != nil {
		t.Fatal(err)
	}
	sealed, start, _ := w.Sealed()
	if !sealed || start != 4208 {
		t.Fatalf("first seal: sealed %v IndexStart %d, want true 4208", sealed, start)
	}
	w.Close()
	r48Zero(t, path, 4208, 4264-4208) // index array and commit torn

	w = r49Recover(t, f)
	if sealed, _, _ := w.Sealed(); sealed || w.LastIndex() != 10 {
		t.Fatalf("after the torn seal: sealed %v LastIndex %d, want false 10", sealed, w.LastIndex())
	}
	if err := w.Append([]types.LogEntry{r49Entry(11, 1936, 'c')}); err != nil {
		t.Fatal(err)
	}
	sealed, start, _ = w.Sealed()
	if !sealed || start != 4144 {
		t.Fatalf("second seal: sealed %v IndexStart %d, want true 4144", sealed, start)
	}
	w.Close() // crash before the rotation records the seal

	w = r49Recover(t, f)
	defer w.Close()
	r49Get(t, w, 11, 1936, 'c')
	if sealed, start, _ := w.Sealed(); !sealed || start != 4144 || w.LastIndex() != 11 {
		t.Fatalf("recovery of the committed second seal: sealed %v IndexStart %d LastIndex %d, want true 4144 11 (the stale torn index frame at 4200 hid it)",
			sealed, start, w.LastIndex())
	}
}

// TestReview49StaleCommitNotAccepted (passes): the torn sealing batch is
// entries 10 (200 bytes) and 11 (2000) at 1976 with a torn payload page
// (chain intact, its commit's CRC fails). The retried batch is entry 10 of
// 192 bytes (frame 200, no seal), whose commit ends at 2184, the stale
// header of entry 11. Recovery reads stale entry 11, the stale index frame
// and commit: that commit's CRC is checked over [2184, commit) and fails, so
// it rewinds to the new commit, unsealed, entry 11 dropped; appends and a
// reopen read every entry.
func TestReview49StaleCommitNotAccepted(t *testing.T) {
	f, path, w := r49Seg(t, 9)
	if err := w.Append([]types.LogEntry{r49Entry(10, 200, 'b'), r49Entry(11, 2000, 'b')}); err != nil {
		t.Fatal(err)
	}
	if sealed, _, _ := w.Sealed(); !sealed {
		t.Fatal("the batch did not seal")
	}
	w.Close()
	r48Zero(t, path, 2184+8+512, 512) // a payload page of entry 11

	w = r49Recover(t, f)
	if sealed, _, _ := w.Sealed(); sealed || w.LastIndex() != 9 {
		t.Fatalf("after the torn seal: sealed %v LastIndex %d, want false 9", sealed, w.LastIndex())
	}
	if err := w.Append([]types.LogEntry{r49Entry(10, 192, 'c')}); err != nil {
		t.Fatal(err)
	}
	w.Close()

	w = r49Recover(t, f)
	if sealed, _, _ := w.Sealed(); sealed || w.LastIndex() != 10 {
		t.Fatalf("after the short retry: sealed %v LastIndex %d, want false 10", sealed, w.LastIndex())
	}
	r49Get(t, w, 10, 192, 'c')
	if err := w.Append([]types.LogEntry{r49Entry(11, 100, 'd')}); err != nil {
		t.Fatal(err)
	}
	w.Close()
	w = r49Recover(t, f)
	defer w.Close()
	if w.LastIndex() != 11 {
		t.Fatalf("LastIndex %d, want 11", w.LastIndex())
	}
	for i := uint64(1); i <= 9; i++ {
		r49Get(t, w, i, 200, 'a')
	}
	r49Get(t, w, 10, 192, 'c')
	r49Get(t, w, 11, 100, 'd')
}
