package meta

import (
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	wal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"
	"github.com/hashicorp/raft-wal/segment"
	"github.com/hashicorp/raft-wal/types"
)

// Outside review 48 of the GROVE PATCH in third_party/raft-wal (Open rotates
// a recovered tail whose file is sealed). A crash is simulated by copying
// the WAL directory (segment files and wal-meta.db) from inside the meta
// store's CommitState: the WAL's writeMu is held there, every append so far
// is fsynced, and nothing else writes, so each copy is deterministic.

const r48SegmentSize = 4 << 10 // about 20 of r48Log's entries per segment

func r48Log(idx uint64, gen int) *raft.Log {
	pad := strings.Repeat(string(rune('a'+idx%26)), 120+int(idx*37%100))
	return &raft.Log{Index: idx, Term: uint64(gen + 1), Type: raft.LogCommand,
		Data: []byte(fmt.Sprintf("%d/%d/%s", idx, gen, pad))}
}

func r48Logs(from, to uint64, gen int) []*raft.Log {
	var logs []*raft.Log
	for i := from; i <= to; i++ {
		logs = append(logs, r48Log(i, gen))
	}
	return logs
}

// r48Meta is the bolt meta store with hooks around CommitState.
type r48Meta struct {
	*metadb.BoltMetaDB
	before, after func(types.PersistentState)
}

func (m *r48Meta) CommitState(st types.PersistentState) error {
	if m.before != nil {
		m.before(st)
	}
	if err := m.BoltMetaDB.CommitState(st); err != nil {
		return err
	}
	if m.after != nil {
		m.after(st)
	}
	return nil
}

func r48Open(dir string, m *r48Meta) (*wal.WAL, error) {
	if m == nil {
		m = &r48Meta{}
	}
	m.BoltMetaDB = &metadb.BoltMetaDB{}
	w, err := wal.Open(dir, wal.WithSegmentSize(r48SegmentSize),
		wal.WithLogger(hclog.NewNullLogger()), wal.WithMetaStore(m))
	if err != nil {
		m.BoltMetaDB.Close()
	}
	return w, err
}

// r48Copy copies the WAL directory: the crash image.
func r48Copy(t *testing.T, src string) string {
	dst := t.TempDir()
	ents, err := os.ReadDir(src)
	if err != nil {
		panic(err)
	}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		bs, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			panic(err)
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), bs, 0o644); err != nil {
			panic(err)
		}
	}
	return dst
}

func r48NumSealed(st types.PersistentState) int {
	n := 0
	for _, s := range st.Segments {
		if !s.SealTime.IsZero() {
			n++
		}
	}
	return n
}

// r48Check: the WAL holds exactly want (contiguous), and nothing after it.
func r48Check(w *wal.WAL, want []*raft.Log) error {
	var wf, wl uint64
	if len(want) > 0 {
		wf, wl = want[0].Index, want[len(want)-1].Index
	}
	first, err := w.FirstIndex()
	if err != nil {
		return err
	}
	last, err := w.LastIndex()
	if err != nil {
		return err
	}
	if first != wf || last != wl {
		return fmt.Errorf("the WAL holds [%d, %d], want [%d, %d]", first, last, wf, wl)
	}
	for _, l := range want {
		var got raft.Log
		if err := w.GetLog(l.Index, &got); err != nil {
			return fmt.Errorf("GetLog(%d) of [%d, %d]: %v", l.Index, wf, wl, err)
		}
		if got.Index != l.Index || got.Term != l.Term || string(got.Data) != string(l.Data) {
			return fmt.Errorf("GetLog(%d) = index %d term %d %.12q, want term %d %.12q",
				l.Index, got.Index, got.Term, got.Data, l.Term, l.Data)
		}
	}
	var got raft.Log
	if err := w.GetLog(wl+1, &got); err == nil {
		return fmt.Errorf("GetLog(%d) past the last index found %.12q", wl+1, got.Data)
	}
	return nil
}

func r48Store(w *wal.WAL, logs []*raft.Log, batch int) error {
	for len(logs) > 0 {
		b := min(batch, len(logs))
		if err := w.StoreLogs(logs[:b]); err != nil {
			return fmt.Errorf("StoreLogs %d..%d: %v", logs[0].Index, logs[b-1].Index, err)
		}
		logs = logs[b:]
	}
	return nil
}

