package btree

// Review 54 (commit cc25594, "floors"): checks of the floors' safety
// claims that the commit's own tests leave out. They are written so as not
// to depend on when a leaf chooses to drop records below a floor (each
// drives writes until one was dropped).

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// r54Pending is the Go client's bookkeeping (client/client.go, pending):
// the numbers of a client's writes still waiting for an answer.
type r54Pending struct {
	mu   sync.Mutex
	last uint64
	open map[uint64]bool
}

func (p *r54Pending) begin() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.open == nil {
		p.open = map[uint64]bool{}
	}
	p.last++
	p.open[p.last] = true
	return p.last
}

func (p *r54Pending) end(seq uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.open, seq)
}

func (p *r54Pending) floor() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	f := p.last + 1
	for s := range p.open {
		f = min(f, s)
	}
	return f
}

// TestReview54OpenWriteKeptBelowLaterFloors: with two writes of one client
// in flight, the later's floor is the earlier's number, so the earlier's
// record (its answer lost) stays through any number of the later writes
// to its leaf and answers its resend; once it has its answer, a floor
// passes it and a late duplicate of its first attempt does nothing.
func TestReview54OpenWriteKeptBelowLaterFloors(t *testing.T) {
	ctx := context.Background()
	tr, _, clk := newTokTree(t, Config{})
	applied := map[uint64]int{}
	tr.onOutcome = func(tk WriteToken, key []byte, ok bool) {
		if ok && tk.Client[0] == 1 {
			applied[tk.Seq]++
		}
	}
	s1 := clk.now()
	// Write 1's first attempt applies; its answer is lost (still open).
	if _, err := tr.PutOnce(ctx, []byte("k1"), []byte("one"), Cond{}, floorTok(1, 1, 1, s1, 1)); err != nil {
		t.Fatal(err)
	}
	// Writes 2.. to another key of the leaf, each with floor 1 (fewer
	// than fill the leaf's room: eviction is another matter).
	seq := uint64(2)
	for ; seq < 60; seq++ {
		clk.ns.Add(1000)
		if _, err := tr.PutOnce(ctx, []byte("k2"), []byte(fmt.Sprint(seq)), Cond{}, floorTok(1, seq, 1, clk.now(), 1)); err != nil {
			t.Fatal(err)
		}
	}
	if n, e := tr.Stats.RecordsFloored.Load(), tr.Stats.RecordsEvicted.Load(); n != 0 || e != 0 {
		t.Fatalf("%d records dropped below floor 1, %d evicted", n, e)
	}
	r, err := tr.PutOnce(ctx, []byte("k1"), []byte("one"), Cond{}, floorTok(1, 1, 2, s1, 1))
	if err != nil || !r.Repeat || !r.Applied || applied[1] != 1 {
		t.Fatalf("the open write's resend: %+v %v (applied %d times)", r, err, applied[1])
	}
	// Write 1 answered: the floors pass it, until records are dropped.
	for start := seq; tr.Stats.RecordsFloored.Load() == 0; seq++ {
		if seq > start+2000 {
			t.Fatal("no record dropped below a floor")
		}
		clk.ns.Add(1000)
		if _, err := tr.PutOnce(ctx, []byte("k2"), []byte(fmt.Sprint(seq)), Cond{}, floorTok(1, seq, 1, clk.now(), seq)); err != nil {
			t.Fatal(err)
		}
	}
	r, err = tr.PutOnce(ctx, []byte("k1"), []byte("one"), Cond{}, floorTok(1, 1, 1, s1, 1))
	if applied[1] != 1 || !(errors.Is(err, ErrTokenExpired) || err == nil && r.Repeat) {
		t.Fatalf("a late duplicate of the answered write: %+v %v (applied %d times)", r, err, applied[1])
	}
}

