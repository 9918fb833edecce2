package rldev

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand"
	"strings"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/lock"
)

const testDisk = 64 << 20

func TestCreateWriteRead(t *testing.T) {
	h := newHarness(t, 3, testDisk)
	if n := len(h.table().Disks); n != 3 {
		t.Fatalf("%d disks registered, want 3", n)
	}
	r := h.create(1024)
	p, s := r.Segs[0].Node, r.Segs[1].Node
	if p == s {
		t.Fatal("both segments on one node")
	}
	data := pattern(1, 8)
	h.mustWrite(p, r.ID, 10, data)
	h.mustRead(p, r.ID, 10, data)
	h.mustRead(s, r.ID, 10, data)
	h.mustRead(s, r.ID, 0, make([]byte, 2*BlockSize)) // never written: zeros
	h.sameCopies(r.ID)
	// Writes through the secondary are refused: the clerk goes to the primary.
	q := h.write(s, r.ID, 0, data, nil)
	h.run()
	if !errors.Is(h.replies[q].Err, ErrNotPrimary) {
		t.Fatalf("write through the secondary: %v", h.replies[q].Err)
	}
	// Bad requests.
	for _, bad := range []struct{ block, n uint64 }{{1020, 8}, {2000, 1}} {
		q := h.write(p, r.ID, bad.block, pattern(0, int(bad.n)), nil)
		h.run()
		if !errors.Is(h.replies[q].Err, ErrBadRequest) {
			t.Fatalf("write of %d at %d: %v", bad.n, bad.block, h.replies[q].Err)
		}
	}
	// The dirty-region log empties once nothing is in flight.
	h.tick(2 * time.Second)
	if n := h.nodes[p].e.reps[r.ID].drl.durable.Count(); n != 0 {
		t.Fatalf("%d dirty regions left", n)
	}
}

// Chained declustering: RLDev i's primary on the i-th node, its secondary
// on the next.
func TestChainedDeclustering(t *testing.T) {
	h := newHarness(t, 3, testDisk)
	prim := map[NodeID]int{}
	for i := 0; i < 6; i++ {
		r := h.create(64)
		if r.Segs[1].Node != r.Segs[0].Node%3+1 {
			t.Fatalf("rldev %d: segments on %d and %d", r.ID, r.Segs[0].Node, r.Segs[1].Node)
		}
		prim[r.Segs[0].Node]++
	}
	for n := NodeID(1); n <= 3; n++ {
		if prim[n] != 2 {
			t.Fatalf("node %d is primary of %d RLDevs, want 2", n, prim[n])
		}
	}
}

// The secondary dies: writes wait until it is declared dead, then the
// primary degrades and goes on alone; the secondary comes back, is
// resynced while writes go on, and serves again.
func TestDegradedAndResync(t *testing.T) {
	h := newHarness(t, 2, testDisk)
	r := h.create(512)
	p, s := r.Segs[0].Node, r.Segs[1].Node
	h.mustWrite(p, r.ID, 0, pattern(1, 4))
	h.crash(h.nodes[s], true, rand.New(rand.NewSource(1)))
	h.run()
	q := h.write(p, r.ID, 100, pattern(2, 4), nil)
	h.run()
	if _, ok := h.replies[q]; ok {
		t.Fatal("a write was acknowledged without the secondary before it was declared dead")
	}
	h.dead[Subject{s, h.nodes[s].inc}] = true
	h.tick(time.Second)
	if rp, ok := h.replies[q]; !ok || rp.Err != nil {
		t.Fatalf("write after the verdict: %+v", rp)
	}
	if rec := h.rec(r.ID); rec.State != Degraded || !rec.Stale[1] || rec.Primary != 0 {
		t.Fatalf("record after the verdict: %+v", rec)
	}
	h.mustWrite(p, r.ID, 300, pattern(3, 8))
	// Back: stale, it serves nothing until resynced.
	h.start(h.nodes[s])
	q = h.read(s, r.ID, 100, 4)
	h.tick(100 * time.Millisecond)
	_ = q
	h.tick(5 * time.Second)
	if rec := h.rec(r.ID); rec.State != Normal || rec.Stale[1] {
		t.Fatalf("not resynced: %+v", rec)
	}
	h.mustRead(s, r.ID, 100, pattern(2, 4))
	h.mustRead(s, r.ID, 300, pattern(3, 8))
	h.mustRead(s, r.ID, 0, pattern(1, 4))
	h.sameCopies(r.ID)
}

