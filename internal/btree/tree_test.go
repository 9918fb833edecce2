package btree

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/grovestore/grove/internal/lock"
	"testing"
	"time"
)

// model is the naive reference: a map, sorted on demand.
type model map[string]string

func (m model) span(from, to []byte) []string {
	var ks []string
	for k := range m {
		if k >= string(from) && (to == nil || k < string(to)) {
			ks = append(ks, k)
		}
	}
	sort.Strings(ks)
	return ks
}

func seedFromEnv(t *testing.T, def int64) int64 {
	if s := os.Getenv("GROVE_SEED"); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	return def
}

type fakeClock struct{ ns atomic.Int64 }

func (c *fakeClock) now() int64 { return c.ns.Load() }

func newMemTree(t *testing.T, cfg Config) (*Tree, *MemStore, *fakeClock) {
	clk := &fakeClock{}
	s, id := NewMemStore(clk.now)
	tr, err := New(s, id, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return tr, s, clk
}

// checkShape walks the tree and compares it with the model and the store's
// chunks.
func checkShape(t *testing.T, s *MemStore, m model, complete bool) Shape {
	t.Helper()
	ctx := context.Background()
	sh, err := Walk(ctx, s, complete)
	if err != nil {
		t.Fatal(err)
	}
	want := m.span(nil, nil)
	if len(sh.Keys) != len(want) {
		t.Fatalf("tree holds %d keys, model %d", len(sh.Keys), len(want))
	}
	for i, k := range want {
		if string(sh.Keys[i]) != k || string(sh.Vals[i]) != m[k] {
			t.Fatalf("entry %d: tree %q=%q, model %q=%q", i, sh.Keys[i], sh.Vals[i], k, m[k])
		}
	}
	chunks := s.Chunks()
	for h := range chunks {
		if !sh.Chunks[h] {
			t.Fatalf("chunk %v is allocated but not part of the tree (leaked)", h)
		}
	}
	for h := range sh.Chunks {
		if !chunks[h] {
			t.Fatalf("the tree uses chunk %v, which is not allocated", h)
		}
	}
	return sh
}

// compressor collects a tree's Underfull hints (underfull is its
// Config.Underfull) and, in run, compresses where they point and repairs
// the tree every 20 passes (the clock a millisecond on), beside a test's
// workers, until stop closes.
type compressor struct {
	mu    sync.Mutex
	hints []struct {
		level int
		key   []byte
	}
}

func (c *compressor) underfull(level int, key []byte) {
	c.mu.Lock()
	c.hints = append(c.hints, struct {
		level int
		key   []byte
	}{level, key})
	c.mu.Unlock()
}

func (c *compressor) run(ctx context.Context, tr *Tree, clk *fakeClock, stop chan struct{}, wg *sync.WaitGroup, fail func(format string, args ...any)) {
	defer wg.Done()
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		default:
		}
		c.mu.Lock()
		hs := c.hints
		c.hints = nil
		c.mu.Unlock()
		for _, h := range hs {
			if _, err := tr.Compress(ctx, h.level, h.key); err != nil && ctx.Err() == nil {
				fail("compress: %v", err)
				return
			}
		}
		if i%20 == 0 {
			clk.ns.Add(int64(time.Millisecond))
			if _, err := tr.Repair(ctx); err != nil && ctx.Err() == nil {
				fail("repair: %v", err)
				return
			}
		}
		time.Sleep(100 * time.Microsecond)
	}
}

func randKey(r *rand.Rand, space int) []byte {
	return []byte(fmt.Sprintf("k%06d", r.Intn(space)))
}

