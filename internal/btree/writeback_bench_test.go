package btree_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/btree"
)

// keys is the size of the benchmarks' trees (writtenTree).
const keys = 6000

// writtenTree makes tree name on s with keys keys of 256-byte values
// ("key%08d"), all written back to their chunks.
func writtenTree(b *testing.B, ctx context.Context, s *btree.Server, name string) *btree.Tree {
	b.Helper()
	if _, err := s.CreateTree(ctx, name, btree.Config{}); err != nil {
		b.Fatal(err)
	}
	tr, err := s.Open(ctx, name)
	if err != nil {
		b.Fatal(err)
	}
	val := make([]byte, 256)
	for i := 0; i < keys; i++ {
		if _, err := tr.Put(ctx, []byte(fmt.Sprintf("key%08d", i)), val, btree.Cond{}); err != nil {
			b.Fatal(err)
		}
	}
	if err := s.Cache().FlushAll(ctx); err != nil {
		b.Fatal(err)
	}
	return tr
}

// BenchmarkCheckpointWriteBack measures a checkpoint's write-back on the
// real stack (three in-process nodes, chunks on RLDevs with their disks in
// files): each round dirties every leaf of a tree of about 300 leaves
// (one put per leaf), then FlushAll writes them back, one at a time or
// several at once (the RLDevs share a sync among the writes in flight).
// Reported: nanoseconds per node written back.
func BenchmarkCheckpointWriteBack(b *testing.B) {
	for _, par := range []int{1, 16} {
		b.Run(fmt.Sprintf("parallel=%d", par), func(b *testing.B) {
			defer btree.SetWriteBackParallelForTest(par)()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			tc := startCluster(b, ctx)
			s := tc.server(b, ctx, 0)
			tr := writtenTree(b, ctx, s, "wb")
			val := make([]byte, 256)
			b.ResetTimer()
			written := 0
			for n := 0; n < b.N; n++ {
				b.StopTimer()
				for i := 0; i < keys; i += 20 {
					if _, err := tr.Put(ctx, []byte(fmt.Sprintf("key%08d", i)), val, btree.Cond{}); err != nil {
						b.Fatal(err)
					}
				}
				dirty := s.Cache().Dirty()
				b.StartTimer()
				if err := s.Cache().FlushAll(ctx); err != nil {
					b.Fatal(err)
				}
				written += dirty
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(max(written, 1)), "ns/node")
		})
	}
}

// BenchmarkRecoveryReplay measures a recovery run's replay on the real
// stack: node 1's server loads a tree of 6 000 keys (256-byte values),
// writes it back, then puts 1 500 keys at random (several puts on most of
// its ~300 leaves), and its node crashes; node 2's server runs the
// recovery. Reported: the replay's duration (the run's records, and the
// node writes it made: one per node, its last image), writing one node at
// a time or several at once. Run it with -benchtime=1x: each round starts
// a cluster.
func BenchmarkRecoveryReplay(b *testing.B) {
	for _, par := range []int{1, 16} {
		b.Run(fmt.Sprintf("parallel=%d", par), func(b *testing.B) {
			// Undone after the clusters' cleanups (which run first: last
			// registered), so that no recovery still running reads it.
			b.Cleanup(btree.SetReplayParallelForTest(par))
			var total time.Duration
			for n := 0; n < b.N; n++ {
				b.StopTimer()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
				tc := startCluster(b, ctx)
				s1, s2 := tc.server(b, ctx, 0), tc.server(b, ctx, 1)
				tr := writtenTree(b, ctx, s1, "replay")
				val := make([]byte, 256)
				rng := rand.New(rand.NewPCG(uint64(n), 7))
				for i := 0; i < 1500; i++ {
					if _, err := tr.Put(ctx, []byte(fmt.Sprintf("key%08d", rng.IntN(keys))), val, btree.Cond{}); err != nil {
						b.Fatal(err)
					}
				}
				dirty := s1.Cache().Dirty()
				before, _ := s2.ReplaysForTest()
				tc.c.Crash(0)
				for {
					if got, took := s2.ReplaysForTest(); got > before {
						total += took
						b.ReportMetric(float64(dirty), "dirty-nodes")
						break
					}
					if ctx.Err() != nil {
						b.Fatal("node 2's server did not replay node 1's log")
					}
					time.Sleep(10 * time.Millisecond)
				}
				cancel()
			}
			b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms/replay")
		})
	}
}

// BenchmarkPutDeltas measures what logging node changes as deltas
// (delta.go) saves: 8 goroutines put 256-byte values at random keys of a
// tree of 6 000 keys on the real stack, each put durable (on both
// replicas of the log's RLDev) when it returns, with the cache's deltas on
// and off. Reported: puts per second and the log's bytes per put (the
// log's end moved, flush padding included). Run it with -benchtime=Nx,
// N the puts of a round.
//
// tokens=true sends every put under a write token (completion records in
// the leaves, completion.go), with deltas on; hot=true puts to 64 keys
// only (without floors, their leaves' records are evicted all the time);
// floors=true sends each client's floor with its tokens (each client has
// one put in flight: the floor is the put's own number).
func BenchmarkPutDeltas(b *testing.B) {
	type variant struct{ on, tokens, hot, floors bool }
	for _, v := range []variant{{false, false, false, false}, {true, false, false, false}, {true, true, false, false}, {true, true, false, true},
		{true, false, true, false}, {true, true, true, false}, {true, true, true, true}} {
		on := v.on
		b.Run(fmt.Sprintf("deltas=%v/tokens=%v/hot=%v/floors=%v", on, v.tokens, v.hot, v.floors), func(b *testing.B) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			tc := startCluster(b, ctx)
			s := tc.server(b, ctx, 0)
			s.SetDeltasForTest(on)
			tr := writtenTree(b, ctx, s, "deltas")
			start := s.LogEndForTest()
			before := s.Cache().Stats().Deltas
			b.ResetTimer()
			const clients = 8
			errs := make(chan error, clients)
			for c := 0; c < clients; c++ {
				go func() {
					rng := rand.New(rand.NewPCG(uint64(c), 9))
					val := make([]byte, 256)
					for i := c; i < b.N; i += clients {
						n := keys
						if v.hot {
							n = 64
						}
						k := []byte(fmt.Sprintf("key%08d", rng.IntN(n)))
						var tok *btree.WriteToken
						if v.tokens {
							tok = &btree.WriteToken{Client: [16]byte{byte(c + 1)}, Seq: uint64(i + 1), Attempt: 1, Stamp: time.Now().UnixNano()}
							if v.floors {
								tok.Floor = tok.Seq
							}
						}
						if _, err := tr.PutOnce(ctx, k, val, btree.Cond{}, tok); err != nil {
							errs <- err
							return
						}
					}
					errs <- nil
				}()
			}
			for c := 0; c < clients; c++ {
				if err := <-errs; err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "puts/s")
			b.ReportMetric(float64(s.LogEndForTest()-start)/float64(b.N), "log-B/put")
			b.ReportMetric(float64(s.Cache().Stats().Deltas-before)/float64(b.N), "deltas/put")
			b.ReportMetric(float64(tr.Stats.RecordsEvicted.Load())/float64(b.N), "evicted/put")
		})
	}
}
