package txn

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"

	"github.com/grovestore/grove/internal/lock"
	"github.com/grovestore/grove/internal/rldev"
)

// The simulator drives the log runtime itself (Open, Recover, Txn, FlushNow,
// Checkpoint: the code a node runs) against a device that behaves as an
// RLDev with its dirty-region log off does under faults: two replicas
// written one after the other, a crash that leaves a write on one replica,
// on part of it, or tears a block; replicas that go down, miss writes and
// serve nothing until resynced from the other (only the blocks written
// while they were away: what the RLDev's degraded-mode log gives);
// fencing tokens; writes of a crashed owner that arrive late. A client
// stands in for the B-link tree: pages cached and changed under
// transactions, written back early (steal) under the write-ahead rule, and
// by checkpoints. After every recovery the oracle checks that exactly a
// prefix of the commits is visible, atomically, and that it includes every
// commit that was acknowledged as durable.

var errCrashed = errors.New("sim: crashed")

const (
	simPages    = 24
	simSlots    = 8
	simSlotSize = 8
	simPageSize = simSlots * simSlotSize
)

type simDev struct {
	rng      *rand.Rand
	blocks   uint64
	rep      [2]map[uint64][]byte
	down     [2]bool
	stale    [2]bool
	degraded map[uint64]bool
	max      lock.Token
	ops      int
	crashAt  int
	crashed  bool
	late     []lateWrite
	stats    *simStats
	// store is the client's pages on their chunks (what the applier and
	// write-back write).
	store map[int][]byte
}

type lateWrite struct {
	block uint64
	data  []byte
	tok   lock.Token
	rep   int
}

func (d *simDev) Blocks() uint64 { return d.blocks }

// step counts one I/O and reports whether it is the crash point.
func (d *simDev) step() (crashNow bool, err error) {
	if d.crashed {
		return false, errCrashed
	}
	d.ops++
	d.maybeLate()
	if d.ops == d.crashAt {
		d.crashed = true
		d.stats.crashes++
		return true, nil
	}
	return false, nil
}

func (d *simDev) maybeLate() {
	if len(d.late) == 0 || d.rng.IntN(4) != 0 {
		return
	}
	w := d.late[0]
	d.late = d.late[1:]
	d.stats.late++
	if w.tok.Less(d.max) {
		d.stats.lateRefused++
		return
	}
	if !d.down[w.rep] && !d.stale[w.rep] {
		d.put(w.rep, w.block, w.data)
	}
}

func (d *simDev) get(r int, b uint64) []byte {
	if x, ok := d.rep[r][b]; ok {
		return x
	}
	return make([]byte, BlockSize)
}

func (d *simDev) put(r int, b uint64, data []byte) {
	for i := 0; i < len(data)/BlockSize; i++ {
		d.rep[r][b+uint64(i)] = bytes.Clone(data[i*BlockSize : (i+1)*BlockSize])
	}
}

func (d *simDev) admit(f *rldev.Fence) error {
	if f.Token.Less(d.max) {
		return rldev.ErrStaleToken
	}
	d.max = f.Token
	return nil
}

// targets are the replicas a write reaches; a down one becomes stale.
func (d *simDev) targets() []int {
	var out []int
	for r := 0; r < 2; r++ {
		if d.down[r] || d.stale[r] {
			if !d.stale[r] {
				d.stale[r] = true
				d.stats.staled++
			}
			continue
		}
		out = append(out, r)
	}
	return out
}

