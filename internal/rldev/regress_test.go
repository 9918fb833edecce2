package rldev

// Regression tests from an outside review of the engine (2026-11-24):
// each scripts, with the harness, a scenario that broke a rule before its
// fix (each says what it was and what holds now).

import (
	"bytes"
	"errors"
	"math/rand"
	"slices"
	"testing"
	"time"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/disk"
	"github.com/grovestore/grove/internal/lock"
)

func rvDiskFull() disk.MemFaults { return disk.MemFaults{Full: true} }

// rvStepUntil runs queued items one at a time until cond holds (true) or
// the queue is empty (cond's value then).
func (h *harness) rvStepUntil(cond func() bool) bool {
	for i := 0; len(h.queue) > 0; i++ {
		if i > 1_000_000 {
			h.t.Fatal("rvStepUntil: no quiescence")
		}
		f := h.queue[0]
		h.queue = h.queue[1:]
		f()
		if cond() {
			return true
		}
	}
	return cond()
}

// rvTickUntil advances time in 100 ms steps (up to d), ticking every engine
// and stepping the queue, and stops as soon as cond holds, leaving what
// is still queued unrun.
func (h *harness) rvTickUntil(d time.Duration, cond func() bool) bool {
	if h.rvStepUntil(cond) {
		return true
	}
	for step := time.Duration(0); step < d; step += 100 * time.Millisecond {
		h.now = h.now.Add(100 * time.Millisecond)
		for _, n := range h.sorted() {
			if n.up {
				h.exec(n, n.e.Tick(h.env(n)))
			}
		}
		if h.rvStepUntil(cond) {
			return true
		}
	}
	return false
}

// rvBits drives MemDevice.Crash: Crash draws r.Intn(2) once per
// unsynced write (in the order written) and keeps the write when it is 0.
// keep lists the draws in order; past its end every write is kept.
type rvBits struct {
	keep []bool
	i    int
}

func (s *rvBits) Seed(int64) {}
func (s *rvBits) Int63() int64 {
	k := true
	if s.i < len(s.keep) {
		k = s.keep[s.i]
	}
	s.i++
	if k {
		return 0
	}
	return 1 << 32 // Intn(2) == Int31()&1 == bit 32 of Int63
}

func (h *harness) rvRead(n NodeID, id, block, count uint64) Reply {
	h.t.Helper()
	q := h.read(n, id, block, count)
	h.run()
	r, ok := h.replies[q]
	if !ok {
		h.t.Fatalf("read at %d from node %d: no reply", block, n)
	}
	return r
}

// rvPlatterBlock decodes block b of RLDev id as it is on the platter of the
// node's segment (what survives a crash).
func (h *harness) rvPlatterBlock(n NodeID, id, b uint64) []byte {
	rec := h.rec(id)
	seg := rec.Segs[rec.SegmentOf(n)]
	raw := h.nodes[n].devs[seg.Disk].Platter(seg.Offset+blockOff(b), PhysBlockSize)
	d, _, st := DecodeBlock(raw, id, b)
	if st == BlockCorrupt || st == BlockMisplaced {
		return nil
	}
	return append([]byte(nil), d...)
}

// rvPlatterLog decodes a log page (PageDRL, PageDegraded) of the node's
// segment as it is on the platter.
func (h *harness) rvPlatterLog(n NodeID, id uint64, kind uint16) []uint64 {
	rec := h.rec(id)
	seg := rec.Segs[rec.SegmentOf(n)]
	dev := h.nodes[n].devs[seg.Disk]
	oa, size := pageSlot(kind, 0)
	ob, _ := pageSlot(kind, 1)
	_, payload, ok := NewestPage(dev.Platter(seg.Offset+oa, size), dev.Platter(seg.Offset+ob, size), kind)
	if !ok {
		return nil
	}
	rb := uint64(DRLRegionBlocks)
	if kind == PageDegraded {
		rb = DegradedRegionBlocks
	}
	b, err := decodeBitmap(payload, regionBlocks(rb, rec.Blocks), rec.Blocks)
	if err != nil {
		return nil
	}
	return b.List()
}

