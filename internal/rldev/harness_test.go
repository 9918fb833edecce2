package rldev

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"math/rand"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/disk"
)

// harness runs engines in one goroutine for scripted tests: disks are
// MemDevices, the config service is a namespace with versioned,
// conditional decrees, messages are queued and delivered in order per
// pair of nodes while both are up and not cut apart, and the failure
// detector answers what the test says. Nothing happens until run drains
// the queue.
type harness struct {
	unsafe    Unsafe // the engines' (teeth tests)
	scrubRate int64  // the engines' (0: the default)
	copyRate  int64  // the engines' CopyRate
	t         *testing.T
	now       time.Time
	nodes     map[NodeID]*hnode
	ns        *pb.Namespace
	queue     []func()
	cut       map[[2]NodeID]bool
	dead      map[Subject]bool
	replies   map[ReqID]Reply
	nextReq   ReqID
	trace     bool

	// Interception, for scripted interleavings (the review tests): a disk
	// read or write that holdRead or holdWrite picks is carried out only
	// when the test releases it from held (a hung I/O; a read released
	// reads the disk as it is then); one that failWrite picks fails with
	// EIO, writing nothing; a decree that holdPropose picks is neither
	// applied nor answered (a slow config service) until the test
	// commits it from heldDecrees; with noTables, the tables engines ask
	// for (Refresh, counted in refreshes) and the watch's deliveries are
	// dropped.
	holdRead  func(*hnode, DiskRead) bool
	holdWrite func(*hnode, DiskWrite) bool
	failWrite func(*hnode, DiskWrite) bool
	// failSync: a sync it picks fails losing the writes it covered, which
	// reads still see (MemDevice.FailSync); a DiskDrop failDrop picks
	// leaves pages cached (ErrStillCached); drops counts the DiskDrops;
	// suspect: every engine starts with its disks suspect, as the
	// runtime's do (not only after a failed sync no engine heard).
	failSync    func(*hnode, DiskSync) bool
	failDrop    func(*hnode, DiskDrop) bool
	drops       int
	suspect     bool
	holdPropose func(*hnode, Propose) bool
	// mute: a message it picks is dropped, the session staying up (a
	// peer that is up but silent: its engine wedged).
	mute        func(from, to NodeID, msg any) bool
	held        []func()
	heldDecrees []Propose
	noTables    bool
	refreshes   int
}

type hnode struct {
	id   NodeID
	inc  uint64
	e    *Engine
	up   bool
	devs map[uint32]*disk.MemDevice
	uuid map[uint32]string
	// Per disk, failed syncs (whether their engine is there to hear or
	// not), and their count at the last crash, which empties the cache:
	// start says Suspect while they differ (or h.suspect).
	fails, clean map[uint32]uint64
}

// skipOneGoroutineUnderRace skips a test of the harness or the simulator
// in CI's race phase (-race -short): one goroutine runs every node's
// engine, its disks and its network, so the race detector has nothing to
// compare, and the test already ran in the main phase. The race phase
// keeps the tests whose goroutines do run at once (the service's, the
// data path's, the clerk's).
func skipOneGoroutineUnderRace(t testing.TB) {
	t.Helper()
	if raceEnabled && testing.Short() {
		t.Skip("one goroutine (harness or simulator): nothing for the race detector; runs without -race")
	}
}

// newHarness starts n nodes with one disk each; opts set the harness's
// engine options first.
func newHarness(t *testing.T, n int, diskSize int64, opts ...func(*harness)) *harness {
	skipOneGoroutineUnderRace(t)
	h := &harness{t: t, now: time.Unix(1000, 0), nodes: map[NodeID]*hnode{}, ns: &pb.Namespace{Name: Namespace},
		cut: map[[2]NodeID]bool{}, dead: map[Subject]bool{}, replies: map[ReqID]Reply{}}
	for _, o := range opts {
		o(h)
	}
	for i := 1; i <= n; i++ {
		hn := &hnode{id: NodeID(i), devs: map[uint32]*disk.MemDevice{0: disk.NewMemDevice(diskSize, nil)}, uuid: map[uint32]string{},
			fails: map[uint32]uint64{}, clean: map[uint32]uint64{}}
		h.nodes[hn.id] = hn
	}
	for _, hn := range h.sorted() {
		h.start(hn)
	}
	h.run()
	return h
}