// The primary dies: the secondary takes over once it is declared dead;
// the old primary comes back stale and is resynced, its own in-flight
// regions included.
func TestPrimaryFailover(t *testing.T) {
	h := newHarness(t, 2, testDisk)
	r := h.create(512)
	p, s := r.Segs[0].Node, r.Segs[1].Node
	h.mustWrite(p, r.ID, 0, pattern(1, 4))
	h.crash(h.nodes[p], true, rand.New(rand.NewSource(2)))
	h.run()
	h.dead[Subject{p, h.nodes[p].inc}] = true
	h.tick(time.Second)
	rec := h.rec(r.ID)
	if rec.State != Degraded || rec.Primary != 1 || !rec.Stale[0] {
		t.Fatalf("after the primary's death: %+v", rec)
	}
	h.mustWrite(s, r.ID, 50, pattern(5, 4))
	h.start(h.nodes[p])
	h.tick(5 * time.Second)
	if rec := h.rec(r.ID); rec.State != Normal {
		t.Fatalf("not resynced: %+v", rec)
	}
	h.mustRead(p, r.ID, 50, pattern(5, 4))
	h.mustRead(p, r.ID, 0, pattern(1, 4))
	h.sameCopies(r.ID)
}

// The primary crashes with writes in flight (its dirty regions durable,
// its local write landed, the forward lost), and comes back before anyone
// declares it dead: it pulls its dirty regions from the secondary before
// serving them, so both copies end identical.
func TestPrimaryCrashPullsDirtyRegions(t *testing.T) {
	h := newHarness(t, 2, testDisk)
	r := h.create(512)
	p, s := r.Segs[0].Node, r.Segs[1].Node
	h.mustWrite(p, r.ID, 0, pattern(1, 8))
	// Cut the pair so the forward is lost, write, crash the primary after
	// its local write and its dirty-region log are durable.
	h.partition(p, s)
	h.write(p, r.ID, 0, pattern(9, 8), nil)
	h.run()
	for _, d := range h.nodes[p].devs {
		d.Sync()
	}
	h.crash(h.nodes[p], false, nil)
	h.heal(p, s)
	h.start(h.nodes[p])
	h.tick(2 * time.Second)
	// The secondary's copy (the old data) is the one readers may have
	// seen: the primary now holds it too.
	h.mustRead(p, r.ID, 0, pattern(1, 8))
	h.mustRead(s, r.ID, 0, pattern(1, 8))
	h.sameCopies(r.ID)
}

// A partition between the two replicas alone, both alive: writes wait,
// reads go on, nothing is lost; after the heal the write completes.
func TestReplicaPartitionLosesNothing(t *testing.T) {
	h := newHarness(t, 2, testDisk)
	r := h.create(256)
	p, s := r.Segs[0].Node, r.Segs[1].Node
	h.mustWrite(p, r.ID, 0, pattern(1, 2))
	h.partition(p, s)
	q := h.write(p, r.ID, 0, pattern(2, 2), nil)
	h.tick(3 * time.Second)
	if _, ok := h.replies[q]; ok {
		t.Fatal("a write was acknowledged during a partition from a live secondary")
	}
	h.mustRead(s, r.ID, 0, pattern(1, 2))
	h.heal(p, s)
	h.tick(2 * time.Second)
	if rp, ok := h.replies[q]; !ok || rp.Err != nil {
		t.Fatalf("write after the heal: %+v", rp)
	}
	h.mustRead(s, r.ID, 0, pattern(2, 2))
	if rec := h.rec(r.ID); rec.State != Normal {
		t.Fatalf("state %v after a partition between live replicas", rec.State)
	}
	h.sameCopies(r.ID)
}

