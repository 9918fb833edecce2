package txn

import (
	"bytes"
	"context"
	"testing"
)

// Redo-only updates (no undo image, for a no-steal user such as the B-tree
// cache): the log takes them; an abort logs no compensation for them; a
// committed one is replayed; a loser's is not rolled back (its target never
// had it) and nothing else is written for it; an update whose undo differs
// in size from its redo is still refused.
func TestRedoOnlyUpdates(t *testing.T) {
	ctx := context.Background()
	d, st := newRevDev(64), newRevStore()
	l := openRev(t, d, tok(1), st)
	if _, err := l.Begin().Update(ctx, []byte("x"), 0, []byte("LONG"), []byte("AB")); err == nil {
		t.Fatal("an update whose undo is shorter than its redo (and not empty) was taken")
	}
	ab := l.Begin()
	if _, err := ab.Update(ctx, []byte("a"), 0, []byte("ABORTED!"), nil); err != nil {
		t.Fatal(err)
	}
	before := l.Stats()
	if err := ab.Abort(ctx, func(Record) error {
		t.Error("an abort asked to undo a redo-only update")
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	committed := l.Begin()
	if _, err := committed.Update(ctx, []byte("c"), 0, []byte("COMMITD!"), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := committed.Commit(ctx, true); err != nil {
		t.Fatal(err)
	}
	loser := l.Begin()
	end, err := loser.Update(ctx, []byte("u"), 0, []byte("UNCOMMIT"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Flush(ctx, end); err != nil {
		t.Fatal(err)
	}
	t.Logf("log before the crash: %+v (before the abort: %+v)", l.Stats(), before)
	// The owner dies; the next one recovers the log.
	st.put("u", 0, []byte("ORIGINAL"))
	l2 := openRev(t, d, tok(2), st)
	defer l2.Close(ctx)
	if got := st.get("c", 0, 8); !bytes.Equal(got, []byte("COMMITD!")) {
		t.Errorf("the committed redo-only update was not replayed: %q", got)
	}
	if got := st.get("a", 0, 8); !bytes.Equal(got, make([]byte, 8)) {
		t.Errorf("the aborted redo-only update reached its target: %q", got)
	}
	if got := st.get("u", 0, 8); !bytes.Equal(got, []byte("ORIGINAL")) {
		t.Errorf("recovery wrote over the loser's target: %q", got)
	}
}
