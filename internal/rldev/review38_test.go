package rldev

import (
	"bytes"
	"errors"
	"testing"
	"time"

	pb "github.com/grovestore/grove/api/grovepb"
)

// review38 drives a harness with node a's disk I/O interceptable: a read
// or write it holds is carried out only when released (a hung I/O; a read
// released reads the disk as it is then), and a write can be failed.
type review38 struct {
	h         *harness
	a         *hnode
	holdRead  func(DiskRead) bool
	holdWrite func(DiskWrite) bool
	failWrite func(DiskWrite) bool
	held      []func()
}

func (d *review38) later(n *hnode, fn func() []any) {
	inc := n.inc
	d.h.queue = append(d.h.queue, func() {
		if n.up && n.inc == inc {
			d.exec(n, fn())
		}
	})
}

func (d *review38) exec(n *hnode, out []any) {
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
			if n == d.a && d.holdRead != nil && d.holdRead(x) {
				d.held = append(d.held, do)
				continue
			}
			do()
		case DiskWrite:
			fail := n == d.a && d.failWrite != nil && d.failWrite(x)
			do := func() {
				err := errors.New("EIO (injected)")
				if !fail {
					err = DoWrite(n.devs[x.Disk], x)
				}
				d.later(n, func() []any { return n.e.DiskDone(h.env(n), x.Op, nil, err) })
			}
			if n == d.a && d.holdWrite != nil && d.holdWrite(x) {
				d.held = append(d.held, do)
				continue
			}
			do()
		case DiskSync:
			err := n.devs[x.Disk].Sync()
			d.later(n, func() []any { return n.e.DiskDone(h.env(n), x.Op, nil, err) })
		case Send:
			to := h.nodes[x.To]
			if to == nil || !to.up || h.isCut(n.id, x.To) {
				continue
			}
			inc, from := to.inc, n.id
			h.queue = append(h.queue, func() {
				if to.up && to.inc == inc && !h.isCut(from, to.id) {
					d.exec(to, to.e.Deliver(h.env(to), from, x.Msg))
				}
			})
		case Reply:
			h.replies[x.Req] = x
		case Propose:
			q := len(h.queue)
			err := h.propose(&pb.Decree{Namespace: Namespace, ExpectedVersion: x.Version, Ops: x.Ops})
			h.queue = h.queue[:q] // the harness's SetTable deliveries, replaced by ours
			if err == nil {
				for _, m := range h.sorted() {
					if m.up {
						m := m
						h.queue = append(h.queue, func() { d.exec(m, m.e.SetTable(h.env(m), h.table(), false, h.incs())) })
					}
				}
			}
			d.later(n, func() []any { return n.e.Decided(h.env(n), x.ID, err) })
		case AskDead:
			for _, s := range x.Subjects {
				s, dead := s, h.dead[s]
				d.later(n, func() []any { return n.e.Verdict(h.env(n), s, dead) })
			}
		case Refresh:
			d.later(n, func() []any { return n.e.SetTable(h.env(n), h.table(), true, h.incs()) })
		case Log:
			if x.Level >= 2 {
				h.t.Logf("node %d log: %s %v", n.id, x.Msg, x.Args)
			}
		}
	}
}

func (d *review38) tickUntil(max time.Duration, cond func() bool) bool {
	h := d.h
	for s := time.Duration(0); s < max; s += 100 * time.Millisecond {
		if cond() {
			return true
		}
		h.now = h.now.Add(100 * time.Millisecond)
		for _, n := range h.sorted() {
			if n.up {
				d.exec(n, n.e.Tick(h.env(n)))
			}
		}
		h.run()
	}
	return cond()
}

func (d *review38) release(i int) {
	f := d.held[i]
	d.held = append(d.held[:i:i], d.held[i+1:]...)
	f()
	d.h.run()
}

