package rldev

import (
	"bytes"
	"testing"
	"time"

	pb "github.com/grovestore/grove/api/grovepb"
)

// Review 79: resends of forwards (an OK to an earlier forward of the same
// write counts), the peer's dedupe of forwards being written (fwdIn), and
// the disk watchdog's progress rule (answered, StuckFactor).

// r79Pair: two nodes, one RLDev (its dirty-region log off if drlOff);
// a its primary, b its secondary.
func r79Pair(t *testing.T, drlOff bool, opts ...func(*harness)) (*harness, *Record, *hnode, *hnode) {
	t.Helper()
	h := newHarness(t, 2, testDisk, opts...)
	tb := h.table()
	r, err := tb.Create(1024, drlOff)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.propose(&pb.Decree{Namespace: Namespace, ExpectedVersion: tb.Version, Ops: []*pb.Op{r.PutOp()}}); err != nil {
		t.Fatal(err)
	}
	h.run()
	h.joined(r.ID)
	rec := h.rec(r.ID)
	return h, rec, h.nodes[rec.Segs[rec.Primary].Node], h.nodes[rec.Segs[1-rec.Primary].Node]
}

// r79Crossing: a write W1 of block blk through a, whose forward's data
// write at b is held past RetryEvery; a's retry sends it again, and the
// link from a to b is slow from then on (what a sends b is kept, in
// order, in d.wire, until r79Deliver); then b's write of the first
// forward lands and b answers it: the resend and b's OK cross.
func r79Crossing(t *testing.T, d *r79Driver, rec *Record, a, b *hnode, blk uint64, data []byte) ReqID {
	t.Helper()
	h := d.h
	base := b.e.reps[rec.ID].base
	h.holdWrite = func(x *hnode, w DiskWrite) bool { return x == b && w.Off >= base+MetaSize }
	q := d.write(a, rec.ID, blk, data)
	if len(h.held) != 1 {
		t.Fatalf("setup: %d held writes at b, want 1", len(h.held))
	}
	h.holdWrite = nil
	d.slow = [2]NodeID{a.id, b.id}
	resent := func() bool {
		for _, m := range d.wire {
			if f, ok := m.(Forward); ok && f.Block == blk {
				return true
			}
		}
		return false
	}
	for i := 0; i < 20 && !resent(); i++ {
		d.tick(100 * time.Millisecond)
	}
	if !resent() {
		t.Fatalf("setup: a did not send the forward again")
	}
	// b's disk answers the first forward's write: b acknowledges it.
	h.release(0)
	return q
}

// deliver delivers what was kept on the slow link, in order, and makes
// it fast again.
func (d *r79Driver) deliver() {
	h := d.h
	from, to := h.nodes[d.slow[0]], h.nodes[d.slow[1]]
	wire := d.wire
	d.wire, d.slow = nil, [2]NodeID{}
	for _, m := range wire {
		d.exec(to, to.e.Deliver(h.env(to), from.id, m))
		h.run()
	}
}

func (d *r79Driver) readReplica(t *testing.T, n *hnode, id, blk uint64, seg int) []byte {
	t.Helper()
	h := d.h
	h.nextReq++
	q := h.nextReq
	d.exec(n, n.e.Read(h.env(n), q, id, blk, 1, seg))
	h.run()
	r, ok := h.replies[q]
	if !ok || r.Err != nil {
		t.Fatalf("ReadReplica %d of block %d on node %d: %v (answered %v)", seg, blk, n.id, r.Err, ok)
	}
	return r.Data
}

func (d *r79Driver) writeReplica(t *testing.T, n *hnode, id, blk uint64, data []byte, seg int) {
	t.Helper()
	h := d.h
	h.nextReq++
	q := h.nextReq
	d.exec(n, n.e.Write(h.env(n), q, id, blk, data, nil, seg))
	h.run()
	if r, ok := h.replies[q]; !ok || r.Err != nil {
		t.Fatalf("WriteReplica %d of block %d on node %d: %v (answered %v)", seg, blk, n.id, r.Err, ok)
	}
}

