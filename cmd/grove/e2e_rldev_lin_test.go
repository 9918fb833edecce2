package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/grovestore/grove/internal/rldev"
	"github.com/grovestore/grove/internal/rldev/blockcheck"
)

// TestEndToEndRLDevLinearizable is the real-process counterpart of the
// RLDev simulator (internal/rldev's TestRLDevSimulation): what runs here
// is what users run -- `grove up --processes` (three nodes, each a config
// service member, an observer and a store node with its real disk file,
// fdatasync and disk workers), the clerk over the framed data path with
// its retries and its watched table. Four clients write unique values to
// random 1-4 block ranges of the first blocks of three RLDevs and read
// them back, through the primary or from one replica named (a stale one
// must refuse); an operator moves random segments to the node that holds
// neither copy (the move's copy, its switch and the old extent's wipe run
// under the faults); meanwhile processFaults SIGKILLs a node and restarts
// it, stops one cleanly, SIGSTOPs one past the failure detector's grace
// period (it is declared dead, the RLDevs degrade without it, and it
// fences itself when it resumes), or SIGKILLs every node at once.
//
// The oracle, independent of the engine: every block, taken as a
// register, has a linearizable history (porcupine: a write whose error
// says it may have taken effect, or that timed out, may have happened at
// any time after it began; one refused otherwise must never be read); a
// block never reads as corrupt and never holds bytes no write wrote (a
// SIGKILL keeps the page cache: nothing acknowledged may be lost, even
// with both copies killed at once); after the faults every RLDev is
// normal again, with no move in progress and no old extent left, and its
// two replicas, each read alone, hold identical blocks, which are the
// last value of each block's history.
//
// GROVE_SEED=S replays the fault, move and operation choices (the
// interleaving is the machine's).
func TestEndToEndRLDevLinearizable(t *testing.T) {
	t.Parallel() // its own ports and directories: see parallelTests
	seed := time.Now().UnixNano() % 1_000_000
	if s := os.Getenv("GROVE_SEED"); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		seed = v
	}
	t.Logf("seed %d (GROVE_SEED=%d replays its choices)", seed, seed)
	_, u, _ := startCluster(t, 10300)
	keepLogsOnFailure(t, u, "grove-e2e-rldev-lin")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	mc := upMeta(t, ctx, u)
	cl := rldev.NewClerk(mc)
	defer cl.Close()
	const (
		rlBlocks = 24 // blocks of each RLDev the clients use (of 256)
		clients  = 4
		opWait   = 20 * time.Second
	)
	recs, err := cl.Create(ctx, 1<<20, 3, false)
	if err != nil {
		t.Fatal(err)
	}
	var ids []uint64
	for _, r := range recs {
		ids = append(ids, r.ID)
	}
	h := &linHistory{start: time.Now(), ops: map[linKey][]porcupine.Operation{}}
	var events []string
	var evMu sync.Mutex
	event := func(format string, args ...any) {
		evMu.Lock()
		defer evMu.Unlock()
		events = append(events, fmt.Sprintf("%8.3fs ", time.Since(h.start).Seconds())+fmt.Sprintf(format, args...))
	}
	fail := func(format string, args ...any) {
		t.Helper()
		evMu.Lock()
		tail := events
		evMu.Unlock()
		t.Fatalf("seed %d (GROVE_SEED=%d replays its choices): %s\nevents:\n%s", seed, seed, fmt.Sprintf(format, args...), strings.Join(tail, "\n"))
	}

	// The clients and the operator run until the faults are over.
	var stop atomic.Bool
	var wg sync.WaitGroup
	var next atomic.Uint64 // write values, unique over the test
	var bad atomic.Value   // the first impossible answer
	for c := 0; c < clients; c++ {
		r := rand.New(rand.NewSource(seed*100 + int64(c) + 1))
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 4*rldev.BlockSize)
			for !stop.Load() && ctx.Err() == nil {
				id := ids[r.Intn(len(ids))]
				n := uint64(1 + r.Intn(4))
				b := uint64(r.Intn(rlBlocks - int(n) + 1))
				octx, ocancel := context.WithTimeout(ctx, opWait)
				call := time.Now()
				if r.Intn(2) == 0 {
					v := next.Add(1)
					data := buf[:n*rldev.BlockSize]
					for i := uint64(0); i < n; i++ {
						linFill(data[i*rldev.BlockSize:(i+1)*rldev.BlockSize], v, id, b+i)
					}
					earlier, err := cl.WriteReport(octx, id, b*rldev.BlockSize, data, rldev.WriteOptions{})
					ret := time.Now()
					switch {
					case err == nil && earlier:
						// An earlier attempt may land later, over later
						// writes (the clerk's contract): no register.
						h.taint(id, b, n, "write %d acknowledged with an earlier attempt that may land later", v)
					case err == nil:
						h.write(c, id, b, n, v, call, ret)
					case errors.Is(err, rldev.ErrMaybeWritten) || ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded):
						h.write(c, id, b, n, v, call, time.Time{}) // open: it may land any time after call
					default:
						h.refused(c, id, b, n, v, err)
					}
				} else {
					replica := r.Intn(3) // 0: the primary (or the other), 1/2: that copy alone
					data, err := cl.Read(octx, id, b*rldev.BlockSize, n*rldev.BlockSize, replica)
					ret := time.Now()
					switch {
					case err == nil:
						for i := uint64(0); i < n; i++ {
							v, ok := linValueOf(data[i*rldev.BlockSize:(i+1)*rldev.BlockSize], id, b+i)
							if !ok {
								bad.CompareAndSwap(nil, fmt.Sprintf("rldev %d block %d (replica %d) holds bytes no write wrote", id, b+i, replica))
								continue
							}
							h.read(c, id, b+i, v, call, ret, replica)
						}
					case errors.Is(err, rldev.ErrCorrupt):
						bad.CompareAndSwap(nil, fmt.Sprintf("rldev %d blocks %d+%d (replica %d) read as corrupt: %v", id, b, n, replica, err))
					}
				}
				ocancel()
			}
		}()
	}
	moves := 0
	wg.Add(1)
	go func() {
		defer wg.Done()
		r := rand.New(rand.NewSource(seed*100 + 99))
		for !stop.Load() && ctx.Err() == nil {
			time.Sleep(time.Duration(1500+r.Intn(2500)) * time.Millisecond)
			id, seg := ids[r.Intn(len(ids))], r.Intn(2)
			tb, err := cl.Table(ctx, true)
			if err != nil || stop.Load() {
				continue
			}
			rec := tb.RLDevs[id]
			var to uint64
			for n := uint64(1); n <= 3; n++ {
				if rec.Segs[0].Node != n && rec.Segs[1].Node != n {
					to = n
				}
			}
			mctx, mcancel := context.WithTimeout(ctx, 10*time.Second)
			_, err = cl.Move(mctx, id, seg, to, -1)
			mcancel()
			if err == nil {
				moves++
				event("move of rldev %d's segment %d (node %d) to node %d asked", id, seg, rec.Segs[seg].Node, to)
			} else {
				event("move of rldev %d's segment %d to node %d refused: %v", id, seg, to, err)
			}
		}
	}()
	frand := rand.New(rand.NewSource(seed))
	did := processFaults(ctx, t, u, frand, event, 4)
	for tail := time.Now(); time.Since(tail) < 2*time.Second && ctx.Err() == nil; {
		time.Sleep(100 * time.Millisecond) // operations across the last heal
	}
	stop.Store(true)
	wg.Wait()
	if v := bad.Load(); v != nil {
		fail("%s", v)
	}

	// Healed: every RLDev normal, named, nothing moving or retiring.
	if err := u.WaitAllHeard(ctx); err != nil {
		fail("the nodes are not all heard after the faults: %v", err)
	}
	var tb *rldev.Table
	settled := time.Now()
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(250 * time.Millisecond) {
		tb, err = cl.Table(ctx, true)
		if err == nil && linSettled(tb, ids) {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			var desc []string
			if tb != nil {
				for _, id := range ids {
					desc = append(desc, fmt.Sprintf("%+v", *tb.RLDevs[id]))
				}
			}
			fail("the RLDevs did not settle within 90 s of the faults' end (err %v):\n%s", err, strings.Join(desc, "\n"))
		}
	}
	event("settled after %v", time.Since(settled).Round(time.Millisecond))

	// Both copies, each read alone, are identical and end each block's
	// history.
	for _, id := range ids {
		var copies [2][]byte
		for rep := 1; rep <= 2; rep++ {
			call := time.Now()
			data, err := cl.Read(ctx, id, 0, rlBlocks*rldev.BlockSize, rep)
			if err != nil {
				fail("final read of rldev %d's replica %d: %v", id, rep, err)
			}
			ret := time.Now()
			for b := uint64(0); b < rlBlocks; b++ {
				v, ok := linValueOf(data[b*rldev.BlockSize:(b+1)*rldev.BlockSize], id, b)
				if !ok {
					fail("final read: rldev %d block %d (replica %d) holds bytes no write wrote", id, b, rep)
				}
				h.read(clients+rep, id, b, v, call, ret, rep)
			}
			copies[rep-1] = data
		}
		if string(copies[0]) != string(copies[1]) {
			for b := uint64(0); b < rlBlocks; b++ {
				x, _ := linValueOf(copies[0][b*rldev.BlockSize:(b+1)*rldev.BlockSize], id, b)
				y, _ := linValueOf(copies[1][b*rldev.BlockSize:(b+1)*rldev.BlockSize], id, b)
				if x != y {
					fail("rldev %d's replicas differ after healing: block %d holds write %d on segment 0, %d on segment 1", id, b, x, y)
				}
			}
		}
	}
	if msg := h.check(); msg != "" {
		fail("%s", msg)
	}
	writes, reads, open, refused := h.counts()
	refusal := ""
	if h.firstRefusal != "" {
		refusal = "; the first: " + h.firstRefusal
	}
	t.Logf("seed %d: faults %s; %d moves asked; %d writes (%d of unknown outcome, %d refused%s) and %d reads checked on %d blocks; %d blocks left out (%s)",
		seed, strings.Join(did, ", "), moves, writes, open, refused, refusal, reads, len(h.ops), len(h.tainted), strings.Join(h.taintWhy, "; "))
	if writes < 50 || reads < 50 {
		fail("too few operations completed to check anything (%d writes, %d reads)", writes, reads)
	}
}

