package rldev

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/lock"
)

// NodeID names a node.
type NodeID = uint64

// OpID names a disk operation the engine asked for; ReqID a client request
// the driver handed it.
type (
	OpID  uint64
	ReqID uint64
)

// Env is what the engine knows of the world at one step: the local time
// and the deadline until which this node incarnation is guaranteed alive
// (the failure detector's self-fence deadline; zero: not alive). A replica
// serves only before the deadline: no dead verdict, and so no decree
// making it stale, can come earlier.
type Env struct {
	Now      time.Time
	Deadline time.Time
}

func (env Env) alive() bool { return !env.Deadline.IsZero() && env.Now.Before(env.Deadline) }

// Effects the driver carries out, in order.
type (
	// DiskRead reads Len bytes at Off of local disk Disk; the driver calls
	// DiskDone(Op, data, err). If Run is set, the bytes are a run of
	// physical blocks: the driver calls ReadRun instead (the blocks are
	// checked and their data moved together off the engine's lock, on the
	// goroutine that reads) and then RunDone(Op, its result, err).
	DiskRead struct {
		Op   OpID
		Disk uint32
		Off  int64
		Len  int
		Run  *BlockRun
		// Lend, with Run, says that the run's data goes to client request
		// Lend's reply and nowhere else: a runtime may lend the read a
		// buffer and take it back once that reply is sent (see physBufs).
		Lend ReqID
	}
	// DiskWrite writes Data at Off; DiskDone(Op, nil, err) when WriteAt
	// returned (not yet durable). If Encode is set, Data is nil and the
	// bytes are Encode's result: pure computation (checksumming blocks)
	// that the runtime does off the engine's lock, on the goroutine that
	// writes (DoWrite).
	DiskWrite struct {
		Op     OpID
		Disk   uint32
		Off    int64
		Data   []byte
		Encode func() Encoded
	}
	// DiskSync makes the writes done before it durable; DiskDone(Op, nil,
	// err).
	DiskSync struct {
		Op   OpID
		Disk uint32
	}
	// DiskDrop drops the disk's cached pages of [Off, Off+Len)
	// (disk.Device.DropCache), so that reads see what survives a crash
	// rather than what a failed sync lost; DiskDone(Op, nil, err).
	DiskDrop struct {
		Op   OpID
		Disk uint32
		Off  int64
		Len  int64
	}
	// Send delivers Msg to the engine of node To (on an ordered session;
	// lost if the session breaks: the engine resends what matters).
	Send struct {
		To  NodeID
		Msg any
	}
	// Reply ends client request Req.
	Reply struct {
		Req  ReqID
		Data []byte
		Err  error
		// LandedBefore: a write done without being applied again, an
		// earlier attempt of it (its WriteID) having landed here.
		LandedBefore bool
	}
	// Propose passes a decree on the RLDev namespace, conditional on
	// Version; the driver calls Decided(ID, err). The table the engine
	// acts on arrives separately (SetTable): a decree's effect is seen
	// there, whoever proposed it.
	Propose struct {
		ID      uint64
		Version uint64
		Ops     []*pb.Op
		What    string
	}
	// AskDead asks the failure-detector service whether node incarnations
	// are dead; the driver calls Verdict for each answer.
	AskDead struct{ Subjects []Subject }
	// Refresh asks for a linearizable read of the table (SetTable with it):
	// a peer acts in an epoch this engine has not seen yet.
	Refresh struct{}
	// Log is a line for the node's log.
	Log struct {
		Level int // 0 debug, 1 info, 2 warn, 3 error
		Msg   string
		Args  []any
	}
)

// Subject is a node incarnation.
type Subject struct{ Node, Inc uint64 }

// LocalDisk is one of this node's disks as the driver opened it.
type LocalDisk struct {
	Index uint32
	Size  int64
	Path  string
	UUID  string // from its header (OpenDisk)
	// Suspect: reads of the disk may see what a failed sync lost (under
	// an earlier engine, whose failure no one alive heard, or an earlier
	// process: Linux reports such a failure once). Each replica's first
	// load then drops its segment's cached pages first.
	Suspect bool
}

// Config configures an engine.
type Config struct {
	Node NodeID
	// Inc is this process's incarnation (the failure detector's): a
	// replica serves once the table names it for its segment. Required.
	Inc   uint64
	Disks []LocalDisk
	// FlushEvery is how often dirty regions with no write in flight are
	// cleared from the log (one log write per flush). Default 1 s.
	FlushEvery time.Duration
	// PollEvery is how often an unreachable peer is asked about. Default
	// 250 ms.
	PollEvery time.Duration
	// RetryEvery is how often an unanswered peer message is sent again.
	// Default 500 ms.
	RetryEvery time.Duration
	// CopyBlocks is the blocks per resync copy message (default 64 =
	// 256 KiB); CopyWindow how many are in flight (default 4).
	CopyBlocks uint64
	CopyWindow int
	// ProgressEvery is how often a resync records its progress by decree.
	// Default 2 s.
	ProgressEvery time.Duration
	// ReloadEvery is how long a segment that failed waits before it is
	// loaded again (its disk's error may have been transient). Default 5 s.
	ReloadEvery time.Duration
	// ScrubRate is the bytes per second the scrubber reads, over all the
	// node's segments: it checks every block and compares generations with
	// the peer, and repairs from the peer what fails (bit rot in a block
	// nobody reads, a misdirected write that left an old block in place).
	// Default 4 MiB/s; negative: off.
	ScrubRate int64
	// ScrubBlocks is the blocks the scrubber checks at a time (default 64).
	ScrubBlocks uint64
	// DiskTimeout is how long a disk operation may stay unanswered before
	// the disk counts as hung and every segment on it fails (default 20
	// s; negative: never): a sync unanswered for DiskTimeout; any other
	// operation unanswered for DiskTimeout while nothing of the disk was
	// answered meanwhile, or for DiskTimeout×StuckFactor whatever the
	// rest of the disk does. Why: a disk that stops answering -- a sync
	// that never returns, a device whose commands the kernel keeps
	// retrying -- leaves its node alive to the failure detector, and
	// every write of its RLDevs waits for it, on the primary's own disk
	// or for the secondary's acknowledgement, for as long as it hangs.
	// Failed, each segment asks to be marked stale, and its peer serves
	// alone. A hung disk's segments load again only once none of its
	// operations is older than a quarter of DiskTimeout (and, as after
	// any failure, none of the failed replica's own is in progress: it
	// may still land).
	//
	// Why the disk's progress counts: an operation's age includes its
	// wait in the node's disk queue, and a disk that is only overloaded
	// (a deep queue of large writes on a slow disk, a resync beside its
	// clients) answers all the while; failing it would have every segment
	// of it copied whole, more load on a disk already short of it. Why a
	// sync counts alone: buffered writes and reads of cached pages are
	// answered by the page cache while the device answers nothing, and
	// the engine has one sync in flight per disk, so a sync's age is the
	// device's own (outside review 79: a sync that never returned was
	// found only at StuckFactor timeouts, and syncs of 45 s each never).
	DiskTimeout time.Duration
	// CopyRate bounds the bytes per second this node's resyncs and move
	// copies send, all together (0: unbounded). Every write waits for
	// the copy's range locks and shares the disk with it: a bound trades
	// rebuild time for the writes' latency meanwhile.
	CopyRate int64
	// Unsafe switches a rule off: for the simulator's teeth tests only,
	// which show that its oracle catches what each rule prevents.
	Unsafe Unsafe

	// drlRegion is the dirty-region log's region in blocks (default
	// DRLRegionBlocks): the simulator's RLDevs are small, and a small
	// region gives them several. Every engine that reads a segment must
	// agree (a log whose region differs does not load).
	drlRegion uint64
}

