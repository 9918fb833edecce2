package btree

import (
	"context"
	"fmt"
	"testing"
	"time"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/chunk"
	"github.com/grovestore/grove/internal/lock"
)

// A recovery run hands its collection of the dead server's orphans to
// later, which the server runs once the run has returned (after the dead
// server's leases are freed), so that the collection's chunk-map mark,
// directory decree and frees are not in the window where the dead
// server's nodes are unavailable. When replayDead returns, the log is
// replayed and nothing is collected: the orphan is allocated and the
// directory holds no retirement; the collection, run then, frees the
// orphan and leaves the tree whole. Without later the run collects before
// it returns (ReplayDead's and the tests' way).
func TestRecoveryCollectsOrphansAfterItsRun(t *testing.T) {
	for _, deferred := range []bool{true, false} {
		t.Run(fmt.Sprintf("deferred=%v", deferred), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			store, dev, ah := deadServerLog(t, ctx, 1, 60)
			cl := store.clerk(2, func(context.Context) error { return nil })
			held := deadServerHolds(store, ah)
			// What the dead server allocated and never linked.
			orphan, err := cl.Allocate(ctx, MinNodeSize, chunk.Owner{Log: OwnerLog(1), Token: lock.Token{Epoch: 1, Seq: 3}})
			if err != nil {
				t.Fatal(err)
			}
			allocated := func(h Handle) bool {
				store.mu.Lock()
				defer store.mu.Unlock()
				return store.data[h] != nil
			}
			dir := &memDirectory{ns: &pb.Namespace{Name: Namespace}}
			run := lock.Recovery{Dead: lock.ClerkID{Node: 1, Inc: 1, Seq: 2}, Names: held, Token: lock.Token{Epoch: 2, Seq: 12}}
			var collect func(context.Context)
			var later func(func(context.Context))
			if deferred {
				later = func(c func(context.Context)) { collect = c }
			}
			rep, err := replayDead(ctx, dev, run, cl, dir, replayUnsafe{}, later, simLog, nil)
			if err != nil {
				t.Fatal(err)
			}
			if rep.Redone == 0 {
				t.Fatalf("the run redid nothing: %+v", rep)
			}
			if deferred {
				if collect == nil {
					t.Fatal("the run handed no collection to later")
				}
				mark, _ := retiredBelow(dir.ns, OwnerLog(1))
				if !allocated(orphan) || dir.retires != 0 || mark != (lock.Token{}) {
					t.Fatalf("the run collected before it returned: orphan allocated %v, directory retirements %d", allocated(orphan), dir.retires)
				}
				collect(ctx)
			}
			if allocated(orphan) {
				t.Fatalf("the dead server's orphan %v is still allocated after the collection", orphan)
			}
			if mark, err := retiredBelow(dir.ns, OwnerLog(1)); err != nil || mark != run.Token {
				t.Fatalf("the directory's retirement of log 1: %v, %v (want %v)", mark, err, run.Token)
			}
			sh, err := Walk(ctx, simChunkReader{&simWorld{chunks: store, anchor: ah}}, false)
			if err != nil {
				t.Fatal(err)
			}
			if len(sh.Keys) != 60 {
				t.Fatalf("the tree holds %d keys after the recovery, want 60", len(sh.Keys))
			}
		})
	}
}
