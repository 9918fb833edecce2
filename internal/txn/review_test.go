package txn

// Review tests: each TestReview* replays one defect found in an outside
// review of internal/txn (a helper's, 2026-11-25), and failed before its
// fix. Two findings were documentation traps, fixed in the documentation
// (Checkpointer: write back every page whose first unwritten change is
// below upTo; Applier: apply every image, unconditionally), and have no
// test here.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/grovestore/grove/internal/lock"
	"github.com/grovestore/grove/internal/rldev"
)

func reviewOnly(t *testing.T) { t.Helper() }

// newRevDev is a fault-free simDev (no scheduled crash, no header-crash
// boost: crashAt far in the future).
func newRevDev(blocks uint64) *simDev {
	return &simDev{rng: rand.New(rand.NewPCG(1, 2)), blocks: blocks, rep: [2]map[uint64][]byte{{}, {}},
		degraded: map[uint64]bool{}, store: map[int][]byte{}, crashAt: 1 << 62, stats: &simStats{}}
}

func tok(seq uint64) rldev.Fence {
	return rldev.Fence{Name: "log", Token: lock.Token{Epoch: 1, Seq: seq}}
}

// revStore is an Applier over byte arrays by target (durable at once),
// fenced as a chunk's RLDev is: a write under a token older than one it
// admitted for the lock is refused.
type revStore struct {
	mu    sync.Mutex
	m     map[string][]byte
	admit map[string]lock.Token
}

func newRevStore() *revStore {
	return &revStore{m: map[string][]byte{}, admit: map[string]lock.Token{}}
}

func (s *revStore) put(target string, off uint64, data []byte) {
	_ = s.putFenced(target, off, data, nil)
}

func (s *revStore) putFenced(target string, off uint64, data []byte, f *rldev.Fence) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f != nil {
		if f.Token.Less(s.admit[f.Name]) {
			return rldev.ErrStaleToken
		}
		s.admit[f.Name] = f.Token
	}
	p := s.m[target]
	if need := int(off) + len(data); len(p) < need {
		p = append(p, make([]byte, need-len(p))...)
	}
	copy(p[off:], data)
	s.m[target] = p
	return nil
}

func (s *revStore) get(target string, off, n uint64) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]byte, n)
	p := s.m[target]
	if int(off) < len(p) {
		copy(out, p[off:])
	}
	return out
}

func (s *revStore) Apply(ctx context.Context, target []byte, off uint64, data []byte, lsn LSN, f *rldev.Fence) error {
	return s.putFenced(string(target), off, data, f)
}

func openRev(t *testing.T, d Device, f rldev.Fence, ap Applier) *Log {
	t.Helper()
	l, err := Open(context.Background(), Config{Device: d, Fence: f, Applier: ap, Manual: true})
	if err != nil {
		t.Fatalf("open under %v: %v", f.Token, err)
	}
	return l
}

var zero8 = make([]byte, 8)

// 1. Update returns "the page's new LSN for the write-ahead rule", and
// Flush(ctx, lsn) is documented as "the write-ahead rule for a client
// writing back a page whose last change is at lsn". But Flush makes
// durable only the records *below* lsn: the record at lsn itself is not
// covered. A client that follows the documentation writes back a page
// whose change is in no durable record; a crash then leaves an
// uncommitted update in the store. (The simulator's client flushes to
// lsn+1, which is why it never sees this.)
func TestReviewFlushAtUpdateLSNIsNotWriteAhead(t *testing.T) {
	reviewOnly(t)
	ctx := context.Background()
	d, st := newRevDev(64), newRevStore()
	l := openRev(t, d, tok(1), st)
	tx := l.Begin()
	lsn, err := tx.Update(ctx, []byte("p"), 0, []byte("UNCOMMIT"), zero8)
	if err != nil {
		t.Fatal(err)
	}
	// The write-ahead rule as documented: flush to the page's LSN, then write the page back.
	if err := l.Flush(ctx, lsn); err != nil {
		t.Fatal(err)
	}
	st.put("p", 0, []byte("UNCOMMIT"))
	durable := l.Durable()
	// The owner dies; the transaction never committed.
	openRev(t, d, tok(2), st)
	if got := st.get("p", 0, 8); !bytes.Equal(got, zero8) {
		t.Errorf("an uncommitted update survived recovery: store holds %q. Flush(ctx, %d) returned with durable=%d, so the record at %d was never written", got, lsn, durable, lsn)
	}
}