// Unsafe rules, off in every real configuration.
type Unsafe struct {
	ServeStale bool // a stale replica serves reads
	NoDirtyLog bool // writes are forwarded without a durable dirty-region mark
	NoJoin     bool // a replica serves without the table naming its incarnation; a verdict on any incarnation counts
	NoMaybe    bool // a write that began to land and failed does not say it may have taken effect
	MoveEarly  bool // a move's copy complete, the primary switches at once: the moving replica never stops serving first
	// ApplyRetries: a write that landed here before (its WriteID
	// remembered) is applied again (landed.go).
	ApplyRetries bool
}

func (c *Config) defaults() {
	if c.FlushEvery == 0 {
		c.FlushEvery = time.Second
	}
	if c.ScrubRate == 0 {
		c.ScrubRate = 4 << 20
	}
	if c.ScrubBlocks == 0 {
		c.ScrubBlocks = 64
	}
	if c.PollEvery == 0 {
		c.PollEvery = 250 * time.Millisecond
	}
	if c.RetryEvery == 0 {
		c.RetryEvery = 500 * time.Millisecond
	}
	if c.CopyBlocks == 0 {
		c.CopyBlocks = 64
	}
	if c.CopyWindow == 0 {
		c.CopyWindow = 4
	}
	if c.ProgressEvery == 0 {
		c.ProgressEvery = 2 * time.Second
	}
	if c.ReloadEvery == 0 {
		c.ReloadEvery = 5 * time.Second
	}
	if c.DiskTimeout == 0 {
		c.DiskTimeout = DefaultDiskTimeout
	}
}

// DefaultDiskTimeout is Config.DiskTimeout's default: past the 30 s a
// Linux block device's command timeout is by default, a disk has failed
// or answered; 20 s keeps a hung disk's writes from waiting that long
// while leaving a loaded disk's slow syncs (seconds at worst, seen here)
// well inside it.
const DefaultDiskTimeout = 20 * time.Second

// StuckFactor: an operation unanswered for DiskTimeout×StuckFactor makes
// its disk hung even while the disk's other operations are answered (a
// sector whose reads the device retries for ever holds one worker, and
// the RLDev request waiting on it, while the other workers go on). An
// overloaded disk's queue wait stays below it: at 60 s by default, a
// thousand 1 MiB writes queued on a 20 MB/s disk.
const StuckFactor = 3

// Engine is one node incarnation's RLDev service: every local replica,
// their data paths, logs and recovery, and the decrees they need. It
// performs no I/O: inputs are methods, outputs the effects they return.
// Not safe for concurrent use. A fenced node's engine is discarded (and a
// new one started for its next incarnation): nothing carries over.
type Engine struct {
	cfg    Config
	env    Env // of the input being handled (continuations read it)
	table  *Table
	fresh  bool              // a linearizable table has been seen since start
	nodes  map[NodeID]uint64 // registered incarnation of each node
	disks  map[uint32]*diskState
	diskIx []uint32 // disks' indexes in order (fixed at start)
	// retiringHere: the RLDevs of table with an extent retiring on this
	// node's disks (decide).
	retiringHere []uint64
	retiringOf   *Table
	reps         map[uint64]*replica // the segments this node holds, by RLDev
	tgts         map[uint64]*replica // the moves' targets this node receives, by RLDev
	ops          map[OpID]func(data []byte, err error) []any
	runs         map[OpID]func(RunData, error) []any // reads of block runs
	// issued: every disk operation in progress, with its disk and when
	// it was issued (watchDisks).
	issued map[OpID]issuedOp
	nextOp OpID
	seq    uint64 // peer message sequence numbers

	up       map[NodeID]bool    // peers with a session now
	suspects map[NodeID]uint64  // peer → incarnation asked about (since its session broke)
	dead     map[NodeID]uint64  // peer → incarnation declared dead
	reqs     map[ReqID]*request // client requests in progress

	decreeID     uint64
	decreeOut    bool      // a decree is in flight
	decreeFailed time.Time // when the last one failed (retry after RetryEvery)
	// awaitTable: a decree was decided and no table since is newer than
	// decreeVer, the version it was conditional on. Until one is, the
	// table held may not show it: committed, or (answered failed) still
	// able to commit, as a proposal in flight when its caller gave up may.
	// A table newer than decreeVer shows it, or proves it never will
	// commit (see replica.retry).
	awaitTable bool
	decreeVer  uint64
	// unsure: the last decree was answered failed, its table not seen;
	// unsettled: and a linearizable table since still stands at
	// decreeVer, so it may commit yet, or never (a lost proposal).
	// decide then proposes a decree conditional on the same version,
	// changing nothing, to settle it: once one of the two commits the
	// other cannot, and the table moves past decreeVer (outside review
	// 39: otherwise, in a quiet cluster, awaitTable held a failed replica
	// down for good).
	unsure, unsettled bool

	lastPoll  time.Time
	lastFlush time.Time
	lastRetry time.Time
	scrubAt   time.Time // when the scrubber may take its next chunk
	scrubNext uint64    // the RLDev it goes to next (round robin)
	copyAt    time.Time // when the next copy chunk may go (CopyRate)

	// Retiring extents of this node (move.go): replicas retired with
	// disk I/O still in progress, the extents being wiped and wiped, and
	// the extents a new replica waits for (extentBusy).
	retired    []*replica
	wiping     map[Segment]bool
	wiped      map[Segment]bool
	waitLogged map[Segment]bool // extents a new replica waits for (extentBusy)
	// forgottenLogged: disks of this node found forgotten in the table
	// (forget.go), said once.
	forgottenLogged map[uint32]bool

	stats Stats
}

