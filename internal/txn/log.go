package txn

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/grovestore/grove/internal/rldev"
)

// Checkpointer writes back, durably, every change that the records below
// upTo protect, so that the log may drop them: for the B-link tree, every
// dirty node whose FIRST change not yet written back (its recLSN, in
// ARIES's terms) is below upTo — a node whose last change is above upTo
// may hold an older, committed change the log is about to drop. The
// write-ahead rule is the checkpointer's to keep for everything it
// writes: a page goes to its chunk only once the log is durable up to the
// page's last change (Log.Flush with the LSN Update returned), and the
// write is fenced with Log.Fence.
type Checkpointer interface {
	WriteBack(ctx context.Context, upTo LSN) error
}

// Config opens a log.
type Config struct {
	Device Device
	// Fence is the log's lock and its owner's token: every write of the
	// log carries it, so that once another node recovers the log (with a
	// newer token) this owner cannot append to it.
	Fence rldev.Fence
	// Applier receives what recovery replays when the log is opened.
	Applier Applier
	// Checkpointer, if set, lets the log reclaim space: when more than
	// CheckpointAt of the ring is in use, a checkpoint writes back what
	// the oldest records protect and moves the head. Without one, appends
	// fail with ErrLogFull once the ring is full.
	Checkpointer Checkpointer
	// CheckpointAt is the fraction of the ring in use that starts a
	// checkpoint (default 0.5).
	CheckpointAt float64
	// LazyInterval bounds how long a lazy commit stays in memory only
	// (default 30 s, Boxwood §5).
	LazyInterval time.Duration
	// Manual: no background work; the caller flushes (Flush, FlushNow)
	// and checkpoints itself (the simulator, which must replay a seed).
	Manual bool
	// Flushes is how many group commits may be in flight at once
	// (default 2; a Manual log has one). A commit that arrives while a
	// flush is in flight need not wait for that flush's whole round trip
	// (the primary's write and sync, the forward, the secondary's write
	// and sync, the answer) before its own write starts: the device
	// overlaps the two. The durable end still moves in log order (see
	// completeLocked), so nothing is acknowledged out of order.
	Flushes int
	Log     *slog.Logger
	Unsafe  Unsafe
}

// Errors an append or commit returns.
var (
	// ErrLogFull: the ring has no room for the record and a checkpoint
	// could not make any (no checkpointer, or the oldest open transaction
	// holds the head). The transaction should abort: room for its abort
	// was set aside with each of its updates.
	ErrLogFull = errors.New("txn: the log is full")
	// ErrClosed: the log was closed.
	ErrClosed = errors.New("txn: the log is closed")
	// ErrTxnDone: the transaction already committed or aborted.
	ErrTxnDone = errors.New("txn: the transaction has ended")
)

// Log is an open log: its owner appends transactions' records and commits
// them, in groups. Safe for concurrent use.
//
// Durability contract: Commit(ctx, true) returns nil only once the
// commit record, and every record before it, is durable on both replicas
// of the RLDev (on the survivor alone in degraded mode); a lazy commit
// (Commit(ctx, false)) is durable within LazyInterval, or sooner when any
// later flush happens, and a crash before then loses it whole (never
// part of it: the transaction's commit record comes after its updates,
// and recovery undoes a transaction without one). Flush(ctx, lsn)
// returns once every record below lsn is durable: the write-ahead rule for
// a client writing back a page whose last change is at lsn.
type Log struct {
	cfg   Config
	ring  uint64
	log   *slog.Logger
	ctx   context.Context
	stop  context.CancelFunc
	wg    sync.WaitGroup
	kick  chan struct{}
	hdrMu sync.Mutex // one header write (checkpoint) at a time
	mu    struct {
		sync.Mutex
		hdr     Header
		head    LSN       // Invariant: head <= durable
		buf     []byte    // records not yet in a flush, from bufLSN
		starts  []int     // where records begin in buf
		bufLSN  LSN       // block-aligned; the last flush's end (in flight or durable)
		since   time.Time // when buf got its first record
		durable LSN       // block-aligned: every record below is durable
		// flights: the flushes in flight, in log order (each begins where
		// the one before it ends, the first at durable). At most
		// cfg.Flushes.
		flights []*flight
		waiters []waiter
		// active: every transaction with an update whose end (commit or
		// abort record) is not durable yet → its first record. The head
		// stays at or below all of them: until its end is durable, a
		// transaction may be rolled back by recovery, which needs its
		// undo images (even once committed lazily). An end record is
		// noted in ending in the same critical section as its append, so
		// the flush that makes it durable drops the transaction.
		active   map[uint64]LSN
		ending   map[uint64]LSN // of those, the ones ended → the end record's LSN
		nextTxn  uint64
		reserved int   // log bytes set aside for aborts (Txn.Update)
		err      error // sticky: the log failed
		closed   bool
		// closeDone is closed when the first Close has ended, with its
		// result in closeErr: a later Close returns that, not nil (it
		// told a caller "flushed" while the first was still flushing,
		// or after it failed: outside review 73).
		closeDone chan struct{}
		closeErr  error
		keepLock  bool // KeepLock: Close keeps the log's lock
		// stopped: Close has stopped the flusher and failed its waiters;
		// a later Flush fails at once (nobody would serve its waiter).
		stopped bool
		ckpt    bool // a checkpoint is running
		// ckptAgain: one was asked for while it ran (checkpointDoneLocked)
		ckptAgain bool
		// The background checkpoints by number, from 1 in the order they
		// started (ckptStarts: the newest), and the newest that failed
		// (ckptFailed, its error ckptErr): an appender waiting for room
		// hears when the checkpoint that was to make it fails, rather
		// than sleeping until its context ends (waitRoomLocked). After a
		// failure the next starts no sooner than ckptRetryAt (ckptBackoff,
		// 50 ms doubling to 1 s, again from nothing after a success;
		// ckptTimer starts one asked for meanwhile), so that appenders
		// that retry at once cannot run checkpoints back to back.
		ckptStarts, ckptFailed uint64
		ckptErr                error
		ckptBackoff            time.Duration
		ckptRetryAt            time.Time
		ckptTimer              *time.Timer
		space                  *sync.Cond
		stats                  Stats
	}
	recovered Report
	release   func() // the log's lock (OpenNamed), released by Close
}

