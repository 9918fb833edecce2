package ddstable

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/lock"
	"github.com/grovestore/grove/internal/meta"
	"github.com/grovestore/grove/internal/transport"
)

// Detector is the failure detector as the bricks ask it: which node
// incarnations are dead (final verdicts).
type Detector interface {
	Dead(ctx context.Context, subjects []lock.Subject) ([]bool, error)
}

// Liveness is the node's view of itself, per incarnation.
type Liveness interface {
	// Deadline is the local time until which inc is guaranteed alive, if
	// inc is running and alive.
	Deadline(inc uint64) (time.Time, bool)
}

// ServiceConfig wires a node's brick into the node.
type ServiceConfig struct {
	Node     uint64
	Meta     *meta.Client
	Detector Detector
	Live     Liveness
	Log      *slog.Logger
	// Participant tunes every replica's participant (Self is filled in).
	Participant ParticipantConfig
	// Tick is how often participants are ticked (default 50 ms).
	Tick time.Duration
	// JanitorEvery is how often the brick asks the failure detector about
	// the other members of its groups (default 1 s).
	JanitorEvery time.Duration
	// SplitBytes: a partition whose replica here holds more than this
	// many bytes of values is split, by the group's first member (default
	// DefaultSplitBytes; negative: never on its own, only when asked).
	SplitBytes int
	// Dir holds the brick's checkpoint files (checkpointer.go); empty: the
	// brick writes none, so no checkpoint of a table it serves completes.
	Dir string
	// CallTimeout bounds one query to a peer or one decree (default 2 s).
	CallTimeout time.Duration
	// RebalanceEvery is how often an idle brick plans a move onto itself
	// (rebalance.go; default 5 s); negative: never (moves only when an
	// operator asks).
	RebalanceEvery time.Duration
}

// Service is a node's brick (DDS §4): the replicas of the table partitions
// whose groups list the node's running incarnation, each a Participant
// and an in-memory store. It serves the libraries' two-phase commit and
// reads, its peers' termination queries, and runs the participants'
// effects: queries to peers, outcome proposals to the config service. It
// implements pb.TableServiceServer.
//
// Durability contract (DDS's: "the image of each replica must only be
// consistent through its brick's cache"): a committed update is in the
// brick's memory before its acknowledgement leaves; replicas are kept
// identical by two-phase commit, and a table survives the loss of all but
// one member of each group. A restarted node's brick holds nothing and
// serves no group it was in: its new incarnation is another brick
// (BrickID), and its old one is decreed out of every group once the
// failure detector declares it dead.
//
// Serving rule: a brick answers anything only while its incarnation is
// running and guaranteed alive (Liveness): once the detector may declare
// it dead, and the janitor remove it, it must not vote, answer a peer or
// serve a read.
type Service struct {
	pb.UnimplementedTableServiceServer
	cfg   ServiceConfig
	log   *slog.Logger
	ctx   context.Context
	stop  context.CancelFunc
	wg    sync.WaitGroup
	conns transport.Pool
	book  *meta.AddressBook
	mu    struct {
		sync.Mutex
		inc    uint64 // the running incarnation; 0 when none
		fenced uint64 // the latest incarnation fenced
		tables map[string]*Maps
		stamps map[string]Stamp // of tables, computed once per decree
		reps   map[repKey]*replica
		// retired: replicas this incarnation left; served again only from
		// a copy made under a write lease (a recovery or a move back) or a
		// restored image, never from nothing (review 127: a brick moved
		// off a partition could otherwise never refill it).
		retired map[repKey]bool
		// pending: partitions this incarnation copied under its write
		// lease, installed as the replica when the join decree lists it.
		pending map[repKey]map[uint64][]byte
		// joining: partitions this incarnation is recovering into; a group
		// that lists the brick there is served only from the copy, which
		// is kept until the maps list the brick or end its lease.
		joining map[repKey]bool
		// proposing: operations whose outcome proposal is queued or in
		// flight; proposals: those queued, decreed together by the
		// proposer (one decree per batch: review 121 measured 300
		// operations in doubt, proposed one decree each, taking 24 s);
		// forgets: outcome registers to remove, likewise.
		proposing map[OpID]bool
		proposals []queuedProposal
		forgets   []string
		// queries: the termination and sweep queries waiting for their
		// peer, a batch per (replica, peer) with one call in flight at a
		// time. One call per query, sent again every QueryEvery whether
		// or not the last one had been answered, set off a storm when a
		// library died with 300 operations prepared on starved nodes
		// (2026-12-03): thousands of calls in flight, each outliving its
		// deadline, and nothing resolved in 2 min.
		queries map[queryKey]*queryQueue
		// known: the tables (by generation) this incarnation has seen;
		// empty replicas are made only for the first maps of a table.
		known map[tableGen]bool
		// ckpt: the latest checkpoint of each table this incarnation wrote
		// or is writing its files of; ckptRetry: not before then after a
		// failed write.
		ckpt      map[tableGen]uint64
		ckptRetry map[tableGen]time.Time
		// restoring: partitions this incarnation is restoring from a
		// checkpoint (their image in pending), each with the dead group it
		// replaces.
		restoring map[repKey][]BrickID
		// pruned: the last checkpoint of each table older files were
		// removed for.
		pruned map[tableGen]uint64
	}
	started sync.Once
	// kick wakes the reshaper when the maps give this brick a split's,
	// merge's or checkpoint's lease (writes wait while it runs).
	kick chan struct{}
	// moveKick wakes the recoverer when the maps give this brick a move's
	// lease it does not drive yet (an operator's move starts at once, not
	// at the next round).
	moveKick chan struct{}
}

type queryKey struct {
	k  repKey
	to BrickID
}

// queryQueue is the queries of one replica to one peer not yet sent, in
// the order asked, each once.
type queryQueue struct {
	r      *replica
	items  []Query
	queued map[Query]bool
	busy   bool // a call is in flight (its goroutine sends the rest after)
}

// Bound of one batch of queries: an answer is 4 bytes a query.
const queryBatch = 4096

type queuedProposal struct {
	k repKey
	r *replica
	p Proposal
}

type tableGen struct {
	table string
	gen   uint64
}

type repKey struct {
	table string
	gen   uint64 // the table's generation: a table created again is another
	part  Partition
}

// replica is one partition's replica on this brick.
type replica struct {
	pt    *Participant
	store map[uint64][]byte
	bytes int
}

// NewService returns a stopped service; Start runs an incarnation.
func NewService(cfg ServiceConfig) *Service {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Tick == 0 {
		cfg.Tick = 50 * time.Millisecond
	}
	if cfg.JanitorEvery == 0 {
		cfg.JanitorEvery = time.Second
	}
	if cfg.SplitBytes == 0 {
		cfg.SplitBytes = DefaultSplitBytes
	}
	if cfg.CallTimeout == 0 {
		cfg.CallTimeout = 2 * time.Second
	}
	if cfg.RebalanceEvery == 0 {
		cfg.RebalanceEvery = 5 * time.Second
	}
	if cfg.Participant.PrepareTimeout == 0 {
		cfg.Participant = DefaultParticipantConfig(BrickID{})
	}
	s := &Service{cfg: cfg, log: cfg.Log.With("layer", "ddstable"), book: meta.NewAddressBook(cfg.Meta), kick: make(chan struct{}, 1), moveKick: make(chan struct{}, 1)}
	s.ctx, s.stop = context.WithCancel(context.Background())
	s.mu.tables = map[string]*Maps{}
	s.mu.stamps = map[string]Stamp{}
	s.mu.reps = map[repKey]*replica{}
	s.mu.retired = map[repKey]bool{}
	s.mu.pending = map[repKey]map[uint64][]byte{}
	s.mu.joining = map[repKey]bool{}
	s.mu.proposing = map[OpID]bool{}
	s.mu.queries = map[queryKey]*queryQueue{}
	s.mu.known = map[tableGen]bool{}
	s.mu.ckpt = map[tableGen]uint64{}
	s.mu.ckptRetry = map[tableGen]time.Time{}
	s.mu.restoring = map[repKey][]BrickID{}
	s.mu.pruned = map[tableGen]uint64{}
	return s
}

