package rldev

import (
	"bytes"
	"errors"
	"testing"
	"time"

	pb "github.com/grovestore/grove/api/grovepb"
)

// review37Driver drives one node's engine by hand (its peer is down), so
// that a disk write can be held (an I/O that hangs) and another failed.
type review37Driver struct {
	t       *testing.T
	h       *harness
	n       *hnode
	q       []func()
	replies map[ReqID]Reply
	hold    func(DiskWrite) bool
	fail    func(DiskWrite) bool
	held    []DiskWrite
	next    ReqID
}

func (d *review37Driver) env() Env { return Env{Now: d.h.now, Deadline: d.h.now.Add(time.Hour)} }

func (d *review37Driver) exec(out []any) {
	e, dev := d.n.e, d.n.devs[0]
	for _, o := range out {
		switch x := o.(type) {
		case DiskRead:
			if x.Run != nil {
				res, err := ReadRun(dev, x.Off, *x.Run)
				d.q = append(d.q, func() { d.exec(e.RunDone(d.env(), x.Op, res, err)) })
				continue
			}
			buf := make([]byte, x.Len)
			_, err := dev.ReadAt(buf, x.Off)
			d.q = append(d.q, func() { d.exec(e.DiskDone(d.env(), x.Op, buf, err)) })
		case DiskWrite:
			if d.hold != nil && d.hold(x) {
				d.held = append(d.held, x)
				continue
			}
			var err error
			if d.fail != nil && d.fail(x) {
				err = errors.New("EIO (injected)")
			} else {
				err = DoWrite(dev, x)
			}
			d.q = append(d.q, func() { d.exec(e.DiskDone(d.env(), x.Op, nil, err)) })
		case DiskSync:
			err := dev.Sync()
			d.q = append(d.q, func() { d.exec(e.DiskDone(d.env(), x.Op, nil, err)) })
		case Send: // the peer is down
		case Reply:
			d.replies[x.Req] = x
		case Propose:
			err := d.h.propose(&pb.Decree{Namespace: Namespace, ExpectedVersion: x.Version, Ops: x.Ops})
			d.q = append(d.q, func() {
				d.exec(e.SetTable(d.env(), d.h.table(), true, d.h.incs()))
				d.exec(e.Decided(d.env(), x.ID, err))
			})
		case AskDead:
			for _, s := range x.Subjects {
				s, dead := s, d.h.dead[s]
				d.q = append(d.q, func() { d.exec(e.Verdict(d.env(), s, dead)) })
			}
		case Refresh:
			d.q = append(d.q, func() { d.exec(e.SetTable(d.env(), d.h.table(), true, d.h.incs())) })
		case Log:
			if x.Level >= 2 {
				d.t.Logf("node %d log: %s %v", d.n.id, x.Msg, x.Args)
			}
		}
	}
}

func (d *review37Driver) run() {
	for len(d.q) > 0 {
		f := d.q[0]
		d.q = d.q[1:]
		f()
	}
}

func (d *review37Driver) tick(dur time.Duration) {
	for s := time.Duration(0); s < dur; s += 100 * time.Millisecond {
		d.h.now = d.h.now.Add(100 * time.Millisecond)
		d.exec(d.n.e.Tick(d.env()))
		d.run()
	}
}

func (d *review37Driver) write(id, block uint64, data []byte) ReqID {
	d.next++
	q := 1000 + d.next
	d.exec(d.n.e.Write(d.env(), q, id, block, data, nil, -1))
	d.run()
	return q
}