type waiter struct {
	lsn LSN
	ch  chan error
}

// flight is one flush in flight: blocks [seq, end) of the log.
type flight struct {
	seq     uint64
	blocks  [][]byte
	end     LSN
	records int
	done    bool // its write returned; it waits for the flights before it
}

// pipelineBelow: a flush starts while others are in flight only if those
// carry fewer records than this. Under light load (a few committers, one
// or two records a flush) a commit then need not wait out the round trip
// of the flush before it; under heavy load the device, not the round
// trip, bounds the rate of flushes (about 2 000 a second here, two
// fdatasyncs each on one disk), and a flush started early would only
// split a group in two. Measured with grove bench log, 2026-11-30:
// 2 committers 1 672 → 2 287 commits/s with two flights always allowed,
// but 64 committers 64 191 → 37 010 (18 records a flush instead of 32).
const pipelineBelow = 4

// Stats count a log's work.
type Stats struct {
	Appends, Commits, LazyCommits, Aborts uint64
	Flushes, FlushBlocks                  uint64 // flushes that became durable, and their blocks
	Checkpoints                           uint64
	Head, Durable, End                    LSN
	RingBlocks, UsedBlocks                uint64
}

// Open recovers the log on cfg.Device (any node may: the log is on an
// RLDev) and returns it ready for appends after the recovered end.
func Open(ctx context.Context, cfg Config) (*Log, error) {
	if cfg.Device == nil || cfg.Applier == nil {
		return nil, errors.New("txn: a log needs a device and an applier")
	}
	if cfg.Fence.Name == "" || cfg.Fence.Token.IsZero() {
		return nil, errors.New("txn: a log needs its lock's name and token")
	}
	if cfg.CheckpointAt == 0 {
		cfg.CheckpointAt = 0.5
	}
	if cfg.CheckpointAt < 0.05 || cfg.CheckpointAt > 0.95 {
		return nil, fmt.Errorf("txn: CheckpointAt %v (0.05 to 0.95)", cfg.CheckpointAt)
	}
	if cfg.LazyInterval == 0 {
		cfg.LazyInterval = 30 * time.Second
	}
	if cfg.Flushes == 0 {
		cfg.Flushes = 2
	}
	if cfg.Flushes < 1 || cfg.Flushes > 16 {
		return nil, fmt.Errorf("txn: Flushes %d (1 to 16)", cfg.Flushes)
	}
	if cfg.Manual {
		cfg.Flushes = 1 // FlushNow's return is then its flush's end
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	rep, err := Recover(ctx, cfg.Device, cfg.Fence, cfg.Applier, cfg.Unsafe)
	if err != nil {
		return nil, err
	}
	l := &Log{cfg: cfg, ring: rep.NewHeader.Ring, log: cfg.Log, kick: make(chan struct{}, 1), recovered: rep}
	l.mu.hdr = rep.NewHeader
	l.mu.head, l.mu.durable, l.mu.bufLSN = rep.Next, rep.Next, rep.Next
	l.mu.active = map[uint64]LSN{}
	l.mu.ending = map[uint64]LSN{}
	l.mu.space = sync.NewCond(&l.mu.Mutex)
	l.ctx, l.stop = context.WithCancel(context.Background())
	if !cfg.Manual {
		for range cfg.Flushes {
			l.wg.Add(1)
			go l.flusher()
		}
	}
	return l, nil
}

// Fence is the owner's lock and token: the fence for its own writes of
// what the log protects (a page written back), so that once another node
// recovers the log they are refused too.
func (l *Log) Fence() *rldev.Fence {
	f := l.cfg.Fence
	return &f
}

// Recovered is what opening the log recovered.
func (l *Log) Recovered() Report { return l.recovered }

// Txn is one transaction. Its records are the log's; its isolation is the
// caller's (locks taken in a fixed order, see LockOrder). Not safe for
// concurrent use by several goroutines.
type Txn struct {
	l        *Log
	id       uint64
	updates  []Record // for a live abort
	done     bool
	reserved int // log bytes set aside for this transaction's abort, and extra
	extra    int // of reserved: what Reserve set aside for UpdateReserved
}

// Begin starts a transaction (nothing is logged until its first update).
func (l *Log) Begin() *Txn {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.mu.nextTxn++
	return &Txn{l: l, id: l.mu.nextTxn}
}

// ID is the transaction's id in the log.
func (t *Txn) ID() uint64 { return t.id }

// Update logs that bytes [off, off+len(redo)) of target change from undo
// to redo; the caller changes them itself (in its cache: no-force). It
// returns the LSN after the record: the write-ahead rule for the page is
// Flush(ctx, that LSN) before the page is written back. Log space for
// the transaction's abort (a compensation per update, an abort record) is
// set aside with each update, so that an abort never finds the log full.
func (t *Txn) Update(ctx context.Context, target []byte, off uint64, redo, undo []byte) (LSN, error) {
	if t.done {
		return 0, ErrTxnDone
	}
	r := Record{Kind: KindUpdate, Txn: t.id, Target: slices.Clone(target), Off: off, Redo: slices.Clone(redo), Undo: slices.Clone(undo)}
	grow := 0
	if !r.RedoOnly() { // (a redo-only update has no compensation)
		c := Record{Kind: KindCompensation, Txn: t.id, Target: r.Target, Off: off, Redo: r.Undo}
		grow = c.Size() + padAllowance // and the padding of a flush that may end right after it
	}
	if t.reserved == 0 {
		grow += abortReserve
	}
	lsn, err := t.l.append(ctx, &r, t.id, grow, false)
	if err != nil {
		return 0, err
	}
	t.reserved += grow
	r.LSN = lsn
	t.updates = append(t.updates, r)
	return lsn + LSN(r.Size()), nil
}

// RedoOnlySize is what Reserve must set aside for one UpdateReserved of
// redo to target: the record's log bytes, and the padding of a flush that
// may end right after it (padAllowance).
func RedoOnlySize(target, redo []byte) int {
	return (&Record{Kind: KindUpdate, Target: target, Redo: redo}).Size() + padAllowance
}

// The room set aside for a record appended without waiting (a
// compensation, an UpdateReserved record) includes a Payload besides the
// record's bytes: every flush that ends in a partial block pads it, and
// the next flush starts a new block, so the padding takes ring room that
// no reservation counted. An update admitted by waiting for room leaves
// the free bytes F at least the reserved bytes R; a flush after it may
// take up to a Payload of F. A record appended from its reservation
// gives back its Payload with its bytes, so a flush after it finds F
// again no less than R less one Payload, and so does an end record (the
// transaction's abortReserve holds one). So each record appended from a
// reservation finds room, however many flushes fall between them. With
// the record's bytes alone (before outside review 67), an abort whose
// compensations each fell into a flush of their own ran out of the room
// set aside for it (TestReview67CompensationAfterTwoFlushes), and with
// the transaction's own records pinning the head it waited for ever
// (TestReview67AbortWaitsWithHeadPinned); UpdateReserved records did
// likewise (TestReview67UpdateReservedFlushes).
const padAllowance = Payload

// Reserve sets aside n more bytes of log space for this transaction,
// waiting for room as an update does (not past ctx), for redo-only
// updates it may have to log later where it must not wait
// (UpdateReserved: a caller that holds a latch a checkpoint needs).
// Commit and Abort give back what is left.
func (t *Txn) Reserve(ctx context.Context, n int) error {
	if t.done {
		return ErrTxnDone
	}
	if n <= 0 {
		return nil
	}
	if uint64(n) > t.l.ring*Payload/4 {
		// (as append refuses a record larger than a quarter of the ring:
		// room that may never come is not waited for)
		return fmt.Errorf("txn: a reserve of %d bytes in a log of %d blocks (at most a quarter of it)", n, t.l.ring)
	}
	grow := n
	if t.reserved == 0 {
		grow += abortReserve
	}
	if err := t.l.reserve(ctx, grow); err != nil {
		return err
	}
	t.reserved += grow
	t.extra += n
	return nil
}

// UpdateReserved logs a redo-only update in room Reserve set aside: it
// never waits for log space (ErrLogFull if the room is not there after
// all). It returns what Update returns.
func (t *Txn) UpdateReserved(target []byte, off uint64, redo []byte) (LSN, error) {
	if t.done {
		return 0, ErrTxnDone
	}
	r := Record{Kind: KindUpdate, Txn: t.id, Target: slices.Clone(target), Off: off, Redo: slices.Clone(redo)}
	if !r.RedoOnly() {
		return 0, errors.New("txn: UpdateReserved logs redo-only updates")
	}
	size := r.Size()
	take := size + padAllowance // as RedoOnlySize set it aside
	if take > t.extra {
		return 0, fmt.Errorf("txn: an update of %d bytes (%d with its flush's padding) from a reserve of %d", size, take, t.extra)
	}
	done, cancel := context.WithCancel(context.Background())
	cancel() // append returns ErrLogFull instead of waiting
	lsn, err := t.l.append(done, &r, t.id, -take, false)
	if err != nil {
		return 0, err
	}
	t.reserved -= take
	t.extra -= take
	r.LSN = lsn
	t.updates = append(t.updates, r)
	return lsn + LSN(size), nil
}

// abortReserve is what a transaction sets aside for its abort record and
// for the padding of the flushes its compensations may fall into.
var abortReserve = (&Record{Kind: KindAbort}).Size() + Payload

// Commit ends the transaction: its updates are to survive. With sync it
// returns once the commit is durable (group commit: every commit waiting
// meanwhile shares one write); without, the commit is durable within the
// lazy interval. It returns the LSN after the commit record.
func (t *Txn) Commit(ctx context.Context, sync bool) (LSN, error) {
	if t.done {
		return 0, ErrTxnDone
	}
	r := Record{Kind: KindCommit, Txn: t.id}
	lsn, err := t.l.append(ctx, &r, t.id, -t.reserved, true)
	if err != nil {
		return 0, err
	}
	t.done, t.reserved, t.extra = true, 0, 0
	end := lsn + LSN(r.Size())
	t.l.ended(sync)
	if sync {
		return end, t.l.Flush(ctx, end)
	}
	return end, nil
}

// Abort rolls the transaction back live: for each update, latest first,
// undo (the caller's) restores the before-image in the caller's cache and
// a compensation record logs that; then an abort record ends it. It is not
// flushed (a crash before it is durable leaves a transaction recovery
// rolls back the same way).
func (t *Txn) Abort(ctx context.Context, undo func(Record) error) error {
	if t.done {
		return ErrTxnDone
	}
	if t.reserved == 0 {
		// Nothing of it is in the log (its first Update failed, or it
		// made none): nothing to roll back or to end there. Its abort
		// record, appended with nothing set aside, waited for room as an
		// update does, and failed when a checkpoint failed, or waited for
		// ever with the head pinned: the B-tree aborts so when an
		// Update fails, and takes a failed abort for a broken log
		// (outside review 67, TestReview67EmptyAbortNeedsRoom).
		t.done, t.updates = true, nil
		t.l.mu.Lock()
		t.l.mu.stats.Aborts++
		t.l.mu.Unlock()
		return nil
	}
	for i := len(t.updates) - 1; i >= 0; i-- {
		u := t.updates[i]
		if u.RedoOnly() {
			t.updates = t.updates[:i] // nothing reached its target: nothing to undo
			continue
		}
		if undo != nil {
			if err := undo(u); err != nil {
				return fmt.Errorf("txn: undo of the record at %d: %w", u.LSN, err)
			}
		}
		c := Record{Kind: KindCompensation, Txn: t.id, Target: u.Target, Off: u.Off, Redo: u.Undo}
		take := c.Size() + padAllowance // as Update set it aside
		if _, err := t.l.append(ctx, &c, t.id, -take, false); err != nil {
			return err
		}
		t.reserved -= take
		t.updates = t.updates[:i] // undone and logged: a retried Abort goes on from here
	}
	r := Record{Kind: KindAbort, Txn: t.id}
	if _, err := t.l.append(ctx, &r, t.id, -t.reserved, true); err != nil {
		return err
	}
	t.done, t.reserved, t.extra = true, 0, 0
	t.l.mu.Lock()
	t.l.mu.stats.Aborts++
	t.l.mu.Unlock()
	return nil
}

func (l *Log) ended(sync bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.mu.stats.Commits++
	if !sync {
		l.mu.stats.LazyCommits++
	}
}

// usedLocked is the ring blocks in use if extra more stream bytes were
// buffered.
func (l *Log) usedLocked(extra int) uint64 {
	headSeq, _ := SeqOf(l.mu.head)
	bufSeq, _ := SeqOf(l.mu.bufLSN)
	n := len(l.mu.buf) + extra
	return bufSeq + uint64((n+Payload-1)/Payload) - headSeq
}

// append buffers r for transaction id and returns its LSN. grow changes
// the log space set aside for aborts (positive: an update sets some
// aside, and must find room for it too; negative: a compensation, an
// abort or a commit uses or returns it). end: r ends the transaction; it
// is noted in the same critical section as the append, so that a flush
// that makes r durable also lets the head pass the transaction.
func (l *Log) append(ctx context.Context, r *Record, id uint64, grow int, end bool) (LSN, error) {
	if err := r.Check(); err != nil {
		return 0, err
	}
	size := r.Size()
	if uint64(size) > l.ring*Payload/4 {
		return 0, fmt.Errorf("txn: a record of %d bytes in a log of %d blocks (at most a quarter of it)", size, l.ring)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	// Room for r and what stays set aside after it: an update needs room
	// for its future compensation too; a compensation or an end record
	// only uses what was set aside for it.
	if err := l.waitRoomLocked(ctx, func() bool {
		return l.usedLocked(size+max(l.mu.reserved+grow, 0)) <= l.ring || grow < 0 && l.usedLocked(size) <= l.ring
	}); err != nil {
		return 0, err
	}
	lsn := l.mu.bufLSN + LSN(len(l.mu.buf))
	if len(l.mu.buf) == 0 {
		l.mu.since = time.Now()
	}
	l.mu.starts = append(l.mu.starts, len(l.mu.buf))
	l.mu.buf = AppendRecord(l.mu.buf, r)
	l.mu.reserved = max(l.mu.reserved+grow, 0)
	if _, ok := l.mu.active[id]; !ok && r.Kind == KindUpdate {
		l.mu.active[id] = lsn
	}
	if _, ok := l.mu.active[id]; ok && end {
		l.mu.ending[id] = lsn
	}
	l.mu.stats.Appends++
	return lsn, nil
}

// reserve sets aside grow more bytes of log space (Txn.Reserve), waiting
// for room as append does.
func (l *Log) reserve(ctx context.Context, grow int) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.waitRoomLocked(ctx, func() bool { return l.usedLocked(l.mu.reserved+grow) <= l.ring }); err != nil {
		return err
	}
	l.mu.reserved += grow
	return nil
}

// waitRoomLocked returns once fits (l.mu held), waiting for room (a
// checkpoint, or an end of transaction that lets one move the head), but
// not past ctx: ErrLogFull then, or at once for a log that does not
// checkpoint itself.
func (l *Log) waitRoomLocked(ctx context.Context, fits func() bool) error {
	var need uint64 // the checkpoint that is to make room (below)
	for {
		if err := l.usableLocked(); err != nil {
			return err
		}
		if fits() {
			return nil
		}
		if l.cfg.Manual || l.cfg.Checkpointer == nil {
			return ErrLogFull
		}
		// The checkpoint that is to make room is the next to start when
		// the appender first finds none: now, once the backoff after a
		// failure ends, or after the one running. Fixed for the call: a
		// wake (another appender giving up, a flush landing) while the
		// next one runs must not move it on to the one after, or a slow
		// failure would never be heard (outside review 63).
		if need == 0 {
			need = l.mu.ckptStarts + 1
		}
		if l.mu.ckpt {
			// One runs: its target may predate what this appender
			// needs (a transaction that ended since), and the appender
			// sleeps until space is broadcast, which a checkpoint that
			// moves the head no further never does. One more runs after
			// it. (Only for an appender waiting: the threshold trigger
			// of completeLocked asking so would chain checkpoints, each
			// forcing a flush, while a long transaction pins the head:
			// outside review 61.)
			l.mu.ckptAgain = true
		} else {
			l.checkpointSoonLocked()
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%w: %w", ErrLogFull, ctx.Err())
		}
		stop := context.AfterFunc(ctx, func() {
			l.mu.Lock()
			l.mu.space.Broadcast()
			l.mu.Unlock()
		})
		l.mu.space.Wait()
		stop()
		if l.mu.ckptFailed >= need && l.usableLocked() == nil && ctx.Err() == nil && !fits() {
			// That checkpoint (or a later one) failed: the appender hears
			// why now, not when its context ends. (One that was running
			// before it needed room does not count: outside review 62.)
			return fmt.Errorf("%w: the checkpoint that would make room failed: %w", ErrLogFull, l.mu.ckptErr)
		}
	}
}

func (l *Log) usableLocked() error {
	switch {
	case l.mu.err != nil:
		return l.mu.err
	case l.mu.closed:
		return ErrClosed
	}
	return nil
}

// Flush returns once every record below lsn is durable.
func (l *Log) Flush(ctx context.Context, lsn LSN) error {
	if l.cfg.Manual {
		for {
			l.mu.Lock()
			d, err := l.mu.durable, l.mu.err
			l.mu.Unlock()
			if d >= lsn {
				return nil
			}
			if err != nil {
				return err
			}
			if err := l.FlushNow(ctx); err != nil {
				return err
			}
			l.mu.Lock()
			stuck := l.mu.durable < lsn && len(l.mu.buf) == 0 && len(l.mu.flights) == 0
			l.mu.Unlock()
			if stuck {
				return fmt.Errorf("txn: flush to %d: nothing is buffered that far", lsn)
			}
		}
	}
	l.mu.Lock()
	if l.mu.durable >= lsn {
		l.mu.Unlock()
		return nil
	}
	if err := l.mu.err; err != nil {
		l.mu.Unlock()
		return err
	}
	if l.mu.stopped {
		l.mu.Unlock()
		return ErrClosed
	}
	w := waiter{lsn: lsn, ch: make(chan error, 1)}
	l.mu.waiters = append(l.mu.waiters, w)
	l.mu.Unlock()
	l.poke()
	select {
	case err := <-w.ch:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (l *Log) poke() {
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// Durable is the LSN below which every record is durable.
func (l *Log) Durable() LSN {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.mu.durable
}

// Err is why the log failed (nil while it works).
func (l *Log) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.mu.err
}

// flusher is the group commit: it writes everything buffered whenever a
// commit waits for durability (and again at once if more came meanwhile),
// and at the latest LazyInterval after a record was buffered. cfg.Flushes
// flushers run, each writing its flight itself (a hand-off to a goroutine
// per flight cost one committer 5 % of its commits a second).
func (l *Log) flusher() {
	defer l.wg.Done()
	tick := time.NewTicker(max(l.cfg.LazyInterval/8, time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-l.ctx.Done():
			return
		case <-l.kick:
		case <-tick.C:
		}
		for {
			l.mu.Lock()
			// A flush that ends pokes a flusher: no spinning meanwhile.
			var f *flight
			if len(l.mu.buf) > 0 && (len(l.mu.waiters) > 0 || time.Since(l.mu.since) >= l.cfg.LazyInterval) {
				f = l.startFlushLocked()
			}
			l.mu.Unlock()
			if f == nil {
				break
			}
			l.poke() // another flusher may start the next flight meanwhile
			if err := l.runFlush(l.ctx, f); err != nil {
				break
			}
		}
	}
}

// FlushNow writes what is buffered as one flush and returns once that
// write has returned: the group commit's one write. It writes nothing and
// returns nil at once if a flight may not start now (see
// startFlushLocked). Its records are durable only once every flight
// before it has landed too: Flush and Durable say when.
func (l *Log) FlushNow(ctx context.Context) error {
	l.mu.Lock()
	if err := l.usableLocked(); err != nil && !(errors.Is(err, ErrClosed) && len(l.mu.buf) > 0) {
		l.mu.Unlock()
		return err
	}
	f := l.startFlushLocked()
	l.mu.Unlock()
	if f == nil {
		return nil
	}
	return l.runFlush(ctx, f)
}

// startFlushLocked takes what is buffered as the next flight, or returns
// nil: nothing buffered, the log failed, cfg.Flushes in flight already, or
// the flights in flight carry pipelineBelow records or more.
func (l *Log) startFlushLocked() *flight {
	if len(l.mu.flights) >= l.cfg.Flushes || len(l.mu.buf) == 0 || l.mu.err != nil {
		return nil
	}
	carried := 0
	for _, g := range l.mu.flights {
		carried += g.records
	}
	if carried >= pipelineBelow {
		return nil // the device is busy with big groups: let this one grow
	}
	seq, off := SeqOf(l.mu.bufLSN)
	if off != 0 {
		panic("txn: a flush that does not start a block")
	}
	blocks := BuildFlush(seq, l.cfg.Fence.Token, l.mu.buf, l.mu.starts)
	f := &flight{seq: seq, blocks: blocks, end: LSNOf(seq+uint64(len(blocks)), 0), records: len(l.mu.starts)}
	l.mu.buf, l.mu.starts, l.mu.bufLSN = nil, nil, f.end
	l.mu.flights = append(l.mu.flights, f)
	if l.cfg.Unsafe.AckBeforeWrite {
		l.durableLocked(f.end)
	}
	return f
}

// runFlush writes flight f and completes it.
func (l *Log) runFlush(ctx context.Context, f *flight) error {
	err := l.writeRing(ctx, f.seq, f.blocks)
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.completeLocked(f, err)
}

// completeLocked records the end of f's write. The durable end moves only
// over a prefix of flights whose writes all returned nil: a later flush
// that lands first acknowledges nothing until every flush before it has
// landed too, so a commit is never acknowledged while a record before it
// may still be lost (recovery's scan stops at the first block missing).
// Any failed write fails the log: it cannot know what of the flight
// landed, so it stops, and the next owner's recovery decides (every
// commit in it unacknowledged, those of later flights too).
func (l *Log) completeLocked(f *flight, err error) error {
	if len(l.mu.buf) > 0 && !l.cfg.Manual {
		l.poke() // what came meanwhile: the flusher's turn
	}
	if err != nil {
		l.failLocked(fmt.Errorf("txn: log flush of %d blocks at %d failed: %w", len(f.blocks), f.seq, fenced(err)))
	}
	f.done = true
	n := 0
	for n < len(l.mu.flights) && l.mu.flights[n].done {
		n++
	}
	landed := l.mu.flights[:n:n]
	l.mu.flights = l.mu.flights[n:]
	if l.mu.err != nil {
		return l.mu.err
	}
	for _, g := range landed {
		l.mu.stats.Flushes++
		l.mu.stats.FlushBlocks += uint64(len(g.blocks))
		l.durableLocked(g.end)
	}
	if len(landed) > 0 && !l.cfg.Manual && l.cfg.Checkpointer != nil && float64(l.usedLocked(0)) > l.cfg.CheckpointAt*float64(l.ring) {
		l.checkpointSoonLocked()
	}
	return nil
}

func (l *Log) durableLocked(end LSN) {
	if end <= l.mu.durable {
		return
	}
	l.mu.durable = end
	for id, e := range l.mu.ending {
		if e < end {
			delete(l.mu.ending, id)
			delete(l.mu.active, id)
		}
	}
	kept := l.mu.waiters[:0]
	for _, w := range l.mu.waiters {
		if w.lsn <= end {
			w.ch <- nil
		} else {
			kept = append(kept, w)
		}
	}
	l.mu.waiters = kept
	l.mu.space.Broadcast()
}

func (l *Log) failLocked(err error) {
	if l.mu.err == nil {
		l.mu.err = err
		l.log.Error("log failed", "err", err)
	}
	for _, w := range l.mu.waiters {
		w.ch <- l.mu.err
	}
	l.mu.waiters = nil
	l.mu.space.Broadcast()
}

// writeRing writes consecutive log blocks from sequence number seq, in as
// few device writes as the ring's wrap and MaxIO allow (one, usually).
func (l *Log) writeRing(ctx context.Context, seq uint64, blocks [][]byte) error {
	for len(blocks) > 0 {
		at := RingBlock(seq, l.ring)
		n := min(uint64(len(blocks)), HeaderBlocks+l.ring-at, rldev.MaxIO/BlockSize)
		data := make([]byte, 0, n*BlockSize)
		for _, b := range blocks[:n] {
			data = append(data, b...)
		}
		if err := l.cfg.Device.Write(ctx, at, data, &l.cfg.Fence); err != nil {
			return err
		}
		seq, blocks = seq+n, blocks[n:]
	}
	return nil
}

func (l *Log) checkpointSoonLocked() {
	if l.mu.ckpt || l.mu.closed || l.cfg.Manual || l.cfg.Checkpointer == nil {
		return // (none once Close began: its flushes' landings ask, review 63)
	}
	if wait := time.Until(l.mu.ckptRetryAt); wait > 0 {
		// The last one failed: this one starts when its backoff ends.
		if l.mu.ckptTimer == nil {
			l.mu.ckptTimer = time.AfterFunc(wait, func() {
				l.mu.Lock()
				defer l.mu.Unlock()
				l.mu.ckptTimer = nil
				if l.ctx.Err() == nil && l.usableLocked() == nil {
					l.checkpointSoonLocked()
				}
			})
		}
		return
	}
	l.mu.ckpt = true
	l.mu.ckptStarts++
	n := l.mu.ckptStarts
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		err := l.Checkpoint(l.ctx)
		if err != nil && l.ctx.Err() == nil {
			l.log.Warn("log checkpoint failed", "err", err)
		}
		l.mu.Lock()
		if err != nil { // (a success ended the backoff in Checkpoint)
			l.mu.ckptFailed, l.mu.ckptErr = n, err
			l.mu.ckptBackoff = min(max(2*l.mu.ckptBackoff, ckptBackoffMin), ckptBackoffMax)
			l.mu.ckptRetryAt = time.Now().Add(l.mu.ckptBackoff)
			l.mu.space.Broadcast()
		}
		l.checkpointDoneLocked()
		l.mu.Unlock()
	}()
}

// The backoff of background checkpoints after a failure (Log.mu.ckptBackoff).
const (
	ckptBackoffMin = 50 * time.Millisecond
	ckptBackoffMax = time.Second
)

// checkpointDoneLocked ends a background checkpoint, and starts the next
// if one was asked for meanwhile (outside review 57: otherwise an appender
// that asked for room while a checkpoint ran could wait until its context
// ended, though a checkpoint then would have made room).
func (l *Log) checkpointDoneLocked() {
	l.mu.ckpt = false
	if l.mu.ckptAgain {
		l.mu.ckptAgain = false
		if l.ctx.Err() == nil && l.usableLocked() == nil {
			l.checkpointSoonLocked()
		}
	}
}

// Checkpoint reclaims log space: it flushes what is buffered, then the head
// moves to the oldest record still needed (the first record of the oldest
// transaction whose end is not durable, or the durable end), once the checkpointer has written back what the records below it
// protect. The new header is the commit point: a crash before it leaves
// the old head, and recovery replays the same records over the pages
// written back (idempotent).
func (l *Log) Checkpoint(ctx context.Context) error {
	if l.cfg.Checkpointer == nil {
		return errors.New("txn: the log has no checkpointer")
	}
	l.hdrMu.Lock()
	defer l.hdrMu.Unlock()
	// Lazy commits become durable first, so that the head can pass them
	// (Flush, not FlushNow: with flights in flight FlushNow may write
	// nothing, or its flight may land before an earlier one).
	l.mu.Lock()
	end := l.mu.bufLSN + LSN(len(l.mu.buf))
	l.mu.Unlock()
	if err := l.Flush(ctx, end); err != nil {
		return err
	}
	l.mu.Lock()
	if err := l.usableLocked(); err != nil {
		l.mu.Unlock()
		return err
	}
	target := l.mu.durable
	for _, first := range l.mu.active {
		target = min(target, first)
	}
	head, hdr := l.mu.head, l.mu.hdr
	l.mu.Unlock()
	if target <= head {
		return nil
	}
	if err := l.cfg.Checkpointer.WriteBack(ctx, target); err != nil {
		return fmt.Errorf("txn: checkpoint write-back below %d: %w", target, err)
	}
	nh := Header{Gen: hdr.Gen + 1, Floor: l.cfg.Fence.Token, Head: target, Ring: l.ring, Writer: l.cfg.Fence.Token}
	if err := writeFenced(ctx, l.cfg.Device, nh.Gen%2, EncodeHeader(nh), &l.cfg.Fence); err != nil {
		l.mu.Lock()
		l.failLocked(err)
		l.mu.Unlock()
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.mu.hdr, l.mu.head = nh, target
	l.mu.stats.Checkpoints++
	// The write-back works again (a direct call's too): background
	// checkpoints start without a backoff.
	l.mu.ckptBackoff, l.mu.ckptRetryAt = 0, time.Time{}
	l.mu.space.Broadcast()
	return nil
}

// Stats returns the log's counters.
func (l *Log) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.mu.stats
	s.Head, s.Durable, s.End = l.mu.head, l.mu.durable, l.mu.bufLSN+LSN(len(l.mu.buf))
	s.RingBlocks, s.UsedBlocks = l.ring, l.usedLocked(0)
	return s
}

// KeepLock makes Close keep the log's lock (OpenNamed) even when the log
// itself closes cleanly: its owner's close failed elsewhere (a B-tree
// server whose dirty nodes did not all reach their chunks), so the log
// still holds the only copy of some committed changes, and the recovery
// of the owner's leases must cover the log (btree.ReplayDead leaves alone
// a log whose lock the dead clerk did not hold). The lock then goes with
// the owner's other leases, once it is declared dead.
func (l *Log) KeepLock() {
	l.mu.Lock()
	l.mu.keepLock = true
	l.mu.Unlock()
}

// Close flushes what is buffered (lazy commits included) and stops the
// log. Open transactions stay unended: the next Open rolls them back. A
// log opened with OpenNamed gives its lock up only if Close succeeds (and
// KeepLock was not called). A second Close waits for the first and
// returns its result (nil only if what was buffered is durable).
func (l *Log) Close(ctx context.Context) (err error) {
	l.mu.Lock()
	if l.mu.closed {
		done := l.mu.closeDone
		l.mu.Unlock()
		select {
		case <-done:
			l.mu.Lock()
			defer l.mu.Unlock()
			return l.mu.closeErr
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	l.mu.closed = true
	l.mu.closeDone = make(chan struct{})
	defer func() {
		l.mu.Lock()
		l.mu.closeErr = err
		close(l.mu.closeDone)
		l.mu.Unlock()
	}()
	l.mu.space.Broadcast()
	if l.mu.ckptTimer != nil {
		l.mu.ckptTimer.Stop() // (one that fired already finds the log closed)
		l.mu.ckptTimer = nil
	}
	l.mu.Unlock()
	for ctx.Err() == nil {
		l.mu.Lock()
		buffered, inFlight := len(l.mu.buf) > 0, len(l.mu.flights) > 0
		failed := l.mu.err
		l.mu.Unlock()
		if !buffered && !inFlight || failed != nil {
			err = failed
			break
		}
		if buffered {
			if e := l.FlushNow(ctx); e != nil {
				l.mu.Lock()
				failed := l.mu.err
				l.mu.Unlock()
				if !errors.Is(e, ErrClosed) || failed != nil {
					err = e
					break
				}
				// ErrClosed with the log sound: a flusher took the
				// buffer between the look above and FlushNow's. Its
				// flight is waited out (the loop), not cancelled by
				// l.stop (outside review 73, from reading: review 57's
				// damage, by another door).
			}
		}
		// A flight in flight (a flusher's, or one FlushNow's write left
		// behind an earlier flight): wait it out, before l.stop cancels
		// the flushers' writes (review 57: Close gave up on it, and the
		// log failed under a commit whose write would have landed).
		time.Sleep(time.Millisecond)
	}
	l.stop()
	l.wg.Wait()
	l.mu.Lock()
	for _, w := range l.mu.waiters {
		w.ch <- ErrClosed
	}
	l.mu.waiters = nil
	l.mu.stopped = true
	l.mu.Unlock()
	if err == nil {
		err = ctx.Err()
	}
	l.mu.Lock()
	keep := l.mu.keepLock
	l.mu.Unlock()
	if l.release != nil && err == nil && !keep {
		// Only a clean close gives the log's lock up. After a failed one
		// the log may hold records nothing else has: the lock stays held
		// until the owner dies, so that the recovery of its leases covers
		// the log (a B-tree replay leaves alone a log whose lock the dead
		// clerk did not hold: btree.ReplayDead).
		l.release()
	}
	return err
}