// Start runs incarnation inc: the brick serves the groups that list
// BrickID{Node, inc}.
func (s *Service) Start(inc uint64) {
	s.started.Do(func() {
		s.wg.Add(6)
		go s.watch()
		go s.ticker()
		go s.janitor()
		go s.recoverer()
		go s.reshaper()
		go s.proposer()
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	if inc <= s.mu.inc || inc <= s.mu.fenced {
		return
	}
	s.dropAllLocked()
	s.mu.inc = inc
	s.syncLocked(time.Now())
}

// Fence stops incarnation inc: its replicas are gone with it.
func (s *Service) Fence(inc uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mu.fenced = max(s.mu.fenced, inc)
	if s.mu.inc == inc {
		s.dropAllLocked()
		s.mu.inc = 0
		s.log.Warn("brick stopped: the node fenced itself", "incarnation", inc)
	}
}

func (s *Service) dropAllLocked() {
	clear(s.mu.reps)
	clear(s.mu.retired)
	clear(s.mu.pending)
	clear(s.mu.joining)
	clear(s.mu.known)
	clear(s.mu.ckpt)
	clear(s.mu.ckptRetry)
	clear(s.mu.restoring)
	clear(s.mu.queries) // their goroutines see it and end
}

// Close stops the service.
func (s *Service) Close() {
	s.mu.Lock()
	s.stop() // under mu: effectsLocked adds no goroutine after it
	s.mu.Unlock()
	s.wg.Wait()
	s.conns.Close()
	s.book.Close()
}

func (s *Service) self() BrickID { return BrickID{Node: s.cfg.Node, Inc: s.mu.inc} }

func (s *Service) watch() {
	defer s.wg.Done()
	for ns := range s.cfg.Meta.Watch(s.ctx, Namespace, 0) {
		ts, bad := decodeTablesNamed(ns)
		stamps := make(map[string]Stamp, len(ts))
		for name, m := range ts {
			stamps[name] = m.Stamp()
		}
		s.mu.Lock()
		for name, err := range bad {
			// A record this build cannot read (a newer format, during an
			// upgrade): the table is not dropped, its replicas are kept
			// with the maps last read, which refuse the newer maps' calls
			// (outside review 123: dropping them lost the data, and made
			// them empty once the record decoded again).
			s.log.Error("a table's maps do not decode; its replicas are kept, with the maps last read, until they do", "err", err)
			if old := s.mu.tables[name]; old != nil {
				ts[name], stamps[name] = old, s.mu.stamps[name]
			}
		}
		s.mu.tables, s.mu.stamps = ts, stamps
		s.syncLocked(time.Now())
		s.mu.Unlock()
	}
}

// syncLocked makes the replicas those of the latest maps: new groups that
// list this brick get a fresh replica (a group that lists a brick from its
// creation commits nothing without it), maps are passed on, and replicas
// no longer listed are dropped for good.
func (s *Service) syncLocked(now time.Time) {
	if s.mu.inc == 0 {
		return
	}
	self := s.self()
	stampOf := func(m *Maps) Stamp { return s.mu.stamps[m.Table] }
	retiring := map[tableGen]map[Partition]Retiree[[]byte]{}
	for k, r := range s.mu.reps {
		m, ok := s.mu.tables[k.table]
		if !ok || m.Gen != k.gen {
			delete(s.mu.reps, k)
			s.log.Info("replica dropped: table dropped", "table", k.table, "partition", k.part)
			continue
		}
		if m.Epoch > r.pt.Stamp().Epoch {
			e, member := r.pt.SetMapsStamped(now, m, stampOf(m))
			s.effectsLocked(k, r, e)
			if !member {
				delete(s.mu.reps, k)
				tg := tableGen{k.table, k.gen}
				if retiring[tg] == nil {
					retiring[tg] = map[Partition]Retiree[[]byte]{}
				}
				retiring[tg][k.part] = Retiree[[]byte]{Store: r.store, Settled: r.pt.InDoubt() == 0}
			}
		}
	}
	// What a split or a merge hands on (reshape.go, step 3); any other
	// replica retired is dropped for good.
	inherited := map[repKey]map[uint64][]byte{}
	for tg, ret := range retiring {
		m := s.mu.tables[tg.table]
		stores, lost := Inherit(m, self, ret)
		for p, st := range stores {
			inherited[repKey{tg.table, tg.gen, p}] = st
		}
		for _, p := range lost {
			s.log.Error("partition not served: a split or merge retired this brick's replica of it with operations in doubt, or without both halves",
				"table", tg.table, "partition", p, "epoch", m.Epoch)
		}
		for p := range ret {
			if len(stores) == 0 && len(lost) == 0 {
				s.mu.retired[repKey{tg.table, tg.gen, p}] = true
				s.log.Warn("replica dropped: this brick left the group", "table", tg.table, "partition", p, "epoch", m.Epoch)
			} else {
				s.log.Info("replica retired by a split or merge", "table", tg.table, "partition", p, "epoch", m.Epoch)
			}
		}
	}
	for k := range s.mu.joining {
		if _, copied := s.mu.pending[k]; copied {
			s.resolveJoinLocked(k)
		}
	}
	for k := range s.mu.restoring {
		s.resolveRestoreLocked(k)
	}
	for name, m := range s.mu.tables {
		tg := tableGen{name, m.Gen}
		fresh := !s.mu.known[tg]
		s.mu.known[tg] = true
		for p, g := range m.RG {
			k := repKey{name, m.Gen, p}
			if !slices.Contains(g, self) || s.mu.reps[k] != nil {
				continue
			}
			if st, ok := inherited[k]; ok {
				if s.startReplicaLocked(k, m, st) {
					delete(s.mu.retired, k) // a partition split and merged back
					s.log.Info("replica serves, made by a split or merge", "table", name, "partition", p, "keys", len(st), "epoch", m.Epoch)
				}
				continue
			}
			store, copied := s.mu.pending[k]
			if s.mu.retired[k] && !copied {
				continue
			}
			if !copied && !fresh {
				// Listed, with neither a copy nor a split's or merge's data:
				// a group lists a brick empty only at the table's creation,
				// which is the first maps of the table this incarnation saw
				// (a brick joins later only by recovery, with a copy).
				if !s.mu.joining[k] {
					s.log.Error("replica not started: listed without a copy or an inherited store", "table", name, "partition", p, "epoch", m.Epoch)
				}
				continue
			}
			if !copied && s.mu.joining[k] {
				// Listed by a recovery of this incarnation whose copy is gone:
				// never serve it empty.
				s.log.Error("replica not started: joined without a copy", "table", name, "partition", p)
				continue
			}
			if !copied {
				store = map[uint64][]byte{}
			}
			if s.startReplicaLocked(k, m, store) && copied {
				// A group this brick recovered into (DDS §4.3), or a
				// partition it restored: its copy.
				delete(s.mu.pending, k)
				delete(s.mu.joining, k)
				delete(s.mu.restoring, k)
				delete(s.mu.retired, k) // a fresh participant, from a whole copy
				s.log.Info("replica serves, recovered or restored", "table", name, "partition", p, "keys", len(store), "epoch", m.Epoch)
			}
		}
	}
	s.checkpointLocked()
	for name, m := range s.mu.tables {
		for p, j := range m.Joining {
			if j == self && m.Replacing[p] != (BrickID{}) && !s.mu.joining[repKey{name, m.Gen, p}] {
				select {
				case s.moveKick <- struct{}{}:
				default:
				}
			}
		}
	}
	for _, m := range s.mu.tables {
		held := m.Freeze.Holder == self
		for _, r := range m.Reshaping {
			held = held || r.Holder == self
		}
		if held {
			select {
			case s.kick <- struct{}{}:
			default:
			}
			break
		}
	}
}

// startReplicaLocked starts this brick's replica k of maps m with store.
func (s *Service) startReplicaLocked(k repKey, m *Maps, store map[uint64][]byte) bool {
	pc := s.cfg.Participant
	pc.Self = s.self()
	pt, err := NewParticipantStamped(pc, m, k.part, s.mu.stamps[m.Table])
	if err != nil {
		s.log.Error("replica not started", "table", k.table, "partition", k.part, "err", err)
		return false
	}
	r := &replica{pt: pt, store: store}
	for _, v := range store {
		r.bytes += len(v)
	}
	s.mu.reps[k] = r
	return true
}

// effectsLocked carries out a participant's effects: updates applied now
// (before the caller's reply leaves), queries and proposals sent.
func (s *Service) effectsLocked(k repKey, r *replica, e Effects) {
	for _, a := range e.Applied {
		old, had := r.store[a.Update.Key]
		if had {
			r.bytes -= len(old)
		}
		if a.Update.Remove {
			delete(r.store, a.Update.Key)
		} else {
			r.store[a.Update.Key] = a.Update.Value
			r.bytes += len(a.Update.Value)
		}
	}
	if s.ctx.Err() != nil {
		return
	}
	for _, q := range e.Queries {
		qk := queryKey{k, q.To}
		qq := s.mu.queries[qk]
		if qq == nil || qq.r != r {
			if qq != nil && qq.busy {
				// The replica was replaced: the old one's call ends alone.
				qq.r, qq.items, qq.queued = r, nil, map[Query]bool{}
			} else {
				qq = &queryQueue{r: r, queued: map[Query]bool{}}
				s.mu.queries[qk] = qq
			}
		}
		if qq.queued[q.Query] {
			continue
		}
		qq.queued[q.Query] = true
		qq.items = append(qq.items, q.Query)
		if !qq.busy {
			qq.busy = true
			s.wg.Add(1)
			go s.query(qk, qq)
		}
	}
	for _, p := range e.Proposals {
		if s.mu.proposing[p.Op] {
			continue // one proposal in flight per operation (review 121)
		}
		s.mu.proposing[p.Op] = true
		s.mu.proposals = append(s.mu.proposals, queuedProposal{k, r, p})
	}
	for _, op := range e.Forgets {
		s.mu.forgets = append(s.mu.forgets, outcomeKey(k.table, k.part, op))
	}
}

// query sends qq's queries to their peer, a batch at a time, until none
// is left; unanswered ones are asked again by the participant's ticks.
func (s *Service) query(qk queryKey, qq *queryQueue) {
	defer s.wg.Done()
	for {
		s.mu.Lock()
		if len(qq.items) == 0 || s.ctx.Err() != nil || s.mu.queries[qk] != qq || s.mu.reps[qk.k] != qq.r {
			qq.busy = false
			if s.mu.queries[qk] == qq {
				delete(s.mu.queries, qk)
			}
			s.mu.Unlock()
			return
		}
		r, from := qq.r, s.self()
		batch := qq.items[:min(len(qq.items), queryBatch)]
		qq.items = qq.items[len(batch):]
		for _, q := range batch {
			delete(qq.queued, q)
		}
		s.mu.Unlock()
		states, err := s.askPeer(qk, from, batch)
		s.mu.Lock()
		if err == nil && s.mu.reps[qk.k] == r {
			now := time.Now()
			for i, st := range states { // (fewer than the batch from an older build)
				s.effectsLocked(qk.k, r, r.pt.Answer(now, qk.to, batch[i], st))
			}
		}
		s.mu.Unlock()
	}
}

// askPeer sends one batch of queries to qk's peer.
func (s *Service) askPeer(qk queryKey, from BrickID, batch []Query) ([]State, error) {
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.CallTimeout)
	defer cancel()
	cl, err := s.client(ctx, qk.to.Node)
	if err != nil {
		return nil, err
	}
	// The first query also in the single form: a build that predates
	// batches answers that one (State, no States), and the rest are asked
	// again at later ticks (review 126).
	req := &pb.TableQueryRequest{Table: qk.k.table, To: brickPB(qk.to), From: brickPB(from), Partition: partPB(qk.k.part),
		Op: opPB(batch[0].Op), Sweep: batch[0].Sweep}
	for _, q := range batch {
		req.Items = append(req.Items, &pb.TableQueryItem{Op: opPB(q.Op), Sweep: q.Sweep})
	}
	a, err := cl.Query(ctx, req)
	if err != nil {
		return nil, err
	}
	if len(a.GetStates()) == 0 {
		return []State{stateOf(a.GetState())}, nil
	}
	if len(a.GetStates()) != len(batch) {
		return nil, fmt.Errorf("ddstable: %d answers to %d queries", len(a.GetStates()), len(batch))
	}
	out := make([]State, len(batch))
	for i, st := range a.GetStates() {
		out[i] = stateOf(st)
	}
	return out, nil
}

// Bounds of one proposer decree (the config service takes at most
// meta.MaxOps operations and 1 MiB per decree; keys are at most 256 bytes).
const proposalBatch = 256

// proposer decrees the queued outcome proposals, a batch per decree, each
// register's first decree standing (rule 2), and removes the registers
// of operations every member has decided.
func (s *Service) proposer() {
	s.every(s.cfg.Tick, func() {
		for s.ctx.Err() == nil {
			s.mu.Lock()
			batch := s.mu.proposals[:min(len(s.mu.proposals), proposalBatch)]
			s.mu.proposals = s.mu.proposals[len(batch):]
			forgets := s.mu.forgets[:min(len(s.mu.forgets), proposalBatch)]
			s.mu.forgets = s.mu.forgets[len(forgets):]
			s.mu.Unlock()
			if len(batch) == 0 && len(forgets) == 0 {
				return
			}
			if len(batch) > 0 {
				s.propose(batch)
			}
			if len(forgets) > 0 {
				s.unregister(forgets)
			}
		}
	})
}

func (s *Service) propose(batch []queuedProposal) {
	defer func() {
		s.mu.Lock()
		for _, q := range batch {
			delete(s.mu.proposing, q.p.Op)
		}
		s.mu.Unlock()
	}()
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.CallTimeout)
	defer cancel()
	decided := make([]bool, len(batch))
	live := make([]bool, len(batch))
	_, err := s.cfg.Meta.Update(ctx, OutcomeNamespace, fmt.Sprintf("dds-%d", s.cfg.Node), func(ns *pb.Namespace) ([]*pb.Op, error) {
		have := make(map[string]bool, len(ns.GetEntries()))
		for _, e := range ns.GetEntries() {
			have[e.Key] = string(e.Value) == "commit"
		}
		// Only proposals whose record is still prepared here, checked
		// after the read (again at each retry of a stale version): a
		// register is removed only once every member decided, so one
		// absent now was never removed; a proposal whose record was
		// decided meanwhile could re-create a removed register with
		// another value (outside review 125).
		s.mu.Lock()
		for i, q := range batch {
			live[i] = s.mu.reps[q.k] == q.r && q.r.pt.StateOf(q.p.Op) == Prepared
		}
		s.mu.Unlock()
		var ops []*pb.Op
		for i, q := range batch {
			if !live[i] {
				continue
			}
			key := outcomeKey(q.k.table, q.k.part, q.p.Op)
			if v, ok := have[key]; ok {
				decided[i] = v
				continue
			}
			decided[i] = q.p.Commit
			have[key] = q.p.Commit
			v := "abort"
			if q.p.Commit {
				v = "commit"
			}
			ops = append(ops, &pb.Op{Kind: pb.Op_KIND_PUT, Key: key, Value: []byte(v)})
		}
		return ops, nil
	})
	if err != nil {
		return // proposed again at a later tick
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, q := range batch {
		if live[i] && s.mu.reps[q.k] == q.r {
			s.log.Info("operation resolved through the config service", "table", q.k.table, "partition", q.k.part, "op", q.p.Op, "commit", decided[i])
			s.effectsLocked(q.k, q.r, q.r.pt.Outcome(time.Now(), q.p.Op, decided[i]))
		}
	}
}

// unregister removes outcome registers (those that exist).
func (s *Service) unregister(keys []string) {
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.CallTimeout)
	defer cancel()
	_, err := s.cfg.Meta.Update(ctx, OutcomeNamespace, fmt.Sprintf("dds-gc-%d", s.cfg.Node), func(ns *pb.Namespace) ([]*pb.Op, error) {
		have := make(map[string]bool, len(ns.GetEntries()))
		for _, e := range ns.GetEntries() {
			have[e.Key] = true
		}
		var ops []*pb.Op
		for _, k := range keys {
			if have[k] {
				ops = append(ops, &pb.Op{Kind: pb.Op_KIND_DELETE, Key: k})
				delete(have, k)
			}
		}
		return ops, nil
	})
	if err != nil {
		s.mu.Lock()
		s.mu.forgets = append(s.mu.forgets, keys...) // again at a later tick
		s.mu.Unlock()
	}
}