// The resend's argument holds for writes that go through the primary: a
// copy of W1 sent again and still on the link when W1 is acknowledged
// (b's OK to the first forward) is taken at b before W2 of the same
// block, which a forwards on the same link after it. Both copies end with
// W2.
func TestReview79ResendCrossingThenPrimaryWrite(t *testing.T) {
	h, rec, a, b := r79Pair(t, false, r79NoScrub)
	h.mustWrite(a.id, rec.ID, 10, pattern(1, 1))
	d := newR79Driver(t, h)
	q1 := r79Crossing(t, d, rec, a, b, 10, pattern(2, 1))
	r1, acked := h.replies[q1]
	t.Logf("W1 acknowledged while its resend is on the link: %v (err %v); %d messages on the link", acked, r1.Err, len(d.wire))
	q2 := d.write(a, rec.ID, 10, pattern(3, 1))
	t.Logf("with W2: %d messages on the link", len(d.wire))
	d.deliver()
	for i := 0; i < 30; i++ {
		d.tick(100 * time.Millisecond)
	}
	if r, ok := h.replies[q1]; !ok || r.Err != nil {
		t.Fatalf("W1: %v (answered %v)", r.Err, ok)
	}
	if r, ok := h.replies[q2]; !ok || r.Err != nil {
		t.Fatalf("W2: %v (answered %v)", r.Err, ok)
	}
	h.sameCopies(rec.ID)
	if got := d.readReplica(t, b, rec.ID, 10, 1-rec.Primary); !bytes.Equal(got, pattern(3, 1)) {
		t.Fatalf("DEFECT: b holds %q..., not W2", got[:4])
	}
}

// A write acknowledged on b's OK to its first forward, while a copy of it
// sent again is still on the link to b, lands at b after the
// acknowledgement. A later write of the block that does not come to b
// through the primary's link -- WriteReplica, on an RLDev whose client
// keeps the replicas itself -- is then overwritten at b by the old write:
// the replicas differ, and b serves the old data. Before the change only
// the last forward's OK counted, and every earlier copy had been taken at
// b (in order, under b's FIFO range locks) before the last was answered:
// nothing of an acknowledged write was left to land.
func TestReview79ResentForwardLandsAfterAckOverWriteReplica(t *testing.T) {
	h, rec, a, b := r79Pair(t, true, r79NoScrub)
	aSeg, bSeg := rec.Primary, 1-rec.Primary
	h.mustWrite(a.id, rec.ID, 10, pattern(1, 1))
	d := newR79Driver(t, h)
	q1 := r79Crossing(t, d, rec, a, b, 10, pattern(2, 1))
	r1, acked := h.replies[q1]
	if !acked {
		// (The old rule: W1 waits for the resend's own answer.)
		d.deliver()
		r1, acked = h.replies[q1]
	}
	if !acked || r1.Err != nil {
		t.Fatalf("setup: W1 answered %v, %v", acked, r1.Err)
	}
	// The client, W1 acknowledged, writes each replica itself.
	d.writeReplica(t, a, rec.ID, 10, pattern(7, 1), aSeg)
	d.writeReplica(t, b, rec.ID, 10, pattern(7, 1), bSeg)
	// The resend, slow on its link, arrives.
	d.deliver()
	for i := 0; i < 10; i++ {
		d.tick(100 * time.Millisecond)
	}
	ga := d.readReplica(t, a, rec.ID, 10, aSeg)
	gb := d.readReplica(t, b, rec.ID, 10, bSeg)
	if !bytes.Equal(gb, pattern(7, 1)) || !bytes.Equal(ga, gb) {
		t.Fatalf("DEFECT: W1 was acknowledged on b's OK to its first forward while a copy sent again was still on the link; "+
			"that copy landed at b after the acknowledgement, over a later WriteReplica of the block: replica %d (node %d) holds %q..., replica %d (node %d) %q... (want %q...)",
			aSeg, a.id, ga[:4], bSeg, b.id, gb[:4], pattern(7, 1)[:4])
	}
}