// linSettled: every RLDev of ids is normal, both its segments named by an
// incarnation, with no move in progress and no old extent left to wipe.
func linSettled(tb *rldev.Table, ids []uint64) bool {
	for _, id := range ids {
		r := tb.RLDevs[id]
		if r == nil || r.State != rldev.Normal || r.Move != nil || len(r.Retiring) > 0 || r.Inc[0] == 0 || r.Inc[1] == 0 {
			return false
		}
	}
	return true
}

// linFill writes value v's content of block b of RLDev id into p: its
// value, its address, then words derived from all three (a block of
// another RLDev, another block or a torn mix of two writes is caught).
func linFill(p []byte, v, id, b uint64) {
	binary.LittleEndian.PutUint64(p, v)
	binary.LittleEndian.PutUint64(p[8:], id<<32|b)
	for i := 16; i < len(p); i += 8 {
		binary.LittleEndian.PutUint64(p[i:], (v^id<<40^b<<20)*0x9e3779b97f4a7c15+uint64(i))
	}
}

// linValueOf decodes a block read back: its write (0: never written);
// false if it is neither zeros nor a write's exact content for that block.
func linValueOf(p []byte, id, b uint64) (uint64, bool) {
	v := binary.LittleEndian.Uint64(p)
	if v == 0 {
		for _, x := range p {
			if x != 0 {
				return 0, false
			}
		}
		return 0, true
	}
	want := make([]byte, len(p))
	linFill(want, v, id, b)
	return v, string(p) == string(want)
}

