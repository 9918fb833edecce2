package rldev

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/units"
)

// Namespace is the config-service namespace of the RLDev table.
const Namespace = "rldev"

// State is an RLDev's replication state.
type State int

const (
	Normal    State = 1 // both segments up to date
	Degraded  State = 2 // one segment stale: the primary serves alone and logs what it writes
	Resyncing State = 3 // the stale segment is being brought up to date
)

func (s State) String() string {
	switch s {
	case Normal:
		return "normal"
	case Degraded:
		return "degraded"
	case Resyncing:
		return "resyncing"
	}
	return fmt.Sprintf("state(%d)", int(s))
}

// Segment is where one replica lives: an extent of a node's disk.
type Segment struct {
	Node   uint64
	Disk   uint32
	Offset int64
}

func (s Segment) String() string { return fmt.Sprintf("%d:%d@%d", s.Node, s.Disk, s.Offset) }

// Record is one RLDev of the table.
//
// Invariants (Check): two segments on two different nodes; Primary is 0 or
// 1; Normal has no stale segment; Degraded and Resyncing have exactly one,
// and it is not the primary.
type Record struct {
	ID            uint64
	Blocks        uint64
	Segs          [2]Segment
	Primary       int
	State         State
	Stale         [2]bool
	Epoch         uint64 // bumped by every change of who serves or what they serve
	DRLOff        bool
	Progress      uint64
	ProgressTotal uint64
	FullCopy      bool
	// Inc is, per segment, the incarnation of its node that serves it (0:
	// none yet). A replica serves once the table names its incarnation; a
	// peer's dead verdict counts only for the incarnation named here.
	Inc [2]uint64
	// Move is a segment move in progress (nil: none); see move.go.
	Move *Move
	// Retiring are extents this RLDev no longer uses (a moved segment's
	// old place, an abandoned move's target) that still count as used
	// until their node has wiped their metadata and removed them by
	// decree: nothing else is placed there before no write of their past
	// can land.
	Retiring []Segment
	// RetiringTargets are the entries of Retiring that are a move's
	// target given up before it became a segment (cancelled, or its disk
	// failed). Never a segment, no protocol path reads them again (a
	// parked target is copied from the start), so their node wipes them
	// in any state; the others wait for the RLDev to be normal
	// (wipeTick). Outside review 83: with every entry waiting, four
	// targets cancelled while the RLDev was degraded reached MaxRetiring
	// and refused the one command that could repair it. A target whose
	// copy ended before the RLDev degraded does hold a whole copy (review
	// 84); like a segment's old place, no command could use it, only a
	// recovery by hand. An older build rewriting the record drops this
	// list (all its entries then wait): a cluster runs one version.
	RetiringTargets []Segment
	// Owed: the primary owes ranges to the stale segment's copy (owed.go:
	// its dirty regions after a crash, which it was pulling from that
	// copy when it went down), set and cleared by the primary's decrees.
	// Re-placing that segment would give them up: StartMove refuses it,
	// and Evacuate (a node gone for good) says it does.
	Owed bool
	// StaleGivenUp: an operator's accept-stale gave the stale segment's
	// copy up (cleared when it is resynced). It answers no pull of owed
	// ranges (owedServe: a history given up), and the accepted copy owes
	// it nothing (outside review 90: the accepted copy, back from a crash
	// with dirty regions, owed them to the copy given up, and pulled the
	// writes the accept gave up back from it).
	StaleGivenUp bool
	// MovingFailed: the move's moving segment, a secondary, failed on its
	// disk. The primary replaces it by the move's target (stale, to be
	// copied whole: the move emptied a failing disk) once it owes that
	// copy nothing, deciding again at every turn; the failing secondary
	// no longer does it itself (outside review 92: it could not know
	// what a primary restarting, or pulling back a refused write, owed
	// its copy, and replaced the only good copy of it).
	MovingFailed bool
	// AcceptedEpoch is the epoch of the last accept-stale decree (0:
	// none): a replica that was stale before it and is up to date after
	// was declared so by an operator, not resynced (accept.go). A state
	// alone cannot tell the two apart: an engine may miss the table of a
	// resync's end (outside review 78).
	AcceptedEpoch uint64
}