// A flipped bit and a torn block on one replica are found on read and
// repaired from the other.
func TestReadRepair(t *testing.T) {
	h := newHarness(t, 2, testDisk)
	r := h.create(128)
	s := r.Segs[1]
	h.mustWrite(r.Segs[0].Node, r.ID, 5, pattern(4, 3))
	dev := h.nodes[s.Node].devs[s.Disk]
	dev.FlipBit(s.Offset+blockOff(5)+HeaderSize+100, 3)
	dev.FlipBit(s.Offset+blockOff(7)+10, 0)
	h.mustRead(s.Node, r.ID, 5, pattern(4, 3))
	h.sameCopies(r.ID)
	if n := h.nodes[s.Node].e.Stats().Repairs; n != 2 {
		t.Fatalf("%d repairs, want 2", n)
	}
}

// Fenced writes: a replica refuses a token older than one it admitted,
// across a restart.
func TestFencing(t *testing.T) {
	h := newHarness(t, 2, testDisk)
	r := h.create(128)
	p := r.Segs[0].Node
	f := func(seq uint64) *Fence { return &Fence{Name: "map", Token: lock.Token{Epoch: 1, Seq: seq}} }
	for _, c := range []struct {
		seq  uint64
		want error
	}{{5, nil}, {5, nil}, {7, nil}, {6, ErrStaleToken}} {
		q := h.write(p, r.ID, 0, pattern(byte(c.seq), 1), f(c.seq))
		h.run()
		if got := h.replies[q].Err; !errors.Is(got, c.want) && !(got == nil && c.want == nil) {
			t.Fatalf("token %d: %v, want %v", c.seq, got, c.want)
		}
	}
	h.mustRead(p, r.ID, 0, pattern(7, 1))
	h.crash(h.nodes[p], false, nil)
	h.start(h.nodes[p])
	h.tick(time.Second)
	q := h.write(p, r.ID, 0, pattern(6, 1), f(6))
	h.run()
	if !errors.Is(h.replies[q].Err, ErrStaleToken) {
		t.Fatalf("after a restart, token 6: %v", h.replies[q].Err)
	}
	h.sameCopies(r.ID)
}

// Overlapping writes in flight at once end identical on both replicas.
func TestOverlappingWrites(t *testing.T) {
	h := newHarness(t, 2, testDisk)
	r := h.create(128)
	p := r.Segs[0].Node
	var qs []ReqID
	for i := 0; i < 20; i++ {
		qs = append(qs, h.write(p, r.ID, uint64(i%5), pattern(byte(10*i), 3), nil))
	}
	h.run()
	for _, q := range qs {
		if h.replies[q].Err != nil {
			t.Fatal(h.replies[q].Err)
		}
	}
	h.sameCopies(r.ID)
}

// A replaced disk: its segments are lost; they are marked stale and copied
// whole from their peers.
func TestDiskReplaced(t *testing.T) {
	h := newHarness(t, 2, testDisk)
	r := h.create(256)
	p, s := r.Segs[0].Node, r.Segs[1].Node
	h.mustWrite(p, r.ID, 0, pattern(3, 16))
	h.crash(h.nodes[s], false, nil)
	h.nodes[s].devs[0].Wipe()
	h.dead[Subject{s, h.nodes[s].inc}] = true
	h.tick(time.Second)
	h.start(h.nodes[s])
	h.tick(5 * time.Second)
	if rec := h.rec(r.ID); rec.State != Normal {
		t.Fatalf("not rebuilt: %+v", rec)
	}
	h.mustRead(s, r.ID, 0, pattern(3, 16))
	h.sameCopies(r.ID)
}