type linKey struct{ id, block uint64 }

// linHistory is each block's history, a register's.
type linHistory struct {
	start    time.Time
	mu       sync.Mutex
	ops      map[linKey][]porcupine.Operation
	refusals map[linKey]map[uint64]string // values whose writes were refused: never to be read
	tainted  map[linKey]bool
	taintWhy []string
	nw, nr   int
	open     int
	nrefused int
	// firstRefusal: the first refused write's error, for the summary.
	firstRefusal string
}

func (h *linHistory) at(t time.Time) int64 { return int64(t.Sub(h.start)) }

func (h *linHistory) write(c int, id, b, n, v uint64, call, ret time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.nw++
	r := int64(blockcheck.Open)
	if ret.IsZero() {
		h.open++
	} else {
		r = h.at(ret)
	}
	for i := uint64(0); i < n; i++ {
		k := linKey{id, b + i}
		h.ops[k] = append(h.ops[k], porcupine.Operation{ClientId: c, Input: blockcheck.In{Write: true, V: v}, Call: h.at(call), Return: r})
	}
}

func (h *linHistory) refused(c int, id, b, n, v uint64, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.nrefused++
	if h.nrefused == 1 {
		h.firstRefusal = err.Error()
	}
	if h.refusals == nil {
		h.refusals = map[linKey]map[uint64]string{}
	}
	for i := uint64(0); i < n; i++ {
		k := linKey{id, b + i}
		if h.refusals[k] == nil {
			h.refusals[k] = map[uint64]string{}
		}
		h.refusals[k][v] = fmt.Sprintf("client %d's write %d refused: %v", c, v, err)
	}
}