// TestReview38LateRepairReadWritesOldDataAfterReload (review 38): a read
// repair of the failed life (rewriteBad) whose disk read was still in
// flight when the replica loaded again (replica.retry reset the range
// locks; reads were not counted) completed in the new life: it wrote the
// peer's copy of the block as the failed life pulled it, under a range
// lock that no longer ordered anything, concurrently with the new life's
// resync copy of that block. The copy landed first, the stale repair
// second: once resynced, the replica served the block's old content,
// though a newer write was acknowledged before. Now a replica loads again
// only once none of its reads is in progress either: the repair finishes
// in the failed life, and the resync copies the block after it.
func TestReview38LateRepairReadWritesOldDataAfterReload(t *testing.T) {
	h := newHarness(t, 2, testDisk, func(h *harness) { h.scrubRate = -1 })
	rec := h.create(512)
	p, s := rec.Segs[0].Node, rec.Segs[1].Node // p primary, s (node a) the secondary
	h.mustWrite(p, rec.ID, 10, pattern(1, 1))  // D1 on both
	a := h.nodes[s]
	d := &review38{h: h, a: a}
	base := rec.Segs[1].Offset
	a.devs[rec.Segs[1].Disk].FlipBit(base+blockOff(10)+HeaderSize+100, 3) // block 10 rots at a

	// A read at a finds block 10 bad and repairs it from p (D1); the
	// repair's read of the block under its exclusive range lock hangs.
	runReads := 0
	d.holdRead = func(x DiskRead) bool {
		if x.Run != nil && x.Off == base+blockOff(10) && x.Run.N == 1 {
			runReads++
			return runReads == 2
		}
		return false
	}
	h.nextReq++
	r0 := h.nextReq
	d.exec(a, a.e.Read(h.env(a), r0, rec.ID, 10, 1, -1))
	h.run()
	if len(d.held) != 1 {
		t.Fatalf("setup: the repair's read not held (%d held, reply %+v)", len(d.held), h.replies[r0])
	}
	d.holdRead = nil
	readR := d.held[0]
	d.held = nil

	// a's disk fails on a forwarded write: a leaves (stale), p degraded.
	d.failWrite = func(x DiskWrite) bool { return x.Encode != nil && x.Off == base+blockOff(100) }
	h.nextReq++
	w0 := h.nextReq
	d.exec(h.nodes[p], h.nodes[p].e.Write(h.env(h.nodes[p]), w0, rec.ID, 100, pattern(9, 1), nil, -1))
	h.run()
	d.failWrite = nil
	if !d.tickUntil(3*time.Second, func() bool { r := h.rec(rec.ID); return r.State == Degraded && r.Stale[1] }) {
		t.Fatalf("setup: record %+v, want degraded, segment 1 stale", h.rec(rec.ID))
	}
	// W: block 10 = D2, acknowledged by p alone.
	h.nextReq++
	w := h.nextReq
	d.exec(h.nodes[p], h.nodes[p].e.Write(h.env(h.nodes[p]), w, rec.ID, 10, pattern(2, 1), nil, -1))
	h.run()
	if rp, ok := h.replies[w]; !ok || rp.Err != nil {
		t.Fatalf("W: %+v (replied %v)", rp.Err, ok)
	}

	// ReloadEvery later a still does not load again: the failed life's
	// repair read is in progress (before the fix it did, and the read,
	// completing in the new life, wrote D1 under a lock the reload had
	// dropped, over the resync's copy of D2).
	if d.tickUntil(10*time.Second, func() bool { return a.e.reps[rec.ID].state != repFailed }) {
		t.Fatalf("a loaded again (state %v) while a read of its failed life is in progress", a.e.reps[rec.ID].state)
	}
	// The read completes (block 10 still bad on disk): the failed life's
	// repair goes on in the failed life; then a loads again and is
	// resynced, its copy of block 10 (D2) after anything of that life.
	readR()
	h.run()
	if !d.tickUntil(20*time.Second, func() bool { r := h.rec(rec.ID); return r.State == Normal && !r.Stale[1] }) {
		t.Fatalf("not resynced: %+v (a: %v)", h.rec(rec.ID), a.e.reps[rec.ID].state)
	}

	h.nextReq++
	q := h.nextReq
	d.exec(a, a.e.Read(h.env(a), q, rec.ID, 10, 1, -1))
	h.run()
	rp, ok := h.replies[q]
	if !ok || rp.Err != nil {
		t.Fatalf("read at a: %+v (replied %v)", rp.Err, ok)
	}
	if !bytes.Equal(rp.Data, pattern(2, 1)) {
		t.Fatalf("block 10 read at node %d (resynced, serving) holds %#x..., the failed life's repair data, not the acknowledged W's %#x...: "+
			"a read of the failed life completed after the reload and wrote under a range lock the reload had dropped", s, rp.Data[0], pattern(2, 1)[0])
	}
}