func (s *Service) client(ctx context.Context, node uint64) (pb.TableServiceClient, error) {
	return dialBrick(ctx, s.book, &s.conns, node)
}

// dialBrick is a TableService client of node's brick, at the address the
// book has for it, on a pooled connection.
func dialBrick(ctx context.Context, book *meta.AddressBook, conns *transport.Pool, node uint64) (pb.TableServiceClient, error) {
	addr, err := book.Addr(ctx, node)
	if err != nil {
		return nil, err
	}
	cc, err := conns.Get(addr)
	if err != nil {
		return nil, err
	}
	return pb.NewTableServiceClient(cc), nil
}

// every runs fn every d until the service closes.
func (s *Service) every(d time.Duration, fn func()) {
	defer s.wg.Done()
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		fn()
	}
}

func (s *Service) ticker() {
	s.every(s.cfg.Tick, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		now := time.Now()
		for k, r := range s.mu.reps {
			s.effectsLocked(k, r, r.pt.Tick(now))
		}
		s.checkpointLocked()
	})
}

// janitor asks the failure detector about the other members of this
// brick's groups and decrees the dead ones out (DDS §4.3; here only after
// the detector's verdict, since DDS's "cannot communicate means stopped"
// does not hold across a partition).
func (s *Service) janitor() {
	s.every(s.cfg.JanitorEvery, s.removeDead)
}

