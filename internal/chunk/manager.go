package chunk

import (
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"time"

	"github.com/grovestore/grove/internal/lock"
)

// Manager is one node's chunk manager of one pair (Boxwood §3.5) as a
// protocol core without I/O: inputs (the pair's record, client requests,
// the peer's messages, completions of the map RLDev's reads and writes, of
// the map lock's acquisitions, of failure-detector questions and decrees,
// ticks) return effects for the runtime to carry out. The runtime and the
// simulator drive the same code. A Manager lives for one node incarnation.
// Not safe for concurrent use.
//
// # Roles
//
// One manager of a pair is primary: it holds the map lock exclusively
// (the lease stays cached; it holds it locally for each change) and makes
// every allocation and free. The other is secondary: at start-up it takes
// the map lock shared (which revokes the primary's lease, so that the
// primary finishes its change in progress and makes no other), reads the
// map from the map RLDev, releases the lock and never takes it again; the
// primary then sends it every change (Update), and it applies them to its
// cached map. Either serves reads and writes of chunks, from its map.
//
// A secondary starts serving only after it read the map under the shared
// lock, which cannot happen while the primary holds the lock for a change,
// and which revokes the primary's lease (its next hold has a newer token).
// So, while the primary holds the lock, an answer "this manager serves
// nothing" (AckNotReady) from the peer, or a dead verdict on its
// incarnation, stays true; and between two holds with one token, no
// secondary started serving. A change is acknowledged to its client only
// once it is durable in the map's log and the peer has applied it, or
// answered that it serves nothing, or been declared dead: a client that
// reads through the secondary after an allocation or a free sees it. A
// secondary that lacks records the primary no longer has is told to read
// the map again (Reload). A partition between the two managers alone,
// both alive, stalls changes (reads and writes go on) until it heals.
//
// The secondary asks the failure detector about the primary's incarnation
// the pair's record names; once it is dead, and a linearizable read of the
// record still names it, the secondary takes the map lock exclusively and
// becomes primary (takeover, below). So may a restarted node whose past
// incarnation was the primary; the decree naming the new primary is
// conditional, a manager that finds another named gives the lock back and
// joins as secondary, and a primary whose lease was revoked checks, before
// its next change, that nobody else wrote the map meanwhile.
//
// # Takeover (becoming primary), and the durability contract
//
//  1. Take the map lock exclusively: token T.
//  2. Write the fence block of the map RLDev and of every data RLDev with
//     T: from then on they refuse every write of an earlier holder (a
//     paused or partitioned primary's log write, a zeroing still in
//     flight), so what is read next is all there is.
//  3. Read the superblock, the checkpoint and the log (the checkpoint plus
//     the log's frames in order, up to the first that is not valid). Ids
//     from the high-water mark on were never handed out; the next id is
//     the mark. Space freed by the replayed records, and the checkpoint's
//     quarantined runs, are quarantined anew.
//  4. If the log is half full, write a checkpoint.
//  5. Decree the pair's primary = this node's incarnation (conditional).
//
// A change (a batch of allocations and frees, group-committed): take the
// hold (cached); zero the new chunks' blocks (durable, fenced with T);
// append a frame of records to the log with T (durable) -- the change is
// then committed; apply it in memory; send it to the secondary and wait as
// above; reply; release the hold. Ids beyond the high-water mark are used
// only after a Reserve record raising it is in the same frame or an
// earlier one: an id is never handed out twice, across crashes.
//
// Freed space is quarantined for Config.Quarantine before it is reused
// (and so is space whose zeroing failed): a write that its writer was told
// failed may still land later (the RLDev's contract), and must not land in
// another chunk. The quarantine is written in every checkpoint and
// restarted at every load, so it holds across failovers. A map write that
// fails may also land later: the manager then gives its lease up (its
// token with it) and takes over again with a newer token, which refuses
// the late write. So it does when a map write or a zeroing succeeded on a
// retry while an earlier attempt may still land (ErrEarlierMayLand).
//
// Checkpoint: the map as of the last LSN is written to the inactive slot
// (durable), then the superblock names it, with the log's generation
// raised and its first LSN the next one (durable): from then on the old
// log's frames (of the old generation) are not read. A crash at any point
// leaves either the old checkpoint and the old log intact, or the new
// checkpoint and an empty log. Changes wait while it is written.
type Manager struct {
	cfg  Config
	pair *Pair
	ver  uint64 // the chunk namespace version pair was read at
	env  Env
	st   state
	why  error // the last failure, for status

	nextOp OpID
	ops    map[OpID]func(data []byte, err error) []any
	acqs   map[OpID]func(tok lock.Token, err error) []any
	decs   map[OpID]func(ver uint64, err error) []any

	// The map, once loaded (nil before, and after a stop).
	m       *chunkMap
	sup     Super  // the current superblock
	logPos  uint64 // block of the next frame
	retryAt time.Time

	// Primary.
	holdOp  OpID       // the acquisition in flight (0: none)
	holding bool       // the map lock is held here now
	token   lock.Token // the last hold's token
	queue   []*request
	batch   []*request  // the change in progress
	busy    bool        // a change or a checkpoint is in progress
	syncing bool        // a new primary brings the secondary up to date before it takes requests
	recent  []lsnRecord // records the secondary has not acknowledged
	peer    peerState
	idNext  uint64     // the next id to hand out (the high-water mark at a load)
	waitAck *ackWaiter // the change waiting for the secondary

	// Secondary.
	maxToken lock.Token        // newest primary token seen in an Update
	drainLSN map[uint64]uint64 // freed chunks whose I/O here has not finished, and their free's LSN (acknowledged once drained)
	ackTo    NodeID            // the node of the last Update (acknowledgements of drains go there)

	// I/O admitted here and not finished, by chunk id: a free waits for
	// it. It outlives a reload of the map (I/O admitted before may still
	// be in flight).
	inflight map[uint64]int

	// A takeover is decided on a linearizable read of the pair made after
	// the named primary was found dead (a watch may lag behind a takeover
	// that already happened).
	wantFresh, fresh bool

	// Failure-detector questions about the pair's primary (secondary and
	// waiting) or the secondary (primary).
	asked    map[Subject]time.Time // questions in flight (Inc 0: the node's registered incarnation), and when asked
	lastAsk  map[Subject]time.Time
	deadSeen map[Subject]bool
}

// Config configures a manager.
type Config struct {
	Node NodeID
	Inc  uint64 // this node incarnation: a manager belongs to one
	CM   uint32
	// RetryEvery is how often an unanswered update is sent again and a
	// failed manager starts again (default 500 ms).
	RetryEvery time.Duration
	// PollEvery is how often the failure detector is asked about the peer
	// (default 500 ms).
	PollEvery time.Duration
	// ReserveStep is how many ids a Reserve record sets aside (default
	// 1024).
	ReserveStep uint64
	// MaxBatch bounds the allocations and frees of one change (default
	// 1000).
	MaxBatch int
	// Quarantine is how long freed space waits before it is reused: longer
	// than a write can land after its writer was told it failed (the RLDev
	// data path gives a request 30 s to arrive). Default 30 s.
	Quarantine time.Duration
	// ResvLife is how long a reservation stays open without its clerk's
	// commit: then the primary keeps every chunk of it (the clerk may have
	// handed any out before it went away). Default 60 s; at every load
	// (a takeover) it starts again.
	ResvLife time.Duration

	// unsafe switches a rule off: for the simulation's teeth test only,
	// which shows that its oracle catches what each rule prevents.
	unsafe unsafeRules
}

type unsafeRules struct {
	noPeerWait   bool // acknowledge changes without the secondary
	noReserve    bool // hand out ids without raising the high-water mark first
	noQuarantine bool // reuse freed space at once
	noFence      bool // take over without fencing earlier holders' writes
	anyAckToken  bool // take a secondary's answers to an earlier lease's messages
	expiryFrees  bool // end an uncommitted reservation keeping none of its chunks
	retireIgnore bool // allocate for a retired owner
	ownersLost   bool // checkpoints without the chunks' owners
}

func (c *Config) defaults() {
	if c.RetryEvery == 0 {
		c.RetryEvery = 500 * time.Millisecond
	}
	if c.PollEvery == 0 {
		c.PollEvery = 500 * time.Millisecond
	}
	if c.ReserveStep == 0 {
		c.ReserveStep = 1024
	}
	if c.MaxBatch == 0 {
		c.MaxBatch = 1000
	}
	if c.Quarantine == 0 {
		c.Quarantine = 30 * time.Second
	}
	if c.ResvLife == 0 {
		c.ResvLife = 60 * time.Second
	}
}

// NodeID names a node; OpID an operation the manager asked the runtime for;
// ReqID a client request the runtime handed the manager.
type (
	NodeID = uint64
	OpID   uint64
	ReqID  uint64
)

// Subject is a node incarnation.
type Subject struct{ Node, Inc uint64 }

// Env is what the manager knows of the world at one step: the local time
// and the deadline until which its incarnation is guaranteed alive (the
// failure detector's self-fence; zero: not alive). A manager serves only
// before the deadline.
type Env struct {
	Now      time.Time
	Deadline time.Time
}

func (env Env) alive() bool { return !env.Deadline.IsZero() && env.Now.Before(env.Deadline) }

type state int

const (
	stWaiting   state = iota // for the table, or to decide
	stJoining                // becoming secondary: shared lock, then the map
	stTakeover               // becoming primary: exclusive lock, fences, the map, decree
	stSecondary              // serving, applying the primary's updates
	stPrimary                // serving, changing the map
	stFailed                 // a map I/O failed or the map does not decode: starts again at retryAt
)

func (s state) String() string {
	return [...]string{"waiting", "joining", "taking over", "secondary", "primary", "failed"}[s]
}

