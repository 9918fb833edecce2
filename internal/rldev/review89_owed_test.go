package rldev

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
)

// Outside review 89 (owed ranges, c31168c).

// r89TornSetup is r86TornSetup with a hook run just before the primary
// restarts (to hold its I/O): block 100 holds A on the secondary, torn on
// the primary; both are down; the primary is started (the secondary not).
func r89TornSetup(t *testing.T, before func(h *harness, r *Record, p, s *hnode)) (*harness, *Record, *hnode, *hnode, []byte) {
	c := tornPair(t)
	if before != nil {
		before(c.h, c.r, c.p, c.s)
	}
	c.h.start(c.p)
	return c.h, c.r, c.p, c.s, c.a
}

// isOwedPageWrite: a write of n's owed page (either copy) of rec's segment
// on n.
func isOwedPageWrite(r *Record, n *hnode, x DiskWrite) bool {
	for _, sg := range r.Segs {
		if NodeID(sg.Node) == n.id && x.Off >= sg.Offset+offOwed && x.Off < sg.Offset+offOwed+2*owedArea {
			return true
		}
	}
	return false
}

// Finding 1 (data loss): the window between "owed in memory" (q.owe) and
// "owed durably" (q.owed). want() only lets the primary itself degrade
// once the page is durable, but the secondary's own disk failure degrades
// the RLDev from the other side (its want: Stale[me], Primary = peer)
// without any such check. abandonRecovery then keeps the range held
// (q.owe), which is right -- but if the primary crashes (or fails) before
// the page write lands, the next life finds the region in the DRL only,
// the peer stale: drlToDeg serves the torn block and the resync copies it
// over the peer's good copy of A. Exactly TestReview86...AfterPeerDiskError,
// with a crash of the primary in a window of one metadata write.
func TestReview89OwePageInFlightPeerFailsThenPrimaryCrash(t *testing.T) {
	r89OweWindow(t, false)
}

// The same window, no crash: the primary's owed page write fails (a
// transient EIO) after the secondary's failure degraded the RLDev; the
// primary fails, loads again (its peer stale), finds the region in its
// DRL only and serves it.
func TestReview89OwePageWriteFailsAfterPeerFailure(t *testing.T) {
	r89OweWindow(t, true)
}

func r89OweWindow(t *testing.T, eio bool) {
	// Since the fix the owed page is written while the primary loads,
	// before it joins: the window is that write. It is held; the
	// secondary comes back and fails (transiently) on its own, degrading
	// the RLDev; then the primary crashes, or its owed page write fails.
	h, r, p, s, a := r89TornSetup(t, func(h *harness, r *Record, p, s *hnode) {
		h.holdWrite = func(n *hnode, x DiskWrite) bool { return n == p && isOwedPageWrite(r, n, x) }
		if eio {
			h.failWrite = h.holdWrite
		}
	})
	if !h.tickUntil(3*time.Second, func() bool { return len(h.held) > 0 }) {
		t.Fatalf("setup: the primary's owed page write is not held: %+v", h.rec(r.ID))
	}
	h.holdWrite = nil
	if rp := p.e.reps[r.ID]; rp == nil || rp.state != repLoading {
		t.Fatalf("setup: the primary should wait for its owed page before it joins")
	}
	h.start(s)
	sr := func() *replica { return s.e.reps[r.ID] }
	if !h.tickUntil(5*time.Second, func() bool { return sr() != nil && sr().ready() }) {
		t.Fatalf("setup: the secondary is not back: %+v", h.rec(r.ID))
	}
	h.exec(s, sr().fail(errors.New("EIO (injected)"))) // transient: it loads again later
	h.run()
	if !h.tickUntil(5*time.Second, func() bool { return h.rec(r.ID).State == Degraded }) {
		t.Fatalf("setup: the secondary's failure did not degrade: %+v", h.rec(r.ID))
	}
	t.Logf("degraded by the secondary's own failure while the primary's owed page write is in flight: %+v", h.rec(r.ID))
	if eio {
		// The owed page write fails: the primary fails and loads again.
		h.failWrite, h.holdWrite = nil, nil
		h.release(0)
	} else {
		// The primary crashes before its owed page write lands.
		h.crash(p, false, nil)
		h.held = nil
		h.start(p)
	}
	if !h.tickUntil(60*time.Second, func() bool { return h.rec(r.ID).State == Normal }) {
		t.Fatalf("not resynced: %+v", h.rec(r.ID))
	}
	rp := h.rvRead(s.id, r.ID, 100, 1)
	_, st := r86Block(h, s, r.ID, 100)
	if rp.Err != nil || !bytes.Equal(rp.Data, a) && !bytes.Equal(rp.Data, pattern(9, 1)) {
		t.Errorf("block 100's acknowledged value A, whole on the secondary, was overwritten by the resync with the primary's torn block (secondary's disk: %v, read: %v)", st, rp.Err)
	}
}