// Stats counts what the engine did (for metrics and tests).
type Stats struct {
	Writes, Reads, Forwards, Repairs, CopiedBlocks, PulledBlocks uint64
	DRLWrites, DegradedWrites, Decrees                           uint64
	DRLAhead                                                     uint64 // regions marked ahead of a sequential writer
	OwedWrites                                                   uint64 // owed-page writes (owed.go)
	OwedWaits, OwedPulled, OwedNotWhole                          uint64 // owed ranges: peer stale while owed (times), pulled from a stale peer, kept as the peer's copy was not whole
	DiskHangs                                                    uint64 // disks found hung (an operation unanswered for DiskTimeout)
	CorruptFound                                                 uint64
	ScrubbedBlocks, ScrubRepairs, ScrubPasses                    uint64
	// Resends: forwards sent again, unanswered for a while (resend);
	// Duplicates: forwards received while the same write was being
	// written here, answered with it rather than written again.
	Resends, Duplicates uint64
	// LandedBefore: client writes not applied again, an earlier attempt
	// having landed here (landed.go); LandedForgotten: times a copy
	// forgot the writes that landed on it (another copy's blocks landed).
	LandedBefore, LandedForgotten uint64
	// LandedStale: writes that landed here before found their blocks
	// older or corrupt, and were applied again (landed.go).
	LandedStale uint64
}

type diskState struct {
	idx     uint32
	size    int64
	uuid    string
	path    string
	waiting []func(error) []any // writes done, waiting for a sync
	syncing bool
	// syncFails counts the disk's failed syncs (the last one's error in
	// syncErr). A write is acknowledged durable only if none failed from
	// its issue to the end of the sync that covers it: after a failed
	// writeback Linux may mark the pages clean and report the error once,
	// to that fdatasync, so a later fdatasync succeeds though a write
	// whose pages were in the failed writeback — any write in flight
	// meanwhile, or a neighbour's (a physical block shares its pages) —
	// was lost.
	syncFails uint64
	syncErr   error
	// suspect: the page cache may hold what a failed sync of an earlier
	// engine or process lost (LocalDisk.Suspect): every replica's first
	// load drops its segment's cached pages (replica.dropCache).
	suspect bool
	// hung: an operation of the disk has been in progress for
	// Config.DiskTimeout with none answered meanwhile (a sync: whatever
	// else was answered), or for StuckFactor times that: its segments failed, and none loads again until no
	// operation of the disk is a quarter of the timeout old (watchDisks).
	hung bool
	// answered: when an operation of the disk was last answered (zero:
	// never, by this engine).
	answered time.Time
}

// issuedOp is a disk operation in progress (Engine.issued).
type issuedOp struct {
	disk uint32
	at   time.Time
	sync bool
}

type request struct {
	id        ReqID
	cancelled bool
}

// NewEngine returns an engine for node cfg.Node with its local disks. It
// serves nothing until SetTable gives it a linearizable table.
func NewEngine(cfg Config) *Engine {
	if cfg.Node == 0 || cfg.Inc == 0 {
		panic("rldev: NewEngine needs the node's id and incarnation")
	}
	cfg.defaults()
	e := &Engine{cfg: cfg, nodes: map[NodeID]uint64{}, disks: map[uint32]*diskState{}, reps: map[uint64]*replica{}, tgts: map[uint64]*replica{},
		ops: map[OpID]func([]byte, error) []any{}, runs: map[OpID]func(RunData, error) []any{}, issued: map[OpID]issuedOp{}, up: map[NodeID]bool{}, suspects: map[NodeID]uint64{},
		dead: map[NodeID]uint64{}, reqs: map[ReqID]*request{}, table: &Table{RLDevs: map[uint64]*Record{}, Disks: map[DiskKey]*Disk{}},
		wiping: map[Segment]bool{}, wiped: map[Segment]bool{}, waitLogged: map[Segment]bool{}, forgottenLogged: map[uint32]bool{}}
	for _, d := range cfg.Disks {
		e.disks[d.Index] = &diskState{idx: d.Index, size: d.Size, uuid: d.UUID, path: d.Path, suspect: d.Suspect}
	}
	e.diskIx = sortedDisks(e.disks)
	// A node reaches itself (a move to another of its disks: the primary
	// and the target on one node): the driver delivers what it sends
	// itself, in order.
	e.up[cfg.Node] = true
	return e
}

// Stats returns the engine's counters.
func (e *Engine) Stats() Stats { return e.stats }

func (e *Engine) logf(level int, msg string, args ...any) Log {
	return Log{Level: level, Msg: msg, Args: args}
}

// ------------------------------------------------------------------ disk

// read issues a disk read; then runs when it completes.
func (e *Engine) read(disk uint32, off int64, n int, then func(data []byte, err error) []any) []any {
	e.issue(disk)
	e.ops[e.nextOp] = then
	return []any{DiskRead{Op: e.nextOp, Disk: disk, Off: off, Len: n}}
}

// readRun issues a read of a run of physical blocks at off; then runs with
// what ReadRun found.
// lend, if not 0, is the client request whose reply alone then gives the
// data to (DiskRead.Lend).
func (e *Engine) readRun(disk uint32, off int64, run BlockRun, lend ReqID, then func(RunData, error) []any) []any {
	e.issue(disk)
	e.runs[e.nextOp] = then
	return []any{DiskRead{Op: e.nextOp, Disk: disk, Off: off, Len: int(run.N) * PhysBlockSize, Run: &run, Lend: lend}}
}

// writeDurable issues a disk write and runs then once it is durable (a
// sync that started after the write returned succeeded), or failed. Syncs
// are shared: every write done while a sync is in flight waits for the
// next one, which covers them all (group commit).
func (e *Engine) writeDurable(disk uint32, off int64, data []byte, then func(err error) []any) []any {
	return e.writeDurableEnc(disk, off, data, nil, then)
}

// writeDurableEnc is writeDurable of data, or of encode's result (see
// DiskWrite).
func (e *Engine) writeDurableEnc(disk uint32, off int64, data []byte, encode func() Encoded, then func(err error) []any) []any {
	var fails uint64 // the disk's failed syncs at the write's issue
	if d := e.disks[disk]; d != nil {
		fails = d.syncFails
	}
	e.issue(disk)
	e.ops[e.nextOp] = func(_ []byte, err error) []any {
		if err != nil {
			return then(err)
		}
		d := e.disks[disk]
		d.waiting = append(d.waiting, func(err error) []any {
			if err == nil && d.syncFails != fails {
				err = fmt.Errorf("a sync of the disk failed while the write was in flight (its pages may have been lost with that writeback): %w", d.syncErr)
			}
			return then(err)
		})
		return e.maybeSync(d)
	}
	return []any{DiskWrite{Op: e.nextOp, Disk: disk, Off: off, Data: data, Encode: encode}}
}

func (e *Engine) maybeSync(d *diskState) []any {
	if d.syncing || len(d.waiting) == 0 {
		return nil
	}
	d.syncing = true
	batch := d.waiting
	d.waiting = nil
	e.issue(d.idx)
	e.issued[e.nextOp] = issuedOp{disk: d.idx, at: e.env.Now, sync: true} // (issue's entry, marked a sync: watchDisks)
	e.ops[e.nextOp] = func(_ []byte, err error) []any {
		d.syncing = false
		if err != nil {
			d.syncFails++
			d.syncErr = err
		}
		var out []any
		for _, fn := range batch {
			out = append(out, fn(err)...)
		}
		return append(out, e.maybeSync(d)...)
	}
	return []any{DiskSync{Op: e.nextOp, Disk: d.idx}}
}