// removeDead is one round of the janitor.
func (s *Service) removeDead() {
	s.mu.Lock()
	self := s.self()
	seen := map[BrickID]bool{}
	var peers []BrickID
	for k, r := range s.mu.reps {
		ids := r.pt.Members()
		if m := s.mu.tables[k.table]; m != nil && m.Gen == k.gen {
			if j, ok := m.Joining[k.part]; ok {
				// A brick recovering into this group: one that dies holds
				// the lease until declared (review 122).
				ids = append(ids, j)
			}
		}
		for _, b := range ids {
			if b != self && !seen[b] {
				seen[b] = true
				peers = append(peers, b)
			}
		}
	}
	s.mu.Unlock()
	if len(peers) == 0 || s.cfg.Detector == nil {
		return
	}
	subs := make([]lock.Subject, len(peers))
	for i, b := range peers {
		subs[i] = lock.Subject{Node: b.Node, Inc: b.Inc}
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.CallTimeout)
	defer cancel()
	dead, err := s.cfg.Detector.Dead(ctx, subs)
	if err != nil {
		return // asked again next round
	}
	set := map[BrickID]bool{}
	for i, d := range dead {
		if d {
			set[peers[i]] = true
		}
	}
	if len(set) == 0 {
		return
	}
	names := fmt.Sprint(slices.Collect(maps.Keys(set)))
	n, err := RemoveDead(ctx, s.cfg.Meta, set)
	if err != nil {
		s.log.Warn("dead bricks not yet removed from their groups", "bricks", names, "err", err)
	} else if n > 0 {
		s.log.Warn("dead bricks removed from their groups", "bricks", names, "tables", n)
	}
}

var errNotServing = status.Error(codes.Unavailable, "ddstable: this brick does not serve that replica")

// serving is the replica a request may use: addressed to this brick's
// running incarnation, while that incarnation is guaranteed alive.
func (s *Service) servingLocked(table string, p *pb.TablePartition, to *pb.TableBrick) (repKey, *replica, error) {
	part, ok := partOf(p)
	if !ok {
		return repKey{}, nil, status.Error(codes.InvalidArgument, "ddstable: invalid partition")
	}
	if s.mu.inc == 0 || brickOf(to) != s.self() {
		return repKey{}, nil, errNotServing
	}
	if s.cfg.Live != nil {
		if dl, ok := s.cfg.Live.Deadline(s.mu.inc); !ok || !time.Now().Before(dl) {
			return repKey{}, nil, status.Error(codes.Unavailable, "ddstable: this brick's incarnation is not known alive")
		}
	}
	m := s.mu.tables[table]
	if m == nil {
		return repKey{}, nil, errNotServing
	}
	k := repKey{table, m.Gen, part}
	r := s.mu.reps[k]
	if r == nil {
		return k, nil, errNotServing
	}
	return k, r, nil
}

// Prepare serves phase 1.
func (s *Service) Prepare(_ context.Context, req *pb.TablePrepareRequest) (*pb.TableVote, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, r, err := s.servingLocked(req.Table, req.Partition, req.To)
	if errors.Is(err, errNotServing) && s.mu.inc != 0 && brickOf(req.To) == s.self() {
		// The brick does not have the replica (yet, or any more): the
		// caller's maps differ from what this brick runs. A "no" it does
		// not record: a later copy of this prepare may find the replica
		// (review 121, finding 1).
		return &pb.TableVote{Reason: uint32(ReasonNotServing), Stamp: stampPB(s.mu.stamps[req.Table])}, nil
	}
	if err != nil {
		return nil, err
	}
	if len(req.Value) > MaxValue {
		return nil, status.Errorf(codes.InvalidArgument, "ddstable: a value of %d bytes (at most %d)", len(req.Value), MaxValue)
	}
	part, _ := partOf(req.Partition)
	v := r.pt.Prepare(time.Now(), Prepare{Op: opOf(req.Op), Partition: part, Stamp: stampOf(req.Stamp), Group: groupOf(req.Group),
		Update: Update{Key: req.Key, Value: req.Value, Remove: req.Remove}, Done: req.Done})
	return &pb.TableVote{Yes: v.Yes, Reason: uint32(v.Reason), Stamp: stampPB(v.Stamp)}, nil
}

// Decide serves phase 2.
func (s *Service) Decide(_ context.Context, req *pb.TableDecideRequest) (*pb.TableAck, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k, r, err := s.servingLocked(req.Table, req.Partition, req.To)
	if err != nil {
		return nil, err
	}
	part, _ := partOf(req.Partition)
	a, applied := r.pt.Decide(time.Now(), Decide{Op: opOf(req.Op), Partition: part, Epoch: req.Epoch, Digest: req.Digest, Commit: req.Commit, Done: req.Done})
	s.effectsLocked(k, r, Effects{Applied: applied})
	return &pb.TableAck{State: uint32(a.State), Later: a.Later}, nil
}

// Query answers a peer's termination or sweep query. A brick without the
// replica does not answer: only a participant's records are an answer.
func (s *Service) Query(_ context.Context, req *pb.TableQueryRequest) (*pb.TableQueryAnswer, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, r, err := s.servingLocked(req.Table, req.Partition, req.To)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	if len(req.Items) == 0 { // a single query (no brick sends one now)
		st := r.pt.Query(now, Query{Op: opOf(req.Op), Sweep: req.Sweep})
		return &pb.TableQueryAnswer{State: uint32(st)}, nil
	}
	a := &pb.TableQueryAnswer{States: make([]uint32, len(req.Items))}
	for i, it := range req.Items {
		a.States[i] = uint32(r.pt.Query(now, Query{Op: opOf(it.Op), Sweep: it.Sweep}))
	}
	return a, nil
}