func (d *simDev) write(reps []int, block uint64, data []byte, f *rldev.Fence) error {
	if block < FenceBlock && !d.crashed && d.crashAt <= d.ops && d.rng.IntN(6) == 0 {
		d.crashAt = d.ops + 1 // a header write is a commit point: crash there often
	}
	crash, err := d.step()
	if err != nil {
		return err
	}
	if err := d.admit(f); err != nil {
		return err
	}
	if !crash {
		for _, r := range reps {
			d.put(r, block, data)
		}
		if len(reps) == 1 {
			for i := uint64(0); i < uint64(len(data)/BlockSize); i++ {
				d.degraded[block+i] = true
			}
		}
		return nil
	}
	// The crash cuts this write: per replica, a prefix of its blocks lands,
	// the next one maybe torn; the rest may arrive later.
	n := len(data) / BlockSize
	for _, r := range reps {
		k := d.rng.IntN(n + 1)
		d.put(r, block, data[:k*BlockSize])
		if len(reps) == 1 {
			for i := 0; i < k; i++ {
				d.degraded[block+uint64(i)] = true
			}
		}
		if k < n && d.rng.IntN(3) == 0 {
			torn := bytes.Clone(d.get(r, block+uint64(k)))
			cut := d.rng.IntN(BlockSize)
			copy(torn[:cut], data[k*BlockSize:k*BlockSize+cut])
			d.rep[r][block+uint64(k)] = torn
			d.stats.torn++
		} else if k < n && d.rng.IntN(3) == 0 {
			j := k + d.rng.IntN(n-k)
			d.late = append(d.late, lateWrite{block: block + uint64(j), data: bytes.Clone(data[j*BlockSize : (j+1)*BlockSize]), tok: f.Token, rep: r})
		}
	}
	return errCrashed
}

func (d *simDev) Write(ctx context.Context, block uint64, data []byte, f *rldev.Fence) error {
	reps := d.targets()
	if len(reps) == 0 {
		return errors.New("sim: no replica")
	}
	return d.write(reps, block, data, f)
}

func (d *simDev) WriteReplica(ctx context.Context, r int, block uint64, data []byte, f *rldev.Fence) error {
	if d.down[r] || d.stale[r] {
		return rldev.ErrNotServing
	}
	return d.write([]int{r}, block, data, f)
}

func (d *simDev) ReadReplica(ctx context.Context, r int, block, n uint64) ([]byte, error) {
	if _, err := d.step(); err != nil {
		return nil, err
	}
	if d.crashed {
		return nil, errCrashed
	}
	if d.down[r] || d.stale[r] {
		return nil, rldev.ErrNotServing
	}
	var out []byte
	for i := uint64(0); i < n; i++ {
		out = append(out, d.get(r, block+i)...)
	}
	return out, nil
}

// crashTakesReplica: the node that crashed may have held a replica of
// the log, which is down until a later step brings it back.
// A replica down since an earlier crash may come back at the same time.
func (d *simDev) crashTakesReplica() {
	if !d.crashed {
		return
	}
	for r := 0; r < 2; r++ {
		if d.down[r] && d.rng.IntN(2) == 0 {
			d.resync(r)
		}
	}
	if d.rng.IntN(2) != 0 {
		return
	}
	r := d.rng.IntN(2)
	if !d.down[1-r] && !d.stale[1-r] && !d.down[r] {
		d.down[r] = true
		d.stats.downs++
	}
}

// resync brings replica r back as the RLDev would: the blocks written
// while it was stale, from the other.
func (d *simDev) resync(r int) {
	d.down[r] = false
	if !d.stale[r] {
		return
	}
	o := 1 - r
	if d.down[o] || d.stale[o] {
		return // waits for its peer, the only up-to-date copy
	}
	for b := range d.degraded {
		d.rep[r][b] = bytes.Clone(d.get(o, b))
	}
	d.degraded = map[uint64]bool{}
	d.stale[r] = false
	d.stats.resyncs++
}

// simApplier writes images to the store (durable at once).
type simApplier struct{ d *simDev }

func (a simApplier) Apply(ctx context.Context, target []byte, off uint64, data []byte, lsn LSN, f *rldev.Fence) error {
	crash, err := a.d.step()
	if err != nil {
		return err
	}
	if crash && a.d.rng.IntN(2) == 0 {
		return errCrashed
	}
	p := int(binary.LittleEndian.Uint32(target))
	pg := a.d.store[p]
	if pg == nil {
		pg = make([]byte, simPageSize)
		a.d.store[p] = pg
	}
	copy(pg[off:], data)
	if crash {
		return errCrashed
	}
	return nil
}

type cpage struct {
	data  []byte
	need  LSN // the log must be durable past here before a write-back
	dirty bool
}

type simTxn struct {
	t      *Txn
	id     int            // the oracle's
	writes map[int][]byte // slot → value
}

type simClient struct {
	log   *Log
	cache map[int]*cpage
	d     *simDev
	open  []*simTxn
	locks map[int]*simTxn // slot → holder
	// commits of this session in commit order; acked: how many of them
	// are known durable.
	commits []*simTxn
	acked   int
	ends    map[*simTxn]LSN
}