// Effects the runtime carries out.
type (
	// MapRead reads Blocks blocks of the pair's map RLDev from Block; the
	// runtime calls Done(Op, data, err).
	MapRead struct {
		Op            OpID
		Block, Blocks uint64
	}
	// MapWrite writes Data (whole blocks) at Block of the map RLDev (or
	// of data RLDev RLDev, if not 0: its fence block), with the map lock's
	// token as the write's fence; Done(Op, nil, err) once it is durable,
	// or failed.
	MapWrite struct {
		Op    OpID
		RLDev uint64
		Block uint64
		Data  []byte
		Token lock.Token
	}
	// ZeroWrite writes zeros over Blocks blocks of data RLDev RLDev from
	// Block (a new chunk's space), fenced with the map lock's Token;
	// Done(Op, nil, err) once durable.
	ZeroWrite struct {
		Op            OpID
		RLDev         uint64
		Block, Blocks uint64
		Token         lock.Token
	}
	// Acquire takes the pair's map lock in Mode (a cached lease answers at
	// once); the runtime calls Granted(Op, token, err).
	Acquire struct {
		Op   OpID
		Mode lock.Mode
	}
	// CancelAcquire gives up acquisition Op (Granted(Op, ...) may still
	// come, with an error, or with a hold the manager releases).
	CancelAcquire struct{ Op OpID }
	// Release ends the manager's hold on the map lock; the lease stays
	// cached unless Drop (then it goes back to the lock service, and the
	// next grant has a newer token).
	Release struct{ Drop bool }
	// Send delivers Msg to the chunk manager of the same pair on node To.
	Send struct {
		To  NodeID
		Msg any
	}
	// Reply ends client request Req.
	Reply struct {
		Req    ReqID
		Handle Handle
		Err    error
	}
	// AskDead asks the failure detector whether Subject is dead (Inc 0:
	// the node's registered incarnation); the runtime calls Verdict with
	// what was asked and the incarnation the answer is about.
	AskDead struct{ Subject Subject }
	// Propose puts Pair in the chunk namespace, conditional on Version;
	// the runtime calls Decided(Op, version, err). The table the manager
	// acts on arrives separately too (SetPair).
	Propose struct {
		Op      OpID
		Version uint64
		Pair    *Pair
		What    string
	}
	// Refresh asks for a linearizable read of the pair's record (SetPair
	// with fresh set).
	Refresh struct{}
	// Log is a line for the node's log.
	Log struct {
		Level int // 0 debug, 1 info, 2 warn, 3 error
		Msg   string
		Args  []any
	}
)

// Peer messages.
type (
	// Update carries the primary's records from LSN First on.
	Update struct {
		CM      uint32
		Token   lock.Token // the primary's map lock token (newer wins)
		First   uint64
		Records []Record
	}
	// Ack answers an Update or a Reload: Code, the secondary's
	// incarnation, the last LSN it applied (and whose frees drained), and
	// the token of the message it answers (a late or duplicated answer
	// says which hold of the primary it is about).
	Ack struct {
		CM    uint32
		Code  AckCode
		Inc   uint64
		LSN   uint64
		Token lock.Token
	}
	// Reload tells a secondary that lacks records the primary no longer
	// has to stop serving and read the map again (it answers AckNotReady).
	Reload struct {
		CM    uint32
		Token lock.Token
	}
)

// AckCode is an Ack's outcome.
type AckCode int

const (
	AckOK       AckCode = iota // applied through LSN
	AckNotReady                // this manager serves nothing (it has not read the map)
	AckStale                   // a newer primary's token was seen: this one is deposed
	AckGap                     // records before First are missing: it has LSN
)

type lsnRecord struct {
	lsn uint64
	r   Record
}

// peerState is the primary's view of the secondary (see Manager).
type peerState struct {
	// serving: the peer may be serving with a map of its own: a change
	// waits for its acknowledgement, or for it to say (or the failure
	// detector to say) that it serves nothing.
	serving bool
	inc     uint64    // its incarnation (0: not heard from yet)
	acked   uint64    // the last LSN it acknowledged
	at      time.Time // when the last update was sent
	since   time.Time // when this view began: a verdict counts if asked since
}

// ackWaiter is a change waiting for the secondary.
type ackWaiter struct {
	lsn  uint64
	then func() []any
}

// request is a client's allocation, free, reservation or commit at the
// primary.
type request struct {
	req    ReqID
	alloc  bool
	owner  Owner    // alloc: its owner (none: zero); retire: the log and the token below which
	resv   bool     // a reservation of count chunks of size bytes
	commit bool     // the end of reservation id: live are its chunks to keep
	disown bool     // the owners of live lose them
	retire bool     // the owners of log owner.Log below owner.Token are retired
	size   uint64   // alloc, resv
	count  uint64   // resv
	id     uint64   // free, commit
	live   []uint64 // commit
	extra  []ReqID  // more requests for the same free or commit (a client's retry), answered with it
	// other: commits of the same reservation with another live list (or
	// arriving while its expiry ends it): once this one is done they are
	// answered ErrUnallocated, so that their clerk frees what it did not
	// keep, after this request's allocations are in the map.
	other []ReqID
	// during a change
	ext  Extent
	done bool
}

func (q *request) isFree() bool { return !q.alloc && !q.resv && !q.commit && !q.disown && !q.retire }

// records is how many log records q takes (a bound on a change's frame).
func (q *request) records() int {
	switch {
	case q.resv:
		return 2
	case q.commit:
		return len(q.live) + 1
	case q.disown:
		return len(q.live)
	case q.alloc && !q.owner.IsZero():
		return 2 // 57 bytes: a frame's budget counts plain records (33 bytes at most)
	}
	return 1
}

// NewManager returns a manager waiting for its pair's record.
func NewManager(cfg Config) *Manager {
	cfg.defaults()
	return &Manager{cfg: cfg, ops: map[OpID]func([]byte, error) []any{}, acqs: map[OpID]func(lock.Token, error) []any{},
		decs: map[OpID]func(uint64, error) []any{}, drainLSN: map[uint64]uint64{}, inflight: map[uint64]int{},
		asked: map[Subject]time.Time{}, lastAsk: map[Subject]time.Time{}, deadSeen: map[Subject]bool{}}
}

func (mg *Manager) logf(level int, msg string, args ...any) Log {
	return Log{Level: level, Msg: msg, Args: append([]any{"cm", mg.cfg.CM}, args...)}
}

// ------------------------------------------------------------------ inputs

// SetPair gives the manager its pair's record as of namespace version ver
// (from the watch, or, fresh, from a linearizable read: the answer to a
// Refresh); nil: the pair is gone or does not include this node.
func (mg *Manager) SetPair(env Env, p *Pair, ver uint64, fresh bool) []any {
	mg.env = env
	if fresh {
		mg.wantFresh, mg.fresh = false, true
	}
	if ver >= mg.ver {
		mg.ver = ver
		if p != nil {
			p = p.Clone()
		}
		mg.pair = p
	}
	return mg.decide(env)
}

// Tick lets time pass: retries, polls of the failure detector, the end of
// quarantines.
func (mg *Manager) Tick(env Env) []any {
	mg.env = env
	var out []any
	if mg.m != nil {
		mg.m.expire(env.Now)
	}
	out = append(out, mg.expireResv(env)...)
	if mg.st == stPrimary && mg.waitAck != nil && env.Now.Sub(mg.peer.at) >= mg.cfg.RetryEvery {
		// The secondary has not answered: send again, and ask whether it
		// is dead (the incarnation last heard from; 0: the node's
		// registered one).
		out = append(out, mg.sendUpdate(env)...)
		out = append(out, mg.ask(env, Subject{mg.pair.Peer(mg.cfg.Node), mg.peer.inc})...)
	}
	return append(out, mg.decide(env)...)
}

// Done delivers the completion of a MapRead, MapWrite or ZeroWrite.
func (mg *Manager) Done(env Env, op OpID, data []byte, err error) []any {
	mg.env = env
	fn := mg.ops[op]
	if fn == nil {
		return nil
	}
	delete(mg.ops, op)
	return append(fn(data, err), mg.decide(env)...)
}

// Granted delivers the outcome of an Acquire.
func (mg *Manager) Granted(env Env, op OpID, tok lock.Token, err error) []any {
	mg.env = env
	fn := mg.acqs[op]
	if fn == nil {
		if err == nil {
			return []any{Release{}} // given up meanwhile
		}
		return nil
	}
	delete(mg.acqs, op)
	return append(fn(tok, err), mg.decide(env)...)
}

// Decided delivers the outcome of a Propose: the namespace version the
// decree made, or why it failed.
func (mg *Manager) Decided(env Env, op OpID, ver uint64, err error) []any {
	mg.env = env
	fn := mg.decs[op]
	if fn == nil {
		return nil
	}
	delete(mg.decs, op)
	return append(fn(ver, err), mg.decide(env)...)
}

// Verdict delivers the failure detector's answer to AskDead{asked}: about
// incarnation inc (asked.Inc, or the one registered when asked.Inc was 0).
func (mg *Manager) Verdict(env Env, asked Subject, inc uint64, dead bool) []any {
	mg.env = env
	askedAt, ok := mg.asked[asked]
	if !ok {
		return nil // not a question of this manager's present life
	}
	delete(mg.asked, asked)
	if !dead || inc == 0 {
		return mg.decide(env)
	}
	s := Subject{asked.Node, inc}
	mg.deadSeen[s] = true
	var out []any
	if mg.pair != nil && s == (Subject{mg.pair.PrimaryNode(), mg.pair.PrimaryInc}) && !mg.wantFresh {
		mg.wantFresh, mg.fresh = true, false
		out = append(out, Refresh{})
	}
	if mg.st == stPrimary && mg.peer.serving && s.Node == mg.pair.Peer(mg.cfg.Node) && s.Inc >= mg.peer.inc && !askedAt.Before(mg.peer.since) {
		// The secondary has fenced itself (and every incarnation before):
		// changes stop waiting for it; it reads the map again when it
		// comes back. Only an answer to a question asked since the peer
		// may have joined counts: an older one may be about an
		// incarnation before the one that joined.
		out = append(out, mg.logf(1, "chunk manager: the secondary is dead; changes go on without it", "node", s.Node, "incarnation", s.Inc))
		out = append(out, mg.peerNotServing(s.Inc)...)
	}
	return append(out, mg.decide(env)...)
}

// Allocate asks for a chunk of size bytes (the primary only).
func (mg *Manager) Allocate(env Env, req ReqID, size uint64) []any {
	return mg.AllocateOwned(env, req, size, Owner{})
}

