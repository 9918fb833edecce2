package chunk

import (
	"errors"
	"fmt"
	"testing"

	"github.com/grovestore/grove/internal/lock"
)

// TestReview40ZeroingEarlierMayLandNotMasked (outside review 40): one
// change allocates several chunks and zeroes each; the manager answered
// the allocations with the first zeroing error only. If that one was a
// plain failure and another zeroing said an earlier attempt of it may
// still land (ErrEarlierMayLand), the manager kept its map lock and token:
// only the quarantine's time bound stood between that late attempt and the
// space's next owner, a bound the gRPC data path does not keep. Now an
// ErrEarlierMayLand among them wins: the manager fails and takes the map
// lock again, under a newer token that fences the late attempt.
func TestReview40ZeroingEarlierMayLandNotMasked(t *testing.T) {
	h := newRvH(t, 600, 4096, reviewCfg())
	first := h.mustReply(1, h.call(1, func(mg *Manager, env Env, req ReqID) []any { return mg.Allocate(env, req, 4096) }))
	if first.Err != nil {
		t.Fatal(first.Err)
	}
	// A free's change waits for the secondary; two allocations queue
	// behind it and go together in the next change.
	h.hold = holdUpdates
	h.call(1, func(mg *Manager, env Env, req ReqID) []any { return mg.Free(env, req, first.Handle.ID) })
	h.run()
	a1 := h.call(1, func(mg *Manager, env Env, req ReqID) []any { return mg.Allocate(env, req, 4096) })
	a2 := h.call(1, func(mg *Manager, env Env, req ReqID) []any { return mg.Allocate(env, req, 4096) })
	h.run()
	zeroes := 0
	h.zeroErr = func(ZeroWrite) error {
		zeroes++
		if zeroes == 1 {
			return errors.New("EIO (injected)")
		}
		return fmt.Errorf("rldev 101: %w", ErrEarlierMayLand)
	}
	tok := h.nodes[1].tok
	h.release()
	if zeroes != 2 {
		t.Fatalf("setup: %d zeroings in the change, want the two allocations' together", zeroes)
	}
	for _, q := range []ReqID{a1, a2} {
		if r := h.mustReply(1, q); r.Err == nil {
			t.Fatalf("allocation %d succeeded with its zeroing failed", q)
		}
	}
	n := h.nodes[1]
	if n.mg.st != stFailed && n.mode != lock.None && n.tok == tok {
		t.Errorf("the manager is %s with the map lock (token %v) it held when a zeroing said an earlier attempt may still land: "+
			"the first zeroing error, a plain one, masked it", n.mg.st, n.tok)
	}
}
