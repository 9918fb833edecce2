package btree

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

var errCrashPoint = errors.New("crash point: the server died here")

// newCrashWorld is the simulator's world without its random faults: three
// servers on one tree over the simulated lock service, chunks and log
// devices.
func newCrashWorld(t *testing.T, ctx context.Context) *simWorld {
	t.Helper()
	w := newSimWorld(t, ctx, 1, false, 256)
	for n := uint64(1); n <= 3; n++ {
		if !w.restartOne(false) {
			t.Fatalf("starting server %d failed", n)
		}
	}
	return w
}

// A server dies at each step of a structural change, right after the
// change's commit record is durable in its log and before any of the
// nodes it changed reached their chunks: in a leaf split, in a split of an
// inner node that a leaf split climbed into (so the climb stops half-way),
// in a merge and in a rebalance (compression). Another server replays its
// log (the lock service's recovery), finishes the work (Repair), and the
// tree read from the chunks holds exactly the acknowledged keys (the one
// operation cut off may or may not be there), in a sound structure.
func TestCrashPoints(t *testing.T) {
	for _, tc := range []struct {
		point string
		level int
	}{{"split", 0}, {"split", 1}, {"split", 2}, {"merge", 0}, {"merge", 1}, {"rebalance", 0}} {
		t.Run(fmt.Sprintf("%s-level-%d", tc.point, tc.level), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			w := newCrashWorld(t, ctx)
			s1, s2 := w.servers[1], w.servers[2]
			var fired atomic.Bool
			s1.tree.crashPoint = func(point string, level int) error {
				if point != tc.point || level != tc.level || !fired.CompareAndSwap(false, true) {
					return nil
				}
				// The group commit flushed the change; the server dies
				// before writing any node back.
				if err := s1.wal.FlushNow(ctx); err != nil {
					t.Errorf("flush at the crash point: %v", err)
				}
				w.kill(s1)
				return errCrashPoint
			}
			model := map[string]string{}
			var cut string // the operation the death cut off
			key := func(i int) string { return fmt.Sprintf("k%05d", (i*7919)%4000) }
			const n = 600
			for i := 0; i < n && !fired.Load(); i++ {
				k, v := key(i), fmt.Sprintf("v%d", i)
				// (A lease past its time — the machine stalled the
				// stand-in's renewals longer than its 30 ms lease — is
				// refused and waited out, as in the simulator.)
				err := afterLeaseLapse(ctx, func() error {
					_, err := s1.tree.Put(ctx, []byte(k), []byte(v), Cond{})
					return err
				})
				switch {
				case err == nil:
					model[k] = v
				case fired.Load():
					cut = k
				default:
					t.Fatalf("put %s: %v", k, err)
				}
			}
			if tc.point != "split" {
				// Compression: delete most keys; the server's compressor
				// merges and rebalances the under-full nodes.
				for i := 0; i < n && !fired.Load(); i++ {
					if i%5 == 0 {
						continue
					}
					k := key(i)
					err := afterLeaseLapse(ctx, func() error {
						_, err := s1.tree.Delete(ctx, []byte(k), Cond{})
						return err
					})
					switch {
					case err == nil:
						delete(model, k)
					case fired.Load():
						cut = k
					default:
						t.Fatalf("delete %s: %v", k, err)
					}
					time.Sleep(200 * time.Microsecond) // the compressor keeps up
				}
				for start := time.Now(); !fired.Load() && time.Since(start) < 5*time.Second; {
					time.Sleep(10 * time.Millisecond)
				}
			}
			if !fired.Load() {
				t.Fatalf("the workload never reached the crash point %s at level %d", tc.point, tc.level)
			}
			// Another server: every acknowledged key, through its cache
			// (it waits for the replay of server 1's log).
			for k, v := range model {
				var got []byte
				var ok bool
				err := afterLeaseLapse(ctx, func() (err error) {
					got, ok, err = s2.tree.Get(ctx, []byte(k))
					return err
				})
				if err != nil || !ok || string(got) != v {
					t.Fatalf("server 2, after server 1 died at %s level %d: get %s = %q %v %v, want %q", tc.point, tc.level, k, got, ok, err, v)
				}
			}
			for pass := 0; pass < 20; pass++ {
				var rep RepairReport
				err := afterLeaseLapse(ctx, func() (err error) {
					rep, err = s2.tree.Repair(ctx)
					return err
				})
				if err != nil {
					t.Fatalf("repair: %v", err)
				}
				if rep.Downlinks+rep.Compressed+rep.Freed == 0 {
					break
				}
			}
			for _, s := range []*simServer{s2, w.servers[3]} {
				if err := afterLeaseLapse(ctx, func() error { return s.cache.FlushAll(ctx) }); err != nil {
					t.Fatal(err)
				}
			}
			// The tree as the chunks hold it.
			sh, err := Walk(ctx, simChunkReader{w}, true)
			if err != nil {
				t.Fatalf("walk: %v", err)
			}
			if sh.Missing != 0 {
				t.Fatalf("%d downlinks still missing after repair", sh.Missing)
			}
			got := map[string]string{}
			for i, k := range sh.Keys {
				got[string(k)] = string(sh.Vals[i])
			}
			for k, v := range model {
				if got[k] != v {
					t.Fatalf("acknowledged %s=%s; the chunks hold %q", k, v, got[k])
				}
			}
			for k := range got {
				if _, ok := model[k]; !ok && k != cut {
					t.Fatalf("key %s is in the tree but was never acknowledged (or was deleted)", k)
				}
			}
			t.Logf("server 1 died at %s (level %d) with %d keys acknowledged; height %d, %d nodes", tc.point, tc.level, len(model), sh.Height, sh.Nodes)
			for _, s := range []*simServer{s2, w.servers[3]} {
				s.halt()
				s.done.Wait()
			}
		})
	}
}