// MaxRetiring bounds Record.Retiring: a move is refused while an RLDev has
// this many extents still to free (their node is down).
const MaxRetiring = 4

// Move is a segment being moved to another place (move.go): the primary
// copies the RLDev to the target while forwarding it every write, then
// the moving segment's replica stops serving and switches the table to
// the target.
type Move struct {
	Seg int     // the segment that moves (0 or 1)
	To  Segment // its new place, on a node that holds neither segment
	// Inc is the target node's incarnation that receives the copy (0:
	// none yet). Writes wait for it while it is set; a change of it
	// starts the copy again.
	Inc uint64
	// Switch: the copy is complete; the moving replica serves nothing
	// more and passes the decree that puts the target in its place.
	Switch bool
}

// Secondary is the index of the segment that is not the primary.
func (r *Record) Secondary() int { return 1 - r.Primary }

// SegmentOf returns the index of the segment on node, or -1.
func (r *Record) SegmentOf(node uint64) int {
	for i, s := range r.Segs {
		if s.Node == node {
			return i
		}
	}
	return -1
}

// Check verifies a record's invariants.
func (r *Record) Check() error {
	switch {
	case r.ID == 0:
		return errors.New("rldev: id 0")
	case r.Blocks == 0:
		return fmt.Errorf("rldev %d: no blocks", r.ID)
	case r.Segs[0].Node == 0 || r.Segs[1].Node == 0:
		return fmt.Errorf("rldev %d: a segment without a node", r.ID)
	case r.Segs[0].Node == r.Segs[1].Node:
		return fmt.Errorf("rldev %d: both segments on node %d", r.ID, r.Segs[0].Node)
	case r.Primary != 0 && r.Primary != 1:
		return fmt.Errorf("rldev %d: primary %d", r.ID, r.Primary)
	case r.Segs[0].Offset%PageSize != 0 || r.Segs[1].Offset%PageSize != 0:
		return fmt.Errorf("rldev %d: unaligned segment", r.ID)
	}
	stale := 0
	for _, s := range r.Stale {
		if s {
			stale++
		}
	}
	switch r.State {
	case Normal:
		if stale != 0 {
			return fmt.Errorf("rldev %d: normal with a stale segment", r.ID)
		}
	case Degraded, Resyncing:
		if stale != 1 || r.Stale[r.Primary] {
			return fmt.Errorf("rldev %d: %v needs exactly one stale segment, not the primary", r.ID, r.State)
		}
	default:
		return fmt.Errorf("rldev %d: unknown state %d", r.ID, r.State)
	}
	if m := r.Move; m != nil {
		switch {
		case m.Seg != 0 && m.Seg != 1:
			return fmt.Errorf("rldev %d: move of segment %d", r.ID, m.Seg)
		case m.To.Node == 0 || m.To.Node == r.Segs[1-m.Seg].Node:
			return fmt.Errorf("rldev %d: move target on node %d, which holds the other segment or is none", r.ID, m.To.Node)
		case m.To.Node == r.Segs[m.Seg].Node && m.To.Disk == r.Segs[m.Seg].Disk:
			return fmt.Errorf("rldev %d: move target on the disk the segment is on", r.ID)
		case m.To.Offset%PageSize != 0:
			return fmt.Errorf("rldev %d: unaligned move target", r.ID)
		case (m.Inc != 0 || m.Switch) && r.State != Normal:
			return fmt.Errorf("rldev %d: a move copies only in the normal state", r.ID)
		case m.Switch && m.Inc == 0:
			return fmt.Errorf("rldev %d: a move switching without a target", r.ID)
		}
	}
	if len(r.Retiring) > MaxRetiring {
		return fmt.Errorf("rldev %d: %d extents retiring", r.ID, len(r.Retiring))
	}
	for i, sg := range r.RetiringTargets {
		if !slices.Contains(r.Retiring, sg) || slices.Contains(r.RetiringTargets[:i], sg) {
			return fmt.Errorf("rldev %d: retiring target %v not retiring once", r.ID, sg)
		}
	}
	return nil
}

