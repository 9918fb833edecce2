package btree

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/grovestore/grove/api/etcdpb"
)

// The combining outbox: every item queued is sent exactly once, by one
// sender at a time, in each putter's order; after a failed send, every
// item is accounted for once — sent, in the failed message, reported
// unsent, or refused by put — and nothing more is sent.
func TestOutboxCombines(t *testing.T) {
	for _, failAt := range []int{0, 1, 40, 100} { // 0: no failure
		var (
			mu       sync.Mutex
			sent     = map[uint64]int{}
			inFailed = map[uint64]bool{}
			unsent   = map[uint64]bool{}
			refused  = map[uint64]bool{}
			msgs     int
			failures int
			sending  atomic.Int32
			lastBy   = map[uint64]uint64{} // putter -> last sequence seen
		)
		errBroken := errors.New("broken")
		var out *outbox[*etcdpb.ForwardAnswer]
		out = newOutbox(func(items []*etcdpb.ForwardAnswer) error {
			if sending.Add(1) != 1 {
				t.Error("two senders at once")
			}
			defer sending.Add(-1)
			time.Sleep(time.Duration(len(items)%3) * 50 * time.Microsecond)
			mu.Lock()
			defer mu.Unlock()
			msgs++
			if failAt > 0 && msgs == failAt {
				for _, it := range items {
					inFailed[it.Id] = true
				}
				return errBroken
			}
			if failAt > 0 && msgs > failAt {
				t.Error("a send after the failure")
			}
			for _, it := range items {
				sent[it.Id]++
				putter, seq := it.Id>>32, it.Id&(1<<32-1)
				if seq <= lastBy[putter] && lastBy[putter] != 0 {
					t.Errorf("putter %d: item %d sent after %d", putter, seq, lastBy[putter])
				}
				lastBy[putter] = seq
			}
			return nil
		}, func(err error, items []*etcdpb.ForwardAnswer) {
			if !errors.Is(err, errBroken) {
				t.Errorf("failed with %v", err)
			}
			mu.Lock()
			defer mu.Unlock()
			failures++
			for _, it := range items {
				unsent[it.Id] = true
			}
		})
		const putters, each = 8, 200
		var wg sync.WaitGroup
		for p := uint64(1); p <= putters; p++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := uint64(1); i <= each; i++ {
					id := p<<32 | i
					if !out.put(&etcdpb.ForwardAnswer{Id: id}) {
						mu.Lock()
						refused[id] = true
						mu.Unlock()
					}
				}
			}()
		}
		wg.Wait()
		if failAt > 0 && failures != 1 || failAt == 0 && failures != 0 {
			t.Fatalf("failAt %d: %d failures reported", failAt, failures)
		}
		for p := uint64(1); p <= putters; p++ {
			for i := uint64(1); i <= each; i++ {
				id := p<<32 | i
				n := sent[id]
				for _, b := range []bool{inFailed[id], unsent[id], refused[id]} {
					if b {
						n++
					}
				}
				if n != 1 {
					t.Fatalf("failAt %d: item %d/%d accounted for %d times (sent %d, failed %v, unsent %v, refused %v)",
						failAt, p, i, n, sent[id], inFailed[id], unsent[id], refused[id])
				}
			}
		}
		t.Logf("failAt %d: %d messages for %d items", failAt, msgs, putters*each)
	}
}