// dropRange issues a DropCache of [off, off+n) of disk; then runs with its
// error once it returned.
func (e *Engine) dropRange(disk uint32, off, n int64, then func(error) []any) []any {
	e.issue(disk)
	e.ops[e.nextOp] = func(_ []byte, err error) []any { return then(err) }
	return []any{DiskDrop{Op: e.nextOp, Disk: disk, Off: off, Len: n}}
}

// issue takes the next operation id, for an operation of disk issued now.
func (e *Engine) issue(disk uint32) {
	e.nextOp++
	e.issued[e.nextOp] = issuedOp{disk: disk, at: e.env.Now}
}

// watchDisks fails the segments of a disk one of whose operations has
// been in progress for Config.DiskTimeout while the disk answered nothing,
// or for StuckFactor times that (see Config.DiskTimeout), and counts the
// disk answering again once none is a quarter of the timeout old.
func (e *Engine) watchDisks(env Env) []any {
	if e.cfg.DiskTimeout < 0 {
		return nil
	}
	oldest, oldestSync := map[uint32]time.Time{}, map[uint32]time.Time{}
	for _, op := range e.issued {
		if t, ok := oldest[op.disk]; !ok || op.at.Before(t) {
			oldest[op.disk] = op.at
		}
		if t, ok := oldestSync[op.disk]; op.sync && (!ok || op.at.Before(t)) {
			oldestSync[op.disk] = op.at
		}
	}
	var out []any
	for _, k := range e.diskIx {
		d := e.disks[k]
		t, busy := oldest[k]
		age := env.Now.Sub(t)
		silent := d.answered.IsZero() || env.Now.Sub(d.answered) >= e.cfg.DiskTimeout
		ts, syncing := oldestSync[k]
		syncStuck := syncing && env.Now.Sub(ts) >= e.cfg.DiskTimeout
		stuck := busy && age >= e.cfg.DiskTimeout && (silent || syncStuck || age >= StuckFactor*e.cfg.DiskTimeout)
		// It answers again once nothing of it is older than a quarter of
		// the timeout: a disk back from a hang drains its backlog in
		// moments, and one that answers now and then, slowly, stays hung
		// rather than have its segments load and fail by turns.
		answers := !busy || env.Now.Sub(t) < e.cfg.DiskTimeout/4
		switch {
		case stuck && !d.hung:
			d.hung = true
			e.stats.DiskHangs++
			what := "answering nothing meanwhile"
			switch {
			case syncStuck && !silent:
				age, what = env.Now.Sub(ts), "a sync (writes and reads of the page cache were answered)"
			case !silent:
				what = fmt.Sprintf("%d times the disk timeout, though other operations were answered", StuckFactor)
			}
			err := fmt.Errorf("%w: disk %d (%s) has left an operation unanswered for %v, %s (disk timeout %v)", ErrDiskHung, k, d.path, age.Round(time.Millisecond), what, e.cfg.DiskTimeout)
			out = append(out, e.logf(3, "rldev disk hung: failing its segments; they load again once it answers", "disk", k, "path", d.path, "unanswered_for", age.Round(time.Millisecond), "answering_others", !silent))
			for _, r := range e.replicas() {
				if r.disk == k {
					out = append(out, r.fail(err)...)
				}
			}
		case answers && d.hung:
			d.hung = false
			out = append(out, e.logf(3, "rldev disk answers again", "disk", k, "path", d.path))
		case d.hung:
			// A replica placed on the disk since it was found hung (a
			// new RLDev's segment, a move's target, one hosted once its
			// extent was free) fails too: loading, it would wait on the
			// disk while the table counts it, and its peer's writes with
			// it (outside review 76).
			for _, r := range e.replicas() {
				if r.disk == k && r.state != repFailed && r.state != repRetired {
					out = append(out, r.fail(fmt.Errorf("%w: disk %d (%s) is hung (an operation unanswered for %v or more)", ErrDiskHung, k, d.path, e.cfg.DiskTimeout))...)
				}
			}
		}
	}
	return out
}

// diskHung says whether disk idx is hung (watchDisks).
func (e *Engine) diskHung(idx uint32) bool {
	d := e.disks[idx]
	return d != nil && d.hung
}

// DiskDone delivers a disk operation's completion.
func (e *Engine) DiskDone(env Env, op OpID, data []byte, err error) []any {
	e.env = env
	e.answered(op)
	fn := e.ops[op]
	if fn == nil {
		return nil
	}
	delete(e.ops, op)
	return append(fn(data, err), e.decide(env)...)
}

// RunDone delivers the completion of a DiskRead of a run of blocks (Run
// set): what ReadRun returned.
func (e *Engine) RunDone(env Env, op OpID, res RunData, err error) []any {
	e.env = env
	e.answered(op)
	fn := e.runs[op]
	if fn == nil {
		return nil
	}
	delete(e.runs, op)
	return append(fn(res, err), e.decide(env)...)
}

// answered notes that disk operation op has been answered (watchDisks).
func (e *Engine) answered(op OpID) {
	if x, ok := e.issued[op]; ok {
		if d := e.disks[x.disk]; d != nil {
			d.answered = e.env.Now
		}
		delete(e.issued, op)
	}
}

// ------------------------------------------------------------------ table

// SetTable gives the engine the RLDev table (linearizable: read from the
// leader, not a watch's hint; the engine serves nothing before the first
// such table, so that a replica made stale while this node was down finds
// out before it serves). nodes is the registered incarnation of each node.
func (e *Engine) SetTable(env Env, t *Table, linearizable bool, nodes map[NodeID]uint64) []any {
	e.env = env
	if nodes != nil {
		e.nodes = nodes
	}
	if t.Version < e.table.Version {
		// An older view: a lagging watch, or a linearizable read whose
		// answer a watch overtook. The table held is newer than the read
		// saw, so it is as fresh as the read would have made it: without
		// this, an engine whose first read a watch overtook never became
		// fresh, and its replicas never served (a node's RLDevs stayed
		// down after a whole-cluster restart).
		if !linearizable || e.fresh {
			return nil
		}
		t = e.table
	}
	e.table = t
	if linearizable {
		e.fresh = true
	}
	if t.Version > e.decreeVer {
		e.awaitTable, e.unsure, e.unsettled = false, false, false
	} else if linearizable && e.unsure && !e.decreeOut {
		e.unsettled = true
	}
	var out []any
	// Replicas this node hosts now: a segment, a move's target, or both
	// (a segment moving to another of this node's disks).
	for _, id := range t.IDs() {
		rec := t.RLDevs[id]
		out = append(out, e.hostSegment(env, t, rec)...)
		out = append(out, e.hostTarget(env, rec)...)
	}
	// Replicas this node no longer hosts.
	for _, id := range sortedIDs(e.reps) {
		if rec := t.RLDevs[id]; rec == nil || rec.SegmentOf(e.cfg.Node) < 0 {
			out = append(out, e.retireReplica(env, e.reps[id], "no longer a replica here")...)
			delete(e.reps, id)
		}
	}
	for _, id := range sortedIDs(e.tgts) {
		if rec := t.RLDevs[id]; rec == nil || rec.Move == nil || rec.Move.To.Node != e.cfg.Node {
			out = append(out, e.retireReplica(env, e.tgts[id], "no longer a move's target here")...)
			delete(e.tgts, id)
		}
	}
	out = append(out, e.wipeTick()...)
	return append(out, e.decide(env)...)
}