// The dedupe answers a copy sent again with the first forward's outcome:
// when b's disk fails the first's write, every copy is refused, none OK;
// the write is acknowledged only once b is stale, and nothing is left in
// b's table of forwards being written.
func TestReview79DedupeFirstFailsAllRefused(t *testing.T) {
	h, rec, a, b := r79Pair(t, false)
	h.mustWrite(a.id, rec.ID, 10, pattern(1, 1))
	base := b.e.reps[rec.ID].base
	failed := false
	h.failWrite = func(x *hnode, w DiskWrite) bool {
		if x == b && w.Off >= base+MetaSize && !failed {
			failed = true
			return true
		}
		return false
	}
	h.holdWrite = func(x *hnode, w DiskWrite) bool { return x == b && w.Off >= base+MetaSize }
	q := h.write(a.id, rec.ID, 10, pattern(2, 1), nil)
	h.run()
	if len(h.held) != 1 {
		t.Fatalf("setup: %d held", len(h.held))
	}
	h.holdWrite = nil
	h.tick(3 * time.Second) // resends, each deduped at b
	br := b.e.reps[rec.ID]
	if len(br.fwdIn) != 1 {
		t.Fatalf("b's forwards being written: %d, want 1", len(br.fwdIn))
	}
	for _, dup := range br.fwdIn {
		t.Logf("copies waiting on the first: %d", len(dup.seqs))
	}
	if _, ok := h.replies[q]; ok {
		t.Fatalf("the write was answered while b's copy was held")
	}
	h.release(0) // fails
	h.tickUntil(20*time.Second, func() bool { _, ok := h.replies[q]; return ok })
	r, ok := h.replies[q]
	rc := h.rec(rec.ID)
	if !ok || r.Err != nil {
		t.Fatalf("the write: answered %v, %v (record %+v)", ok, r.Err, rc)
	}
	if !rc.Stale[1-rec.Primary] {
		t.Fatalf("DEFECT: the write was acknowledged while b's copy failed, b not stale: %+v", rc)
	}
	if n := len(b.e.reps[rec.ID].fwdIn); n != 0 {
		t.Fatalf("DEFECT: %d forward entries left at b", n)
	}
}

// ------------------------------------------------------------------ the watchdog

// r79Driver runs a harness's engines as harness.exec does, and can hold a
// node's disk syncs (never answered): the harness has no such hook. It
// takes over once the harness's queue is drained.
type r79Driver struct {
	h         *harness
	holdSync  func(*hnode, DiskSync) bool
	heldSyncs []func()
	// slow: what slow[0] sends slow[1] is kept in wire (a slow link,
	// in order) until deliver.
	slow [2]NodeID
	wire []any
	// latency: a disk operation of a node it gives a duration for
	// completes that long after its issue (delayed, run by tick).
	latency func(*hnode) time.Duration
	delayed []r79Delayed
	// syncOnly: latency applies to syncs alone (buffered writes and
	// cached reads answered at once).
	syncOnly bool
}

type r79Delayed struct {
	at time.Time
	do func()
}

// defer_ holds do until its node's latency passed, if it has one.
func (d *r79Driver) defer_(n *hnode, do func()) bool {
	return d.deferOp(n, do, true)
}

func (d *r79Driver) deferOp(n *hnode, do func(), sync bool) bool {
	if d.latency == nil || d.syncOnly && !sync {
		return false
	}
	l := d.latency(n)
	if l <= 0 {
		return false
	}
	d.delayed = append(d.delayed, r79Delayed{at: d.h.now.Add(l), do: do})
	return true
}

// newR79Driver takes over h's engines (h's queue drained); the tables
// decrees make go through the driver too.
func newR79Driver(t *testing.T, h *harness) *r79Driver {
	t.Helper()
	h.run()
	h.noTables = true
	return &r79Driver{h: h}
}

func (d *r79Driver) later(n *hnode, fn func() []any) {
	h := d.h
	inc := n.inc
	h.queue = append(h.queue, func() {
		if n.up && n.inc == inc {
			d.exec(n, fn())
		}
	})
}

