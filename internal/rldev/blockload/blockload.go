// Package blockload is the RLDev layer's real-process linearizability
// workload: clients writing unique values to the first blocks of a few
// RLDevs through a real Clerk and reading them back, an operator moving
// segments, while the caller's faults run (processes killed, stopped and
// paused in cmd/grove's test; network cuts, loss and pauses in the
// multi-host fault suite, internal/faults). Its oracle is independent of
// the engine and of the clerk: each block's history as a register, checked
// by porcupine (package blockcheck, the simulator's too), and the values'
// own bytes, which name their write, RLDev and block.
//
// What Run checks:
//   - every block's history is linearizable: a write whose error says it
//     may have taken effect, or that timed out, may have happened at any
//     time after it began; one refused otherwise must never be read back;
//   - no block reads as corrupt, nor holds bytes no write wrote for it
//     (another block's, another RLDev's, a torn mix of two writes);
//   - once the faults are over and the caller's Healed returns, every
//     RLDev is normal again within SettleWithin, named, with no move in
//     progress and no old extent left, and its two replicas, each read
//     alone, hold identical blocks, which end each block's history.
//
// A write acknowledged with "an earlier attempt may land later"
// (Clerk.WriteReport) leaves its blocks out of the check: the clerk's
// contract lets that attempt land over later writes. Run counts them. A
// write acknowledged after attempts of unknown outcome is one register
// write per attempt that may have landed, each within the call
// (rldev.WriteResult.Applied): the clerk's retry is a new write of the
// same data, and another client's write may land between two of them
// (CI, seed 62704: a value read while its write was in flight, another
// client's write acknowledged, then the first value again, written by
// the retry after a failover).
package blockload

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/grovestore/grove/internal/rldev"
	"github.com/grovestore/grove/internal/rldev/blockcheck"
)

// Config is one run's.
type Config struct {
	Clerk *rldev.Clerk
	// Seed chooses the clients' operations (Seed*100+c+1), the
	// operator's moves (Seed*100+99) and the faults (Seed): a run
	// replays its choices from it; the interleaving is the machine's.
	Seed int64
	// RLDevs of Size bytes are created for the run (defaults 3, 1 MiB);
	// the clients use their first Blocks blocks (default 24).
	RLDevs  int
	Size    uint64
	Blocks  int
	Clients int // default 4
	// Nodes, if not nil, are the store nodes: every 1.5-4 s the operator
	// asks a move of a random segment to a node holding neither copy.
	Nodes []uint64
	// Faults runs the faults and returns what it did; the clients stop 2 s
	// after it returns.
	Faults func(ctx context.Context, r *rand.Rand, event func(string, ...any)) []string
	// Healed returns once every node is alive and heard again.
	Healed func(ctx context.Context) error
	// SettleWithin bounds the wait for every RLDev to be normal again
	// (default 90 s).
	SettleWithin time.Duration
	// OpWait bounds each operation (default 20 s).
	OpWait time.Duration
}

// Result is what a run checked.
type Result struct {
	Did                          []string // the faults
	Moves                        int      // moves asked and accepted
	Writes, Reads, Open, Refused int
	// Reapplied: acknowledged writes the clerk sent again after an
	// attempt of unknown outcome (each attempt checked as a write).
	Reapplied int
	// LandedBefore: acknowledged writes whose last attempt found an
	// earlier one landed, and applied nothing (rldev.WriteResult).
	LandedBefore int
	FirstRefusal string
	Blocks       int      // blocks with a history
	LeftOut      []string // blocks left out, and why
	Settle       time.Duration
}

func (r *Result) String() string {
	refusal := ""
	if r.FirstRefusal != "" {
		refusal = "; the first: " + r.FirstRefusal
	}
	return fmt.Sprintf("faults %s; %d moves asked; %d writes (%d of unknown outcome, %d that may have been applied twice, %d retries that found an earlier attempt landed, %d refused%s) and %d reads checked on %d blocks; settled in %v; %d blocks left out (%s)",
		strings.Join(r.Did, ", "), r.Moves, r.Writes, r.Open, r.Reapplied, r.LandedBefore, r.Refused, refusal, r.Reads, r.Blocks, r.Settle.Round(time.Millisecond), len(r.LeftOut), strings.Join(r.LeftOut, "; "))
}