// TestReview54RebalanceCarriesFloor: a leaf's floor goes to both halves of
// a rebalance (compressPair: a merge's records and floors split again), so
// a late duplicate of a write whose record the floor replaced is refused
// wherever its key lands.
func TestReview54RebalanceCarriesFloor(t *testing.T) {
	ctx := context.Background()
	tr, _, clk := newTokTree(t, Config{MaxFanout: 4})
	applied := 0
	tr.onOutcome = func(tk WriteToken, key []byte, ok bool) {
		if ok && tk.Client[0] == 1 && tk.Seq == 1 {
			applied++
		}
	}
	s1 := clk.now()
	if _, err := tr.PutOnce(ctx, []byte("m"), []byte("1"), Cond{}, floorTok(1, 1, 1, s1, 1)); err != nil {
		t.Fatal(err)
	}
	for seq := uint64(2); tr.Stats.RecordsFloored.Load() == 0; seq++ {
		if seq > 2000 {
			t.Fatal("no record dropped below a floor")
		}
		clk.ns.Add(1000)
		if _, err := tr.PutOnce(ctx, []byte("a"), []byte("2"), Cond{}, floorTok(1, seq, 1, clk.now(), seq)); err != nil {
			t.Fatal(err)
		}
	}
	dup := func(when string) {
		t.Helper()
		r, err := tr.PutOnce(ctx, []byte("m"), []byte("1"), Cond{}, floorTok(1, 1, 2, s1, 1))
		if applied != 1 || !(errors.Is(err, ErrTokenExpired) || err == nil && r.Repeat) {
			t.Fatalf("%s: a late duplicate of write 1: %+v %v, applied %d times", when, r, err, applied)
		}
	}
	rnd := rand.New(rand.NewSource(54))
	keys := []string{}
	for c := 'b'; c <= 'z'; c++ {
		if c != 'm' {
			keys = append(keys, string(c))
		}
	}
	for round := 0; round < 200 && (tr.Stats.Rebalances.Load() < 3 || tr.Stats.Merges.Load() == 0); round++ {
		k := []byte(keys[rnd.Intn(len(keys))])
		if rnd.Intn(2) == 0 {
			if _, err := tr.Put(ctx, k, []byte("v"), Cond{}); err != nil {
				t.Fatal(err)
			}
		} else if _, err := tr.Delete(ctx, k, Cond{}); err != nil && !errors.Is(err, ErrNotApplied) {
			t.Fatal(err)
		}
		if _, err := tr.Repair(ctx); err != nil {
			t.Fatal(err)
		}
		dup(fmt.Sprintf("round %d (%d splits, %d merges, %d rebalances)", round, tr.Stats.Splits.Load(), tr.Stats.Merges.Load(), tr.Stats.Rebalances.Load()))
	}
	if tr.Stats.Rebalances.Load() == 0 || tr.Stats.Merges.Load() == 0 {
		t.Fatalf("%d rebalances, %d merges: the test tests too little", tr.Stats.Rebalances.Load(), tr.Stats.Merges.Load())
	}
}

// TestReview54FloorImages: every flipped bit of an image with floors is
// caught (TestNodeRoundTrip flips only sampleImages()[:5], which leaves
// the floor samples out), and deltas between images that add, raise,
// merge or drop floors rebuild the next image exactly.
func TestReview54FloorImages(t *testing.T) {
	for _, b := range sampleImages()[5:7] {
		n, err := decode(b)
		if err != nil || len(n.Floors) == 0 {
			t.Fatalf("a floor sample: %v", err)
		}
		for i := 12; i < len(b); i++ {
			c := bytes.Clone(b)
			c[i] ^= 0x10
			if _, err := decode(c); err == nil {
				t.Fatalf("a flip at byte %d decoded", i)
			}
		}
	}
	r := rand.New(rand.NewSource(54))
	leaf := func() *Node {
		n := &Node{Self: Handle{CM: 1, ID: 9}, Tree: 4, HighInf: true, Version: 3}
		for i := 0; i < 20; i++ {
			n.Keys = append(n.Keys, []byte(fmt.Sprintf("k%02d", i)))
			n.Vals = append(n.Vals, []byte(fmt.Sprintf("v%d", i)))
		}
		return n
	}
	var seqs uint64
	mutate := func(n *Node) {
		switch r.Intn(5) {
		case 0: // a put's record
			c := [16]byte{byte(1 + r.Intn(4))}
			seqs++
			seq := seqs
			n.addDone(Completion{Key: n.Keys[r.Intn(len(n.Keys))], Client: c, Seq: seq, Print: r.Uint64(), Stamp: int64(100 + r.Intn(100)), Applied: true})
		case 1:
			n.Floors = mergeFloors(n.Floors, []Floor{{Client: [16]byte{byte(1 + r.Intn(4))}, Seq: uint64(1 + r.Intn(50)), Stamp: int64(100 + r.Intn(100))}})
		case 2:
			if len(n.Floors) > 0 {
				n.Floors = n.Floors[1:]
			}
		case 3:
			if len(n.Done) > 0 {
				n.Done = n.Done[1:]
			}
		default:
			n.setVal(r.Intn(len(n.Keys)), []byte(fmt.Sprintf("w%d", r.Intn(1000))), false)
		}
		if len(n.Done) == 0 {
			n.Done = nil
		}
		if len(n.Floors) == 0 {
			n.Floors = nil
		}
	}
	deltas := 0
	for i := 0; i < 2000; i++ {
		base := leaf()
		for j := r.Intn(8); j > 0; j-- {
			mutate(base)
		}
		next := base.Clone()
		next.Version++
		for j := 1 + r.Intn(3); j > 0; j-- {
			mutate(next)
		}
		b, nb := base.Encode(nil), next.Encode(nil)
		for _, x := range []struct {
			n   *Node
			img []byte
		}{{base, b}, {next, nb}} {
			got, err := decode(x.img)
			if err != nil || !bytes.Equal(got.Encode(nil), x.img) || x.n.Size() != len(x.img) {
				t.Fatalf("round trip: %v (size %d of %d)", err, x.n.Size(), len(x.img))
			}
		}
		if d, ok := makeDelta(b, nb); ok {
			deltas++
			out, err := applyDelta(b, d, true)
			if err != nil || !bytes.Equal(out, nb) {
				t.Fatalf("a delta rebuilt %d of %d bytes: %v", len(out), len(nb), err)
			}
		}
	}
	if deltas == 0 {
		t.Fatal("no delta made")
	}
}

