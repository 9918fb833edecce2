package btree

import (
	"context"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/lock"
)

// Review (an outside review, 2026-11-26; failed before the fix): insertSeparator's ordinary path (repair false) does not check
// that the child is still live and still starts at sep. Repair may put the
// same downlink back first (it sees the split's right node without one)
// and compression may then merge that node away; when the splitter's own,
// late insertSeparator finally gets the parent's lock it puts a downlink
// to the removed node back. Once the node's grace ends and a Repair pass
// frees its chunk, every descent through that downlink meets ErrGone and
// restarts from the root, forever: the keys it covers are unreachable.
//
// The interleaving is the algorithm's own steps, run in the order two
// servers (the splitter, slow to lock the parent; another running Repair
// and a compression) could run them.
func TestReviewLateSeparatorRevivesRemovedNode(t *testing.T) {
	ctx := context.Background()
	tr, s, clk := newMemTree(t, Config{MaxFanout: 4, Grace: time.Second})
	put := func(k string) {
		if _, err := tr.Put(ctx, []byte(k), []byte("v"+k), Cond{}); err != nil {
			t.Fatal(err)
		}
	}
	del := func(k string) {
		if r, err := tr.Delete(ctx, []byte(k), Cond{}); err != nil || !r.Applied {
			t.Fatalf("delete %s: %+v %v", k, r, err)
		}
	}
	for _, k := range []string{"k10", "k20", "k30", "k40", "k50", "k60", "k70"} {
		put(k)
	}
	// Server A: put k80, which splits the last leaf; A is slow to take the
	// parent's lock, so its separator is not in yet.
	key := []byte("k80")
	leaf, path, err := tr.locate(ctx, target{key: key}, 0)
	if err != nil {
		t.Fatal(err)
	}
	n, err := tr.lockCovering(ctx, leaf.Self, target{key: key}, lock.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	nn := n.Clone()
	i, _ := nn.Search(key)
	nn.Keys, nn.Vals = insertAt(nn.Keys, i, key), insertAt(nn.Vals, i, []byte("vk80"))
	if tr.fits(nn) {
		t.Fatalf("setup: leaf %v does not overflow", nn.Keys)
	}
	sep, right, _, err := tr.split(ctx, nn, nil, trims{}, nil)
	s.Unlock(n.Self, lock.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("A split %v: right node %v from %q; its separator is in flight", n.Self, right, sep)

	// Server B: a Repair pass puts the missing downlink back...
	rep, err := tr.Repair(ctx)
	if err != nil || rep.Downlinks != 1 {
		t.Fatalf("setup: repair %+v %v", rep, err)
	}
	// ...deletes leave the pair under-full, and compression merges the
	// right node into its left neighbour (it is now removed, pointing on).
	for _, k := range []string{"k60", "k80"} {
		del(k)
	}
	r, _ := s.Read(ctx, right)
	left, _ := s.Read(ctx, n.Self)
	changed, err := tr.Compress(ctx, 0, left.Keys[0])
	if err != nil || !changed {
		t.Fatalf("setup: compress %v %v (left %q right %q)", changed, err, left.Keys, r.Keys)
	}
	if r, _ := s.Read(ctx, right); !r.Deleted {
		t.Fatalf("setup: %v not merged away", right)
	}
	if _, err := Walk(ctx, s, true); err != nil {
		t.Fatalf("setup: the tree is not whole before A's late insert: %v", err)
	}

	// Server A's insertSeparator finally runs.
	if err := tr.insertSeparator(ctx, 1, sep, right, path, false); err != nil {
		t.Fatalf("late insert: %v", err)
	}
	if _, err := Walk(ctx, s, true); err != nil {
		t.Logf("DEFECT (structure): after A's late separator insert: %v", err)
	}
	// Grace passes; a Repair pass frees the removed node's chunk.
	clk.ns.Add(int64(2 * time.Second))
	if rep, err := tr.Repair(ctx); err != nil {
		t.Fatalf("repair: %v", err)
	} else {
		t.Logf("repair after grace: %+v", rep)
	}
	if rep, err := tr.Repair(ctx); err != nil {
		t.Fatalf("repair: %v", err)
	} else {
		t.Logf("second repair: %+v", rep)
	}
	v, found, err := tr.Get(ctx, []byte("k70"))
	if err != nil || !found {
		t.Fatalf("DEFECT: key k70 (present, never deleted) is unreachable after A's late separator insert revived a removed node: found %v %q, err %v", found, v, err)
	}
}