// (A) A degraded-mode write is written locally before its degraded-mode
// log region is durable (datapath.go progress: deg.mark is issued but not
// waited for before the local write). A crash that keeps the data but not
// the log page leaves a block that the primary serves after restart and
// that the resync never copies: the copies differ after healing, and a
// read from the old primary returns the new value, then one from the
// resynced replica the old value.
func TestRegressDegradedWriteLandsBeforeDegLog(t *testing.T) {
	h := newHarness(t, 2, testDisk)
	r := h.create(512)
	p, s := r.Segs[0].Node, r.Segs[1].Node
	h.mustWrite(p, r.ID, 0, pattern(1, 4))
	h.crash(h.nodes[s], false, nil)
	h.run()
	h.dead[Subject{s, h.nodes[s].inc}] = true
	h.tick(time.Second)
	if rec := h.rec(r.ID); rec.State != Degraded || rec.Primary != 0 {
		t.Fatalf("not degraded: %+v", rec)
	}
	// Two degraded writes: the generation floor of this epoch is raised,
	// so the next write's generation is taken at once.
	h.mustWrite(p, r.ID, 100, pattern(2, 4))
	h.mustWrite(p, r.ID, 120, pattern(2, 4))
	h.tick(2 * time.Second) // everything synced

	// A degraded write to a fresh degraded-log region (block 300): the log
	// page and the data are both written, neither synced yet.
	h.write(p, r.ID, 300, pattern(3, 4), nil)
	// Power cut on the primary; every unsynced write lands. The data may
	// land only if its degraded-log mark is durable (it was written before
	// the fix, the mark not yet synced).
	h.crash(h.nodes[p], false, rand.New(&rvBits{}))
	landed := bytes.Equal(h.rvPlatterBlock(p, r.ID, 300), pattern(3, 1))
	marked := false
	for _, x := range h.rvPlatterLog(p, r.ID, PageDegraded) {
		marked = marked || x == 300/DegradedRegionBlocks
	}
	if landed && !marked {
		t.Fatal("the degraded write landed without its degraded-log mark")
	}
	h.start(h.nodes[p])
	h.tick(time.Second)
	rp := h.rvRead(p, r.ID, 300, 4)
	if rp.Err != nil {
		t.Fatalf("read from the restarted primary: %v", rp.Err)
	}
	t.Logf("restarted primary serves block 300 = %d (the unacknowledged degraded write); its degraded-log regions %v, dirty regions %v",
		rp.Data[0], h.nodes[p].e.reps[r.ID].deg.durable.List(), h.nodes[p].e.reps[r.ID].drl.durable.List())

	h.start(h.nodes[s])
	// Read the moment the RLDev is normal again (the scrubber, which
	// compares generations, would later pull the newer block across).
	if !h.rvTickUntil(10*time.Second, func() bool { return h.rec(r.ID).State == Normal }) {
		t.Fatalf("not resynced: %+v", h.rec(r.ID))
	}
	h.run()
	rs := h.rvRead(s, r.ID, 300, 4)
	if rs.Err != nil {
		t.Fatalf("read from the resynced replica: %v", rs.Err)
	}
	if !bytes.Equal(rp.Data, rs.Data) {
		t.Fatalf("the restarted primary returned %d at block 300, then (normal again) the resynced replica %d: the degraded-mode log missed the write", rp.Data[0], rs.Data[0])
	}
	h.sameCopies(r.ID)
}