// Get serves a read at this replica (rule 5: not while a write to the key
// is in doubt here).
func (s *Service) Get(_ context.Context, req *pb.TableGetRequest) (*pb.TableGetResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.mu.tables[req.Table]
	if m == nil {
		return &pb.TableGetResponse{Result: pb.TableGetResponse_RESULT_NOT_SERVING}, nil
	}
	_, r, err := s.servingLocked(req.Table, partPB(m.DP.Lookup(req.Key)), req.To)
	if errors.Is(err, errNotServing) {
		return &pb.TableGetResponse{Result: pb.TableGetResponse_RESULT_NOT_SERVING, Stamp: stampPB(s.mu.stamps[req.Table])}, nil
	}
	if err != nil {
		return nil, err
	}
	switch err := r.pt.Read(req.Key, stampOf(req.Stamp)); {
	case errors.Is(err, ErrBusy):
		return &pb.TableGetResponse{Result: pb.TableGetResponse_RESULT_BUSY}, nil
	case errors.Is(err, ErrRepair):
		return &pb.TableGetResponse{Result: pb.TableGetResponse_RESULT_REPAIR, Stamp: stampPB(r.pt.Stamp())}, nil
	case errors.Is(err, ErrHandedOff):
		return &pb.TableGetResponse{Result: pb.TableGetResponse_RESULT_NOT_SERVING, Stamp: stampPB(r.pt.Stamp())}, nil
	case err != nil:
		return nil, err
	}
	v, ok := r.store[req.Key]
	return &pb.TableGetResponse{Found: ok, Value: v}, nil
}

// Status reports the brick's replicas.
func (s *Service) Status(context.Context, *pb.TableBrickStatusRequest) (*pb.TableBrickStatus, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := &pb.TableBrickStatus{Node: s.cfg.Node, Inc: s.mu.inc, Checkpoints: s.checkpointFiles()}
	for k, r := range s.mu.reps {
		var settled uint64
		if m := s.mu.tables[k.table]; m != nil && m.Gen == k.gen && r.pt.FreezeReady(m.Freeze.ID) == nil {
			settled = m.Freeze.ID
		}
		out.Replicas = append(out.Replicas, &pb.TableReplicaStatus{Table: k.table, Partition: partPB(k.part),
			Epoch: r.pt.Stamp().Epoch, Keys: uint64(len(r.store)), Bytes: uint64(r.bytes), InDoubt: uint64(r.pt.InDoubt()), SettledFreeze: settled})
	}
	slices.SortFunc(out.Replicas, func(a, b *pb.TableReplicaStatus) int {
		if a.Table != b.Table {
			if a.Table < b.Table {
				return -1
			}
			return 1
		}
		return cmpU64(a.Partition.Bits, b.Partition.Bits)
	})
	return out, nil
}

// Copy streams a whole replica to a brick recovering into its group (DDS
// §4.3, step 2), once this participant's maps give that brick the
// partition's write lease and nothing is in doubt here (CopyReady). The
// snapshot is taken under the brick's lock; no write can commit at this
// replica after it until the lease ends (prepares are refused).
func (s *Service) Copy(req *pb.TableCopyRequest, stream pb.TableService_CopyServer) error {
	s.mu.Lock()
	_, r, err := s.servingLocked(req.Table, req.Partition, req.To)
	if err == nil && req.Probe && req.HandOff {
		// A move's holder asking the member it replaces to stop serving
		// reads (rebalance.go, step 3).
		err = r.pt.HandOff(brickOf(req.From))
		s.mu.Unlock()
		if err != nil {
			return status.Error(codes.FailedPrecondition, err.Error())
		}
		return stream.Send(&pb.TableCopyChunk{Last: true, HandedOff: true})
	}
	if err == nil && req.Probe && r.pt.ReshapeReady(brickOf(req.From)) == nil {
		// A split's or merge's holder asking whether this member is settled.
		s.mu.Unlock()
		return stream.Send(&pb.TableCopyChunk{Last: true})
	}
	if err == nil {
		if err = r.pt.CopyReady(brickOf(req.From)); err != nil {
			err = status.Error(codes.FailedPrecondition, err.Error())
		}
	}
	if err == nil && req.Probe {
		s.mu.Unlock()
		return stream.Send(&pb.TableCopyChunk{Last: true})
	}
	var entries []*pb.TableEntry
	if err == nil {
		entries = make([]*pb.TableEntry, 0, len(r.store))
		for k, v := range r.store {
			entries = append(entries, &pb.TableEntry{Key: k, Value: v})
		}
	}
	s.mu.Unlock()
	if err != nil {
		return err
	}
	slices.SortFunc(entries, func(a, b *pb.TableEntry) int { return cmpU64(a.Key, b.Key) })
	const chunkBytes = 1 << 20
	var chunk []*pb.TableEntry
	size := 0
	for i, e := range entries {
		chunk = append(chunk, e)
		size += len(e.Value) + 16
		if size >= chunkBytes || i == len(entries)-1 {
			last := i == len(entries)-1
			msg := &pb.TableCopyChunk{Entries: chunk, Last: last}
			if last {
				msg.Total = uint64(len(entries))
			}
			if err := stream.Send(msg); err != nil {
				return err
			}
			chunk, size = nil, 0
		}
	}
	if len(entries) == 0 {
		return stream.Send(&pb.TableCopyChunk{Last: true})
	}
	return nil
}

// recoverer brings short groups back to the table's replication degree
// with this brick (DDS §4.3): one partition at a time, it takes the
// partition's write lease by decree, waits until every member is settled
// under it (CopyReady: the lease in its maps, nothing in doubt), copies
// the whole partition from one of them, and joins the group by decree,
// which also ends the lease; the watch then installs the copy as the
// replica (participant.go, rule 6). A recovery that fails gives its lease
// up, and its partition is not tried again for RecoveryBackoff (a group
// whose every member died stays short for good). A recovering brick that
// dies loses its lease to the janitor, or to its node's next incarnation.
func (s *Service) recoverer() {
	defer s.wg.Done()
	t := time.NewTimer(s.cfg.JanitorEvery)
	defer t.Stop()
	failed := map[repKey]time.Time{} // partitions not to try before then
	nextPlan := time.Now().Add(s.cfg.RebalanceEvery)
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		case <-s.moveKick:
			if !t.Stop() {
				select {
				case <-t.C:
				default:
				}
			}
		}
		now := time.Now()
		s.mu.Lock()
		self := s.self()
		var k repKey
		found := false
		if s.mu.inc != 0 && len(s.mu.joining) == 0 {
			// Moves' leases decreed for this brick (by its planner, or an
			// operator) first: writes to their partitions wait until it
			// drives them (review 127). Then the short groups.
		pass:
			for _, moves := range []bool{true, false} {
				for _, name := range slices.Sorted(maps.Keys(s.mu.tables)) {
					m := s.mu.tables[name]
					for _, p := range m.DP.Leaves() {
						c := repKey{name, m.Gen, p}
						given := m.Joining[p] == self && m.Replacing[p] != (BrickID{}) && s.mu.pending[c] == nil
						if moves && given {
							k, found = c, true
							break pass
						}
						if moves || now.Before(failed[c]) {
							continue
						}
						if _, err := WithLease(m, p, self); err == nil {
							k, found = c, true
							break pass
						}
					}
				}
			}
		}
		if found {
			s.mu.joining[k] = true
		}
		idle := s.mu.inc != 0 && len(s.mu.joining) == 0
		// A join asked for and not known to have landed, while the maps
		// still show this brick's lease: ask again.
		var rejoin []repKey
		for j := range s.mu.joining {
			if m := s.mu.tables[j.table]; s.mu.pending[j] != nil && m != nil && m.Gen == j.gen && m.Joining[j.part] == self {
				rejoin = append(rejoin, j)
			}
		}
		s.mu.Unlock()
		for _, j := range rejoin {
			s.join(j, self, func(fn func(*Maps) (*Maps, error)) error { return s.updateTable(j, fn) }, s.log.With("table", j.table, "partition", j.part))
		}
		if idle && s.cfg.RebalanceEvery > 0 && !now.Before(nextPlan) {
			// Nothing to recover: a move onto this brick, if the plan
			// gives one (DDS §3.1; rebalance.go).
			nextPlan = now.Add(s.cfg.RebalanceEvery)
			if k, found = s.planMove(self, failed); found {
				s.mu.Lock()
				s.mu.joining[k] = true
				s.mu.Unlock()
			}
		}
		next := s.cfg.JanitorEvery
		if found {
			move := s.moving(k)
			switch joined, busy := s.recoverInto(k, self); {
			case joined:
				next = 10 * time.Millisecond // the next short group at once
			case busy:
				// Another brick recovers into it, or a split, merge or
				// checkpoint runs: not a failure; tried again soon (a 30 s
				// backoff here kept restored groups short), the others
				// meanwhile (review 125).
				failed[k] = time.Now().Add(2 * s.cfg.JanitorEvery)
			case move:
				failed[k] = time.Now().Add(moveBackoff)
			default:
				failed[k] = time.Now().Add(recoveryBackoff)
			}
		}
		t.Reset(next)
	}
}

