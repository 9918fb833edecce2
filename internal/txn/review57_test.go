package txn

// Review 57: pipelined group commit (commit 0003ce9).

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/rldev"
)

// Close while a flight is in flight and nothing is buffered: Close is
// meant to wait the flight out ("a flush in flight: wait it out"), but
// FlushNow answers ErrClosed (nothing buffered), Close gives up at once,
// cancels the flushers' context under the flight's write, and returns
// ErrClosed: the commit in flight fails though its write would have
// landed, the log fails, and an OpenNamed log keeps its lock.
func TestReview57CloseWaitsOutFlightInFlight(t *testing.T) {
	hd := &holdDev{lockedDev: &lockedDev{d: newRevDev(HeaderBlocks + 256)}, pending: make(chan *heldWrite, 4), failCancelled: true}
	d := hd
	l, err := Open(context.Background(), Config{Device: d, Fence: tok(1), Applier: newRevStore(), Flushes: 2, LazyInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	hd.setHold(true)
	a := commitAsync(l, "a", []byte("AAAAAAAA"))
	first := nextHeld(t, hd)
	closed := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		closed <- l.Close(ctx)
	}()
	time.Sleep(50 * time.Millisecond) // Close is in its loop, the flight held
	hd.setHold(false)
	first.release <- nil
	if err := <-closed; err != nil {
		t.Errorf("Close with a flight in flight and nothing buffered: %v (want nil: wait the flight out)", err)
	}
	if err := <-a; err != nil {
		t.Errorf("the commit in flight during Close: %v", err)
	}
	if err := l.Err(); err != nil {
		t.Errorf("the log failed: %v", err)
	}
}

// r57Dev hands every log write to the test, which decides its fate: it
// lands on both replicas (nil), on neither, on one replica only, or in
// part (an error for the last three); or the owner crashes, and every
// write from then on fails (whatever of them landed stays).
type r57Dev struct {
	ld      *lockedDev
	mu      sync.Mutex
	pass    bool // recovery's own writes: straight through
	crashed bool
	pend    []*r57Write
	maxPend int
	quiet   bool // most writes land
	arrive  chan struct{}
}

type r57Write struct {
	block uint64
	data  []byte
	f     *rldev.Fence
	done  chan error
}

var errR57 = errors.New("r57: write failed")

func (d *r57Dev) Blocks() uint64 { return d.ld.Blocks() }
func (d *r57Dev) ReadReplica(ctx context.Context, r int, b, n uint64) ([]byte, error) {
	return d.ld.ReadReplica(ctx, r, b, n)
}
func (d *r57Dev) WriteReplica(ctx context.Context, r int, b uint64, data []byte, f *rldev.Fence) error {
	return d.ld.WriteReplica(ctx, r, b, data, f)
}
func (d *r57Dev) Write(ctx context.Context, block uint64, data []byte, f *rldev.Fence) error {
	d.mu.Lock()
	if d.pass {
		d.mu.Unlock()
		return d.ld.Write(ctx, block, data, f)
	}
	if d.crashed {
		d.mu.Unlock()
		return errR57
	}
	w := &r57Write{block: block, data: bytes.Clone(data), f: f, done: make(chan error, 1)}
	d.pend = append(d.pend, w)
	d.maxPend = max(d.maxPend, len(d.pend))
	d.mu.Unlock()
	select {
	case d.arrive <- struct{}{}:
	default:
	}
	return <-w.done
}

// take removes a random pending write (nil if none).
func (d *r57Dev) take(rng *rand.Rand) *r57Write {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.pend) == 0 {
		return nil
	}
	i := rng.IntN(len(d.pend))
	w := d.pend[i]
	d.pend = append(d.pend[:i], d.pend[i+1:]...)
	return w
}

// settle lands w (or not) and answers it.
func (d *r57Dev) settle(rng *rand.Rand, w *r57Write, mayAck bool) {
	ctx := context.Background()
	n := len(w.data) / BlockSize
	x := rng.IntN(10)
	if d.quiet && rng.IntN(6) != 0 {
		x = 0
	}
	switch {
	case x < 6 && mayAck:
		w.done <- d.ld.Write(ctx, w.block, w.data, w.f)
		return
	case x < 7:
	case x < 8:
		_ = d.ld.WriteReplica(ctx, rng.IntN(2), w.block, w.data, w.f)
	case x < 9:
		if k := rng.IntN(n + 1); k > 0 {
			_ = d.ld.Write(ctx, w.block, w.data[:k*BlockSize], w.f)
		}
	default:
		_ = d.ld.Write(ctx, w.block, w.data, w.f) // landed, answer lost
	}
	w.done <- errR57
}

// Sessions of a pipelined log on a small ring (flights wrap), each ending
// in a crash or a failed write at a random point while its writes land
// in a random order, on one replica or in part: every commit that was
// acknowledged is in the store after the next owner's recovery.
func TestReview57RandomFlightsAckedSurvive(t *testing.T) { r57Random(t, false) }

// The same with checkpoints (the checkpoint's own flights and header
// writes meet the same fates).
func TestReview57RandomFlightsWithCheckpoints(t *testing.T) { r57Random(t, true) }