// 3. Recover's fence stops the log writes of a deposed recovery, but not
// its Applier writes: Applier.Apply carries no token and ChunkApplier
// writes chunks unfenced. A recovery that stalls in its replay (GC pause,
// partition, lease lost) while another node recovers, and whose in-flight
// image lands afterwards, overwrites the new owner's committed and
// checkpointed data with an image from the old log (here the redo image
// of a loser).
type gateApplier struct {
	st       *revStore
	reached  chan struct{}
	release  chan struct{}
	calls    int
	applied  []byte
	deadNext bool
}

func (g *gateApplier) Apply(ctx context.Context, target []byte, off uint64, data []byte, lsn LSN, f *rldev.Fence) error {
	g.calls++
	if g.calls == 1 {
		close(g.reached)
		<-g.release
		_ = g.st.putFenced(string(target), off, data, f) // the in-flight write arrives late
		g.applied = bytes.Clone(data)
		return errors.New("the recovering node died after its write was sent")
	}
	return g.st.Apply(ctx, target, off, data, lsn, f)
}

type allCkpt struct{}

func (allCkpt) WriteBack(context.Context, LSN) error { return nil }

func TestReviewDeposedRecoveryApplyIsNotFenced(t *testing.T) {
	reviewOnly(t)
	ctx := context.Background()
	d, st := newRevDev(64), newRevStore()
	l1 := openRev(t, d, tok(1), st)
	x := l1.Begin()
	if _, err := x.Update(ctx, []byte("p"), 0, []byte("XXXXXXXX"), zero8); err != nil {
		t.Fatal(err)
	}
	if err := l1.FlushNow(ctx); err != nil {
		t.Fatal(err)
	}
	// l1's node dies; x never committed.
	g := &gateApplier{st: st, reached: make(chan struct{}), release: make(chan struct{})}
	done := make(chan error, 1)
	go func() {
		_, err := Open(ctx, Config{Device: d, Fence: tok(2), Applier: g, Manual: true})
		done <- err
	}()
	<-g.reached // recovery 2 is stalled inside its first redo
	l3 := openRev(t, d, tok(3), st)
	if got := st.get("p", 0, 8); !bytes.Equal(got, zero8) {
		t.Fatalf("recovery 3 left %q", got)
	}
	y := l3.Begin()
	lsn, err := y.Update(ctx, []byte("p"), 0, []byte("YYYYYYYY"), zero8)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := y.Commit(ctx, true); err != nil { // acknowledged
		t.Fatal(err)
	}
	if err := l3.Flush(ctx, lsn+1); err != nil {
		t.Fatal(err)
	}
	if err := st.putFenced("p", 0, []byte("YYYYYYYY"), l3.Fence()); err != nil { // written back under the write-ahead rule, fenced
		t.Fatal(err)
	}
	l3.cfg.Checkpointer = allCkpt{}
	if err := l3.Checkpoint(ctx); err != nil {
		t.Fatal(err)
	}
	close(g.release) // recovery 2's in-flight image lands
	err2 := <-done
	openRev(t, d, tok(4), st) // and a later recovery cannot repair it: the log no longer holds Y
	if got := st.get("p", 0, 8); !bytes.Equal(got, []byte("YYYYYYYY")) {
		t.Errorf("acknowledged, checkpointed commit overwritten by a deposed recovery's replay: store holds %q (recovery 2 ended with %v)", got, err2)
	}
}

// 4. Recover accepts a token equal to the header's writer (it refuses only
// an older one), and Open hands the same token to the new owner. A holder
// that reopens its log under the token it still holds (the natural thing
// after "log flush ... failed": the lock was never lost) gets a log whose
// floor no longer excludes the blocks its own failed flush left beyond the
// end. Transaction ids restart at 1 in every session, so a commit record
// of the failed flush is later read as the commit of a new, uncommitted
// transaction with the same id.
type cutDev struct {
	*simDev
	cutNext bool // the next multi-block write lands its blocks after the first only, then fails
}