// AllocateOwned asks for a chunk of size bytes that owner (if not zero)
// will link, or give back (the primary only): the chunk keeps owner's tag
// until Disown, so that Owned finds it if the owner dies first. An owner
// retired (Retire) when the change is made is refused: ErrRetired.
func (mg *Manager) AllocateOwned(env Env, req ReqID, size uint64, owner Owner) []any {
	mg.env = env
	switch {
	case size == 0:
		return mg.reply(req, Handle{}, fmt.Errorf("%w: a chunk of 0 bytes", ErrBadRequest))
	case size > MaxChunk:
		return mg.reply(req, Handle{}, fmt.Errorf("%w: %d bytes (at most %d)", ErrTooLarge, size, MaxChunk))
	}
	if err := mg.primaryReady(env); err != nil {
		return mg.reply(req, Handle{}, err)
	}
	if owner.IsZero() {
		owner = Owner{}
	}
	mg.queue = append(mg.queue, &request{req: req, alloc: true, size: size, owner: owner})
	return mg.pump(env)
}

// MaxDisown bounds the chunks of one Disown.
const MaxDisown = 1000

// Disown takes the owner tag off chunks ids (the primary only): their
// owner has linked them durably. Ids that are not allocated, or have no
// owner, are skipped (a retry of a disown that took effect); the answer
// says only that every id named is without an owner now.
func (mg *Manager) Disown(env Env, req ReqID, ids []uint64) []any {
	mg.env = env
	if len(ids) == 0 || len(ids) > MaxDisown {
		return mg.reply(req, Handle{}, fmt.Errorf("%w: a disown of %d chunks (1 to %d)", ErrBadRequest, len(ids), MaxDisown))
	}
	if err := mg.primaryReady(env); err != nil {
		return mg.reply(req, Handle{}, err)
	}
	mg.queue = append(mg.queue, &request{req: req, disown: true, live: slices.Clone(ids)})
	return mg.pump(env)
}

// Retire makes the pair refuse, from the answer on, every allocation for
// an owner of log whose token is below below (the primary only): the
// recovery of a dead owner's log retires it before it lists what the dead
// owner left (Owned), so that an allocation of the dead owner's still in
// flight cannot add to that list afterwards. Retiring below a token at or
// below the log's current mark does nothing.
func (mg *Manager) Retire(env Env, req ReqID, log uint64, below lock.Token) []any {
	mg.env = env
	if log == 0 || below.IsZero() {
		return mg.reply(req, Handle{}, fmt.Errorf("%w: a retirement of log %d below %v", ErrBadRequest, log, below))
	}
	if err := mg.primaryReady(env); err != nil {
		return mg.reply(req, Handle{}, err)
	}
	mg.queue = append(mg.queue, &request{req: req, retire: true, owner: Owner{Log: log, Token: below}})
	return mg.pump(env)
}

// Owned lists (the primary only), in order, the chunks after id after
// that an owner of log below token below allocated and has not disowned,
// nor freed or begun to free: up to limit of them, and whether there are
// more. It reads the map as it is: a change is in it once logged at the
// primary (before the secondary acknowledged it, and before its answer),
// not before.
func (mg *Manager) Owned(env Env, log uint64, below lock.Token, after uint64, limit int) ([]uint64, bool, error) {
	mg.env = env
	if err := mg.primaryReady(env); err != nil {
		return nil, false, err
	}
	if limit < 1 {
		limit = 1
	}
	ids, more := mg.m.ownedBy(log, below, after, limit)
	return ids, more, nil
}

// Free asks for chunk id's deallocation (the primary only). I/O admitted
// on it drains first; none is admitted meanwhile.
func (mg *Manager) Free(env Env, req ReqID, id uint64) []any {
	mg.env = env
	if err := mg.primaryReady(env); err != nil {
		return mg.reply(req, Handle{}, err)
	}
	e := mg.m.chunks[id]
	if e == nil || e.freeing {
		// A free of it under way (a client's retry; its change may be
		// logged already and not acknowledged by the secondary yet) is
		// answered with it.
		for _, q := range append(mg.batch, mg.queue...) {
			if q.isFree() && q.id == id && !q.done {
				q.extra = append(q.extra, req)
				return nil
			}
		}
	}
	if e == nil {
		return mg.reply(req, Handle{}, fmt.Errorf("%w: %s", ErrUnallocated, Handle{mg.cfg.CM, id}))
	}
	if e.freeing {
		panic(fmt.Sprintf("chunk: chunk %d freeing without its free", id))
	}
	e.freeing = true
	mg.queue = append(mg.queue, &request{req: req, id: id})
	return mg.pump(env)
}

// Reserve asks for a reservation (the primary only): count chunks of size
// bytes, zeroed, their ids and space set aside for one clerk, which hands
// them out without asking (Boxwood's allocation batching, §4.3) and ends
// the reservation with Commit. The reply's handle is the reservation's id
// R; its chunks are R+1..R+count. Until the commit, the chunks are not
// readable; if no commit comes within ResvLife, every chunk of it is kept.
func (mg *Manager) Reserve(env Env, req ReqID, size uint64, count int) []any {
	mg.env = env
	switch {
	case size == 0 || count < 1 || count > MaxReserve:
		return mg.reply(req, Handle{}, fmt.Errorf("%w: a reservation of %d chunks of %d bytes (1 to %d chunks)", ErrBadRequest, count, size, MaxReserve))
	case size > MaxChunk:
		return mg.reply(req, Handle{}, fmt.Errorf("%w: %d bytes (at most %d)", ErrTooLarge, size, MaxChunk))
	case uint64(count)*blocksFor(size) > MaxChunk/BlockSize*4:
		return mg.reply(req, Handle{}, fmt.Errorf("%w: a reservation of %d chunks of %d bytes (at most %d MiB in all)", ErrTooLarge, count, size, 4*MaxChunk>>20))
	}
	if err := mg.primaryReady(env); err != nil {
		return mg.reply(req, Handle{}, err)
	}
	mg.queue = append(mg.queue, &request{req: req, resv: true, size: size, count: uint64(count)})
	return mg.pump(env)
}

// Commit ends reservation resv (the primary only): the chunks in live
// become allocated chunks; the reservation's other chunks are never
// allocated (their ids are never used; their space is freed). A
// reservation that is not open (committed already, or kept whole after
// ResvLife) is answered with ErrUnallocated: its clerk then frees what
// it does not keep, one by one. A commit that finds one of the same
// reservation under way is answered with it if its list is the same (a
// retry); otherwise (another list, or the expiry already begun) with
// ErrUnallocated once that one is done. A clerk must send one list per
// reservation (the Batcher seals it at its first attempt).
func (mg *Manager) Commit(env Env, req ReqID, resv uint64, live []uint64) []any {
	mg.env = env
	if err := mg.primaryReady(env); err != nil {
		return mg.reply(req, Handle{}, err)
	}
	rv := mg.m.resv[resv]
	if rv == nil {
		// A commit of it may be under way: logged (so the reservation is
		// closed here) and not yet acknowledged by the secondary, which
		// still has it open. Answered now, "not open" would let the clerk
		// use the chunks it kept through the secondary, which would say
		// they are reserved, not allocated: it is answered with that
		// commit instead (as Free does with a free under way).
		for _, q := range mg.batch {
			if q.commit && q.id == resv && !q.done {
				if q.req != 0 && slices.Equal(q.live, live) {
					q.extra = append(q.extra, req)
				} else {
					q.other = append(q.other, req)
				}
				return nil
			}
		}
		return mg.reply(req, Handle{}, fmt.Errorf("%w: reservation %s is not open (committed, or its chunks were all kept when no commit came)", ErrUnallocated, Handle{mg.cfg.CM, resv}))
	}
	seen := map[uint64]bool{}
	for _, id := range live {
		if !rv.Holds(id) || seen[id] {
			return mg.reply(req, Handle{}, fmt.Errorf("%w: chunk %d is not one of reservation %d's (%d to %d), or named twice", ErrBadRequest, id, resv, resv+1, resv+rv.Count))
		}
		seen[id] = true
	}
	for _, q := range mg.queue {
		if q.commit && q.id == resv && !q.done && q.req == 0 {
			// The reservation's expiry, not begun yet: the clerk's own
			// list ends it instead.
			q.req, q.live = req, append([]uint64(nil), live...)
			return nil
		}
	}
	for _, q := range append(mg.batch, mg.queue...) {
		if q.commit && q.id == resv && !q.done {
			if q.req != 0 && slices.Equal(q.live, live) {
				q.extra = append(q.extra, req) // a retry: answered with the first
			} else {
				q.other = append(q.other, req) // answered "not open" once it is done
			}
			return nil
		}
	}
	rv.ending = true
	mg.queue = append(mg.queue, &request{req: req, commit: true, id: resv, live: append([]uint64(nil), live...)})
	return mg.pump(env)
}

// expireResv ends the reservations whose clerk did not commit within
// ResvLife, keeping all their chunks (the primary only).
func (mg *Manager) expireResv(env Env) []any {
	if mg.st != stPrimary || mg.m == nil || mg.syncing {
		return nil
	}
	var out []any
	ids := make([]uint64, 0, len(mg.m.resv))
	for id := range mg.m.resv {
		ids = append(ids, id)
	}
	slices.Sort(ids) // one order, so that a simulation replays
	for _, id := range ids {
		rv := mg.m.resv[id]
		if rv.ending || env.Now.Before(rv.until) {
			continue
		}
		rv.ending = true
		all := make([]uint64, 0, rv.Count)
		for i := uint64(1); i <= rv.Count && !mg.cfg.unsafe.expiryFrees; i++ {
			all = append(all, rv.ID+i)
		}
		out = append(out, mg.logf(1, "chunk manager: a reservation was not committed in time; all its chunks are kept", "reservation", rv.ID, "chunks", rv.Count))
		mg.queue = append(mg.queue, &request{commit: true, id: rv.ID, live: all})
	}
	if len(out) > 0 {
		out = append(out, mg.pump(env)...)
	}
	return out
}

