package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/grovestore/grove/client"
	"github.com/grovestore/grove/internal/bench"
	"github.com/grovestore/grove/internal/btree"
	"github.com/grovestore/grove/internal/chunk"
	"github.com/grovestore/grove/internal/meta"
)

// cluster starts 3 in-process nodes with a chunk manager pair and returns
// their gRPC addresses.
func cluster(t testing.TB, ctx context.Context) (*bench.InProcessCluster, []string) {
	t.Helper()
	c, err := bench.StartCluster(t.TempDir(), 3, bench.ClusterOptions{Store: true, DiskSize: 512 << 20}) // room for three 64 MiB logs beside the chunk pair
	if err != nil {
		t.Fatal(err)
	}
	mc := meta.NewClient(c.Members())
	t.Cleanup(func() { mc.Close(); c.Close() })
	if _, err := c.WaitLockMaster(ctx); err != nil {
		t.Fatal(err)
	}
	for ctx.Err() == nil { // every node registers its disk first
		if _, err = chunk.CreatePair(ctx, mc, [2]uint64{2, 3}, 4<<20, 64<<20); err == nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	var eps []string
	for _, m := range c.Members() {
		eps = append(eps, m.GRPCAddr)
	}
	return c, eps
}

// deadAddr is a loopback address nothing listens on.
func deadAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := l.Addr().String()
	l.Close()
	return a
}

func key(i int) []byte { return []byte(fmt.Sprintf("k%05d", i)) }

// The client's whole surface against a real cluster, through an endpoint
// list whose first entry is dead (a write goes on to the next endpoint:
// nothing was sent).
func TestClient(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, eps := cluster(t, ctx)
	c, err := client.Dial(ctx, append([]string{deadAddr(t)}, eps...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.CreateTree(ctx, "t", client.TreeOptions{Fanout: 6}); err != nil {
		t.Fatal(err)
	}
	if err := c.CreateTree(ctx, "t", client.TreeOptions{}); !errors.Is(err, client.ErrExists) {
		t.Fatalf("a second create: %v", err)
	}
	if ts, err := c.Trees(ctx); err != nil || len(ts) != 1 || ts[0].Name != "t" || ts[0].Fanout != 6 {
		t.Fatalf("trees %+v, %v", ts, err)
	}
	tr := c.Tree("t")
	const n = 300
	for i := 0; i < n; i++ {
		if err := tr.Put(ctx, key(i), []byte(fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	if v, err := tr.Get(ctx, key(7)); err != nil || string(v) != "7" {
		t.Fatalf("get: %q %v", v, err)
	}
	if _, err := tr.Get(ctx, []byte("nope")); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("get of an absent key: %v", err)
	}
	if _, err := c.Tree("no-such").Get(ctx, key(1)); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("get from an unknown tree: %v", err)
	}
	if err := tr.Put(ctx, bytes.Repeat([]byte("k"), 2000), []byte("v")); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("an oversized key: %v", err)
	}
	if err := tr.Put(ctx, []byte("big"), make([]byte, client.MaxValue+1)); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("a value over client.MaxValue: %v", err)
	}
	// A 64 KiB value lives in a chunk of its own (8 KiB nodes).
	big := bytes.Repeat([]byte("0123456789abcdef"), 4<<10)
	if err := tr.Put(ctx, []byte("big"), big); err != nil {
		t.Fatalf("a 64 KiB value: %v", err)
	}
	if v, err := tr.Get(ctx, []byte("big")); err != nil || !bytes.Equal(v, big) {
		t.Fatalf("the 64 KiB value read back: %d bytes, %v", len(v), err)
	}
	if found, err := tr.Delete(ctx, []byte("big")); err != nil || !found {
		t.Fatalf("deleting the 64 KiB value: %v %v", found, err)
	}
	// Conditional forms.
	if ok, err := tr.PutIfAbsent(ctx, key(1), []byte("x")); err != nil || ok {
		t.Fatalf("put-if-absent over a present key: %v %v", ok, err)
	}
	if ok, err := tr.PutIfAbsent(ctx, []byte("new"), []byte("1")); err != nil || !ok {
		t.Fatalf("put-if-absent: %v %v", ok, err)
	}
	if ok, cur, found, err := tr.CompareAndSwap(ctx, []byte("new"), []byte("0"), []byte("2")); err != nil || ok || !found || string(cur) != "1" {
		t.Fatalf("a failing CAS: %v %q %v %v", ok, cur, found, err)
	}
	if ok, _, _, err := tr.CompareAndSwap(ctx, []byte("new"), []byte("1"), []byte("2")); err != nil || !ok {
		t.Fatalf("CAS: %v %v", ok, err)
	}
	if ok, err := tr.CompareAndDelete(ctx, []byte("new"), []byte("1")); err != nil || ok {
		t.Fatalf("a failing compare-and-delete: %v %v", ok, err)
	}
	if ok, err := tr.CompareAndDelete(ctx, []byte("new"), []byte("2")); err != nil || !ok {
		t.Fatalf("compare-and-delete: %v %v", ok, err)
	}
	if found, err := tr.Delete(ctx, key(0)); err != nil || !found {
		t.Fatalf("delete: %v %v", found, err)
	}
	if found, err := tr.Delete(ctx, key(0)); err != nil || found {
		t.Fatalf("a second delete: %v %v", found, err)
	}
	// Scans: every page, forward and reverse, limits, keys only.
	var got []string
	for kv, err := range tr.Scan(ctx, client.Range{}) {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, string(kv.Key)+"="+string(kv.Value))
	}
	if len(got) != n-1 || got[0] != "k00001=1" || got[n-2] != fmt.Sprintf("k%05d=%d", n-1, n-1) {
		t.Fatalf("scan: %d entries, %v .. %v", len(got), got[:2], got[len(got)-2:])
	}
	var rev []string
	for kv, err := range tr.Scan(ctx, client.Range{From: key(10), To: key(250), Reverse: true, KeysOnly: true, Limit: 200}) {
		if err != nil {
			t.Fatal(err)
		}
		if kv.Value != nil {
			t.Fatal("keys-only scan returned a value")
		}
		rev = append(rev, string(kv.Key))
	}
	if len(rev) != 200 || rev[0] != "k00249" || rev[199] != "k00050" {
		t.Fatalf("reverse scan: %d keys, %v .. %v", len(rev), rev[0], rev[len(rev)-1])
	}
	stopped := 0
	for range tr.Scan(ctx, client.Range{}) {
		if stopped++; stopped == 3 {
			break // an iteration the caller ends early
		}
	}
	if cnt, err := tr.Count(ctx, client.Range{From: key(100), To: key(200)}); err != nil || cnt != 100 {
		t.Fatalf("count: %d %v", cnt, err)
	}
	if st, err := tr.Stat(ctx); err != nil || st.Keys != n-1 || st.Height < 2 {
		t.Fatalf("stat: %+v %v", st, err)
	}
	// Another client drops the tree and makes it again: this client's
	// next write carries the dropped tree's anchor (as looked up before
	// its first write), is refused TREE_CHANGED at its first attempt
	// (nothing done), looks the tree up again, and applies under a new
	// token, in the new tree (review 55: a resend to a tree made again
	// under the name would apply afresh without the anchor).
	other, err := client.Dial(ctx, eps...)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := other.DropTree(ctx, "t"); err != nil {
		t.Fatal(err)
	}
	if err := other.CreateTree(ctx, "t", client.TreeOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := tr.Put(ctx, key(1), []byte("new")); err != nil {
		t.Fatalf("a put after the tree was made again: %v", err)
	}
	if st := c.Stats(); st.TreeChanged != 1 {
		t.Fatalf("%d attempts refused for their tree, want 1: the put did not carry the dropped tree's anchor, or was not refused", st.TreeChanged)
	}
	if cnt, err := tr.Count(ctx, client.Range{}); err != nil || cnt != 1 {
		t.Fatalf("the new tree holds %d keys (%v), want the one put", cnt, err)
	}
	if found, err := tr.Delete(ctx, key(1)); err != nil || !found {
		t.Fatal(err)
	}
	if err := c.Tree("no-such").Put(ctx, key(1), []byte("v")); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("a put to an unknown tree: %v", err)
	}
	if err := c.DropTree(ctx, "t"); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Get(ctx, key(1)); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("get from a dropped tree: %v", err)
	}
}