func (c *cutDev) Write(ctx context.Context, block uint64, data []byte, f *rldev.Fence) error {
	if c.cutNext && len(data) > BlockSize {
		c.cutNext = false
		if err := c.simDev.Write(ctx, block+1, data[BlockSize:], f); err != nil {
			return err
		}
		return errors.New("sim: write cut (the first block never landed)")
	}
	return c.simDev.Write(ctx, block, data, f)
}

func TestReviewSameTokenReopenResurrectsFailedFlush(t *testing.T) {
	reviewOnly(t)
	ctx := context.Background()
	d, st := &cutDev{simDev: newRevDev(64)}, newRevStore()
	l1 := openRev(t, d, tok(1), st)
	a := l1.Begin() // id 1
	if _, err := a.Update(ctx, []byte("a"), 0, []byte("AAAAAAAA"), zero8); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Commit(ctx, true); err != nil {
		t.Fatal(err)
	}
	// Transaction 2: one update that fills its block exactly, then its
	// commit, which starts the next block at offset 0. The flush is cut:
	// only the commit's block lands.
	b := l1.Begin() // id 2
	big := make([]byte, 2009)
	r := Record{Kind: KindUpdate, Txn: b.ID(), Target: []byte("big"), Redo: big, Undo: big}
	if r.Size() != Payload {
		t.Fatalf("record of %d bytes, want %d", r.Size(), Payload)
	}
	if _, err := b.Update(ctx, []byte("big"), 0, big, big); err != nil {
		t.Fatal(err)
	}
	d.cutNext = true
	if _, err := b.Commit(ctx, true); err == nil {
		t.Fatal("the cut flush succeeded")
	}
	// The same holder reopens under the token it still holds: refused (a
	// recovery must outrank every earlier writer); before the fix, the
	// failed flush's commit was later taken for a new transaction's.
	if _, err := Open(ctx, Config{Device: d, Fence: tok(1), Applier: st, Manual: true}); !errors.Is(err, ErrFenced) {
		t.Fatalf("reopen under the same token: %v, want ErrFenced", err)
	}
	l2, err := Open(ctx, Config{Device: d, Fence: tok(2), Applier: st, Manual: true})
	if err != nil {
		t.Fatal(err)
	}
	c1 := l2.Begin() // id 1 again
	if _, err := c1.Update(ctx, []byte("c"), 0, []byte("CCCCCCCC"), zero8); err != nil {
		t.Fatal(err)
	}
	if _, err := c1.Commit(ctx, false); err != nil {
		t.Fatal(err)
	}
	c2 := l2.Begin() // id 2 again: never commits
	if _, err := c2.Update(ctx, []byte("d"), 0, []byte("DDDDDDDD"), zero8); err != nil {
		t.Fatal(err)
	}
	if err := l2.FlushNow(ctx); err != nil { // one block: the failed flush's second block stays after it
		t.Fatal(err)
	}
	// The owner dies; a new owner recovers under a newer token.
	l3 := openRev(t, d, tok(3), st)
	rep := l3.Recovered()
	if got := st.get("d", 0, 8); !bytes.Equal(got, zero8) {
		t.Errorf("uncommitted transaction %d survived: store holds %q for it; recovery committed %v (the commit of the failed flush's transaction %d was taken for it; scan: %s)",
			c2.ID(), got, rep.Committed, b.ID(), rep.Why)
	}
}

// 5. Commit and Abort append the end record, unlock, and only then note it
// in `ending` (Log.ended / endingLocked). A flush that runs in between makes
// the end record durable while the transaction is not yet in `ending`, so
// durableLocked does not drop it from `active`; it stays there until some
// later flush. With nothing more to flush (e.g. the ring is full, so no
// append succeeds), Checkpoint can never move the head past the
// transaction's first record: ErrLogFull for good. The test races a
// flusher against lazy commits and reports a transaction pinned that way.
type lockedDev struct {
	mu sync.Mutex
	d  *simDev
}

func (l *lockedDev) Blocks() uint64 { return l.d.Blocks() }
func (l *lockedDev) Write(ctx context.Context, b uint64, data []byte, f *rldev.Fence) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.d.Write(ctx, b, data, f)
}
func (l *lockedDev) ReadReplica(ctx context.Context, r int, b, n uint64) ([]byte, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.d.ReadReplica(ctx, r, b, n)
}
func (l *lockedDev) WriteReplica(ctx context.Context, r int, b uint64, data []byte, f *rldev.Fence) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.d.WriteReplica(ctx, r, b, data, f)
}

