package ddstable_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/bench"
	"github.com/grovestore/grove/internal/ddstable"
	"github.com/grovestore/grove/internal/meta"
)

// Moves on three nodes in one process (DDS §3.1: data spread onto a node
// that holds none): a table of four partitions of two replicas placed on
// nodes 1 and 2 only; node 3's brick moves replicas onto itself on its own
// until no two bricks differ by more than one, while a library writes and
// another reads. No read returns a value older than one acknowledged
// before the read began (the replaced member hands off before the swap),
// every acknowledged write reads back, and every partition's two replicas
// hold the same keys.
func TestServiceTableRebalance(t *testing.T) {
	ctx, c, mc := startTables(t, 2*time.Minute)
	bricks, _ := placeOnTwo(t, ctx, mc, 4)
	w := ddstable.NewLibrary(ddstable.LibraryConfig{Meta: mc})
	defer w.Close()
	r := ddstable.NewLibrary(ddstable.LibraryConfig{Meta: mc})
	defer r.Close()

	const keys = 200
	var acked [keys]atomic.Int64 // the last round acknowledged, per key (-1: none)
	var mu sync.Mutex
	maybe := map[uint64]map[int64]bool{} // rounds whose outcome is unknown
	for k := range acked {
		acked[k].Store(-1)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var writes, reads, stale atomic.Int64
	errs := make(chan error, 2)
	wg.Add(2)
	go func() { // the writer: rounds over every key
		defer wg.Done()
		for round := int64(0); ; round++ {
			for k := range uint64(keys) {
				select {
				case <-stop:
					return
				default:
				}
				wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				err := w.Put(wctx, "t", k, []byte(fmt.Sprint(round)))
				cancel()
				switch {
				case err == nil:
					acked[k].Store(round)
					writes.Add(1)
				case errors.Is(err, ddstable.ErrOutcomeUnknown):
					mu.Lock()
					if maybe[k] == nil {
						maybe[k] = map[int64]bool{}
					}
					maybe[k][round] = true
					mu.Unlock()
				default:
					errs <- fmt.Errorf("put %d round %d: %w", k, round, err)
					return
				}
			}
		}
	}()
	go func() { // the reader: no value older than one acknowledged before
		defer wg.Done()
		rng := rand.New(rand.NewPCG(1, 2))
		for {
			select {
			case <-stop:
				return
			default:
			}
			k := rng.Uint64N(keys)
			floor := acked[k].Load()
			v, found, err := r.Get(ctx, "t", k)
			if err != nil {
				errs <- fmt.Errorf("get %d: %w", k, err)
				return
			}
			reads.Add(1)
			var got int64 = -1
			if found {
				fmt.Sscan(string(v), &got)
			}
			if got < floor {
				stale.Add(1)
				errs <- fmt.Errorf("get %d: round %d, older than round %d acknowledged before the read", k, got, floor)
				return
			}
		}
	}()
	start := time.Now()
	var final *ddstable.Maps
	for final == nil {
		select {
		case err := <-errs:
			close(stop)
			wg.Wait()
			t.Fatal(err)
		default:
		}
		ms, err := ddstable.ListTables(ctx, mc)
		if err == nil && len(ms) == 1 && len(ms[0].Joining) == 0 && len(ms[0].Replacing) == 0 {
			n := ddstable.ReplicaCounts(ms[0])
			if n[bricks[2]] >= 2 && n[bricks[0]] <= 3 && n[bricks[1]] <= 3 {
				final = ms[0]
				break
			}
		}
		if !bench.SleepCtx(ctx, 100*time.Millisecond) {
			t.Fatalf("never balanced: %v", ms)
		}
	}
	took := time.Since(start)
	time.Sleep(time.Second) // writes and reads on the balanced table
	close(stop)
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	t.Logf("balanced in %v (epoch %d): replicas per brick %v; %d writes and %d reads meanwhile, none stale",
		took.Round(time.Millisecond), final.Epoch, ddstable.ReplicaCounts(final), writes.Load(), reads.Load())
	if writes.Load() == 0 || reads.Load() == 0 {
		t.Fatal("no write or no read went through")
	}
	// Every acknowledged write reads back (or a later one whose outcome
	// is unknown).
	for k := range uint64(keys) {
		v, found, err := r.Get(ctx, "t", k)
		if err != nil {
			t.Fatal(err)
		}
		var got int64 = -1
		if found {
			fmt.Sscan(string(v), &got)
		}
		if want := acked[k].Load(); got != want && !(got > want && maybe[k][got]) {
			t.Fatalf("key %d: round %d, want %d (unknown: %v)", k, got, want, maybe[k])
		}
	}
	// The replicas agree, and the bricks serve what the maps list.
	held := map[ddstable.Partition][]uint64{}
	for i := range 3 {
		want := ddstable.ReplicaCounts(final)[bricks[i]]
		for {
			st, err := c.Nodes[i].Tables().Status(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if len(st.Replicas) == want {
				for _, rs := range st.Replicas {
					p := ddstable.Partition{Bits: rs.Partition.Bits, Depth: uint8(rs.Partition.Depth)}
					held[p] = append(held[p], rs.Keys)
				}
				break
			}
			if !bench.SleepCtx(ctx, 100*time.Millisecond) {
				t.Fatalf("node %d serves %d replicas, the maps list %d", i+1, len(st.Replicas), want)
			}
		}
	}
	for p, ks := range held {
		if len(ks) != 2 || ks[0] != ks[1] {
			t.Fatalf("partition %v: replicas hold %v keys", p, ks)
		}
	}
}

// Outside review 127, finding 1: a brick moved off a partition refused
// for its whole incarnation to serve it again, so an operator could not
// move it back, and when the other member died the partition stayed on
// one copy for good though that brick was alive and idle. Now a copy
// under a lease (a recovery, a move back) brings it back.
func TestReview127RetiredRefills(t *testing.T) {
	ctx, c, mc := startTables(t, 2*time.Minute)
	bricks, m := placeOnTwo(t, ctx, mc, 1)
	lib := ddstable.NewLibrary(ddstable.LibraryConfig{Meta: mc})
	defer lib.Close()
	if err := lib.Put(ctx, "t", 5, []byte("five")); err != nil {
		t.Fatal(err)
	}
	p := m.DP.Leaves()[0]
	wait := func(what string, ok func(*ddstable.Maps) bool) {
		t.Helper()
		for {
			if ms, err := ddstable.ListTables(ctx, mc); err == nil && len(ms) == 1 && ok(ms[0]) {
				return
			}
			if !bench.SleepCtx(ctx, 100*time.Millisecond) {
				t.Fatalf("%s: never", what)
			}
		}
	}
	if _, err := ddstable.RequestMove(ctx, mc, "t", p, 1, 3); err != nil {
		t.Fatal(err)
	}
	wait("the move to node 3", func(m *ddstable.Maps) bool { return slices.Contains(m.RG[p], bricks[2]) && len(m.Joining) == 0 })
	if _, err := ddstable.RequestMove(ctx, mc, "t", p, 3, 1); err != nil {
		t.Fatal(err)
	}
	wait("the move back to node 1", func(m *ddstable.Maps) bool { return slices.Contains(m.RG[p], bricks[0]) && len(m.Joining) == 0 })
	if _, err := ddstable.RequestMove(ctx, mc, "t", p, 1, 3); err != nil {
		t.Fatal(err)
	}
	wait("node 3 again", func(m *ddstable.Maps) bool { return slices.Contains(m.RG[p], bricks[2]) && len(m.Joining) == 0 })
	c.Crash(1) // node 2: the partition is left on node 3; node 1 refills it
	wait("refilled by node 1", func(m *ddstable.Maps) bool {
		return len(m.RG[p]) == 2 && slices.Contains(m.RG[p], bricks[0]) && slices.Contains(m.RG[p], bricks[2])
	})
	if v, found, err := lib.Get(ctx, "t", 5); err != nil || !found || string(v) != "five" {
		t.Fatalf("get 5: %q %v %v", v, found, err)
	}
}

// placeOnTwo creates table "t" of partitions partitions with two replicas
// placed on nodes 1 and 2 only (node 3's brick holds none), and returns
// the bricks by node and the maps.
func placeOnTwo(t *testing.T, ctx context.Context, mc *meta.Client, partitions int) ([]ddstable.BrickID, *ddstable.Maps) {
	t.Helper()
	ns, err := mc.Read(ctx, meta.NodesNamespace)
	if err != nil {
		t.Fatal(err)
	}
	bricks, err := ddstable.Bricks(ns)
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(bricks, func(a, b ddstable.BrickID) int { return int(a.Node) - int(b.Node) })
	m, err := ddstable.NewTableMaps("t", partitions, 2, bricks[:2])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mc.Update(ctx, ddstable.Namespace, "test", func(*pb.Namespace) ([]*pb.Op, error) {
		return []*pb.Op{{Kind: pb.Op_KIND_PUT, Key: ddstable.TableKey("t"), Value: m.AppendBinary(nil)}}, nil
	}); err != nil {
		t.Fatal(err)
	}
	return bricks, m
}
