package btree

import (
	"context"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/lock"
	"github.com/grovestore/grove/internal/txn"
)

// TestReplayLeavesALogItsRunDoesNotCover: server 1 (incarnation 1) dies
// with every node it changed only in its log; its next incarnation dies
// too, waiting for its fence lock, before it opened the log. A new lock
// master knows the first one's leases (a names recovery) but not the
// second's (an "all" recovery, which excludes every name the first holds:
// its fence lock, its log's lock, its nodes' locks). The master may run the
// two at once. The "all" run must leave the log alone: replaying it would
// truncate it under the names run, which would then find nothing to redo
// (TestEndToEndTreeLinearizable found the loss on real processes). Then
// the names run replays the log and every key is in the chunks.
func TestReplayLeavesALogItsRunDoesNotCover(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const keys = 60
	store, dev, ah := deadServerLog(t, ctx, 1, keys)
	// The first incarnation's leases: its fence lock, its log's lock,
	// and every node of the tree (it wrote them all).
	held := []string{FenceLock(1), txn.LockName(LogName(1))}
	store.mu.Lock()
	for h := range store.data {
		if h != ah {
			held = append(held, LockName(h))
		}
	}
	store.mu.Unlock()
	nop := func(context.Context) error { return nil }

	all := lock.Recovery{Dead: lock.ClerkID{Node: 1, Inc: 2, Seq: 2}, All: true, Exclude: held, Token: lock.Token{Epoch: 2, Seq: 11}}
	rep, err := ReplayDead(ctx, dev, all, store.clerk(2, nop))
	if err != nil {
		t.Fatalf("the all run: %v", err)
	}
	if rep.Records != 0 || rep.Redone != 0 {
		t.Fatalf("the all run of an incarnation that never held its log read %d records, redid %d", rep.Records, rep.Redone)
	}
	names := lock.Recovery{Dead: lock.ClerkID{Node: 1, Inc: 1, Seq: 2}, Names: held, Token: lock.Token{Epoch: 2, Seq: 12}}
	rep, err = ReplayDead(ctx, dev, names, store.clerk(3, nop))
	if err != nil {
		t.Fatalf("the names run: %v", err)
	}
	t.Logf("the names run redid %d of %d records", rep.Redone, rep.Records)
	if rep.Redone == 0 {
		t.Fatal("the names run found nothing to redo: the log was truncated under it")
	}
	w := &simWorld{chunks: store, anchor: ah}
	sh, err := Walk(ctx, simChunkReader{w}, false)
	if err != nil {
		t.Fatalf("after both runs: %v", err)
	}
	if len(sh.Keys) != keys {
		t.Fatalf("after both runs the chunks hold %d keys, want %d", len(sh.Keys), keys)
	}
}
