package rldev

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/units"
)

// Forgetting a node gone for good (grove rldev forget-node).
//
// A node lost for good leaves two things in the table that only it could
// clear: its disks, on which Create and moves go on placing segments (an
// RLDev created then starts degraded), and the extents retiring on them,
// which only their node wipes and frees (an RLDev with MaxRetiring of them
// can no longer be moved). Once its segments are elsewhere (each re-placed
// by grove rldev move, rebuilt from the other copy), an operator forgets
// it: one decree marks its disks forgotten and drops the extents retiring
// there. Their data is given up: a forgotten disk is never read again.
// forget-node --re-place does all of it: ForgetDisks first (nothing is
// placed on the node meanwhile, and nothing dropped there is ever free),
// then Evacuate, a decree per RLDev, then Forget.
//
// The disks stay in the table, marked, rather than deleted: a node that
// runs again registers the disks it does not find in the table, and would
// then be placed on again over extents still holding old superblocks. A
// forgotten disk is not registered anew by a node that finds it with the
// same UUID (Engine.decide); a wiped or new disk has another header, and
// is used as any new disk.

// ErrForget: a node cannot be forgotten (yet).
var ErrForget = errors.New("rldev: cannot forget the node")

// ForgetPlan is what forgetting a node changes.
type ForgetPlan struct {
	Node    uint64
	Disks   []DiskKey            // its disks, to be marked forgotten
	Dropped map[uint64][]Segment // per RLDev, the extents retiring there, dropped
	Ops     []*pb.Op
}

// Forget returns the decree ops that forget node (conditional on t's
// version). Refused while a segment of an RLDev or a move's target is on
// the node (re-place it first), or if the table has no disk of the node.
// A node already forgotten, with nothing retiring there, gives no ops.
func (t *Table) Forget(node uint64) (*ForgetPlan, error) {
	var held []string
	for _, id := range t.IDs() {
		rec := t.RLDevs[id]
		for seg, sg := range rec.Segs {
			if sg.Node == node {
				held = append(held, fmt.Sprintf("rldev %d's %s", id, rec.SegmentName(seg)))
			}
		}
		if rec.Move != nil && rec.Move.To.Node == node {
			held = append(held, fmt.Sprintf("rldev %d's move target", id))
		}
	}
	if len(held) > 0 {
		more := ""
		if len(held) > 8 {
			more, held = fmt.Sprintf(" and %d more", len(held)-8), held[:8]
		}
		return nil, fmt.Errorf("%w: node %d still holds %s%s: re-place each first (grove rldev forget-node --re-place does; or grove rldev move ID --segment primary|secondary --to NODE, and a move's target: grove rldev move ID --cancel)",
			ErrForget, node, strings.Join(held, ", "), more)
	}
	return t.ForgetDisks(node)
}

// ForgetDisks returns the decree ops that mark node's disks forgotten and
// drop every extent retiring there, whatever still lies on the node: the
// first step of an evacuation (forget-node --re-place), so that no extent
// of the node is ever free to place on before it is forgotten (outside
// review 85: the evacuation dropped, unwiped, extents on a disk not yet
// forgotten, and a command stopped half-way left them free: a new RLDev
// placed there failed to load, on one copy for good). Segments still on
// the node are untouched: they go on as before (and a node back after all
// serves them), only nothing new is placed there.
func (t *Table) ForgetDisks(node uint64) (*ForgetPlan, error) {
	p := &ForgetPlan{Node: node, Dropped: map[uint64][]Segment{}}
	for k := range t.Disks {
		if k.Node == node {
			p.Disks = append(p.Disks, k)
		}
	}
	if len(p.Disks) == 0 {
		return nil, fmt.Errorf("%w: the table has no disk of node %d", ErrForget, node)
	}
	slices.SortFunc(p.Disks, func(a, b DiskKey) int { return int(a.Index) - int(b.Index) })
	for _, id := range t.IDs() {
		nr := t.RLDevs[id].Clone()
		dropped := nr.dropRetiringOn(node)
		if len(dropped) == 0 {
			continue
		}
		if err := nr.Check(); err != nil {
			return nil, err
		}
		p.Dropped[id] = dropped
		p.Ops = append(p.Ops, nr.PutOp())
	}
	for _, k := range p.Disks {
		if d := t.Disks[k]; !d.Forgotten {
			nd := *d
			nd.Forgotten = true
			p.Ops = append(p.Ops, PutDiskOp(&nd))
		}
	}
	return p, nil
}