// (B) replica.afterLoad, case "!r.drl.durable.Empty()" (replica.go:256):
// a primary that restarts in degraded (or resyncing) state throws its
// dirty regions away. Those regions may hold a write that landed here and
// never reached the (now stale) peer, and that is in no degraded-mode
// log (the primary crashed between the degraded decree and the write's
// degraded-log mark). Nothing copies them to the peer: the copies differ
// after healing. (The same path runs when a failed segment that is the only
// up-to-date copy reloads: replica.retry -> load -> afterLoad.)
func TestRegressRestartInDegradedDropsDirtyRegions(t *testing.T) {
	h := newHarness(t, 2, testDisk)
	r := h.create(512)
	p, s := r.Segs[0].Node, r.Segs[1].Node
	h.mustWrite(p, r.ID, 0, pattern(1, 4))
	h.tick(2 * time.Second) // dirty regions cleared
	sInc := h.nodes[s].inc
	h.crash(h.nodes[s], false, nil)
	h.run()
	// A write in flight: dirty region durable, local copy durable, the
	// forward waits for the dead secondary.
	q := h.write(p, r.ID, 0, pattern(9, 4), nil)
	h.run()
	if _, ok := h.replies[q]; ok {
		t.Fatal("setup: acknowledged without the secondary")
	}
	// The secondary is declared dead; stop right after the degraded
	// decree commits, before the primary marks its degraded-mode log.
	h.dead[Subject{s, sInc}] = true
	if !h.rvTickUntil(5*time.Second, func() bool { return h.rec(r.ID).State == Degraded }) {
		t.Fatal("setup: never degraded")
	}
	h.crash(h.nodes[p], false, nil) // only what was synced survives
	if got := h.rvPlatterLog(p, r.ID, PageDRL); len(got) != 1 || got[0] != 0 {
		t.Fatalf("setup: dirty regions on the primary's platter %v", got)
	}
	h.start(h.nodes[p])
	h.run()
	h.joined(r.ID)
	h.tick(2 * time.Second)
	// Its dirty region, which no degraded-mode write touched, is owed to
	// the stale peer (owed.go; before owed ranges it went into the
	// degraded-mode log, the resync's list, rather than away): unserved
	// until the peer is back, then pulled from it.
	if pr := h.nodes[p].e.reps[r.ID]; pr.owedCount() != 1 {
		t.Fatalf("the restarted primary's dirty region 0 is not owed: owed %d, degraded-mode log %v", pr.owedCount(), pr.deg.durable.List())
	}
	if rp := h.rvRead(p, r.ID, 0, 4); !errors.Is(rp.Err, ErrUnavailable) {
		t.Fatalf("read from the restarted primary: %v, want ErrUnavailable", rp.Err)
	}
	h.start(h.nodes[s])
	if !h.rvTickUntil(10*time.Second, func() bool { return h.rec(r.ID).State == Normal }) {
		t.Fatalf("not resynced: %+v", h.rec(r.ID))
	}
	h.run()
	rp := h.rvRead(p, r.ID, 0, 4)
	rs := h.rvRead(s, r.ID, 0, 4)
	if rp.Err != nil || rs.Err != nil {
		t.Fatalf("reads after the resync: %v, %v", rp.Err, rs.Err)
	}
	if !bytes.Equal(rp.Data, rs.Data) {
		t.Fatalf("the primary serves block 0 = %d, the resynced replica %d: the dirty region was dropped, not resynced", rp.Data[0], rs.Data[0])
	}
	h.sameCopies(r.ID)
}

// (C) Engine.poll (engine.go: "len(e.suspects) == 0" returns before the
// loop that adds the table's unreachable peers): an engine that starts
// while its peer is down, and so never sees a session to it break
// (PeerDown), never asks the failure detector about it. Its writes wait
// forever although the peer is declared dead.
func TestRegressRestartedEngineNeverSuspectsDownPeer(t *testing.T) {
	h := newHarness(t, 2, testDisk)
	r := h.create(256)
	p, s := r.Segs[0].Node, r.Segs[1].Node
	h.mustWrite(p, r.ID, 0, pattern(1, 2))
	h.tick(2 * time.Second) // dirty regions cleared: no recovery on restart
	sInc := h.nodes[s].inc
	// A power outage takes both; only the primary's node comes back.
	h.crash(h.nodes[s], false, nil)
	h.crash(h.nodes[p], false, nil)
	h.run()
	h.dead[Subject{s, sInc}] = true // the failure detector says so
	h.start(h.nodes[p])
	h.run()
	h.joined(r.ID)
	q := h.write(p, r.ID, 0, pattern(2, 2), nil)
	h.tick(20 * time.Second)
	rp, ok := h.replies[q]
	if !ok || rp.Err != nil {
		t.Fatalf("write not completed 20 s after the peer's death was known to the failure detector (replied %v: %v); state %v, suspects %v",
			ok, rp.Err, h.rec(r.ID).State, h.nodes[p].e.suspects)
	}
	if rec := h.rec(r.ID); rec.State != Degraded {
		t.Fatalf("state %v", rec.State)
	}
}

