package txn

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"strings"
	"testing"
)

// A loser mixing normal and redo-only updates on one target, next to an
// aborted and a committed transaction of both kinds: recovery redoes and
// then undoes the loser's normal updates, never applies its redo-only one,
// replays the committed redo-only one, and leaves the aborted one out.
func TestReview10MixedRecovery(t *testing.T) {
	ctx := context.Background()
	d, st := newRevDev(64), newRevStore()
	l := openRev(t, d, tok(1), st)
	st.put("L", 0, []byte("ORIGINAL"))
	st.put("A", 0, []byte("A-BEFORE"))

	ab := l.Begin()
	must := func(_ LSN, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(ab.Update(ctx, []byte("A"), 0, []byte("A-NORMAL"), []byte("A-BEFORE")))
	must(ab.Update(ctx, []byte("A"), 0, []byte("A-REDOON"), nil))
	must(ab.Update(ctx, []byte("A2"), 0, []byte("A2REDOON"), nil))
	// An abort failing midway (at the normal update), then retried.
	calls := 0
	if err := ab.Abort(ctx, func(Record) error { calls++; return context.Canceled }); err == nil {
		t.Fatal("the failing undo did not fail the abort")
	}
	if err := ab.Abort(ctx, func(r Record) error {
		calls++
		if r.RedoOnly() {
			t.Error("undo of a redo-only update")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if calls != 2 {
		t.Errorf("undo calls: %d, want 2", calls)
	}
	if l.mu.reserved != 0 {
		t.Errorf("log reserved %d after the abort", l.mu.reserved)
	}

	c := l.Begin()
	must(c.Update(ctx, []byte("C"), 0, []byte("C-REDOON"), nil))
	must(c.Update(ctx, []byte("C2"), 0, []byte("C2NORMAL"), zero8))
	must(c.Commit(ctx, false))

	lo := l.Begin()
	must(lo.Update(ctx, []byte("L"), 0, []byte("L-NORMAL"), []byte("ORIGINAL")))
	must(lo.Update(ctx, []byte("L"), 0, []byte("L-REDOON"), nil))
	end, err := lo.Update(ctx, []byte("L2"), 0, []byte("L2REDOON"), nil)
	must(end, err)
	if got, want := l.mu.reserved, lo.reserved; got != want {
		t.Errorf("log reserved %d, loser's %d", got, want)
	}
	if err := l.Flush(ctx, end); err != nil {
		t.Fatal(err)
	}
	// Simulate the aborted transaction's live undo not having reached A (no-steal).
	l2 := openRev(t, d, tok(2), st)
	defer l2.Close(ctx)
	for _, c := range []struct{ target, want string }{
		{"L", "ORIGINAL"}, {"L2", "\x00\x00\x00\x00\x00\x00\x00\x00"},
		{"A", "A-BEFORE"}, {"A2", "\x00\x00\x00\x00\x00\x00\x00\x00"},
		{"C", "C-REDOON"}, {"C2", "C2NORMAL"},
	} {
		if got := st.get(c.target, 0, 8); !bytes.Equal(got, []byte(c.want)) {
			t.Errorf("%s: %q, want %q", c.target, got, c.want)
		}
	}
}

// Review 10's finding: an older build (header version 1 only) read a log
// holding redo-only updates as ending at the first one, silently dropping
// every later record. Headers are now written as version 2, which such a
// build refuses; this build reads versions 1 and 2 and refuses any other.
func TestReview10HeaderVersion(t *testing.T) {
	b := EncodeHeader(Header{Gen: 3, Head: 7, Ring: 61})
	if v := binary.LittleEndian.Uint32(b[12:]); v != 2 {
		t.Fatalf("a header is written as version %d, want 2", v)
	}
	with := func(v uint32) []byte {
		c := append([]byte(nil), b...)
		binary.LittleEndian.PutUint32(c[12:], v)
		binary.LittleEndian.PutUint32(c[8:], crc32.Checksum(c[12:HeaderSize], castagnoli))
		return c
	}
	for _, v := range []uint32{1, 2} {
		if h, err := DecodeHeader(with(v)); err != nil || h.Gen != 3 || h.Head != 7 {
			t.Errorf("a version %d header: %+v, %v", v, h, err)
		}
	}
	for _, v := range []uint32{0, 3} {
		if _, err := DecodeHeader(with(v)); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "version") {
			t.Errorf("a version %d header: %v, want a version error", v, err)
		}
	}
}
