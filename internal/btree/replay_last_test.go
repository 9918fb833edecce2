package btree

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/lock"
	"github.com/grovestore/grove/internal/rldev"
)

// writeCounter counts the writes of each chunk.
type writeCounter struct {
	Chunks
	mu     sync.Mutex
	writes map[Handle]int
}

func (w *writeCounter) Write(ctx context.Context, h Handle, data []byte, f *rldev.Fence) error {
	w.mu.Lock()
	w.writes[h]++
	w.mu.Unlock()
	return w.Chunks.Write(ctx, h, data, f)
}

// A recovery run writes each node of the dead server's log once, its last
// committed image (newestImages), however many records the node has: the
// log of 200 puts into a tree of fanout 6 holds several images of most
// leaves, and the replay leaves every key in place. Writing every image,
// as before, wrote a hot leaf once per put since its last write-back.
func TestReplayWritesEachNodeOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const keys = 200
	store, dev, ah := deadServerLog(t, ctx, 1, keys)
	held := deadServerHolds(store, ah)
	wc := &writeCounter{Chunks: store.clerk(2, func(context.Context) error { return nil }), writes: map[Handle]int{}}
	run := lock.Recovery{Dead: lock.ClerkID{Node: 1, Inc: 1, Seq: 2}, Names: held, Token: lock.Token{Epoch: 2, Seq: 12}}
	rep, err := replayDead(ctx, dev, run, wc, nil, replayUnsafe{}, nil, simLog, nil)
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for h, n := range wc.writes {
		if n > 1 {
			t.Errorf("chunk %v written %d times by one replay", h, n)
		}
		total += n
	}
	if total == 0 || rep.Records < 2*total {
		t.Fatalf("the log holds %d records and the replay wrote %d chunks: the scenario has too few images of the same nodes to tell", rep.Records, total)
	}
	sh, err := Walk(ctx, simChunkReader{&simWorld{chunks: store, anchor: ah}}, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(sh.Keys) != keys {
		t.Fatalf("the tree holds %d keys after the replay, want %d", len(sh.Keys), keys)
	}
	t.Logf("%d records, %d redone, %d chunks written once each", rep.Records, rep.Redone, total)
}