func (h *harness) sorted() []*hnode {
	var out []*hnode
	for _, n := range h.nodes {
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].id < out[j].id })
	return out
}

func (h *harness) env(n *hnode) Env {
	if !n.up {
		return Env{Now: h.now}
	}
	return Env{Now: h.now, Deadline: h.now.Add(time.Hour)}
}

// start begins a new incarnation of n on its disks.
func (h *harness) start(n *hnode) {
	n.inc++
	n.up = true
	var disks []LocalDisk
	for _, idx := range slices.Sorted(maps.Keys(n.devs)) {
		d := n.devs[idx]
		hdr, _, err := OpenDisk(d, n.id, idx)
		if err != nil {
			h.t.Fatal(err)
		}
		n.uuid[idx] = hdr.UUID
		disks = append(disks, LocalDisk{Index: idx, Size: d.Size(), UUID: hdr.UUID, Path: fmt.Sprintf("disk-%d-%d", n.id, idx), Suspect: h.suspect || n.fails[idx] != n.clean[idx]})
	}
	n.e = NewEngine(Config{Node: n.id, Inc: n.inc, Disks: disks, Unsafe: h.unsafe, ScrubRate: h.scrubRate, CopyRate: h.copyRate})
	h.exec(n, n.e.SetTable(h.env(n), h.table(), true, h.incs()))
	for _, p := range h.sorted() {
		if p != n && p.up && !h.isCut(n.id, p.id) {
			h.exec(n, n.e.PeerUp(h.env(n), p.id))
			h.exec(p, p.e.PeerUp(h.env(p), n.id))
		}
	}
}

// crash stops n: its disks keep what was synced (torn if torn).
func (h *harness) crash(n *hnode, torn bool, r *rand.Rand) {
	n.up = false
	for idx, d := range n.devs {
		d.Crash(r, torn)
		n.clean[idx] = n.fails[idx]
	}
	for _, p := range h.sorted() {
		if p != n && p.up {
			h.exec(p, p.e.PeerDown(h.env(p), n.id))
		}
	}
}

func (h *harness) incs() map[NodeID]uint64 {
	m := map[NodeID]uint64{}
	for _, n := range h.nodes {
		m[n.id] = n.inc
	}
	return m
}

func (h *harness) table() *Table {
	t, err := DecodeTable(h.ns)
	if err != nil {
		h.t.Fatal(err)
	}
	return t
}

func (h *harness) isCut(a, b NodeID) bool { return h.cut[[2]NodeID{a, b}] || h.cut[[2]NodeID{b, a}] }

// partition cuts a from b (both directions).
func (h *harness) partition(a, b NodeID) {
	h.cut[[2]NodeID{a, b}] = true
	for _, x := range []NodeID{a, b} {
		y := a + b - x
		if n := h.nodes[x]; n.up {
			h.exec(n, n.e.PeerDown(h.env(n), y))
		}
	}
}

func (h *harness) heal(a, b NodeID) {
	delete(h.cut, [2]NodeID{a, b})
	delete(h.cut, [2]NodeID{b, a})
	for _, x := range []NodeID{a, b} {
		y := a + b - x
		if n := h.nodes[x]; n.up && h.nodes[y].up {
			h.exec(n, n.e.PeerUp(h.env(n), y))
		}
	}
}

// propose applies a decree as the config service would, then tells every
// engine the new table.
func (h *harness) propose(d *pb.Decree) error {
	if d.ExpectedVersion != h.ns.Version {
		return fmt.Errorf("stale version %d (now %d)", d.ExpectedVersion, h.ns.Version)
	}
	ents := map[string][]byte{}
	for _, e := range h.ns.Entries {
		ents[e.Key] = e.Value
	}
	for _, op := range d.Ops {
		if op.Kind == pb.Op_KIND_PUT {
			ents[op.Key] = op.Value
		} else {
			delete(ents, op.Key)
		}
	}
	ns := &pb.Namespace{Name: Namespace, Version: h.ns.Version + 1}
	var keys []string
	for k := range ents {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		ns.Entries = append(ns.Entries, &pb.Entry{Key: k, Value: ents[k]})
	}
	h.ns = ns
	if _, err := DecodeTable(ns); err != nil {
		h.t.Fatalf("decree made a bad table: %v", err)
	}
	if !h.noTables {
		h.tables(false)
	}
	return nil
}

