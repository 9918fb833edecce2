package btree_test

import (
	"context"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/btree"
)

// TestReview56OpenAfterDropRecreate (review 56, N1): an Open that looked
// the directory up just before the tree was dropped and made again under
// the same name must not cache the dropped tree over the new one, or
// every later Open of the name on this server returns the dropped tree
// (each operation on it then fails or is refused until it is forgotten).
func TestReview56OpenAfterDropRecreate(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tc := startCluster(t, ctx)
	s := tc.server(t, ctx, 0)
	const name = "n1"
	if _, err := s.CreateTree(ctx, name, btree.Config{}); err != nil {
		t.Fatal(err)
	}
	looked, resume := make(chan struct{}), make(chan struct{})
	s.SetOpenLookedForTest(func(n string) {
		if n == name {
			s.SetOpenLookedForTest(nil)
			close(looked)
			<-resume
		}
	})
	type opened struct {
		tr  *btree.Tree
		err error
	}
	first := make(chan opened, 1)
	go func() {
		tr, err := s.Open(ctx, name)
		first <- opened{tr, err}
	}()
	<-looked // the Open holds the old tree's entry
	if err := s.DropTree(ctx, name); err != nil {
		t.Fatal(err)
	}
	fresh, err := s.CreateTree(ctx, name, btree.Config{})
	if err != nil {
		t.Fatal(err)
	}
	close(resume)
	if o := <-first; o.err != nil {
		t.Fatal(o.err)
	}
	tr, err := s.Open(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if tr.AnchorForTest() != fresh.Anchor {
		t.Fatalf("Open after the re-create returns the dropped tree (anchor %v, the tree under the name now %v)", tr.AnchorForTest(), fresh.Anchor)
	}
}
