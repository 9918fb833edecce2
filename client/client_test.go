package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/grovestore/grove/client"
	"github.com/grovestore/grove/internal/bench"
	"github.com/grovestore/grove/internal/chunk"
	"github.com/grovestore/grove/internal/meta"
)

// cluster starts 3 in-process nodes with a chunk manager pair and returns
// their gRPC addresses.
func cluster(t *testing.T, ctx context.Context) (*bench.InProcessCluster, []string) {
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
	c, err := client.Dial(ctx, eps[0], eps[1])
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.CreateTree(ctx, "f", client.TreeOptions{}); err != nil {
		t.Fatal(err)
	}
	tr := c.Tree("f")
	acked := map[string]bool{}
	unknown := 0
	for i := 0; i < 200; i++ {
		if i == 60 {
			cl.Crash(0) // node 1, the endpoint in use, dies
		}
		cctx, ccancel := context.WithTimeout(ctx, 20*time.Second)
		err := tr.Put(cctx, key(i), []byte("v"))
		ccancel()
		switch {
		case err == nil:
			acked[string(key(i))] = true
		case errors.Is(err, client.ErrUnknownOutcome):
			unknown++
		default:
			t.Fatalf("put %d: %v", i, err)
		}
	}
	t.Logf("%d puts acknowledged, %d with an unknown outcome", len(acked), unknown)
	if len(acked) < 190 {
		t.Fatalf("only %d of 200 puts acknowledged", len(acked))
	}
	for k := range acked {
		if _, err := tr.Get(ctx, []byte(k)); err != nil {
			t.Fatalf("acknowledged %s: %v", k, err)
		}
	}
}
