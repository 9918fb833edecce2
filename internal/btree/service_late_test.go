package btree_test

import (
	"context"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/btree"
)

// A B-tree server that finishes starting after its incarnation ended is
// stopped by the role's run loop: after the node's clean close began, it
// closes cleanly under the close's context and the close waits for it (the
// process may exit as soon as Close returns); after a fence, it stops as a
// fenced server does, leaving its leases and log to a recovery.
func TestServiceStopsALateServer(t *testing.T) {
	for _, fenced := range []bool{false, true} {
		name := "close"
		if fenced {
			name = "fence"
		}
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			tc := startCluster(t, ctx)
			svc := tc.c.Nodes[0].BTree()
			started, release := make(chan *btree.Server, 1), make(chan struct{})
			svc.SetAfterStartForTest(func(s *btree.Server) {
				started <- s
				<-release
			})
			type stop struct {
				clean bool
				err   error
			}
			stopped := make(chan stop, 1)
			svc.SetLateStopForTest(func(clean bool, err error) { stopped <- stop{clean, err} })
			// A tree made through node 2 starts node 1's server (its role
			// watches the directory).
			if _, err := tc.server(t, ctx, 1).CreateTree(ctx, "late", btree.Config{MaxFanout: 6}); err != nil {
				t.Fatal(err)
			}
			select {
			case <-started:
			case <-time.After(time.Minute):
				t.Fatal("node 1's B-tree server did not start after a tree was made")
			}
			closed := make(chan struct{})
			if fenced {
				svc.FenceForTest()
			} else {
				go func() {
					svc.Close()
					close(closed)
				}()
				select {
				case <-closed:
					t.Fatal("the node's close returned while its B-tree server was still starting")
				case <-time.After(300 * time.Millisecond):
				}
			}
			close(release)
			var st stop
			select {
			case st = <-stopped:
			case <-time.After(20 * time.Second):
				t.Fatal("the server that finished starting late was not stopped")
			}
			if fenced {
				if st.clean {
					t.Fatal("a server whose incarnation was fenced was closed cleanly (its leases are gone: nothing it writes back can be accepted)")
				}
				return
			}
			if !st.clean || st.err != nil {
				t.Fatalf("a server that finished starting as the node closed: clean %v, %v; want a clean close", st.clean, st.err)
			}
			select {
			case <-closed:
			case <-time.After(15 * time.Second):
				t.Fatal("the node's close did not return after its late server closed")
			}
		})
	}
}
