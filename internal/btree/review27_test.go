package btree

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/chunk"
)

// r27Chunks fails the first free after arm, and records which chunk it was.
type r27Chunks struct {
	*simChunkClerk
	mu     sync.Mutex
	armed  bool
	failed Handle
	sizes  map[Handle]uint64
}

func (c *r27Chunks) Allocate(ctx context.Context, size uint64, owner chunk.Owner) (Handle, error) {
	h, err := c.simChunkClerk.Allocate(ctx, size, owner)
	if err == nil {
		c.mu.Lock()
		c.sizes[h] = size
		c.mu.Unlock()
	}
	return h, err
}

func (c *r27Chunks) Free(ctx context.Context, h Handle) error {
	c.mu.Lock()
	fail := c.armed
	if fail {
		c.armed, c.failed = false, h
	}
	c.mu.Unlock()
	if fail {
		return errors.New("review27: the chunk's pair is down")
	}
	return c.simChunkClerk.Free(ctx, h)
}

// TestReview27NotAppliedValueFreeNotRetried (outside review 27, failing
// before its fix): c64d930 says a chunk the
// server gave back whose free failed is freed again by the stray loop
// (RefreeFailed). A put whose condition fails after its value chunk was
// written gives that chunk back through TreeStore.Free (settleValues'
// free(mine)), which bypasses Cache.free: a failed free there is not put in
// refree, the chunk stays in the unlinked set (so CollectStrays leaves it
// alone too) and stays allocated and tagged for the server's whole life.
func TestReview27NotAppliedValueFreeNotRetried(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	g := newStrayRig(t, ctx, 10)
	wrap := &r27Chunks{simChunkClerk: g.chunks, sizes: map[Handle]uint64{}}
	g.cache.cfg.Chunks = wrap
	wrap.mu.Lock()
	wrap.armed = true
	wrap.mu.Unlock()
	val := bytes.Repeat([]byte("y"), 500)
	res, err := g.tree.Put(ctx, []byte("absent-key"), val, Cond{Kind: IfExists})
	if err != nil || res.Applied {
		t.Fatalf("put if-exists of an absent key: %+v, %v; want not applied, no error", res, err)
	}
	wrap.mu.Lock()
	h, size := wrap.failed, wrap.sizes[wrap.failed]
	wrap.mu.Unlock()
	if h.IsZero() || size != ValueChunkSize(len(val)) {
		t.Fatalf("the failed free was of %v (size %d), not the put's value chunk", h, size)
	}
	if got := g.tree.Stats.ValueLeaks.Load(); got != 1 {
		t.Fatalf("ValueLeaks = %d, want 1", got)
	}
	g.cache.mu.Lock()
	inRefree, inUnlinked := g.cache.mu.refree[h], g.cache.mu.unlinked[h]
	g.cache.mu.Unlock()
	n, err := g.cache.RefreeFailed(ctx)
	if err != nil {
		t.Fatal(err)
	}
	g.chunks.strays.Add(1)
	m, err := g.cache.CollectStrays(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if g.tagged()[h] {
		t.Fatalf("value chunk %v of a put that did not apply, whose free failed, is still allocated after RefreeFailed (freed %d) and CollectStrays (freed %d): in refree %v, in unlinked %v — it leaks until the log's next holder",
			h, n, m, inRefree, inUnlinked)
	}
}

// TestReview27LateServerAfterCrashIsClosedCleanly (outside review 27,
// failing before its fix): b8aa3dd's stopLate says
// a server that finishes starting after Crash stops as a fenced one (its
// leases "must not be given back, after Crash"). Node.Crash calls
// btree.Service.Crash and then Node.Close, which calls Service.Close: Close
// sets closeCtx while the incarnation is already stopped, and a run whose
// StartServer returns now sees closed && inc == inc && closeCtx != nil, so
// it closes the server cleanly (write-back, leases and log lock given
// back). The same after Fence then Close (a self-fenced node told to stop
// while its server was still starting): a clean close of a fenced
// incarnation's server under a live 10 s context that no fence will cut.
// The condition below is run's and stopLate's, verbatim.
func TestReview27LateServerAfterCrashIsClosedCleanly(t *testing.T) {
	for _, first := range []string{"crash", "fence"} {
		t.Run(first, func(t *testing.T) {
			s := NewService(ServiceConfig{Node: 1})
			const inc = 1
			s.mu.inc = inc
			s.mu.ctx, s.mu.cancel = context.WithCancel(context.Background())
			s.mu.ready, s.mu.gone, s.mu.started = make(chan struct{}), make(chan struct{}), true
			ctx := s.mu.ctx
			s.runs.Add(1) // launch: a run in StartServer
			if first == "crash" {
				s.Crash() // Node.Crash: btree.Crash, then Node.Close
			} else {
				s.Fence(inc) // the node fences itself, then is told to stop
			}
			closed := make(chan struct{})
			go func() { s.Close(); close(closed) }()
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
				s.mu.Lock()
				set := s.mu.closing != nil // Close began
				s.mu.Unlock()
				if set {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("Close did not begin")
				}
			}
			// StartServer returns now: run's check and stopLate's choice.
			s.mu.Lock()
			late := s.mu.inc != inc || s.mu.closed || ctx.Err() != nil
			closing, closeCtx := s.mu.closed && s.mu.inc == inc, s.mu.closeCtx
			s.mu.Unlock()
			clean := closing && closeCtx != nil
			live := closeCtx != nil && closeCtx.Err() == nil
			s.runs.Done()
			<-closed
			if !late {
				t.Fatal("the run would keep the server")
			}
			if clean {
				t.Fatalf("after %s then Close, a server that finishes starting is closed cleanly (close context live: %v), not stopped as a fenced one", first, live)
			}
		})
	}
}