func (mg *Manager) primaryReady(env Env) error {
	switch {
	case mg.st == stSecondary:
		return fmt.Errorf("%w (chunk manager %d on node %d)", ErrNotPrimary, mg.cfg.CM, mg.cfg.Node)
	case mg.st != stPrimary || !env.alive():
		return fmt.Errorf("%w: chunk manager %d on node %d is %s", ErrNotServing, mg.cfg.CM, mg.cfg.Node, mg.st)
	case mg.syncing:
		return fmt.Errorf("%w: chunk manager %d on node %d is bringing its secondary up to date", ErrNotServing, mg.cfg.CM, mg.cfg.Node)
	}
	return nil
}

// Admit admits a read or write of n bytes at off of chunk id: its extent,
// once the manager serves and the range is inside the chunk. The caller
// does the I/O on the extent's RLDev and then calls Finished: until then a
// free of the chunk waits.
func (mg *Manager) Admit(env Env, id, off, n uint64) (Extent, error) {
	mg.env = env
	if (mg.st != stPrimary && mg.st != stSecondary) || !env.alive() || mg.m == nil {
		return Extent{}, fmt.Errorf("%w: chunk manager %d on node %d is %s", ErrNotServing, mg.cfg.CM, mg.cfg.Node, mg.st)
	}
	e := mg.m.chunks[id]
	if e == nil && mg.st == stPrimary {
		for _, q := range mg.batch {
			if q.isFree() && q.id == id && !q.done {
				e = &entry{freeing: true} // freed by the change in progress
			}
		}
	}
	if e == nil {
		if rv := mg.m.resvOf(id); rv != nil {
			return Extent{}, fmt.Errorf("%w: %s is reserved for a batching clerk that has not sent it yet", ErrUnallocated, Handle{mg.cfg.CM, id})
		}
		return Extent{}, fmt.Errorf("%w: %s", ErrUnallocated, Handle{mg.cfg.CM, id})
	}
	if e.freeing {
		// Until the free is acknowledged (the secondary may still serve
		// the chunk), neither "allocated" nor "not allocated" can be
		// answered: the client tries again.
		return Extent{}, fmt.Errorf("%w: chunk %s is being freed", ErrNotServing, Handle{mg.cfg.CM, id})
	}
	if off > e.Len || n > e.Len-off {
		return Extent{}, fmt.Errorf("%w: %d bytes at %d of chunk %s (%d bytes)", ErrOutOfRange, n, off, Handle{mg.cfg.CM, id}, e.Len)
	}
	mg.inflight[id]++
	return e.Extent, nil
}

// Finished ends I/O admitted on chunk id.
func (mg *Manager) Finished(env Env, id uint64) []any {
	mg.env = env
	if mg.inflight[id] == 0 {
		panic(fmt.Sprintf("chunk: Finished(%d) without Admit", id))
	}
	if mg.inflight[id]--; mg.inflight[id] > 0 {
		return nil
	}
	delete(mg.inflight, id)
	out := mg.flushAcks(env)
	return append(out, mg.pump(env)...)
}

// Status is what a manager reports (grove chunk stat).
type Status struct {
	CM                    uint32
	Role                  string
	Err                   string
	Chunks                uint64
	FreeBlocks, Largest   uint64
	FreeRuns              int
	QuarantinedBlocks     uint64
	LSN, HighWater        uint64
	LogUsed, LogBlocks    uint64
	Checkpoint, MaxChunks uint64
	Peer                  string
}

// Status reports the manager's state.
func (mg *Manager) Status() Status {
	s := Status{CM: mg.cfg.CM, Role: mg.st.String()}
	if mg.why != nil {
		s.Err = mg.why.Error()
	}
	if mg.m != nil {
		s.Chunks = uint64(len(mg.m.chunks))
		s.FreeBlocks, s.Largest, s.FreeRuns, s.QuarantinedBlocks = mg.m.freeBlocks()
		s.LSN, s.HighWater = mg.m.lsn, mg.m.hw
		s.LogUsed, s.LogBlocks = mg.logPos-blockLog, uint64(mg.sup.Layout.LogBlocks)
		s.Checkpoint, s.MaxChunks = uint64(mg.sup.CkBlocks), mg.sup.Layout.MaxEntries()
	}
	if mg.st == stPrimary {
		switch {
		case mg.peer.serving && mg.peer.inc != 0:
			s.Peer = fmt.Sprintf("secondary incarnation %d, acknowledged through %d", mg.peer.inc, mg.peer.acked)
		case mg.peer.serving:
			s.Peer = "secondary not heard from yet"
		default:
			// Said at the primary's start, often: its secondary was still
			// loading. One that joined since revoked this primary's lease,
			// which the primary learns at its next change.
			s.Peer = "secondary not serving when last heard from (one that joined since gets the next change)"
		}
	}
	return s
}

// ------------------------------------------------------------------ roles

// decide starts what the manager's state and the pair's record call for.
func (mg *Manager) decide(env Env) []any {
	p := mg.pair
	if p == nil || !p.Has(mg.cfg.Node) {
		if mg.st != stWaiting && mg.st != stFailed {
			return mg.stop(env, fmt.Errorf("%w: the pair no longer includes node %d", ErrNotServing, mg.cfg.Node))
		}
		return nil
	}
	me := Subject{mg.cfg.Node, mg.cfg.Inc}
	named := Subject{p.PrimaryNode(), p.PrimaryInc}
	switch mg.st {
	case stFailed:
		if env.Now.Before(mg.retryAt) {
			return nil
		}
		mg.st = stWaiting
		return mg.decide(env)
	case stWaiting:
		if !env.alive() {
			return nil
		}
		switch {
		case p.PrimaryInc == 0 && named.Node == mg.cfg.Node:
			return mg.takeover(env, "the pair's first primary")
		case p.PrimaryInc == 0:
			return nil // the named node formats the map first
		case named == me:
			return mg.takeover(env, "named primary")
		case mg.deadSeen[named]:
			return mg.whenFresh(func() []any { return mg.takeover(env, "the primary is dead") })
		default:
			// Join as secondary, and keep asking about the primary.
			out := mg.ask(env, named)
			return append(out, mg.join(env)...)
		}
	case stSecondary:
		if mg.dataChanged() {
			// An operator added a data RLDev: read the map again, knowing it.
			out := mg.stop(env, fmt.Errorf("%w: the pair's data RLDevs changed; reading the map again", ErrNotServing))
			return append(out, mg.decide(env)...)
		}
		if mg.deadSeen[named] {
			return mg.whenFresh(func() []any {
				mg.st, mg.m = stWaiting, nil
				return append([]any{mg.logf(1, "chunk manager: the primary is dead; taking over", "node", named.Node, "incarnation", named.Inc)}, mg.decide(env)...)
			})
		}
		return mg.ask(env, named)
	case stPrimary:
		if named != me && !mg.busy {
			// Another manager was decreed primary: give way.
			return mg.stop(env, fmt.Errorf("%w: node %d incarnation %d is the pair's primary now", ErrNotPrimary, named.Node, named.Inc))
		}
		if mg.dataChanged() && !mg.busy {
			// An operator added a data RLDev: take over again (which
			// fences it with a newer token before anything is allocated
			// on it, and loads the map knowing it).
			out := mg.stop(env, fmt.Errorf("%w: the pair's data RLDevs changed; loading the map again", ErrNotServing))
			return append(out, mg.decide(env)...)
		}
	}
	return nil
}

// dataChanged reports whether the pair names a data RLDev the loaded map
// does not know (data RLDevs are only ever added).
func (mg *Manager) dataChanged() bool {
	if mg.m == nil {
		return false
	}
	for _, d := range mg.pair.Data {
		if mg.m.spaces[d.ID] == nil {
			return true
		}
	}
	return false
}

// whenFresh runs then once a linearizable read of the pair has come since
// the primary was found dead (decide runs again when it comes).
func (mg *Manager) whenFresh(then func() []any) []any {
	switch {
	case mg.fresh:
		return then()
	case !mg.wantFresh:
		mg.wantFresh = true
		return []any{Refresh{}}
	}
	return nil
}

// ask asks the failure detector about s, at most once per PollEvery (and
// again if an answer is long in coming).
func (mg *Manager) ask(env Env, s Subject) []any {
	if at, ok := mg.asked[s]; mg.deadSeen[s] || ok && env.Now.Sub(at) < mg.cfg.PollEvery*4 {
		return nil
	}
	if at, ok := mg.lastAsk[s]; ok && env.Now.Sub(at) < mg.cfg.PollEvery {
		return nil
	}
	mg.asked[s], mg.lastAsk[s] = env.Now, env.Now
	return []any{AskDead{Subject: s}}
}

// stop ends the current role (failures, deposition): replies to every
// waiting client, gives the lease back, forgets the map.
func (mg *Manager) stop(env Env, why error) []any {
	var out []any
	// The change in progress may be in the map's log already (a new
	// primary replays it): its requests may have taken effect.
	maybe := why
	if !errors.Is(why, ErrMaybeDone) {
		maybe = fmt.Errorf("%w (%w)", why, ErrMaybeDone)
	}
	for _, q := range mg.batch {
		if !q.done {
			out = append(out, mg.answer(q, Handle{}, maybe)...)
		}
	}
	for _, q := range mg.queue {
		if !q.done {
			out = append(out, mg.answer(q, Handle{}, why)...)
		}
	}
	mg.queue, mg.batch = nil, nil
	if mg.holding {
		out = append(out, Release{Drop: true})
		mg.holding = false
	} else if mg.st == stPrimary || mg.st == stTakeover {
		out = append(out, Release{Drop: true}) // no hold: give the cached lease back all the same
	}
	if mg.holdOp != 0 {
		delete(mg.acqs, mg.holdOp)
		out = append(out, CancelAcquire{mg.holdOp})
		mg.holdOp = 0
	}
	mg.ops = map[OpID]func([]byte, error) []any{}
	mg.decs = map[OpID]func(uint64, error) []any{}
	mg.acqs = map[OpID]func(lock.Token, error) []any{}
	mg.m, mg.busy, mg.syncing, mg.peer, mg.recent, mg.waitAck = nil, false, false, peerState{}, nil, nil
	mg.drainLSN, mg.ackTo = map[uint64]uint64{}, 0
	mg.st = stWaiting
	return append(out, mg.logf(1, "chunk manager stopped", "why", why))
}

