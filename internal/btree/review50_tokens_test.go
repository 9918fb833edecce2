package btree

// Review 50 (outside review of 2e6cf52, completion records of tokened
// writes): each test demonstrates one defect and fails while it is there.
//
//	go test ./internal/btree/ -run 'TestReview50' -count=1 -v

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// A first attempt's ErrTokenExpired was documented as "nothing was done,
// and never will" (the client may send the write again under a new
// token), though it can be answered while another attempt of the same
// write applied: the attempt number is no evidence that no other attempt
// exists once attempts may be sent together or delivered late. Two ways:
// the applied attempt's record was evicted (one server, no skew); or the
// age check on a server whose clock is ahead refuses attempt 1 while a
// server whose clock is behind, later in true time, applies attempt 2.
//
// Fixed by the contract (completion.go): a refusal says only that this
// attempt did nothing and that the write's record may be gone; the
// client, which knows whether it sent another attempt, decides (the
// shipped client: TestClientTokenAnswers, "an attempt of unknown outcome,
// then too old: unknown"; the simulator's clients likewise). What is left
// to check here: the refused attempt did nothing, in both ways.
func TestReview50ExpiredContradictsApplied(t *testing.T) {
	ctx := context.Background()
	t.Run("evicted", func(t *testing.T) {
		tr, _, clk := newTokTree(t, Config{})
		applied := map[uint64]int{}
		tr.onOutcome = func(tk WriteToken, key []byte, ok bool) {
			if ok && tk.Client[0] == 1 {
				applied[tk.Seq]++
			}
		}
		stamp := clk.now()
		// Attempt 2 is served first (attempt 1 is in flight beside it,
		// or delayed by a paused server).
		if r, err := tr.PutOnce(ctx, []byte("hot"), []byte("A"), Cond{}, tok(1, 1, 2, stamp)); err != nil || !r.Applied {
			t.Fatalf("attempt 2: %+v %v", r, err)
		}
		// Other clients' tokened writes to the leaf evict its record.
		for seq := uint64(1); tr.Stats.RecordsEvicted.Load() == 0; seq++ {
			clk.ns.Add(1000)
			if _, err := tr.PutOnce(ctx, []byte("hot"), []byte(fmt.Sprint(seq)), Cond{}, tok(2, seq, 1, clk.now())); err != nil {
				t.Fatal(err)
			}
		}
		_, err := tr.PutOnce(ctx, []byte("hot"), []byte("A"), Cond{}, tok(1, 1, 1, stamp))
		if !errors.Is(err, ErrTokenExpired) || applied[1] != 1 {
			t.Errorf("the late attempt 1: %v, the write applied %d times", err, applied[1])
		}
	})
	t.Run("skew", func(t *testing.T) {
		tr, _, clk := newTokTree(t, Config{})
		applied := 0
		tr.onOutcome = func(tk WriteToken, key []byte, ok bool) {
			if ok {
				applied++
			}
		}
		stamp := clk.now()
		// Server A, clock ClockSkew ahead: true time stamp+W-skew, reads stamp+W.
		clk.ns.Store(stamp + int64(TokenWindow))
		_, err1 := tr.PutOnce(ctx, []byte("k"), []byte("v"), Cond{}, tok(1, 1, 1, stamp))
		// Server B, clock ClockSkew behind: true time stamp+W+skew-1 (later
		// than A's), reads stamp+W-1. (One store: the clock going back
		// stands for the other server's clock.)
		clk.ns.Store(stamp + int64(TokenWindow) - 1)
		r2, err2 := tr.PutOnce(ctx, []byte("k"), []byte("v"), Cond{}, tok(1, 1, 2, stamp))
		if !errors.Is(err1, ErrTokenExpired) || err2 != nil || !r2.Applied || applied != 1 {
			t.Errorf("attempt 1: %v; attempt 2: %+v %v; applied %d times", err1, r2, err2, applied)
		}
	})
}

