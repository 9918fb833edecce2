package rldev

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	pb "github.com/grovestore/grove/api/grovepb"
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
	var held []string
	for _, id := range t.IDs() {
		rec := t.RLDevs[id]
		for seg, sg := range rec.Segs {
			if sg.Node == node {
				held = append(held, fmt.Sprintf("rldev %d's %s", id, SegmentName(rec, seg)))
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
		return nil, fmt.Errorf("%w: node %d still holds %s%s: re-place each first (grove rldev move ID --segment primary|secondary --to NODE; a move's target: grove rldev move ID --cancel)",
			ErrForget, node, strings.Join(held, ", "), more)
	}
	for _, id := range t.IDs() {
		rec := t.RLDevs[id]
		var keep, keepTargets, dropped []Segment
		for _, sg := range rec.Retiring {
			if sg.Node == node {
				dropped = append(dropped, sg)
				continue
			}
			keep = append(keep, sg)
			if rec.IsRetiringTarget(sg) {
				keepTargets = append(keepTargets, sg)
			}
		}
		if len(dropped) == 0 {
			continue
		}
		nr := rec.Clone()
		nr.Retiring, nr.RetiringTargets = keep, keepTargets
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

// DroppedCount is the number of retiring extents dropped.
func (p *ForgetPlan) DroppedCount() int {
	n := 0
	for _, sgs := range p.Dropped {
		n += len(sgs)
	}
	return n
}

// Describe says what forgetting the node does.
func (p *ForgetPlan) Describe() string {
	what := fmt.Sprintf("forgetting it marks its %s forgotten (nothing is placed there again)", Count(len(p.Disks), "disk"))
	if n := p.DroppedCount(); n > 0 {
		what += fmt.Sprintf(" and drops the %s retiring there (of %s), giving up what they hold", Count(n, "extent"), Count(len(p.Dropped), "RLDev"))
	}
	if len(p.Ops) == 0 {
		what = "already forgotten, nothing retiring there"
	}
	return what
}

// Count is n and word, plural unless n is 1.
func Count(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}

// SegmentName is "primary" or "secondary": what segment seg of rec is now.
func SegmentName(rec *Record, seg int) string {
	if seg == rec.Primary {
		return "primary"
	}
	return "secondary"
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
