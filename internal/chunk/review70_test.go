package chunk

// Outside review 70 (a helper's). Each test asserts what the chunk store
// promises and fails on the current code.

import (
	"testing"
	"time"

	"github.com/grovestore/grove/internal/lock"
)

// r70ReadMap decodes the map as it is on the map RLDev (what every load
// reads): the current superblock and its checkpoint.
func r70ReadMap(t *testing.T, h *rvH) (Super, error) {
	t.Helper()
	s, err := PickSuper(h.mapDev[1*BlockSize:2*BlockSize], h.mapDev[2*BlockSize:3*BlockSize])
	if err != nil {
		return s, err
	}
	if s.CkBlocks == 0 {
		return s, nil
	}
	start := s.Layout.slotStart(s.Slot) * BlockSize
	_, err = DecodeCheckpoint(h.mapDev[start : start+s.CkBytes])
	return s, err
}

// A reservation's unused slots are freed as one run (unallocatedRuns
// merges neighbouring slots) and quarantined as one run. A reservation
// may span up to 4·MaxChunk (Reserve, NewBatcher), so that run can be
// longer than MaxChunk; coverRuns merges runs but never splits one, and
// the checkpoint is written with it. DecodeCheckpoint refuses a
// quarantined run longer than MaxChunk/BlockSize blocks: every later load
// of the map (a takeover, a secondary's join) fails with ErrCorrupt, and
// the pair serves nothing until an operator acts.
//
// Schedule: a Batcher of 1 MiB chunks (its default Count, 100: 25 600
// blocks, allowed) reserves; its user takes one chunk; the flusher
// commits [R+1]; the 99 other slots (25 344 blocks) are freed and
// quarantined as one run. Within the quarantine (30 s) the log fills and
// the primary checkpoints (here: 4 KiB allocations); the primary then
// dies; the secondary's takeover cannot read the map.
func TestReview70LongQuarantinedRunBricksMap(t *testing.T) {
	h := newRvH(t, 600, 64<<10, reviewCfg())
	R := h.reserve(1<<20, 100).ID
	if r := h.mustReply(1, h.commit(R, R+1)); r.Err != nil {
		t.Fatalf("commit: %v", r.Err)
	}
	p := h.nodes[1].mg
	seq := p.sup.Seq
	for i := 0; p.sup.Seq == seq; i++ {
		if i > 1000 {
			t.Fatal("no checkpoint after 1000 allocations")
		}
		if r := h.mustReply(1, h.call(1, func(mg *Manager, env Env, req ReqID) []any { return mg.Allocate(env, req, 4096) })); r.Err != nil {
			t.Fatalf("allocation %d: %v", i, r.Err)
		}
	}
	var longest uint64
	for _, q := range p.m.quarantined() {
		longest = max(longest, q.Blocks)
	}
	t.Logf("checkpoint written (superblock seq %d); the longest quarantined run is %d blocks (a checkpoint accepts %d)", p.sup.Seq, longest, MaxChunk/BlockSize)
	if _, err := r70ReadMap(t, h); err != nil {
		t.Errorf("DEFECT: the map the primary just checkpointed does not decode: %v", err)
	}
	// The primary's node dies; the secondary takes over.
	h.nodes[1].mg, h.nodes[1].mode, h.nodes[1].holds = nil, lock.None, 0
	h.dead[Subject{1, 1}] = true
	for i := 0; i < 4; i++ {
		h.now = h.now.Add(time.Second)
		h.tick(2)
	}
	if n2 := h.nodes[2].mg; n2.st != stPrimary {
		t.Errorf("DEFECT: the secondary could not take over: it is %s (%v)", n2.st, n2.why)
	}
}

