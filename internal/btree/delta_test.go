package btree

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/lock"
	"github.com/grovestore/grove/internal/txn"
)

// deltaLeaf is a leaf of n keys with values of vlen bytes, version v.
func deltaLeaf(r *rand.Rand, n, vlen int, v uint64) *Node {
	l := &Node{Self: Handle{CM: 1, ID: 9}, Tree: 4, Version: v, HighInf: true}
	for i := 0; i < n; i++ {
		val := make([]byte, vlen)
		r.Read(val)
		l.Keys, l.Vals = append(l.Keys, []byte(fmt.Sprintf("key%05d", i*10))), append(l.Vals, val)
	}
	return l
}

// A delta from one image of a leaf to the next (an entry inserted,
// replaced or removed anywhere, the first and last included) rebuilds the
// next image exactly, is far smaller than it, and refuses every image
// but its base: another version, or the same version with other bytes.
func TestDeltaRoundTrip(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	for trial := 0; trial < 300; trial++ {
		base := deltaLeaf(r, 1+r.Intn(28), 256, uint64(1+r.Intn(100)))
		next := base.Clone()
		next.Version = base.Version + 1
		next.LSN = base.LSN + 77
		i := r.Intn(len(base.Keys))
		switch r.Intn(3) {
		case 0:
			val := make([]byte, 256)
			r.Read(val)
			next.insertEntry(i, []byte(fmt.Sprintf("key%05d", i*10-5)), val, false)
		case 1:
			val := make([]byte, 1+r.Intn(300))
			r.Read(val)
			next.Vals[i] = val
		case 2:
			next.removeEntry(i)
		}
		b, n := base.Encode(nil), next.Encode(nil)
		d, ok := makeDelta(b, n)
		if !ok {
			if len(base.Keys) > 2 {
				t.Fatalf("trial %d: no delta of a one-entry change to a %d-entry leaf", trial, len(base.Keys))
			}
			continue // (a leaf of one or two entries: the whole image is as small)
		}
		if len(base.Keys) > 8 && len(d)*2 > len(n) {
			t.Errorf("trial %d: a delta of %d bytes for a %d-byte image", trial, len(d), len(n))
		}
		got, err := applyDelta(b, d, true)
		if err != nil || !bytes.Equal(got, n) {
			t.Fatalf("trial %d: the delta rebuilt %d bytes (err %v), want the %d-byte image", trial, len(got), err, len(n))
		}
		if bv, nv, ok := deltaVersions(d); !ok || bv != base.Version || nv != next.Version {
			t.Fatalf("trial %d: versions %d→%d, want %d→%d", trial, bv, nv, base.Version, next.Version)
		}
		// Not its base: the next image, an image of another version,
		// and one of the same version with one value changed.
		other := base.Clone()
		other.Vals[len(other.Vals)-1] = []byte("changed")
		for _, wrong := range [][]byte{n, other.Encode(nil)} {
			for _, exact := range []bool{true, false} {
				if _, err := applyDelta(wrong, d, exact); !errors.Is(err, ErrCorrupt) {
					t.Fatalf("trial %d: a delta applied to another image (exact %v): %v", trial, exact, err)
				}
			}
		}
		// The base as its write-back wrote it to the chunk (another LSN,
		// the pin's token): not the exact base, but the same body.
		wb := *base
		wb.LSN, wb.Token = base.LSN+100, lock.Token{Epoch: 3, Seq: 9}
		if _, err := applyDelta(wb.Encode(nil), d, true); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("trial %d: an exact delta applied to a base with another header: %v", trial, err)
		}
		if got, err := applyDelta(wb.Encode(nil), d, false); err != nil || !bytes.Equal(got, n) {
			t.Fatalf("trial %d: the delta over the written-back base rebuilt %d bytes (err %v)", trial, len(got), err)
		}
	}
}

// FuzzNodeDelta: applyDelta on any bytes, as a delta of a real image or
// as a base, errs or returns an image that decodes; never panics.
func FuzzNodeDelta(f *testing.F) {
	r := rand.New(rand.NewSource(2))
	base := deltaLeaf(r, 12, 40, 3)
	next := base.Clone()
	next.Version = 4
	next.Vals[5] = []byte("fuzz")
	b, n := base.Encode(nil), next.Encode(nil)
	d, _ := makeDelta(b, n)
	f.Add(d, false)
	f.Add(d[:len(d)-3], false)
	f.Add(b, true)
	// A two-part delta (GBD2) of a leaf with completion records, as data.
	base2 := base.Clone()
	base2.addDone(Completion{Key: base2.Keys[2], Seq: 1, Stamp: 5})
	next2 := base2.Clone()
	next2.Version = 4
	next2.Vals[5] = []byte("fuzz")
	next2.addDone(Completion{Key: next2.Keys[5], Seq: 2, Stamp: 6, Applied: true})
	if d2, ok := makeDelta(base2.Encode(nil), next2.Encode(nil)); ok {
		f.Add(d2, false)
	}
	f.Fuzz(func(t *testing.T, data []byte, asBase bool) {
		var out []byte
		var err error
		if asBase {
			out, err = applyDelta(data, d, len(data)%2 == 0)
		} else {
			out, err = applyDelta(b, data, true)
		}
		if err == nil {
			if _, derr := decode(out); derr != nil {
				t.Fatalf("applyDelta returned an image that does not decode: %v", derr)
			}
		}
	})
}