// fail stops the manager after a map I/O failure or a corrupt map: it
// starts again after RetryEvery (a new takeover or join, with a newer
// token). Waiting clients are told their change may have been made.
func (mg *Manager) fail(env Env, err error) []any {
	wrapped := err
	if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrNotPrimary) {
		wrapped = fmt.Errorf("%w: %w", ErrMaybeDone, err)
	}
	out := mg.stop(env, wrapped)
	mg.st, mg.why, mg.retryAt = stFailed, err, env.Now.Add(mg.cfg.RetryEvery)
	return append(out, mg.logf(2, "chunk manager failed; starting again", "err", err, "in", mg.cfg.RetryEvery))
}

func (mg *Manager) reply(req ReqID, h Handle, err error) []any {
	if req == 0 {
		return nil // the manager's own request (a reservation's expiry)
	}
	return []any{Reply{Req: req, Handle: h, Err: err}}
}

// answer ends request q and its duplicates.
func (mg *Manager) answer(q *request, h Handle, err error) []any {
	q.done = true
	out := mg.reply(q.req, h, err)
	for _, r := range q.extra {
		out = append(out, mg.reply(r, h, err)...)
	}
	for _, r := range q.other {
		oerr := err
		if err == nil {
			oerr = fmt.Errorf("%w: reservation %s was ended by another commit (its expiry, or a different list): free what you do not keep", ErrUnallocated, Handle{mg.cfg.CM, q.id})
		}
		out = append(out, mg.reply(r, Handle{}, oerr)...)
	}
	return out
}

// ------------------------------------------------------------------ I/O helpers

func (mg *Manager) mapRead(block, blocks uint64, then func([]byte, error) []any) []any {
	mg.nextOp++
	mg.ops[mg.nextOp] = then
	return []any{MapRead{Op: mg.nextOp, Block: block, Blocks: blocks}}
}

func (mg *Manager) mapWrite(block uint64, data []byte, then func(error) []any) []any {
	mg.nextOp++
	mg.ops[mg.nextOp] = func(_ []byte, err error) []any { return then(err) }
	return []any{MapWrite{Op: mg.nextOp, Block: block, Data: data, Token: mg.token}}
}

func (mg *Manager) acquire(mode lock.Mode, then func(lock.Token, error) []any) []any {
	mg.nextOp++
	op := mg.nextOp
	mg.holdOp = op
	mg.acqs[op] = func(tok lock.Token, err error) []any {
		mg.holdOp = 0
		return then(tok, err)
	}
	return []any{Acquire{Op: op, Mode: mode}}
}

func (mg *Manager) propose(p *Pair, what string, then func(uint64, error) []any) []any {
	mg.nextOp++
	mg.decs[mg.nextOp] = then
	return []any{Propose{Op: mg.nextOp, Version: mg.ver, Pair: p, What: what}}
}

func (mg *Manager) release() []any {
	if !mg.holding {
		return nil
	}
	mg.holding = false
	return []any{Release{}}
}

// ------------------------------------------------------------------ joining (secondary)

// join takes the map lock shared, reads the map, releases the lock.
func (mg *Manager) join(env Env) []any {
	mg.st, mg.why = stJoining, nil
	out := []any{mg.logf(0, "chunk manager joining as secondary")}
	return append(out, mg.acquire(lock.Shared, func(_ lock.Token, err error) []any {
		if err != nil {
			return mg.fail(mg.env, fmt.Errorf("the map lock (shared): %w", err))
		}
		mg.holding = true
		return mg.load(func(err error) []any {
			mg.holding = false
			out := []any{Release{}}
			if errors.Is(err, errNoSuper) {
				// The primary has not formatted the map yet: try again.
				mg.m = nil
				mg.st, mg.retryAt = stFailed, mg.env.Now.Add(mg.cfg.RetryEvery)
				return out
			}
			if err != nil {
				return append(out, mg.fail(mg.env, err)...)
			}
			mg.st = stSecondary
			return append(out, mg.logf(1, "chunk manager serving as secondary", "lsn", mg.m.lsn, "chunks", len(mg.m.chunks)))
		})
	})...)
}

// ------------------------------------------------------------------ takeover (primary)

func (mg *Manager) takeover(env Env, why string) []any {
	mg.st, mg.why, mg.fresh = stTakeover, nil, false
	out := []any{mg.logf(1, "chunk manager taking over as primary", "why", why)}
	return append(out, mg.acquire(lock.Exclusive, func(tok lock.Token, err error) []any {
		if err != nil {
			return mg.fail(mg.env, fmt.Errorf("the map lock (exclusive): %w", err))
		}
		mg.holding, mg.token = true, tok
		fences := mg.fences
		if mg.cfg.unsafe.noFence {
			fences = func(then func() []any) []any { return then() }
		}
		return fences(func() []any {
			return mg.load(func(err error) []any {
				switch {
				case errors.Is(err, errNoSuper) && !mg.pair.Formatted:
					return mg.format()
				case errors.Is(err, errNoSuper):
					return mg.fail(mg.env, fmt.Errorf("%w: the pair's map RLDev %d is blank, but the map was formatted: it was lost (not formatted again)", ErrCorrupt, mg.pair.MapRLDev))
				case err != nil:
					return mg.fail(mg.env, err)
				}
				if mg.logPos-blockLog >= uint64(mg.sup.Layout.LogBlocks)/2 {
					return mg.checkpoint(func() []any { return mg.named() })
				}
				return mg.named()
			})
		})
	})...)
}

// fences writes the fence blocks of the map RLDev and of every data RLDev
// with the hold's token, then runs then.
func (mg *Manager) fences(then func() []any) []any {
	targets := []uint64{0}
	for _, d := range mg.pair.Data {
		targets = append(targets, d.ID)
	}
	pending := len(targets)
	var ferr error
	var out []any
	for _, rl := range targets {
		mg.nextOp++
		mg.ops[mg.nextOp] = func(_ []byte, err error) []any {
			if err != nil && ferr == nil {
				ferr = err
			}
			if pending--; pending > 0 {
				return nil
			}
			if ferr != nil {
				return mg.fail(mg.env, fmt.Errorf("writing the fence blocks: %w", ferr))
			}
			return then()
		}
		out = append(out, MapWrite{Op: mg.nextOp, RLDev: rl, Block: blockFence, Data: EncodeFence(mg.cfg.CM, mg.cfg.Node, mg.cfg.Inc), Token: mg.token})
	}
	return out
}

// format writes an empty map (the pair's first primary).
func (mg *Manager) format() []any {
	l, err := NewLayout(mg.pair.MapBlocks)
	if err != nil {
		return mg.fail(mg.env, err)
	}
	s := Super{CM: mg.cfg.CM, Seq: 1, LogGen: 1, LogFirst: 1, HighWater: 1, Layout: l}
	return mg.mapWrite(superBlockFor(s.Seq), EncodeSuper(s), func(err error) []any {
		if err != nil {
			return mg.fail(mg.env, fmt.Errorf("formatting the map: %w", err))
		}
		mg.sup, mg.logPos, mg.idNext = s, blockLog, 1
		mg.m = newChunkMap(mg.cfg.CM, mg.pair.Data)
		return append([]any{mg.logf(1, "chunk manager formatted its pair's map", "rldev", mg.pair.MapRLDev, "log blocks", l.LogBlocks, "max chunks", l.MaxEntries())}, mg.named()...)
	})
}

// named passes the decree naming this manager's incarnation primary,
// unless the pair names another that is not known dead (a takeover that
// lost the race gives way).
func (mg *Manager) named() []any {
	p := mg.pair.Clone()
	idx := 0
	if p.Nodes[1] == mg.cfg.Node {
		idx = 1
	}
	me := Subject{mg.cfg.Node, mg.cfg.Inc}
	cur := Subject{p.PrimaryNode(), p.PrimaryInc}
	switch {
	case cur == me && p.Formatted:
		return mg.serve()
	case p.PrimaryInc != 0 && cur != me && !mg.deadSeen[cur]:
		return mg.stop(mg.env, fmt.Errorf("%w: node %d incarnation %d was named primary meanwhile", ErrNotServing, cur.Node, cur.Inc))
	}
	p.Primary, p.PrimaryInc, p.Formatted = idx, mg.cfg.Inc, true
	p.Epoch++
	return mg.propose(p, "primary chunk manager", func(ver uint64, err error) []any {
		if err != nil {
			// Lost to another decree (maybe another takeover), or its
			// answer was lost: read the table again and decide anew.
			out := mg.stop(mg.env, fmt.Errorf("%w: the decree naming it primary failed: %v", ErrNotServing, err))
			return append(out, Refresh{})
		}
		mg.pair, mg.ver = p, max(mg.ver, ver)
		return mg.serve()
	})
}

// serve begins serving as primary: first the peer is brought up to date
// (the log may hold records it lacks: a change committed whose update
// never reached it), or found to serve nothing; until then no request is
// taken (nothing is answered from records the secondary may lack).
func (mg *Manager) serve() []any {
	mg.st = stPrimary
	mg.peer = peerState{serving: true, since: mg.env.Now}
	mg.busy, mg.syncing = true, true
	out := []any{mg.logf(1, "chunk manager serving as primary", "lsn", mg.m.lsn, "chunks", len(mg.m.chunks), "token", mg.token.String())}
	mg.waitAck = &ackWaiter{lsn: mg.m.lsn, then: func() []any {
		mg.busy, mg.syncing = false, false
		out := mg.release()
		return append(out, mg.pump(mg.env)...)
	}}
	return append(out, mg.sendUpdate(mg.env)...)
}

// ------------------------------------------------------------------ loading the map