// The same run comes back at every takeover, long after its quarantine
// ended: a load quarantines anew the space the log's records freed, the
// reservation's close among them (one run again), and a takeover whose log
// is half full checkpoints at once. Here the new primary serves (its map
// is in memory), but the map it wrote does not decode: the node that comes
// back cannot join, and the next takeover cannot load.
func TestReview70TakeoverRequarantinesLongRun(t *testing.T) {
	h := newRvH(t, 600, 64<<10, reviewCfg())
	R := h.reserve(1<<20, 100).ID
	if r := h.mustReply(1, h.commit(R, R+1)); r.Err != nil {
		t.Fatalf("commit: %v", r.Err)
	}
	h.now = h.now.Add(h.cfg.Quarantine + time.Second)
	h.tick(1) // the quarantine ends at the primary
	p := h.nodes[1].mg
	if n := len(p.m.quarantined()); n != 0 {
		t.Fatalf("%d runs still quarantined", n)
	}
	seq := p.sup.Seq
	for p.logPos-blockLog < uint64(p.sup.Layout.LogBlocks)/2 {
		if r := h.mustReply(1, h.call(1, func(mg *Manager, env Env, req ReqID) []any { return mg.Allocate(env, req, 4096) })); r.Err != nil {
			t.Fatalf("allocation: %v", r.Err)
		}
	}
	if p.sup.Seq != seq {
		t.Fatal("the primary checkpointed: the schedule needs a half-full log")
	}
	// The primary's node dies; the secondary takes over (and checkpoints).
	h.nodes[1].mg, h.nodes[1].mode, h.nodes[1].holds = nil, lock.None, 0
	h.dead[Subject{1, 1}] = true
	for i := 0; i < 4; i++ {
		h.now = h.now.Add(time.Second)
		h.tick(2)
	}
	n2 := h.nodes[2].mg
	if n2.st != stPrimary {
		t.Fatalf("node 2 is %s (%v)", n2.st, n2.why)
	}
	if _, err := r70ReadMap(t, h); err != nil {
		t.Errorf("DEFECT: the new primary's takeover checkpoint does not decode: %v", err)
	}
	// Node 1 comes back and joins as secondary.
	h.startNode(1)
	n1 := h.nodes[1]
	h.exec(n1, n1.mg.SetPair(h.env(), h.pair.Clone(), h.ver, true))
	for i := 0; i < 4; i++ {
		h.now = h.now.Add(time.Second)
		h.tick(1)
		h.tick(2)
	}
	if n1.mg.st != stSecondary {
		t.Errorf("DEFECT: node 1 cannot join as secondary: it is %s (%v)", n1.mg.st, n1.mg.why)
	}
}

// A map written before the fix (a checkpoint holding a quarantined run
// longer than MaxChunk) loads: the run is split as it is quarantined
// again, and the next checkpoint holds only runs of at most MaxChunk.
func TestReview70OldCheckpointWithLongRunLoads(t *testing.T) {
	const most = MaxChunk / BlockSize
	long := Run{RLDev: 7, Block: 256, Blocks: 25344}
	c := Checkpoint{CM: 1, Through: 5, HighWater: 10, Chunks: map[uint64]Extent{1: {RLDev: 7, Block: 64, Len: 4 * BlockSize}}, Quarantined: []Run{long}}
	got, err := DecodeCheckpoint(EncodeCheckpoint(c))
	if err != nil {
		t.Fatalf("a checkpoint with a %d-block quarantined run: %v", long.Blocks, err)
	}
	m := newChunkMap(1, []DataRLDev{{ID: 7, Blocks: 64 << 10}})
	if err := m.load(got); err != nil {
		t.Fatal(err)
	}
	m.quarantine(time.Unix(100, 0))
	var total uint64
	for _, q := range m.quarantined() {
		if q.Blocks > most {
			t.Fatalf("a quarantined run of %d blocks (at most %d)", q.Blocks, most)
		}
		total += q.Blocks
	}
	if total != long.Blocks {
		t.Fatalf("%d blocks quarantined (want %d)", total, long.Blocks)
	}
	if _, err := DecodeCheckpoint(EncodeCheckpoint(m.checkpoint())); err != nil {
		t.Fatalf("the next checkpoint: %v", err)
	}
	// A run past the end of block numbers is corrupt; one past its
	// RLDev's end is refused at load.
	c.Quarantined = []Run{{RLDev: 7, Block: 256, Blocks: ^uint64(0) - 100}}
	if _, err := DecodeCheckpoint(EncodeCheckpoint(c)); err == nil {
		t.Fatal("a quarantined run past the end of block numbers decoded")
	}
	c.Quarantined = []Run{{RLDev: 7, Block: 256, Blocks: 64 << 10}}
	got, err = DecodeCheckpoint(EncodeCheckpoint(c))
	if err != nil {
		t.Fatal(err)
	}
	if err := newChunkMap(1, []DataRLDev{{ID: 7, Blocks: 64 << 10}}).load(got); err == nil {
		t.Fatal("a quarantined run past its RLDev's end loaded")
	}
}