// retire lists sg among the extents retiring; target: a move's target
// given up before it became a segment (RetiringTargets).
func (r *Record) retire(sg Segment, target bool) {
	r.Retiring = append(r.Retiring, sg)
	if target {
		r.RetiringTargets = append(r.RetiringTargets, sg)
	}
}

// isRetiringTarget reports whether sg retires as a move's target given
// up before it became a segment (RetiringTargets).
func (r *Record) isRetiringTarget(sg Segment) bool { return slices.Contains(r.RetiringTargets, sg) }

// Extents are every extent the record holds: its segments, a move's
// target, the extents retiring.
func (r *Record) Extents() []Segment {
	out := append([]Segment{r.Segs[0], r.Segs[1]}, r.Retiring...)
	if r.Move != nil {
		out = append(out, r.Move.To)
	}
	return out
}

// Serves reports whether segment i may serve reads and writes: it is not
// stale (a segment being resynced receives writes but serves nothing).
func (r *Record) Serves(i int) bool { return !r.Stale[i] }

// SegmentName is "primary" or "secondary": what segment seg is now.
func (r *Record) SegmentName(seg int) string {
	if seg == r.Primary {
		return "primary"
	}
	return "secondary"
}

// StaleSeg returns the stale segment's index, or -1.
func (r *Record) StaleSeg() int {
	for i, s := range r.Stale {
		if s {
			return i
		}
	}
	return -1
}

// Clone returns a copy.
func (r *Record) Clone() *Record {
	c := *r
	if r.Move != nil {
		m := *r.Move
		c.Move = &m
	}
	c.Retiring = append([]Segment(nil), r.Retiring...)
	c.RetiringTargets = append([]Segment(nil), r.RetiringTargets...)
	return &c
}

// Clone returns a deep copy: its records and disks may be changed without
// touching t's.
func (t *Table) Clone() *Table {
	c := &Table{Version: t.Version, RLDevs: make(map[uint64]*Record, len(t.RLDevs)), Disks: make(map[DiskKey]*Disk, len(t.Disks))}
	for id, r := range t.RLDevs {
		c.RLDevs[id] = r.Clone()
	}
	for k, d := range t.Disks {
		dc := *d
		c.Disks[k] = &dc
	}
	return c
}

// Disk is one disk of a node that holds segments.
type Disk struct {
	Node  uint64
	Index uint32
	Size  int64
	Path  string
	UUID  string // from the disk's header: another one means the disk was replaced
	// Forgotten: its node is gone for good (Table.Forget): nothing is
	// placed on it, and the node, if it runs again with this disk (this
	// UUID), does not register it anew (a wiped or new disk has another).
	Forgotten bool
}

// DiskReserved is the space at the start of every disk that holds its
// header (DiskHeader); segments come after it.
const DiskReserved = 1 << 20

// DiskKey names a disk.
type DiskKey struct {
	Node  uint64
	Index uint32
}

// Table is the RLDev table as one config-service version holds it.
type Table struct {
	Version uint64
	RLDevs  map[uint64]*Record
	Disks   map[DiskKey]*Disk
}

// Keys of the namespace.
func recordKey(id uint64) string { return fmt.Sprintf("rldev/%010d", id) }
func diskKey(k DiskKey) string   { return fmt.Sprintf("disk/%d/%d", k.Node, k.Index) }

