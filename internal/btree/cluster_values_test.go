package btree_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/btree"
)

// Values in chunks of their own, across servers and a crash: two servers
// overwrite each other's large values (64 KiB and 1 MiB, beside small
// ones, in 8 KiB nodes), each reads the other's at once; then server 1
// dies with leaves naming new value chunks only in its cache and log;
// server 2 replays its log and reads every value; the walk of the chunks
// reads every value chunk (length, checksum, identity) and finds the keys
// and values acknowledged.
func TestServersShareLargeValues(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	tc := startCluster(t, ctx)
	s1, s2 := tc.server(t, ctx, 0), tc.server(t, ctx, 1)
	if _, err := s1.CreateTree(ctx, "large", btree.Config{}); err != nil {
		t.Fatal(err)
	}
	t1, err := s1.Open(ctx, "large")
	if err != nil {
		t.Fatal(err)
	}
	t2, err := s2.Open(ctx, "large")
	if err != nil {
		t.Fatal(err)
	}
	sizes := []int{100, 3 << 10, 64 << 10}
	value := func(i, round, size int) []byte {
		return bytes.Repeat([]byte(fmt.Sprintf("%04d.%d|", i, round)), size/7+1)[:size]
	}
	want := map[string]string{}
	put := func(tr *btree.Tree, k string, v []byte) {
		t.Helper()
		if _, err := tr.Put(ctx, []byte(k), v, btree.Cond{}); err != nil {
			t.Fatalf("put %s (%d bytes): %v", k, len(v), err)
		}
		want[k] = string(v)
	}
	check := func(who string, tr *btree.Tree) {
		t.Helper()
		for k, v := range want {
			got, ok, err := tr.Get(ctx, []byte(k))
			if err != nil || !ok || string(got) != v {
				t.Fatalf("%s: get %s = %d bytes %v %v, want %d bytes", who, k, len(got), ok, err, len(v))
			}
		}
	}
	// Round 0 on server 1, round 1 (overwrites, other sizes) on server 2.
	for round, tr := range []*btree.Tree{t1, t2} {
		for i := 0; i < 30; i++ {
			put(tr, fmt.Sprintf("k%03d", i), value(i, round, sizes[(i+round)%3]))
		}
		check(fmt.Sprintf("round %d, the other server", round), []*btree.Tree{t2, t1}[round])
	}
	put(t1, "huge", value(0, 0, btree.MaxValue))
	// A compare-and-swap over a value in a chunk compares the whole value.
	if r, err := t2.Put(ctx, []byte("huge"), []byte("small"), btree.Cond{Kind: btree.IfEquals, Value: value(0, 0, btree.MaxValue-1)}); err != nil || r.Applied {
		t.Fatalf("a CAS against a shorter value applied: %+v %v", r, err)
	}
	if r, err := t2.Put(ctx, []byte("huge"), value(1, 1, btree.MaxValue), btree.Cond{Kind: btree.IfEquals, Value: value(0, 0, btree.MaxValue), Prev: true}); err != nil || !r.Applied || !bytes.Equal(r.Prev, value(0, 0, btree.MaxValue)) {
		t.Fatalf("a CAS against the value: applied %v, prev %d bytes, %v", r.Applied, len(r.Prev), err)
	}
	want["huge"] = string(value(1, 1, btree.MaxValue))
	// A scan pages by bytes: 4 MiB at most, one entry at least.
	n := 0
	for sp := (btree.Span{}); ; {
		pg, err := t1.Scan(ctx, sp, 0, false)
		if err != nil {
			t.Fatal(err)
		}
		for i, k := range pg.Keys {
			if string(pg.Vals[i]) != want[string(k)] {
				t.Fatalf("scan: %s has %d bytes, want %d", k, len(pg.Vals[i]), len(want[string(k)]))
			}
			n++
		}
		if !pg.More {
			break
		}
		sp.From = pg.Hi
	}
	if n != len(want) {
		t.Fatalf("the scan read %d keys, want %d", n, len(want))
	}
	// Server 1 changes more, then dies with them in its cache and log.
	for i := 0; i < 30; i += 3 {
		put(t1, fmt.Sprintf("k%03d", i), value(i, 2, sizes[(i+2)%3]))
	}
	if r, err := t1.Delete(ctx, []byte("k001"), btree.Cond{}); err != nil || !r.Applied {
		t.Fatalf("delete: %+v %v", r, err)
	}
	delete(want, "k001")
	if s1.Cache().Dirty() == 0 {
		t.Fatal("nothing is dirty: the test would prove nothing")
	}
	st := s1.Cache().Stats()
	t.Logf("server 1: %d value chunks written, %d read; tree: %d freed", st.ValueWrites, st.ValueReads, t1.Stats.ValuesFreed.Load())
	tc.c.Crash(0)
	t2b, err := s2.Open(ctx, "large")
	if err != nil {
		t.Fatal(err)
	}
	check("server 2 after server 1's recovery", t2b)
	tc.closeServer(1)
	sh := walkChunks(t, ctx, tc, "large", want)
	if sh.Values == 0 {
		t.Fatal("the walk found no value in a chunk of its own")
	}
	t.Logf("tree: height %d, %d nodes, %d keys, %d values in chunks of their own", sh.Height, sh.Nodes, len(sh.Keys), sh.Values)
}