// The scrubber finds a flipped bit in a block nobody reads and repairs it
// from the peer.
func TestScrubRepairsRot(t *testing.T) {
	h := newHarness(t, 2, testDisk)
	r := h.create(256)
	p, s := r.Segs[0], r.Segs[1]
	h.mustWrite(p.Node, r.ID, 100, pattern(9, 4))
	dev := h.nodes[s.Node].devs[s.Disk]
	dev.FlipBit(s.Offset+MetaSize+102*PhysBlockSize+HeaderSize+7, 5)
	dev.FlipBit(s.Offset+MetaSize+200*PhysBlockSize+3, 1) // a block never written
	h.tick(3 * time.Second)                               // 256 blocks at 4 MiB/s: well under a second
	h.sameCopies(r.ID)
	st := h.nodes[s.Node].e.Stats()
	if st.ScrubRepairs != 2 || st.ScrubPasses == 0 {
		t.Fatalf("scrub: %d repairs, %d passes; want 2 repairs and a pass", st.ScrubRepairs, st.ScrubPasses)
	}
}

// A misdirected write on the secondary: block 10's new content landed at
// block 20, and block 10 kept its old, well-formed content. The scrubber
// finds block 20 misplaced and block 10 older than the peer's, and
// repairs both.
func TestScrubFindsMisdirectedWrite(t *testing.T) {
	h := newHarness(t, 2, testDisk)
	r := h.create(128)
	p, s := r.Segs[0], r.Segs[1]
	h.mustWrite(p.Node, r.ID, 10, pattern(1, 1))
	dev := h.nodes[s.Node].devs[s.Disk]
	at := func(b int64) int64 { return s.Offset + MetaSize + b*PhysBlockSize }
	old := dev.Platter(at(10), PhysBlockSize)
	h.mustWrite(p.Node, r.ID, 10, pattern(2, 1))
	newer := dev.Platter(at(10), PhysBlockSize)
	// What the disk did instead of the second write.
	if _, err := dev.WriteAt(old, at(10)); err != nil {
		t.Fatal(err)
	}
	if _, err := dev.WriteAt(newer, at(20)); err != nil {
		t.Fatal(err)
	}
	if err := dev.Sync(); err != nil {
		t.Fatal(err)
	}
	h.mustRead(s.Node, r.ID, 10, pattern(1, 1)) // what a checksum cannot see
	h.tick(3 * time.Second)
	h.sameCopies(r.ID)
	h.mustRead(s.Node, r.ID, 10, pattern(2, 1))
	if n := h.nodes[s.Node].e.Stats().ScrubRepairs; n != 2 {
		t.Fatalf("scrub: %d repairs, want 2 (block 20 misplaced, block 10 older)", n)
	}
}

// TestPrimaryCrashPoints crashes the primary after every step of one
// replicated write (each step is one completion or message the engine
// handles: the dirty-region mark and its sync, the local write and its
// sync, the forward, the secondary's write, sync and acknowledgement),
// with the unsynced writes on its disk dropped, kept or torn, and the
// messages it sent last delivered or lost. After it
// restarts: both copies identical, every block either wholly old or
// wholly new, none corrupt, and new only if the secondary has it (what a
// reader of the secondary may have seen).
func TestPrimaryCrashPoints(t *testing.T) {
	if testing.Short() {
		t.Skip("single-threaded simulations (80 runs): the full suite runs them")
	}
	if n, err := primaryCrashPoints(t, Unsafe{}); err != nil {
		t.Fatal(err)
	} else {
		t.Logf("%d crash points checked (unsynced writes dropped, kept or torn; messages in flight delivered or lost)", n)
	}
	// Teeth: without the dirty-region log, a crash after the local write
	// leaves the replicas different.
	if _, err := primaryCrashPoints(t, Unsafe{NoDirtyLog: true}); err == nil {
		t.Fatal("with the dirty-region log off, no crash point found the replicas different")
	} else {
		t.Logf("with the dirty-region log off: %v", err)
	}
}