// A node dies under a client's writes: each write either succeeds, or
// fails as "outcome unknown" (never sent twice); later writes go on
// through another endpoint; every acknowledged one is read back.
func TestClientFailover(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cl, eps := cluster(t, ctx)
	// Endpoint failover: every call to the endpoint in use (home routing
	// off; TestClientRoutesToHome covers the home's loss).
	c, err := client.DialOptions(ctx, client.Options{NoRouting: true}, eps[0], eps[1])
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.CreateTree(ctx, "f", client.TreeOptions{}); err != nil {
		t.Fatal(err)
	}
	tr := c.Tree("f")
	acked, unknown := putAll(t, ctx, tr, 0, 200, "v", func(i int) {
		if i == 60 {
			cl.Crash(0) // node 1, the endpoint in use, dies
		}
	})
	t.Logf("%d puts acknowledged, %d with an unknown outcome", len(acked), unknown)
	if len(acked) < 190 {
		t.Fatalf("only %d of 200 puts acknowledged", len(acked))
	}
	for i := range acked {
		if _, err := tr.Get(ctx, key(i)); err != nil {
			t.Fatalf("acknowledged %s: %v", key(i), err)
		}
	}
}

// putAll puts keys from..to-1 one at a time (calling before(i), if set,
// before each): each is acknowledged or of unknown outcome, anything
// else fails the test.
func putAll(t *testing.T, ctx context.Context, tr *client.Tree, from, to int, val string, before func(i int)) (acked map[int]bool, unknown int) {
	t.Helper()
	acked = map[int]bool{}
	for i := from; i < to; i++ {
		if before != nil {
			before(i)
		}
		cctx, ccancel := context.WithTimeout(ctx, 20*time.Second)
		err := tr.Put(cctx, key(i), []byte(val))
		ccancel()
		switch {
		case err == nil:
			acked[i] = true
		case errors.Is(err, client.ErrUnknownOutcome):
			unknown++
		default:
			t.Fatalf("put %d: %v", i, err)
		}
	}
	return acked, unknown
}

