package btree

import (
	"context"
	"fmt"
	"math/rand"
	"sync"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/chunk"
	"github.com/grovestore/grove/internal/lock"
	"github.com/grovestore/grove/internal/rldev"
	"github.com/grovestore/grove/internal/txn"
)

// review9Chunks loses answers adversarially: any write (a renewed rewrite
// included) may leave an attempt in flight, either with the retry through
// (errWrittenEarlierMayLand) or with nothing known to have landed
// (chunk.ErrMaybeDone). Every such attempt is kept; the test lands them when
// it likes.
type review9Chunks struct {
	*simChunkClerk
	mu      sync.Mutex
	r       *rand.Rand
	p       float64
	strays  []stray
	retried int
	failed  int
	// pin (the teeth): every write goes under the run's first token, as a
	// replay that renews but keeps writing under the token it had.
	pin *lock.Token
}

func (c *review9Chunks) Write(ctx context.Context, h Handle, data []byte, f *rldev.Fence) error {
	if c.pin != nil {
		f = &rldev.Fence{Name: f.Name, Token: *c.pin}
	}
	c.mu.Lock()
	lose, through := c.r.Float64() < c.p, c.r.Intn(2) == 0
	if lose {
		c.strays = append(c.strays, stray{h, append([]byte(nil), data...), *f})
	}
	c.mu.Unlock()
	if lose && !through {
		c.mu.Lock()
		c.failed++
		c.mu.Unlock()
		return fmt.Errorf("review9: the answer was lost: %w", chunk.ErrMaybeDone)
	}
	if err := c.simChunkClerk.Write(ctx, h, data, f); err != nil {
		return err
	}
	if lose {
		c.mu.Lock()
		c.retried++
		c.mu.Unlock()
		return fmt.Errorf("writing chunk %v: %w", h, errWrittenEarlierMayLand)
	}
	return nil
}

// land delivers the strays from index from on, in a shuffled order; it
// returns how many were admitted.
func (c *review9Chunks) land(from int, r *rand.Rand) (admitted int) {
	c.mu.Lock()
	s := append([]stray(nil), c.strays[from:]...)
	c.mu.Unlock()
	r.Shuffle(len(s), func(i, j int) { s[i], s[j] = s[j], s[i] })
	return landStrays(c.s, s)
}

// Review 9: strays under the first token AND under renewed tokens (the
// renewed rewrites lose answers too, half of them with nothing known to have
// landed), over two runs of one recovery (the second sees every node current:
// the cv >= nv path rewrites the chunk's own image), landed in random order
// (1) right after the run that sent them, before anything else writes, and
// (2) after another server rewrote every node. None may be admitted: each is
// superseded on its RLDev by a later write of the same chunk under a newer
// token of the dead server's fence name.
func TestReview9ReplayStraysUnderRenewedTokens(t *testing.T) {
	t.Run("renews", func(t *testing.T) { review9StrayCase(t, false) })
	t.Run("teeth", func(t *testing.T) { review9StrayCase(t, true) })
}

func review9StrayCase(t *testing.T, teeth bool) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const keys = 60
	store, dev, ah := deadServerLog(t, ctx, 9, keys)
	nop := func(context.Context) error { return nil }
	r := rand.New(rand.NewSource(9))
	lossy := &review9Chunks{simChunkClerk: store.clerk(2, nop), r: rand.New(rand.NewSource(99)), p: 0.5}
	tok := lock.Token{Epoch: 2, Seq: 1}
	renewals := 0
	run := func(dev txn.Device) (int, error) {
		tok.Seq += 100 // the next run's token is above every earlier one
		from := len(lossy.strays)
		if teeth {
			first := tok
			lossy.pin = &first
		}
		rec := lock.Recovery{Dead: lock.ClerkID{Node: 1}, All: true, Token: tok,
			Renew: func(context.Context) (lock.Token, error) {
				renewals++
				tok.Seq++
				return tok, nil
			}}
		_, err := ReplayDead(ctx, dev, rec, lossy)
		return from, err
	}
	// A copy of the log as the dead server left it: run 2 replays it as if
	// run 1's log writes (its final header above all) never landed, so
	// run 2 finds every node current (cv >= nv) and rewrites the chunks'
	// own images.
	dev2 := copySimDevice(dev)
	from1, err := run(dev)
	if err != nil {
		t.Fatalf("run 1: %v", err)
	}
	n1 := len(lossy.strays)
	if adm := lossy.land(from1, r); adm != 0 && !teeth {
		t.Fatalf("run 1 left %d strays, %d admitted right after it", n1-from1, adm)
	}
	from2, err := run(dev2)
	if err != nil {
		t.Fatalf("run 2: %v", err)
	}
	if adm := lossy.land(from2, r); adm != 0 && !teeth {
		t.Fatalf("run 2's strays: %d admitted right after it", adm)
	}
	t.Logf("run 1: %d strays; run 2 (cv >= nv): %d strays", n1-from1, len(lossy.strays)-from2)
	w := &simWorld{chunks: store, anchor: ah}
	sh, err := Walk(ctx, simChunkReader{w}, false)
	if (err != nil || len(sh.Keys) != keys) && teeth {
		t.Logf("teeth caught: the strays landed between the runs broke the tree: %v", err)
		return
	}
	if err != nil || len(sh.Keys) != keys {
		t.Fatalf("after the replays: %v, %d keys", err, len(sh.Keys))
	}
	newer := rewriteEveryNode(t, store, ah.ID, lock.Token{Epoch: 2, Seq: 100000})
	admitted := lossy.land(0, r)
	overwritten := countOverwritten(store, newer)
	t.Logf("%d strays (%d retried through, %d failed-maybe), %d renewals; after server 3: %d admitted, %d nodes overwritten",
		len(lossy.strays), lossy.retried, lossy.failed, renewals, admitted, overwritten)
	if teeth {
		if overwritten == 0 {
			t.Fatal("teeth: a replay writing under its first token after renewing was not caught")
		}
		return
	}
	if admitted > 0 || overwritten > 0 {
		t.Fatalf("%d strays admitted after the node locks moved on, %d nodes overwritten", admitted, overwritten)
	}
	if lossy.retried == 0 || lossy.failed == 0 || renewals < 2 {
		t.Fatal("the loss pattern did not bite")
	}
}

func copySimDevice(d *simDevice) *simDevice {
	d.mu.Lock()
	defer d.mu.Unlock()
	c := newSimDevice(d.blocks)
	for i := range d.rep {
		for b, v := range d.rep[i] {
			c.rep[i][b] = append([]byte(nil), v...)
		}
	}
	for n, t := range d.tokens {
		c.tokens[n] = t
	}
	return c
}
