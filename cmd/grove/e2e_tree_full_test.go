package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/client"
	"github.com/grovestore/grove/internal/bench"
	"github.com/grovestore/grove/internal/btree"
)

// TestEndToEndTreeFull: a tree on a cluster whose chunk store is tiny
// (three pairs of 1 MiB) is loaded until a put needs a node the store has
// no room for. That put fails with client.ErrNoSpace (the CLI: exit 1 and
// a message naming the full chunk store), nothing is lost or half-done:
// every acknowledged key reads back, the count matches, deletes and
// updates in place still work. Growing the store (grove chunk grow) lets
// puts go on.
func TestEndToEndTreeFull(t *testing.T) {
	t.Parallel() // its own ports and directories: see parallelTests
	bin, u, ctx := startCluster(t, 9400, "--chunk-size", "1MiB")
	keepLogsOnFailure(t, u, "grove-e2e-tree-full")
	c, err := client.Dial(ctx, u.Nodes[1].GRPC, u.Nodes[2].GRPC, u.Nodes[3].GRPC)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for start := time.Now(); ; time.Sleep(500 * time.Millisecond) {
		err := c.CreateTree(ctx, "full", client.TreeOptions{})
		if err == nil || errors.Is(err, client.ErrExists) {
			break
		}
		if time.Since(start) > 90*time.Second {
			t.Fatalf("create: %v", err)
		}
	}
	unreadableEntry(t, ctx, u, bin, c)
	tr := c.Tree("full")
	val := func(i int) []byte { return []byte(fmt.Sprintf("%06d-%s", i, strings.Repeat("v", 1000))) }
	key := func(i int) []byte { return []byte(fmt.Sprintf("key-%06d", i)) }
	acked := 0
	var full error
	for i := 0; i < 20000 && full == nil; i++ {
		err := tr.Put(ctx, key(i), val(i))
		switch {
		case err == nil:
			acked++
		case errors.Is(err, client.ErrNoSpace) && !errors.Is(err, client.ErrUnknownOutcome):
			full = err
		default:
			t.Fatalf("put %d: %v", i, err)
		}
	}
	if full == nil {
		t.Fatalf("%d puts of 1 KiB fit in three 1 MiB chunk pairs", acked)
	}
	t.Logf("%d puts acknowledged, then: %v", acked, full)

	// The CLI says so too (exit 1, the reason on stderr): keys that land in
	// a full leaf need a split.
	ep := "--endpoints=" + u.Nodes[2].GRPC
	refused := false
	for i := acked; i < acked+200 && !refused; i++ {
		r := grove(t, bin, nil, "tree", "put", "full", string(key(i)), string(val(i)), ep)
		switch {
		case r.code == 0:
			acked++ // it fitted in its leaf
		case r.code == 1 && strings.Contains(r.stderr, "chunk store is full"):
			refused = true
			t.Logf("the CLI: exit %d: %s", r.code, strings.TrimSpace(r.stderr))
		default:
			t.Fatalf("tree put: %v", r)
		}
		if r.code == 0 && i != acked-1 {
			t.Fatalf("put %d skipped", i)
		}
	}
	if !refused {
		t.Fatal("200 more puts through the CLI all fitted")
	}

	// Nothing lost, nothing half-done.
	check := func(n int) {
		t.Helper()
		got, err := tr.Count(ctx, client.Range{})
		if err != nil || got != uint64(n) {
			t.Fatalf("count: %d, %v; want %d", got, err, n)
		}
		for i := 0; i < n; i += 37 {
			v, err := tr.Get(ctx, key(i))
			if err != nil || string(v) != string(val(i)) {
				t.Fatalf("get %s: %.20q, %v", key(i), v, err)
			}
		}
	}
	check(acked)
	// Updates in place and deletes need no new node.
	if err := tr.Put(ctx, key(0), val(0)); err != nil {
		t.Fatalf("overwriting a key in a full store: %v", err)
	}
	if found, err := tr.Delete(ctx, key(acked-1)); err != nil || !found {
		t.Fatalf("delete in a full store: %v %v", found, err)
	}
	acked--
	check(acked)

	// More room: the puts go on.
	for cm := 1; cm <= 3; cm++ {
		if r := grove(t, bin, nil, "chunk", "grow", fmt.Sprint(cm), "--size", "4MiB", ep); r.code != 0 {
			t.Fatalf("chunk grow %d: %v", cm, r)
		}
	}
	for i := acked; i < acked+100; i++ {
		var err error
		for start := time.Now(); ; time.Sleep(200 * time.Millisecond) {
			if err = tr.Put(ctx, key(i), val(i)); err == nil || !errors.Is(err, client.ErrNoSpace) || time.Since(start) > 30*time.Second {
				break
			}
		}
		if err != nil {
			t.Fatalf("put %d after growing the store: %v", i, err)
		}
	}
	check(acked + 100)
}

// unreadableEntry: a tree directory entry this build cannot decode (a
// newer build's, or damaged) does not hide the other trees. `grove tree
// list` prints them and fails (exit 1) naming the entry; the Go client
// returns them with an *UnreadableTreesError. The entry is then removed.
func unreadableEntry(t *testing.T, ctx context.Context, u *bench.UpCluster, bin string, c *client.Client) {
	mc := upMeta(t, ctx, u)
	const key = "tree/zz-unreadable"
	set := func(op *pb.Op) {
		t.Helper()
		if _, err := mc.Update(ctx, btree.Namespace, "test", func(*pb.Namespace) ([]*pb.Op, error) { return []*pb.Op{op}, nil }); err != nil {
			t.Fatal(err)
		}
	}
	set(&pb.Op{Kind: pb.Op_KIND_PUT, Key: key, Value: []byte{0xff, 1, 2}})
	r := grove(t, bin, nil, "tree", "list", "--endpoints="+u.Nodes[3].GRPC)
	if r.code != 1 || !strings.Contains(r.stdout, "full") || !strings.Contains(r.stderr, key) {
		t.Fatalf("tree list beside an unreadable entry: %v", r)
	}
	ts, err := c.Trees(ctx)
	var ue *client.UnreadableTreesError
	if !errors.As(err, &ue) || len(ue.Entries) != 1 || len(ts) != 1 || ts[0].Name != "full" {
		t.Fatalf("Trees beside an unreadable entry: %+v, %v", ts, err)
	}
	set(&pb.Op{Kind: pb.Op_KIND_DELETE, Key: key})
	if r := grove(t, bin, nil, "tree", "list", "--endpoints="+u.Nodes[3].GRPC); r.code != 0 || !strings.Contains(r.stdout, "full") {
		t.Fatalf("tree list once the entry is gone: %v", r)
	}
}
