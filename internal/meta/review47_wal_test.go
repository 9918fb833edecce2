package meta

import (
	"fmt"
	"math/rand"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	wal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"

	"github.com/grovestore/grove/internal/sim"
)

// review47SegmentSize: segments this small rotate every few dozen entries,
// so truncations land in sealed segments, the tail, and on boundaries.
const review47SegmentSize = 4 << 10

// review47WAL drives raft-wal directly, opened as openLogStore opens it
// (an owned metadb), and keeps a model of the log it must hold.
type review47WAL struct {
	t    *testing.T
	dir  string
	w    *wal.WAL
	mdb  *metadb.BoltMetaDB
	rng  *rand.Rand
	gen  int         // bumped by every truncation: rewritten indexes differ
	logs []*raft.Log // the model: logs[i].Index == first+i
	next uint64      // the index the next append uses
	ops  []string    // the sequence so far, for the failure message
}

func newReview47WAL(t *testing.T, rng *rand.Rand) *review47WAL {
	h := &review47WAL{t: t, dir: t.TempDir(), rng: rng, next: 1}
	h.open()
	t.Cleanup(func() {
		if h.w != nil {
			h.w.Close()
			h.mdb.Close()
		}
	})
	return h
}

func (h *review47WAL) fatalf(format string, args ...any) {
	h.t.Helper()
	h.t.Fatalf("%s\nafter: %s", fmt.Sprintf(format, args...), strings.Join(h.ops, "; "))
}

func (h *review47WAL) open() {
	h.t.Helper()
	h.mdb = &metadb.BoltMetaDB{}
	w, err := wal.Open(h.dir, wal.WithSegmentSize(review47SegmentSize),
		wal.WithLogger(hclog.NewNullLogger()), wal.WithMetaStore(h.mdb))
	if err != nil {
		h.fatalf("reopen: %v", err)
	}
	h.w = w
}

func (h *review47WAL) reopen() {
	h.t.Helper()
	h.ops = append(h.ops, "reopen")
	// (A Close that wins the race with a rotation the last append queued
	// leaves a sealed tail: Grove's copy of raft-wal rotates it at open,
	// TestReview47WALReopenAfterSegmentFills.)
	if err := h.w.Close(); err != nil {
		h.fatalf("close: %v", err)
	}
	h.mdb.Close()
	h.w = nil
	h.open()
	h.check("reopen")
}

func (h *review47WAL) first() uint64 {
	if len(h.logs) == 0 {
		return 0
	}
	return h.logs[0].Index
}

func (h *review47WAL) last() uint64 {
	if len(h.logs) == 0 {
		return 0
	}
	return h.logs[len(h.logs)-1].Index
}

// appendN stores n entries in batches of at most batch, as raft does.
func (h *review47WAL) appendN(n, batch int) {
	h.t.Helper()
	h.ops = append(h.ops, fmt.Sprintf("append %d..%d (batches of %d)", h.next, h.next+uint64(n)-1, batch))
	for n > 0 {
		b := min(batch, n)
		logs := make([]*raft.Log, b)
		for i := range logs {
			idx := h.next + uint64(i)
			pad := strings.Repeat(string(rune('a'+idx%26)), 20+h.rng.Intn(180))
			logs[i] = &raft.Log{
				Index: idx,
				Term:  uint64(h.gen + 1),
				Type:  raft.LogCommand,
				Data:  []byte(fmt.Sprintf("%d/%d/%s", idx, h.gen, pad)),
			}
		}
		if err := h.w.StoreLogs(logs); err != nil {
			h.fatalf("StoreLogs %d..%d: %v", logs[0].Index, logs[b-1].Index, err)
		}
		h.logs = append(h.logs, logs...)
		h.next += uint64(b)
		n -= b
	}
	h.check("append")
}

// deleteRange applies raft's DeleteRange to the WAL and the model. Only a
// prefix or a suffix (what raft asks for) is supported.
func (h *review47WAL) deleteRange(lo, hi uint64) {
	h.t.Helper()
	h.ops = append(h.ops, fmt.Sprintf("DeleteRange(%d, %d)", lo, hi))
	if err := h.w.DeleteRange(lo, hi); err != nil {
		h.fatalf("DeleteRange(%d, %d) of [%d, %d]: %v", lo, hi, h.first(), h.last(), err)
	}
	h.gen++
	first, last := h.first(), h.last()
	switch {
	case len(h.logs) == 0 || hi < first || lo > last:
	case lo <= first: // prefix (possibly the whole log)
		if hi >= last {
			h.logs = nil // next stays: raft continues after the old last
		} else {
			h.logs = h.logs[hi+1-first:]
		}
	case hi >= last: // suffix
		h.logs = h.logs[:lo-first]
		h.next = lo
	default:
		h.fatalf("the test asked for a middle range")
	}
	h.check("DeleteRange")
}