func (c *simClient) page(p int) *cpage {
	if x := c.cache[p]; x != nil {
		return x
	}
	x := &cpage{data: make([]byte, simPageSize)}
	if s := c.d.store[p]; s != nil {
		copy(x.data, s)
	}
	c.cache[p] = x
	return x
}

func (c *simClient) writeBack(ctx context.Context, p int) error {
	pg := c.cache[p]
	if pg == nil || !pg.dirty {
		return nil
	}
	if err := c.log.Flush(ctx, pg.need); err != nil { // the write-ahead rule
		return err
	}
	c.ackDurable()
	crash, err := c.d.step()
	if err != nil {
		return err
	}
	if crash && c.d.rng.IntN(2) == 0 {
		return errCrashed
	}
	c.d.store[p] = bytes.Clone(pg.data)
	pg.dirty = false
	c.d.stats.writeBacks++
	if crash {
		return errCrashed
	}
	return nil
}

// WriteBack is the checkpointer: every dirty page (more than needed is
// allowed, under the write-ahead rule).
func (c *simClient) WriteBack(ctx context.Context, upTo LSN) error {
	for p := 0; p < simPages; p++ {
		if err := c.writeBack(ctx, p); err != nil {
			return err
		}
	}
	return nil
}

// truncated folds the commits a checkpoint dropped from the log into the
// model: the store holds them now, and recovery will not see them.
func (c *simClient) truncated(model map[int][]byte) {
	head := c.log.Stats().Head
	for len(c.commits) > 0 && c.ends[c.commits[0]] <= head {
		for s, v := range c.commits[0].writes {
			model[s] = v
		}
		c.commits = c.commits[1:]
		c.acked = max(c.acked-1, 0)
	}
}

func (c *simClient) ackDurable() {
	d := c.log.Durable()
	for c.acked < len(c.commits) && c.ends[c.commits[c.acked]] <= d {
		c.acked++
	}
}

type simStats struct {
	txns, commits, syncCommits, aborts, updates, flushes, checkpoints, writeBacks                  int
	crashes, recoveries, recoveryCrashes, torn, late, lateRefused, staled, resyncs, zombies, downs int
	repaired, undone, redone, waits                                                                int
}

func simSeeds(t *testing.T, def int) (int, int) {
	n := def
	if v := os.Getenv("GROVE_TXN_SEEDS"); v != "" {
		n, _ = strconv.Atoi(v)
	}
	start := 1
	if v := os.Getenv("GROVE_TXN_SEED"); v != "" {
		start, _ = strconv.Atoi(v)
		if os.Getenv("GROVE_TXN_SEEDS") == "" {
			n = 1
		}
	}
	return start, n
}

func TestSimLog(t *testing.T) {
	start, n := simSeeds(t, 150)
	var total simStats
	for seed := start; seed < start+n; seed++ {
		if err := runSim(uint64(seed), Unsafe{}, &total); err != nil {
			t.Fatalf("seed %d: %v (replay: GROVE_TXN_SEED=%d go test ./internal/txn -run TestSimLog)", seed, err, seed)
		}
	}
	t.Logf("seeds %d..%d: %+v", start, start+n-1, total)
}

// Each unsafe rule must be caught by the oracle within a few seeds: the
// oracle can fail.
func TestSimTeeth(t *testing.T) {
	if testing.Short() {
		t.Skip("sweeps of simulations: the full suite runs them")
	}
	cases := []struct {
		name string
		u    Unsafe
	}{
		{"ack before write", Unsafe{AckBeforeWrite: true}},
		{"no undo", Unsafe{NoUndo: true}},
		{"no floor", Unsafe{NoFloor: true}},
		{"no reconcile", Unsafe{NoReconcile: true}},
		{"no pre-header", Unsafe{NoPreHeader: true}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var st simStats
			for seed := uint64(1); seed <= 6000; seed++ {
				if err := runSim(seed, c.u, &st); err != nil {
					t.Logf("caught at seed %d: %v", seed, err)
					return
				}
			}
			t.Fatalf("%s: no seed in 1..6000 caught it", c.name)
		})
	}
}

var trace = os.Getenv("GROVE_TXN_TRACE") != ""