// load reads the superblock, the checkpoint and the log into a new map.
// A new primary quarantines, from now, the space freed by the replayed
// records and the checkpoint's quarantined runs (a secondary allocates
// nothing: it follows the primary's records, which may reuse that space
// as soon as the primary's quarantine ends).
func (mg *Manager) load(then func(error) []any) []any {
	return mg.mapRead(blockSuper, 2, func(data []byte, err error) []any {
		if err != nil {
			return then(fmt.Errorf("reading the map's superblock: %w", err))
		}
		s, err := PickSuper(data[:BlockSize], data[BlockSize:])
		if err != nil {
			return then(err)
		}
		if s.CM != mg.cfg.CM {
			return then(fmt.Errorf("%w: the map RLDev holds chunk manager %d's map, not %d's", ErrCorrupt, s.CM, mg.cfg.CM))
		}
		if uint64(blockLog)+uint64(s.Layout.LogBlocks)+2*uint64(s.Layout.SlotBlocks) > mg.pair.MapBlocks {
			return then(fmt.Errorf("%w: the map's layout %+v does not fit its RLDev of %d blocks", ErrCorrupt, s.Layout, mg.pair.MapBlocks))
		}
		m := newChunkMap(mg.cfg.CM, mg.pair.Data)
		next := func() []any {
			m.hw = max(m.hw, s.HighWater)
			if m.lsn+1 != s.LogFirst {
				return then(fmt.Errorf("%w: the checkpoint ends at LSN %d, the log starts at %d", ErrCorrupt, m.lsn, s.LogFirst))
			}
			return mg.scanLog(s, m, blockLog, func(pos uint64, err error) []any {
				if err != nil {
					return then(err)
				}
				if mg.st == stTakeover {
					m.quarantine(mg.env.Now.Add(mg.cfg.Quarantine))
				} else {
					m.freed = nil // a secondary allocates nothing (the primary's records place chunks)
				}
				for _, rv := range m.resv {
					rv.until = mg.env.Now.Add(mg.cfg.ResvLife)
				}
				mg.sup, mg.m, mg.logPos, mg.idNext = s, m, pos, m.hw
				return then(nil)
			})
		}
		if s.CkBlocks == 0 {
			m.lsn = s.LogFirst - 1
			return next()
		}
		return mg.mapRead(s.Layout.slotStart(s.Slot), uint64(s.CkBlocks), func(data []byte, err error) []any {
			if err != nil {
				return then(fmt.Errorf("reading the map's checkpoint: %w", err))
			}
			b := data[:s.CkBytes]
			if crc32.Checksum(b, castagnoli) != s.CkCRC {
				return then(fmt.Errorf("%w: the checkpoint's checksum", ErrCorrupt))
			}
			c, err := DecodeCheckpoint(b)
			if err != nil {
				return then(err)
			}
			if err := m.load(c); err != nil {
				return then(err)
			}
			return next()
		})
	})
}

// scanLog applies the log's frames from block pos on, and returns the
// block after the last valid one.
func (mg *Manager) scanLog(s Super, m *chunkMap, pos uint64, then func(uint64, error) []any) []any {
	end := blockLog + uint64(s.Layout.LogBlocks)
	if pos >= end {
		return then(pos, nil)
	}
	n := min(uint64(MaxFrameBlocks)*4, end-pos)
	return mg.mapRead(pos, n, func(data []byte, err error) []any {
		if err != nil {
			return then(0, fmt.Errorf("reading the map's log: %w", err))
		}
		for off := uint64(0); off < n; {
			k := uint64(FrameLen(data[off*BlockSize:]))
			if k == 0 || pos+off+k > end {
				return then(pos+off, nil) // the end of the log
			}
			if off+k > n {
				return mg.scanLog(s, m, pos+off, then) // read the whole frame
			}
			f, err := DecodeFrame(data[off*BlockSize : (off+k)*BlockSize])
			if err != nil || f.Gen != s.LogGen || f.First != m.lsn+1 {
				return then(pos+off, nil)
			}
			for i, r := range f.Records {
				if err := m.apply(f.First+uint64(i), r, false); err != nil {
					return then(0, err)
				}
			}
			off += k
		}
		return mg.scanLog(s, m, pos+n, then)
	})
}

// ------------------------------------------------------------------ changes (primary)

// pump starts the next change if the primary is idle and has work.
func (mg *Manager) pump(env Env) []any {
	if mg.st != stPrimary || mg.busy {
		return nil
	}
	var ready, rest []*request
	recs := 1 // a Reserve record
	for _, q := range mg.queue {
		// A frame holds at most MaxFrameBlocks: a change takes up to
		// MaxBatch requests and 5 000 records (a commit of a reservation
		// is one record per chunk kept).
		if len(ready) < mg.cfg.MaxBatch && recs+q.records() <= maxChangeRecords && (!q.isFree() || mg.inflight[q.id] == 0) {
			ready = append(ready, q)
			recs += q.records()
		} else {
			rest = append(rest, q)
		}
	}
	if len(ready) == 0 {
		return nil
	}
	mg.queue, mg.batch = rest, ready
	mg.busy = true
	return mg.acquire(lock.Exclusive, func(tok lock.Token, err error) []any {
		if err != nil {
			return mg.fail(mg.env, fmt.Errorf("the map lock (exclusive): %w", err))
		}
		mg.holding = true
		if tok == mg.token {
			return mg.change(ready)
		}
		// The lease was revoked and granted again: a secondary may have
		// read the map meanwhile (it has everything up to now), and
		// changes wait for it again. Whoever held the lock meanwhile must
		// not have changed the map (only a manager that believed itself
		// primary could have): the superblock and the log's end are read
		// to make sure, before anything is changed.
		out := []any{mg.logf(1, "chunk manager: its lease was revoked (a secondary may have joined)", "token", tok.String())}
		mg.peer = peerState{serving: true, acked: mg.m.lsn, since: mg.env.Now}
		mg.recent = nil
		mg.token = tok
		return append(out, mg.verifyTail(func() []any { return mg.change(ready) })...)
	})
}

// verifyTail checks that the map on its RLDev is still what this primary
// last wrote (the same superblock, no frame after its last), then runs
// then; otherwise another manager changed it: this one stops.
func (mg *Manager) verifyTail(then func() []any) []any {
	return mg.mapRead(blockSuper, 2, func(data []byte, err error) []any {
		if err != nil {
			return mg.fail(mg.env, fmt.Errorf("reading the map's superblock: %w", err))
		}
		s, err := PickSuper(data[:BlockSize], data[BlockSize:])
		if err != nil || s.Seq != mg.sup.Seq {
			return mg.fail(mg.env, fmt.Errorf("%w: the map's superblock changed under this primary (seq %d, was %d: %v)", ErrNotPrimary, s.Seq, mg.sup.Seq, err))
		}
		if mg.logPos >= blockLog+uint64(s.Layout.LogBlocks) {
			return then()
		}
		return mg.mapRead(mg.logPos, MaxFrameBlocks, func(data []byte, err error) []any {
			if err != nil {
				return mg.fail(mg.env, fmt.Errorf("reading the map's log: %w", err))
			}
			if f, err := DecodeFrame(data); err == nil && f.Gen == mg.sup.LogGen && f.First == mg.m.lsn+1 {
				return mg.fail(mg.env, fmt.Errorf("%w: another manager appended to the map's log (LSN %d)", ErrNotPrimary, f.First))
			}
			return then()
		})
	})
}