// commit applies a proposal as the config service would (propose).
func (h *harness) commit(x Propose) error {
	return h.propose(&pb.Decree{Namespace: Namespace, ExpectedVersion: x.Version, Ops: x.Ops})
}

// tables queues, as a watch would (or a linearizable read), the table to
// every up node.
func (h *harness) tables(linearizable bool) {
	for _, n := range h.sorted() {
		if n.up {
			n := n
			h.queue = append(h.queue, func() { h.exec(n, n.e.SetTable(h.env(n), h.table(), linearizable, h.incs())) })
		}
	}
}

// release carries out the held I/O i (it completes in the queue).
func (h *harness) release(i int) {
	f := h.held[i]
	h.held = append(h.held[:i:i], h.held[i+1:]...)
	f()
	h.run()
}

// tickUntil advances time in 100 ms steps (up to max), ticking every
// engine and draining the queue after each step, until cond holds.
func (h *harness) tickUntil(max time.Duration, cond func() bool) bool {
	for s := time.Duration(0); s < max; s += 100 * time.Millisecond {
		if cond() {
			return true
		}
		h.tick(100 * time.Millisecond)
	}
	return cond()
}

// exec carries out an engine's effects.
func (h *harness) exec(n *hnode, out []any) {
	for _, o := range out {
		if h.trace {
			h.t.Logf("node %d: %T %+v", n.id, o, short(o))
		}
		switch x := o.(type) {
		case DiskRead:
			do := func() {
				if x.Run != nil {
					res, err := ReadRun(n.devs[x.Disk], x.Off, *x.Run)
					h.later(n, func() []any { return n.e.RunDone(h.env(n), x.Op, res, err) })
					return
				}
				buf := make([]byte, x.Len)
				_, err := n.devs[x.Disk].ReadAt(buf, x.Off)
				h.later(n, func() []any { return n.e.DiskDone(h.env(n), x.Op, buf, err) })
			}
			if h.holdRead != nil && h.holdRead(n, x) {
				h.held = append(h.held, do)
				continue
			}
			do()
		case DiskWrite:
			fail := h.failWrite != nil && h.failWrite(n, x)
			do := func() {
				err := errors.New("EIO (injected)")
				if !fail {
					err = DoWrite(n.devs[x.Disk], x)
				}
				h.later(n, func() []any { return n.e.DiskDone(h.env(n), x.Op, nil, err) })
			}
			if h.holdWrite != nil && h.holdWrite(n, x) {
				h.held = append(h.held, do)
				continue
			}
			do()
		case DiskSync:
			var err error
			if h.failSync != nil && h.failSync(n, x) {
				err = n.devs[x.Disk].FailSync()
			} else {
				err = n.devs[x.Disk].Sync()
			}
			if err != nil {
				n.fails[x.Disk]++
			}
			h.later(n, func() []any { return n.e.DiskDone(h.env(n), x.Op, nil, err) })
		case DiskDrop:
			h.drops++
			var err error
			if h.failDrop != nil && h.failDrop(n, x) {
				err = fmt.Errorf("%w (injected)", disk.ErrStillCached)
			} else {
				err = n.devs[x.Disk].DropCache(x.Off, x.Len)
			}
			h.later(n, func() []any { return n.e.DiskDone(h.env(n), x.Op, nil, err) })
		case Send:
			to := h.nodes[x.To]
			if to == nil || !to.up || h.isCut(n.id, x.To) || h.mute != nil && h.mute(n.id, x.To, x.Msg) {
				continue
			}
			inc := to.inc
			from := n.id
			h.queue = append(h.queue, func() {
				if to.up && to.inc == inc && !h.isCut(from, to.id) {
					h.exec(to, to.e.Deliver(h.env(to), from, x.Msg))
				}
			})
		case Reply:
			h.replies[x.Req] = x
		case Propose:
			if h.holdPropose != nil && h.holdPropose(n, x) {
				h.t.Logf("node %d: decree %q (version %d) held", n.id, x.What, x.Version)
				h.heldDecrees = append(h.heldDecrees, x)
				continue
			}
			err := h.commit(x)
			h.later(n, func() []any { return n.e.Decided(h.env(n), x.ID, err) })
		case AskDead:
			for _, s := range x.Subjects {
				s := s
				dead := h.dead[s]
				h.later(n, func() []any { return n.e.Verdict(h.env(n), s, dead) })
			}
		case Refresh:
			if h.noTables {
				h.refreshes++
				continue
			}
			h.later(n, func() []any { return n.e.SetTable(h.env(n), h.table(), true, h.incs()) })
		case Log:
			if h.trace || x.Level >= 3 {
				h.t.Logf("node %d log: %s %v", n.id, x.Msg, x.Args)
			}
		default:
			h.t.Fatalf("unknown effect %T", o)
		}
	}
}