// Run runs the workload and its checks. Its error names the seed and ends
// with the run's events (faults, moves, the settling).
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if cfg.RLDevs == 0 {
		cfg.RLDevs = 3
	}
	if cfg.Size == 0 {
		cfg.Size = 1 << 20
	}
	if cfg.Blocks == 0 {
		cfg.Blocks = 24
	}
	if cfg.Clients == 0 {
		cfg.Clients = 4
	}
	if cfg.SettleWithin == 0 {
		cfg.SettleWithin = 90 * time.Second
	}
	if cfg.OpWait == 0 {
		cfg.OpWait = 20 * time.Second
	}
	if uint64(cfg.Blocks)*rldev.BlockSize > cfg.Size {
		return nil, fmt.Errorf("blockload: %d blocks do not fit in an RLDev of %d bytes", cfg.Blocks, cfg.Size)
	}
	cl := cfg.Clerk
	h := NewHistory(time.Now())
	var events []string
	var evMu sync.Mutex
	event := func(format string, args ...any) {
		evMu.Lock()
		defer evMu.Unlock()
		events = append(events, fmt.Sprintf("%8.3fs ", time.Since(h.start).Seconds())+fmt.Sprintf(format, args...))
	}
	fail := func(format string, args ...any) error {
		evMu.Lock()
		defer evMu.Unlock()
		return fmt.Errorf("seed %d (GROVE_SEED=%d replays its choices): %s\nevents:\n%s", cfg.Seed, cfg.Seed, fmt.Sprintf(format, args...), strings.Join(events, "\n"))
	}
	recs, err := cl.Create(ctx, cfg.Size, cfg.RLDevs, false)
	if err != nil {
		return nil, fmt.Errorf("blockload: creating %d RLDevs: %w", cfg.RLDevs, err)
	}
	var ids []uint64
	for _, r := range recs {
		ids = append(ids, r.ID)
	}
	event("rldevs %v created", ids)
	res := &Result{}

	// The clients and the operator run until the faults are over.
	var stop atomic.Bool
	var wg sync.WaitGroup
	var next atomic.Uint64 // write values, unique over the run
	var landedBefore atomic.Int64
	var bad atomic.Value // the first impossible answer
	for c := 0; c < cfg.Clients; c++ {
		r := rand.New(rand.NewSource(cfg.Seed*100 + int64(c) + 1))
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 4*rldev.BlockSize)
			for !stop.Load() && ctx.Err() == nil {
				id := ids[r.Intn(len(ids))]
				n := uint64(1 + r.Intn(4))
				b := uint64(r.Intn(cfg.Blocks - int(n) + 1))
				octx, ocancel := context.WithTimeout(ctx, cfg.OpWait)
				call := time.Now()
				if r.Intn(2) == 0 {
					v := next.Add(1)
					data := buf[:n*rldev.BlockSize]
					for i := uint64(0); i < n; i++ {
						Fill(data[i*rldev.BlockSize:(i+1)*rldev.BlockSize], v, id, b+i)
					}
					info, err := cl.WriteInfo(octx, id, b*rldev.BlockSize, data, rldev.WriteOptions{})
					ret := time.Now()
					switch {
					case err == nil && info.EarlierMayLand:
						// An earlier attempt may land later, over later
						// writes (the clerk's contract): no register.
						h.Taint(id, b, n, "write %d acknowledged with an earlier attempt that may land later", v)
					case err == nil:
						// Each attempt that may have landed is a write of
						// its own, within the call (the clerk's contract:
						// a retry is a new write of the same data).
						h.WriteTimes(c, id, b, n, v, call, ret, info.Applied)
						if info.LandedBefore {
							landedBefore.Add(1)
						}
					case errors.Is(err, rldev.ErrMaybeWritten) || ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded):
						h.Write(c, id, b, n, v, call, time.Time{}) // open: it may land any time after call
					default:
						h.Refused(c, id, b, n, v, err)
					}
				} else {
					replica := r.Intn(3) // 0: the primary (or the other), 1/2: that copy alone
					data, err := cl.Read(octx, id, b*rldev.BlockSize, n*rldev.BlockSize, replica)
					ret := time.Now()
					switch {
					case err == nil:
						for i := uint64(0); i < n; i++ {
							v, ok := ValueOf(data[i*rldev.BlockSize:(i+1)*rldev.BlockSize], id, b+i)
							if !ok {
								bad.CompareAndSwap(nil, fmt.Sprintf("rldev %d block %d (replica %d) holds bytes no write wrote", id, b+i, replica))
								continue
							}
							h.Read(c, id, b+i, v, call, ret, replica)
						}
					case errors.Is(err, rldev.ErrCorrupt):
						bad.CompareAndSwap(nil, fmt.Sprintf("rldev %d blocks %d+%d (replica %d) read as corrupt: %v", id, b, n, replica, err))
					}
				}
				ocancel()
			}
		}()
	}
	var moves atomic.Int64
	if len(cfg.Nodes) > 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewSource(cfg.Seed*100 + 99))
			for !stop.Load() && ctx.Err() == nil {
				time.Sleep(time.Duration(1500+r.Intn(2500)) * time.Millisecond)
				id, seg := ids[r.Intn(len(ids))], r.Intn(2)
				tb, err := cl.Table(ctx, true)
				if err != nil || stop.Load() {
					continue
				}
				rec := tb.RLDevs[id]
				var tos []uint64
				for _, n := range cfg.Nodes {
					if rec.Segs[0].Node != n && rec.Segs[1].Node != n {
						tos = append(tos, n)
					}
				}
				if len(tos) == 0 {
					continue
				}
				to := tos[0]
				if len(tos) > 1 {
					to = tos[r.Intn(len(tos))]
				}
				mctx, mcancel := context.WithTimeout(ctx, 10*time.Second)
				_, err = cl.Move(mctx, id, seg, to, -1)
				mcancel()
				if err == nil {
					moves.Add(1)
					event("move of rldev %d's segment %d (node %d) to node %d asked", id, seg, rec.Segs[seg].Node, to)
				} else {
					event("move of rldev %d's segment %d to node %d refused: %v", id, seg, to, err)
				}
			}
		}()
	}
	res.Did = cfg.Faults(ctx, rand.New(rand.NewSource(cfg.Seed)), event)
	for tail := time.Now(); time.Since(tail) < 2*time.Second && ctx.Err() == nil; {
		time.Sleep(100 * time.Millisecond) // operations across the last heal
	}
	stop.Store(true)
	wg.Wait()
	res.Moves = int(moves.Load())
	if v := bad.Load(); v != nil {
		return nil, fail("%s", v)
	}

	// Healed: every RLDev normal, named, nothing moving or retiring.
	if err := cfg.Healed(ctx); err != nil {
		return nil, fail("the nodes are not all heard after the faults: %v", err)
	}
	var tb *rldev.Table
	settled := time.Now()
	for deadline := time.Now().Add(cfg.SettleWithin); ; time.Sleep(250 * time.Millisecond) {
		tb, err = cl.Table(ctx, true)
		if err == nil && Settled(tb, ids) {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			var desc []string
			if tb != nil {
				for _, id := range ids {
					desc = append(desc, fmt.Sprintf("%+v", *tb.RLDevs[id]))
				}
			}
			return nil, fail("the RLDevs did not settle within %v of the faults' end (err %v):\n%s", cfg.SettleWithin, err, strings.Join(desc, "\n"))
		}
	}
	res.Settle = time.Since(settled)
	event("settled after %v", res.Settle.Round(time.Millisecond))

	// Both copies, each read alone, are identical and end each block's
	// history.
	for _, id := range ids {
		var copies [2][]byte
		for rep := 1; rep <= 2; rep++ {
			call := time.Now()
			data, err := cl.Read(ctx, id, 0, uint64(cfg.Blocks)*rldev.BlockSize, rep)
			if err != nil {
				return nil, fail("final read of rldev %d's replica %d: %v", id, rep, err)
			}
			ret := time.Now()
			for b := uint64(0); b < uint64(cfg.Blocks); b++ {
				v, ok := ValueOf(data[b*rldev.BlockSize:(b+1)*rldev.BlockSize], id, b)
				if !ok {
					return nil, fail("final read: rldev %d block %d (replica %d) holds bytes no write wrote", id, b, rep)
				}
				h.Read(cfg.Clients+rep, id, b, v, call, ret, rep)
			}
			copies[rep-1] = data
		}
		if string(copies[0]) != string(copies[1]) {
			for b := uint64(0); b < uint64(cfg.Blocks); b++ {
				x, _ := ValueOf(copies[0][b*rldev.BlockSize:(b+1)*rldev.BlockSize], id, b)
				y, _ := ValueOf(copies[1][b*rldev.BlockSize:(b+1)*rldev.BlockSize], id, b)
				if x != y {
					return nil, fail("rldev %d's replicas differ after healing: block %d holds write %d on segment 0, %d on segment 1", id, b, x, y)
				}
			}
		}
	}
	if msg := h.Check(); msg != "" {
		return nil, fail("%s", msg)
	}
	h.mu.Lock()
	res.Writes, res.Reads, res.Open, res.Refused, res.FirstRefusal = h.nw, h.nr, h.open, h.nrefused, h.firstRefusal
	res.Reapplied = h.reapplied
	res.LandedBefore = int(landedBefore.Load())
	res.Blocks, res.LeftOut = len(h.ops), h.taintWhy
	h.mu.Unlock()
	if res.Writes < 50 || res.Reads < 50 {
		return nil, fail("too few operations completed to check anything (%d writes, %d reads)", res.Writes, res.Reads)
	}
	return res, nil
}