// TestTreeSequentialDifferential runs random operations one at a time
// against the model, checking every answer, with compression after
// deletes and repair passes, and walks the tree at the end.
//
// The last variant keeps values of more than a few bytes in chunks of
// their own (MaxInline 20), with short and long values mixed so that
// overwrites move values in and out of their leaves.
func TestTreeSequentialDifferential(t *testing.T) {
	for _, vc := range []struct{ fan, inline int }{{4, 0}, {6, 0}, {0, 0}, {6, 20}} {
		fan := vc.fan
		name := fmt.Sprintf("fanout=%d", fan)
		if vc.inline != 0 {
			name += fmt.Sprintf(",inline=%d", vc.inline)
		}
		t.Run(name, func(t *testing.T) {
			seed := seedFromEnv(t, time.Now().UnixNano())
			t.Logf("seed %d (GROVE_SEED replays)", seed)
			r := rand.New(rand.NewSource(seed))
			var hints [][]byte
			var hintLevels []int
			cfg := Config{MaxFanout: fan, Grace: time.Second, MaxScanLeaves: 8, MaxCountLeaves: 1 << 20, MaxInline: vc.inline,
				Underfull: func(level int, key []byte) { hints = append(hints, key); hintLevels = append(hintLevels, level) }}
			tr, s, clk := newMemTree(t, cfg)
			ctx := context.Background()
			m := model{}
			space := 400
			valLen := 8
			if fan == 0 {
				valLen = 600 // byte-bounded nodes: make them split
			}
			ops := 6000
			if testing.Short() {
				ops = 2000
			}
			for op := 0; op < ops; op++ {
				k := randKey(r, space)
				if vc.inline != 0 {
					valLen = []int{4, 30, 300}[r.Intn(3)]
				}
				v := []byte(fmt.Sprintf("%0*d", valLen, r.Intn(1e6)))
				cur, found := m[string(k)]
				switch x := r.Intn(100); {
				case x < 40:
					res, err := tr.Put(ctx, k, v, Cond{Prev: true})
					if err != nil || !res.Applied || res.Found != found || found && string(res.Prev) != cur {
						t.Fatalf("op %d: put %q: %+v %v (model found %v %q)", op, k, res, err, found, cur)
					}
					m[string(k)] = string(v)
				case x < 50:
					res, err := tr.Put(ctx, k, v, Cond{Kind: IfAbsent})
					if err != nil || res.Applied == found {
						t.Fatalf("op %d: put-if-absent %q: %+v %v (model found %v)", op, k, res, err, found)
					}
					if !found {
						m[string(k)] = string(v)
					}
				case x < 55:
					old := []byte(cur)
					if r.Intn(2) == 0 {
						old = []byte("nope")
					}
					res, err := tr.Put(ctx, k, v, Cond{Kind: IfEquals, Value: old})
					want := found && cur == string(old)
					if err != nil || res.Applied != want {
						t.Fatalf("op %d: cas %q: %+v %v (want %v)", op, k, res, err, want)
					}
					if want {
						m[string(k)] = string(v)
					}
				case x < 80:
					res, err := tr.Delete(ctx, k, Cond{})
					if err != nil || res.Applied != found {
						t.Fatalf("op %d: delete %q: %+v %v (model found %v)", op, k, res, err, found)
					}
					delete(m, string(k))
				case x < 88:
					got, ok, err := tr.Get(ctx, k)
					if err != nil || ok != found || string(got) != cur {
						t.Fatalf("op %d: get %q = %q %v %v, model %q %v", op, k, got, ok, err, cur, found)
					}
				case x < 96:
					from := randKey(r, space)
					var to []byte
					if r.Intn(3) > 0 {
						to = randKey(r, space)
						if bytes.Compare(from, to) >= 0 {
							from, to = to, from
						}
						if bytes.Equal(from, to) {
							to = append(to, 0)
						}
					}
					if r.Intn(4) == 0 {
						from = nil
					}
					checkScan(t, tr, m, Span{From: from, To: to}, r.Intn(12), r.Intn(2) == 0)
				default:
					from, to := randKey(r, space), randKey(r, space)
					if bytes.Compare(from, to) > 0 {
						from, to = to, from
					}
					to = append(to, 0)
					c, err := tr.Count(ctx, Span{From: from, To: to})
					if err != nil || c != len(m.span(from, to)) {
						t.Fatalf("op %d: count [%q,%q) = %d %v, model %d", op, from, to, c, err, len(m.span(from, to)))
					}
				}
				for len(hints) > 0 {
					h, l := hints[0], hintLevels[0]
					hints, hintLevels = hints[1:], hintLevels[1:]
					if _, err := tr.Compress(ctx, l, h); err != nil {
						t.Fatal(err)
					}
				}
				if op%500 == 499 {
					clk.ns.Add(int64(2 * time.Second))
					if _, err := tr.Repair(ctx); err != nil {
						t.Fatal(err)
					}
					checkShape(t, s, m, true)
				}
			}
			clk.ns.Add(int64(2 * time.Second))
			if _, err := tr.Repair(ctx); err != nil {
				t.Fatal(err)
			}
			sh := checkShape(t, s, m, true)
			t.Logf("height %d, %d nodes, %d removed waiting; splits %d, root splits %d, merges %d, rebalances %d, freed %d, restarts %d",
				sh.Height, sh.Nodes, sh.Removed, tr.Stats.Splits.Load(), tr.Stats.RootSplits.Load(), tr.Stats.Merges.Load(),
				tr.Stats.Rebalances.Load(), tr.Stats.Freed.Load(), tr.Stats.Restarts.Load())
			if tr.Stats.Splits.Load() == 0 || tr.Stats.Merges.Load()+tr.Stats.Rebalances.Load() == 0 {
				t.Fatal("the workload split or merged nothing: it tests too little")
			}
			if vc.inline != 0 && (sh.Values == 0 || tr.Stats.ValuesFreed.Load() == 0) {
				t.Fatalf("%d values in chunks at the end, %d freed: the workload tests too little of them", sh.Values, tr.Stats.ValuesFreed.Load())
			}
		})
	}
}

