package chunk

import (
	"errors"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/lock"
)

// Owned allocations (Owner) through one pair's two real Managers (the rvH
// harness): the tag is in the map, at the secondary, in the checkpoint
// and the log a new primary reads; Disown, Free and Retire change what
// Owned lists; a retired owner's allocation is refused, a newer holder's
// of the same log is not.
func TestOwnedAllocations(t *testing.T) {
	// 71 blocks: a log of 64 blocks, so that the changes below fill it
	// and the primary checkpoints (owners go through a checkpoint too).
	h := newRvH(t, 71, 4096, reviewCfg())
	tok := func(seq uint64) lock.Token { return lock.Token{Epoch: 1, Seq: seq} }
	a, b := Owner{Log: 7, Token: tok(100)}, Owner{Log: 8, Token: tok(100)}
	alloc := func(o Owner) (Handle, error) {
		t.Helper()
		r := h.mustReply(1, h.call(1, func(mg *Manager, env Env, req ReqID) []any { return mg.AllocateOwned(env, req, 4096, o) }))
		return r.Handle, r.Err
	}
	mustAlloc := func(o Owner) uint64 {
		t.Helper()
		x, err := alloc(o)
		if err != nil {
			t.Fatalf("allocation for %v: %v", o, err)
		}
		return x.ID
	}
	owned := func(node NodeID, log uint64, below lock.Token) []uint64 {
		t.Helper()
		var all []uint64
		after := uint64(0)
		for {
			ids, more, err := h.nodes[node].mg.Owned(h.env(), log, below, after, 2)
			if err != nil {
				t.Fatalf("owned at node %d: %v", node, err)
			}
			all = append(all, ids...)
			if !more {
				return all
			}
			after = ids[len(ids)-1]
		}
	}
	call := func(f func(mg *Manager, env Env, req ReqID) []any) error {
		t.Helper()
		return h.mustReply(1, h.call(1, f)).Err
	}
	var as []uint64
	for i := 0; i < 5; i++ {
		as = append(as, mustAlloc(a))
	}
	plain := mustAlloc(Owner{})
	bs := []uint64{mustAlloc(b), mustAlloc(b)}
	if got := owned(1, 7, tok(101)); !reflect.DeepEqual(got, as) {
		t.Fatalf("log 7's chunks below seq 101: %v, want %v", got, as)
	}
	if got := owned(1, 7, tok(100)); len(got) != 0 {
		t.Fatalf("log 7's chunks below seq 100 (its own token): %v, want none", got)
	}
	if got := owned(1, 8, tok(101)); !reflect.DeepEqual(got, bs) {
		t.Fatalf("log 8's chunks: %v, want %v", got, bs)
	}
	// Disown two of a's, an unowned chunk and an id never handed out
	// (skipped); free another of a's.
	if err := call(func(mg *Manager, env Env, req ReqID) []any {
		return mg.Disown(env, req, []uint64{as[0], as[1], plain, 999999})
	}); err != nil {
		t.Fatalf("disown: %v", err)
	}
	if err := call(func(mg *Manager, env Env, req ReqID) []any { return mg.Disown(env, req, []uint64{as[0]}) }); err != nil {
		t.Fatalf("disown again (a retry): %v", err)
	}
	if err := call(func(mg *Manager, env Env, req ReqID) []any { return mg.Free(env, req, as[2]) }); err != nil {
		t.Fatalf("free: %v", err)
	}
	left := as[3:]
	if got := owned(1, 7, tok(101)); !reflect.DeepEqual(got, left) {
		t.Fatalf("after disown and free: %v, want %v", got, left)
	}
	if err := call(func(mg *Manager, env Env, req ReqID) []any { return mg.Disown(env, req, nil) }); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("an empty disown: %v, want ErrBadRequest", err)
	}
	// Retire log 7's owners below seq 101: a's allocations are refused, a
	// newer holder's (seq 102) are not, nor log 8's.
	if err := call(func(mg *Manager, env Env, req ReqID) []any { return mg.Retire(env, req, 7, tok(101)) }); err != nil {
		t.Fatalf("retire: %v", err)
	}
	if _, err := alloc(a); !errors.Is(err, ErrRetired) {
		t.Fatalf("a retired owner's allocation: %v, want ErrRetired", err)
	}
	next := mustAlloc(Owner{Log: 7, Token: tok(102)})
	bs = append(bs, mustAlloc(b))
	if err := call(func(mg *Manager, env Env, req ReqID) []any { return mg.Retire(env, req, 7, tok(50)) }); err != nil {
		t.Fatalf("an older retirement (nothing to do): %v", err)
	}
	if got := owned(1, 7, tok(101)); !reflect.DeepEqual(got, left) {
		t.Fatalf("after the retirement: %v, want %v", got, left)
	}
	if got := owned(1, 7, tok(200)); !reflect.DeepEqual(got, append(slices.Clone(left), next)) {
		t.Fatalf("log 7's chunks below seq 200: %v, want %v and %d", got, left, next)
	}
	// Enough single changes to fill the log: the primary checkpoints.
	gen := h.nodes[1].mg.sup.LogGen
	var filler []uint64
	for i := 0; i < 70; i++ {
		filler = append(filler, mustAlloc(Owner{Log: 9, Token: tok(5)}))
	}
	if h.nodes[1].mg.sup.LogGen == gen {
		t.Fatalf("70 changes did not fill the map's log (no checkpoint)")
	}
	h.nodes[1].mg.m.checkConsistent(t)
	h.nodes[2].mg.m.checkConsistent(t)
	// The secondary's map agrees.
	want := map[uint64]Owner{}
	for id, e := range h.nodes[1].mg.m.chunks {
		if !e.owner.IsZero() {
			want[id] = e.owner
		}
	}
	sec := map[uint64]Owner{}
	for id, e := range h.nodes[2].mg.m.chunks {
		if !e.owner.IsZero() {
			sec[id] = e.owner
		}
	}
	if !reflect.DeepEqual(sec, want) {
		t.Fatalf("the secondary's owners %v, the primary's %v", sec, want)
	}
	// The primary's node dies; the secondary takes over from the map on
	// its RLDev (checkpoint and log) and lists the same.
	h.nodes[1].mg, h.nodes[1].mode, h.nodes[1].holds = nil, lock.None, 0
	h.dead[Subject{1, 1}] = true
	for i := 0; i < 4 && h.nodes[2].mg.st != stPrimary; i++ {
		h.now = h.now.Add(time.Second)
		h.tick(2)
	}
	n2 := h.nodes[2].mg
	if n2.st != stPrimary {
		t.Fatalf("node 2 is %s, not primary", n2.st)
	}
	got := map[uint64]Owner{}
	for id, e := range n2.m.chunks {
		if !e.owner.IsZero() {
			got[id] = e.owner
		}
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("the new primary's owners %v, the old one's %v", got, want)
	}
	for i := 0; i < 10 && n2.primaryReady(h.env()) != nil; i++ {
		h.now = h.now.Add(time.Second)
		h.tick(2)
	}
	if l := owned(2, 9, tok(6)); !reflect.DeepEqual(l, filler) {
		t.Fatalf("log 9's chunks at the new primary: %d, want %d", len(l), len(filler))
	}
	r := h.mustReply(2, h.call(2, func(mg *Manager, env Env, req ReqID) []any { return mg.AllocateOwned(env, req, 4096, a) }))
	if !errors.Is(r.Err, ErrRetired) {
		t.Fatalf("a retired owner's allocation at the new primary: %v, want ErrRetired", r.Err)
	}
}