// Forgotten reports whether node was forgotten whole (grove rldev
// forget-node done): the table has disks of it, all marked forgotten, and
// nothing of any RLDev is on it any more (no segment, move target or
// retiring extent: Forget would have nothing left to do). A node whose
// disks are marked but that still holds something is half-way (Forgetting):
// forget-node --re-place marks the disks first, and a command stopped
// there leaves RLDevs on one copy (outside review 96).
func (t *Table) Forgotten(node uint64) bool { return t.forgotten(node) && !t.holdsAny(node) }

// Forgetting reports whether node's disks are all marked forgotten while
// something of an RLDev is still on it (forget-node --re-place unfinished).
func (t *Table) Forgetting(node uint64) bool { return t.forgotten(node) && t.holdsAny(node) }

// holdsAny reports whether a segment, move target or retiring extent of
// an RLDev is on node.
func (t *Table) holdsAny(node uint64) bool {
	for _, rec := range t.RLDevs {
		if rec.SegmentOf(node) >= 0 || rec.Move != nil && rec.Move.To.Node == node {
			return true
		}
		for _, sg := range rec.Retiring {
			if sg.Node == node {
				return true
			}
		}
	}
	return false
}

// forgotten reports whether the table has disks of node, all forgotten.
func (t *Table) forgotten(node uint64) bool {
	n := 0
	for k, d := range t.Disks {
		if k.Node == node {
			if !d.Forgotten {
				return false
			}
			n++
		}
	}
	return n > 0
}

// Evacuate returns, for a decree conditional on t's version, RLDev id's
// record with nothing left on node (gone for good, before Forget): a
// move's target there is given up (CancelMove), a move in progress
// otherwise too, and a segment there re-placed (StartMove's re-place of a
// stale segment of a degraded RLDev, rebuilt by a full copy from the
// primary) on the node among candidates that does not hold the other
// segment and has the most room. nil: nothing of the RLDev is on node.
// A segment there that is not stale yet (the failure detector's verdict
// has not reached its other node) is ErrForgetWait.
func (t *Table) Evacuate(id, node uint64, candidates []uint64) (*Record, string, error) {
	rec := t.RLDevs[id]
	if rec == nil {
		return nil, "", fmt.Errorf("%w: no rldev %d", ErrUnknown, id)
	}
	seg := rec.SegmentOf(node)
	onTarget := rec.Move != nil && rec.Move.To.Node == node
	if seg < 0 && !onTarget {
		return nil, "", nil
	}
	if seg >= 0 && !rec.Stale[seg] && rec.Stale[1-seg] {
		// Outside review 85: answered "wait", which no verdict changes.
		return nil, "", fmt.Errorf("%w: node %d holds rldev %d's only up-to-date copy (its %s; node %d's copy is stale): the RLDev serves nothing without it; if the node is gone for good, accept the stale copy first (grove rldev accept-stale %d --lose-writes), or bring the node back",
			ErrForget, node, id, rec.SegmentName(seg), rec.Segs[1-seg].Node, id)
	}
	if seg >= 0 && (rec.State != Degraded || !rec.Stale[seg]) {
		return nil, "", fmt.Errorf("%w: rldev %d's %s is on node %d, and the RLDev is %s, not degraded with it stale: the failure detector's verdict on the node has not reached the other copy's yet",
			ErrForgetWait, id, rec.SegmentName(seg), node, rec.State)
	}
	// Worked on a copy of the table, one step after the other: the
	// extents retiring on node dropped first if its disks are forgotten
	// (ForgetDisks; else they wait for Forget, which marks them in the
	// same decree), then the move cancelled, then the re-place.
	tt := &Table{Version: t.Version, Disks: t.Disks, RLDevs: maps.Clone(t.RLDevs)}
	nr, what := rec.Clone(), ""
	if t.forgotten(node) {
		if dropped := nr.dropRetiringOn(node); len(dropped) > 0 {
			what = fmt.Sprintf("%s retiring on node %d dropped", count(len(dropped), "extent"), node)
		}
	}
	tt.RLDevs[id] = nr
	if nr.Move != nil {
		to := nr.Move.To.Node
		var err error
		if nr, err = tt.CancelMove(id); err != nil {
			return nil, "", err
		}
		tt.RLDevs[id] = nr
		what = joinWhat(what, fmt.Sprintf("its move to node %d cancelled", to))
	}
	if seg < 0 {
		return nr, what, nil
	}
	best, room := uint64(0), int64(-1)
	for _, n := range candidates {
		if n == node || n == nr.Segs[1-seg].Node {
			continue
		}
		if _, err := tt.placeOn(n, nr.Blocks); err != nil {
			continue
		}
		if f := tt.largestFree(n); f > room || f == room && n < best {
			best, room = n, f
		}
	}
	if room < 0 {
		return nil, "", fmt.Errorf("%w: rldev %d: no live node without its other copy has %s free on a disk for its %s", ErrNoSpace, id, units.FormatSize(SegmentSize(nr.Blocks)), nr.SegmentName(seg))
	}
	rp, err := tt.startMove(id, seg, best, -1, true)
	if err != nil {
		return nil, "", err
	}
	gave := ""
	if nr.Owed && nr.Stale[seg] {
		// Gone for good with the node: the primary's own copy of the
		// ranges it owed that copy stands (owed.go, NotWhole).
		gave = "; the ranges its primary was pulling from that copy after a crash are given up (the primary's copy of them stands)"
	}
	return rp, joinWhat(what, fmt.Sprintf("its %s re-placed on node %d (%v), to be copied whole from the primary%s", nr.SegmentName(seg), best, rp.Segs[seg], gave)), nil
}