func primaryCrashPoints(t *testing.T, unsafe Unsafe) (int, error) {
	old, neu := pattern(1, 8), pattern(9, 8)
	setup := func() (*harness, *Record, NodeID, NodeID, ReqID) {
		// The rules alone: the scrubber would repair, later, copies a
		// broken rule let differ.
		h := newHarness(t, 2, testDisk, func(h *harness) { h.unsafe, h.scrubRate = unsafe, -1 })
		r := h.create(512)
		p, s := r.Segs[0].Node, r.Segs[1].Node
		h.mustWrite(p, r.ID, 0, old)
		h.tick(3 * time.Second) // dirty regions cleared: the write marks its region again
		return h, r, p, s, h.write(p, r.ID, 0, neu, nil)
	}
	// The steps of the write, uninterrupted.
	h, _, _, _, q := setup()
	steps := 0
	for len(h.queue) > 0 {
		if _, ok := h.replies[q]; ok {
			break
		}
		h.rvStepUntil(func() bool { return true })
		steps++
	}
	if rp, ok := h.replies[q]; !ok || rp.Err != nil {
		return 0, fmt.Errorf("the write alone: %v %v", ok, rp.Err)
	}
	points := 0
	for k := 0; k < steps; k++ {
		for _, mode := range []string{"dropped", "kept", "torn", "kept, messages lost", "torn, messages lost"} {
			h, r, p, s, q := setup()
			for i := 0; i < k; i++ {
				h.rvStepUntil(func() bool { return true })
			}
			if _, ok := h.replies[q]; ok {
				continue // answered already: not a crash point of this write
			}
			var rnd *rand.Rand // dropped: nothing unsynced survives
			switch strings.Fields(mode)[0] {
			case "kept", "kept,":
				rnd = rand.New(&rvBits{}) // every unsynced write survives
			case "torn", "torn,":
				rnd = rand.New(rand.NewSource(int64(k)))
			}
			lost := strings.HasSuffix(mode, "messages lost")
			if lost {
				h.partition(p, s) // what the primary sent is lost with it
			}
			h.crash(h.nodes[p], strings.HasPrefix(mode, "torn"), rnd)
			h.run()
			if lost {
				h.heal(p, s)
			}
			h.start(h.nodes[p])
			h.tick(3 * time.Second)
			points++
			sec := h.rvRead(s, r.ID, 0, 8)
			pri := h.rvRead(p, r.ID, 0, 8)
			if sec.Err != nil || pri.Err != nil {
				return points, fmt.Errorf("crash after step %d of %d (%s): reads: secondary %v, primary %v", k, steps, mode, sec.Err, pri.Err)
			}
			if !bytes.Equal(sec.Data, pri.Data) {
				return points, fmt.Errorf("crash after step %d of %d (%s): the replicas answer differently", k, steps, mode)
			}
			for b := 0; b < 8; b++ {
				blk := sec.Data[b*BlockSize : (b+1)*BlockSize]
				if !bytes.Equal(blk, old[b*BlockSize:(b+1)*BlockSize]) && !bytes.Equal(blk, neu[b*BlockSize:(b+1)*BlockSize]) {
					return points, fmt.Errorf("crash after step %d of %d (%s): block %d is neither the old nor the new value", k, steps, mode, b)
				}
			}
			h.sameCopies(r.ID)
		}
	}
	return points, nil
}

