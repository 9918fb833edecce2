package chunk

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"time"

	"github.com/grovestore/grove/internal/lock"
)

// chunkMap is a pair's map in memory: every allocated chunk and, for the
// primary, the free space of every data RLDev. Both managers of a pair
// keep one; only the primary changes it, by records it logs first, and the
// secondary applies the same records in LSN order.
//
// Invariant: no two chunks overlap; a chunk's blocks are not free in its
// RLDev's space; lsn is the last record applied; every id in chunks is
// below hw.
type chunkMap struct {
	cm     uint32
	chunks map[uint64]*entry
	// resv: the open reservations, by id (each holds its whole run of
	// space; ids ID+1..ID+Count are its, below hw, not in chunks until a
	// commit's RecAlloc records name them).
	resv   map[uint64]*openResv
	spaces map[uint64]*space // by RLDev id
	lsn    uint64
	hw     uint64
	// Space freed and not yet reusable (out of spaces): freed holds runs
	// freed by records applied here and not quarantined yet (the manager
	// quarantines them with its clock); quar the quarantined, in order of
	// release.
	freed []Run
	quar  []quarRun
	// retired: per owners' log, the token below which its owners are
	// retired (their allocations refused); owned counts the chunks that
	// have an owner (each a checkpoint entry more).
	retired map[uint64]lock.Token
	owned   int
	// byLog indexes the owned chunks by their owner's log (Owned lists
	// one log's without walking the map).
	byLog map[uint64]map[uint64]bool
}

// own and disown keep owned and byLog with the entries' owners.
func (m *chunkMap) own(id uint64, e *entry, o Owner) {
	e.owner = o
	m.owned++
	if m.byLog == nil {
		m.byLog = map[uint64]map[uint64]bool{}
	}
	if m.byLog[o.Log] == nil {
		m.byLog[o.Log] = map[uint64]bool{}
	}
	m.byLog[o.Log][id] = true
}

func (m *chunkMap) disown(id uint64, e *entry) {
	if e.owner.IsZero() {
		return
	}
	delete(m.byLog[e.owner.Log], id)
	if len(m.byLog[e.owner.Log]) == 0 {
		delete(m.byLog, e.owner.Log)
	}
	e.owner = Owner{}
	m.owned--
}

type quarRun struct {
	Run
	until time.Time
}

// openResv is an open reservation.
type openResv struct {
	Resv
	mat    map[uint64]bool // slots allocated by records of the frame that closes it
	until  time.Time       // the primary keeps all its chunks then (a clerk that went away)
	ending bool            // the primary queued its end
}

// resvOf returns the open reservation that holds id.
func (m *chunkMap) resvOf(id uint64) *openResv {
	for _, r := range m.resv {
		if r.Holds(id) {
			return r
		}
	}
	return nil
}

// resvIDOf is the id of the open reservation that holds id (0: none).
func (m *chunkMap) resvIDOf(id uint64) uint64 {
	if r := m.resvOf(id); r != nil {
		return r.ID
	}
	return 0
}

// reservedChunks is how many checkpoint entries the open reservations
// may take (each its chunks, and itself: 40 bytes).
func (m *chunkMap) reservedChunks() uint64 {
	n := uint64(0)
	for _, r := range m.resv {
		n += r.Count + 2
	}
	return n
}

// unallocatedRuns is the space of r's slots that no record allocated.
func (r *openResv) unallocatedRuns() []Run {
	var out []Run
	k := blocksFor(r.Size)
	for i := uint64(1); i <= r.Count; i++ {
		if r.mat[r.ID+i] {
			continue
		}
		b := r.Run.Block + (i-1)*k
		if n := len(out); n > 0 && out[n-1].Block+out[n-1].Blocks == b {
			out[n-1].Blocks += k
		} else {
			out = append(out, Run{RLDev: r.Run.RLDev, Block: b, Blocks: k})
		}
	}
	return out
}

// entry is one chunk.
type entry struct {
	Extent
	freeing bool  // a free is under way at the primary: no new I/O is admitted
	owner   Owner // who allocated it and has not linked it durably yet (Owner)
}

