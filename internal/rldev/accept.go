package rldev

import (
	"context"
	"errors"
	"fmt"

	pb "github.com/grovestore/grove/api/grovepb"
)

// Accepting a stale copy (beyond Boxwood; `grove rldev accept-stale`).
//
// When the only up-to-date copy of an RLDev is gone for good -- its disk
// lost while the other copy was stale (down, or being resynced) -- the
// RLDev serves nothing: a stale replica never serves (the rule that keeps
// an acknowledged write from being read as its older value), and nothing
// but an operator can say that the writes it missed are to be given up.
// AcceptStale is that decision, by decree: the stale segment is declared
// up to date and made the primary, and the other one stale, to be copied
// whole from it when its node comes back (its disk, if it holds
// anything, holds writes the accepted copy lacks: a copy of the accepted
// one replaces them).
//
// What keeps it from losing more than the operator gave up: the decree is
// conditional on the record's epoch the operator's checks saw (the CLI
// refuses unless the up-to-date copy's node is dead to the failure
// detector or reports its copy lost), so a copy that came back meanwhile, or a
// resync that started, makes it fail; and an engine serving the copy
// given up finds its segment stale in the new epoch and stops, as after a
// degraded decree.

// ErrAccept is AcceptStale's refusal.
var ErrAccept = errors.New("rldev: cannot accept the stale copy")

// AcceptStale returns RLDev id's record with its stale segment declared
// up to date and made the primary, the other segment stale and to be
// copied whole, for a decree conditional on t's version. epoch is the
// record's epoch the caller's checks saw: another one is refused.
func (t *Table) AcceptStale(id uint64, epoch uint64) (*Record, error) {
	rec := t.RLDevs[id]
	switch {
	case rec == nil:
		return nil, fmt.Errorf("%w: %w: %d", ErrAccept, ErrUnknown, id)
	case rec.Epoch != epoch:
		return nil, fmt.Errorf("%w: rldev %d changed since it was checked (epoch %d, now %d): check it again", ErrAccept, id, epoch, rec.Epoch)
	case rec.State == Normal:
		return nil, fmt.Errorf("%w: rldev %d is normal: neither copy is stale", ErrAccept, id)
	case rec.Move != nil:
		return nil, fmt.Errorf("%w: rldev %d has a segment move in progress: cancel it first (grove rldev move %d --cancel)", ErrAccept, id, id)
	}
	seg := rec.Secondary() // the stale one (Check: degraded and resyncing have exactly one, not the primary)
	nr := rec.Clone()
	nr.Stale[seg], nr.Stale[1-seg] = false, true
	nr.Primary, nr.State, nr.FullCopy = seg, Degraded, true
	nr.Progress, nr.ProgressTotal = 0, 0
	nr.Epoch++
	return nr, nr.Check()
}

// AcceptStale passes the decree of Table.AcceptStale for RLDev id, whose
// record's epoch was epoch when the caller checked it, and returns the
// record it made.
func (c *Clerk) AcceptStale(ctx context.Context, id uint64, epoch uint64) (*Record, error) {
	var rec *Record
	_, err := c.meta.Update(ctx, Namespace, "grove rldev accept-stale", func(ns *pb.Namespace) ([]*pb.Op, error) {
		t, err := DecodeTable(ns)
		if err != nil {
			return nil, err
		}
		r, err := t.AcceptStale(id, epoch)
		if err != nil {
			return nil, err
		}
		rec = r
		return []*pb.Op{r.PutOp()}, nil
	})
	if err != nil {
		return nil, err
	}
	return rec, nil
}
