package chunk

// Outside review 72 (a helper's): continuations and clocks that outlive
// their view, and the checkpoint-entries accounting after review 70.
// Each test asserts what the chunk store promises and fails on the
// current code.

import (
	"sort"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/lock"
)

// r72Crash1 kills node 1 (the primary) and lets node 2 take over,
// returning what a panic in the takeover said (nil: none).
func r72Crash1(h *rvH) (panicked any) {
	h.nodes[1].mg, h.nodes[1].mode, h.nodes[1].holds = nil, lock.None, 0
	h.dead[Subject{1, h.nodes[1].inc}] = true
	defer func() { panicked = recover() }()
	for i := 0; i < 4; i++ {
		h.now = h.now.Add(time.Second)
		h.tick(2)
	}
	return nil
}

// A reload re-quarantines every run the log's records freed that is free
// now, although the old primary's quarantine of it ended long ago and its
// checkpoint entries went to new chunks. coverRuns (review resv) merges
// only runs within one MaxChunk window: frees of chunks that are farther
// apart (here 64 MiB chunks, every other one freed) each come back as a
// checkpoint entry, and the new primary's map needs more entries than a
// slot holds. The takeover checkpoints at once (the log is half full)
// and panics ("a checkpoint of 3 blocks in a slot of 2"); so does every
// later takeover: the pair cannot fail over.
//
// Schedule (map of 71 blocks: 254 entries a slot; log 64 blocks): 200
// allocations of 64 MiB (two frames); 40 frees of every other one (a
// frame each: the log is 43 blocks, past half); the quarantine ends at
// the primary; 94 allocations of 4 KiB fill the map to 254 entries (best
// fit puts them all in one freed run). The primary dies; node 2 takes
// over: its load quarantines the 40 freed runs anew (none within 64 MiB
// of another): 254 chunks + 40 runs do not fit a slot.
func TestReview72ReloadFarApartFreesOverflowCheckpoint(t *testing.T) {
	const most = MaxChunk / BlockSize
	h := newRvH(t, 71, 300*most, reviewCfg())
	p := h.nodes[1].mg
	maxE := p.sup.Layout.MaxEntries()
	alloc := func(n int, size uint64) {
		t.Helper()
		var reqs []ReqID
		for i := 0; i < n; i++ {
			reqs = append(reqs, h.call(1, func(mg *Manager, env Env, req ReqID) []any { return mg.Allocate(env, req, size) }))
		}
		h.run()
		for _, q := range reqs {
			if r, ok := h.reply(1, q); !ok || r.Err != nil {
				t.Fatalf("allocation of %d bytes: %v %v", size, ok, r.Err)
			}
		}
	}
	alloc(200, MaxChunk)
	ids := make([]uint64, 0, len(p.m.chunks))
	for id := range p.m.chunks {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return p.m.chunks[ids[i]].Block < p.m.chunks[ids[j]].Block })
	for i := 0; i < 80; i += 2 {
		id := ids[i]
		if r := h.mustReply(1, h.call(1, func(mg *Manager, env Env, req ReqID) []any { return mg.Free(env, req, id) })); r.Err != nil {
			t.Fatalf("free: %v", r.Err)
		}
	}
	h.now = h.now.Add(h.cfg.Quarantine + time.Second)
	h.tick(1)
	if n := len(p.m.quarantined()); n != 0 {
		t.Fatalf("%d runs still quarantined", n)
	}
	alloc(int(maxE)-len(p.m.chunks)-p.m.quarantineEntries(), 4096) // (the map full: one entry kept for quarantine since the fix)
	t.Logf("old primary: %d chunks of %d entries, none quarantined; log %d of %d blocks (superblock seq %d)",
		len(p.m.chunks), maxE, p.logPos-blockLog, p.sup.Layout.LogBlocks, p.sup.Seq)
	if p.logPos-blockLog < uint64(p.sup.Layout.LogBlocks)/2 || p.sup.Seq != 1 {
		t.Fatal("the schedule needs a half-full log and no checkpoint since the frees")
	}
	if pan := r72Crash1(h); pan != nil {
		t.Fatalf("DEFECT: the takeover panicked: %v", pan)
	}
	n2 := h.nodes[2].mg
	if n2.st != stPrimary {
		t.Fatalf("node 2 is %s (%v)", n2.st, n2.why)
	}
	if _, err := r70ReadMap(t, h); err != nil {
		t.Errorf("the new primary's map does not decode: %v", err)
	}
}