// r48Resume opens a crash image, which must hold exactly want, appends 45
// entries (two or more segment rotations) and 1 more after a reopen, and
// checks the log after each step and each reopen.
func r48Resume(t *testing.T, name, dir string, want []*raft.Log) {
	t.Helper()
	step := "open"
	fail := func(err error) {
		t.Helper()
		t.Fatalf("%s: %s: %v", name, step, err)
	}
	w, err := r48Open(dir, nil)
	if err != nil {
		fail(err)
	}
	defer func() { w.Close() }()
	if err := r48Check(w, want); err != nil {
		fail(err)
	}
	next := uint64(1)
	if len(want) > 0 {
		next = want[len(want)-1].Index + 1
	}
	step = "append 45"
	more := r48Logs(next, next+44, 1)
	if err := r48Store(w, more, 3); err != nil {
		fail(err)
	}
	want = append(append([]*raft.Log(nil), want...), more...)
	if err := r48Check(w, want); err != nil {
		fail(err)
	}
	for i := 0; i < 2; i++ {
		step = fmt.Sprintf("reopen %d", i+1)
		w.Close()
		if w, err = r48Open(dir, nil); err != nil {
			fail(err)
		}
		if err := r48Check(w, want); err != nil {
			fail(err)
		}
		if i == 0 {
			step = "append 1 after the reopen"
			l := r48Log(want[len(want)-1].Index+1, 2)
			if err := w.StoreLogs([]*raft.Log{l}); err != nil {
				fail(err)
			}
			want = append(want, l)
		}
	}
}

// r48Rotation is a crash image taken at a rotation's meta commit.
type r48Rotation struct {
	st        types.PersistentState // the state the rotation commits
	pre, post string                // images before and after the commit
}

// r48Sealed: the segment a rotation seals (the last but one).
func (r r48Rotation) sealed() types.SegmentInfo { return r.st.Segments[len(r.st.Segments)-2] }

// r48Rotations appends logs (in batches of batch) to a new WAL in a fresh
// directory and images the first n rotations before and after their meta
// commit (after it the new tail segment's file does not exist yet).
func r48Rotations(t *testing.T, logs []*raft.Log, batch, n int) []r48Rotation {
	t.Helper()
	dir := t.TempDir()
	var mu sync.Mutex
	var rots []r48Rotation
	sealed := 0
	m := &r48Meta{
		before: func(st types.PersistentState) {
			mu.Lock()
			defer mu.Unlock()
			if k := r48NumSealed(st); k > sealed && len(rots) < n {
				rots = append(rots, r48Rotation{st: st, pre: r48Copy(t, dir)})
			}
		},
		after: func(st types.PersistentState) {
			mu.Lock()
			defer mu.Unlock()
			if k := r48NumSealed(st); k > sealed {
				sealed = k
				if len(rots) > 0 && rots[len(rots)-1].post == "" {
					rots[len(rots)-1].post = r48Copy(t, dir)
				}
			}
		},
	}
	w, err := r48Open(dir, m)
	if err != nil {
		t.Fatal(err)
	}
	for len(logs) > 0 {
		b := min(batch, len(logs))
		if err := w.StoreLogs(logs[:b]); err != nil {
			t.Fatal(err)
		}
		logs = logs[b:]
		mu.Lock()
		done := len(rots) == n && rots[n-1].post != ""
		mu.Unlock()
		if done {
			break
		}
	}
	w.Close()
	mu.Lock()
	defer mu.Unlock()
	if len(rots) < n || rots[n-1].post == "" {
		t.Fatalf("only %d rotations", len(rots))
	}
	return rots[:n]
}