// retiredOwner reports whether o's allocations are refused: a Retire of
// its log named a newer token.
func (m *chunkMap) retiredOwner(o Owner) bool {
	t, ok := m.retired[o.Log]
	return ok && o.Token.Less(t)
}

// ownedBy lists, in order, the chunks (not being freed) whose owner is
// of log below token below, from id after on, at most limit of them, and
// whether there are more.
func (m *chunkMap) ownedBy(log uint64, below lock.Token, after uint64, limit int) ([]uint64, bool) {
	var ids []uint64
	for id := range m.byLog[log] {
		if e := m.chunks[id]; id > after && !e.freeing && e.owner.Token.Less(below) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	if len(ids) > limit {
		return ids[:limit], true
	}
	return ids, false
}

// DataFence is the block of every data RLDev a new primary writes with its
// map lock token (so that a zeroing of an earlier holder cannot land
// after it): never part of a chunk.
const DataFence = 0

func newChunkMap(cm uint32, data []DataRLDev) *chunkMap {
	m := &chunkMap{cm: cm, chunks: map[uint64]*entry{}, spaces: map[uint64]*space{}, resv: map[uint64]*openResv{}, hw: 1, retired: map[uint64]lock.Token{}}
	for _, d := range data {
		sp := newSpace(d.Blocks)
		if err := sp.take(DataFence, 1); err != nil {
			panic(err) // a fresh space is free
		}
		m.spaces[d.ID] = sp
	}
	return m
}

// load fills the map from a checkpoint.
func (m *chunkMap) load(c Checkpoint) error {
	if c.CM != m.cm {
		return fmt.Errorf("%w: the checkpoint is chunk manager %d's, not %d's", ErrCorrupt, c.CM, m.cm)
	}
	for id, e := range c.Chunks {
		if err := m.add(id, e); err != nil {
			return err
		}
	}
	for _, q := range c.Quarantined {
		if sp := m.spaces[q.RLDev]; sp == nil || q.Block+q.Blocks > sp.blocks {
			return fmt.Errorf("%w: quarantined run %+v not on the pair's RLDevs", ErrCorrupt, q)
		}
		// Free in the space until the log is replayed (a record after the
		// checkpoint may have reused it once its quarantine ended then):
		// quarantine takes what is still free.
		m.freed = append(m.freed, q)
	}
	for _, r := range c.Reservations {
		if err := m.openResv(r, false); err != nil {
			return err
		}
	}
	for id, o := range c.Owned {
		e := m.chunks[id]
		if e == nil || o.IsZero() {
			return fmt.Errorf("%w: owner %v of chunk %d, not in the checkpoint", ErrCorrupt, o, id)
		}
		m.own(id, e, o)
	}
	for l, t := range c.Retired {
		m.retired[l] = t
	}
	m.lsn, m.hw = c.Through, max(c.HighWater, 1)
	return nil
}

// openResv records reservation r; its space is taken here unless own (the
// primary took it when it built the record).
func (m *chunkMap) openResv(r Resv, own bool) error {
	if m.resv[r.ID] != nil || m.chunks[r.ID] != nil {
		return fmt.Errorf("%w: reservation %d opened twice", ErrCorrupt, r.ID)
	}
	sp := m.spaces[r.Run.RLDev]
	if sp == nil {
		return fmt.Errorf("%w: reservation %d on RLDev %d, which the pair does not have", ErrCorrupt, r.ID, r.Run.RLDev)
	}
	if !own {
		if err := sp.take(r.Run.Block, r.Run.Blocks); err != nil {
			return fmt.Errorf("reservation %d: %w", r.ID, err)
		}
	}
	m.resv[r.ID] = &openResv{Resv: r, mat: map[uint64]bool{}}
	return nil
}

// quarantine keeps the runs freed since the last call (released to the
// spaces) out of the allocator until until: what of them is free now (a
// run freed by a replayed record may have been reused by a later one).
//
// Each run kept is at most MaxChunk long, as a checkpoint's must be: a
// reservation's unused slots are freed as one run, up to 4·MaxChunk
// (MaxReserve), and a checkpoint holding it did not decode, so that no
// later load of the map could read it (outside review 70). The pieces of
// one freed run number at most its reservation's slots, for which the
// reservation held checkpoint entries (reservedChunks).
func (m *chunkMap) quarantine(until time.Time) {
	const most = MaxChunk / BlockSize
	for _, r := range m.freed {
		for _, x := range m.spaces[r.RLDev].takeFree(r.Block, r.Blocks) {
			for b, end := x.start, x.start+x.n; b < end; b += most {
				m.quar = append(m.quar, quarRun{Run{r.RLDev, b, min(most, end-b)}, until})
			}
		}
	}
	m.freed = nil
}

// expire returns quarantined runs whose time has come to the allocator.
func (m *chunkMap) expire(now time.Time) {
	i := 0
	for ; i < len(m.quar) && !now.Before(m.quar[i].until); i++ {
		q := m.quar[i]
		m.spaces[q.RLDev].release(q.Block, q.Blocks)
	}
	m.quar = m.quar[i:]
}

// quarantineEntries is the checkpoint entries kept for quarantined runs:
// one per RLDev of the pair, always, since a checkpoint can write any
// quarantine so (coarseRuns). Not the runs quarantined now: a reload
// quarantines again what the log's records freed, so that a map the
// primary filled while its own quarantine was empty could not be
// checkpointed by the next primary (outside review 72); and runs
// quarantined now in many pieces refused allocations though a
// checkpoint would fit.
func (m *chunkMap) quarantineEntries() int { return len(m.spaces) }

// quarantined is every run not reusable yet (for a checkpoint). The
// manager quarantines what it frees at once, so m.freed is empty then.
func (m *chunkMap) quarantined() []Run {
	var out []Run
	for _, q := range m.quar {
		out = append(out, q.Run)
	}
	return out
}

// add maps id to e, taking its space.
func (m *chunkMap) add(id uint64, e Extent) error {
	if m.chunks[id] != nil {
		return fmt.Errorf("%w: chunk %d allocated twice", ErrCorrupt, id)
	}
	sp := m.spaces[e.RLDev]
	if sp == nil {
		return fmt.Errorf("%w: chunk %d on RLDev %d, which the pair does not have", ErrCorrupt, id, e.RLDev)
	}
	if err := sp.take(e.Block, blocksFor(e.Len)); err != nil {
		return fmt.Errorf("chunk %d: %w", id, err)
	}
	m.chunks[id] = &entry{Extent: e}
	return nil
}

// apply applies record r with LSN lsn (the next one). own is set for the
// primary's own records: an allocation's (and a reservation's) space was
// taken when the change was built, and a free's (and a closed
// reservation's unallocated slots') is quarantined by the primary once the
// secondary has applied it too; otherwise (loading, the secondary) an
// allocation takes its space here, and a free's space is released and
// joins m.freed, quarantined once the records at hand are applied. An
// allocation of a reserved slot takes nothing: the reservation holds it.
func (m *chunkMap) apply(lsn uint64, r Record, own bool) error {
	if lsn != m.lsn+1 {
		return fmt.Errorf("%w: record %d applied after %d", ErrCorrupt, lsn, m.lsn)
	}
	switch r.Kind {
	case RecAlloc, RecAllocOwned:
		if r.ID >= m.hw {
			return fmt.Errorf("%w: chunk %d allocated at or above the high-water id %d", ErrCorrupt, r.ID, m.hw)
		}
		if rv := m.resvOf(r.ID); rv != nil {
			// A reserved slot: its space is the reservation's already.
			if r.Extent != rv.Slot(r.ID) || rv.mat[r.ID] || m.chunks[r.ID] != nil {
				return fmt.Errorf("%w: chunk %d of reservation %d allocated at %+v (its slot is %+v) or twice", ErrCorrupt, r.ID, rv.ID, r.Extent, rv.Slot(r.ID))
			}
			rv.mat[r.ID] = true
			m.chunks[r.ID] = &entry{Extent: r.Extent}
		} else if own {
			if m.chunks[r.ID] != nil {
				return fmt.Errorf("%w: chunk %d allocated twice", ErrCorrupt, r.ID)
			}
			m.chunks[r.ID] = &entry{Extent: r.Extent}
		} else if err := m.add(r.ID, r.Extent); err != nil {
			return err
		}
		if r.Kind == RecAllocOwned {
			m.own(r.ID, m.chunks[r.ID], r.Owner)
		}
	case RecDisown:
		e := m.chunks[r.ID]
		if e == nil || e.owner.IsZero() {
			return fmt.Errorf("%w: disown of chunk %d, not allocated or not owned", ErrCorrupt, r.ID)
		}
		m.disown(r.ID, e)
	case RecRetire:
		if t, ok := m.retired[r.Owner.Log]; ok && !t.Less(r.Owner.Token) {
			return fmt.Errorf("%w: log %d's owners retired below %v, then below %v", ErrCorrupt, r.Owner.Log, t, r.Owner.Token)
		}
		m.retired[r.Owner.Log] = r.Owner.Token
	case RecFree:
		e := m.chunks[r.ID]
		if e == nil {
			return fmt.Errorf("%w: free of chunk %d, not allocated", ErrCorrupt, r.ID)
		}
		m.disown(r.ID, e)
		delete(m.chunks, r.ID)
		if !own {
			m.spaces[e.RLDev].release(e.Block, blocksFor(e.Len))
			m.freed = append(m.freed, Run{e.RLDev, e.Block, blocksFor(e.Len)})
		}
	case RecResv:
		if r.Resv.ID+r.Resv.Count >= m.hw {
			return fmt.Errorf("%w: reservation %d of %d ids at or above the high-water id %d", ErrCorrupt, r.Resv.ID, r.Resv.Count, m.hw)
		}
		if err := m.openResv(r.Resv, own); err != nil {
			return err
		}
	case RecResvClose:
		rv := m.resv[r.ID]
		if rv == nil {
			return fmt.Errorf("%w: close of reservation %d, not open", ErrCorrupt, r.ID)
		}
		delete(m.resv, r.ID)
		if !own {
			for _, x := range rv.unallocatedRuns() {
				m.spaces[x.RLDev].release(x.Block, x.Blocks)
				m.freed = append(m.freed, x)
			}
		}
	case RecReserve:
		if r.HW < m.hw {
			return fmt.Errorf("%w: high-water id lowered from %d to %d", ErrCorrupt, m.hw, r.HW)
		}
		m.hw = r.HW
	default:
		return fmt.Errorf("%w: record of kind %d", ErrCorrupt, r.Kind)
	}
	m.lsn = lsn
	return nil
}

// checkpointIn is the map as a checkpoint of at most slot bytes if it
// can be: when its quarantined runs, as covering runs of at most
// MaxChunk, do not fit, as one run per RLDev (coarseRuns). A load
// quarantines anew what the log's records freed, however long ago their
// quarantine ended at the primary and however full it filled the map
// meanwhile: the takeover's checkpoint panicked, and so did every later
// takeover's (outside review 72). Allocations keep room for one run per
// RLDev (quarantineEntries). It returns the checkpoint and its encoding.
func (m *chunkMap) checkpointIn(slot uint64) (Checkpoint, []byte) {
	c := m.checkpoint()
	b := EncodeCheckpoint(c)
	if uint64(len(b)) > slot {
		c.Quarantined = coarseRuns(m.quarantined())
		b = EncodeCheckpoint(c)
	}
	return c, b
}

// checkpoint is the map as a checkpoint.
func (m *chunkMap) checkpoint() Checkpoint {
	c := Checkpoint{CM: m.cm, Through: m.lsn, HighWater: m.hw, Chunks: make(map[uint64]Extent, len(m.chunks)), Quarantined: coverRuns(m.quarantined())}
	for id, e := range m.chunks {
		c.Chunks[id] = e.Extent
		if !e.owner.IsZero() {
			if c.Owned == nil {
				c.Owned = map[uint64]Owner{}
			}
			c.Owned[id] = e.owner
		}
	}
	if len(m.retired) > 0 {
		c.Retired = maps.Clone(m.retired)
	}
	for _, r := range m.resv {
		if len(r.mat) > 0 {
			panic("chunk: a checkpoint in the middle of a reservation's close")
		}
		c.Reservations = append(c.Reservations, r.Resv)
	}
	sort.Slice(c.Reservations, func(i, j int) bool { return c.Reservations[i].ID < c.Reservations[j].ID })
	return c
}

// coverRuns merges runs into fewer runs that cover them (each at most
// MaxChunk long), for a checkpoint: a load quarantines only the blocks of
// a quarantined run that are free, so a run that also covers chunks or
// long-free blocks between two quarantined ones quarantines nothing
// wrongly (long-free blocks wait a quarantine more). Without it, a map
// with many small gaps (a reservation's unused slots, scattered frees)
// could, reloaded, hold more entries than a checkpoint slot.
func coverRuns(runs []Run) []Run {
	rs := append([]Run(nil), runs...)
	sort.Slice(rs, func(i, j int) bool {
		if rs[i].RLDev != rs[j].RLDev {
			return rs[i].RLDev < rs[j].RLDev
		}
		return rs[i].Block < rs[j].Block
	})
	var out []Run
	for _, r := range rs {
		if r.Blocks > MaxChunk/BlockSize {
			panic(fmt.Sprintf("chunk: a quarantined run of %d blocks (at most %d: quarantine splits them)", r.Blocks, MaxChunk/BlockSize))
		}
		if n := len(out); n > 0 {
			last := &out[n-1]
			if last.RLDev == r.RLDev && r.Block+r.Blocks-last.Block <= MaxChunk/BlockSize {
				last.Blocks = max(last.Blocks, r.Block+r.Blocks-last.Block)
				continue
			}
		}
		out = append(out, r)
	}
	return out
}

// coarseRuns covers runs with one run per RLDev, from the first
// quarantined block to the last: what a checkpoint holds when covering
// runs of at most MaxChunk would not fit its slot (a load quarantines
// only what of a run is free: free blocks between the runs wait a
// quarantine more, chunks among them are not touched).
func coarseRuns(runs []Run) []Run {
	span := map[uint64]*Run{}
	var ids []uint64
	for _, r := range runs {
		c := span[r.RLDev]
		if c == nil {
			c = &Run{RLDev: r.RLDev, Block: r.Block, Blocks: r.Blocks}
			span[r.RLDev] = c
			ids = append(ids, r.RLDev)
			continue
		}
		end := max(c.Block+c.Blocks, r.Block+r.Blocks)
		c.Block = min(c.Block, r.Block)
		c.Blocks = end - c.Block
	}
	slices.Sort(ids)
	out := make([]Run, 0, len(ids))
	for _, id := range ids {
		out = append(out, *span[id])
	}
	return out
}

// pick chooses where a chunk of n blocks goes: the best fit in the RLDev
// with the most free space that has a run large enough (spreading chunks
// over the pair's RLDevs), and takes it.
func (m *chunkMap) pick(n uint64, order []DataRLDev) (Extent, bool) {
	var best *DataRLDev
	for i := range order {
		sp := m.spaces[order[i].ID]
		if sp != nil && sp.largest() >= n && (best == nil || sp.free > m.spaces[best.ID].free) {
			best = &order[i]
		}
	}
	if best == nil {
		return Extent{}, false
	}
	b, _ := m.spaces[best.ID].alloc(n)
	return Extent{RLDev: best.ID, Block: b}, true
}

// freeBlocks sums the pair's free space (blocks), its largest run, the
// runs, and the blocks in quarantine.
func (m *chunkMap) freeBlocks() (free, largest uint64, runs int, quarantined uint64) {
	for _, sp := range m.spaces {
		free += sp.free
		largest = max(largest, sp.largest())
		runs += sp.runs()
	}
	for _, q := range m.quarantined() {
		quarantined += q.Blocks
	}
	return
}