// Settled reports whether every RLDev of ids is normal, both its segments
// named by an incarnation, with no move in progress and no old extent left
// to wipe.
func Settled(tb *rldev.Table, ids []uint64) bool {
	for _, id := range ids {
		r := tb.RLDevs[id]
		if r == nil || r.State != rldev.Normal || r.Move != nil || len(r.Retiring) > 0 || r.Inc[0] == 0 || r.Inc[1] == 0 {
			return false
		}
	}
	return true
}

// Fill writes value v's content of block b of RLDev id into p: its value,
// its address, then words derived from all three (a block of another
// RLDev, another block or a torn mix of two writes is caught).
func Fill(p []byte, v, id, b uint64) {
	binary.LittleEndian.PutUint64(p, v)
	binary.LittleEndian.PutUint64(p[8:], id<<32|b)
	for i := 16; i < len(p); i += 8 {
		binary.LittleEndian.PutUint64(p[i:], (v^id<<40^b<<20)*0x9e3779b97f4a7c15+uint64(i))
	}
}

// ValueOf decodes a block read back: its write (0: never written); false
// if it is neither zeros nor a write's exact content for that block.
func ValueOf(p []byte, id, b uint64) (uint64, bool) {
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
	Fill(want, v, id, b)
	return v, string(p) == string(want)
}