func runSim(seed uint64, u Unsafe, total *simStats) error {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 0x7478_6e))
	st := &simStats{}
	defer func() { addStats(total, st) }()
	d := &simDev{rng: rng, blocks: uint64(HeaderBlocks + 16 + rng.IntN(48)), rep: [2]map[uint64][]byte{{}, {}},
		degraded: map[uint64]bool{}, store: map[int][]byte{}, crashAt: -1, stats: st}
	// The oracle's state: the value of every slot that recovery must show.
	model := map[int][]byte{}
	session := uint64(0)
	nextID := 0
	var c *simClient

	open := func() error {
		anyK := false // an earlier attempt's header may have landed
		for attempt := 0; ; attempt++ {
			if attempt > 50 {
				return fmt.Errorf("recovery did not finish in 50 attempts")
			}
			session++
			d.crashTakesReplica()
			d.crashed = false
			if rng.IntN(2) == 0 {
				d.crashAt = d.ops + 1 + rng.IntN(40) // a crash during recovery
			}
			l, err := Open(ctx, Config{Device: d, Fence: rldev.Fence{Name: "log", Token: lock.Token{Epoch: 1, Seq: session}},
				Applier: simApplier{d}, Manual: true, Unsafe: u})
			if trace {
				fmt.Printf("  open session %d: %v\n", session, err)
			}
			if errors.Is(err, errCrashed) {
				st.recoveryCrashes++
				anyK = true
				continue
			}
			if errors.Is(err, ErrUnavailable) {
				// It waits for the replica it cannot read: that comes back.
				st.waits++
				for r := 0; r < 2; r++ {
					if d.down[r] {
						d.resync(r)
					}
				}
				continue
			}
			if err != nil {
				return fmt.Errorf("session %d: open (down %v, stale %v, crashed %v): %w", session, d.down, d.stale, d.crashed, err)
			}
			st.recoveries++
			rep := l.Recovered()
			st.repaired += rep.Repaired
			st.undone += rep.Undone
			st.redone += rep.Redone
			if err := check(c, rep, model, d, anyK && len(rep.Committed) == 0); err != nil {
				var scans []string
				for _, r := range rep.Scanned {
					scans = append(scans, fmt.Sprintf("{%d records, end %d, next %d, %d blocks: %s}", len(r.Records), r.End, r.Next, r.Blocks, r.Why))
				}
				return fmt.Errorf("session %d (header %+v, replicas read %v, winner %d, scans %v): %w", session, rep.Header, rep.Replicas, rep.Winner, scans, err)
			}
			c = &simClient{log: l, cache: map[int]*cpage{}, d: d, locks: map[int]*simTxn{}, ends: map[*simTxn]LSN{}}
			l.cfg.Checkpointer = c
			return nil
		}
	}
	if err := open(); err != nil {
		return err
	}
	crash := func() error {
		if rng.IntN(5) == 0 && !d.crashed {
			// A zombie: the old owner lives on, a new one recovers the log,
			// then the old one tries to write.
			old := c
			st.zombies++
			hadBuf := old.log.Stats().End > old.log.Durable()
			if err := open(); err != nil {
				return err
			}
			err := old.log.FlushNow(ctx)
			if err == nil && hadBuf {
				return fmt.Errorf("a deposed owner's flush succeeded")
			}
			if err != nil && !errors.Is(err, ErrFenced) {
				return fmt.Errorf("a deposed owner's flush: %v (want ErrFenced)", err)
			}
			return nil
		}
		d.crashed = true
		return open()
	}
	steps := 150 + rng.IntN(250)
	for step := 0; step < steps; step++ {
		if d.crashAt < d.ops && rng.IntN(20) == 0 {
			d.crashAt = d.ops + 1 + rng.IntN(60)
		}
		var err error
		x := rng.IntN(100)
		if trace {
			for _, tx := range c.open {
				fmt.Printf("  open sim txn %x log txn %d writes %d first %v\n", tx.id, tx.t.ID(), len(tx.writes), c.log.mu.active[tx.t.ID()])
			}
			fmt.Printf("step %d x=%d ops=%d crashAt=%d down=%v stale=%v durable=%d head=%d commits=%d acked=%d\n", step, x, d.ops, d.crashAt, d.down, d.stale, c.log.Durable(), c.log.Stats().Head, len(c.commits), c.acked)
		}
		switch {
		case x < 12 && len(c.open) < 3:
			nextID++
			c.open = append(c.open, &simTxn{t: c.log.Begin(), id: nextID, writes: map[int][]byte{}})
			st.txns++
		case x < 45 && len(c.open) > 0:
			tx := c.open[rng.IntN(len(c.open))]
			slot := rng.IntN(simPages * simSlots)
			if h := c.locks[slot]; h != nil && h != tx {
				break
			}
			c.locks[slot] = tx
			val := make([]byte, simSlotSize)
			binary.LittleEndian.PutUint32(val, uint32(tx.id))
			binary.LittleEndian.PutUint32(val[4:], uint32(step))
			p, off := slot/simSlots, (slot%simSlots)*simSlotSize
			pg := c.page(p)
			target := binary.LittleEndian.AppendUint32(nil, uint32(p))
			var lsn LSN
			lsn, err = tx.t.Update(ctx, target, uint64(off), val, pg.data[off:off+simSlotSize])
			if err != nil {
				break
			}
			copy(pg.data[off:], val)
			pg.dirty = true
			pg.need = max(pg.need, lsn) // the LSN after the record
			tx.writes[slot] = val
			st.updates++
		case x < 62 && len(c.open) > 0:
			i := rng.IntN(len(c.open))
			tx := c.open[i]
			sync := rng.IntN(3) == 0
			var end LSN
			end, err = tx.t.Commit(ctx, sync)
			if end != 0 { // the commit record is in the log
				c.commits = append(c.commits, tx)
				c.ends[tx] = end
			}
			if err != nil {
				break
			}
			c.endTxn(i)
			st.commits++
			if sync {
				st.syncCommits++
			}
			c.ackDurable()
		case x < 67 && len(c.open) > 0:
			i := rng.IntN(len(c.open))
			tx := c.open[i]
			err = tx.t.Abort(ctx, func(r Record) error {
				p := int(binary.LittleEndian.Uint32(r.Target))
				pg := c.page(p)
				copy(pg.data[r.Off:], r.Undo)
				pg.dirty = true
				return nil
			})
			if err != nil {
				break
			}
			// the page's need stays: the compensation's LSN is later, but
			// the restored bytes were durable-or-undoable either way
			c.endTxn(i)
			st.aborts++
		case x < 77:
			err = c.log.FlushNow(ctx)
			st.flushes++
			c.ackDurable()
		case x < 85:
			err = c.writeBack(ctx, rng.IntN(simPages))
		case x < 90:
			err = c.log.Checkpoint(ctx)
			if trace {
				fmt.Printf("  checkpoint: %v, head %d, session %d, ops %d\n", err, c.log.Stats().Head, session, d.ops)
			}
			st.checkpoints++
			c.ackDurable()
			if err == nil {
				c.truncated(model)
			}
		case x < 94:
			r := rng.IntN(2)
			if d.down[r] {
				d.resync(r)
			} else if !d.down[1-r] && !d.stale[1-r] {
				d.down[r] = true
				st.downs++
			}
		case x < 97:
			err = crash()
			if err != nil {
				return err
			}
			continue
		}
		if errors.Is(err, ErrLogFull) {
			// abort the oldest open transaction to make room
			if len(c.open) > 0 {
				tx := c.open[0]
				if aerr := tx.t.Abort(ctx, func(r Record) error {
					p := int(binary.LittleEndian.Uint32(r.Target))
					pg := c.page(p)
					copy(pg.data[r.Off:], r.Undo)
					pg.dirty = true
					return nil
				}); aerr == nil {
					c.endTxn(0)
					st.aborts++
				} else if errors.Is(aerr, ErrLogFull) {
					// An abort always finds the room set aside for it
					// (padAllowance; outside reviews 67 and 68): this
					// accepted ErrLogFull and so missed that it did not.
					return fmt.Errorf("an abort found the log full: %w", aerr)
				} else {
					err = aerr
				}
			}
			if errors.Is(err, ErrLogFull) {
				c.ackDurable()
				if err = c.log.Checkpoint(ctx); err == nil {
					c.truncated(model)
				}
			}
		}
		if err != nil {
			if errors.Is(err, errCrashed) || errors.Is(c.log.Err(), errCrashed) {
				if err := open(); err != nil {
					return err
				}
				continue
			}
			return fmt.Errorf("step %d: %w", step, err)
		}
	}
	// The end: a crash, and a last check.
	d.crashed = true
	return open()
}