// Bounds of one recovery.
const (
	recoveryBackoff = 30 * time.Second // a partition whose recovery failed waits this long
	settleTimeout   = 2 * time.Minute  // for every member to be settled under the lease
	// A move is optional work whose lease blocks the partition's writes:
	// it gives up sooner, and a failed one is not planned again for long
	// (review 127: a member that never hands off otherwise blocked writes
	// 4 minutes in every 4½).
	moveSettleTimeout = 30 * time.Second
	handOffTimeout    = 15 * time.Second
	moveBackoff       = 10 * time.Minute
)

// recoverInto runs one recovery; it reports whether the brick joined.
func (s *Service) recoverInto(k repKey, self BrickID) (joined, busy bool) {
	start := time.Now()
	log := s.log.With("table", k.table, "partition", k.part)
	update := func(fn func(m *Maps) (*Maps, error)) error { return s.updateTable(k, fn) }
	// giveUp, before any join decree was asked: the copy is dropped and
	// the lease released (tried a few times; else the janitor's, when this
	// brick dies, or the next try's).
	giveUp := func(why error) {
		s.mu.Lock()
		delete(s.mu.pending, k)
		delete(s.mu.joining, k)
		s.mu.Unlock()
		var err error
		for try := 0; try < 5 && s.ctx.Err() == nil; try++ {
			if err = update(func(m *Maps) (*Maps, error) {
				c, ok := WithoutLease(m, k.part, self)
				if !ok {
					return nil, nil
				}
				return c, nil
			}); err == nil || errors.Is(err, ErrNoTable) {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		log.Warn("recovery given up", "why", why, "lease released", err == nil)
	}
	// 1. The write lease.
	err := update(func(m *Maps) (*Maps, error) {
		if j, ok := m.Joining[k.part]; ok && j == self {
			return nil, nil // a resend found it taken
		}
		return WithLease(m, k.part, self)
	})
	if err != nil {
		s.mu.Lock()
		delete(s.mu.joining, k)
		s.mu.Unlock()
		busy = errors.Is(err, ErrLeaseHeld) || errors.Is(err, ErrNotShort) || errors.Is(err, ErrInGroup) ||
			errors.Is(err, ErrReshaping) || errors.Is(err, ErrCheckpointing)
		if !busy {
			log.Warn("recovery not started", "err", err)
		}
		return false, busy
	}
	log.Info("recovering into the group: write lease taken")
	// 2. Every member settled under the lease, then the copy from one.
	var data map[uint64][]byte
	var from BrickID
	limit := settleTimeout
	if s.moving(k) {
		limit = moveSettleTimeout
	}
	for try := 0; data == nil; try++ {
		if time.Since(start) > limit || s.ctx.Err() != nil {
			giveUp(errors.New("the members did not all settle under the lease, or none gave a copy"))
			return false, false
		}
		if try > 0 {
			time.Sleep(200 * time.Millisecond)
		}
		s.mu.Lock()
		m := s.mu.tables[k.table]
		var g []BrickID
		lease := false
		if m != nil && m.Gen == k.gen {
			g = slices.Clone(m.RG[k.part])
			lease = m.Joining[k.part] == self
		}
		live := s.mu.inc == self.Inc
		s.mu.Unlock()
		if !live {
			return false, false // fenced: the lease goes with the incarnation
		}
		if !lease || len(g) == 0 {
			// The watch has not shown the lease yet, or it is gone.
			if try > 50 && !lease {
				giveUp(ErrLeaseLost)
				return false, false
			}
			continue
		}
		settled := true
		for _, b := range g {
			if _, err := s.copyFrom(k, b, self, true); err != nil {
				settled = false // not yet; or unreachable until the janitor removes it
				break
			}
		}
		if !settled {
			continue
		}
		from = g[try%len(g)]
		if d, err := s.copyFrom(k, from, self, false); err == nil {
			data = d
		}
	}
	// 3. A move: the member replaced hands off first (rebalance.go), its
	// own deadline counted from now (a long copy must not use it up;
	// review 126). Dead members are decreed out before, so that the join
	// sees a short group and keeps the replaced one (as far as the
	// detector knows yet).
	s.removeDeadMembers(k)
	if err := s.handOff(k, self, time.Now()); err != nil {
		giveUp(err)
		return false, false
	}
	s.mu.Lock()
	if !s.liveLocked(self) {
		// Fenced meanwhile: a dead incarnation must not take a live
		// member's place (review 127); the lease goes with it.
		s.mu.Unlock()
		return false, false
	}
	keys := len(data) // (once installed, data is the replica's store, written under mu)
	s.mu.pending[k] = data
	s.mu.Unlock()
	if !s.join(k, self, update, log) {
		return false, false
	}
	log.Info("recovered into the group: joined", "copied from", from, "keys", keys, "took", time.Since(start).Round(time.Millisecond))
	return true, false
}

// handOff asks the member a move replaces to stop serving reads
// (rebalance.go, step 3) until it says yes, or the maps remove it (dead)
// or end the move; nil at once for a recovery. A member that neither
// answers nor is removed within handOffTimeout of start fails the move.
// (A member on a build without hand-offs never answers handed_off: such
// moves fail until it is upgraded.)
func (s *Service) handOff(k repKey, self BrickID, start time.Time) error {
	for try := 0; ; try++ {
		s.mu.Lock()
		m := s.mu.tables[k.table]
		var a BrickID
		var lease, member bool
		if m != nil && m.Gen == k.gen {
			lease = m.Joining[k.part] == self
			a = m.Replacing[k.part]
			member = slices.Contains(m.RG[k.part], a)
		}
		s.mu.Unlock()
		switch {
		case !lease:
			return ErrLeaseLost
		case a == (BrickID{}) || !member:
			return nil // a recovery, or the member replaced was removed as dead
		case !s.isLive(self):
			return errors.New("ddstable: this brick's incarnation is no longer known alive")
		case time.Since(start) > handOffTimeout || s.ctx.Err() != nil:
			return fmt.Errorf("ddstable: the member %v this move replaces did not hand off", a)
		}
		if try > 0 {
			time.Sleep(200 * time.Millisecond)
		}
		ctx, cancel := context.WithTimeout(s.ctx, s.cfg.CallTimeout)
		err := func() error {
			cl, err := s.client(ctx, a.Node)
			if err != nil {
				return err
			}
			st, err := cl.Copy(ctx, &pb.TableCopyRequest{Table: k.table, To: brickPB(a), From: brickPB(self), Partition: partPB(k.part), Probe: true, HandOff: true})
			if err != nil {
				return err
			}
			c, err := st.Recv()
			if err == nil && !c.GetHandedOff() {
				// A build that predates hand_off took it for a probe.
				err = errors.New("ddstable: the member answered without handing off")
			}
			return err
		}()
		cancel()
		if err == nil {
			return nil
		}
	}
}

// moving says whether this brick's maps show k under a move's lease.
func (s *Service) moving(k repKey) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.mu.tables[k.table]
	return m != nil && m.Gen == k.gen && m.Replacing[k.part] != (BrickID{})
}

// liveLocked says whether incarnation self runs here and is guaranteed
// alive for a call's time yet.
func (s *Service) liveLocked(self BrickID) bool {
	if s.mu.inc != self.Inc || self.Inc == 0 {
		return false
	}
	if s.cfg.Live == nil {
		return true
	}
	dl, ok := s.cfg.Live.Deadline(self.Inc)
	return ok && time.Until(dl) > 0
}

func (s *Service) isLive(self BrickID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.liveLocked(self)
}

// removeDeadMembers decrees out of every group the members of k's group
// that the failure detector declared dead (the janitor's round does it
// only for the groups of replicas this brick serves).
func (s *Service) removeDeadMembers(k repKey) {
	s.mu.Lock()
	var g []BrickID
	if m := s.mu.tables[k.table]; m != nil && m.Gen == k.gen {
		g = slices.Clone(m.RG[k.part])
	}
	s.mu.Unlock()
	if len(g) == 0 || s.cfg.Detector == nil {
		return
	}
	subs := make([]lock.Subject, len(g))
	for i, b := range g {
		subs[i] = lock.Subject{Node: b.Node, Inc: b.Inc}
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.CallTimeout)
	defer cancel()
	dead, err := s.cfg.Detector.Dead(ctx, subs)
	if err != nil || len(dead) != len(g) {
		return
	}
	set := map[BrickID]bool{}
	for i, d := range dead {
		if d {
			set[g[i]] = true
		}
	}
	if len(set) > 0 {
		if _, err := RemoveDead(ctx, s.cfg.Meta, set); err == nil {
			// The watch shows the decree before the join reads the maps
			// again in the config service: Joined runs there, on them.
			s.log.Info("dead members removed before a move's join", "table", k.table, "partition", k.part)
		}
	}
}

// planMove decrees a move onto this brick if PlanMove gives one for a
// table (in name order): the plan is made again on the maps the decree
// changes, so that bricks planning at once do not overshoot. Partitions
// this incarnation left, and those whose move failed lately, are not
// taken.
func (s *Service) planMove(self BrickID, failed map[repKey]time.Time) (repKey, bool) {
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.CallTimeout)
	defer cancel()
	ns, err := s.cfg.Meta.Read(ctx, meta.NodesNamespace)
	if err != nil {
		return repKey{}, false
	}
	bricks, err := Bricks(ns)
	if err != nil || len(bricks) < 2 || s.cfg.Detector == nil {
		return repKey{}, false
	}
	subs := make([]lock.Subject, len(bricks))
	for i, b := range bricks {
		subs[i] = lock.Subject{Node: b.Node, Inc: b.Inc}
	}
	dead, err := s.cfg.Detector.Dead(ctx, subs)
	if err != nil || len(dead) != len(bricks) {
		return repKey{}, false
	}
	var live []BrickID
	for i, b := range bricks {
		if !dead[i] {
			live = append(live, b)
		}
	}
	now := time.Now()
	s.mu.Lock()
	var names []string
	gens := map[string]uint64{}
	for name, m := range s.mu.tables {
		names, gens[name] = append(names, name), m.Gen
	}
	skip := func(name string, gen uint64) func(Partition) bool {
		return func(p Partition) bool {
			k := repKey{name, gen, p}
			return now.Before(failed[k])
		}
	}
	s.mu.Unlock()
	slices.Sort(names)
	for _, name := range names {
		s.mu.Lock()
		local := s.mu.tables[name]
		worth := false
		if local != nil && local.Gen == gens[name] {
			_, _, worth = PlanMove(local, live, self, skip(name, gens[name]))
		}
		s.mu.Unlock()
		if !worth {
			continue // no decree unless this brick's maps show a move (review 127)
		}
		var k repKey
		err := s.updateTable(repKey{table: name, gen: gens[name]}, func(m *Maps) (*Maps, error) {
			s.mu.Lock()
			p, from, ok := PlanMove(m, live, self, skip(name, m.Gen))
			s.mu.Unlock()
			if !ok {
				return nil, nil
			}
			c, err := WithMoveLease(m, p, self, from)
			if err == nil {
				k = repKey{name, m.Gen, p}
			}
			return c, err
		})
		if err == nil && k != (repKey{}) {
			s.log.Info("moving a replica onto this brick", "table", name, "partition", k.part, "replacing", s.replacedIn(k))
			return k, true
		}
	}
	return repKey{}, false
}