// Finding 2 (data loss by a routine operator command): a stale segment of
// a degraded RLDev is re-placed at once by `grove rldev move`
// (Table.StartMove: its copy "given up" -- harmless before owed ranges,
// since the primary then held every acknowledged write). With a range
// owed to it, that stale copy is the only good copy of the range; the
// table does not know, StartMove does not refuse, the new blank segment
// answers NotWhole and the primary's torn block stands -- although the old
// node comes back minutes later with A intact on its disk.
func TestReview89StaleSegmentMovedWhileOwed(t *testing.T) {
	h, r, p, s, a := r89TornSetup(t, nil)
	h.dead[Subject{s.id, s.inc}] = true
	if !h.tickUntil(5*time.Second, func() bool { return h.rec(r.ID).State == Degraded }) {
		t.Fatalf("not degraded: %+v", h.rec(r.ID))
	}
	if n := p.e.reps[r.ID].owedCount(); n != 1 {
		t.Fatalf("setup: owed %d", n)
	}
	var third *hnode
	for _, n := range h.nodes {
		if n != p && n != s {
			third = n
		}
	}
	tb := h.table()
	sseg := 1 - r.Primary
	if !h.rec(r.ID).Owed {
		t.Fatalf("the table does not say the primary owes ranges to the stale copy: %+v", h.rec(r.ID))
	}
	_, err := tb.StartMove(r.ID, sseg, uint64(third.id), -1)
	if !errors.Is(err, ErrMove) || !strings.Contains(err.Error(), "forget-node") {
		t.Fatalf("StartMove of the stale segment owed ranges: %v, want refused naming forget-node", err)
	}
	t.Logf("refused: %v", err)
	// Evacuate (forget-node --re-place, a node gone for good) re-places
	// it, and says what it gives up.
	if _, what, err := tb.Evacuate(r.ID, uint64(s.id), []uint64{uint64(p.id), uint64(third.id)}); err != nil || !strings.Contains(what, "given up") {
		t.Fatalf("evacuate: %q %v", what, err)
	}
	// The node comes back instead: the owed range is pulled from it.
	h.dead = map[Subject]bool{}
	h.start(s)
	if !h.tickUntil(60*time.Second, func() bool { return h.rec(r.ID).State == Normal && p.e.reps[r.ID].recovering() == 0 }) {
		t.Fatalf("not normal: %+v", h.rec(r.ID))
	}
	if h.rec(r.ID).Owed {
		t.Fatalf("still owed in the table: %+v", h.rec(r.ID))
	}
	if rp := h.rvRead(p.id, r.ID, 100, 1); rp.Err != nil || !bytes.Equal(rp.Data, a) {
		t.Fatalf("block 100: %v, want A", rp.Err)
	}
}

// Finding 3 (stuck request): owedErr is checked when a request is
// admitted only. A read (or write) of the range admitted while the RLDev
// was still normal waits for the recovery's range lock; the RLDev then
// degrades with the range owed, and that request is neither served nor
// answered Unavailable until the peer is back (for ever if it never is),
// while the same read issued a moment later fails at once.
func TestReview89WaitingRequestNotToldUnavailable(t *testing.T) {
	h, r, p, s, _ := r89TornSetup(t, nil)
	if !h.tickUntil(3*time.Second, func() bool { rp := p.e.reps[r.ID]; return rp != nil && rp.recovering() > 0 }) {
		t.Fatalf("setup: not recovering")
	}
	q := h.read(p.id, r.ID, 100, 1)
	h.run()
	h.dead[Subject{s.id, s.inc}] = true
	if !h.tickUntil(5*time.Second, func() bool { return h.rec(r.ID).State == Degraded }) {
		t.Fatalf("not degraded: %+v", h.rec(r.ID))
	}
	if rp := h.rvRead(p.id, r.ID, 100, 1); !errors.Is(rp.Err, ErrUnavailable) {
		t.Fatalf("a new read: %v", rp.Err)
	}
	h.tick(30 * time.Second)
	if rp, ok := h.replies[q]; !ok {
		t.Errorf("a read admitted before the degrade is still unanswered 30 s later (a new one fails at once with ErrUnavailable)")
	} else {
		t.Logf("the waiting read: %v", rp.Err)
	}
}

