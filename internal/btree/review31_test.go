package btree

import (
	"context"
	"sync"
	"testing"
	"time"

	pb "github.com/grovestore/grove/api/grovepb"
)

// Review 31 (outside review of 71bfb2c, f154ab1: settleListed, the
// OpTimeout bound).

// review31HangChunks is a chunk store whose reads of one chunk hang until
// their context ends, as chunk.Clerk.Read does for a chunk whose manager
// pair is down (its errors are not final: it retries until ctx ends).
type review31HangChunks struct {
	Chunks
	mu   sync.Mutex
	hang Handle
}

func (c *review31HangChunks) Read(ctx context.Context, h Handle, n uint64) ([]byte, error) {
	c.mu.Lock()
	hang := c.hang
	c.mu.Unlock()
	if h == hang {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return c.Chunks.Read(ctx, h, n)
}

// review31CtxDir is memDirectory whose reads fail once their context
// ended, as meta.Client.Read does.
type review31CtxDir struct{ *memDirectory }

func (d review31CtxDir) Trees(ctx context.Context) (map[string]TreeEntry, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return d.memDirectory.Trees(ctx)
}

func (d review31CtxDir) Drops(ctx context.Context) ([]pendingDrop, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return d.memDirectory.Drops(ctx)
}

// One listed tree whose anchor's chunk cannot be read (its manager pair
// down) made settleListed spend the whole dropper pass's context, and
// report success (read failures were not counted); the pass's FinishDrops
// then ran on the ended context and finished nothing (and said nothing:
// finishDrops dropped Drops' error). So while any listed tree's anchor was
// unreachable, no drop anywhere was finished. Now the pass finishes first,
// each step has its own budget, each anchor's read is bounded, and the
// unreadable anchors are counted.
func TestReview31UnreadableAnchorDoesNotStarveFinishing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var chunks *review31HangChunks
	_, _, solo, _ := newLoggedSolo(t, ctx, 31, func(cl *simChunkClerk) Chunks {
		chunks = &review31HangChunks{Chunks: cl}
		return chunks
	})
	c := solo.cache
	write := func(ctx context.Context, h Handle, img []byte) error {
		return writeFenced(ctx, chunks, solo.fence, h, img)
	}
	mem := &memDirectory{ns: &pb.Namespace{Name: Namespace}}
	dir := review31CtxDir{mem}
	cfg := Config{NodeSize: MinNodeSize, MaxFanout: 6}

	unreachable, err := createTree(ctx, c, dir, write, "a", cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := createTree(ctx, c, dir, write, "z", cfg, nil); err != nil {
		t.Fatal(err)
	}
	if _, _, err := beginDrop(ctx, c, dir, "z", nil); err != nil {
		t.Fatal(err)
	}
	chunks.mu.Lock()
	chunks.hang = unreachable.Anchor // tree a's manager pair goes down
	chunks.mu.Unlock()

	// One dropper pass's steps (Server.dropPass), each with a budget of
	// 300 ms (10 × OpTimeout in the server), an anchor's read 50 ms.
	finished := 0
	n, unreadable, ferr, serr := dropPassSteps(ctx, c, dir, chunks.Free, 0, 300*time.Millisecond, func(_ TreeEntry, err error) {
		if err == nil {
			finished++
		}
	}, nil, 50*time.Millisecond)
	t.Logf("settleListed: %d settled, %d unreadable, err %v; drops finished in the pass: %d (%v); drops left: %d", n, unreadable, serr, finished, ferr, len(pendingDrops(mem.ns)))
	if unreadable != 1 {
		t.Errorf("settleListed counted %d unreadable anchors (want 1: tree a's)", unreadable)
	}
	if finished != 1 || ferr != nil {
		t.Errorf("an unreadable live anchor kept the pass from finishing tree z's drop (marked, recorded, DropWait 0): %d finished, %v", finished, ferr)
	}
	if ds := pendingDrops(mem.ns); len(ds) != 0 {
		t.Fatalf("drops left %v", ds)
	}
}