// hostSegment keeps e.reps[rec.ID] the replica of the segment rec puts on
// this node, if any: a move's target the table now puts in the segment's
// place is promoted to it; a replica whose segment went elsewhere is
// retired.
func (e *Engine) hostSegment(env Env, t *Table, rec *Record) []any {
	id := rec.ID
	seg := rec.SegmentOf(e.cfg.Node)
	if seg < 0 {
		return nil
	}
	place := rec.Segs[seg]
	var out []any
	r := e.reps[id]
	if r != nil && (r.seg != seg || r.place() != place) {
		// This node's segment moved (to a node elsewhere and back, or to
		// another of its disks): the old one is retired.
		out = append(out, e.retireReplica(env, r, "segment moved")...)
		delete(e.reps, id)
		r = nil
	}
	if tg := e.tgts[id]; r == nil && tg != nil && tg.seg == seg && tg.place() == place {
		if tg.ready() {
			// A move's target the table now puts in the segment's place.
			delete(e.tgts, id)
			e.reps[id] = tg
			return append(out, tg.promote(env, rec)...)
		}
		// Not ready (say, joining after its move was parked): a new
		// replica takes the extent, once this one's I/O has ended.
		out = append(out, e.retireReplica(env, tg, "its extent now holds the segment")...)
		delete(e.tgts, id)
	}
	if r != nil {
		return append(out, r.setRecord(env, rec)...)
	}
	if e.disks[place.Disk] == nil {
		return append(out, e.logf(3, "rldev segment on a disk this node does not have", "rldev", id, "disk", place.Disk))
	}
	if e.extentBusy(place) {
		return append(out, e.logWaitOnce(place, "rldev segment waits for the I/O of a retired replica of its extent to end", "rldev", id, "extent", place.String())...)
	}
	r = newReplica(e, rec, seg, place, false)
	// A segment on a disk whose header is not the one the table
	// registered was lost with that disk: it serves nothing, and asks to
	// be marked stale and copied whole.
	if td := t.Disks[DiskKey{e.cfg.Node, r.disk}]; td != nil && td.UUID != "" && td.UUID != e.disks[r.disk].uuid && !rec.Stale[seg] {
		r.lost = true
		out = append(out, e.logf(3, "rldev segment lost with its disk (the disk was replaced)", "rldev", id, "disk", r.disk))
	}
	e.reps[id] = r
	return append(out, r.load(env)...)
}

// hostTarget keeps e.tgts[rec.ID] the replica receiving the move rec
// puts on this node, if any.
func (e *Engine) hostTarget(env Env, rec *Record) []any {
	m := rec.Move
	if m == nil || m.To.Node != e.cfg.Node {
		return nil
	}
	id := rec.ID
	var out []any
	r := e.tgts[id]
	if r != nil && (r.seg != m.Seg || r.place() != m.To) {
		out = append(out, e.retireReplica(env, r, "the move's target changed")...)
		delete(e.tgts, id)
		r = nil
	}
	if r != nil {
		return append(out, r.setRecord(env, rec)...)
	}
	if e.disks[m.To.Disk] == nil {
		return append(out, e.logf(3, "rldev move target on a disk this node does not have", "rldev", id, "disk", m.To.Disk))
	}
	if e.extentBusy(m.To) {
		return append(out, e.logWaitOnce(m.To, "rldev move target waits for the I/O of a retired replica of its extent to end", "rldev", id, "extent", m.To.String())...)
	}
	r = newReplica(e, rec, m.Seg, m.To, true)
	e.tgts[id] = r
	return append(out, r.load(env)...)
}

// extentBusy: a retired replica's disk I/O on the extent at place is
// still in progress, or the extent is being wiped. A new replica there
// waits (Tick asks again): the old I/O, landing after the new replica's
// load, resync or writes, would undo them (outside review 39: a move's
// target dropped with its copy write in flight, its extent then given to
// the segment).
func (e *Engine) extentBusy(place Segment) bool {
	if e.wiping[place] || e.retiredBusy(place) {
		return true
	}
	delete(e.waitLogged, place)
	return false
}

// logWaitOnce logs, once per wait, that a replica waits for its extent.
func (e *Engine) logWaitOnce(place Segment, msg string, args ...any) []any {
	if e.waitLogged[place] {
		return nil
	}
	e.waitLogged[place] = true
	return []any{e.logf(2, msg, args...)}
}

// hostPending hosts what the table puts on this node and a retired
// replica's I/O held back (extentBusy).
func (e *Engine) hostPending(env Env) []any {
	if len(e.waitLogged) == 0 || !e.fresh {
		return nil
	}
	var out []any
	for _, id := range e.table.IDs() {
		rec := e.table.RLDevs[id]
		if seg := rec.SegmentOf(e.cfg.Node); seg >= 0 && e.reps[id] == nil && e.waitLogged[rec.Segs[seg]] {
			out = append(out, e.hostSegment(env, e.table, rec)...)
		}
		if m := rec.Move; m != nil && m.To.Node == e.cfg.Node && e.tgts[id] == nil && e.waitLogged[m.To] {
			out = append(out, e.hostTarget(env, rec)...)
		}
	}
	return out
}

// replicas returns every local replica: segments by RLDev, then move
// targets by RLDev (a fixed order: the simulator replays a seed exactly).
func (e *Engine) replicas() []*replica {
	out := make([]*replica, 0, len(e.reps)+len(e.tgts))
	for _, id := range sortedIDs(e.reps) {
		out = append(out, e.reps[id])
	}
	for _, id := range sortedIDs(e.tgts) {
		out = append(out, e.tgts[id])
	}
	return out
}

// ------------------------------------------------------------------ peers

// PeerUp: a session to node is up.
func (e *Engine) PeerUp(env Env, node NodeID) []any {
	e.env = env
	if node == e.cfg.Node {
		return nil
	}
	e.up[node] = true
	delete(e.suspects, node)
	delete(e.dead, node)
	var out []any
	for _, r := range e.replicas() {
		out = append(out, r.peerUp(env, node)...)
	}
	return append(out, e.decide(env)...)
}

// PeerDown: the session to node broke. What was sent on it may be lost:
// replicas resend, and the node is asked about until it is back or dead.
func (e *Engine) PeerDown(env Env, node NodeID) []any {
	e.env = env
	if node == e.cfg.Node {
		return nil
	}
	delete(e.up, node)
	if _, ok := e.suspects[node]; !ok && e.dead[node] == 0 {
		e.suspects[node] = e.nodes[node]
	}
	var out []any
	for _, r := range e.replicas() {
		out = append(out, r.peerDown(env, node)...)
	}
	out = append(out, e.poll(env, true)...)
	return append(out, e.decide(env)...)
}