// TestReview48WALCrashCopies: a crash right after the append that sealed a
// segment (before the rotation's meta commit), one after that commit but
// before the new tail's file exists, and one in the rotation Open now does
// (after its commit, before its file): each image reopens with every entry
// and accepts appends across further rotations.
func TestReview48WALCrashCopies(t *testing.T) {
	logs := r48Logs(1, 200, 0)
	for _, batch := range []int{1, 4} {
		rots := r48Rotations(t, logs, batch, 3)
		for k, r := range rots {
			s := r.sealed()
			want := logs[:s.MaxIndex]
			name := fmt.Sprintf("batch %d, rotation %d (segment [%d, %d])", batch, k+1, s.BaseIndex, s.MaxIndex)
			if s.MaxIndex == 0 || r.st.Segments[len(r.st.Segments)-1].BaseIndex != s.MaxIndex+1 {
				t.Fatalf("%s: a rotation commits %+v", name, r.st.Segments)
			}
			// The post image has no file for the new tail.
			if _, err := os.Stat(filepath.Join(r.post, segment.FileName(r.st.Segments[len(r.st.Segments)-1]))); !os.IsNotExist(err) {
				t.Fatalf("%s: the new tail's file exists before the commit returned: %v", name, err)
			}

			// The rotation at Open, imaged after its commit.
			open := r48Copy(t, r.pre)
			var openPost string
			om := &r48Meta{after: func(types.PersistentState) {
				if openPost == "" {
					openPost = r48Copy(t, open)
				}
			}}
			w, err := r48Open(open, om)
			if err != nil {
				t.Fatalf("%s: open of the pre-commit image: %v", name, err)
			}
			err = r48Check(w, want)
			w.Close()
			if err != nil {
				t.Fatalf("%s: pre-commit image: %v", name, err)
			}
			if openPost == "" {
				t.Fatalf("%s: Open did not rotate the sealed tail", name)
			}

			r48Resume(t, name+", crash before the rotation's commit", r.pre, want)
			r48Resume(t, name+", crash after the rotation's commit, before its file", r.post, want)
			r48Resume(t, name+", crash in Open's rotation, after its commit", openPost, want)
		}
	}
}

// TestReview48WALForceSealCommitLost: a tail truncation inside the tail
// segment seals its file (ForceSeal writes the index block and fsyncs)
// before the meta commit; a crash before that commit leaves a sealed tail
// holding the entries the truncation would have dropped. Open rotates it
// with MaxIndex at the old last index (the truncation did not happen: raft
// asks again), and the repeated truncation then cuts a sealed segment.
func TestReview48WALForceSealCommitLost(t *testing.T) {
	dir := t.TempDir()
	var mu sync.Mutex
	var last types.PersistentState
	var image string
	lo := uint64(0)
	m := &r48Meta{
		before: func(st types.PersistentState) {
			mu.Lock()
			defer mu.Unlock()
			if lo != 0 && image == "" {
				image = r48Copy(t, dir)
			}
		},
		after: func(st types.PersistentState) {
			mu.Lock()
			defer mu.Unlock()
			last = st
		},
	}
	w, err := r48Open(dir, m)
	if err != nil {
		t.Fatal(err)
	}
	logs := r48Logs(1, 50, 0)
	if err := r48Store(w, logs, 1); err != nil {
		t.Fatal(err)
	}
	w.Close() // settles any queued rotation (Open does it)
	if w, err = r48Open(dir, m); err != nil {
		t.Fatal(err)
	}
	defer func() { w.Close() }()
	mu.Lock()
	tailBase := last.Segments[len(last.Segments)-1].BaseIndex
	mu.Unlock()
	if n := uint64(len(logs)); n < tailBase+1 { // fewer than two entries in the tail
		more := r48Logs(n+1, n+3, 0)
		if err := r48Store(w, more, 1); err != nil {
			t.Fatal(err)
		}
		logs = append(logs, more...)
	}
	oldLast := uint64(len(logs))
	mu.Lock()
	lo = oldLast - 1 // inside the unsealed tail: ForceSeal
	mu.Unlock()
	if lo <= tailBase {
		t.Fatalf("truncation at %d is not inside the tail [%d, %d]", lo, tailBase, oldLast)
	}
	if err := w.DeleteRange(lo, oldLast); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	img := image
	mu.Unlock()
	if img == "" {
		t.Fatal("no image taken at the truncation's commit")
	}

	// The image: the truncation is lost, the sealed tail holds [.., oldLast].
	asLeft := r48Copy(t, img)
	w2, err := r48Open(img, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { w2.Close() }()
	if err := r48Check(w2, logs); err != nil {
		t.Fatalf("image of a lost ForceSeal truncation: %v", err)
	}
	if err := w2.DeleteRange(lo, oldLast); err != nil { // raft asks again
		t.Fatal(err)
	}
	want := logs[:lo-1]
	if err := r48Check(w2, want); err != nil {
		t.Fatalf("after the repeated truncation: %v", err)
	}
	w2.Close()
	r48Resume(t, "after the repeated truncation", img, want)
	r48Resume(t, "the image, appended to without the truncation", asLeft, logs)
}

// r48Zero zeroes n bytes of the file at off: sectors of the sealing write
// that never reached the disk.
func r48Zero(t *testing.T, path string, off, n int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(make([]byte, n), off); err != nil {
		t.Fatal(err)
	}
}

// r48IndexFrame checks the index frame of a sealed segment's file (its header
// just before IndexStart) and returns the file offset of the commit frame
// that follows it.
func r48IndexFrame(t *testing.T, path string, s types.SegmentInfo) int64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var fh [8]byte
	if _, err := f.ReadAt(fh[:], int64(s.IndexStart)-8); err != nil && err != io.EOF {
		t.Fatal(err)
	}
	n := s.MaxIndex - s.BaseIndex + 1
	if fh[0] != 2 /* FrameIndex */ || uint64(binary.LittleEndian.Uint32(fh[4:])) != 4*n {
		t.Fatalf("no index frame of %d entries at %d: % x", n, s.IndexStart-8, fh)
	}
	l := int64(4 * n)
	return int64(s.IndexStart) + l + (8-l%8)%8
}

