package rldev

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	pb "github.com/grovestore/grove/api/grovepb"
)

// r38bDriver drives a harness with its effects interceptable: a disk write
// of either node can be failed (EIO, nothing written), a decree proposed
// by node a can be held (a slow config service: neither applied nor
// answered until the test says), and the tables the engines ask for
// (Refresh) can be withheld (a linearizable read that is slow to answer).
type r38bDriver struct {
	h           *harness
	a           *hnode
	failWrite   func(n *hnode, x DiskWrite) bool
	holdPropose func(Propose) bool
	held        []Propose
	noTables    bool // Refresh effects are dropped (counted in refreshes)
	refreshes   int
}

func (d *r38bDriver) later(n *hnode, fn func() []any) {
	inc := n.inc
	d.h.queue = append(d.h.queue, func() {
		if n.up && n.inc == inc {
			d.exec(n, fn())
		}
	})
}

// tables queues, as a watch would, the harness's table to every up node.
func (d *r38bDriver) tables(linearizable bool) {
	h := d.h
	for _, m := range h.sorted() {
		if m.up {
			m := m
			h.queue = append(h.queue, func() { d.exec(m, m.e.SetTable(h.env(m), h.table(), linearizable, h.incs())) })
		}
	}
}

// commit applies a proposal to the harness's namespace, as the config
// service would, and returns its outcome; the watch's table deliveries
// are left to the caller (tables).
func (d *r38bDriver) commit(x Propose) error {
	h := d.h
	q := len(h.queue)
	err := h.propose(&pb.Decree{Namespace: Namespace, ExpectedVersion: x.Version, Ops: x.Ops})
	h.queue = h.queue[:q] // the harness's SetTable deliveries (through h.exec), replaced by ours
	return err
}

func (d *r38bDriver) exec(n *hnode, out []any) {
	h := d.h
	for _, o := range out {
		switch x := o.(type) {
		case DiskRead:
			if x.Run != nil {
				res, err := ReadRun(n.devs[x.Disk], x.Off, *x.Run)
				d.later(n, func() []any { return n.e.RunDone(h.env(n), x.Op, res, err) })
				continue
			}
			buf := make([]byte, x.Len)
			_, err := n.devs[x.Disk].ReadAt(buf, x.Off)
			d.later(n, func() []any { return n.e.DiskDone(h.env(n), x.Op, buf, err) })
		case DiskWrite:
			err := errors.New("EIO (injected)")
			if d.failWrite == nil || !d.failWrite(n, x) {
				err = DoWrite(n.devs[x.Disk], x)
			}
			d.later(n, func() []any { return n.e.DiskDone(h.env(n), x.Op, nil, err) })
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
			if n == d.a && d.holdPropose != nil && d.holdPropose(x) {
				h.t.Logf("node %d: decree %q (version %d) held", n.id, x.What, x.Version)
				d.held = append(d.held, x)
				continue
			}
			err := d.commit(x)
			if err == nil {
				d.tables(false)
			}
			d.later(n, func() []any { return n.e.Decided(h.env(n), x.ID, err) })
		case AskDead:
			for _, s := range x.Subjects {
				s, dead := s, h.dead[s]
				d.later(n, func() []any { return n.e.Verdict(h.env(n), s, dead) })
			}
		case Refresh:
			if d.noTables {
				d.refreshes++
				continue
			}
			d.later(n, func() []any { return n.e.SetTable(h.env(n), h.table(), true, h.incs()) })
		case Log:
			if x.Level >= 2 {
				h.t.Logf("node %d log: %s %v", n.id, x.Msg, x.Args)
			}
		}
	}
}

