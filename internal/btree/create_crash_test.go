package btree_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/btree"
	"github.com/grovestore/grove/internal/chunk"
	"github.com/grovestore/grove/internal/lock"
)

// TestCreateTreeCrash: a B-tree server dies in the middle of a tree's
// creation, its anchor and first root allocated (tagged with its log's
// owner) and written:
//   - before the directory's decree: the recovery of its log frees both
//     (untagged, as they were before, they leaked for ever);
//   - after the decree, before it disowned them: the recovery disowns them
//     instead (the directory names them), and the tree works;
//   - the same, node 1 stopped cleanly instead: its next start's
//     collection disowns them;
//   - the same with a recovery that ignores the directory (the teeth): it
//     frees the anchor of a listed tree;
//   - a creation by a server the directory retired is refused, its
//     chunks freed.
func TestCreateTreeCrash(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	tc := startCluster(t, ctx)
	cl := chunk.NewClerk(tc.mc)
	tc.cls = append(tc.cls, cl)
	s2, s3 := tc.server(t, ctx, 1), tc.server(t, ctx, 2)
	tagged := func() []btree.Handle {
		hs, err := cl.Owned(ctx, btree.OwnerLog(1), lock.Token{Epoch: math.MaxUint64, Seq: math.MaxUint64})
		if err != nil {
			t.Fatal(err)
		}
		return hs
	}
	// dies creates tree name on node 1's server, which dies at stage; it
	// returns the tree's anchor and root once node 1's recovery collected
	// them (neither tagged any more), and node 1 runs again. With stop,
	// node 1 stops cleanly instead (no recovery: the server's next start
	// collects them).
	dies := func(name, stage string, stop bool) (btree.Handle, btree.Handle) {
		t.Helper()
		s1 := tc.server(t, ctx, 0)
		var ah, rh btree.Handle
		s1.SetCreateStopForTest(func(at string, a, r btree.Handle) bool {
			ah, rh = a, r
			return at == stage
		})
		if _, err := s1.CreateTree(ctx, name, btree.Config{MaxFanout: 6}); err == nil {
			t.Fatalf("tree %q: the creation did not stop at %q", name, stage)
		}
		if hs := tagged(); !slices.Contains(hs, ah) || !slices.Contains(hs, rh) {
			t.Fatalf("tree %q: anchor %v and root %v are not both tagged with node 1's log: %v", name, ah, rh, hs)
		}
		start := time.Now()
		if stop {
			tc.c.Stop(0)
			if hs := tagged(); !slices.Contains(hs, ah) || !slices.Contains(hs, rh) {
				t.Fatalf("tree %q: node 1's clean stop untagged anchor %v or root %v: %v", name, ah, rh, hs)
			}
			if err := tc.c.Start(0); err != nil {
				t.Fatal(err)
			}
			tc.server(t, ctx, 0)
		} else {
			tc.c.Crash(0)
		}
		for hs := tagged(); slices.Contains(hs, ah) || slices.Contains(hs, rh); hs = tagged() {
			if ctx.Err() != nil {
				t.Fatalf("tree %q: node 1's recovery did not collect anchor %v and root %v (tagged: %v)", name, ah, rh, hs)
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Logf("tree %q, node 1 died %s (stopped cleanly: %v): collected %v after the crash or stop", name, stage, stop, time.Since(start).Round(time.Millisecond))
		if err := tc.c.Start(0); err != nil {
			t.Fatal(err)
		}
		return ah, rh
	}
	allocated := func(h btree.Handle) bool {
		_, err := cl.Read(ctx, h, 0, 8)
		if err != nil && !errors.Is(err, chunk.ErrUnallocated) {
			t.Fatal(err)
		}
		return err == nil
	}

	ah, rh := dies("unrecorded", "written", false)
	if allocated(ah) || allocated(rh) {
		t.Fatalf("the unrecorded tree's anchor %v (%v) or root %v (%v) is still allocated", ah, allocated(ah), rh, allocated(rh))
	}
	if _, err := btree.LookupTree(ctx, tc.mc, "unrecorded"); !errors.Is(err, btree.ErrNoTree) {
		t.Fatalf("the unrecorded tree: %v", err)
	}

	want := map[string]string{}
	for _, stop := range []bool{false, true} {
		name := map[bool]string{false: "recorded", true: "restarted"}[stop]
		ah, rh = dies(name, "decreed", stop)
		if !allocated(ah) || !allocated(rh) {
			t.Fatalf("the %s tree's anchor %v (%v) or root %v (%v) was freed", name, ah, allocated(ah), rh, allocated(rh))
		}
		tr, err := s2.Open(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 60; i++ {
			k, v := fmt.Sprintf("k%03d", i), name
			if _, err := tr.Put(ctx, []byte(k), []byte(v), btree.Cond{}); err != nil {
				t.Fatal(err)
			}
			want[k] = v
		}
	}

	// The teeth: a recovery that does not read the directory.
	s2.SetRecoverWithoutDirectoryForTest()
	s3.SetRecoverWithoutDirectoryForTest()
	ah, rh = dies("teeth", "decreed", false)
	if allocated(ah) || allocated(rh) {
		t.Fatalf("teeth: a recovery without the directory kept the listed tree's anchor %v and root %v: the test cannot fail", ah, rh)
	}

	// A creator the directory retired (a zombie's creation): refused
	// before any change (a client tries another node), its chunks freed.
	s1 := tc.server(t, ctx, 0)
	if err := (btree.MetaDirectory{Meta: tc.mc}).RetireCreators(ctx, btree.OwnerLog(1), lock.Token{Epoch: math.MaxUint64, Seq: math.MaxUint64}); err != nil {
		t.Fatal(err)
	}
	s1.SetCreateStopForTest(func(_ string, a, r btree.Handle) bool { ah, rh = a, r; return false })
	if _, err := s1.CreateTree(ctx, "zombie", btree.Config{}); !errors.Is(err, btree.ErrCreatorRetired) || !errors.Is(err, btree.ErrNotApplied) {
		t.Fatalf("a retired creator's creation: %v (want ErrCreatorRetired, not applied)", err)
	}
	if allocated(ah) || allocated(rh) {
		t.Fatalf("the refused creation's anchor %v or root %v is still allocated", ah, rh)
	}
	if _, err := btree.LookupTree(ctx, tc.mc, "zombie"); !errors.Is(err, btree.ErrNoTree) {
		t.Fatalf("the refused tree: %v", err)
	}

	tc.closeServer(0)
	tc.closeServer(1)
	tc.closeServer(2)
	sh := walkChunks(t, ctx, tc, "restarted", want)
	t.Logf("the restarted tree: height %d, %d nodes, %d keys", sh.Height, sh.Nodes, len(sh.Keys))
}