// (D) A resync target whose disk fails while it applies a forwarded write
// answers DiskFailed; writeOp.acked (datapath.go:213) only resends, and
// copyAcked retries NotServing forever. Nothing stops the resync (only a
// DiskFailed answer to a Copy or a broken session does), the stale target
// cannot decree anything, and the write holds the range that the copy
// needs: the RLDev stays resyncing and the write never completes, though
// the source is healthy and could go back to degraded.
func TestRegressResyncTargetFailsOnForwardStalls(t *testing.T) {
	h := newHarness(t, 2, testDisk)
	r := h.create(512)
	p, s := r.Segs[0].Node, r.Segs[1].Node
	h.mustWrite(p, r.ID, 0, pattern(1, 4))
	h.crash(h.nodes[s], false, nil)
	h.run()
	h.dead[Subject{s, h.nodes[s].inc}] = true
	h.tick(time.Second)
	h.mustWrite(p, r.ID, 100, pattern(2, 4)) // the resync copies chunk [64, 128)
	h.start(h.nodes[s])
	if !h.rvStepUntil(func() bool { return h.rec(r.ID).State == Resyncing }) {
		t.Fatal("setup: no resync")
	}
	// The target's disk stops taking writes; the client writes into the
	// chunk to copy.
	h.nodes[s].devs[0].SetFaults(rvDiskFull())
	q := h.write(p, r.ID, 100, pattern(3, 4), nil)
	h.tick(30 * time.Second)
	rp, ok := h.replies[q]
	if !ok {
		t.Fatalf("write unanswered 30 s after the resync target's disk failed; state %v (source healthy)", h.rec(r.ID).State)
	}
	_ = rp
}

// (E) Fencing tokens are per replica and are not carried by a resync:
// tokens admitted by a survivor in degraded mode never reach the other
// replica. After a later failover back to it, a write with an older token
// is accepted (lock.TokenGuard's contract broken across failover).
func TestRegressFenceTokensNotResynced(t *testing.T) {
	h := newHarness(t, 2, testDisk)
	r := h.create(128)
	a, b := r.Segs[0].Node, r.Segs[1].Node
	f := func(seq uint64) *Fence { return &Fence{Name: "map", Token: lock.Token{Epoch: 1, Seq: seq}} }
	h.mustWrite(a, r.ID, 0, pattern(1, 1))
	// a dies: b serves alone and admits token 7.
	h.crash(h.nodes[a], false, nil)
	h.run()
	h.dead[Subject{a, h.nodes[a].inc}] = true
	h.tick(time.Second)
	q := h.write(b, r.ID, 0, pattern(7, 1), f(7))
	h.run()
	if err := h.replies[q].Err; err != nil {
		t.Fatalf("token 7 on b: %v", err)
	}
	// a comes back and is resynced.
	h.start(h.nodes[a])
	h.tick(5 * time.Second)
	if rec := h.rec(r.ID); rec.State != Normal {
		t.Fatalf("not resynced: %+v", rec)
	}
	// b dies: a serves alone.
	h.crash(h.nodes[b], false, nil)
	h.run()
	h.dead[Subject{b, h.nodes[b].inc}] = true
	h.tick(time.Second)
	if rec := h.rec(r.ID); rec.State != Degraded || rec.Segs[rec.Primary].Node != a {
		t.Fatalf("not failed over to a: %+v", rec)
	}
	q = h.write(a, r.ID, 0, pattern(6, 1), f(6))
	h.run()
	if err := h.replies[q].Err; !errors.Is(err, ErrStaleToken) {
		t.Fatalf("a write with token 6 after token 7 was admitted: %v (want ErrStaleToken); block 0 now holds the older lock holder's data", err)
	}
}