// check reads every entry from FirstIndex to LastIndex and compares it with
// the model.
func (h *review47WAL) check(after string) {
	h.t.Helper()
	first, err := h.w.FirstIndex()
	if err != nil {
		h.fatalf("after %s: FirstIndex: %v", after, err)
	}
	last, err := h.w.LastIndex()
	if err != nil {
		h.fatalf("after %s: LastIndex: %v", after, err)
	}
	if first != h.first() || last != h.last() {
		h.fatalf("after %s: the WAL holds [%d, %d], the model [%d, %d]", after, first, last, h.first(), h.last())
	}
	for _, want := range h.logs {
		var got raft.Log
		if err := h.w.GetLog(want.Index, &got); err != nil {
			h.fatalf("after %s: GetLog(%d) of [%d, %d]: %v", after, want.Index, first, last, err)
		}
		if got.Index != want.Index || got.Term != want.Term || got.Type != want.Type || string(got.Data) != string(want.Data) {
			h.fatalf("after %s: GetLog(%d) = index %d term %d %.20q, want term %d %.20q",
				after, want.Index, got.Index, got.Term, got.Data, want.Term, want.Data)
		}
	}
	// Past the last index nothing may be found: a truncated suffix's entries
	// conflict with the leader's. (Below the first index raft-wal v0.4.2
	// still returns the compacted entries of the unsealed tail segment until
	// a reopen or a rotation; those are committed entries, unchanged, so it
	// is not checked.)
	if len(h.logs) > 0 {
		var got raft.Log
		if err := h.w.GetLog(last+1, &got); err == nil {
			h.fatalf("after %s: GetLog(%d) past the last index found %.20q", after, last+1, got.Data)
		}
	}
}

// boundaries: the base indexes of the segment files in (first, last], i.e.
// the first index of every segment but the first. Call it before any
// truncation in the directory (deleted segments' files may linger).
func (h *review47WAL) boundaries() []uint64 {
	h.t.Helper()
	ents, err := os.ReadDir(h.dir)
	if err != nil {
		h.t.Fatal(err)
	}
	var bs []uint64
	for _, e := range ents {
		name := e.Name()
		if !strings.HasSuffix(name, ".wal") || len(name) < 20 {
			continue
		}
		b, err := strconv.ParseUint(name[:20], 10, 64)
		if err != nil {
			h.t.Fatalf("segment file %q: %v", name, err)
		}
		if b > h.first() && b <= h.last() {
			bs = append(bs, b)
		}
	}
	sort.Slice(bs, func(i, j int) bool { return bs[i] < bs[j] })
	if len(bs) < 3 {
		h.t.Fatalf("only %d segment boundaries in [%d, %d]: the segments are not rotating", len(bs), h.first(), h.last())
	}
	return bs
}