// Decoder robustness.
func FuzzReview89DecodeOwed(f *testing.F) {
	b := NewBitmap(256, 1000)
	b.Set(1)
	f.Add(encodeOwed(b, []run{{5, 3}}), uint64(256), uint64(1000))
	f.Add(encodeOwed(NewBitmap(256, 256), nil), uint64(256), uint64(256))
	f.Add([]byte{}, uint64(1), uint64(1))
	f.Fuzz(func(t *testing.T, p []byte, rb, blocks uint64) {
		if rb == 0 || blocks == 0 || blocks > 1<<40 || rb > 1<<40 || (blocks+rb-1)/rb > 1<<20 {
			return
		}
		bits, runs, err := decodeOwed(p, rb, blocks)
		if err != nil {
			return
		}
		for _, x := range bits.List() {
			if x*rb >= blocks {
				t.Fatalf("region %d past the end", x)
			}
		}
		for _, g := range runs {
			if g.n == 0 || g.first+g.n > blocks {
				t.Fatalf("run %+v", g)
			}
		}
		if q := encodeOwed(bits, runs); !bytes.Equal(q, p) {
			// Not necessarily a defect (padding bits), but say so.
			t.Logf("re-encoding differs")
		}
	})
}

// r89Start is h.start with the engine's dirty-region log region set.
func r89Start(h *harness, n *hnode, drlRegion uint64) {
	n.inc++
	n.up = true
	var disks []LocalDisk
	for idx, d := range n.devs {
		hdr, _, err := OpenDisk(d, n.id, idx)
		if err != nil {
			h.t.Fatal(err)
		}
		n.uuid[idx] = hdr.UUID
		disks = append(disks, LocalDisk{Index: idx, Size: d.Size(), UUID: hdr.UUID, Path: "disk", Suspect: n.fails[idx] != n.clean[idx]})
	}
	n.e = NewEngine(Config{Node: n.id, Inc: n.inc, Disks: disks, ScrubRate: h.scrubRate, drlRegion: drlRegion})
	h.exec(n, n.e.SetTable(h.env(n), h.table(), true, h.incs()))
	for _, p := range h.sorted() {
		if p != n && p.up && !h.isCut(n.id, p.id) {
			h.exec(n, n.e.PeerUp(h.env(n), p.id))
			h.exec(p, p.e.PeerUp(h.env(p), n.id))
		}
	}
}

// Finding 4 (stuck; pre-existing on the wire, new in the engine): a
// dirty region larger than MaxPullBlocks (4096) -- every RLDev above
// 4096 x 32448 blocks, ~544 GB, gets regions that large from
// regionBlocks -- is pulled in one Pull, which the peer refuses
// (BadRequest; over gRPC DecodePeer refuses it and closes the link).
// Before c31168c the engine kept its own copy on that answer; now the
// range is owed and "asked again on the next tick" for ever: the region
// is held for good, a write to it never completes, the RLDev never
// leaves recovery.
func TestReview89RegionLargerThanAPullNeverRecovers(t *testing.T) {
	const region = 5000
	h := newHarness(t, 2, testDisk, func(h *harness) { h.scrubRate = -1 })
	for _, n := range h.sorted() {
		h.crash(n, false, nil)
	}
	for _, n := range h.sorted() {
		r89Start(h, n, region)
	}
	h.run()
	r := h.create(region)
	p := h.nodes[NodeID(r.Segs[r.Primary].Node)]
	h.mustWrite(p.id, r.ID, 100, pattern(1, 1)) // region 0 dirty
	h.crash(p, false, nil)
	r89Start(h, p, region)
	h.run()
	// (Since the fix the region is pulled in parts as soon as the
	// primary is named: it may be over already.)
	if !h.tickUntil(3*time.Second, func() bool { rp := p.e.reps[r.ID]; return rp != nil && rp.ready() }) {
		t.Fatalf("setup: the primary is not back: %+v", h.rec(r.ID))
	}
	q := h.write(p.id, r.ID, 200, pattern(2, 1), nil)
	h.tick(30 * time.Second)
	if rp, ok := h.replies[q]; !ok || p.e.reps[r.ID].recovering() > 0 {
		t.Errorf("30 s on, both nodes up: the primary still recovering %d ranges; the write of block 200 answered %v (%v)", p.e.reps[r.ID].recovering(), ok, rp.Err)
	}
}