// (F) A write that began in the resyncing epoch (its degraded-log mark and
// local write done, its forward in flight) when the RLDev returns to
// normal has no dirty-region cover for what already landed: resync.done()
// does not wait for forwards in flight, and the dirty region is marked
// only when the write next progresses. A primary crash right then keeps
// the data locally, the peer (normal, not stale) never got it, and the
// restarted primary's afterLoad finds no dirty region: the copies differ.
func TestRegressWriteAcrossResyncEndUncovered(t *testing.T) {
	h := newHarness(t, 2, testDisk)
	r := h.create(512)
	p, s := r.Segs[0].Node, r.Segs[1].Node
	h.mustWrite(p, r.ID, 0, pattern(1, 4))
	h.crash(h.nodes[s], false, nil)
	h.run()
	h.dead[Subject{s, h.nodes[s].inc}] = true
	h.tick(time.Second)
	h.mustWrite(p, r.ID, 100, pattern(2, 4))
	h.start(h.nodes[s])
	pr := func() *replica { return h.nodes[p].e.reps[r.ID] }
	if !h.rvStepUntil(func() bool { return pr().rec.State == Resyncing && pr().resync != nil }) {
		t.Fatal("setup: no resync")
	}
	// A write in the resyncing epoch raises its generation floor.
	h.write(p, r.ID, 200, pattern(4, 4), nil)
	if !h.rvStepUntil(func() bool { return h.rec(r.ID).State == Normal }) {
		t.Fatal("setup: resync did not end")
	}
	// The decree back to normal has committed; the primary has not seen
	// it yet. A client write arrives: written locally, forwarded in the
	// resyncing epoch (which the peer, now normal, refuses).
	h.write(p, r.ID, 300, pattern(3, 4), nil)
	if st := pr().rec.State; st != Resyncing {
		t.Fatalf("setup: the primary sees %v", st)
	}
	// Power cut on the primary: what it wrote lands (every unsynced write
	// kept), no dirty-region mark was ever issued for the write.
	h.crash(h.nodes[p], false, rand.New(&rvBits{}))
	// If the write landed, its region is in the dirty-region log (writes
	// of the resyncing epoch are covered too): the restarted primary pulls
	// it from the secondary.
	landed := bytes.Equal(h.rvPlatterBlock(p, r.ID, 300), pattern(3, 1))
	if got := h.rvPlatterLog(p, r.ID, PageDRL); landed && !slices.Contains(got, 300/regionBlocks(DRLRegionBlocks, r.Blocks)) {
		t.Fatalf("the write landed, but the dirty regions %v do not cover it", got)
	}
	h.start(h.nodes[p]) // back before anyone declares it dead
	h.run()
	h.joined(r.ID)
	h.run()
	if rec := h.rec(r.ID); rec.State != Normal {
		t.Fatalf("state %+v", rec)
	}
	rp := h.rvRead(p, r.ID, 300, 4)
	rs := h.rvRead(s, r.ID, 300, 4)
	if rp.Err != nil || rs.Err != nil {
		t.Fatalf("reads: %v / %v", rp.Err, rs.Err)
	}
	if !bytes.Equal(rp.Data, rs.Data) {
		t.Fatalf("in normal state the primary serves block 300 = %d, the secondary %d", rp.Data[0], rs.Data[0])
	}
	h.sameCopies(r.ID)
}

