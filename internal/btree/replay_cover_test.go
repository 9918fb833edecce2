package btree

import (
	"context"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/lock"
)

// coverScenario: server 1 (incarnation 1) dies with every node it changed
// only in its log; its next incarnation dies too, waiting for its fence
// lock, before it opened the log. A new lock master knows the first one's
// leases (a names recovery) but not the second's (an "all" recovery, which
// excludes every name the first holds: its fence lock, its log's lock, its
// nodes' locks), and may run the two at once. The runs go in the order
// allFirst says; it returns how many keys the chunks hold then (-1: the
// tree does not walk), how many records the all run read and how many the
// names run redid. unsafe replays a log the run does not cover (the
// behaviour before the fix).
func coverScenario(t *testing.T, allFirst, unsafe bool) (keys, allRead, namesRedone int) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	store, dev, ah := deadServerLog(t, ctx, 1, 60)
	held := deadServerHolds(store, ah)
	nop := func(context.Context) error { return nil }
	all := lock.Recovery{Dead: lock.ClerkID{Node: 1, Inc: 2, Seq: 2}, All: true, Exclude: held, Token: lock.Token{Epoch: 2, Seq: 11}}
	names := lock.Recovery{Dead: lock.ClerkID{Node: 1, Inc: 1, Seq: 2}, Names: held, Token: lock.Token{Epoch: 2, Seq: 12}}
	runAll := func() {
		rep, err := replayDead(ctx, dev, all, store.clerk(2, nop), nil, replayUnsafe{uncovered: unsafe}, nil, simLog, nil)
		if err != nil && allFirst {
			t.Fatalf("the all run: %v", err)
		}
		allRead = rep.Records
	}
	if allFirst {
		runAll()
	}
	rep, err := replayDead(ctx, dev, names, store.clerk(3, nop), nil, replayUnsafe{uncovered: unsafe}, nil, simLog, nil)
	if err != nil {
		t.Fatalf("the names run: %v", err)
	}
	namesRedone = rep.Redone
	if !allFirst {
		runAll() // (an older token than the names run's: refused, if it acts)
	}
	sh, err := Walk(ctx, simChunkReader{&simWorld{chunks: store, anchor: ah}}, false)
	if err != nil {
		t.Logf("walking the chunks: %v", err)
		return -1, allRead, namesRedone
	}
	return len(sh.Keys), allRead, namesRedone
}

// TestReplayLeavesALogItsRunDoesNotCover: the "all" run of coverScenario
// leaves the log alone (replaying it truncated it under the names run,
// which then found nothing to redo: TestEndToEndTreeLinearizable found the
// loss on real processes); the names run replays it, in either order, and
// every key is in the chunks.
func TestReplayLeavesALogItsRunDoesNotCover(t *testing.T) {
	for _, allFirst := range []bool{true, false} {
		keys, allRead, redone := coverScenario(t, allFirst, false)
		t.Logf("all run first %v: the all run read %d records, the names run redid %d, the chunks hold %d keys", allFirst, allRead, redone, keys)
		if allRead != 0 {
			t.Fatalf("the all run of an incarnation that never held its log read %d records", allRead)
		}
		if redone == 0 || keys != 60 {
			t.Fatalf("the names run redid %d records; the chunks hold %d keys, want 60", redone, keys)
		}
	}
}

// TestReplayCoverTeeth: replaying a log the run does not cover loses the
// keys in coverScenario (the check above can fail).
func TestReplayCoverTeeth(t *testing.T) {
	keys, allRead, redone := coverScenario(t, true, true)
	t.Logf("unsafe: the all run read %d records, the names run redid %d, the chunks hold %d keys", allRead, redone, keys)
	if keys == 60 && redone > 0 {
		t.Fatal("replaying the uncovered log lost nothing: the scenario has no teeth")
	}
}