func (c *simClient) endTxn(i int) {
	tx := c.open[i]
	for s, h := range c.locks {
		if h == tx {
			delete(c.locks, s)
		}
	}
	c.open = append(c.open[:i], c.open[i+1:]...)
}

// check compares what recovery left in the store with the oracle: the
// commits of the last session that the log holds must be a prefix of its
// commit order no shorter than what was acknowledged, and the store must
// show exactly them over the model (the state the previous recovery left).
func check(c *simClient, rep Report, model map[int][]byte, d *simDev, anyK bool) error {
	var commits []*simTxn
	acked := 0
	if c != nil {
		// A checkpoint whose header landed as it crashed truncated these.
		for len(c.commits) > 0 && c.ends[c.commits[0]] <= rep.Header.Head {
			for s, v := range c.commits[0].writes {
				model[s] = v
			}
			c.commits = c.commits[1:]
			c.acked = max(c.acked-1, 0)
		}
		commits, acked = c.commits, c.acked
	}
	byLog := map[uint64]int{}
	for i, tx := range commits {
		byLog[tx.t.ID()] = i
	}
	k := len(rep.Committed)
	for i, id := range rep.Committed {
		j, ok := byLog[id]
		if !ok {
			return fmt.Errorf("recovery committed transaction %d, which never committed", id)
		}
		if j != i {
			var order []uint64
			for _, tx := range commits {
				order = append(order, tx.t.ID())
			}
			return fmt.Errorf("recovery committed %v: not a prefix of the commit order %v", rep.Committed, order)
		}
	}
	if anyK {
		// An earlier recovery finished its replay and crashed on its
		// header write, which landed: the log is empty, and the store
		// shows what that recovery found.
		var errs []error
		for k = acked; k <= len(commits); k++ {
			err := compare(commits[:k], model, d, k, len(commits), acked)
			if err == nil {
				break
			}
			errs = append(errs, err)
		}
		if k > len(commits) {
			return fmt.Errorf("no prefix of the commits matches the store: %w", errors.Join(errs...))
		}
	} else if k < acked {
		return fmt.Errorf("recovery found %d commits; %d were acknowledged durable", k, acked)
	}
	if err := compare(commits[:k], model, d, k, len(commits), acked); err != nil {
		return err
	}
	for _, tx := range commits[:k] {
		for s, v := range tx.writes {
			model[s] = v
		}
	}
	return nil
}