// The write-back/commit race of delta.go: a checkpoint that runs while a
// put's delta is logged but not committed writes the leaf's previous
// image back and moves the log's head past the leaf's whole image (the
// put's transaction is the oldest open one), so the log holds the
// delta and the chunk its base. The commit then logs the new image whole
// as well (RaceImages); else a later write-back of the leaf that a crash
// tears leaves a delta with no base anywhere, and the put is lost. Teeth:
// unsafeNoRaceImage, which the replay fails on (errBaseless).
func TestRacedDeltaLogsWholeImage(t *testing.T) {
	for _, unsafe := range []bool{false, true} {
		t.Run(fmt.Sprintf("unsafe=%v", unsafe), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			st := newSoloTree(t, ctx, 3, 64, func(c *Cache) { c.unsafeNoRaceImage = unsafe })
			store, dev, cache, wal, ah, root, tr := st.store, st.dev, st.cache, st.wal, st.anchor, st.root, st.tree
			put := func(k string) {
				t.Helper()
				if _, err := tr.Put(ctx, []byte(k), []byte("value-of-"+k), Cond{}); err != nil {
					t.Fatal(err)
				}
			}
			for i := 0; i < 6; i++ {
				put(fmt.Sprintf("k%d", i)) // a whole image of the root leaf, then deltas
			}
			if cache.Stats().Deltas == 0 {
				t.Fatal("no put was logged as a delta")
			}
			var ckErr error
			cache.testBeforeCommit = func() {
				cache.testBeforeCommit = nil
				ckErr = wal.Checkpoint(ctx)
			}
			put("k6")
			if ckErr != nil {
				t.Fatal(ckErr)
			}
			if want := map[bool]uint64{false: 1, true: 0}[unsafe]; cache.Stats().RaceImages != want {
				t.Fatalf("%d whole images logged after a raced delta, want %d", cache.Stats().RaceImages, want)
			}
			if err := wal.FlushNow(ctx); err != nil {
				t.Fatal(err)
			}
			// The leaf's next write-back is cut off by a crash: the chunk
			// holds part of k6's image over part of its base.
			store.mu.Lock()
			b := store.data[root]
			for i := 12; i < len(b)/2; i++ {
				b[i] ^= 0x5a
			}
			store.mu.Unlock()
			held := deadServerHolds(store, ah)
			run := lock.Recovery{Dead: lock.ClerkID{Node: 1, Inc: 1, Seq: 2}, Names: held, Token: lock.Token{Epoch: 2, Seq: 12}}
			_, err := replayDead(ctx, dev, run, store.clerk(2, func(context.Context) error { return nil }), nil, replayUnsafe{}, nil, simLog, nil)
			if unsafe {
				if !errors.Is(err, errBaseless) {
					t.Fatalf("without the whole image the replay gave %v, want errBaseless", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			sh, err := Walk(ctx, simChunkReader{&simWorld{chunks: store, anchor: ah}}, false)
			if err != nil {
				t.Fatal(err)
			}
			if len(sh.Keys) != 7 {
				t.Fatalf("after the replay the tree holds %d keys, want 7", len(sh.Keys))
			}
		})
	}
}

// replayChains makes one record per node: the newest image rebuilt from
// the node's whole images and deltas; a delta whose base the log does not
// hold (its whole image passed by the head) is dropped when an image at
// least as new follows, and otherwise is the node's only record (Apply
// checks it against the chunk), never beside an image of the same chunk
// (the parallel apply would write the chunk twice at once).
func TestReplayChains(t *testing.T) {
	r := rand.New(rand.NewSource(5))
	images := map[uint64][]byte{}
	leaf := deltaLeaf(r, 20, 64, 5)
	images[5] = leaf.Encode(nil)
	for v := uint64(6); v <= 9; v++ {
		leaf = leaf.Clone()
		leaf.Version = v
		leaf.Vals[int(v)%20] = []byte(fmt.Sprintf("value %d", v))
		images[v] = leaf.Encode(nil)
	}
	target := txn.ChunkTarget(leaf.Self)
	whole := func(v uint64) txn.Record {
		return txn.Record{Kind: txn.KindUpdate, Target: target, Redo: images[v]}
	}
	delta := func(v uint64) txn.Record {
		d, ok := makeDelta(images[v-1], images[v])
		if !ok {
			t.Fatalf("no delta %d→%d", v-1, v)
		}
		return txn.Record{Kind: txn.KindUpdate, Target: target, Off: deltaOff, Redo: d}
	}
	for _, c := range []struct {
		name     string
		recs     []txn.Record
		want     uint64 // the whole image's version, or
		orphanTo uint64 // the orphan's new version
	}{
		{"whole then deltas", []txn.Record{whole(5), delta(6), delta(7)}, 7, 0},
		{"a raced delta and its whole image", []txn.Record{whole(5), delta(6), delta(7), whole(7), delta(8)}, 8, 0},
		{"leading orphans superseded", []txn.Record{delta(6), delta(7), whole(7), delta(8)}, 8, 0},
		{"orphans only", []txn.Record{delta(6), delta(7)}, 0, 7},
		{"a gap", []txn.Record{whole(5), delta(6), delta(8), delta(9)}, 0, 9},
	} {
		out := replayChains(c.recs)
		if len(out) != 1 {
			t.Fatalf("%s: %d records, want 1", c.name, len(out))
		}
		switch o := out[0]; {
		case c.want != 0:
			if o.Off != 0 || !bytes.Equal(o.Redo, images[c.want]) {
				v, _ := imageVersion(o.Redo)
				t.Fatalf("%s: a record at %d of version %d, want the whole image %d", c.name, o.Off, v, c.want)
			}
		default:
			if _, next, ok := deltaVersions(o.Redo); o.Off != deltaOff || !ok || next != c.orphanTo {
				t.Fatalf("%s: a record at %d (to %d), want the orphan delta to %d", c.name, o.Off, next, c.orphanTo)
			}
		}
	}
}