// DecodeTable reads the namespace; a record that does not decode or breaks
// an invariant is an error (the table is written only by this package).
func DecodeTable(ns *pb.Namespace) (*Table, error) {
	t := &Table{Version: ns.GetVersion(), RLDevs: map[uint64]*Record{}, Disks: map[DiskKey]*Disk{}}
	for _, e := range ns.GetEntries() {
		switch {
		case strings.HasPrefix(e.Key, "rldev/"):
			m := &pb.RLDevRecord{}
			if err := proto.Unmarshal(e.Value, m); err != nil {
				return nil, fmt.Errorf("rldev: record %q: %w", e.Key, err)
			}
			r, err := recordFromPB(m)
			if err != nil {
				return nil, fmt.Errorf("rldev: record %q: %w", e.Key, err)
			}
			if e.Key != recordKey(r.ID) {
				return nil, fmt.Errorf("rldev: record %q holds RLDev %d", e.Key, r.ID)
			}
			t.RLDevs[r.ID] = r
		case strings.HasPrefix(e.Key, "disk/"):
			m := &pb.RLDevDisk{}
			if err := proto.Unmarshal(e.Value, m); err != nil {
				return nil, fmt.Errorf("rldev: disk %q: %w", e.Key, err)
			}
			d := &Disk{Node: m.Node, Index: m.Index, Size: int64(m.Size), Path: m.Path, UUID: m.Uuid, Forgotten: m.Forgotten}
			t.Disks[DiskKey{d.Node, d.Index}] = d
		default:
			return nil, fmt.Errorf("rldev: unknown key %q", e.Key)
		}
	}
	return t, nil
}

func recordFromPB(m *pb.RLDevRecord) (*Record, error) {
	if len(m.Segments) != 2 || len(m.Stale) != 2 || len(m.ServingInc) != 0 && len(m.ServingInc) != 2 {
		return nil, fmt.Errorf("%d segments, %d stale flags, %d serving incarnations: want 2", len(m.Segments), len(m.Stale), len(m.ServingInc))
	}
	r := &Record{ID: m.Id, Blocks: m.Blocks, Primary: int(m.Primary), State: State(m.State), Epoch: m.Epoch,
		DRLOff: m.DrlOff, Progress: m.Progress, ProgressTotal: m.ProgressTotal, FullCopy: m.FullCopy, AcceptedEpoch: m.AcceptedEpoch, Owed: m.Owed, StaleGivenUp: m.StaleGivenUp, MovingFailed: m.MovingFailed}
	for i, s := range m.Segments {
		r.Segs[i] = Segment{Node: s.Node, Disk: s.Disk, Offset: int64(s.Offset)}
		r.Stale[i] = m.Stale[i]
	}
	if len(m.ServingInc) == 2 {
		r.Inc = [2]uint64{m.ServingInc[0], m.ServingInc[1]}
	}
	if mv := m.Move; mv != nil {
		if mv.To == nil {
			return nil, errors.New("a move without a target")
		}
		r.Move = &Move{Seg: int(mv.Segment), To: Segment{Node: mv.To.Node, Disk: mv.To.Disk, Offset: int64(mv.To.Offset)},
			Inc: mv.TargetInc, Switch: mv.Switch}
	}
	for _, s := range m.Retiring {
		r.Retiring = append(r.Retiring, Segment{Node: s.Node, Disk: s.Disk, Offset: int64(s.Offset)})
	}
	for _, s := range m.RetiringTargets {
		r.RetiringTargets = append(r.RetiringTargets, Segment{Node: s.Node, Disk: s.Disk, Offset: int64(s.Offset)})
	}
	return r, r.Check()
}