func short(o any) any {
	switch x := o.(type) {
	case DiskWrite:
		return fmt.Sprintf("write op %d disk %d off %d len %d", x.Op, x.Disk, x.Off, len(x.Data))
	case Send:
		switch m := x.Msg.(type) {
		case Forward:
			return fmt.Sprintf("to %d Forward rldev %d epoch %d seq %d block %d n %d", x.To, m.RLDev, m.Epoch, m.Seq, m.Block, len(m.Data)/BlockSize)
		case Copy:
			return fmt.Sprintf("to %d Copy rldev %d epoch %d seq %d block %d n %d", x.To, m.RLDev, m.Epoch, m.Seq, m.Block, len(m.Data)/BlockSize)
		case PullData:
			return fmt.Sprintf("to %d PullData seq %d code %v n %d", x.To, m.Seq, m.Code, len(m.Data)/BlockSize)
		}
	}
	return o
}

// later queues fn in n's current life.
func (h *harness) later(n *hnode, fn func() []any) {
	inc := n.inc
	h.queue = append(h.queue, func() {
		if n.up && n.inc == inc {
			h.exec(n, fn())
		}
	})
}

// run drains the queue (bounded).
func (h *harness) run() {
	for i := 0; len(h.queue) > 0; i++ {
		if i > 1_000_000 {
			h.t.Fatal("harness: the engines do not quiesce")
		}
		f := h.queue[0]
		h.queue = h.queue[1:]
		f()
	}
}

// tick advances time by d in steps, ticking every engine.
func (h *harness) tick(d time.Duration) {
	for step := time.Duration(0); step < d; step += 100 * time.Millisecond {
		h.now = h.now.Add(100 * time.Millisecond)
		for _, n := range h.sorted() {
			if n.up {
				h.exec(n, n.e.Tick(h.env(n)))
			}
		}
		h.run()
	}
}

// create makes an RLDev by decree.
func (h *harness) create(blocks uint64) *Record {
	t := h.table()
	r, err := t.Create(blocks, false)
	if err != nil {
		h.t.Fatal(err)
	}
	if err := h.propose(&pb.Decree{Namespace: Namespace, ExpectedVersion: t.Version, Ops: []*pb.Op{r.PutOp()}}); err != nil {
		h.t.Fatal(err)
	}
	h.run()
	h.joined(r.ID)
	return h.rec(r.ID)
}

// joined lets time pass (up to 10 s) until the up nodes holding the
// RLDevs' segments (all of them, if none given) are named in the table,
// so that they serve.
func (h *harness) joined(ids ...uint64) {
	for i := 0; i < 100; i++ {
		t := h.table()
		if len(ids) == 0 {
			ids = t.IDs()
		}
		all := true
		for _, id := range ids {
			rec := t.RLDevs[id]
			for seg, sg := range rec.Segs {
				if n := h.nodes[sg.Node]; n != nil && n.up && rec.Inc[seg] != n.inc {
					all = false
				}
			}
		}
		if all {
			return
		}
		h.tick(100 * time.Millisecond)
	}
}

func (h *harness) rec(id uint64) *Record { return h.table().RLDevs[id] }

// write asks node n to write (through the primary there).
func (h *harness) write(n NodeID, id, block uint64, data []byte, f *Fence) ReqID {
	h.nextReq++
	q := h.nextReq
	nd := h.nodes[n]
	h.exec(nd, nd.e.Write(h.env(nd), q, id, block, data, f, -1))
	return q
}