// TestReview54ConcurrentClientsLoad: clients with several writes in flight
// at once (the Go client's case: each attempt's floor is the least number
// still waiting, below the attempt's own), attempts delivered late with
// the floor they were sent with (after their write was answered or given
// up), compression moving keys and records, and in odd seeds the clock
// jumping past records' and floors' life. No write's outcome is committed
// twice; every answered write's, once; answers agree; the final tree is
// what the commits built; and no attempt of a write still waiting is
// refused below a floor.
func TestReview54ConcurrentClientsLoad(t *testing.T) {
	seeds := 6
	if testing.Short() {
		seeds = 2
	}
	for seed := int64(1); seed <= int64(seeds); seed++ {
		if bad, stats := runReview54Load(t, seed); bad != "" {
			t.Fatal(bad)
		} else {
			t.Logf("seed %d: %s", seed, stats)
		}
	}
}

func runReview54Load(t *testing.T, seed int64) (bad, stats string) {
	comp := &compressor{}
	tr, s, clk := newTokTree(t, Config{MaxFanout: 6, Grace: time.Millisecond, Underfull: comp.underfull})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var mu sync.Mutex
	fail := func(format string, args ...any) {
		mu.Lock()
		if bad == "" {
			bad = fmt.Sprintf("seed %d: ", seed) + fmt.Sprintf(format, args...)
		}
		mu.Unlock()
	}
	type op struct {
		tok    WriteToken // Attempt and Floor zero
		key    []byte
		val    []byte
		del    bool
		cond   Cond
		mu     sync.Mutex
		answer *Result
	}
	var register sync.Mutex
	ops := map[WriteToken]*op{}
	outcomes := map[WriteToken]int{}
	state := map[string]string{}
	tr.onOutcome = func(tk WriteToken, key []byte, ok bool) {
		tk.Attempt, tk.Floor = 0, 0
		register.Lock()
		o := ops[tk]
		register.Unlock()
		mu.Lock()
		defer mu.Unlock()
		outcomes[tk]++
		if outcomes[tk] > 1 && bad == "" {
			bad = fmt.Sprintf("seed %d: write %d.%d committed %d times", seed, tk.Client[0], tk.Seq, outcomes[tk])
		}
		cur, found := state[string(key)]
		if o.cond.holds(found, []byte(cur)) != ok && bad == "" {
			bad = fmt.Sprintf("seed %d: write %d.%d committed applied=%v against the commit order", seed, tk.Client[0], tk.Seq, ok)
		}
		if ok {
			if o.del {
				delete(state, string(key))
			} else {
				state[string(key)] = string(o.val)
			}
		}
	}
	var openRefused, late atomic.Int64
	send := func(o *op, attempt uint32, floor uint64, open bool) {
		tk := o.tok
		tk.Attempt, tk.Floor = attempt, floor
		var res Result
		var err error
		if o.del {
			res, err = tr.DeleteOnce(ctx, o.key, o.cond, &tk)
		} else {
			res, err = tr.PutOnce(ctx, o.key, o.val, o.cond, &tk)
		}
		switch {
		case err == nil:
			o.mu.Lock()
			if o.answer == nil {
				o.answer = &res
			} else if o.answer.Applied != res.Applied || o.answer.Found != res.Found {
				fail("write %d.%d answered %+v, then %+v", tk.Client[0], tk.Seq, *o.answer, res)
			}
			o.mu.Unlock()
		case errors.Is(err, ErrTokenExpired):
			if open {
				openRefused.Add(1)
			}
		case ctx.Err() != nil:
		default:
			fail("write %d.%d attempt %d: %v", tk.Client[0], tk.Seq, attempt, err)
		}
	}
	stop := make(chan struct{})
	var bg sync.WaitGroup
	bg.Add(1)
	go comp.run(ctx, tr, clk, stop, &bg, fail)
	const clients, perClient, writes = 3, 3, 120
	var wg sync.WaitGroup
	for c := 0; c < clients; c++ {
		pend := &r54Pending{}
		for g := 0; g < perClient; g++ {
			wg.Add(1)
			go func(c, g int) {
				defer wg.Done()
				r := rand.New(rand.NewSource(seed*101 + int64(c*perClient+g)))
				var later []func()
				for i := 0; i < writes; i++ {
					mu.Lock()
					stopped := bad != ""
					mu.Unlock()
					if stopped {
						return
					}
					if seed%2 == 1 && r.Intn(60) == 0 {
						clk.ns.Add(int64(TokenWindow + 2*ClockSkew + time.Second))
					}
					o := &op{tok: WriteToken{Client: [16]byte{byte(c + 1)}, Seq: pend.begin(), Stamp: clk.now()},
						key: []byte(fmt.Sprintf("k%02d", r.Intn(40)))}
					switch x := r.Intn(10); {
					case x < 4:
						o.val = []byte(fmt.Sprintf("%d.%d.%d", c, g, i))
					case x < 6:
						o.val, o.cond = []byte(fmt.Sprintf("%d.%d.%d", c, g, i)), Cond{Kind: IfAbsent}
					default:
						o.del, o.cond = true, Cond{Kind: IfExists}
					}
					register.Lock()
					ops[o.tok] = o
					register.Unlock()
					for a := uint32(1); a <= uint32(1+r.Intn(3)); a++ {
						floor := pend.floor()
						if r.Intn(4) == 0 {
							a := a
							later = append(later, func() { send(o, a, floor, false); late.Add(1) })
							continue
						}
						send(o, a, floor, true)
						if o.answer != nil {
							break
						}
					}
					pend.end(o.tok.Seq) // answered, or given up
					for len(later) > 0 && r.Intn(2) == 0 {
						j := r.Intn(len(later))
						later[j]()
						later = append(later[:j], later[j+1:]...)
					}
				}
				for _, f := range later {
					f()
				}
			}(c, g)
		}
	}
	wg.Wait()
	close(stop)
	bg.Wait()
	if bad != "" {
		return bad, ""
	}
	for tk, o := range ops {
		if o.answer != nil && outcomes[tk] != 1 {
			return fmt.Sprintf("seed %d: write %d.%d answered %+v, committed %d times", seed, tk.Client[0], tk.Seq, *o.answer, outcomes[tk]), ""
		}
	}
	if n := openRefused.Load(); n > 0 && tr.Stats.RefusedOld.Load()+tr.Stats.RefusedHorizon.Load()+tr.Stats.RefusedFuture.Load() == 0 {
		return fmt.Sprintf("seed %d: %d attempts of writes still waiting refused, none for age, the future or a horizon (below a floor)", seed, n), ""
	}
	if bad := repairedEquals(tr, s, seed, state); bad != "" {
		return bad, ""
	}
	return "", fmt.Sprintf("%d writes, %d late attempts, %d splits, %d merges, %d rebalances, %d records dropped below a floor, %d refused below one, %d evicted, %d aged; %d attempts of waiting writes refused (old %d, horizon %d)",
		len(ops), late.Load(), tr.Stats.Splits.Load(), tr.Stats.Merges.Load(), tr.Stats.Rebalances.Load(),
		tr.Stats.RecordsFloored.Load(), tr.Stats.RefusedFloor.Load(), tr.Stats.RecordsEvicted.Load(), tr.Stats.RecordsDropped.Load(),
		openRefused.Load(), tr.Stats.RefusedOld.Load(), tr.Stats.RefusedHorizon.Load())
}