// poll asks the failure detector about unreachable peers every PollEvery.
func (e *Engine) poll(env Env, now bool) []any {
	if !now && env.Now.Sub(e.lastPoll) < e.cfg.PollEvery {
		return nil
	}
	// Every peer of a local replica without a session now is a suspect,
	// including one this engine never had a session with (it started
	// while the peer was down). It is asked about the incarnation the
	// table names for its segment, or a later one the membership knows: a
	// verdict on an earlier one would not count.
	suspect := func(n NodeID, inc uint64) {
		inc = max(inc, e.nodes[n])
		if e.up[n] || inc == 0 || e.dead[n] >= inc {
			return
		}
		if inc > e.suspects[n] {
			delete(e.dead, n)
			e.suspects[n] = inc
		}
	}
	for _, id := range sortedIDs(e.reps) {
		r := e.reps[id] // a move's target (e.tgts) waits for the primary; the primary watches it
		suspect(r.peerNode(), r.rec.Inc[r.peer()])
		if m := r.rec.Move; m != nil && m.Inc != 0 && r.isPrimary() {
			suspect(m.To.Node, m.Inc)
		}
	}
	if len(e.suspects) == 0 {
		return nil
	}
	e.lastPoll = env.Now
	var subs []Subject
	for n, inc := range e.suspects {
		if inc != 0 {
			subs = append(subs, Subject{Node: n, Inc: inc})
		}
	}
	sort.Slice(subs, func(i, j int) bool { return subs[i].Node < subs[j].Node })
	if len(subs) == 0 {
		return nil
	}
	return []any{AskDead{Subjects: subs}}
}

// Verdict is the failure detector's answer about a suspect.
func (e *Engine) Verdict(env Env, s Subject, dead bool) []any {
	e.env = env
	if !dead || e.suspects[s.Node] != s.Inc {
		return nil
	}
	delete(e.suspects, s.Node)
	e.dead[s.Node] = s.Inc
	return append([]any{e.logf(2, "rldev peer declared dead", "peer", s.Node, "peer_incarnation", s.Inc)}, e.decide(env)...)
}

// peerDead reports whether incarnation inc of node (0: whichever) was
// declared dead since its session broke (so it has fenced itself and
// serves nothing). A node's incarnations run one after the other: a
// verdict on one covers those before it.
func (e *Engine) peerDead(node NodeID, inc uint64) bool {
	d := e.dead[node]
	return d != 0 && (d >= inc || e.cfg.Unsafe.NoJoin)
}

// Deliver hands the engine a peer message from node from.
func (e *Engine) Deliver(env Env, from NodeID, msg any) []any {
	e.env = env
	id, target := msgRLDev(msg)
	r := e.reps[id]
	if target {
		r = e.tgts[id]
	}
	if r == nil {
		// Not (or no longer, or not yet) a replica here: say so, so that
		// the sender refreshes its view.
		return e.refuse(from, msg, Unknown)
	}
	if !e.fresh || !env.alive() {
		return e.refuse(from, msg, NotServing)
	}
	return append(r.deliver(env, from, msg), e.decide(env)...)
}

// msgRLDev returns the RLDev a peer message is for, and whether for the
// move's target on this node rather than its segment.
func msgRLDev(msg any) (uint64, bool) {
	switch m := msg.(type) {
	case Forward:
		return m.RLDev, m.Target
	case Ack:
		return m.RLDev, false
	case Pull:
		return m.RLDev, false
	case PullData:
		return m.RLDev, false
	case ResyncMe:
		return m.RLDev, false
	case Copy:
		return m.RLDev, m.Target
	}
	return 0, false
}

// refuse answers a request message that cannot be served.
func (e *Engine) refuse(to NodeID, msg any, c Code) []any {
	switch m := msg.(type) {
	case Forward:
		return []any{Send{to, Ack{RLDev: m.RLDev, Seq: m.Seq, Code: c}}}
	case Copy:
		return []any{Send{to, Ack{RLDev: m.RLDev, Seq: m.Seq, Code: c}}}
	case Pull:
		return []any{Send{to, PullData{RLDev: m.RLDev, Seq: m.Seq, Code: c}}}
	}
	return nil
}

// ------------------------------------------------------------------ clients

// Write asks for data (whole blocks) to be written at block of RLDev id,
// through the primary (replica -1), or to one replica only (replica 0 or
// 1, for a client that keeps its own log and has turned the dirty-region
// log off: WriteReplica). The engine replies once the write is durable
// where it must be.
func (e *Engine) Write(env Env, req ReqID, id uint64, block uint64, data []byte, fence *Fence, replica int) []any {
	return e.WriteAs(env, req, WriteID{}, id, block, data, fence, replica)
}

// WriteAs is Write of the client's write wid (the same in each of its
// attempts): through the primary, a write that landed on this copy
// before is not applied again (landed.go).
func (e *Engine) WriteAs(env Env, req ReqID, wid WriteID, id uint64, block uint64, data []byte, fence *Fence, replica int) []any {
	e.env = env
	r, code := e.replicaFor(env, id, replica, true)
	if code != OK {
		return []any{Reply{Req: req, Err: fmt.Errorf("%w (rldev %d, node %d)", code.Err(), id, e.cfg.Node)}}
	}
	if err := r.checkRange(block, uint64(len(data))/BlockSize); err != nil || len(data) == 0 || len(data)%BlockSize != 0 {
		if err == nil {
			err = fmt.Errorf("%w: %d bytes is not a whole number of %d-byte blocks", ErrBadRequest, len(data), BlockSize)
		}
		return []any{Reply{Req: req, Err: err}}
	}
	if fence != nil {
		if err := lock.ValidName(fence.Name); err != nil {
			return []any{Reply{Req: req, Err: fmt.Errorf("%w: fence: %v", ErrBadRequest, err)}}
		}
	}
	if err := r.owedErr(block, uint64(len(data))/BlockSize); err != nil {
		return []any{Reply{Req: req, Err: err}}
	}
	e.reqs[req] = &request{id: req}
	e.stats.Writes++
	return r.clientWrite(env, req, wid, block, data, fence, replica >= 0)
}

// Read asks for count blocks at block, from this node's replica (replica
// -1: whichever serves; 0 or 1: that replica even when the dirty-region
// log is off and the replicas may differ: ReadReplica).
func (e *Engine) Read(env Env, req ReqID, id uint64, block, count uint64, replica int) []any {
	e.env = env
	r, code := e.replicaFor(env, id, replica, false)
	if code == NotPrimary { // reads need no primary
		code = OK
	}
	if code != OK {
		return []any{Reply{Req: req, Err: fmt.Errorf("%w (rldev %d, node %d)", code.Err(), id, e.cfg.Node)}}
	}
	if err := r.checkRange(block, count); err != nil || count == 0 {
		if err == nil {
			err = fmt.Errorf("%w: a read of 0 blocks", ErrBadRequest)
		}
		return []any{Reply{Req: req, Err: err}}
	}
	if err := r.owedErr(block, count); err != nil {
		return []any{Reply{Req: req, Err: err}}
	}
	e.reqs[req] = &request{id: req}
	e.stats.Reads++
	return r.clientRead(env, req, block, count)
}