// (G) replica.abandonRecovery / recovered: a dirty region whose pull was
// answered before the peer became stale is recovered twice (once when the
// pulled data is written, once when its degraded-log mark is durable):
// recovering is decremented twice and goes negative. want() then never
// degrades the RLDev again (it needs recovering == 0): the next death of
// the peer leaves the primary's writes waiting forever.
func TestRegressAbandonRecoveryCountsTwice(t *testing.T) {
	h := newHarness(t, 2, testDisk)
	r := h.create(512)
	p, s := r.Segs[0].Node, r.Segs[1].Node
	h.mustWrite(p, r.ID, 0, pattern(1, 4))
	h.tick(2 * time.Second)
	// The primary crashes with a write in flight in region 0 (its dirty
	// region durable, the forward lost), and restarts cut off from the
	// secondary: its recovery pull waits.
	h.partition(p, s)
	h.write(p, r.ID, 0, pattern(9, 4), nil)
	h.run()
	h.crash(h.nodes[p], false, nil)
	h.start(h.nodes[p])
	h.run()
	h.joined(r.ID)
	pr := func() *replica { return h.nodes[p].e.reps[r.ID] }
	if pr().recovering() != 1 {
		t.Fatalf("setup: recovering %d", pr().recovering())
	}
	// A write to another region, forwarded when the pair heals (before
	// the pull: retry resends forwards first).
	h.write(p, r.ID, 400, pattern(5, 4), nil)
	h.run()
	h.tick(600 * time.Millisecond)
	// The secondary's disk refuses the forwarded write (it fails and
	// decrees itself stale) while it serves the pull.
	h.nodes[s].devs[0].SetFaults(rvDiskFull())
	h.heal(p, s)
	h.run()
	t.Logf("after the secondary's failure: state %v, primary recovering = %d", h.rec(r.ID).State, pr().recovering())
	h.nodes[s].devs[0].SetFaults(disk.MemFaults{})
	// (A region recovered twice once drove a count below zero; the count
	// is now the queue's length, and a region leaves the queue once.)
	// The secondary reloads and is copied whole; then it dies for good.
	h.tick(10 * time.Second)
	if rec := h.rec(r.ID); rec.State != Normal {
		t.Fatalf("not resynced: %+v", rec)
	}
	sInc := h.nodes[s].inc
	h.crash(h.nodes[s], false, nil)
	h.run()
	h.dead[Subject{s, sInc}] = true
	q := h.write(p, r.ID, 0, pattern(7, 4), nil)
	h.tick(10 * time.Second)
	if rp, ok := h.replies[q]; !ok || rp.Err != nil {
		t.Fatalf("write unanswered 10 s after the secondary was declared dead (state %v, recovering %d, verdicts held %v): %v", h.rec(r.ID).State, pr().recovering(), h.nodes[p].e.dead, rp.Err)
	}
}

// (H) The disk of the only up-to-date replica is replaced (a double fault:
// its peer is stale). The first incarnation sees the new disk's UUID
// differ from the table's, takes the segment as lost (stale in fact) and
// serves nothing, but its decide() registers the new disk's UUID (the
// decree that would mark the segment stale is not proposed: the peer is
// already stale). After one more restart the UUIDs match, lost is false,
// and the freshly formatted segment (Super.Incomplete, which nothing but
// ResyncMe reads) serves zeros as the authoritative copy: acknowledged
// writes silently read as never written, and the stale replica is then
// "resynced" from it (nothing copied) and returned to normal.
func TestRegressReplacedDiskOfOnlyCopyServesZeros(t *testing.T) {
	h := newHarness(t, 2, testDisk)
	r := h.create(256)
	p, s := r.Segs[0].Node, r.Segs[1].Node
	h.mustWrite(p, r.ID, 0, pattern(3, 4))
	h.crash(h.nodes[s], false, nil)
	h.run()
	h.dead[Subject{s, h.nodes[s].inc}] = true
	h.tick(time.Second)
	h.mustWrite(p, r.ID, 10, pattern(4, 4)) // degraded: only p has it
	// p's disk is replaced.
	h.crash(h.nodes[p], false, nil)
	h.nodes[p].devs[0].Wipe()
	h.start(h.nodes[p])
	h.tick(2 * time.Second)
	rp := h.rvRead(p, r.ID, 0, 4)
	t.Logf("first life on the new disk: read %v (lost %v)", rp.Err, h.nodes[p].e.reps[r.ID].lost)
	// Any restart.
	h.crash(h.nodes[p], false, nil)
	h.start(h.nodes[p])
	h.tick(2 * time.Second)
	rp = h.rvRead(p, r.ID, 0, 4)
	if rp.Err == nil {
		t.Errorf("the blank segment that replaced the only up-to-date copy serves: block 0 reads %d (acknowledged %d), no error; table %+v",
			rp.Data[0], pattern(3, 1)[0], h.rec(r.ID))
	}
	h.start(h.nodes[s])
	h.tick(5 * time.Second)
	if rec := h.rec(r.ID); rec.State == Normal {
		rs := h.rvRead(s, r.ID, 0, 4)
		t.Errorf("the stale replica was 'resynced' from the blank one and the RLDev is normal; block 0: %d on p, %d on s", rp.Data[0], rs.Data[0])
	}
}