// replacedIn is the member k's move replaces, per this brick's maps.
func (s *Service) replacedIn(k repKey) BrickID {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m := s.mu.tables[k.table]; m != nil && m.Gen == k.gen {
		return m.Replacing[k.part]
	}
	return BrickID{}
}

// join decrees a recovering brick into the group, ending its lease (step
// 3). Once asked, the copy is kept until the maps settle it (syncLocked):
// listed, it is installed; the lease gone and not listed, it is dropped. A
// decree whose answer was lost may have landed (review 122); the recoverer
// asks again while the maps still show the lease.
func (s *Service) join(k repKey, self BrickID, update func(func(*Maps) (*Maps, error)) error, log *slog.Logger) bool {
	for try := 0; ; try++ {
		err := update(func(m *Maps) (*Maps, error) {
			if slices.Contains(m.RG[k.part], self) {
				return nil, nil // a resend found it done
			}
			return Joined(m, k.part, self)
		})
		if err == nil {
			break
		}
		if errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrNoTable) {
			log.Warn("recovery given up: the lease was lost before the join", "err", err)
			s.mu.Lock()
			s.resolveJoinLocked(k)
			s.mu.Unlock()
			return false
		}
		if try >= 50 || s.ctx.Err() != nil {
			log.Warn("recovery's join not known to have landed; the maps will tell", "err", err)
			return false
		}
		time.Sleep(200 * time.Millisecond)
	}
	return true
}

// updateTable is a read-modify-decree of table k's maps: fn returns the
// new maps, or nil for no change.
func (s *Service) updateTable(k repKey, fn func(m *Maps) (*Maps, error)) error {
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.CallTimeout)
	defer cancel()
	_, err := s.cfg.Meta.Update(ctx, Namespace, fmt.Sprintf("dds-recover-%d", s.cfg.Node), func(ns *pb.Namespace) ([]*pb.Op, error) {
		ts, _ := DecodeTables(ns)
		m, ok := ts[k.table]
		if !ok || m.Gen != k.gen {
			return nil, fmt.Errorf("%w: %q", ErrNoTable, k.table)
		}
		c, err := fn(m)
		if err != nil || c == nil {
			return nil, err
		}
		return []*pb.Op{{Kind: pb.Op_KIND_PUT, Key: TableKey(k.table), Value: c.AppendBinary(nil)}}, nil
	})
	return err
}

// resolveJoinLocked drops a recovery's copy once the maps say its join
// did not and cannot land: the table is gone, or the lease is no longer
// this brick's and the group does not list it.
func (s *Service) resolveJoinLocked(k repKey) {
	m := s.mu.tables[k.table]
	if m != nil && m.Gen == k.gen && (m.Joining[k.part] == s.self() || slices.Contains(m.RG[k.part], s.self())) {
		return // still undecided, or about to be installed
	}
	delete(s.mu.pending, k)
	delete(s.mu.joining, k)
}