// checkScan compares one scan page with the model: the page must hold
// exactly the model's entries in [Lo, Hi), within the span, no more than
// the limit.
func checkScan(t *testing.T, tr *Tree, m model, span Span, limit int, reverse bool) {
	t.Helper()
	pg, err := tr.Scan(context.Background(), span, limit, reverse)
	if err != nil {
		t.Fatalf("scan %q..%q: %v", span.From, span.To, err)
	}
	if limit > 0 && len(pg.Keys) > limit {
		t.Fatalf("scan returned %d entries, limit %d", len(pg.Keys), limit)
	}
	if bytes.Compare(pg.Lo, span.From) < 0 || span.To != nil && (pg.Hi == nil || bytes.Compare(pg.Hi, span.To) > 0) {
		t.Fatalf("page [%q,%q) outside span [%q,%q)", pg.Lo, pg.Hi, span.From, span.To)
	}
	want := m.span(pg.Lo, pg.Hi)
	if reverse {
		for i, j := 0, len(want)-1; i < j; i, j = i+1, j-1 {
			want[i], want[j] = want[j], want[i]
		}
	}
	if len(want) != len(pg.Keys) {
		t.Fatalf("scan [%q,%q) reverse %v limit %d: page [%q,%q) has %d keys, model %d", span.From, span.To, reverse, limit, pg.Lo, pg.Hi, len(pg.Keys), len(want))
	}
	for i, k := range want {
		if string(pg.Keys[i]) != k || string(pg.Vals[i]) != m[k] {
			t.Fatalf("scan entry %d: %q=%q, model %q=%q", i, pg.Keys[i], pg.Vals[i], k, m[k])
		}
	}
	all := m.span(span.From, span.To)
	if !pg.More && len(all) != len(want) {
		t.Fatalf("scan says no more, but the span holds %d keys and the page %d", len(all), len(want))
	}
}

// TestTreeConcurrentDifferential runs many goroutines at once, each on its
// own keys (so each can check every answer against its own model), with
// keys of all goroutines interleaved in the same leaves, while background
// goroutines compress and repair. Run it with -race.
//
// The second variant keeps most values in chunks of their own (MaxInline
// 16): scans and gets then meet value chunks that other workers' overwrites
// free under them.
func TestTreeConcurrentDifferential(t *testing.T) {
	t.Run("inline", func(t *testing.T) { testConcurrentDifferential(t, 0) })
	t.Run("values-in-chunks", func(t *testing.T) { testConcurrentDifferential(t, 16) })
}