// heldResync: the secondary b dies and the primary a serves alone
// (degraded); b's next incarnation asks to be resynced, and a's "resync"
// decree is held (returned, not committed).
func (h *harness) heldResync(id uint64, a, b *hnode) Propose {
	h.t.Helper()
	h.dead[Subject{b.id, b.inc}] = true
	h.crash(b, false, nil)
	if !h.tickUntil(10*time.Second, func() bool { r := h.rec(id); return r.State == Degraded && r.Stale[1] }) {
		h.t.Fatalf("setup: not degraded: %+v", h.rec(id))
	}
	h.holdPropose = func(n *hnode, x Propose) bool { return n == a && strings.HasSuffix(x.What, ": resync]") }
	h.start(b)
	if !h.tickUntil(10*time.Second, func() bool { return len(h.heldDecrees) == 1 }) {
		h.t.Fatalf("setup: no resync decree: %+v", h.rec(id))
	}
	h.holdPropose = nil
	held := h.heldDecrees[0]
	h.heldDecrees = nil
	return held
}

// writeBy writes through node n and drains the queue.
func (h *harness) writeBy(n *hnode, id, block uint64, data []byte) ReqID {
	q := h.write(n.id, id, block, data, nil)
	h.run()
	return q
}

func (h *harness) read(n NodeID, id, block, count uint64) ReqID {
	h.nextReq++
	q := h.nextReq
	nd := h.nodes[n]
	h.exec(nd, nd.e.Read(h.env(nd), q, id, block, count, -1))
	return q
}

// mustWrite writes and waits for success.
func (h *harness) mustWrite(n NodeID, id, block uint64, data []byte) {
	h.t.Helper()
	q := h.write(n, id, block, data, nil)
	h.run()
	if r, ok := h.replies[q]; !ok || r.Err != nil {
		h.t.Fatalf("write of %d blocks at %d through node %d: %+v (replied %v)", len(data)/BlockSize, block, n, r.Err, ok)
	}
}

// mustRead reads from node n and checks want.
func (h *harness) mustRead(n NodeID, id, block uint64, want []byte) {
	h.t.Helper()
	q := h.read(n, id, block, uint64(len(want))/BlockSize)
	h.run()
	r, ok := h.replies[q]
	if !ok || r.Err != nil {
		h.t.Fatalf("read at %d from node %d: %v (replied %v)", block, n, r.Err, ok)
	}
	if !bytes.Equal(r.Data, want) {
		h.t.Fatalf("read at %d from node %d: got %q..., want %q...", block, n, r.Data[:8], want[:8])
	}
}

func pattern(seed byte, blocks int) []byte {
	b := make([]byte, blocks*BlockSize)
	for i := range b {
		b[i] = seed + byte(i/BlockSize)
	}
	return b
}

// sameCopies checks that both segments of an RLDev hold the same data.
func (h *harness) sameCopies(id uint64) {
	h.t.Helper()
	rec := h.rec(id)
	var copies [2][]byte
	for i, s := range rec.Segs {
		dev := h.nodes[s.Node].devs[s.Disk]
		raw := make([]byte, int(rec.Blocks)*PhysBlockSize)
		dev.ReadAt(raw, s.Offset+MetaSize)
		data := make([]byte, int(rec.Blocks)*BlockSize)
		for b := uint64(0); b < rec.Blocks; b++ {
			d, _, st := DecodeBlock(raw[b*PhysBlockSize:(b+1)*PhysBlockSize], id, b)
			if st == BlockCorrupt || st == BlockMisplaced {
				h.t.Fatalf("rldev %d block %d on node %d: %v", id, b, s.Node, st)
			}
			copy(data[b*BlockSize:], d)
		}
		copies[i] = data
	}
	if !bytes.Equal(copies[0], copies[1]) {
		for b := uint64(0); b < rec.Blocks; b++ {
			if !bytes.Equal(copies[0][b*BlockSize:(b+1)*BlockSize], copies[1][b*BlockSize:(b+1)*BlockSize]) {
				h.t.Fatalf("rldev %d: the copies differ at block %d", id, b)
			}
		}
	}
}

var errNone = errors.New("none")