// Cancel forgets a request's reply (its client gave up); a write in
// progress still completes.
func (e *Engine) Cancel(req ReqID) {
	if q := e.reqs[req]; q != nil {
		q.cancelled = true
	}
}

// reply ends a client request (once).
func (e *Engine) reply(req ReqID, data []byte, err error) []any {
	return e.replyWith(Reply{Req: req, Data: data, Err: err})
}

// replyWith ends a client request (once) with r.
func (e *Engine) replyWith(r Reply) []any {
	q := e.reqs[r.Req]
	if q == nil {
		return nil
	}
	delete(e.reqs, r.Req)
	if q.cancelled {
		return nil
	}
	return []any{r}
}

// replicaFor finds the local replica that can take a request: replica -1
// means the RLDev's serving replica here (the primary, for a write).
func (e *Engine) replicaFor(env Env, id uint64, replica int, write bool) (*replica, Code) {
	rec := e.table.RLDevs[id]
	if rec == nil {
		return nil, Unknown
	}
	r := e.reps[id] // never a move's target: it serves nothing
	if r == nil || !e.fresh || !env.alive() {
		return r, NotServing
	}
	if replica >= 0 {
		if replica > 1 || replica != r.seg {
			return r, NotServing // ReadReplica/WriteReplica name the replica on this node
		}
		if !rec.DRLOff && write {
			return r, BadRequest // only for an RLDev whose client keeps its own log
		}
	}
	if !r.ready() || r.target || r.switching() || r.stale() && !(e.cfg.Unsafe.ServeStale && replica < 0) {
		return r, NotServing // a move's target serves nothing yet, its moving replica nothing more
	}
	if replica < 0 && rec.Primary != r.seg {
		return r, NotPrimary
	}
	return r, OK
}

// ------------------------------------------------------------------ time

// Tick runs the engine's timers: polls of unreachable peers, lazy clearing
// of dirty regions, resends, resync progress, and decrees to retry.
func (e *Engine) Tick(env Env) []any {
	e.env = env
	var out []any
	out = append(out, e.poll(env, false)...)
	if env.Now.Sub(e.lastFlush) >= e.cfg.FlushEvery {
		e.lastFlush = env.Now
		for _, r := range e.replicas() {
			out = append(out, r.lazyClear(env)...)
		}
	}
	if env.Now.Sub(e.lastRetry) >= e.cfg.RetryEvery {
		e.lastRetry = env.Now
		out = append(out, e.watchDisks(env)...)
		if !e.fresh && env.alive() {
			// Ask again until a linearizable read arrives: the runtime's
			// read for this engine may be lost (one begun for an earlier
			// incarnation holds the runtime's only slot, and its answer
			// goes to that incarnation), and nothing else asks while the
			// engine is not fresh (outside review 15).
			out = append(out, Refresh{})
		}
		for _, r := range e.replicas() {
			out = append(out, r.retry(env)...)
			r.landed.expire(env.Now) // an idle copy's memory too
		}
	}
	out = append(out, e.scrub(env)...)
	if e.cfg.CopyRate > 0 { // copies held back by the rate go on
		for _, id := range sortedIDs(e.reps) {
			r := e.reps[id]
			for _, s := range []*resyncSrc{r.resync, r.mv} {
				if r.live(s) {
					out = append(out, r.pump(env, s)...)
				}
			}
		}
	}
	out = append(out, e.hostPending(env)...)
	out = append(out, e.wipeTick()...)
	return append(out, e.decide(env)...)
}