func testConcurrentDifferential(t *testing.T, inline int) {
	seed := seedFromEnv(t, time.Now().UnixNano())
	t.Logf("seed %d (GROVE_SEED replays the choices; the interleaving is the scheduler's)", seed)
	comp := &compressor{}
	cfg := Config{MaxFanout: 6, Grace: time.Millisecond, MaxScanLeaves: 6, MaxCountLeaves: 1 << 20, MaxInline: inline,
		Underfull: comp.underfull}
	tr, s, clk := newMemTree(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	workers, ops := 8, 3000
	if testing.Short() {
		ops = 1000
	}
	models := make([]model, workers)
	var wg sync.WaitGroup
	var failed atomic.Bool
	fail := func(format string, args ...any) {
		if failed.CompareAndSwap(false, true) {
			t.Errorf(format, args...)
		}
		cancel()
	}
	stop := make(chan struct{})
	var bg sync.WaitGroup
	bg.Add(1)
	go comp.run(ctx, tr, clk, stop, &bg, fail) // compression and repair, beside the workers
	for w := 0; w < workers; w++ {
		models[w] = model{}
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			r := rand.New(rand.NewSource(seed + int64(w)))
			m := models[w]
			key := func() []byte { return []byte(fmt.Sprintf("%04d.%d", r.Intn(300), w)) }
			for op := 0; op < ops && !failed.Load(); op++ {
				k := key()
				v := []byte(fmt.Sprintf("v%d.%d", w, op))
				if r.Intn(2) == 0 {
					v = []byte(fmt.Sprintf("v%d.%d.%s", w, op, strings.Repeat("x", r.Intn(200))))
				}
				cur, found := m[string(k)]
				switch x := r.Intn(100); {
				case x < 45:
					res, err := tr.Put(ctx, k, v, Cond{Prev: true})
					if err != nil || res.Found != found || string(res.Prev) != cur {
						fail("worker %d op %d: put %q: %+v %v, model %v %q", w, op, k, res, err, found, cur)
						return
					}
					m[string(k)] = string(v)
				case x < 55:
					res, err := tr.Put(ctx, k, v, Cond{Kind: IfEquals, Value: []byte(cur)})
					if err != nil || res.Applied != found {
						fail("worker %d op %d: cas %q: %+v %v, model %v", w, op, k, res, err, found)
						return
					}
					if found {
						m[string(k)] = string(v)
					}
				case x < 85:
					res, err := tr.Delete(ctx, k, Cond{})
					if err != nil || res.Applied != found {
						fail("worker %d op %d: delete %q: %+v %v, model %v", w, op, k, res, err, found)
						return
					}
					delete(m, string(k))
				case x < 95:
					got, ok, err := tr.Get(ctx, k)
					if err != nil || ok != found || string(got) != cur {
						fail("worker %d op %d: get %q = %q %v %v, model %q %v", w, op, k, got, ok, err, cur, found)
						return
					}
				default:
					// A scan of the whole tree, filtered to this worker's keys:
					// they must be exactly the model's (others' keys change
					// under the scan, ours cannot).
					reverse := r.Intn(2) == 0
					var mine []string
					span := Span{}
					for {
						pg, err := tr.Scan(ctx, span, 0, reverse)
						if err != nil {
							fail("worker %d: scan: %v", w, err)
							return
						}
						for _, k := range pg.Keys {
							if bytes.HasSuffix(k, []byte(fmt.Sprintf(".%d", w))) {
								mine = append(mine, string(k))
							}
						}
						if !pg.More {
							break
						}
						if reverse {
							span.To = pg.Lo
						} else {
							span.From = pg.Hi
						}
					}
					want := m.span(nil, nil)
					if reverse {
						sort.Sort(sort.Reverse(sort.StringSlice(want)))
					}
					if fmt.Sprint(mine) != fmt.Sprint(want) {
						fail("worker %d op %d: scan (reverse %v) saw %d own keys, model %d", w, op, reverse, len(mine), len(want))
						return
					}
				}
			}
		}(w)
	}
	wg.Wait()
	close(stop)
	bg.Wait()
	if failed.Load() {
		return
	}
	all := model{}
	for _, m := range models {
		for k, v := range m {
			all[k] = v
		}
	}
	clk.ns.Add(int64(time.Second))
	for i := 0; i < 3; i++ {
		if _, err := tr.Repair(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	sh := checkShape(t, s, all, true)
	if inline != 0 && (sh.Values == 0 || tr.Stats.ValuesFreed.Load() == 0) {
		t.Fatalf("%d values in chunks at the end, %d freed: the workload tests too little of them", sh.Values, tr.Stats.ValuesFreed.Load())
	}
	t.Logf("%d values in chunks, %d freed, %d leaked", sh.Values, tr.Stats.ValuesFreed.Load(), tr.Stats.ValueLeaks.Load())
	t.Logf("%d keys, height %d, %d nodes; splits %d, merges %d, rebalances %d, freed %d, restarts %d, move-rights %d, onwards %d, repairs %d",
		len(all), sh.Height, sh.Nodes, tr.Stats.Splits.Load(), tr.Stats.Merges.Load(), tr.Stats.Rebalances.Load(),
		tr.Stats.Freed.Load(), tr.Stats.Restarts.Load(), tr.Stats.MoveRights.Load(), tr.Stats.Onwards.Load(), tr.Stats.Repairs.Load())
}

func TestTreeErrors(t *testing.T) {
	tr, s, _ := newMemTree(t, Config{})
	ctx := context.Background()
	if _, err := tr.Put(ctx, nil, []byte("v"), Cond{}); !errors.Is(err, ErrKey) {
		t.Fatalf("empty key: %v", err)
	}
	if _, err := tr.Put(ctx, make([]byte, MaxKey+1), nil, Cond{}); !errors.Is(err, ErrKey) {
		t.Fatalf("long key: %v", err)
	}
	if _, err := tr.Put(ctx, []byte("k"), make([]byte, MaxValue+1), Cond{}); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("a value over MaxValue: %v", err)
	}
	if n := len(s.Chunks()); n != 2 {
		t.Fatalf("a refused value left %d chunks, want the anchor and the root", n)
	}
	big := make([]byte, tr.Config().MaxInline-leafExtra-MaxKey)
	for i := 0; i < 40; i++ {
		k := bytes.Repeat([]byte{byte('a' + i)}, MaxKey)
		if _, err := tr.Put(ctx, k, big, Cond{}); err != nil {
			t.Fatalf("largest entry %d: %v", i, err)
		}
	}
	if _, err := tr.Scan(ctx, Span{From: []byte("b"), To: []byte("a")}, 0, false); !errors.Is(err, ErrBadRange) {
		t.Fatalf("inverted span: %v", err)
	}
	if _, err := Walk(ctx, s, true); err != nil {
		t.Fatal(err)
	}
	if _, err := New(s, 1, Config{NodeSize: 4096}); err == nil {
		t.Fatal("a 4 KiB node size was accepted")
	}
}

var errFlaky = errors.New("flaky store: commit refused")

// flakyStore refuses some commits, applying nothing: an operation whose
// own change is refused fails and changes nothing; one whose separator is
// refused succeeds and leaves a downlink missing, for Repair.
type flakyStore struct {
	Store
	r    *rand.Rand
	mu   sync.Mutex
	rate float64
}

func (f *flakyStore) Commit(ctx context.Context, nodes []*Node, a *Anchor, frees []Handle) (uint64, error) {
	f.mu.Lock()
	fail := f.r.Float64() < f.rate
	f.mu.Unlock()
	if fail {
		return 0, errFlaky
	}
	return f.Store.Commit(ctx, nodes, a, frees)
}

// TestTreeFailedCommits: with 10% of commits refused, every operation
// either fails having changed nothing or succeeds; downlinks left missing
// are found by the walker and put back by Repair.
func TestTreeFailedCommits(t *testing.T) {
	seed := seedFromEnv(t, time.Now().UnixNano())
	t.Logf("seed %d (GROVE_SEED replays)", seed)
	r := rand.New(rand.NewSource(seed))
	clk := &fakeClock{}
	ms, id := NewMemStore(clk.now)
	fs := &flakyStore{Store: ms, r: rand.New(rand.NewSource(seed + 1)), rate: 0.1}
	tr, err := New(fs, id, Config{MaxFanout: 4, Grace: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	m := model{}
	missing := 0
	for round := 0; round < 10; round++ {
		for op := 0; op < 300; op++ {
			k := randKey(r, 500)
			v := []byte(fmt.Sprint(op))
			if r.Intn(3) > 0 {
				res, err := tr.Put(ctx, k, v, Cond{})
				if errors.Is(err, errFlaky) {
					continue
				}
				if err != nil || !res.Applied {
					t.Fatalf("put: %+v %v", res, err)
				}
				m[string(k)] = string(v)
			} else {
				res, err := tr.Delete(ctx, k, Cond{})
				if errors.Is(err, errFlaky) {
					continue
				}
				if err != nil {
					t.Fatal(err)
				}
				if res.Applied {
					delete(m, string(k))
				}
				if _, err := tr.Compress(ctx, 0, k); err != nil && !errors.Is(err, errFlaky) {
					t.Fatal(err)
				}
			}
		}
		sh := checkShape(t, ms, m, false)
		missing += sh.Missing
		fs.rate = 0
		clk.ns.Add(int64(2 * time.Second))
		for i := 0; i < 5; i++ {
			if _, err := tr.Repair(ctx); err != nil {
				t.Fatal(err)
			}
		}
		checkShape(t, ms, m, true)
		fs.rate = 0.1
	}
	t.Logf("%d downlinks were missing before repairs; %d repaired", missing, tr.Stats.Repairs.Load())
	if missing == 0 {
		t.Fatal("no downlink was ever missing: the test exercises nothing")
	}
}

// TestFailingConditionalLargePutWritesNoChunk: a put-if-absent or
// compare-and-swap of a value in a chunk of its own whose condition fails
// allocates nothing (a lock-free read finds it fails first), and reports
// the current value as a failed condition does.
func TestFailingConditionalLargePutWritesNoChunk(t *testing.T) {
	tr, s, _ := newMemTree(t, Config{})
	ctx := context.Background()
	big := func(c byte) []byte { return bytes.Repeat([]byte{c}, 5000) }
	if _, err := tr.Put(ctx, []byte("k"), big('a'), Cond{}); err != nil {
		t.Fatal(err)
	}
	before := len(s.Chunks())
	r, err := tr.Put(ctx, []byte("k"), big('b'), Cond{Kind: IfAbsent})
	if err != nil || r.Applied || !r.Found || !bytes.Equal(r.Prev, big('a')) {
		t.Fatalf("put-if-absent over a present key: %+v %v", r.Applied, err)
	}
	r, err = tr.Put(ctx, []byte("k"), big('b'), Cond{Kind: IfEquals, Value: big('c')})
	if err != nil || r.Applied || !r.Found || !bytes.Equal(r.Prev, big('a')) {
		t.Fatalf("a failing CAS: %+v %v", r.Applied, err)
	}
	if n := len(s.Chunks()); n != before {
		t.Fatalf("failing conditional puts left %d chunks, %d before", n, before)
	}
	if r, err := tr.Put(ctx, []byte("k"), big('b'), Cond{Kind: IfEquals, Value: big('a')}); err != nil || !r.Applied {
		t.Fatalf("a CAS that holds: %+v %v", r.Applied, err)
	}
	if v, ok, err := tr.Get(ctx, []byte("k")); err != nil || !ok || !bytes.Equal(v, big('b')) {
		t.Fatalf("after the CAS: %d bytes %v %v", len(v), ok, err)
	}
	if n := len(s.Chunks()); n != before {
		t.Fatalf("a CAS that replaced a value left %d chunks, %d before", n, before)
	}
}

// latchWatch is a store that counts value reads made while an exclusive
// lock is held, and runs between once, after the first value read made
// with no lock held (to change the tree between a lock-free read and the
// locked path).
type latchWatch struct {
	Store
	mu        sync.Mutex
	exclusive int
	under     int
	between   func()
}

func (w *latchWatch) Lock(ctx context.Context, h Handle, mode lock.Mode) (*Node, error) {
	n, err := w.Store.Lock(ctx, h, mode)
	if err == nil && mode == lock.Exclusive {
		w.mu.Lock()
		w.exclusive++
		w.mu.Unlock()
	}
	return n, err
}

func (w *latchWatch) Unlock(h Handle, mode lock.Mode) {
	if mode == lock.Exclusive {
		w.mu.Lock()
		w.exclusive--
		w.mu.Unlock()
	}
	w.Store.Unlock(h, mode)
}

func (w *latchWatch) ReadValue(ctx context.Context, r ValueRef) ([]byte, error) {
	w.mu.Lock()
	held := w.exclusive > 0
	if held {
		w.under++
	}
	f := w.between
	if !held {
		w.between = nil
	}
	w.mu.Unlock()
	v, err := w.Store.ReadValue(ctx, r)
	if f != nil && !held {
		f()
	}
	return v, err
}

// A compare-and-swap or compare-and-delete against a value in a chunk of
// its own compares with a lock-free read of it, not with a read of the
// chunk while the leaf is held exclusively; if the key was overwritten
// between (another chunk), the locked path reads the new value and the
// condition fails on it.
func TestLargeCompareReadsNoChunkUnderLock(t *testing.T) {
	clk := &fakeClock{}
	ms, id := NewMemStore(clk.now)
	w := &latchWatch{Store: ms}
	tr, err := New(w, id, Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	big := func(c byte) []byte { return bytes.Repeat([]byte{c}, 5000) }
	k := []byte("k")
	if _, err := tr.Put(ctx, k, big('a'), Cond{}); err != nil {
		t.Fatal(err)
	}
	if r, err := tr.Put(ctx, k, big('b'), Cond{Kind: IfEquals, Value: big('a')}); err != nil || !r.Applied || !bytes.Equal(r.Prev, big('a')) {
		t.Fatalf("CAS a→b: %+v %v", r.Applied, err)
	}
	if r, err := tr.Put(ctx, k, []byte("small"), Cond{Kind: IfEquals, Value: big('b'), Prev: true}); err != nil || !r.Applied || !bytes.Equal(r.Prev, big('b')) {
		t.Fatalf("CAS b→small: %+v %v", r.Applied, err)
	}
	if _, err := tr.Put(ctx, k, big('c'), Cond{}); err != nil {
		t.Fatal(err)
	}
	if r, err := tr.Delete(ctx, k, Cond{Kind: IfEquals, Value: big('c')}); err != nil || !r.Applied {
		t.Fatalf("compare-and-delete c: %+v %v", r.Applied, err)
	}
	if w.under != 0 {
		t.Fatalf("%d value chunks read holding a leaf exclusively", w.under)
	}
	// Overwritten between the lock-free read and the lock: the locked
	// path reads the new chunk and the condition fails on it.
	if _, err := tr.Put(ctx, k, big('d'), Cond{}); err != nil {
		t.Fatal(err)
	}
	w.between = func() {
		if _, err := tr.Put(ctx, k, big('e'), Cond{}); err != nil {
			t.Error(err)
		}
	}
	r, err := tr.Put(ctx, k, big('f'), Cond{Kind: IfEquals, Value: big('d')})
	if err != nil || r.Applied || !bytes.Equal(r.Prev, big('e')) {
		t.Fatalf("CAS d→f after an overwrite with e: applied %v, prev %.1q, %v", r.Applied, r.Prev, err)
	}
	if w.under != 1 {
		t.Fatalf("%d value chunks read holding a leaf exclusively; want 1 (the overwrite's)", w.under)
	}
	if v, ok, err := tr.Get(ctx, k); err != nil || !ok || !bytes.Equal(v, big('e')) {
		t.Fatalf("get: %.1q %v %v", v, ok, err)
	}
}
