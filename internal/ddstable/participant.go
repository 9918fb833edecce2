package ddstable

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"time"
)

// OpID names one state-changing operation (a put or a remove): the
// coordinator's session, a random 64-bit number a library draws when it
// starts, and a sequence number within the session that is never reused.
type OpID struct {
	Session uint64
	Seq     uint64
}

func (o OpID) String() string { return fmt.Sprintf("%x/%d", o.Session, o.Seq) }

// Update is what an operation does to one key: put Value, or remove.
type Update struct {
	Key    uint64
	Value  []byte
	Remove bool
}

// Digest is a checksum of u (CRC-32C of the key, the remove flag and the
// value), carried by decisions so that a participant never takes one
// operation for another under a reused id.
func (u Update) Digest() uint32 {
	var b [9]byte
	binary.LittleEndian.PutUint64(b[:8], u.Key)
	if u.Remove {
		b[8] = 1
	}
	return crc32.Update(crc32.Checksum(b[:], castagnoli), castagnoli, u.Value)
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// State is a participant's record of one operation.
type State uint8

const (
	// Absent: no record. A participant asked by a peer about an operation
	// it has no record of records it as Aborted before answering, so that
	// a prepare arriving later is refused: its "no" is then final.
	Absent State = iota
	// Prepared: voted yes; the key's write lock is held; the outcome is
	// not known here.
	Prepared
	// Committed: the update is applied.
	Committed
	// Aborted: the update will never be applied here.
	Aborted
)

func (s State) String() string {
	switch s {
	case Absent:
		return "absent"
	case Prepared:
		return "prepared"
	case Committed:
		return "committed"
	case Aborted:
		return "aborted"
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// Reason says why a participant voted no.
type Reason uint8

const (
	ReasonNone       Reason = iota
	ReasonConflict          // another operation holds the key's write lock (DDS §4.1)
	ReasonRepair            // the caller's maps differ from the brick's (DDS §4.2); Vote.Stamp is the brick's
	ReasonBusy              // the brick holds MaxOps records: admission control
	ReasonOld               // the operation is older than its session's Done mark, or was aborted here
	ReasonRecovering        // a brick is recovering into the group: writes wait (DDS §4.3's write lease)
	// ReasonNotServing: the brick runs no participant for the partition
	// (its maps are behind or ahead of the caller's): a "no" it does not
	// record, which the coordinator, as for ReasonBusy, does not take for
	// an abort.
	ReasonNotServing
)

// recorded says whether a no vote for r is recorded as an abort (rule 1).
func (r Reason) recorded() bool { return r != ReasonBusy && r != ReasonNotServing }

func (r Reason) String() string {
	switch r {
	case ReasonNone:
		return "yes"
	case ReasonConflict:
		return "conflict"
	case ReasonRepair:
		return "repair"
	case ReasonBusy:
		return "busy"
	case ReasonOld:
		return "old or aborted"
	case ReasonRecovering:
		return "recovering"
	case ReasonNotServing:
		return "not serving"
	}
	return fmt.Sprintf("reason(%d)", uint8(r))
}

// Prepare is phase 1 of a put or remove, from the coordinator.
type Prepare struct {
	Op        OpID
	Partition Partition // the key's partition by the coordinator's maps
	Stamp     Stamp     // the coordinator's maps
	Group     []BrickID // the replica group the coordinator prepares at (its maps' RG entry)
	Update    Update
	// Done: every operation of this session with a lower Seq is finished
	// (every member of its group acknowledged the outcome), so its record
	// may be forgotten.
	Done uint64
}

// Vote answers a Prepare.
type Vote struct {
	Yes    bool
	Reason Reason
	Stamp  Stamp // the brick's maps, for ReasonRepair
}

// Decide is phase 2, from the coordinator.
type Decide struct {
	Op        OpID
	Partition Partition // as in the Prepare: which participant of the brick
	// Epoch is that of the maps the operation was prepared with (its
	// Prepare's Stamp): a participant born later never prepared it.
	Epoch  uint64
	Digest uint32 // the update's (Update.Digest)
	Commit bool
	Done   uint64
}

// Ack answers a Decide with the participant's state after it. An abort
// answered Prepared was refused: the participant is resolving the
// operation with its peers and the outcome may yet be commit.
type Ack struct {
	State State
	// Later: no record, and this participant began after the operation
	// was prepared (Decide.Epoch): it cannot say what a participant of
	// the same name before it did, and never will. The coordinator stops
	// waiting on it and reports the operation Unknown.
	Later bool
}

// Query is a peer's question during termination: what is your state of
// Op? Sweep queries (asked before forgetting a decided record) do not
// create a record at the answerer.
type Query struct {
	Op    OpID
	Sweep bool
}

// PeerSend is a query this participant wants sent to a peer; the answer
// comes back through Answer.
type PeerSend struct {
	To    BrickID
	Query Query
}

// Proposal asks the config service to decree op's outcome, unless a decree
// for op exists; the runtime hands the register's value, the first decree,
// to Outcome.
type Proposal struct {
	Op     OpID
	Commit bool
}

// Errors of Read.
var (
	ErrBusy   = errors.New("ddstable: the key has a write in doubt at this replica; retry")
	ErrRepair = errors.New("ddstable: the caller's maps differ from the brick's")
	// ErrHandedOff: a move replaces this replica, which stopped serving
	// reads for it (rebalance.go, step 3); read another replica.
	ErrHandedOff = errors.New("ddstable: this replica is being replaced by a move and serves no read; read another")
)

// ParticipantConfig tunes a Participant.
type ParticipantConfig struct {
	Self BrickID
	// PrepareTimeout: a prepared operation without a decision this long
	// starts termination (queries to its peers).
	PrepareTimeout time.Duration
	// QueryEvery: how often an unanswered query is sent again.
	QueryEvery time.Duration
	// RecordLife: a decided record is kept at least this long (unless its
	// session's Done passes it), then forgotten once every peer answers a
	// sweep query with anything but Prepared. It also bounds how long a
	// session's Done mark is remembered after the session's last message.
	// It must exceed the longest a message can take to arrive, so that a
	// prepare delivered late finds the record that refuses it.
	RecordLife time.Duration
	// MaxOps bounds the operations in doubt (Prepared); prepares beyond
	// it are refused busy (admission control). Refusals are still
	// recorded: a "no" must be final (rule 1).
	MaxOps int
	// MaxRecords bounds every record, tombstones too (default 8 × MaxOps).
	// A brick at the bound votes busy without a record, answers an abort
	// and a termination query "absent" (no answer), and keeps no new
	// tombstone: what it cannot record it does not promise.
	MaxRecords int
	// OnDecide, if set, is told of every prepared operation this
	// participant decides, as it decides it (the simulator's oracle keeps
	// the decisions; records are forgotten). It must not call back.
	OnDecide func(op OpID, s State)
	// Unsafe variants for the oracle's teeth tests; never set otherwise.
	Unsafe UnsafeParticipant
}

// UnsafeParticipant selects broken rules that the simulator's oracle must
// catch.
type UnsafeParticipant struct {
	// NoFreeze accepts a coordinator's abort after answering a peer
	// "prepared", so a peer may have concluded commit from that answer.
	NoFreeze bool
	// PaperRule resolves as the DDS paper words it: commit if a peer saw a
	// commit, otherwise abort — even when every peer is prepared and one
	// that was removed may have committed and served reads.
	PaperRule bool
	// LocalDecide concludes on what this participant saw (abort on any
	// Aborted answer, commit when all answered Prepared) without the
	// config service's register.
	LocalDecide bool
	// IgnoreLease accepts prepares while a brick holds the partition's
	// write lease: writes commit while it copies, and it misses them.
	IgnoreLease bool
	// CopyInDoubt lets a recovering brick copy while operations are in
	// doubt here: one that commits after the copy is missing from it.
	CopyInDoubt bool
	// ReshapeInDoubt lets a split or merge retire this replica while
	// operations are in doubt here: they are lost with its records.
	ReshapeInDoubt bool
	// FreezeInDoubt (the simulator's checkpoint images, not this type)
	// takes a checkpoint's image while operations are in doubt here.
	FreezeInDoubt bool
	// EarlyUnregister removes an outcome register as soon as this
	// participant adopts it, while peers may still be prepared and
	// propose again: a second decree may differ from the first.
	EarlyUnregister bool
}

// DefaultParticipantConfig has the defaults for brick self.
func DefaultParticipantConfig(self BrickID) ParticipantConfig {
	return ParticipantConfig{
		Self:           self,
		PrepareTimeout: 2 * time.Second,
		QueryEvery:     500 * time.Millisecond,
		RecordLife:     5 * time.Minute,
		MaxOps:         65536,
	}
}

// Validate rejects settings under which the protocol's rules do not hold.
func (c ParticipantConfig) Validate() error {
	switch {
	case c.PrepareTimeout <= 0 || c.QueryEvery <= 0:
		return errors.New("ddstable: prepare timeout and query interval must be positive")
	case c.RecordLife < 4*c.PrepareTimeout:
		return fmt.Errorf("ddstable: record life %v must be at least 4 prepare timeouts (%v)", c.RecordLife, 4*c.PrepareTimeout)
	case c.MaxOps < 1:
		return errors.New("ddstable: MaxOps must be positive")
	case c.MaxRecords != 0 && c.MaxRecords < c.MaxOps:
		return errors.New("ddstable: MaxRecords must be at least MaxOps")
	}
	return nil
}

// Participant is one brick's replica of one partition, as a participant of
// DDS's two-phase commit (§4.1): the library coordinates, replicas vote and
// apply. It holds the key write locks and the "short in-memory log of
// recent state changing operations and their outcomes" that termination
// reads; the data itself is the caller's (Applied effects).
//
// The rules, which the simulator checks over many seeds:
//
//  1. Votes are final. A participant votes yes by entering Prepared (the
//     key's write lock taken) and no by recording Aborted; it never votes
//     both ways for one operation. Asked by a peer about an operation it
//     has no record of, it records Aborted first.
//
//  2. Termination. A Prepared participant not decided after PrepareTimeout
//     asks every peer of the operation's group that is still a member, as
//     DDS's replicas do. A Committed answer: commit at once (the
//     coordinator decided commit, so nothing can conclude abort).
//     Otherwise the participant proposes an outcome to the operation's
//     outcome register in the config service, and every participant
//     adopts the register's first decree: abort once any member answered
//     Aborted (then the coordinator did not decide commit), commit once
//     every member answered Prepared (every member voted yes).
//
//  3. Freezing. A participant that answered a peer "prepared", or is
//     resolving, refuses a coordinator's abort: a commit proposal may rest
//     on that answer. A commit is always accepted: the coordinator decides
//     commit only when every member voted yes, and then no member can be
//     Aborted, so no abort is ever proposed.
//
//  4. Membership. Termination waits for members that do not answer until
//     a decree removes them from the group; the failure detector declares
//     a brick dead (and the brick stops) before that decree. A removed
//     member's state no longer counts: if it committed and served a read,
//     every survivor is Prepared or Committed, so the outcome is commit.
//
//  5. Reads. A key whose write lock a Prepared operation holds is not
//     read here (ErrBusy): another replica may already have committed it.
//
//  6. Recovery (DDS §4.3). A brick joins a group only through a write
//     lease in the maps (Maps.Joining): from the lease's epoch on, the
//     members refuse prepares; the newcomer copies the whole partition
//     from a member once EVERY member has the lease in its maps and
//     nothing in doubt (CopyReady at each: a state no member leaves while
//     the lease lasts), so every operation is decided at every member, the
//     same way, for good; then a decree adds it and ends the lease. Nothing
//     in doubt at the source alone is not enough: a peer still prepared
//     when the source is removed concludes commit by rule 4, over the
//     source's copied abort (outside review 122). A
//     newcomer is a new BrickID (an incarnation), never taken for a member
//     an old operation's group lists. Splits and merges drain the
//     partitions they retire the same way, under a reshape lease
//     (reshape.go): a retired participant takes its records with it, so
//     nothing may be in doubt at any member when it retires.
//
// Departures from DDS, and why. DDS's rule, "if any peer received a
// commit, commit; if not, abort", loses a committed write when the only
// replica that committed it, and served a read of it, fails before its
// peers hear of it (UnsafeParticipant.PaperRule; the simulator catches
// it). Deciding locally on what one saw is not enough either: two peers
// can see different members before a removal decree reaches both, one an
// Aborted answer from a member that then died, the other only Prepared
// answers from the survivors. So where DDS's replicas would abort, Grove's
// agree through the config service, which a termination needs only when a
// coordinator failed between its two phases. DDS assumed no partitions, so
// a library dropped a brick it could not reach; here only a decree after
// the failure detector's verdict removes one (rule 4).
//
// Operation ids must be unique (sessions are random 64-bit numbers); a
// reused one is refused at prepare and at decide (Update.Digest), but
// peers' termination assumes unique ids.
//
// A Participant is not safe for concurrent use; its runtime serializes
// calls. Durability contract: the caller applies each Applied update to the
// partition's store before any reply returned with it leaves the brick.
// A participant whose brick lost its records (a restart) must not be
// recreated in place: the brick is removed from the group by decree and
// rejoins by recovery, with a fresh Participant, as DDS §4.3 does.
type Participant struct {
	cfg       ParticipantConfig
	partition Partition
	stamp     Stamp
	members   []BrickID
	joining   BrickID // the brick holding the partition's write lease; zero if none
	reshaper  BrickID // the member holding its split's or merge's lease; zero if none
	freeze    uint64  // the table's checkpoint in progress (Maps.Freeze.ID); 0 if none
	gen       uint64  // the table's generation (Maps.Gen)
	// replacing: the member the lease's holder replaces (a move); handedOff:
	// this replica is that member and told the holder it serves no read
	// while the holder's lease lasts (rebalance.go, step 3).
	replacing BrickID
	handedOff bool
	// born is the epoch of the maps this participant started with: it
	// prepares no operation of an earlier epoch (stamps must be equal),
	// though a participant of the same name before it may have (a
	// partition split and merged back, or restored; outside review 123).
	born uint64

	// locks: key → the Prepared operation holding its write lock.
	// Invariant: locks[k] == op iff ops[op].state == Prepared and
	// ops[op].update.Key == k.
	locks    map[uint64]OpID
	ops      map[OpID]*record
	sessions map[uint64]*session
	// unregister: operations forgotten whose outcome registers may go,
	// handed out by the next Tick.
	unregister []OpID
}

type record struct {
	state     State
	update    Update
	digest    uint32    // update's
	group     []BrickID // the operation's group, from its prepare
	at        time.Time // when it was prepared, or decided
	frozen    bool      // answered a peer "prepared", or resolving (rule 3)
	resolving bool
	answers   map[BrickID]State
	asked     map[BrickID]time.Time
	proposal  State     // Committed or Aborted once proposed (rule 2), else Absent
	proposed  time.Time // when last sent
	// registered: an outcome register may exist for the operation (this
	// participant proposed, or adopted a decree); it is removed once the
	// record is forgotten, when every member has decided (Effects.Forgets).
	registered bool
}

type session struct {
	done      uint64 // operations below this are finished
	lastHeard time.Time
	seqs      map[uint64]bool // the session's operations with a record here
}

// Applied is an update that this call committed; the caller applies it to
// the store (see the durability contract).
type Applied struct {
	Op     OpID
	Update Update
}

// NewParticipant is a participant for partition p of maps m, in which Self
// must be a member of p's group.
func NewParticipant(cfg ParticipantConfig, m *Maps, p Partition) (*Participant, error) {
	return NewParticipantStamped(cfg, m, p, m.Stamp())
}

// NewParticipantStamped is NewParticipant with m's stamp computed by the
// caller.
func NewParticipantStamped(cfg ParticipantConfig, m *Maps, p Partition, stamp Stamp) (*Participant, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	g, ok := m.RG[p]
	if !ok {
		return nil, fmt.Errorf("ddstable: partition %v is not in table %q's maps", p, m.Table)
	}
	if !slices.Contains(g, cfg.Self) {
		return nil, fmt.Errorf("ddstable: brick %v is not in partition %v's replica group %v", cfg.Self, p, g)
	}
	if cfg.MaxRecords == 0 {
		cfg.MaxRecords = 8 * cfg.MaxOps
	}
	return &Participant{
		cfg: cfg, partition: p, stamp: stamp, members: slices.Clone(g), joining: m.Joining[p], reshaper: m.Reshaping[p].Holder, freeze: m.Freeze.ID, gen: m.Gen, born: m.Epoch,
		replacing: m.Replacing[p],
		locks:     map[uint64]OpID{}, ops: map[OpID]*record{}, sessions: map[uint64]*session{},
	}, nil
}

// Members is the group as this participant knows it.
func (pt *Participant) Members() []BrickID { return slices.Clone(pt.members) }

// Stamp is the maps this participant checks calls against.
func (pt *Participant) Stamp() Stamp { return pt.stamp }

// InDoubt is the number of Prepared operations.
func (pt *Participant) InDoubt() int { return len(pt.locks) }

// StateOf is the participant's record of op (Absent if none).
func (pt *Participant) StateOf(op OpID) State {
	if r, ok := pt.ops[op]; ok {
		return r.state
	}
	return Absent
}

// Effects are what a call asks of its runtime: updates to apply to the
// store (before any reply leaves; see the durability contract), queries to
// send to peers, and outcome proposals to put to the config service.
type Effects struct {
	Applied   []Applied
	Queries   []PeerSend
	Proposals []Proposal
	// Forgets are operations whose outcome registers may be removed: the
	// record is forgotten because every member decided (a sweep answered
	// by every peer, or the session's Done mark), so no member proposes
	// again. (A register left behind is harmless, only space.)
	Forgets []OpID
}

func (e *Effects) add(o Effects) {
	e.Applied = append(e.Applied, o.Applied...)
	e.Queries = append(e.Queries, o.Queries...)
	e.Proposals = append(e.Proposals, o.Proposals...)
	e.Forgets = append(e.Forgets, o.Forgets...)
}

// SetMaps installs newer maps (a decree seen). It returns what
// terminations do now that a removed member no longer counts, and false
// when Self is no longer in the group: the caller then stops serving the
// partition.
func (pt *Participant) SetMaps(now time.Time, m *Maps) (Effects, bool) {
	return pt.SetMapsStamped(now, m, m.Stamp())
}

// SetMapsStamped is SetMaps with m's stamp computed by the caller once
// for all of a table's participants (encoding a large table's maps per
// partition cost seconds; review 121).
func (pt *Participant) SetMapsStamped(now time.Time, m *Maps, s Stamp) (Effects, bool) {
	if m.Gen != pt.gen {
		// The table was dropped and created again: another table.
		pt.members = nil
		return Effects{}, false
	}
	if s.Epoch <= pt.stamp.Epoch {
		return Effects{}, true
	}
	g, ok := m.RG[pt.partition]
	pt.stamp = s
	if !ok || !slices.Contains(g, pt.cfg.Self) {
		// A split or merge retires this partition, or a decree removed this
		// brick (after the detector declared it dead: it is stopping).
		pt.members = nil
		return Effects{}, false
	}
	pt.members = slices.Clone(g)
	if m.Joining[pt.partition] != pt.joining || m.Replacing[pt.partition] != pt.replacing {
		pt.handedOff = false // the move it handed off to ended: serve again
	}
	pt.joining = m.Joining[pt.partition]
	pt.replacing = m.Replacing[pt.partition]
	pt.reshaper = m.Reshaping[pt.partition].Holder
	pt.freeze = m.Freeze.ID
	var e Effects
	for op, r := range pt.ops {
		if r.resolving {
			e.add(pt.conclude(now, op, r))
		}
	}
	return e, true
}

// Prepare handles phase 1.
func (pt *Participant) Prepare(now time.Time, req Prepare) Vote {
	s := pt.heard(now, req.Op.Session, req.Done)
	if r, ok := pt.ops[req.Op]; ok {
		switch {
		case r.state == Aborted:
			return Vote{Reason: ReasonOld}
		case r.digest != req.Update.Digest():
			// Another operation under a used id (a session id reused):
			// never taken for the first (review 120, finding 6).
			return Vote{Reason: ReasonOld}
		default:
			return Vote{Yes: true} // a duplicate; the first answer stands
		}
	}
	if req.Op.Seq < s.done {
		return Vote{Reason: ReasonOld}
	}
	if len(pt.ops) >= pt.cfg.MaxRecords {
		return Vote{Reason: ReasonBusy} // no record: it would be one more
	}
	if req.Stamp != pt.stamp || req.Partition != pt.partition || !slices.Equal(req.Group, pt.members) || !pt.partition.Contains(req.Update.Key) {
		return pt.refuse(now, req.Op, Vote{Reason: ReasonRepair, Stamp: pt.stamp})
	}
	if (pt.joining != (BrickID{}) || pt.reshaper != (BrickID{}) || pt.freeze != 0) && !pt.cfg.Unsafe.IgnoreLease {
		return pt.refuse(now, req.Op, Vote{Reason: ReasonRecovering})
	}
	if _, held := pt.locks[req.Update.Key]; held {
		return pt.refuse(now, req.Op, Vote{Reason: ReasonConflict})
	}
	if len(pt.locks) >= pt.cfg.MaxOps {
		return pt.refuse(now, req.Op, Vote{Reason: ReasonBusy})
	}
	pt.ops[req.Op] = &record{state: Prepared, update: req.Update, digest: req.Update.Digest(), group: slices.Clone(req.Group), at: now}
	s.seqs[req.Op.Seq] = true
	pt.locks[req.Update.Key] = req.Op
	return Vote{Yes: true}
}

// refuse records a no vote (rule 1). Callers have checked MaxRecords.
func (pt *Participant) refuse(now time.Time, op OpID, v Vote) Vote {
	pt.ops[op] = &record{state: Aborted, at: now}
	pt.sessions[op.Session].seqs[op.Seq] = true
	return v
}

// tombstone records that op will never be prepared here, if there is room
// and the operation is not finished (below its session's Done mark: then
// it may have committed here and been forgotten). ok: it is recorded.
func (pt *Participant) tombstone(now time.Time, op OpID) bool {
	if len(pt.ops) >= pt.cfg.MaxRecords {
		return false
	}
	if s, known := pt.sessions[op.Session]; known && op.Seq < s.done {
		return false
	}
	s := pt.session(op.Session)
	s.seqs[op.Seq] = true
	pt.ops[op] = &record{state: Aborted, at: now}
	return true
}

// heard notes a message from session id, with its Done mark, and forgets
// the session's decided records below the mark.
func (pt *Participant) heard(now time.Time, id, done uint64) *session {
	s := pt.session(id)
	s.lastHeard = now
	if done > s.done {
		s.done = done
		for seq := range s.seqs {
			op := OpID{Session: id, Seq: seq}
			if r := pt.ops[op]; seq < done && (r == nil || r.state != Prepared) {
				if r != nil && r.registered {
					pt.unregister = append(pt.unregister, op)
				}
				delete(pt.ops, op)
				delete(s.seqs, seq)
			}
		}
	}
	return s
}

func (pt *Participant) session(id uint64) *session {
	s, ok := pt.sessions[id]
	if !ok {
		s = &session{seqs: map[uint64]bool{}}
		pt.sessions[id] = s
	}
	return s
}

// forget drops op's record.
func (pt *Participant) forget(op OpID) {
	if r := pt.ops[op]; r != nil && r.registered {
		pt.unregister = append(pt.unregister, op)
	}
	delete(pt.ops, op)
	if s, ok := pt.sessions[op.Session]; ok {
		delete(s.seqs, op.Seq)
	}
}

// Decide handles phase 2.
func (pt *Participant) Decide(now time.Time, req Decide) (Ack, []Applied) {
	pt.heard(now, req.Op.Session, req.Done)
	r, ok := pt.ops[req.Op]
	if !ok {
		if req.Commit {
			// Committed and swept (a commit needs this brick's yes): the
			// coordinator counts the answer as the commit's acknowledgement.
			return Ack{State: Absent}, nil
		}
		if req.Epoch != 0 && req.Epoch < pt.born {
			// Prepared, if anywhere here, by a participant of this name
			// before this one, whose records are gone (a split merged
			// back, a restore): it may have committed there. No
			// acknowledgement of the abort, and no tombstone (a prepare of
			// that epoch is refused here anyway: its stamp is not ours).
			return Ack{State: Absent, Later: true}, nil
		}
		if !pt.tombstone(now, req.Op) {
			// Finished and forgotten (a late abort, after the operation
			// may have committed here), or no room to promise: no
			// acknowledgement of the abort (review 120, findings 2, 3).
			return Ack{State: Absent}, nil
		}
		return Ack{State: Aborted}, nil
	}
	if r.state != Aborted && r.digest != req.Digest {
		// Another operation under this id (a reused session id): this one
		// was never prepared here, and never will be (rule 1).
		return Ack{State: Aborted}, nil
	}
	if r.state != Prepared {
		return Ack{State: r.state}, nil
	}
	if req.Commit {
		return Ack{State: Committed}, pt.decide(now, req.Op, r, Committed)
	}
	if r.frozen && !pt.cfg.Unsafe.NoFreeze {
		return Ack{State: Prepared}, nil // rule 3: resolving with the peers
	}
	pt.decide(now, req.Op, r, Aborted)
	return Ack{State: Aborted}, nil
}

// decide moves a Prepared record to its outcome and frees the key.
func (pt *Participant) decide(now time.Time, op OpID, r *record, s State) []Applied {
	if r.state != Prepared || (s != Committed && s != Aborted) {
		panic(fmt.Sprintf("ddstable: %v: %v → %v", op, r.state, s))
	}
	if pt.locks[r.update.Key] != op {
		panic(fmt.Sprintf("ddstable: %v prepared without the lock on key %d", op, r.update.Key))
	}
	delete(pt.locks, r.update.Key)
	r.state, r.at, r.resolving, r.answers, r.asked, r.proposal = s, now, false, nil, nil, Absent
	if pt.cfg.OnDecide != nil {
		pt.cfg.OnDecide(op, s)
	}
	if s == Committed {
		return []Applied{{Op: op, Update: r.update}}
	}
	return nil
}

// Query answers a peer's termination (or sweep) query.
func (pt *Participant) Query(now time.Time, q Query) State {
	r, ok := pt.ops[q.Op]
	if !ok {
		if q.Sweep {
			return Absent
		}
		if s, known := pt.sessions[q.Op.Session]; known && q.Op.Seq < s.done {
			// Finished (every member acknowledged its outcome) and forgotten
			// here. An asker still Prepared holds a late duplicate of the
			// prepare, which must not be applied: abort it. No tombstone:
			// this member may have committed the operation itself.
			return Aborted
		}
		// Rule 1: say no for good before saying it; with no room to
		// record, say nothing (the asker asks again).
		if !pt.tombstone(now, q.Op) {
			return Absent
		}
		return Aborted
	}
	if r.state == Prepared && !q.Sweep {
		r.frozen = true // rule 3
	}
	return r.state
}

// Answer takes a peer's answer to this participant's query.
func (pt *Participant) Answer(now time.Time, from BrickID, q Query, s State) Effects {
	r, ok := pt.ops[q.Op]
	if !ok {
		return Effects{}
	}
	if q.Sweep {
		if r.state != Prepared && r.answers != nil {
			r.answers[from] = s
			if pt.swept(r) {
				pt.forget(q.Op)
			}
		}
		return Effects{}
	}
	if r.state != Prepared || !r.resolving || s == Absent {
		return Effects{} // no answer: asked again at a later tick
	}
	r.answers[from] = s
	return pt.conclude(now, q.Op, r)
}

// Outcome takes the config service's decree for op (rule 2): the first
// proposal put to op's register, whoever made it.
func (pt *Participant) Outcome(now time.Time, op OpID, commit bool) Effects {
	r, ok := pt.ops[op]
	if !ok {
		return Effects{}
	}
	r.registered = true
	if pt.cfg.Unsafe.EarlyUnregister {
		pt.unregister = append(pt.unregister, op)
	}
	if r.state != Prepared {
		if (r.state == Committed) != commit && pt.cfg.Unsafe == (UnsafeParticipant{}) {
			panic(fmt.Sprintf("ddstable: %v is %v here but decreed commit=%v", op, r.state, commit))
		}
		return Effects{}
	}
	if commit {
		return Effects{Applied: pt.decide(now, op, r, Committed)}
	}
	pt.decide(now, op, r, Aborted)
	return Effects{}
}

// peers are the members of r's group still in the group, but Self.
func (pt *Participant) peers(r *record) []BrickID {
	var out []BrickID
	for _, b := range r.group {
		if b != pt.cfg.Self && slices.Contains(pt.members, b) {
			out = append(out, b)
		}
	}
	return out
}

// conclude applies rule 2 to a resolving record.
func (pt *Participant) conclude(now time.Time, op OpID, r *record) Effects {
	all, aborted := true, false
	for _, b := range pt.peers(r) {
		switch r.answers[b] {
		case Committed:
			return Effects{Applied: pt.decide(now, op, r, Committed)}
		case Aborted:
			aborted = true
		case Prepared:
		default:
			all = false
		}
	}
	if pt.cfg.Unsafe.PaperRule {
		if all {
			pt.decide(now, op, r, Aborted) // "if not, the replica aborts"
		}
		return Effects{}
	}
	if pt.cfg.Unsafe.LocalDecide {
		switch {
		case aborted:
			pt.decide(now, op, r, Aborted)
		case all:
			return Effects{Applied: pt.decide(now, op, r, Committed)}
		}
		return Effects{}
	}
	switch {
	case r.proposal != Absent:
		return Effects{} // proposed: waiting for the decree (Tick repeats it)
	case aborted:
		r.proposal = Aborted
	case all:
		r.proposal = Committed
	default:
		return Effects{}
	}
	r.proposed, r.registered = now, true
	return Effects{Proposals: []Proposal{{Op: op, Commit: r.proposal == Committed}}}
}

// swept: every peer answered a sweep query with something other than
// Prepared, so none will ask about the record again.
func (pt *Participant) swept(r *record) bool {
	for _, b := range pt.peers(r) {
		if s, ok := r.answers[b]; !ok || s == Prepared {
			return false
		}
	}
	return true
}

// Tick starts terminations that are due, repeats unanswered queries and
// proposals not yet decreed, and sweeps old records.
func (pt *Participant) Tick(now time.Time) Effects {
	var e Effects
	for op, r := range pt.ops {
		switch {
		case r.state == Prepared && !r.resolving && now.Sub(r.at) >= pt.cfg.PrepareTimeout:
			r.resolving, r.frozen = true, true
			r.answers, r.asked = map[BrickID]State{}, map[BrickID]time.Time{}
			e.add(pt.conclude(now, op, r)) // a group with no other member left
			if r.state == Prepared {
				e.Queries = append(e.Queries, pt.ask(now, op, r, false)...)
			}
		case r.state == Prepared && r.resolving:
			e.Queries = append(e.Queries, pt.ask(now, op, r, false)...)
			if r.proposal != Absent && now.Sub(r.proposed) >= pt.cfg.QueryEvery {
				r.proposed = now
				e.Proposals = append(e.Proposals, Proposal{Op: op, Commit: r.proposal == Committed})
			}
		case r.state != Prepared && now.Sub(r.at) >= pt.cfg.RecordLife:
			if r.answers == nil {
				r.answers, r.asked = map[BrickID]State{}, map[BrickID]time.Time{}
			}
			if pt.swept(r) {
				pt.forget(op)
				continue
			}
			e.Queries = append(e.Queries, pt.ask(now, op, r, true)...)
		}
	}
	for id, s := range pt.sessions {
		if len(s.seqs) == 0 && now.Sub(s.lastHeard) >= pt.cfg.RecordLife {
			delete(pt.sessions, id)
		}
	}
	e.Forgets, pt.unregister = append(e.Forgets, pt.unregister...), nil
	return e
}

// ask sends q to the peers that have not answered, at most every QueryEvery.
func (pt *Participant) ask(now time.Time, op OpID, r *record, sweep bool) []PeerSend {
	var out []PeerSend
	for _, b := range pt.peers(r) {
		if st, ok := r.answers[b]; ok && (!sweep || st != Prepared) {
			continue // (a peer prepared at a sweep is asked again: review 125)
		}
		if t, ok := r.asked[b]; ok && now.Sub(t) < pt.cfg.QueryEvery {
			continue
		}
		r.asked[b] = now
		out = append(out, PeerSend{To: b, Query: Query{Op: op, Sweep: sweep}})
	}
	return out
}

// Errors of CopyReady.
var (
	ErrNoLease = errors.New("ddstable: the brick asking to copy holds no write lease on the partition here")
	ErrInDoubt = errors.New("ddstable: operations are in doubt at this replica; retry")
)

// CopyReady says whether this replica is settled for a recovering brick
// (DDS §4.3, step 2): its maps give that brick the partition's write
// lease, so no prepare is accepted here, and nothing is in doubt here.
// Once true it stays true while the lease lasts. The newcomer copies only
// once every member is settled (rule 6); the caller snapshots the store
// under the same lock.
func (pt *Participant) CopyReady(joiner BrickID) error {
	if joiner == (BrickID{}) || pt.joining != joiner {
		return ErrNoLease
	}
	if len(pt.locks) > 0 && !pt.cfg.Unsafe.CopyInDoubt {
		return ErrInDoubt
	}
	return nil
}

// ReshapeReady says whether this replica is settled for a split or merge
// (reshape.go, step 2): its maps give holder the partition's reshape
// lease, so no prepare is accepted here, and nothing is in doubt here. Once
// true it stays true while the lease lasts.
func (pt *Participant) ReshapeReady(holder BrickID) error {
	if holder == (BrickID{}) || pt.reshaper != holder {
		return ErrNoLease
	}
	if len(pt.locks) > 0 && !pt.cfg.Unsafe.ReshapeInDoubt {
		return ErrInDoubt
	}
	return nil
}

// FreezeReady says whether this replica is settled for checkpoint id
// (checkpoint.go, step 2): its maps freeze the table for id, so no prepare
// is accepted here, and nothing is in doubt here. Once true it stays true
// while the freeze lasts, and the replica's data does not change.
func (pt *Participant) FreezeReady(id uint64) error {
	if id == 0 || pt.freeze != id {
		return ErrNoLease
	}
	if len(pt.locks) > 0 {
		return ErrInDoubt
	}
	return nil
}

// HandOff stops reads here for a move whose holder is joiner and whose
// replaced member is this replica (rebalance.go, step 3), until the maps
// end the move: ErrNoLease if the maps here are not those of such a move
// (not yet, or no longer). Once it returned nil, no read is served here
// at the maps of this move, so the holder may take this replica's place.
func (pt *Participant) HandOff(joiner BrickID) error {
	if joiner == (BrickID{}) || pt.joining != joiner || pt.replacing != pt.cfg.Self {
		return ErrNoLease
	}
	pt.handedOff = true
	return nil
}

// Read checks that key may be read here with the caller's maps: nil, or
// ErrRepair (the caller refreshes its maps), ErrHandedOff (read another
// replica), or ErrBusy (rule 5; retry).
func (pt *Participant) Read(key uint64, stamp Stamp) error {
	if stamp != pt.stamp || !pt.partition.Contains(key) {
		return ErrRepair
	}
	if pt.handedOff {
		return ErrHandedOff
	}
	if _, held := pt.locks[key]; held {
		return ErrBusy
	}
	return nil
}