// TestReview48WALTornSealIndex: power is lost during the fsync of the
// append that sealed a segment: the pages holding its index array and
// commit frame never reach the disk (the index frame's header does). That
// append never returned, so recovery keeps the entries of the earlier
// commits. But recoverTail keeps indexStart from the uncommitted index
// frame, so Sealed() says sealed and the patched Open rotates the segment,
// recording IndexStart at the torn index array: reads go through the
// writer's in-memory index until the next reopen, then through the
// on-disk index, which is zeroes. Fixed in the copy: recoverTail keeps a
// seal only if the commit it accepts follows the index frame; the torn seal
// leaves a writable tail that continues after the last good commit.
func TestReview48WALTornSealIndex(t *testing.T) {
	logs := r48Logs(1, 60, 0)
	r := r48Rotations(t, logs, 1, 1)[0]
	s := r.sealed()
	path := filepath.Join(r.pre, segment.FileName(s))
	commitOff := r48IndexFrame(t, path, s)
	r48Zero(t, path, int64(s.IndexStart), commitOff+8-int64(s.IndexStart))
	// Batches of one: the torn commit held entry MaxIndex only.
	r48Resume(t, fmt.Sprintf("segment [%d, %d] with a torn seal", s.BaseIndex, s.MaxIndex), r.pre, logs[:s.MaxIndex-1])
}

// TestReview48WALTornFirstBatchSeal: the same torn seal where the sealing
// append was the segment's first batch (a batch bigger than the segment).
// No commit frame is left, recoverTail re-initializes the file as empty but
// keeps indexStart: Sealed() says sealed with LastIndex 0, and the patched
// Open rotates with MaxIndex 0, so the "next" segment gets BaseIndex 1 and
// replaces segment 1 (acknowledged entries 1..30) in the meta store:
// FirstIndex is 0, appends fail ("non-monotonic append to segment with
// BaseIndex=1"), and the next Open fails ("unsealed segment is not at
// tail"). Upstream v0.4.2 only refused appends here ("segment is sealed").
// Fixed in the copy as above (no commit kept: an empty file, not sealed);
// Open also refuses, rather than rotates, a sealed tail with no entries.
func TestReview48WALTornFirstBatchSeal(t *testing.T) {
	logs := r48Logs(1, 60, 0)
	r := r48Rotations(t, r48Logs(1, 90, 0), 30, 2)[1] // 30 entries (>5 KiB): each batch seals a fresh segment
	s := r.sealed()
	if s.BaseIndex != 31 || s.MaxIndex != 60 {
		t.Fatalf("the second segment is [%d, %d]", s.BaseIndex, s.MaxIndex)
	}
	path := filepath.Join(r.pre, segment.FileName(s))
	r48Zero(t, path, r48IndexFrame(t, path, s), 8) // its only commit frame
	r48Resume(t, "segment [31, 60] whose one batch's seal is torn", r.pre, logs[:30])
}