func TestReviewEndRecordFlushedBeforeEndingPinsHead(t *testing.T) {
	reviewOnly(t)
	ctx := context.Background()
	d := &lockedDev{d: newRevDev(HeaderBlocks + 4096)}
	l := openRev(t, d, tok(1), newRevStore())
	l.cfg.Checkpointer = allCkpt{}
	// found: a transaction whose end record is durable, noted in ending,
	// and still active (the state a later flush is needed to clear).
	var found string
	for round := 0; round < 200 && found == ""; round++ {
		stop := make(chan struct{})
		var bg sync.WaitGroup
		bg.Add(2)
		go func() { // a group-commit flusher
			defer bg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				_ = l.FlushNow(ctx)
			}
		}()
		go func() { // watches for the state
			defer bg.Done()
			for found == "" {
				select {
				case <-stop:
					return
				default:
				}
				l.mu.Lock()
				for id, e := range l.mu.ending {
					if first, ok := l.mu.active[id]; ok && e < l.mu.durable {
						found = fmt.Sprintf("transaction %d: end record at %d, durable to %d, still active from %d (head %d)", id, e, l.mu.durable, first, l.mu.head)
					}
				}
				l.mu.Unlock()
			}
		}()
		var wg sync.WaitGroup
		errs := make(chan error, 64)
		for c := 0; c < 24; c++ {
			wg.Add(1)
			go func() { // committers
				defer wg.Done()
				for i := 0; i < 4; i++ {
					tx := l.Begin()
					if _, err := tx.Update(ctx, fmt.Appendf(nil, "p%d", c), 0, []byte("VVVVVVVV"), zero8); err != nil {
						errs <- err
						return
					}
					if _, err := tx.Commit(ctx, false); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		close(stop)
		bg.Wait()
		select {
		case err := <-errs:
			t.Fatal(err)
		default:
		}
		if err := l.FlushNow(ctx); err != nil {
			t.Fatal(err)
		}
		if err := l.Checkpoint(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if found != "" {
		t.Errorf("%s: a flush ran between the end record's append and Log.ended/endingLocked, so durableLocked kept it in active; until another flush of new records, Checkpoint cannot move the head past it (with a full ring: ErrLogFull for good)", found)
		return
	}
	// Fixed: the end record is noted with its append, so no flush can
	// fall between (the test found the state every run before the fix).
}

// 6. ErrLogFull says "the transaction should abort", but Abort must append
// a compensation record per update and an abort record, with no space
// reserved for them: a transaction that filled the ring can neither commit
// nor abort, it holds the head, Checkpoint cannot move it, and every other
// transaction gets ErrLogFull until the log is recovered (a restart).
func TestReviewAbortNeedsLogSpace(t *testing.T) {
	reviewOnly(t)
	ctx := context.Background()
	d, st := newRevDev(HeaderBlocks+8), newRevStore()
	l := openRev(t, d, tok(1), st)
	l.cfg.Checkpointer = allCkpt{}
	tx := l.Begin()
	img := make([]byte, 3000)
	n := 0
	for ; n < 100; n++ {
		_, err := tx.Update(ctx, []byte("t"), uint64(n)*3000, img, img)
		if errors.Is(err, ErrLogFull) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := l.FlushNow(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Checkpoint(ctx); err != nil {
		t.Fatal(err)
	}
	abortErr := tx.Abort(ctx, nil)
	if err := l.Checkpoint(ctx); err != nil {
		t.Fatal(err)
	}
	other := l.Begin()
	_, otherErr := other.Update(ctx, []byte("u"), 0, []byte("x"), []byte("y"))
	if abortErr != nil {
		t.Errorf("after %d updates filled the ring (ErrLogFull), Abort fails: %v; and the log stays wedged for everyone: a new transaction's 1-byte update gets %v (head %d, ring %d blocks)",
			n, abortErr, otherErr, l.Stats().Head, l.Stats().RingBlocks)
	}
}

// 8. Regression in 564e543 ("a replica whose one header slot is blank and
// the other torn holds a new log"). The premise "any later header write
// writes the blank slot" holds for the log, not for one replica: a cut
// checkpoint header (slot 0) can land on replica A only, and a cut
// pre-header of the next recovery (slot 1) can tear slot 1 on replica B
// only. B then reads blank+torn and a recovery reading B alone takes the
// log for new: it replays from 0 WITHOUT writing a pre-header (the NewLog
// path skips it), so when it crashes half-way its replay is outranked by
// nothing, and the next recovery, reading A's checkpoint header, starts
// from that header's head and never redoes the records the crashed replay
// rolled back to older images. An acknowledged commit is lost.
type hdrCutDev struct {
	*simDev
	plan [][2]string // per cut header write: replica 0 and 1: "land", "torn" or "none"
}

func (c *hdrCutDev) Write(ctx context.Context, block uint64, data []byte, f *rldev.Fence) error {
	if block >= FenceBlock || len(c.plan) == 0 {
		return c.simDev.Write(ctx, block, data, f)
	}
	p := c.plan[0]
	c.plan = c.plan[1:]
	if err := c.admit(f); err != nil {
		return err
	}
	for r := 0; r < 2; r++ {
		if c.down[r] || c.stale[r] {
			continue
		}
		switch p[r] {
		case "land":
			c.put(r, block, data)
		case "torn":
			torn := bytes.Clone(c.get(r, block))
			copy(torn[:40], data[:40])
			c.rep[r][block] = torn
		}
	}
	return errCrashed
}

// crashApplier applies the first n images, then fails (the node dies).
type crashApplier struct {
	st *revStore
	n  int
}

func (a *crashApplier) Apply(ctx context.Context, target []byte, off uint64, data []byte, lsn LSN, f *rldev.Fence) error {
	if a.n == 0 {
		return errCrashed
	}
	a.n--
	return a.st.Apply(ctx, target, off, data, lsn, f)
}

func TestReviewBlankTornHeaderTakenForNewLog(t *testing.T) {
	reviewOnly(t)
	ctx := context.Background()
	d, st := &hdrCutDev{simDev: newRevDev(64)}, newRevStore()
	l1 := openRev(t, d, tok(1), st) // header gen 1 in slot 1, on both
	var prev []byte = zero8
	for _, v := range []string{"AAAAAAAA", "BBBBBBBB"} {
		tx := l1.Begin()
		if _, err := tx.Update(ctx, []byte("x"), 0, []byte(v), prev); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Commit(ctx, true); err != nil { // acknowledged
			t.Fatal(err)
		}
		prev = []byte(v)
	}
	st.put("x", 0, []byte("BBBBBBBB")) // written back (the log is durable past it)
	l1.cfg.Checkpointer = allCkpt{}
	d.plan = [][2]string{{"land", "none"}} // the checkpoint header (gen 2, slot 0) lands on A only
	if err := l1.Checkpoint(ctx); err == nil {
		t.Fatal("the cut checkpoint succeeded")
	}
	// Recovery 2 reads A's checkpoint header; its pre-header (gen 3, slot 1)
	// is cut: B's slot 1 torn, A's untouched.
	d.plan = [][2]string{{"none", "torn"}}
	if _, err := Open(ctx, Config{Device: d, Fence: tok(2), Applier: st, Manual: true}); err == nil {
		t.Fatal("recovery 2 was not cut")
	}
	h0, e0 := DecodeHeader(d.get(1, 0))
	h1, e1 := DecodeHeader(d.get(1, 1))
	t.Logf("replica B: slot 0 %+v %v, slot 1 %+v %v", h0, e0, h1, e1)
	// A goes down; recovery 3 reads B alone and is cut after one image.
	d.down[0] = true
	_, err3 := Open(ctx, Config{Device: d, Fence: tok(3), Applier: &crashApplier{st: st, n: 1}, Manual: true})
	// A comes back (resynced from B); recovery 4 reads both.
	d.resync(0)
	l4 := openRev(t, d, tok(4), st)
	rep := l4.Recovered()
	if got := st.get("x", 0, 8); !bytes.Equal(got, []byte("BBBBBBBB")) {
		t.Errorf("acknowledged commit lost: x holds %q. Recovery 3 (%v) took B's blank+torn header slots for a new log and replayed from 0 with no pre-header; recovery 4 acted on A's checkpoint header %+v and replayed nothing", got, err3, rep.Header)
	}
}