func (d *r38bDriver) tickUntil(max time.Duration, cond func() bool) bool {
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

func (d *r38bDriver) write(n *hnode, id, block uint64, data []byte) ReqID {
	h := d.h
	h.nextReq++
	q := h.nextReq
	d.exec(n, n.e.Write(h.env(n), q, id, block, data, nil, -1))
	h.run()
	return q
}

func (d *r38bDriver) read(n *hnode, id, block uint64) Reply {
	h := d.h
	h.nextReq++
	q := h.nextReq
	d.exec(n, n.e.Read(h.env(n), q, id, block, 1, -1))
	h.run()
	rp, ok := h.replies[q]
	if !ok {
		h.t.Fatalf("read of block %d at node %d: no reply", block, n.id)
	}
	return rp
}

// TestReview38bDecreeAfterReload (review 38, defect B): a decree of a
// replica's failed life committing after the replica loaded again. Primary
// a has resynced b and proposed "resynced" (Normal, nothing stale); the
// config service is slow. Meanwhile W_f (block 20) is forwarded to b and
// lands there, and a's own write of it fails: a fails, W_f is answered
// "may have been written". The table a holds still says b stale, so a
// loaded again after ReloadEvery and served as the only up-to-date copy,
// moving W_f's dirty region into its degraded-mode log. Then the old
// decree committed: Normal, nothing stale, and lazyClear dropped the
// degraded-mode region, never copied: block 20 read D1 at a and W_f at b,
// both serving in the normal state. Now a replica loads again only once no
// decree of its engine is in flight (decreeOut) and the table has shown
// the last one decided (awaitTable): a stays failed until the "resynced"
// table arrives, then leaves the RLDev by decree (b primary, a stale) and
// is resynced from b, block 20 with the rest.
func TestReview38bDecreeAfterReload(t *testing.T) {
	// No scrubber: it compares the replicas' generations and would
	// eventually repair the divergence this test looks for (the defect is
	// that the normal state served two versions, however long).
	h := newHarness(t, 2, testDisk, func(h *harness) { h.scrubRate = -1 })
	rec := h.create(512)
	id := rec.ID
	a, b := h.nodes[rec.Segs[0].Node], h.nodes[rec.Segs[1].Node] // a primary, b secondary
	baseA, baseB := rec.Segs[0].Offset, rec.Segs[1].Offset
	h.mustWrite(a.id, id, 20, pattern(1, 1)) // D1 on both
	d := &r38bDriver{h: h, a: a}
	dataAt := func(node *hnode, base int64, block uint64) func(*hnode, DiskWrite) bool {
		return func(n *hnode, x DiskWrite) bool { return n == node && x.Encode != nil && x.Off == base+blockOff(block) }
	}

	// b's disk fails on a forwarded write: b leaves (stale), a degraded.
	// ReloadEvery later b loads again, asks to be resynced, and a copies
	// it whole; once done a proposes "resynced", which the config service
	// holds.
	d.holdPropose = func(x Propose) bool { return strings.Contains(x.What, "resynced") }
	d.failWrite = dataAt(b, baseB, 100)
	if rp, ok := h.replies[d.write(a, id, 100, pattern(9, 1))]; !ok || rp.Err != nil {
		t.Fatalf("setup: the write that fails b: %+v (replied %v)", rp.Err, ok)
	}
	d.failWrite = nil
	if !d.tickUntil(30*time.Second, func() bool { return len(d.held) == 1 }) {
		t.Fatalf("setup: no \"resynced\" decree from node %d: record %+v", a.id, h.rec(id))
	}
	held := d.held[0]
	if r := h.rec(id); r.State != Resyncing || !r.Stale[1] || r.Primary != 0 {
		t.Fatalf("setup: record %+v, want resyncing, node %d primary, segment 1 stale", r, a.id)
	}

	// W_f: forwarded to b, where it lands; a's write of it fails. a
	// fails; W_f is answered "may have been written".
	d.failWrite = dataAt(a, baseA, 20)
	wf := d.write(a, id, 20, pattern(2, 1))
	d.failWrite = nil
	if rp, ok := h.replies[wf]; !ok || !errors.Is(rp.Err, ErrMaybeWritten) {
		t.Fatalf("W_f: %+v (replied %v), want ErrMaybeWritten", rp.Err, ok)
	}
	ra := a.e.reps[id]
	if ra.state != repFailed {
		t.Fatalf("setup: node %d's replica %v after W_f's local write failed, want failed", a.id, ra.state)
	}

	// ReloadEvery (5 s) and more pass, the decree still held: a must not
	// load again (before the fix it did at 5 s, the table it holds
	// saying b stale, and served).
	reloaded := false
	if d.tickUntil(10*time.Second, func() bool { return ra.state != repFailed }) {
		reloaded = true
		t.Errorf("node %d loaded its failed replica again (state %v) while its \"resynced\" decree was in flight", a.id, ra.state)
	}

	// The decree commits and is answered, but the table that shows it is
	// slow to arrive (no watch, the Refresh unanswered): a still must not
	// load again, since the table it holds does not show its decree yet.
	d.noTables = true
	err := d.commit(held)
	if err != nil {
		t.Fatalf("the held decree no longer commits: %v (record %+v)", err, h.rec(id))
	}
	d.exec(a, a.e.Decided(h.env(a), held.ID, err))
	h.run()
	if r := h.rec(id); r.State != Normal || r.Stale[0] || r.Stale[1] {
		t.Fatalf("the held decree committed: record %+v, want normal, nothing stale", r)
	}
	if d.tickUntil(2*time.Second, func() bool { return ra.state != repFailed }) && !reloaded {
		t.Errorf("node %d loaded its failed replica again (state %v) after its decree was decided, before a table showed it", a.id, ra.state)
	}
	// The table arrives: a, failed in a normal RLDev, leaves it by decree
	// and is resynced from b.
	d.noTables = false
	d.tables(true)
	h.run()
	rb := b.e.reps[id]
	if !d.tickUntil(60*time.Second, func() bool {
		r := h.rec(id)
		return r.State == Normal && !r.Stale[0] && !r.Stale[1] && a.e.reps[id] == ra && ra.ready() && rb.ready() &&
			a.e.table.Version == h.ns.Version && b.e.table.Version == h.ns.Version
	}) {
		t.Fatalf("not normal again with both replicas serving: record %+v (node %d: %v, node %d: %v)", h.rec(id), a.id, ra.state, b.id, rb.state)
	}

	// Normal, both serving: each replica's copy of block 20 is the same.
	rpA, rpB := d.read(a, id, 20), d.read(b, id, 20)
	if rpA.Err != nil || rpB.Err != nil {
		t.Fatalf("reads of block 20: node %d: %v, node %d: %v", a.id, rpA.Err, b.id, rpB.Err)
	}
	if !bytes.Equal(rpA.Data, rpB.Data) {
		t.Fatalf("block 20 in the normal state (record %+v): node %d serves %#x..., node %d serves %#x... (W_f's is %#x, D1's %#x): "+
			"a decree of the failed life committed after the replica loaded again, and the degraded-mode region that named W_f's block was cleared, never copied",
			h.rec(id), a.id, rpA.Data[0], b.id, rpB.Data[0], pattern(2, 1)[0], pattern(1, 1)[0])
	}
	if !bytes.Equal(rpA.Data, pattern(2, 1)) {
		t.Errorf("block 20 holds %#x... on both, want W_f's %#x... (it landed on node %d and nothing wrote the block since)", rpA.Data[0], pattern(2, 1)[0], b.id)
	}
	h.sameCopies(id)
}