// PB returns the record as stored.
func (r *Record) PB() *pb.RLDevRecord {
	m := &pb.RLDevRecord{Id: r.ID, Blocks: r.Blocks, Primary: uint32(r.Primary), State: pb.RldevState(r.State),
		Stale: []bool{r.Stale[0], r.Stale[1]}, Epoch: r.Epoch, DrlOff: r.DRLOff, Progress: r.Progress,
		ProgressTotal: r.ProgressTotal, FullCopy: r.FullCopy, ServingInc: []uint64{r.Inc[0], r.Inc[1]}, AcceptedEpoch: r.AcceptedEpoch, Owed: r.Owed, StaleGivenUp: r.StaleGivenUp, MovingFailed: r.MovingFailed}
	for _, s := range r.Segs {
		m.Segments = append(m.Segments, segPB(s))
	}
	if r.Move != nil {
		m.Move = &pb.RLDevMove{Segment: uint32(r.Move.Seg), To: segPB(r.Move.To), TargetInc: r.Move.Inc, Switch: r.Move.Switch}
	}
	for _, s := range r.Retiring {
		m.Retiring = append(m.Retiring, segPB(s))
	}
	for _, s := range r.RetiringTargets {
		m.RetiringTargets = append(m.RetiringTargets, segPB(s))
	}
	return m
}

func segPB(s Segment) *pb.RLDevSegment {
	return &pb.RLDevSegment{Node: s.Node, Disk: s.Disk, Offset: uint64(s.Offset)}
}

// PutOp is the decree op that stores r.
func (r *Record) PutOp() *pb.Op {
	if err := r.Check(); err != nil {
		panic(err) // programmer error: the engine proposes only checked records
	}
	b, err := proto.Marshal(r.PB())
	if err != nil {
		panic(err)
	}
	return &pb.Op{Kind: pb.Op_KIND_PUT, Key: recordKey(r.ID), Value: b}
}

// PutDiskOp is the decree op that stores d.
func PutDiskOp(d *Disk) *pb.Op {
	b, err := proto.Marshal(&pb.RLDevDisk{Node: d.Node, Index: d.Index, Size: uint64(d.Size), Path: d.Path, Uuid: d.UUID, Forgotten: d.Forgotten})
	if err != nil {
		panic(err)
	}
	return &pb.Op{Kind: pb.Op_KIND_PUT, Key: diskKey(DiskKey{d.Node, d.Index}), Value: b}
}