// TestFreshAfterOvertakenRead: an engine's first linearizable read of the
// table can be answered after the watch delivered a newer version (the
// runtime watches from the start). The engine must count itself fresh
// then: before the fix it dropped the read's answer as an older view,
// stayed unfresh, and never proposed anything (its disks unregistered,
// its replicas never serving) — a node's RLDevs stayed down after a
// whole-cluster restart in TestEndToEndTreeKillAll.
func TestFreshAfterOvertakenRead(t *testing.T) {
	dev := disk.NewMemDevice(64<<20, nil)
	hdr, _, err := OpenDisk(dev, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	e := NewEngine(Config{Node: 1, Inc: 1, Disks: []LocalDisk{{Index: 0, Size: dev.Size(), UUID: hdr.UUID, Path: "d"}}})
	now := time.Unix(1000, 0)
	env := Env{Now: now, Deadline: now.Add(time.Hour)}
	table := func(v uint64) *Table {
		tb, err := DecodeTable(&pb.Namespace{Name: Namespace, Version: v})
		if err != nil {
			t.Fatal(err)
		}
		return tb
	}
	proposes := func(out []any) bool {
		for _, o := range out {
			if _, ok := o.(Propose); ok {
				return true
			}
		}
		return false
	}
	if proposes(e.SetTable(env, table(5), false, nil)) {
		t.Fatal("an engine proposed from a watched table before any linearizable read")
	}
	if !proposes(e.SetTable(env, table(4), true, nil)) {
		t.Fatal("a linearizable read overtaken by the watch left the engine unfresh: it proposes nothing (its disk stays unregistered)")
	}
}

// TestUnfreshEngineAsksAgain: an engine that has seen no linearizable read
// asks for one on its ticks (every RetryEvery) until it has: the runtime's
// first read for it can be lost (a read in flight for the previous
// incarnation holds the runtime's one refresh slot), and nothing else asks
// while it is not fresh.
func TestUnfreshEngineAsksAgain(t *testing.T) {
	e := NewEngine(Config{Node: 1, Inc: 1})
	now := time.Unix(1000, 0)
	env := func() Env { return Env{Now: now, Deadline: now.Add(time.Hour)} }
	table := func(v uint64) *Table {
		tb, err := DecodeTable(&pb.Namespace{Name: Namespace, Version: v})
		if err != nil {
			t.Fatal(err)
		}
		return tb
	}
	asks := func(out []any) bool {
		for _, o := range out {
			if _, ok := o.(Refresh); ok {
				return true
			}
		}
		return false
	}
	e.SetTable(env(), table(3), false, nil) // the watch only
	now = now.Add(time.Minute)
	if !asks(e.Tick(env())) {
		t.Fatal("an engine without a linearizable read does not ask for one on its tick")
	}
	e.SetTable(env(), table(3), true, nil)
	now = now.Add(time.Minute)
	if asks(e.Tick(env())) {
		t.Fatal("a fresh engine asks for reads on its ticks")
	}
}