func compare(commits []*simTxn, base map[int][]byte, d *simDev, k, all, acked int) error {
	model := map[int][]byte{}
	for s, v := range base {
		model[s] = v
	}
	for _, tx := range commits {
		for s, v := range tx.writes {
			model[s] = v
		}
	}
	for p := 0; p < simPages; p++ {
		got := d.store[p]
		for s := 0; s < simSlots; s++ {
			want := model[p*simSlots+s]
			if want == nil {
				want = make([]byte, simSlotSize)
			}
			var have []byte
			if got == nil {
				have = make([]byte, simSlotSize)
			} else {
				have = got[s*simSlotSize : (s+1)*simSlotSize]
			}
			if !bytes.Equal(have, want) {
				return fmt.Errorf("page %d slot %d holds %x, want %x (%d of %d commits recovered, %d acknowledged)", p, s, have, want, k, all, acked)
			}
		}
	}
	return nil
}

func addStats(t, s *simStats) {
	t.txns += s.txns
	t.commits += s.commits
	t.syncCommits += s.syncCommits
	t.aborts += s.aborts
	t.updates += s.updates
	t.flushes += s.flushes
	t.checkpoints += s.checkpoints
	t.writeBacks += s.writeBacks
	t.crashes += s.crashes
	t.recoveries += s.recoveries
	t.recoveryCrashes += s.recoveryCrashes
	t.torn += s.torn
	t.late += s.late
	t.lateRefused += s.lateRefused
	t.staled += s.staled
	t.resyncs += s.resyncs
	t.zombies += s.zombies
	t.downs += s.downs
	t.repaired += s.repaired
	t.undone += s.undone
	t.redone += s.redone
	t.waits += s.waits
}