// IDs returns the RLDev ids in order.
func (t *Table) IDs() []uint64 {
	ids := make([]uint64, 0, len(t.RLDevs))
	for id := range t.RLDevs {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids
}

// extent is a byte range of a disk.
type extent struct{ off, end int64 }

// used returns the extents of disk k that segments occupy, in order.
func (t *Table) used(k DiskKey) []extent {
	var out []extent
	for _, r := range t.RLDevs {
		for _, s := range r.Extents() {
			if s.Node == k.Node && s.Disk == k.Index {
				out = append(out, extent{s.Offset, s.Offset + SegmentSize(r.Blocks)})
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].off < out[j].off })
	return out
}

// FreeExtent finds room for a segment of blocks on disk k (first fit),
// returning its offset.
func (t *Table) FreeExtent(k DiskKey, blocks uint64) (int64, bool) {
	d := t.Disks[k]
	if d == nil || d.Forgotten {
		return 0, false
	}
	need := SegmentSize(blocks)
	at := int64(DiskReserved)
	for _, e := range t.used(k) {
		if e.off-at >= need {
			return at, true
		}
		at = max(at, e.end)
	}
	return at, d.Size-at >= need
}

// FreeBytes is the free space of disk k.
func (t *Table) FreeBytes(k DiskKey) int64 {
	d := t.Disks[k]
	if d == nil || d.Forgotten {
		return 0
	}
	free := d.Size - DiskReserved
	for _, e := range t.used(k) {
		free -= e.end - e.off
	}
	return free
}

// storageNodes returns the nodes with a registered disk, in order.
func (t *Table) storageNodes() []uint64 {
	seen := map[uint64]bool{}
	var out []uint64
	for k, d := range t.Disks {
		if !seen[k.Node] && !d.Forgotten {
			seen[k.Node] = true
			out = append(out, k.Node)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// ErrNoSpace: no disk of a node has room for a segment.
var ErrNoSpace = errors.New("rldev: no room for the segment")

// placeOn finds room for a segment of blocks on node's disks.
func (t *Table) placeOn(node uint64, blocks uint64) (Segment, error) {
	var keys []DiskKey
	for k := range t.Disks {
		if k.Node == node {
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].Index < keys[j].Index })
	for _, k := range keys {
		if off, ok := t.FreeExtent(k, blocks); ok {
			return Segment{Node: node, Disk: k.Index, Offset: off}, nil
		}
	}
	return Segment{}, fmt.Errorf("%w: node %d has no disk with %d bytes free", ErrNoSpace, node, SegmentSize(blocks))
}

// NextID is the id a new RLDev gets: one above every id ever in the table.
func (t *Table) NextID() uint64 {
	next := uint64(1)
	for id := range t.RLDevs {
		next = max(next, id+1)
	}
	return next
}

// Create lays out a new RLDev of blocks by chained declustering: RLDev i's
// primary on the i-th storage node (mod N), its secondary on the next one,
// each segment in free space on that node's disks. Where that pair lacks
// room, the next pair of the chain that has it takes the RLDev (nodes k+1
// and k+2, and so on): it still sits on two neighbours of the chain. A
// create failed while other pairs had room (a full node stopped every
// RLDev whose turn fell on it); it now fails only when no pair has.
func (t *Table) Create(blocks uint64, drlOff bool) (*Record, error) {
	nodes := t.storageNodes()
	if len(nodes) < 2 {
		return nil, fmt.Errorf("rldev: %d nodes with disks: an RLDev needs two", len(nodes))
	}
	id := t.NextID()
	k := int((id - 1) % uint64(len(nodes)))
	for step := 0; step < len(nodes); step++ {
		p, err := t.placeOn(nodes[(k+step)%len(nodes)], blocks)
		if err != nil {
			continue
		}
		s, err := t.placeOn(nodes[(k+step+1)%len(nodes)], blocks)
		if err != nil {
			continue
		}
		r := &Record{ID: id, Blocks: blocks, Segs: [2]Segment{p, s}, Primary: 0, State: Normal, Epoch: 1, DRLOff: drlOff}
		return r, r.Check()
	}
	var room []string
	for _, n := range nodes {
		room = append(room, fmt.Sprintf("node %d %s", n, units.FormatSize(t.largestFree(n))))
	}
	return nil, fmt.Errorf("%w: no two neighbouring nodes of the chain each have %s free in one piece on a disk (the RLDev's blocks with their headers and logs); the most each node has: %s",
		ErrNoSpace, units.FormatSize(SegmentSize(blocks)), strings.Join(room, ", "))
}

// largestFree is the largest free extent on node's disks.
func (t *Table) largestFree(node uint64) int64 {
	var most int64
	for k, d := range t.Disks {
		if k.Node != node || d.Forgotten {
			continue
		}
		at := int64(DiskReserved)
		for _, e := range t.used(k) {
			most = max(most, e.off-at)
			at = max(at, e.end)
		}
		most = max(most, d.Size-at)
	}
	return most
}

// CreateOn lays out a new RLDev of blocks with its primary segment on node
// primary and its secondary on node secondary (a layer that keeps its
// data on the disks of the nodes that run it: a chunk manager pair).
func (t *Table) CreateOn(blocks uint64, drlOff bool, primary, secondary NodeID) (*Record, error) {
	if primary == secondary {
		return nil, fmt.Errorf("rldev: both segments on node %d", primary)
	}
	p, err := t.placeOn(primary, blocks)
	if err != nil {
		return nil, err
	}
	s, err := t.placeOn(secondary, blocks)
	if err != nil {
		return nil, err
	}
	r := &Record{ID: t.NextID(), Blocks: blocks, Segs: [2]Segment{p, s}, Primary: 0, State: Normal, Epoch: 1, DRLOff: drlOff}
	return r, r.Check()
}

// ParseID parses an RLDev id.
func ParseID(s string) (uint64, error) {
	id, err := strconv.ParseUint(s, 10, 64)
	if err != nil || id == 0 {
		return 0, fmt.Errorf("rldev id %q: want a positive integer", s)
	}
	return id, nil
}