// checkConsistent checks the owned count against the entries.
func (m *chunkMap) checkConsistent(t *testing.T) {
	t.Helper()
	n := 0
	for _, e := range m.chunks {
		if !e.owner.IsZero() {
			n++
		}
	}
	if n != m.owned {
		t.Fatalf("the map counts %d owned chunks; %d have an owner", m.owned, n)
	}
}

// A retried commit of a reservation whose first commit is logged (the
// reservation closed at the primary) and not yet acknowledged by the
// secondary (which still has it open) is answered with that commit, once
// the secondary has it: answered "not open" at once, it let the clerk use
// the chunks it kept through the secondary, which called them reserved
// (the chunk simulation's seed 51 with owned clients).
func TestCommitRetryWaitsForTheFirst(t *testing.T) {
	h := newRvH(t, 600, 4096, reviewCfg())
	R := h.reserve(4096, 3).ID
	h.hold = holdUpdates // the secondary is slow
	first := h.commit(R, R+1, R+2)
	h.run()
	if _, ok := h.reply(1, first); ok {
		t.Fatalf("the first commit was answered before the secondary had it")
	}
	retry := h.commit(R, R+1, R+2)
	h.run()
	if r, ok := h.reply(1, retry); ok {
		t.Fatalf("the retry was answered (%v) before the secondary had the first commit", r.Err)
	}
	h.release()
	for _, q := range []ReqID{first, retry} {
		if r, ok := h.reply(1, q); !ok || r.Err != nil {
			t.Fatalf("commit %d: answered %v, %v; want OK", q, ok, r.Err)
		}
	}
	for _, id := range []uint64{R + 1, R + 2} {
		if ok, err := h.isChunk(2, id); !ok {
			t.Fatalf("chunk %d at the secondary after the commit's answer: %v", id, err)
		}
	}
	// A different list while the first is under way is told "not open"
	// once the first is done (its clerk frees what it did not keep).
	R2 := h.reserve(4096, 2).ID
	h.hold = holdUpdates
	first = h.commit(R2, R2+1)
	h.run()
	other := h.commit(R2, R2+1, R2+2)
	h.run()
	h.release()
	if r, ok := h.reply(1, other); !ok || !errors.Is(r.Err, ErrUnallocated) {
		t.Fatalf("a commit with another list: %v %v, want ErrUnallocated", ok, r.Err)
	}
}