// TestReview47WALTruncateReopen: every truncation raft does (a follower
// dropping a conflicting suffix, snapshot compaction dropping a prefix)
// leaves a log that reopens whole. raft-wal v0.4.0 left a log whose suffix
// was truncated inside a sealed segment unreadable after a reopen
// (hashicorp/raft-wal#31); this drives v0.4.2 directly, with segments of
// 4 KiB so that truncations cross and land on segment boundaries.
func TestReview47WALTruncateReopen(t *testing.T) {
	seed := sim.RandomSeed(t, "the entry sizes and, in the randomized part, the operations")

	t.Run("SuffixFromSealedSegment", func(t *testing.T) {
		h := newReview47WAL(t, rand.New(rand.NewSource(seed)))
		h.appendN(200, 5)
		bs := h.boundaries()
		h.deleteRange(bs[1]+3, h.last()) // starts inside a sealed segment
		h.reopen()
		h.appendN(60, 7)
		h.reopen()
		h.deleteRange(bs[0]+1, h.last()+10) // max past the last, as raft may ask
		h.appendN(5, 5)
		h.reopen()
		h.appendN(100, 3)
		h.reopen()
	})

	t.Run("SuffixAtSegmentBoundary", func(t *testing.T) {
		for _, off := range []int{-1, 0, 1} {
			h := newReview47WAL(t, rand.New(rand.NewSource(seed)))
			h.appendN(220, 4)
			bs := h.boundaries()
			// Remove the whole last segment (the tail), then from a boundary
			// further back: the segment before is left exactly full.
			h.deleteRange(uint64(int(bs[len(bs)-1])+off), h.last())
			h.reopen()
			h.deleteRange(uint64(int(bs[1])+off), h.last())
			h.reopen()
			h.appendN(50, 50) // one batch bigger than a segment
			h.reopen()
			h.deleteRange(uint64(int(bs[0])+off), h.last())
			h.appendN(1, 1)
			h.reopen()
		}
	})

	t.Run("WholeLog", func(t *testing.T) {
		h := newReview47WAL(t, rand.New(rand.NewSource(seed)))
		h.appendN(150, 6)
		h.deleteRange(h.first()+1, h.last()) // leave one entry
		h.reopen()
		h.appendN(80, 8)
		h.deleteRange(h.first(), h.last()) // nothing left
		h.reopen()
		h.appendN(80, 8) // continues after the old last index
		h.reopen()
		h.deleteRange(h.first(), h.last())
		h.next += 1000 // a snapshot install: the log restarts further on
		h.appendN(80, 8)
		h.reopen()
		h.deleteRange(h.first(), h.last())
		h.reopen()
		h.appendN(3, 3)
		h.reopen()
	})

	t.Run("PrefixThenSuffix", func(t *testing.T) {
		h := newReview47WAL(t, rand.New(rand.NewSource(seed)))
		h.appendN(300, 5)
		bs := h.boundaries()
		h.deleteRange(h.first(), bs[2]+5) // compaction into a segment
		h.reopen()
		// A suffix inside the head segment, whose MinIndex > BaseIndex.
		h.deleteRange(bs[2]+9, h.last())
		h.reopen()
		h.appendN(90, 9)
		h.deleteRange(h.first(), h.last()-40) // compaction again
		h.reopen()
		h.deleteRange(h.first()+1, h.last()) // one entry left
		h.deleteRange(h.first(), h.first())  // then none
		h.reopen()
		h.appendN(40, 4)
		h.reopen()
	})

	t.Run("Randomized", func(t *testing.T) {
		rng := rand.New(rand.NewSource(seed))
		h := newReview47WAL(t, rng)
		for op := 0; op < 300; op++ {
			first, last := h.first(), h.last()
			switch r := rng.Intn(100); {
			case r < 45 || len(h.logs) == 0:
				h.appendN(1+rng.Intn(40), 1+rng.Intn(12))
			case r < 65: // a follower drops a conflicting suffix
				lo := first + uint64(rng.Int63n(int64(last-first+1)))
				if rng.Intn(4) == 0 {
					lo = last - uint64(rng.Int63n(int64(min(last-first+1, 3)))) // the last few
				}
				hi := last
				if rng.Intn(4) == 0 {
					hi += uint64(rng.Intn(20))
				}
				h.deleteRange(lo, hi)
				if len(h.logs) == 0 && rng.Intn(2) == 0 {
					h.next = lo // a new leader's entries from lo on
				}
			case r < 80: // snapshot compaction
				hi := first + uint64(rng.Int63n(int64(last-first+1)))
				if len(h.logs) > 150 {
					hi = last - uint64(rng.Intn(60))
				}
				lo := first
				if k := uint64(rng.Intn(5)); rng.Intn(4) == 0 && first > k {
					lo = first - k // below the first index, as raft may ask
				}
				h.deleteRange(lo, hi)
				if len(h.logs) == 0 && rng.Intn(2) == 0 {
					h.next += uint64(rng.Intn(500)) // a snapshot install
				}
			default:
				h.reopen()
			}
		}
		h.reopen()
		t.Logf("%d operations; the log ended at [%d, %d]", len(h.ops), h.first(), h.last())
	})
}

// TestReview47WALReopenAfterSegmentFills: an append that fills a segment
// seals its file and queues the rotation to a new tail segment on a
// goroutine; a Close right after it wins the race (runRotate sees the WAL
// closed and gives up), and so does a crash before the rotation commits.
// raft-wal v0.4.2's Open then recovered the sealed file as the tail writer
// and every append failed with "segment is sealed", after every reopen: the
// replica read its log (checkLog passes) but could never append again.
// The Close wins almost every time (the first race in about 95 runs of
// 100); eight chances made a pass very rare. Grove's copy of raft-wal
// (third_party/raft-wal/PATCHES.md) completes the rotation at open; this
// failed 400 of 400 runs on v0.4.2 as released (outside review 47).
func TestReview47WALReopenAfterSegmentFills(t *testing.T) {
	dir := t.TempDir()
	for idx := uint64(1); idx <= 150; idx++ { // about eight 4 KiB segments: eight races
		mdb := &metadb.BoltMetaDB{}
		w, err := wal.Open(dir, wal.WithSegmentSize(review47SegmentSize),
			wal.WithLogger(hclog.NewNullLogger()), wal.WithMetaStore(mdb))
		if err != nil {
			t.Fatalf("open before append %d: %v", idx, err)
		}
		err = w.StoreLogs([]*raft.Log{{Index: idx, Term: 1, Type: raft.LogCommand, Data: make([]byte, 200)}})
		if err == nil {
			var got raft.Log
			err = w.GetLog(idx, &got)
		}
		w.Close() // straight after the append, as a replica's Stop may
		mdb.Close()
		if err != nil {
			t.Fatalf("append %d, each after a reopen: %v", idx, err)
		}
	}
}