// copyFrom copies replica k from member from; probe only asks whether it
// is settled (CopyReady).
func (s *Service) copyFrom(k repKey, from, self BrickID, probe bool) (map[uint64][]byte, error) {
	limit := 5 * time.Minute
	if probe {
		limit = s.cfg.CallTimeout
	}
	ctx, cancel := context.WithTimeout(s.ctx, limit)
	defer cancel()
	cl, err := s.client(ctx, from.Node)
	if err != nil {
		return nil, err
	}
	st, err := cl.Copy(ctx, &pb.TableCopyRequest{Table: k.table, To: brickPB(from), From: brickPB(self), Partition: partPB(k.part), Probe: probe})
	if err != nil {
		return nil, err
	}
	data := map[uint64][]byte{}
	for {
		c, err := st.Recv()
		if err != nil {
			return nil, err
		}
		for _, e := range c.Entries {
			if !k.part.Contains(e.Key) {
				return nil, fmt.Errorf("ddstable: copy from %v: key %d is not in partition %v", from, e.Key, k.part)
			}
			data[e.Key] = e.Value
		}
		if c.Last {
			if c.Total != uint64(len(data)) {
				return nil, fmt.Errorf("ddstable: copy from %v: %d entries, the source counted %d", from, len(data), c.Total)
			}
			return data, nil
		}
	}
}

// DefaultSplitBytes is the partition size past which a brick splits a
// partition on its own: a recovery copies a partition in one piece (DDS
// kept partitions "relatively small (~100MB)" so that one copies "within 1
// to 10 seconds").
const DefaultSplitBytes = 64 << 20

// reshaper runs the splits and merges whose lease this brick holds
// (reshape.go), and asks for the split of every partition whose group this
// brick heads and whose replica here has grown past SplitBytes.
func (s *Service) reshaper() {
	defer s.wg.Done()
	failed := map[repKey]time.Time{}      // partitions not to split on their own before then
	backoff := map[repKey]time.Duration{} // and the next wait after a failed split
	t := time.NewTimer(s.cfg.JanitorEvery)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		case <-s.kick:
		}
		now := time.Now()
		s.mu.Lock()
		self := s.self()
		var held, grown, frozen []repKey // held: for a merge, the parent; frozen: checkpoints held (Root)
		merge := map[repKey]bool{}
		freeze := map[repKey]uint64{}
		if s.mu.inc != 0 {
			for _, name := range slices.Sorted(maps.Keys(s.mu.tables)) {
				m := s.mu.tables[name]
				if m.Freeze.ID != 0 && m.Freeze.Holder == self {
					k := repKey{name, m.Gen, Root}
					frozen, freeze[k] = append(frozen, k), m.Freeze.ID
				}
				for _, p := range m.DP.Leaves() {
					k := repKey{name, m.Gen, p}
					r, leased := m.Reshaping[p]
					switch {
					case leased && r.Holder == self && !r.Merge:
						held = append(held, k)
					case leased && r.Holder == self && p.Bits>>(p.Depth-1)&1 == 0:
						parent, _ := p.Parent()
						pk := repKey{name, m.Gen, parent}
						held, merge[pk] = append(held, pk), true
					case !leased && m.Joining[p] == (BrickID{}) && m.Freeze.ID == 0 && s.cfg.SplitBytes > 0 && !now.Before(failed[k]):
						if rep := s.mu.reps[k]; rep != nil && m.RG[p][0] == self && rep.bytes > s.cfg.SplitBytes && p.Depth < 64 && splitsEvenly(rep.store, p) {
							grown = append(grown, k)
						}
					}
				}
			}
		}
		s.mu.Unlock()
		if len(grown) > 0 && len(held) == 0 {
			// One grown partition at a time, its lease taken only when it
			// is driven at once (outside review 123: leases taken for all,
			// then driven one by one, kept the last ones' writes waiting).
			k := grown[0]
			fail := func(why any) {
				backoff[k] = min(max(2*backoff[k], recoveryBackoff), 16*recoveryBackoff)
				failed[k] = time.Now().Add(backoff[k])
				s.log.Warn("a grown partition's split failed; not tried again on its own for a while", "table", k.table, "partition", k.part, "why", why, "backoff", backoff[k])
			}
			err := s.updateTable(k, func(m *Maps) (*Maps, error) {
				if !m.DP.Has(k.part) || m.RG[k.part][0] != self {
					return nil, nil
				}
				return WithSplitLease(m, k.part, self)
			})
			if err != nil {
				fail(err)
			} else {
				s.log.Info("splitting a grown partition: lease taken", "table", k.table, "partition", k.part, "bytes over", s.cfg.SplitBytes)
				if !s.reshape(k, false, self) {
					fail("the split did not complete")
				} else {
					delete(backoff, k)
				}
			}
		}
		for _, k := range held {
			if s.ctx.Err() != nil {
				break
			}
			s.reshape(k, merge[k], self)
		}
		for _, k := range frozen {
			if s.ctx.Err() != nil {
				break
			}
			s.checkpoint(k, freeze[k], self)
		}
		t.Reset(s.cfg.JanitorEvery)
	}
}

// reshape runs the split of partition k, or the merge of k's children,
// whose lease self holds: it waits until every member is settled under the
// lease, then decrees the new partitions (reshape.go, steps 2-3). After
// settleTimeout it gives the lease up. The leases are in the maps, so a
// holder that restarts or loses a decree's answer takes the job up again
// from the maps; one that dies loses the lease to the janitor.
func (s *Service) reshape(k repKey, merge bool, self BrickID) bool {
	start := time.Now()
	log := s.log.With("table", k.table, "partition", k.part, "merge", merge)
	parts := []Partition{k.part}
	if merge {
		zero, one, _ := k.part.Children()
		parts = []Partition{zero, one}
	}
	for try := 0; s.ctx.Err() == nil; try++ {
		if try > 0 {
			time.Sleep(100 * time.Millisecond)
		}
		s.mu.Lock()
		m := s.mu.tables[k.table]
		var g []BrickID
		if m != nil && m.Gen == k.gen && m.Reshaping[parts[0]].Holder == self {
			g = slices.Clone(m.RG[parts[0]])
		}
		live := s.mu.inc == self.Inc
		s.mu.Unlock()
		if g == nil || !live {
			// Done (a decree whose answer was lost), given up, or no
			// longer this incarnation's.
			return m != nil && m.Gen == k.gen && (merge && m.DP.Has(k.part) || !merge && !m.DP.Has(k.part))
		}
		if time.Since(start) > settleTimeout {
			err := s.updateTable(k, func(m *Maps) (*Maps, error) {
				c, ok := WithoutReshape(m, parts[0], self)
				if !ok {
					return nil, nil
				}
				return c, nil
			})
			log.Warn("split or merge given up: the members did not all settle under the lease", "lease released", err == nil)
			return false
		}
		settled := true
		for _, b := range g {
			for _, p := range parts {
				if _, err := s.copyFrom(repKey{k.table, k.gen, p}, b, self, true); err != nil {
					settled = false
				}
			}
			if !settled {
				break
			}
		}
		if !settled {
			continue
		}
		err := s.updateTable(k, func(m *Maps) (*Maps, error) {
			if merge {
				if m.DP.Has(k.part) {
					return nil, nil // a resend found it done
				}
				return Merged(m, k.part, self)
			}
			if !m.DP.Has(k.part) {
				return nil, nil
			}
			return Split(m, k.part, self)
		})
		if err == nil {
			log.Info("partition reshaped", "took", time.Since(start).Round(time.Millisecond))
			return true
		}
		if errors.Is(err, ErrReshapeLost) || errors.Is(err, ErrNoTable) {
			log.Warn("split or merge given up: its lease is gone", "err", err)
			return false
		}
		log.Warn("split or merge decree not known to have landed; trying again", "err", err)
	}
	return false
}

// splitsEvenly says whether a split of partition p would leave each child
// at least an eighth of store's bytes: keys that share their low bits
// (say, ids shifted left) would otherwise split again and again into an
// empty partition and a full one (outside review 123).
func splitsEvenly(store map[uint64][]byte, p Partition) bool {
	var half [2]int
	for k, v := range store {
		half[k>>p.Depth&1] += len(v) + 8
	}
	total := half[0] + half[1]
	return half[0] >= total/8 && half[1] >= total/8
}