// A tree's calls go to the tree's home node, which the client learns from
// the nodes (it is not among the endpoints here), so that clients on
// different endpoints do not pass the tree's node leases back and forth;
// with routing off they are served where they land. When the home dies,
// calls go on through the endpoints.
func TestClientRoutesToHome(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cl, eps := cluster(t, ctx)
	const name = "routed"
	var ids []uint64
	for _, m := range cl.Members() {
		ids = append(ids, m.ID)
	}
	home := -1
	for i, m := range cl.Members() {
		if m.ID == btree.Home(name, ids) {
			home = i
		}
	}
	var others []string
	for i, ep := range eps {
		if i != home {
			others = append(others, ep)
		}
	}
	served := func() (h, o uint64) {
		for i, n := range cl.Nodes {
			if n == nil {
				continue
			}
			if i == home {
				h += n.BTree().Served()
			} else {
				o += n.BTree().Served()
			}
		}
		return h, o
	}
	for _, routing := range []bool{false, true} {
		c, err := client.DialOptions(ctx, client.Options{NoRouting: !routing}, others...)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if !routing {
			if err := c.CreateTree(ctx, name, client.TreeOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		tr := c.Tree(name)
		// The first calls go to an endpoint while the client asks for the
		// nodes and connects to the home.
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			h0, _ := served()
			if _, err := tr.Get(ctx, key(0)); err != nil && !errors.Is(err, client.ErrNotFound) {
				t.Fatal(err)
			}
			if h1, _ := served(); h1 > h0 || !routing {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		h0, o0 := served()
		for i := 0; i < 50; i++ {
			if err := tr.Put(ctx, key(i), []byte("v")); err != nil {
				t.Fatal(err)
			}
			if _, err := tr.Get(ctx, key(i)); err != nil {
				t.Fatal(err)
			}
		}
		h1, o1 := served()
		t.Logf("routing %v: the home (node %d) served %d calls, the other nodes %d", routing, home+1, h1-h0, o1-o0)
		if routing && (h1-h0 != 100 || o1 != o0) || !routing && (h1 != h0 || o1-o0 != 100) {
			t.Fatalf("routing %v: the home served %d of 100 calls, the others %d", routing, h1-h0, o1-o0)
		}
		if !routing {
			continue
		}
		// The home dies: calls go on through the endpoints.
		cl.Crash(home)
		acked, unknown := putAll(t, ctx, tr, 50, 150, "w", nil)
		t.Logf("after the home's crash: %d puts acknowledged, %d of unknown outcome", len(acked), unknown)
		if len(acked) < 95 {
			t.Fatalf("only %d of 100 puts acknowledged after the home's crash", len(acked))
		}
		for i := 0; i < 150; i++ {
			if _, err := tr.Get(ctx, key(i)); err != nil && (i < 50 || acked[i] || !errors.Is(err, client.ErrNotFound)) {
				t.Fatalf("key %d: %v", i, err)
			}
		}
	}
}

// BenchmarkClientRouting: three clients, each dialed to one node of its
// own, put into one shared tree (two goroutines each, disjoint keys), with
// and without home routing. Without it the clients' servers pass the
// tree's leaf leases back and forth (a write-back each time).
func BenchmarkClientRouting(b *testing.B) {
	for _, routing := range []bool{false, true} {
		b.Run(fmt.Sprintf("routing=%v", routing), func(b *testing.B) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			_, eps := cluster(b, ctx)
			var cs []*client.Client
			for _, ep := range eps {
				c, err := client.DialOptions(ctx, client.Options{NoRouting: !routing}, ep)
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				cs = append(cs, c)
			}
			if err := cs[0].CreateTree(ctx, "bench", client.TreeOptions{}); err != nil {
				b.Fatal(err)
			}
			for _, c := range cs { // warm up, and let routing learn the nodes
				for i := 0; i < 20; i++ {
					if err := c.Tree("bench").Put(ctx, []byte(fmt.Sprintf("warm%d", i)), []byte("v")); err != nil {
						b.Fatal(err)
					}
				}
			}
			time.Sleep(1500 * time.Millisecond)
			b.ResetTimer()
			var wg sync.WaitGroup
			workers := 2 * len(cs)
			for w := 0; w < workers; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					tr := cs[w%len(cs)].Tree("bench")
					for i := w; i < b.N; i += workers {
						if err := tr.Put(ctx, []byte(fmt.Sprintf("key%08d", i)), make([]byte, 256)); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "puts/s")
		})
	}
}