// TestReview37ReloadedReplicaLetsEarlierWriteLandLast (review 37): the
// sequencing of a clerk's connections (admitClerkConn) rests on "a write
// started on the engine before its retry lands before it". A replica whose
// disk failed was loaded again after ReloadEvery (replica.retry) with its
// range locks reset, while a write of its failed life still had its disk
// write in flight (held: its range is meant to stay locked until it
// lands). W1 starts, its disk write hangs; another write's I/O fails (the
// replica fails; W1 is answered "may have been written"); 5 s later the
// replica served again; the clerk's retry W2 and its next write W3 to the
// same blocks succeeded; then W1's disk write completed, over W3. The RLDev
// is degraded (this node holds the only up-to-date copy): the acknowledged
// W3 was gone. Now the replica loads again only once none of its disk
// writes is in progress: it stays failed while W1's hangs, and serves once
// it has landed, so W2 and W3 come after it.
func TestReview37ReloadedReplicaLetsEarlierWriteLandLast(t *testing.T) {
	h := newHarness(t, 2, testDisk)
	r := h.create(512)
	p, s := r.Segs[0].Node, r.Segs[1].Node
	h.crash(h.nodes[s], true, nil)
	h.run()
	h.dead[Subject{s, h.nodes[s].inc}] = true
	h.tick(time.Second)
	if rec := h.rec(r.ID); rec.State != Degraded || rec.Primary != 0 || !rec.Stale[1] {
		t.Fatalf("setup: record %+v, want degraded with node %d primary", rec, p)
	}
	pn := h.nodes[p]
	pn.up = false // driven by hand from here
	d := &review37Driver{t: t, h: h, n: pn, replies: map[ReqID]Reply{}}
	base := r.Segs[0].Offset
	dataAt := func(block uint64) func(DiskWrite) bool {
		return func(x DiskWrite) bool { return x.Encode != nil && x.Off == base+blockOff(block) }
	}

	// W1: its data write hangs.
	d.hold = dataAt(10)
	w1 := d.write(r.ID, 10, pattern(1, 2))
	if len(d.held) != 1 {
		t.Fatalf("W1's data write not issued (%d held, reply %+v)", len(d.held), d.replies[w1])
	}
	d.hold = nil
	// W0, elsewhere: its I/O fails; the replica fails, W1 is answered.
	d.fail = dataAt(100)
	d.write(r.ID, 100, pattern(9, 1))
	d.fail = nil
	if rp, ok := d.replies[w1]; !ok || !errors.Is(rp.Err, ErrMaybeWritten) {
		t.Fatalf("W1 after the failure: %+v (replied %v), want ErrMaybeWritten", rp.Err, ok)
	}
	// ReloadEvery later the replica still does not serve: W1's I/O hangs.
	d.tick(6 * time.Second)
	if st := pn.e.reps[r.ID].state; st == repReady {
		t.Fatal("replica loaded again and serving while a write of its failed life is still in progress")
	}
	if rp, ok := d.replies[d.write(r.ID, 10, pattern(1, 2))]; ok && rp.Err == nil {
		t.Fatal("W2 (the retry) accepted while W1's disk write is still in progress")
	}
	// W1's hung I/O completes; the replica then loads again and serves.
	x := d.held[0]
	d.held = nil
	err := DoWrite(pn.devs[0], x)
	d.q = append(d.q, func() { d.exec(pn.e.DiskDone(d.env(), x.Op, nil, err)) })
	d.run()
	d.tick(6 * time.Second)
	if st := pn.e.reps[r.ID].state; st != repReady {
		t.Fatalf("replica %v once its writes landed and ReloadEvery passed, want ready", st)
	}
	if rp, ok := d.replies[d.write(r.ID, 10, pattern(1, 2))]; !ok || rp.Err != nil {
		t.Fatalf("W2 (the retry): %+v (replied %v)", rp.Err, ok)
	}
	if rp, ok := d.replies[d.write(r.ID, 10, pattern(3, 2))]; !ok || rp.Err != nil {
		t.Fatalf("W3 (the next write): %+v (replied %v)", rp.Err, ok)
	}

	d.next++
	q := 1000 + d.next
	d.exec(pn.e.Read(d.env(), q, r.ID, 10, 2, -1))
	d.run()
	rp, ok := d.replies[q]
	if !ok || rp.Err != nil {
		t.Fatalf("read: %+v (replied %v)", rp.Err, ok)
	}
	if !bytes.Equal(rp.Data, pattern(3, 2)) {
		t.Fatalf("blocks 10-11 hold %#x..., W1's data (started first, answered ErrMaybeWritten), not the acknowledged W3's %#x...: W1's disk write landed after W2 and W3",
			rp.Data[0], pattern(3, 2)[0])
	}
}