// The horizon's 10 bytes (and a version 2 image's) are outside
// entriesSize, which fits goes by, and trimDone can only evict records: a
// leaf with a horizon whose entries fill it to within 10 bytes of
// NodeSize is committed as an image larger than NodeSize (its chunk's
// size: the write-back's write is out of range; a read of NodeSize bytes
// gets a truncated image).
func TestReview50HorizonOverflowsNode(t *testing.T) {
	ctx := context.Background()
	tr, s, clk := newTokTree(t, Config{})
	for seq := uint64(1); tr.Stats.RecordsEvicted.Load() == 0; seq++ {
		clk.ns.Add(1000)
		if _, err := tr.PutOnce(ctx, []byte("hot"), []byte("x"), Cond{}, tok(1, seq, 1, clk.now())); err != nil {
			t.Fatal(err)
		}
	}
	// Every image the store holds is checked after each put.
	check := func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		for h, n := range s.mu.images {
			if img := n.Encode(nil); len(img) > tr.cfg.NodeSize {
				_, err := decode(img[:tr.cfg.NodeSize])
				t.Fatalf("node %v: a committed image of %d bytes in a %d-byte node (its chunk read back: %v; horizon %d, %d records, entries %d bytes)",
					h, len(img), tr.cfg.NodeSize, err, n.Horizon, len(n.Done), n.entriesSize())
			}
		}
	}
	root := func() *Node {
		a, err := s.Anchor(ctx)
		if err != nil {
			t.Fatal(err)
		}
		n, err := s.Read(ctx, a.Root)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	size := tr.cfg.NodeSize
	// Fill the leaf's entries to within a byte or two of NodeSize, each
	// way the last entry can land: before the fix the image passed the
	// node size by the horizon's 10 bytes; now the leaf splits.
	for i := 0; root().Leaf() && i < 40; i++ {
		k := []byte(fmt.Sprintf("f%03d", i))
		room := size - root().entriesSize()
		v := 1000
		if room <= 1300 {
			v = room - leafExtra - len(k) - i%3
		}
		if _, err := tr.Put(ctx, k, make([]byte, max(v, 1)), Cond{}); err != nil {
			t.Fatal(err)
		}
		check()
	}
}

// A token reused for a write to a key in another leaf is not refused
// (ErrTokenReused is found only within one leaf), so two records of one
// token exist; when compression brings them into one leaf, its image fails
// Check: the MemStore panics at the commit; the cache commits it without a
// check, and the image then fails to decode (ErrCorrupt) when read back.
// A client's defect becomes a corrupt leaf.
func TestReview50ReusedTokenAcrossLeavesCorruptsMerge(t *testing.T) {
	ctx := context.Background()
	tr, s, clk := newTokTree(t, Config{MaxFanout: 4})
	var keys []string
	for i := 0; i < 12; i++ {
		keys = append(keys, fmt.Sprintf("k%02d", i))
		if _, err := tr.Put(ctx, []byte(keys[i]), []byte("v"), Cond{}); err != nil {
			t.Fatal(err)
		}
	}
	same := tok(9, 1, 1, clk.now())
	if _, err := tr.PutOnce(ctx, []byte("k00"), []byte("x"), Cond{}, same); err != nil {
		t.Fatal(err)
	}
	r, err := tr.PutOnce(ctx, []byte("k11"), []byte("y"), Cond{}, same)
	if err == nil && r.Applied {
		t.Logf("the token reused for a key in another leaf applied (not ErrTokenReused)")
	}
	var panicked any
	func() {
		defer func() { panicked = recover() }()
		for _, k := range keys[1:11] {
			if _, err := tr.Delete(ctx, []byte(k), Cond{}); err != nil {
				t.Fatal(err)
			}
		}
		for pass := 0; pass < 10; pass++ {
			for _, k := range keys {
				if _, err := tr.Compress(ctx, 0, []byte(k)); err != nil {
					t.Fatal(err)
				}
			}
		}
	}()
	if panicked != nil {
		if strings.Contains(fmt.Sprint(panicked), "second record of one token") {
			t.Fatalf("compression committed a leaf image that fails Check: %v", panicked)
		}
		panic(panicked)
	}
	sh, err := Walk(ctx, s, true)
	t.Logf("no merge of the two records' leaves happened: %d leaves? %v", len(sh.Keys), err)
}