func (d *r79Driver) exec(n *hnode, out []any) {
	h := d.h
	for _, o := range out {
		switch x := o.(type) {
		case DiskRead:
			do := func() {
				if x.Run != nil {
					res, err := ReadRun(n.devs[x.Disk], x.Off, *x.Run)
					d.later(n, func() []any { return n.e.RunDone(h.env(n), x.Op, res, err) })
					return
				}
				buf := make([]byte, x.Len)
				_, err := n.devs[x.Disk].ReadAt(buf, x.Off)
				d.later(n, func() []any { return n.e.DiskDone(h.env(n), x.Op, buf, err) })
			}
			if h.holdRead != nil && h.holdRead(n, x) {
				h.held = append(h.held, do)
				continue
			}
			if d.deferOp(n, do, false) {
				continue
			}
			do()
		case DiskWrite:
			do := func() {
				err := DoWrite(n.devs[x.Disk], x)
				d.later(n, func() []any { return n.e.DiskDone(h.env(n), x.Op, nil, err) })
			}
			if h.holdWrite != nil && h.holdWrite(n, x) {
				h.held = append(h.held, do)
				continue
			}
			if d.deferOp(n, do, false) {
				continue
			}
			do()
		case DiskSync:
			do := func() {
				err := n.devs[x.Disk].Sync()
				d.later(n, func() []any { return n.e.DiskDone(h.env(n), x.Op, nil, err) })
			}
			if d.holdSync != nil && d.holdSync(n, x) {
				d.heldSyncs = append(d.heldSyncs, do)
				continue
			}
			if d.defer_(n, do) {
				continue
			}
			do()
		case DiskDrop:
			err := n.devs[x.Disk].DropCache(x.Off, x.Len)
			d.later(n, func() []any { return n.e.DiskDone(h.env(n), x.Op, nil, err) })
		case Send:
			to := h.nodes[x.To]
			if to == nil || !to.up || h.isCut(n.id, x.To) {
				continue
			}
			if d.slow[0] == n.id && d.slow[1] == x.To {
				d.wire = append(d.wire, x.Msg)
				continue
			}
			inc := to.inc
			from := n.id
			h.queue = append(h.queue, func() {
				if to.up && to.inc == inc && !h.isCut(from, to.id) {
					d.exec(to, to.e.Deliver(h.env(to), from, x.Msg))
				}
			})
		case Reply:
			h.replies[x.Req] = x
		case Propose:
			err := h.propose(&pb.Decree{Namespace: Namespace, ExpectedVersion: x.Version, Ops: x.Ops})
			if err == nil {
				for _, m := range h.sorted() {
					if m.up {
						m := m
						d.later(m, func() []any { return m.e.SetTable(h.env(m), h.table(), false, h.incs()) })
					}
				}
			}
			d.later(n, func() []any { return n.e.Decided(h.env(n), x.ID, err) })
		case AskDead:
			for _, s := range x.Subjects {
				s := s
				dead := h.dead[s]
				d.later(n, func() []any { return n.e.Verdict(h.env(n), s, dead) })
			}
		case Refresh:
			d.later(n, func() []any { return n.e.SetTable(h.env(n), h.table(), true, h.incs()) })
		case Log:
			if x.Level >= 3 {
				h.t.Logf("node %d log: %s %v", n.id, x.Msg, x.Args)
			}
		default:
			h.t.Fatalf("unknown effect %T", o)
		}
	}
}

func (d *r79Driver) tick(step time.Duration) {
	h := d.h
	h.now = h.now.Add(step)
	for len(d.delayed) > 0 && !d.delayed[0].at.After(h.now) {
		x := d.delayed[0]
		d.delayed = d.delayed[1:]
		x.do()
		h.run()
	}
	for _, n := range h.sorted() {
		if n.up {
			d.exec(n, n.e.Tick(h.env(n)))
		}
	}
	h.run()
}

func (d *r79Driver) write(n *hnode, id, blk uint64, data []byte) ReqID {
	h := d.h
	h.nextReq++
	q := h.nextReq
	d.exec(n, n.e.Write(h.env(n), q, id, blk, data, nil, -1))
	h.run()
	return q
}

// The hang DiskTimeout names first, "a sync that never returns", on a
// disk that still takes writes: the runtime's writes are buffered
// (FileDevice without DirectWrites) and return from the page cache, and
// its reads (the scrubber's, clients') are answered from it too. Each
// such answer counts as the disk's progress (answered), so the disk is
// never "silent" while anything reaches it, and the stuck sync makes it
// hung only at StuckFactor x DiskTimeout (60 s), not DiskTimeout (20 s)
// as before: every write of every RLDev with a copy on the disk waits
// three times as long (past the 30 s the DiskTimeout comment means to
// stay under). Schedule: b's syncs hang; every second a client writes a
// block through a, and one reads a block from b (neither needs a sync at
// b to be answered by b's disk).
func TestReview79HungSyncWhileWritesAnswered(t *testing.T) {
	h, rec, a, b := r79Pair(t, false)
	h.mustWrite(a.id, rec.ID, 10, pattern(1, 1))
	h.tick(3 * time.Second)
	d := newR79Driver(t, h)
	d.holdSync = func(n *hnode, _ DiskSync) bool { return n == b }
	start := h.now
	first := d.write(a, rec.ID, 20, pattern(2, 1))
	var hungAt, answeredAt time.Duration
	for s := time.Duration(0); s < StuckFactor*DefaultDiskTimeout+10*time.Second; s += 100 * time.Millisecond {
		if s%time.Second == 0 {
			// A client's write through a, and one's read from b, of
			// other blocks (a buffered write, a read of the page cache).
			k := uint64(s / time.Second)
			d.write(a, rec.ID, 100+(k*67)%900, pattern(3, 1))
			h.nextReq++
			d.exec(b, b.e.Read(h.env(b), h.nextReq, rec.ID, 1000-k%50, 1, -1))
			h.run()
		}
		d.tick(100 * time.Millisecond)
		if hungAt == 0 && b.e.diskHung(0) {
			hungAt = h.now.Sub(start)
		}
		if _, ok := h.replies[first]; ok && answeredAt == 0 {
			answeredAt = h.now.Sub(start)
		}
		if hungAt != 0 && answeredAt != 0 {
			break
		}
	}
	t.Logf("b's sync held: %d syncs held; disk found hung after %v; the first write answered after %v (%v); record %+v",
		len(d.heldSyncs), hungAt, answeredAt, h.replies[first].Err, h.rec(rec.ID))
	if len(d.heldSyncs) != 1 {
		t.Fatalf("setup: %d syncs held at b, want 1", len(d.heldSyncs))
	}
	if hungAt == 0 || hungAt > DefaultDiskTimeout+2*time.Second {
		t.Fatalf("DEFECT: b's sync never returned, yet its disk was found hung only after %v (disk timeout %v): the writes and reads it answered from the page cache counted as progress; a write of the RLDev waited %v",
			hungAt, DefaultDiskTimeout, answeredAt)
	}
}