type key struct{ id, block uint64 }

// History is each block's history, a register's, recorded by concurrent
// clients.
type History struct {
	start    time.Time
	mu       sync.Mutex
	ops      map[key][]porcupine.Operation
	refusals map[key]map[uint64]string // values whose writes were refused: never to be read
	tainted  map[key]bool
	taintWhy []string
	nw, nr   int
	open     int
	// reapplied: acknowledged writes that may have taken effect more
	// than once (WriteTimes).
	reapplied int
	nrefused  int
	// firstRefusal: the first refused write's error, for the summary.
	firstRefusal string
}

// NewHistory starts a history whose clock is 0 at start.
func NewHistory(start time.Time) *History {
	return &History{start: start, ops: map[key][]porcupine.Operation{}}
}

func (h *History) at(t time.Time) int64 { return int64(t.Sub(h.start)) }

// Write records client c's write of v to blocks [b, b+n) of RLDev id,
// called at call and acknowledged at ret (zero: its outcome is unknown).
func (h *History) Write(c int, id, b, n, v uint64, call, ret time.Time) {
	h.WriteTimes(c, id, b, n, v, call, ret, 1)
}

// WriteTimes is Write of a write that may have taken effect up to times
// times between call and ret (the clerk sent it again after attempts of
// unknown outcome: rldev.WriteResult.Applied): one register write each,
// so that another client's write may come between two of them.
func (h *History) WriteTimes(c int, id, b, n, v uint64, call, ret time.Time, times int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.nw++
	if times > 1 {
		h.reapplied++
	}
	r := int64(blockcheck.Open)
	if ret.IsZero() {
		h.open++
	} else {
		r = h.at(ret)
	}
	for i := uint64(0); i < n; i++ {
		k := key{id, b + i}
		for j := 0; j < max(times, 1); j++ {
			h.ops[k] = append(h.ops[k], porcupine.Operation{ClientId: c, Input: blockcheck.In{Write: true, V: v}, Call: h.at(call), Return: r})
		}
	}
}

// Refused records a write refused with err, saying it did not take
// effect: its value must never be read.
func (h *History) Refused(c int, id, b, n, v uint64, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.nrefused++
	if h.nrefused == 1 {
		h.firstRefusal = err.Error()
	}
	if h.refusals == nil {
		h.refusals = map[key]map[uint64]string{}
	}
	for i := uint64(0); i < n; i++ {
		k := key{id, b + i}
		if h.refusals[k] == nil {
			h.refusals[k] = map[uint64]string{}
		}
		h.refusals[k][v] = fmt.Sprintf("client %d's write %d refused: %v", c, v, err)
	}
}

// Taint leaves blocks [b, b+n) of RLDev id out of the check, saying why.
func (h *History) Taint(id, b, n uint64, format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.tainted == nil {
		h.tainted = map[key]bool{}
	}
	for i := uint64(0); i < n; i++ {
		h.tainted[key{id, b + i}] = true
	}
	h.taintWhy = append(h.taintWhy, fmt.Sprintf("rldev %d blocks %d+%d: ", id, b, n)+fmt.Sprintf(format, args...))
}

// Read records client c's read of block b of RLDev id, which returned v,
// from replica (0: the primary, 1 or 2: that copy alone).
func (h *History) Read(c int, id, b, v uint64, call, ret time.Time, replica int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.nr++
	k := key{id, b}
	h.ops[k] = append(h.ops[k], porcupine.Operation{ClientId: c, Input: blockcheck.In{}, Output: v, Call: h.at(call), Return: h.at(ret), Metadata: fmt.Sprintf("replica %d", replica)})
}

// Check returns what is wrong with the histories ("" if nothing): a
// refused write's value read back, or a block's history that is not
// linearizable.
func (h *History) Check() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	keys := make([]key, 0, len(h.ops))
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