// A sequential writer's next dirty region is marked ahead of it: a stream
// of region-sized writes finds its region durable in the log when it
// arrives (its data goes to the disk at once, no log write first); a
// write whose region is in the log write already in flight waits for that
// one, not for another; a crash with a region marked ahead and never
// written costs only its copy, and the copies end identical.
func TestDirtyRegionsMarkedAhead(t *testing.T) {
	h := newHarness(t, 2, testDisk)
	const rb = DRLRegionBlocks
	r := h.create(8 * rb)
	p, s := r.Segs[0].Node, r.Segs[1].Node
	rep := h.nodes[p].e.reps[r.ID]
	landed := func(block uint64, data []byte) bool { // on the primary's disk, not yet synced
		raw := make([]byte, PhysBlockSize)
		h.nodes[p].devs[rep.disk].ReadAt(raw, rep.base+blockOff(block))
		d, _, st := DecodeBlock(raw, r.ID, block)
		return st == BlockOK && bytes.Equal(d, data[:BlockSize])
	}
	h.mustWrite(p, r.ID, 0, pattern(1, rb)) // region 0: not sequential (nothing before it)
	if n := h.nodes[p].e.stats.DRLAhead; n != 0 {
		t.Fatalf("%d regions marked ahead of a first write", n)
	}
	// Regions 1 and 2 back to back: the first's log write carries region
	// 2 ahead; the second waits for that write in flight, not another.
	before := h.nodes[p].e.stats.DRLWrites
	q1 := h.write(p, r.ID, rb, pattern(2, rb), nil)
	q2 := h.write(p, r.ID, 2*rb, pattern(3, rb), nil)
	h.run()
	for _, q := range []ReqID{q1, q2} {
		if err := h.replies[q].Err; err != nil {
			t.Fatal(err)
		}
	}
	if got := h.nodes[p].e.stats.DRLWrites - before; got != 2 { // {1, 2}, then 3 ahead
		t.Fatalf("%d log writes for two sequential writes, want 2", got)
	}
	// Region 3, marked ahead: the write's data lands at once.
	data := pattern(4, rb)
	q := h.write(p, r.ID, 3*rb, data, nil)
	if !landed(3*rb, data) {
		t.Fatal("a sequential write into a region marked ahead waited before writing")
	}
	h.run()
	if err := h.replies[q].Err; err != nil {
		t.Fatal(err)
	}
	for x := uint64(0); x <= 4; x++ {
		if !rep.drl.durable.Has(x) {
			t.Fatalf("region %d not in the log (%v)", x, rep.drl.durable.List())
		}
	}
	// Region 4 is marked and was never written; the primary crashes.
	h.crash(h.nodes[p], true, rand.New(rand.NewSource(1)))
	h.start(h.nodes[p])
	h.tick(3 * time.Second)
	for i, want := range [][]byte{pattern(1, rb), pattern(2, rb), pattern(3, rb), pattern(4, rb)} {
		h.mustRead(p, r.ID, uint64(i)*rb, want)
		h.mustRead(s, r.ID, uint64(i)*rb, want)
	}
	h.sameCopies(r.ID)
	// Nothing in flight and nothing written since: every mark is cleared.
	h.tick(3 * time.Second)
	if n := h.nodes[p].e.reps[r.ID].drl.durable.Count(); n != 0 {
		t.Fatalf("%d dirty regions left", n)
	}
}

// BenchmarkDecideManyRLDevs: an engine's tick (decide, after every input)
// on a node that holds none of a table's 4 000 RLDevs. decide went through
// every RLDev of the table, a clone of each; it now goes through those
// the node holds or frees extents of (decideIDs).
func BenchmarkDecideManyRLDevs(b *testing.B) {
	e := NewEngine(Config{Node: 1, Inc: 1, Disks: []LocalDisk{{Index: 0, Size: 1 << 30, UUID: "u", Path: "d"}}})
	t := &Table{Version: 1, RLDevs: map[uint64]*Record{}, Disks: map[DiskKey]*Disk{{1, 0}: {Node: 1, Index: 0, Size: 1 << 30, Path: "d", UUID: "u"}}}
	for id := uint64(1); id <= 4000; id++ {
		t.RLDevs[id] = &Record{ID: id, Blocks: 256, Segs: [2]Segment{{Node: 2}, {Node: 3}}, Inc: [2]uint64{1, 1}, Epoch: 1,
			Retiring: []Segment{{Node: 4, Offset: int64(id) << 20}}}
	}
	now := time.Unix(1000, 0)
	env := Env{Now: now, Deadline: now.Add(time.Hour)}
	for _, o := range e.SetTable(env, t, true, map[NodeID]uint64{1: 1, 2: 1, 3: 1}) {
		if _, ok := o.(Propose); ok {
			b.Fatalf("proposed %v", o)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		e.Tick(env)
	}
}