func (h *linHistory) taint(id, b, n uint64, format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.tainted == nil {
		h.tainted = map[linKey]bool{}
	}
	for i := uint64(0); i < n; i++ {
		h.tainted[linKey{id, b + i}] = true
	}
	h.taintWhy = append(h.taintWhy, fmt.Sprintf("rldev %d blocks %d+%d: ", id, b, n)+fmt.Sprintf(format, args...))
}

func (h *linHistory) read(c int, id, b, v uint64, call, ret time.Time, replica int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.nr++
	k := linKey{id, b}
	h.ops[k] = append(h.ops[k], porcupine.Operation{ClientId: c, Input: blockcheck.In{}, Output: v, Call: h.at(call), Return: h.at(ret), Metadata: fmt.Sprintf("replica %d", replica)})
}

func (h *linHistory) counts() (writes, reads, open, refused int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.nw, h.nr, h.open, h.nrefused
}

// check returns what is wrong with the histories ("" if nothing): a
// refused write's value read back, or a block's history that is not
// linearizable.
func (h *linHistory) check() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	keys := make([]linKey, 0, len(h.ops))
	for k := range h.ops {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		return keys[i].id < keys[j].id || keys[i].id == keys[j].id && keys[i].block < keys[j].block
	})
	for _, k := range keys {
		if h.tainted[k] {
			continue
		}
		for _, op := range h.ops[k] {
			if in := op.Input.(blockcheck.In); !in.Write {
				if why, ok := h.refusals[k][op.Output.(uint64)]; ok {
					return fmt.Sprintf("rldev %d block %d: read back the value of a refused write (%s)", k.id, k.block, why)
				}
			}
		}
		if ops := blockcheck.Observed(h.ops[k]); blockcheck.Check(ops, 20*time.Second) != porcupine.Ok {
			return fmt.Sprintf("rldev %d block %d: the history is not linearizable (%d operations)%s", k.id, k.block, len(ops), blockcheck.Describe(ops))
		}
	}
	return ""
}

// TestRLDevLinOracleHasTeeth: the real-process test's checker catches a
// stale read (a block read back older than a write acknowledged before
// the read began), a refused write's value read back, and passes a
// history a register allows (an open write seen late, overlapping
// operations in either order).
func TestRLDevLinOracleHasTeeth(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	fresh := func() *linHistory { return &linHistory{start: t0, ops: map[linKey][]porcupine.Operation{}} }

	h := fresh() // sound: write 1 acked, write 2 open and seen later, a read overlapping write 3
	h.write(0, 1, 0, 1, 1, at(0), at(10))
	h.write(1, 1, 0, 1, 2, at(20), time.Time{})
	h.read(2, 1, 0, 1, at(15), at(18), 1)
	h.read(2, 1, 0, 2, at(40), at(50), 2)
	h.write(0, 1, 0, 1, 3, at(60), at(80))
	h.read(2, 1, 0, 2, at(61), at(70), 0)
	h.read(2, 1, 0, 3, at(90), at(95), 0)
	if msg := h.check(); msg != "" {
		t.Fatalf("a linearizable history is refused: %s", msg)
	}

	h = fresh() // stale: write 2 acknowledged at 30, a read begun at 40 returns 1
	h.write(0, 1, 0, 1, 1, at(0), at(10))
	h.write(0, 1, 0, 1, 2, at(20), at(30))
	h.read(1, 1, 0, 1, at(40), at(45), 2)
	if msg := h.check(); !strings.Contains(msg, "not linearizable") {
		t.Fatalf("a stale read is not caught: %q", msg)
	}

	h = fresh() // a refused write read back
	h.write(0, 1, 0, 1, 1, at(0), at(10))
	h.refused(1, 1, 0, 1, 2, rldev.ErrStaleToken)
	h.read(1, 1, 0, 2, at(40), at(45), 0)
	if msg := h.check(); !strings.Contains(msg, "refused write") {
		t.Fatalf("a refused write read back is not caught: %q", msg)
	}

	p := make([]byte, rldev.BlockSize) // a block of another RLDev, or torn
	linFill(p, 7, 1, 3)
	if v, ok := linValueOf(p, 1, 3); !ok || v != 7 {
		t.Fatalf("a block's own value reads as %d, %v", v, ok)
	}
	if _, ok := linValueOf(p, 2, 3); ok {
		t.Fatal("another RLDev's block is taken as this one's")
	}
	q := make([]byte, rldev.BlockSize)
	linFill(q, 8, 1, 3)
	copy(p[2048:], q[2048:])
	if _, ok := linValueOf(p, 1, 3); ok {
		t.Fatal("a block torn between two writes is taken as a write's")
	}
}