func sortedDisks(m map[uint32]*diskState) []uint32 {
	ks := make([]uint32, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Slice(ks, func(i, j int) bool { return ks[i] < ks[j] })
	return ks
}

func sortedIDs(m map[uint64]*replica) []uint64 {
	ids := make([]uint64, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids
}

// ------------------------------------------------------------------ decrees

// decide proposes, in one decree, every change of the table the local
// replicas need now (one decree at a time; a failed one is retried from
// the next table).
func (e *Engine) decide(env Env) []any {
	if e.decreeOut || !e.fresh || !env.alive() || env.Now.Sub(e.decreeFailed) < e.cfg.RetryEvery {
		return nil
	}
	var ops []*pb.Op
	var what []string
	var out []any
	for _, k := range e.diskIx {
		d := e.disks[k]
		td := e.table.Disks[DiskKey{e.cfg.Node, k}]
		if td != nil && td.Forgotten && td.UUID == d.uuid {
			// Its node was forgotten, gone for good (forget.go): this
			// disk's extents hold what the table gave up; only a wiped
			// or new disk (another UUID) is registered.
			if !e.forgottenLogged[k] {
				e.forgottenLogged[k] = true
				out = append(out, e.logf(3, "rldev disk forgotten by an operator (grove rldev forget-node): not used; to store segments here again, wipe the whole disk (its old extents were never wiped), or use a new one", "disk", k, "path", d.path))
			}
			continue
		}
		if td == nil || td.UUID != d.uuid || td.Size != d.size || td.Path != d.path {
			ops = append(ops, PutDiskOp(&Disk{Node: e.cfg.Node, Index: k, Size: d.size, Path: d.path, UUID: d.uuid}))
			what = append(what, fmt.Sprintf("disk %d/%d registered", e.cfg.Node, k))
		}
	}
	for _, id := range e.decideIDs() {
		rec := e.table.RLDevs[id]
		if rec == nil {
			continue // a replica SetTable retires
		}
		var nr *Record
		var why []string
		for _, r := range []*replica{e.reps[id], e.tgts[id]} {
			if r == nil {
				continue
			}
			// The segment's change first; the target's (a node may hold
			// both) on top of it, if it still wants one there.
			base := nr
			if base == nil {
				base = rec
			}
			if x, w := r.want(env, base.Clone()); x != nil {
				nr, why = x, append(why, w)
			}
		}
		// Extents of the RLDev on this node's disks that are retiring:
		// wiped, then removed from the table (move.go).
		if x, w := e.wipeRetiring(env, rec, nr); x != nil {
			nr, why = x, append(why, w)
		}
		if nr != nil {
			if err := nr.Check(); err != nil {
				panic(fmt.Sprintf("rldev: the engine proposed a bad record (%s): %v", why, err))
			}
			ops = append(ops, nr.PutOp())
			what = append(what, fmt.Sprintf("rldev %d: %s", id, strings.Join(why, "; ")))
		}
	}
	if len(ops) == 0 && e.unsettled {
		for _, k := range e.diskIx {
			d := e.disks[k]
			nd := &Disk{Node: e.cfg.Node, Index: k, Size: d.size, Path: d.path, UUID: d.uuid}
			if td := e.table.Disks[DiskKey{e.cfg.Node, k}]; td != nil && td.Forgotten {
				nd = td // as it is: a forgotten disk stays so
			}
			ops = append(ops, PutDiskOp(nd))
			what = append(what, fmt.Sprintf("settling decree %d, unanswered: disk %d/%d as registered", e.decreeID, e.cfg.Node, k))
			break
		}
	}
	if len(ops) == 0 {
		return out
	}
	e.decreeOut = true
	e.unsure, e.unsettled = false, false
	e.decreeID++
	e.stats.Decrees++
	e.decreeVer = e.table.Version
	p := Propose{ID: e.decreeID, Version: e.table.Version, Ops: ops, What: fmt.Sprint(what)}
	return append(out, p, e.logf(1, "rldev decree proposed", "what", p.What, "version", p.Version))
}

// decideIDs returns, in order, the RLDevs decide may change: those this
// node holds a segment or a move's target of, and those with an extent
// retiring on its disks. Any other's record it leaves as it is (want is
// a replica's, wipeRetiring frees this node's extents only), and decide
// runs after every input: it sorted and went through every RLDev of the
// table at each disk completion and peer message, half a millisecond each
// on a node holding none of 4 000 (BenchmarkDecideManyRLDevs).
func (e *Engine) decideIDs() []uint64 {
	retiring := e.retiringIDs()
	ids := make([]uint64, 0, len(e.reps)+len(e.tgts)+len(retiring))
	for id := range e.reps {
		ids = append(ids, id)
	}
	for id := range e.tgts {
		if e.reps[id] == nil {
			ids = append(ids, id)
		}
	}
	for _, id := range retiring {
		if e.reps[id] == nil && e.tgts[id] == nil {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// retiringIDs returns, in order, the RLDevs of the table with an extent
// retiring on this node (found again when the table is replaced: SetTable
// replaces it whole, and nothing changes a table in place).
func (e *Engine) retiringIDs() []uint64 {
	if e.retiringOf != e.table {
		e.retiringOf, e.retiringHere = e.table, nil
		for _, id := range e.table.IDs() {
			for _, sg := range e.table.RLDevs[id].Retiring {
				if sg.Node == e.cfg.Node {
					e.retiringHere = append(e.retiringHere, id)
					break
				}
			}
		}
	}
	return e.retiringHere
}

// Decided is a decree's outcome. Committed or not, the table that follows
// (SetTable) says what holds; a failure is retried, recomputed from it.
func (e *Engine) Decided(env Env, id uint64, err error) []any {
	e.env = env
	if id != e.decreeID {
		return nil
	}
	e.decreeOut = false
	e.awaitTable = e.table.Version <= e.decreeVer // (a watch may have shown it already)
	e.unsure = e.awaitTable && err != nil
	if err != nil {
		e.decreeFailed = env.Now
		return []any{e.logf(1, "rldev decree not taken", "err", err), Refresh{}}
	}
	return []any{Refresh{}} // see its effect at once rather than when the watch says
}

// Incarnation is the engine's incarnation.
func (e *Engine) Incarnation() uint64 { return e.cfg.Inc }

// ReplicaStatus is one local replica as the engine sees it.
type ReplicaStatus struct {
	RLDev           uint64
	Segment         int
	State           string // loading, joining, ready, failed, retired; waiting (Wait)
	Stale, Primary  bool
	MoveTarget      bool // this node receives the segment by a move
	DirtyRegions    uint64
	DegradedRegions uint64
	Recovering      int
	Owed            int // of Recovering, the ranges owed by the peer's copy (owed.go)
	ResyncCopied    uint64
	ResyncTotal     uint64
	ScrubPasses     uint64
	ScrubRepaired   uint64
	ScrubNext       uint64
	Err             string
	// Wait says what the replica waits for before it goes on, if it
	// waits for something of this node's own: a failed replica's reload
	// for an operation of its failed life; a new one (State "waiting":
	// not loaded yet) for a retired replica's I/O on its extent.
	Wait string
	// Lost: the replica holds nothing to serve, whatever the table says
	// (its disk was replaced, or its segment is incomplete); Incomplete:
	// its superblock says it was formatted blank and not copied whole
	// since (grove rldev accept-stale refuses such a copy); Overwritten:
	// a full copy began writing onto it (Super.Overwritten).
	Lost, Incomplete, Overwritten bool
}

// Status describes the engine's replicas, by RLDev.
func (e *Engine) Status() []ReplicaStatus {
	var out []ReplicaStatus
	for _, r := range e.replicas() {
		st := ReplicaStatus{RLDev: r.rec.ID, Segment: r.seg, State: r.state.String(), Stale: r.stale(), Primary: r.isPrimary(), MoveTarget: r.target,
			Recovering: r.recovering(), Owed: r.owedCount(), ScrubPasses: r.scrub.passes, ScrubRepaired: r.scrub.repaired, ScrubNext: r.scrub.next,
			Lost: r.lost, Incomplete: r.super.Incomplete, Overwritten: r.super.Overwritten}
		if r.drl != nil {
			st.DirtyRegions = uint64(r.drl.durable.Count())
			st.DegradedRegions = uint64(r.deg.durable.Count())
		}
		if r.resync != nil {
			st.ResyncCopied, st.ResyncTotal = r.resync.copied, r.resync.total
		}
		if r.mv != nil {
			st.ResyncCopied, st.ResyncTotal = r.mv.copied, r.mv.total
		}
		if r.err != nil {
			st.Err = r.err.Error()
		}
		if r.state == repFailed && (r.reloadHeld || r.busy()) {
			st.Wait = "an operation of its failed life is still in progress: it loads again once that ends"
		}
		if r.state == repFailed && e.diskHung(r.disk) {
			st.Wait = "its disk is hung: it loads again once the disk answers"
		}
		if r.state == repLoading && r.dropAgain {
			st.Wait = fmt.Sprintf("pages of its segment were still cached after a drop (try %d of %d): it loads once they are gone", r.dropTries, maxDropTries)
		}
		out = append(out, st)
	}
	// Segments and move targets this node does not host yet: their
	// extent's retired replica still has I/O in progress (extentBusy).
	if len(e.waitLogged) > 0 && e.table != nil && e.fresh { // (as hostPending: a table not yet re-read may place them elsewhere)
		const why = "the I/O of a retired replica of its extent is still in progress"
		for _, id := range e.table.IDs() {
			rec := e.table.RLDevs[id]
			if seg := rec.SegmentOf(e.cfg.Node); seg >= 0 && e.reps[id] == nil && e.waitLogged[rec.Segs[seg]] {
				out = append(out, ReplicaStatus{RLDev: id, Segment: seg, State: "waiting", Stale: rec.Stale[seg], Primary: rec.Primary == seg, Wait: why})
			}
			if m := rec.Move; m != nil && m.To.Node == e.cfg.Node && e.tgts[id] == nil && e.waitLogged[m.To] {
				out = append(out, ReplicaStatus{RLDev: id, Segment: m.Seg, State: "waiting", MoveTarget: true, Wait: why})
			}
		}
	}
	return out
}