// A disk whose syncs take 45 s each (a device whose commands the kernel
// retries once past its 30 s command timeout, then succeed: the case
// DiskTimeout names second), while buffered writes and cached reads are
// answered at once (as the runtime's FileDevice does without
// DirectWrites). Before the change, a sync 20 s old made the disk hung,
// its segments failed, and the RLDevs went on with their other copies.
// Now the cache's answers keep the disk from being silent, and no sync
// lives 60 s (StuckFactor): the disk is never found hung, and every write
// of every RLDev with a copy on it waits up to 90 s for as long as the
// device stays so. Schedule: b's syncs take 45 s; every second a client
// writes a block through a and one reads a block from b.
func TestReview79SlowSyncsNeverHung(t *testing.T) {
	h, rec, a, b := r79Pair(t, false)
	h.mustWrite(a.id, rec.ID, 10, pattern(1, 1))
	h.tick(3 * time.Second)
	d := newR79Driver(t, h)
	d.latency = func(n *hnode) time.Duration {
		if n == b {
			return 45 * time.Second
		}
		return 0
	}
	d.syncOnly = true
	start := h.now
	first := d.write(a, rec.ID, 20, pattern(2, 1))
	var hungAt, answeredAt, worst time.Duration
	issued := map[ReqID]time.Time{}
	for s := time.Duration(0); s < 150*time.Second; s += 100 * time.Millisecond {
		if s%time.Second == 0 {
			k := uint64(s / time.Second)
			issued[d.write(a, rec.ID, 100+(k*67)%900, pattern(3, 1))] = h.now
			h.nextReq++
			d.exec(b, b.e.Read(h.env(b), h.nextReq, rec.ID, 1000-k%50, 1, -1))
			h.run()
		}
		d.tick(100 * time.Millisecond)
		if hungAt == 0 && b.e.diskHung(0) {
			hungAt = h.now.Sub(start)
		}
		if _, ok := h.replies[first]; ok && answeredAt == 0 {
			answeredAt = h.now.Sub(start)
		}
		for q, at := range issued {
			if _, ok := h.replies[q]; ok {
				worst = max(worst, h.now.Sub(at))
				delete(issued, q)
			}
		}
		if hungAt != 0 {
			break
		}
	}
	t.Logf("slowest write answered after %v", worst)
	t.Logf("b's disk 45 s per sync: found hung after %v; the first write answered after %v (%v); record %+v",
		hungAt, answeredAt, h.replies[first].Err, h.rec(rec.ID))
	if hungAt == 0 || hungAt > DefaultDiskTimeout+2*time.Second {
		t.Fatalf("DEFECT: a disk whose syncs take 45 s was not found hung in %v (disk timeout %v; found hung after %v): "+
			"its cached answers count as progress and no sync lives %v; writes through the primary took up to %v",
			150*time.Second, DefaultDiskTimeout, hungAt, StuckFactor*DefaultDiskTimeout, worst)
	}
}

// r79NoScrub turns the scrubber off (its pulls would only add traffic to
// the schedules).
func r79NoScrub(h *harness) { h.scrubRate = -1 }