// change makes one change of the map: the allocations' space and ids,
// their zeroing, the frame, the secondary's acknowledgement.
func (mg *Manager) change(reqs []*request) []any {
	m := mg.m
	var recs []Record
	var allocs []*request
	needIDs := uint64(0)
	for _, q := range reqs {
		switch {
		case q.alloc:
			needIDs++
		case q.resv:
			needIDs += q.count + 1
		}
	}
	next := mg.idNext
	if next+needIDs > m.hw && !mg.cfg.unsafe.noReserve {
		recs = append(recs, Record{Kind: RecReserve, HW: next + needIDs + mg.cfg.ReserveStep})
	}
	var out []any
	freed := map[uint64]bool{}          // chunks this change frees (or disowns)
	retiring := map[uint64]lock.Token{} // retirements this change makes
	retired := func(o Owner) bool {
		t, ok := retiring[o.Log]
		return m.retiredOwner(o) || ok && o.Token.Less(t)
	}
	newOwned := 0             // checkpoint entries this change may add beyond its chunks
	var addRetires []*request // retirements of logs with no mark yet (an entry each)
	for _, q := range reqs {
		switch {
		case q.isFree():
			recs = append(recs, Record{Kind: RecFree, ID: q.id})
			freed[q.id] = true
			continue
		case q.disown:
			for _, id := range q.live {
				if e := m.chunks[id]; e != nil && !e.owner.IsZero() && !freed[id] {
					recs = append(recs, Record{Kind: RecDisown, ID: id})
					freed[id] = true // (not named twice)
				}
			}
			continue
		case q.retire:
			cur, ok := retiring[q.owner.Log]
			if !ok {
				cur, ok = m.retired[q.owner.Log]
			}
			if !ok || cur.Less(q.owner.Token) {
				recs = append(recs, Record{Kind: RecRetire, Owner: q.owner})
				retiring[q.owner.Log] = q.owner.Token
				if !ok {
					newOwned++ // a new mark; a newer one replaces the old
					addRetires = append(addRetires, q)
				}
			}
			continue
		case q.alloc && !q.owner.IsZero() && retired(q.owner) && !mg.cfg.unsafe.retireIgnore:
			out = append(out, mg.answer(q, Handle{}, fmt.Errorf("%w: %v (chunk manager %d retired its log's older owners)", ErrRetired, q.owner, mg.cfg.CM))...)
			continue
		case q.commit:
			rv := m.resv[q.id]
			if rv == nil {
				panic(fmt.Sprintf("chunk: a commit of reservation %d, not open", q.id))
			}
			for _, id := range q.live {
				recs = append(recs, Record{Kind: RecAlloc, ID: id, Extent: rv.Slot(id)})
			}
			recs = append(recs, Record{Kind: RecResvClose, ID: q.id})
			continue
		}
		blocks := blocksFor(q.size)
		if q.resv {
			blocks *= q.count
		}
		ext, ok := m.pick(blocks, mg.pair.Data)
		if !ok {
			free, largest, _, quar := m.freeBlocks()
			out = append(out, mg.answer(q, Handle{}, fmt.Errorf("%w: chunk manager %d has no free run of %d blocks (%d blocks free, the largest run %d; %d more freed in the last %v, reusable after it)",
				ErrFull, mg.cfg.CM, blocks, free, largest, quar, mg.cfg.Quarantine))...)
			continue
		}
		if q.resv {
			// ext.Len stays 0 here: the run's blocks are in Resv.
			q.ext = Extent{RLDev: ext.RLDev, Block: ext.Block, Len: blocks * BlockSize}
			recs = append(recs, Record{Kind: RecResv, ID: next, Resv: Resv{ID: next, Run: Run{RLDev: ext.RLDev, Block: ext.Block, Blocks: blocks}, Count: q.count, Size: q.size}})
			next += q.count + 1
		} else {
			ext.Len = q.size
			q.ext = ext
			if q.owner.IsZero() {
				recs = append(recs, Record{Kind: RecAlloc, ID: next, Extent: ext})
			} else {
				recs = append(recs, Record{Kind: RecAllocOwned, ID: next, Extent: ext, Owner: q.owner})
				newOwned++
			}
			next++
		}
		allocs = append(allocs, q)
	}
	if len(allocs) == 0 && onlyReserve(recs) {
		// Nothing to log: the allocations failed, and the disowns and
		// retirements found nothing to change (done already).
		for _, q := range reqs {
			if !q.done {
				if !q.disown && !q.retire {
					panic(fmt.Sprintf("chunk: a change left request %+v without a record", q))
				}
				out = append(out, mg.answer(q, Handle{}, nil)...)
			}
		}
		mg.busy, mg.batch = false, nil
		out = append(out, mg.release()...)
		return append(out, mg.pump(mg.env)...)
	}
	giveBack := func() {
		for _, q := range allocs {
			m.spaces[q.ext.RLDev].release(q.ext.Block, blocksFor(q.ext.Len))
		}
	}
	// Room in the log: a full log is checkpointed first.
	need := uint64(frameBlocks(recs))
	if need > MaxFrameBlocks {
		panic(fmt.Sprintf("chunk: a change of %d records does not fit a frame (MaxBatch too large)", len(recs)))
	}
	if mg.logPos+need > blockLog+uint64(mg.sup.Layout.LogBlocks) {
		giveBack()
		return append(out, mg.checkpoint(func() []any { return mg.change(undone(reqs)) })...)
	}
	newChunks := uint64(0)
	for _, q := range allocs {
		newChunks += 1
		if q.resv {
			newChunks += q.count + 1 // it may become count chunks
		}
	}
	// Room in the checkpoint: every entry counts 32 bytes (quarantined
	// runs and retirement marks take 24), the owners' section header 16
	// more (one entry). Only a change that adds entries is refused (and
	// the requests that add them answered, so that the change made again
	// without them goes through): frees and disowns take nothing.
	tail := 0
	if m.owned+len(m.retired)+newOwned > 0 {
		tail = 1
	}
	if newChunks+uint64(newOwned) > 0 && uint64(len(m.chunks)+m.quarantineEntries()+m.owned+len(m.retired)+newOwned+tail)+m.reservedChunks()+newChunks > mg.sup.Layout.MaxEntries() {
		giveBack()
		full := fmt.Errorf("%w: chunk manager %d holds %d chunks, as many as its map's checkpoint can (%d entries, %d owned, %d retirement marks)", ErrMapFull, mg.cfg.CM, len(m.chunks), mg.sup.Layout.MaxEntries(), m.owned, len(m.retired))
		for _, q := range allocs {
			out = append(out, mg.answer(q, Handle{}, full)...)
		}
		for _, q := range addRetires {
			out = append(out, mg.answer(q, Handle{}, full)...)
		}
		return append(out, mg.change(undone(reqs))...)
	}
	// Zero the new chunks (durable), then log.
	pending := len(allocs)
	var zeroErr error
	logIt := func() []any {
		if zeroErr != nil {
			// Nothing was logged: the allocations fail, and their space is
			// quarantined (a zeroing may still land).
			var out []any
			for _, q := range allocs {
				m.spaces[q.ext.RLDev].release(q.ext.Block, blocksFor(q.ext.Len))
				m.freed = append(m.freed, Run{q.ext.RLDev, q.ext.Block, blocksFor(q.ext.Len)})
				out = append(out, mg.answer(q, Handle{}, fmt.Errorf("zeroing the new chunk: %w", zeroErr))...)
			}
			m.quarantine(mg.env.Now.Add(mg.cfg.Quarantine))
			if errors.Is(zeroErr, ErrEarlierMayLand) {
				// Its RLDev answered, and a lost attempt of the zeroing
				// is still on its way: the quarantine bounds it only by
				// time. Taking the map lock again fences it for good.
				return append(out, mg.fail(mg.env, fmt.Errorf("zeroing new chunks: %w", zeroErr))...)
			}
			return append(out, mg.change(undone(reqs))...)
		}
		return mg.logFrame(recs, reqs)
	}
	if pending == 0 {
		return append(out, logIt()...)
	}
	for _, q := range allocs {
		mg.nextOp++
		mg.ops[mg.nextOp] = func(_ []byte, err error) []any {
			// The first error is the one answered; but one that says a
			// lost attempt may still land wins over any other, since it
			// decides whether the map lock is taken again (below).
			if err != nil && (zeroErr == nil || errors.Is(err, ErrEarlierMayLand) && !errors.Is(zeroErr, ErrEarlierMayLand)) {
				zeroErr = err
			}
			if pending--; pending > 0 {
				return nil
			}
			return logIt()
		}
		out = append(out, ZeroWrite{Op: mg.nextOp, RLDev: q.ext.RLDev, Block: q.ext.Block, Blocks: blocksFor(q.ext.Len), Token: mg.token})
	}
	return out
}

// ErrEarlierMayLand fails a map-lock write (a map block, a new chunk's
// zeroing) that succeeded on a retry while an earlier attempt, its answer
// lost, may still land (rldev.Clerk.WriteReport): under the same token it
// would be admitted whenever it arrived — over the map's next frame or
// superblock at the same place, over the data a chunk's owner wrote after
// the allocation was answered (review 36). The manager then takes the map
// lock again (fail); the takeover writes the new token to the fence block
// of the map RLDev and of every data RLDev, which refuse the late attempt
// from then on.
var ErrEarlierMayLand = errors.New("an earlier attempt of the write, whose answer was lost, may still land")

// maxChangeRecords bounds the records of one change, counted by
// request.records (a frame of 5 000
// allocations is 41 blocks of MaxFrameBlocks).
const maxChangeRecords = 5000

func onlyReserve(recs []Record) bool {
	for _, r := range recs {
		if r.Kind != RecReserve {
			return false
		}
	}
	return true
}

func undone(reqs []*request) []*request {
	var out []*request
	for _, q := range reqs {
		if !q.done {
			out = append(out, q)
		}
	}
	return out
}

// logFrame appends recs to the log; then applies them, sends them to the
// secondary, and replies once it acknowledged (or serves nothing).
func (mg *Manager) logFrame(recs []Record, reqs []*request) []any {
	f := Frame{Gen: mg.sup.LogGen, First: mg.m.lsn + 1, Records: recs}
	b := EncodeFrame(f)
	pos := mg.logPos
	return mg.mapWrite(pos, b, func(err error) []any {
		if err != nil {
			return mg.fail(mg.env, fmt.Errorf("appending to the map's log: %w", err))
		}
		mg.logPos = pos + uint64(len(b)/BlockSize)
		var freed []Run // in record order
		for i, r := range recs {
			if r.Kind == RecFree {
				if e := mg.m.chunks[r.ID]; e != nil {
					freed = append(freed, Run{e.RLDev, e.Block, blocksFor(e.Len)})
				}
			}
			if r.Kind == RecResvClose {
				if rv := mg.m.resv[r.ID]; rv != nil {
					freed = append(freed, rv.unallocatedRuns()...) // its allocations are applied
				}
			}
			if mg.cfg.unsafe.noReserve && r.isAlloc() && r.ID >= mg.m.hw {
				mg.m.hw = r.ID + 1 // as if reserved (not logged)
			}
			if mg.cfg.unsafe.noReserve && r.Kind == RecResv && r.Resv.ID+r.Resv.Count >= mg.m.hw {
				mg.m.hw = r.Resv.ID + r.Resv.Count + 1
			}
			if err := mg.m.apply(f.First+uint64(i), r, true); err != nil {
				panic(fmt.Sprintf("chunk: applying a change just logged: %v", err)) // the change was built from this map
			}
			if r.isAlloc() {
				mg.idNext = max(mg.idNext, r.ID+1)
			}
			if r.Kind == RecResv {
				mg.idNext = max(mg.idNext, r.Resv.ID+r.Resv.Count+1)
				mg.m.resv[r.ID].until = mg.env.Now.Add(mg.cfg.ResvLife)
			}
			if mg.peer.serving {
				mg.recent = append(mg.recent, lsnRecord{f.First + uint64(i), r})
			}
		}
		finish := func() []any {
			// The secondary has the change, or serves nothing: reply,
			// quarantine the freed space, release, next change.
			var out []any
			for _, r := range freed {
				mg.m.spaces[r.RLDev].release(r.Block, r.Blocks)
			}
			if !mg.cfg.unsafe.noQuarantine {
				mg.m.freed = append(mg.m.freed, freed...)
				mg.m.quarantine(mg.env.Now.Add(mg.cfg.Quarantine))
			}
			for _, q := range reqs {
				if q.done {
					continue
				}
				if q.alloc || q.resv {
					out = append(out, mg.answer(q, Handle{mg.cfg.CM, idOf(recs, q)}, nil)...)
				} else {
					out = append(out, mg.answer(q, Handle{mg.cfg.CM, q.id}, nil)...)
				}
			}
			mg.busy, mg.batch = false, nil
			out = append(out, mg.release()...)
			return append(out, mg.pump(mg.env)...)
		}
		if !mg.peer.serving || mg.cfg.unsafe.noPeerWait {
			return finish()
		}
		mg.waitAck = &ackWaiter{lsn: mg.m.lsn, then: finish}
		return mg.sendUpdate(mg.env)
	})
}