func joinWhat(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// dropRetiringOn removes from r the extents retiring on node (and from
// RetiringTargets), returning them.
func (r *Record) dropRetiringOn(node uint64) []Segment {
	var keep, keepTargets, dropped []Segment
	for _, sg := range r.Retiring {
		if sg.Node == node {
			dropped = append(dropped, sg)
			continue
		}
		keep = append(keep, sg)
		if r.isRetiringTarget(sg) {
			keepTargets = append(keepTargets, sg)
		}
	}
	if len(dropped) > 0 {
		r.Retiring, r.RetiringTargets = keep, keepTargets
	}
	return dropped
}

// EvacuateAll is what forget-node --re-place would do, RLDev after RLDev
// as Clerk.Evacuate does it, each step on the table the last left (two
// re-places do not take the same extent: outside review 85), the node's
// disks forgotten first: per RLDev changed, what changes.
func (t *Table) EvacuateAll(node uint64, candidates []uint64) ([]string, error) {
	p, err := t.ForgetDisks(node)
	if err != nil {
		return nil, err
	}
	tt := &Table{Version: t.Version, Disks: maps.Clone(t.Disks), RLDevs: maps.Clone(t.RLDevs)}
	for _, k := range p.Disks {
		d := *tt.Disks[k]
		d.Forgotten = true
		tt.Disks[k] = &d
	}
	var out []string
	for _, id := range tt.IDs() {
		nr, what, err := tt.Evacuate(id, node, candidates)
		if err != nil {
			return nil, err
		}
		if nr != nil {
			tt.RLDevs[id] = nr
			out = append(out, fmt.Sprintf("rldev %d: %s", id, what))
		}
	}
	return out, nil
}

// ErrForgetWait: a node cannot be forgotten yet; it may be later.
var ErrForgetWait = errors.New("rldev: cannot forget the node yet")

// EvacStep is one decree of forget-node --re-place (NextEvacStep).
type EvacStep struct {
	Ops   []*pb.Op
	What  string
	ID    uint64      // the RLDev evacuated (0: the disks' step or the last)
	Plan  *ForgetPlan // the first and the last steps': what they forget
	Final bool        // the last step (Forget): the node is forgotten
	// Dropped: an RLDev's step, the extents retiring on the node it
	// drops (the node's disks forgotten already: Evacuate).
	Dropped []Segment
}

// NextEvacStep is the next decree of forget-node --re-place from t as it
// is, the whole sequence in one place for the clerk and the simulator:
// the node's disks forgotten first (ForgetDisks: nothing is placed there
// meanwhile, and nothing dropped there is ever free), then each RLDev
// with something on it evacuated (Evacuate), one decree each, then the
// forget (Forget, Final). A caller applies each step's Ops by a decree
// conditional on t's version and asks again on the table that follows.
func (t *Table) NextEvacStep(node uint64, candidates []uint64) (EvacStep, error) {
	if !t.forgotten(node) {
		p, err := t.ForgetDisks(node)
		if err != nil {
			return EvacStep{}, err
		}
		return EvacStep{Ops: p.Ops, Plan: p, What: fmt.Sprintf("its disks forgotten first: %s", p.Describe())}, nil
	}
	for _, id := range t.IDs() {
		nr, what, err := t.Evacuate(id, node, candidates)
		if err != nil {
			return EvacStep{}, err
		}
		if nr != nil {
			var dropped []Segment
			for _, sg := range t.RLDevs[id].Retiring {
				if sg.Node == node && !slices.Contains(nr.Retiring, sg) {
					dropped = append(dropped, sg)
				}
			}
			return EvacStep{Ops: []*pb.Op{nr.PutOp()}, ID: id, What: what, Dropped: dropped}, nil
		}
	}
	p, err := t.Forget(node)
	if err != nil {
		return EvacStep{}, err
	}
	return EvacStep{Ops: p.Ops, Plan: p, What: p.Describe(), Final: true}, nil
}

// ForgetReplacing is forget-node --re-place: NextEvacStep, a decree each,
// until the node is forgotten; report is called after each RLDev's. It
// returns what the steps forgot together: the disks, and every extent
// retiring there dropped, by the RLDevs' steps or the last.
func (c *Clerk) ForgetReplacing(ctx context.Context, node uint64, candidates []uint64, report func(id uint64, what string)) (*ForgetPlan, error) {
	var plan *ForgetPlan
	mid := map[uint64][]Segment{} // dropped by the RLDevs' steps
	for {
		var step EvacStep
		_, err := c.meta.Update(ctx, Namespace, "grove rldev forget-node --re-place", func(ns *pb.Namespace) ([]*pb.Op, error) {
			t, err := DecodeTable(ns)
			if err != nil {
				return nil, err
			}
			step, err = t.NextEvacStep(node, candidates)
			return step.Ops, err
		})
		if err != nil {
			return nil, err
		}
		switch {
		case step.Final:
			// Prepended in turn: the first step's, the middle steps',
			// then the last's.
			for _, p := range []*ForgetPlan{{Dropped: mid}, plan} {
				if p == nil {
					continue
				}
				for id, sgs := range p.Dropped {
					step.Plan.Dropped[id] = append(slices.Clone(sgs), step.Plan.Dropped[id]...)
				}
			}
			return step.Plan, nil
		case step.Plan != nil:
			plan = step.Plan
		default:
			if len(step.Dropped) > 0 {
				mid[step.ID] = append(mid[step.ID], step.Dropped...)
			}
			report(step.ID, step.What)
		}
	}
}

// DroppedCount is the number of retiring extents dropped.
func (p *ForgetPlan) DroppedCount() int {
	n := 0
	for _, sgs := range p.Dropped {
		n += len(sgs)
	}
	return n
}

// DroppedText is the retiring extents the plan drops, and of how many
// RLDevs ("3 extents of 2 RLDevs").
func (p *ForgetPlan) DroppedText() string {
	return fmt.Sprintf("%s of %s", count(p.DroppedCount(), "extent"), count(len(p.Dropped), "RLDev"))
}

// Describe says what forgetting the node does.
func (p *ForgetPlan) Describe() string {
	what := fmt.Sprintf("forgetting it marks its %s forgotten (nothing is placed there again)", count(len(p.Disks), "disk"))
	if n := p.DroppedCount(); n > 0 {
		what += fmt.Sprintf(" and drops the %s retiring there (of %s), giving up what they hold", count(n, "extent"), count(len(p.Dropped), "RLDev"))
	}
	if len(p.Ops) == 0 {
		what = "already forgotten, nothing retiring there"
	}
	return what
}

// count is n and word, plural unless n is 1.
func count(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}

// Forget forgets node by decree (Table.Forget), conditional on the table
// it read; it returns what changed.
func (c *Clerk) Forget(ctx context.Context, node uint64) (*ForgetPlan, error) {
	var plan *ForgetPlan
	_, err := c.meta.Update(ctx, Namespace, "grove rldev forget-node", func(ns *pb.Namespace) ([]*pb.Op, error) {
		t, err := DecodeTable(ns)
		if err != nil {
			return nil, err
		}
		if plan, err = t.Forget(node); err != nil {
			return nil, err
		}
		return plan.Ops, nil
	})
	if err != nil {
		return nil, err
	}
	return plan, nil
}
