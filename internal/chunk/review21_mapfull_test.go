package chunk

import (
	"errors"
	"os"
	"os/exec"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/lock"
)

// Outside review 21 (commit 74d5d65: owned allocations).
//
// Manager.change counts a retirement as one more checkpoint entry
// (newOwned++), even for a log that already has a mark, and checks the
// total against MaxEntries for every change, not only one with
// allocations. When the total is over, it answers the change's
// allocations with ErrMapFull and calls change(undone(reqs)) again. A
// change with no allocation (a Retire, alone or with frees and disowns)
// has nothing to answer there: the same requests come back, the same total
// is over again, and change recurses until the goroutine's stack
// overflows. That is a fatal error (it cannot be recovered), so it kills
// the whole node process; the secondary then takes over the same map, and
// the next Retire kills it too.
//
// The map needs only to be full: a pair that answered ErrMapFull once
// holds MaxEntries entries (allocations are admitted while the total stays
// at or below it). That is when the B-tree's collection of orphaned
// chunks is most needed, and every collection starts with a Retire
// (collectOrphans: at every B-tree server start and after every replay).
//
// The test runs the scenario in a child process, with a small stack limit
// so that the overflow comes at once, and fails if the child died of it.
// Fixed: only a change that adds checkpoint entries is refused, and the
// requests that add them (allocations, new retirement marks) are answered
// ErrMapFull; the owners' section header counts as an entry.
func TestReview21RetireOnFullMapOverflowsStack(t *testing.T) {
	if os.Getenv("REVIEW21_MAPFULL_CHILD") == "1" {
		review21RetireOnFullMap(t)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestReview21RetireOnFullMapOverflowsStack$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "REVIEW21_MAPFULL_CHILD=1")
	out, err := cmd.CombinedOutput()
	text := string(out)
	if i := strings.Index(text, "goroutine stack exceeds"); i >= 0 {
		j := strings.Index(text[i:], "\n")
		frames := strings.Count(text, "chunk.(*Manager).change(")
		t.Fatalf("DEFECT: a Retire at a pair whose map is full killed the process: %q (%d change frames in the trace; exit %v)", text[i:i+j], frames, err)
	}
	if err != nil {
		t.Fatalf("child failed otherwise: %v\n%s", err, text)
	}
	t.Logf("child:\n%s", text)
}

func review21RetireOnFullMap(t *testing.T) {
	debug.SetMaxStack(16 << 20) // the default 1 GB would take a while to reach
	// 71 blocks: slots of 2 blocks, MaxEntries 254.
	h := newRvH(t, 71, 4096, reviewCfg())
	max := h.nodes[1].mg.sup.Layout.MaxEntries()
	n := 0
	for {
		r := h.mustReply(1, h.call(1, func(mg *Manager, env Env, req ReqID) []any { return mg.Allocate(env, req, 4096) }))
		if errors.Is(r.Err, ErrMapFull) {
			break
		}
		if r.Err != nil {
			t.Fatalf("allocation %d: %v", n, r.Err)
		}
		n++
	}
	m := h.nodes[1].mg.m
	total := uint64(len(m.chunks)+len(m.quarantined())+m.owned+len(m.retired)) + m.reservedChunks()
	t.Logf("%d chunks allocated, then ErrMapFull; the map counts %d entries of %d", n, total, max)
	// A B-tree server starts (or a replay ends): collectOrphans retires
	// the log's earlier holders at every pair.
	retire := func(seq uint64) error {
		return h.mustReply(1, h.call(1, func(mg *Manager, env Env, req ReqID) []any {
			return mg.Retire(env, req, 7, lock.Token{Epoch: 1, Seq: seq})
		})).Err
	}
	// Fixed: the retirement (a new mark: an entry, and the owners'
	// section header) is refused as the allocations are; the map serves on.
	if err := retire(10); !errors.Is(err, ErrMapFull) {
		t.Fatalf("a retirement at a full map: %v, want ErrMapFull", err)
	}
	// Frees make room; then the mark is made, and a newer one for the
	// same log (it replaces the old: no new entry) even once full again.
	var ids []uint64
	for id := range m.chunks {
		ids = append(ids, id)
	}
	for _, id := range ids[:2] {
		if r := h.mustReply(1, h.call(1, func(mg *Manager, env Env, req ReqID) []any { return mg.Free(env, req, id) })); r.Err != nil {
			t.Fatalf("free: %v", r.Err)
		}
	}
	h.now = h.now.Add(h.cfg.Quarantine + time.Second) // their space out of quarantine (an entry each until then)
	h.tick(1)
	if err := retire(10); err != nil {
		t.Fatalf("a retirement after two frees: %v", err)
	}
	for {
		r := h.mustReply(1, h.call(1, func(mg *Manager, env Env, req ReqID) []any { return mg.Allocate(env, req, 4096) }))
		if errors.Is(r.Err, ErrMapFull) {
			break
		}
		if r.Err != nil {
			t.Fatalf("allocation: %v", r.Err)
		}
	}
	if err := retire(11); err != nil {
		t.Fatalf("a newer retirement of the same log at a full map: %v", err)
	}
	// The checkpoint of the full map fits its slot.
	if c := EncodeCheckpoint(m.checkpoint()); uint64(len(c)) > uint64(h.nodes[1].mg.sup.Layout.SlotBlocks)*BlockSize {
		t.Fatalf("the full map's checkpoint takes %d bytes; a slot holds %d", len(c), uint64(h.nodes[1].mg.sup.Layout.SlotBlocks)*BlockSize)
	}
}