// idOf is the id the change gave request q.
func idOf(recs []Record, q *request) uint64 {
	for _, r := range recs {
		if q.alloc && r.isAlloc() && r.Extent == q.ext {
			return r.ID
		}
		if q.resv && r.Kind == RecResv && r.Resv.Run.RLDev == q.ext.RLDev && r.Resv.Run.Block == q.ext.Block {
			return r.ID
		}
	}
	panic("chunk: an allocation without its record")
}

// sendUpdate sends the secondary every record it has not acknowledged
// (none: an empty update that asks how far it is).
func (mg *Manager) sendUpdate(env Env) []any {
	mg.peer.at = env.Now
	u := Update{CM: mg.cfg.CM, Token: mg.token, First: mg.m.lsn + 1}
	if len(mg.recent) > 0 {
		u.First = mg.recent[0].lsn
		for _, x := range mg.recent {
			u.Records = append(u.Records, x.r)
		}
	}
	return []any{Send{To: mg.pair.Peer(mg.cfg.Node), Msg: u}}
}

// Deliver handles a peer message.
func (mg *Manager) Deliver(env Env, from NodeID, msg any) []any {
	mg.env = env
	if mg.pair == nil || from != mg.pair.Peer(mg.cfg.Node) {
		return nil
	}
	switch x := msg.(type) {
	case Update:
		return mg.onUpdate(env, from, x)
	case Ack:
		return mg.onAck(env, x)
	case Reload:
		return mg.onReload(env, from, x)
	}
	return nil
}

func (mg *Manager) onAck(env Env, a Ack) []any {
	if mg.st != stPrimary || !mg.peer.serving || a.Inc < mg.peer.inc {
		return nil // not waiting, or an older incarnation's answer
	}
	if a.Token != mg.token && !mg.cfg.unsafe.anyAckToken {
		// An answer to a message of an earlier lease of the map lock,
		// arriving late (the transport may delay or duplicate it): the
		// secondary may have joined, or restarted, since. Every message
		// of this lease carries its token, and the answers to them echo
		// it.
		return nil
	}
	switch a.Code {
	case AckStale:
		// A newer primary exists: this one is deposed (its lease is gone;
		// its writes are fenced). Stop.
		return mg.fail(env, fmt.Errorf("%w: the secondary has seen a newer primary", ErrNotPrimary))
	case AckNotReady:
		// It serves nothing, and cannot start before this primary's hold
		// ends (it reads the map under the lock held shared first).
		out := []any{mg.logf(1, "chunk manager: the secondary serves nothing", "incarnation", a.Inc)}
		return append(out, mg.peerNotServing(a.Inc)...)
	case AckGap:
		if len(mg.recent) == 0 || a.LSN+1 < mg.recent[0].lsn {
			// It lacks records this primary no longer has: it reads the
			// map again.
			mg.peer.inc = a.Inc
			return []any{mg.logf(1, "chunk manager: the secondary lacks records; it reads the map again", "incarnation", a.Inc, "has", a.LSN),
				Send{To: mg.pair.Peer(mg.cfg.Node), Msg: Reload{CM: mg.cfg.CM, Token: mg.token}}}
		}
	}
	mg.peer.inc = a.Inc
	if a.LSN > mg.peer.acked {
		mg.peer.acked = a.LSN
	}
	for len(mg.recent) > 0 && mg.recent[0].lsn <= mg.peer.acked {
		mg.recent = mg.recent[1:]
	}
	if w := mg.waitAck; w != nil && mg.peer.acked >= w.lsn {
		mg.waitAck = nil
		return w.then()
	}
	return nil
}

// peerNotServing records that the secondary (incarnation inc) serves
// nothing: the change waiting for it goes on.
func (mg *Manager) peerNotServing(inc uint64) []any {
	mg.peer = peerState{inc: inc}
	mg.recent = nil
	if w := mg.waitAck; w != nil {
		mg.waitAck = nil
		return w.then()
	}
	return nil
}

// ------------------------------------------------------------------ updates (secondary)

func (mg *Manager) onUpdate(env Env, from NodeID, u Update) []any {
	ack := func(code AckCode, lsn uint64) []any {
		return []any{Send{To: from, Msg: Ack{CM: mg.cfg.CM, Code: code, Inc: mg.cfg.Inc, LSN: lsn, Token: u.Token}}}
	}
	if mg.st != stSecondary || mg.m == nil || !env.alive() {
		return mg.notReady(from, u.Token)
	}
	if u.Token.Less(mg.maxToken) {
		return ack(AckStale, mg.m.lsn)
	}
	mg.maxToken, mg.ackTo = u.Token, from
	m := mg.m
	if u.First > m.lsn+1 {
		return ack(AckGap, m.lsn)
	}
	for i, r := range u.Records {
		lsn := u.First + uint64(i)
		if lsn <= m.lsn {
			continue // sent again
		}
		if r.Kind == RecFree && mg.inflight[r.ID] > 0 {
			// No new I/O on it from now on (it is gone from the map); the
			// acknowledgement of this free waits for the I/O admitted
			// before to finish.
			mg.drainLSN[r.ID] = lsn
		}
		if err := m.apply(lsn, r, false); err != nil {
			return mg.fail(env, fmt.Errorf("applying the primary's update: %w", err))
		}
	}
	m.freed = nil // a secondary allocates nothing: its free space only follows the primary's records
	out := []any{mg.logf(0, "chunk manager: update applied", "first", u.First, "records", len(u.Records), "lsn", m.lsn, "draining", len(mg.drainLSN))}
	return append(out, mg.ackNow(from)...)
}

// ackNow acknowledges every record applied whose free has drained.
func (mg *Manager) ackNow(to NodeID) []any {
	lsn := mg.m.lsn
	for _, l := range mg.drainLSN {
		lsn = min(lsn, l-1)
	}
	return []any{Send{To: to, Msg: Ack{CM: mg.cfg.CM, Code: AckOK, Inc: mg.cfg.Inc, LSN: lsn, Token: mg.maxToken}}}
}

// flushAcks acknowledges, once I/O on freed chunks drained.
func (mg *Manager) flushAcks(env Env) []any {
	changed := false
	for id := range mg.drainLSN {
		if mg.inflight[id] == 0 {
			delete(mg.drainLSN, id)
			changed = true
		}
	}
	if !changed || mg.st != stSecondary || mg.m == nil || mg.ackTo == 0 {
		return nil
	}
	return mg.ackNow(mg.ackTo)
}

// onReload: the primary cannot fill a gap in this secondary's map: it
// stops serving and reads the map again (once the primary's hold ends).
func (mg *Manager) onReload(env Env, from NodeID, r Reload) []any {
	if mg.st != stSecondary || r.Token.Less(mg.maxToken) {
		return mg.notReady(from, r.Token)
	}
	out := mg.stop(env, fmt.Errorf("%w: the primary asked it to read the map again", ErrNotServing))
	mg.st, mg.retryAt = stFailed, env.Now.Add(mg.cfg.RetryEvery/4)
	return append(out, mg.notReady(from, r.Token)...)
}

// notReady answers that this manager serves nothing -- once no I/O it
// admitted is in flight any more (until then it does not answer: the
// primary sends again, and frees nothing this I/O could still reach).
func (mg *Manager) notReady(to NodeID, tok lock.Token) []any {
	if len(mg.inflight) > 0 {
		return nil
	}
	return []any{Send{To: to, Msg: Ack{CM: mg.cfg.CM, Code: AckNotReady, Inc: mg.cfg.Inc, Token: tok}}}
}

// ------------------------------------------------------------------ checkpoints (primary)

func superBlockFor(seq uint64) uint64 { return blockSuper + seq%2 }

// checkpointChunk is the blocks of a checkpoint written at a time.
const checkpointChunk = 256

// checkpoint writes the map to the inactive slot, then the superblock
// naming it with a new, empty log; then runs then. The primary holds the
// map lock throughout, and no change is made meanwhile.
func (mg *Manager) checkpoint(then func() []any) []any {
	c, b := mg.m.checkpointIn(uint64(mg.sup.Layout.SlotBlocks) * BlockSize)
	if mg.cfg.unsafe.ownersLost {
		c.Owned = nil
		b = EncodeCheckpoint(c)
	}
	blocks := (uint64(len(b)) + BlockSize - 1) / BlockSize
	if blocks > uint64(mg.sup.Layout.SlotBlocks) {
		// Allocations keep every checkpoint within its slot (MaxEntries,
		// quarantineEntries); a map filled by an earlier build under
		// looser rules may not fit. The manager fails (it tries again
		// later), rather than take the node's process down with it.
		return mg.fail(mg.env, fmt.Errorf("%w: a checkpoint of %d blocks in a slot of %d: the map holds more entries than its checkpoint slot (a map filled by an earlier build under looser rules)", ErrCorrupt, blocks, mg.sup.Layout.SlotBlocks))
	}
	padded := make([]byte, blocks*BlockSize)
	copy(padded, b)
	slot := 1 - mg.sup.Slot
	start := mg.sup.Layout.slotStart(slot)
	s := mg.sup
	s.Seq++
	s.Slot, s.CkBlocks, s.CkBytes, s.CkCRC = slot, uint32(blocks), uint64(len(b)), crc32.Checksum(b, castagnoli)
	s.LogGen++
	s.LogFirst, s.HighWater = c.Through+1, c.HighWater
	out := []any{mg.logf(0, "chunk manager checkpoint", "lsn", c.Through, "chunks", len(c.Chunks), "blocks", blocks, "slot", slot)}
	var writeFrom func(off uint64) []any
	writeFrom = func(off uint64) []any {
		if off >= blocks {
			// The checkpoint is durable: the superblock switches to it.
			return mg.mapWrite(superBlockFor(s.Seq), EncodeSuper(s), func(err error) []any {
				if err != nil {
					return mg.fail(mg.env, fmt.Errorf("writing the map's superblock: %w", err))
				}
				mg.sup, mg.logPos = s, blockLog
				return then()
			})
		}
		n := min(checkpointChunk, blocks-off)
		return mg.mapWrite(start+off, padded[off*BlockSize:(off+n)*BlockSize], func(err error) []any {
			if err != nil {
				return mg.fail(mg.env, fmt.Errorf("writing the map's checkpoint: %w", err))
			}
			return writeFrom(off + n)
		})
	}
	return append(out, writeFrom(0)...)
}