// r57Ckpt writes back every update whose record ends at or below upTo.
type r57Ckpt struct {
	st  *revStore
	mu  sync.Mutex
	ups []r57Up
	n   int
}

type r57Up struct {
	end    LSN
	target string
	val    []byte
}

func (c *r57Ckpt) add(end LSN, target string, val []byte) {
	c.mu.Lock()
	c.ups = append(c.ups, r57Up{end, target, val})
	c.mu.Unlock()
}

func (c *r57Ckpt) WriteBack(ctx context.Context, upTo LSN) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n++
	kept := c.ups[:0]
	for _, u := range c.ups {
		if u.end <= upTo {
			c.st.put(u.target, 0, u.val)
		} else {
			kept = append(kept, u)
		}
	}
	c.ups = kept
	return nil
}

func r57Random(t *testing.T, ckpt bool) {
	seed := uint64(57)
	if v, err := strconv.ParseUint(os.Getenv("R57_SEED"), 10, 64); err == nil {
		seed = v
	}
	t.Logf("seed %d (R57_SEED replays it)", seed)
	rng := rand.New(rand.NewPCG(seed, 57))
	ld := &lockedDev{d: newRevDev(HeaderBlocks + 16)}
	st := newRevStore()
	type acked struct {
		target string
		val    []byte
	}
	var all []acked
	overlap, ckpts, stuck := 0, 0, 0
	sessions := 300
	if testing.Short() {
		sessions = 60
	}
	for s := 1; s <= sessions; s++ {
		d := &r57Dev{ld: ld, pass: true, quiet: ckpt, arrive: make(chan struct{}, 1)}
		cfg := Config{Device: d, Fence: tok(uint64(s)), Applier: st, Flushes: 1 + rng.IntN(3), LazyInterval: time.Hour}
		ck := &r57Ckpt{st: st}
		if ckpt {
			cfg.Checkpointer, cfg.CheckpointAt = ck, 0.2
		}
		l, err := Open(context.Background(), cfg)
		if err != nil {
			t.Fatalf("session %d: open: %v", s, err)
		}
		for _, a := range all {
			if got := st.get(a.target, 0, 8); !bytes.Equal(got, a.val) {
				t.Fatalf("session %d: acknowledged commit to %s lost: %q, want %q (recovery: %s)", s, a.target, got, a.val, l.Recovered().Why)
			}
		}
		d.mu.Lock()
		d.pass = false
		d.mu.Unlock()
		n := 1 + rng.IntN(8)
		if ckpt {
			n = 2 + rng.IntN(14)
		}
		var wg sync.WaitGroup
		var amu sync.Mutex
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				target := fmt.Sprintf("s%d-%d", s, i)
				val := []byte(fmt.Sprintf("%08d", s*10+i))
				tx := l.Begin()
				uctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				defer cancel()
				end, err := tx.Update(uctx, []byte(target), 0, val, zero8)
				if err != nil {
					if uctx.Err() != nil {
						amu.Lock()
						stuck++
						amu.Unlock()
					}
					return
				}
				ck.add(end, target, val)
				if _, err := tx.Commit(context.Background(), true); err == nil {
					amu.Lock()
					all = append(all, acked{target, val})
					amu.Unlock()
				}
			}()
		}
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		crashAfter := rng.IntN(12)
		if ckpt {
			crashAfter = rng.IntN(40)
		}
		settled := 0
	loop:
		for {
			d.mu.Lock()
			np := len(d.pend)
			d.mu.Unlock()
			if np == 1 && rng.IntN(4) != 0 {
				// Let a second flight start beside it, most times.
				select {
				case <-d.arrive:
				case <-time.After(3 * time.Millisecond):
				}
			}
			if w := d.take(rng); w != nil {
				if settled == crashAfter {
					d.mu.Lock()
					d.crashed = true
					d.mu.Unlock()
				}
				d.mu.Lock()
				crashed := d.crashed
				d.mu.Unlock()
				d.settle(rng, w, !crashed)
				settled++
				continue
			}
			select {
			case <-d.arrive:
			case <-done:
				break loop
			case <-time.After(20 * time.Millisecond):
			}
		}
		d.mu.Lock()
		d.crashed = true
		d.mu.Unlock()
		// Whatever is still pending fails (landing or not).
		for w := d.take(rng); w != nil; w = d.take(rng) {
			d.settle(rng, w, false)
		}
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		closed := make(chan struct{})
		go func() {
			for {
				select {
				case <-closed:
					return
				case <-d.arrive:
					for w := d.take(rng); w != nil; w = d.take(rng) {
						d.settle(rng, w, false)
					}
				case <-time.After(5 * time.Millisecond):
					for w := d.take(rng); w != nil; w = d.take(rng) {
						d.settle(rng, w, false)
					}
				}
			}
		}()
		_ = l.Close(cctx)
		close(closed)
		cancel()
		<-done
		if d.maxPend > 1 {
			overlap++
		}
		ckpts += ck.n
	}
	t.Logf("%d acknowledged commits checked over %d sessions (%d with writes in flight at once, %d write-backs, %d updates that waited 2 s for room)", len(all), sessions, overlap, ckpts, stuck)
}
