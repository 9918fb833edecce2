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

// ErrAccept is AcceptStale's and CheckAccept's refusal; ErrAcceptWait
// CheckAccept's when the stale copy's node is not up with it loaded.
var (
	ErrAccept     = errors.New("rldev: cannot accept the stale copy")
	ErrAcceptWait = errors.New("rldev: the stale copy cannot take over yet")
)

// AcceptView is what the operator's tool sees when it checks an accept
// (grove rldev accept-stale reads the table first, then the cluster's
// status, then the nodes' replica status: a node that comes back after
// the status was read can only do so by a decree that changes the
// record's epoch, on which the accept is conditional).
type AcceptView struct {
	// Stale is the stale copy's node's status of it (nil: the node did
	// not answer, or has no such replica).
	Stale *ReplicaStatus
	// The up-to-date copy's node, from the cluster's status: whether it
	// is registered, the incarnation registered, and whether it is alive
	// (not declared dead by a majority of the observers).
	UpRegistered, UpAlive bool
	UpInc                 uint64
	// UpStatus is its node's status of its copy (nil: none answered).
	UpStatus *ReplicaStatus
	// StatusCached: the cluster's status came from a cached node list
	// (no config-service quorum): its verdicts may be of the past.
	StatusCached bool
	// Mixed accepts a copy a full copy was being written onto.
	Mixed bool
}

// CheckAccept says whether the stale copy of rec may be accepted, given
// v, and if so why the up-to-date copy counts as gone: its incarnation
// the table names is dead to the failure detector (it fenced itself
// for good: failure detector's contract), or its node reports its copy
// lost. It refuses a copy that is not loaded (a blank disk formatted
// after the accept would count as complete), incomplete, or being
// overwritten by a full copy (it holds part of another history: writes a
// first accept gave up would resurface beside writes made since; Mixed
// takes it anyway), and any up-to-date copy that may serve again (its
// node alive, or back with another incarnation whose copy will be named).
// Outside review 77 found the first form of these checks letting a
// loading blank copy, and a copy come back between the checks, through.
func CheckAccept(rec *Record, v AcceptView) (gone string, err error) {
	switch {
	case rec.State == Normal:
		return "", fmt.Errorf("%w: rldev %d is normal: both copies are up to date, nothing to accept", ErrAccept, rec.ID)
	case rec.Move != nil:
		return "", fmt.Errorf("%w: rldev %d has a segment move in progress: cancel it first (grove rldev move %d --cancel)", ErrAccept, rec.ID, rec.ID)
	}
	stale, up := rec.Secondary(), rec.Primary
	sNode, uNode := rec.Segs[stale].Node, rec.Segs[up].Node
	switch st := v.Stale; {
	case st != nil && (st.Lost || st.Incomplete):
		// (First: --mixed takes nothing that holds nothing.)
		return "", fmt.Errorf("%w: node %d's copy is incomplete (formatted blank after its disk was replaced or its segment re-placed, never copied whole): it holds nothing to accept; the RLDev's data is gone with the other copy", ErrAccept, sNode)
	case rec.State == Resyncing && rec.FullCopy && !v.Mixed:
		return "", fmt.Errorf("%w: a full copy onto node %d's copy was under way: it holds part of node %d's history and part of its own (writes given up before may resurface next to later ones); --mixed accepts it anyway", ErrAccept, sNode, uNode)
	case st != nil && st.Overwritten && !v.Mixed && !st.Lost && !st.Incomplete:
		return "", fmt.Errorf("%w: a full copy onto node %d's copy began and did not end: it holds part of node %d's history and part of its own (writes given up before may resurface next to later ones); --mixed accepts it anyway", ErrAccept, sNode, uNode)
	case st == nil:
		return "", fmt.Errorf("%w: node %d, which holds the stale copy, does not answer or has not loaded its segment: it must be up to take over", ErrAcceptWait, sNode)
	case st.Lost || st.Incomplete:
		return "", fmt.Errorf("%w: node %d's copy is incomplete (formatted blank after its disk was replaced, never copied whole): it holds nothing to accept; the RLDev's data is gone with the other copy", ErrAccept, sNode)
	case st.State == "failed":
		return "", fmt.Errorf("%w: node %d's copy failed (%s): it must load again first", ErrAcceptWait, sNode, st.Err)
	case st.State != "ready" && st.State != "joining":
		return "", fmt.Errorf("%w: node %d's copy is %s, not loaded yet", ErrAcceptWait, sNode, st.State)
	}
	switch us := v.UpStatus; {
	case v.StatusCached:
		return "", fmt.Errorf("%w: the cluster's status is a cached copy (no config-service quorum): whether node %d is dead cannot be told", ErrAccept, uNode)
	case us != nil && (us.Lost || us.Incomplete):
		return fmt.Sprintf("node %d reports its copy lost (its disk was replaced)", uNode), nil
	case us != nil && us.State == "failed":
		return "", fmt.Errorf("%w: node %d reports its copy failed (%s); it loads again now and then and may serve again. If its disk is dead, stop node %d (it is then dead to the failure detector) and run this again", ErrAccept, uNode, us.Err, uNode)
	case us != nil:
		return "", fmt.Errorf("%w: node %d answers with its copy (%s): it may serve again, and accepting node %d's stale copy would give up the writes only it holds", ErrAccept, uNode, us.State, sNode)
	case v.UpRegistered && !v.UpAlive && v.UpInc > rec.Inc[up]:
		// Its last incarnation died before the table named it (outside
		// review 80: its disk hung while it loaded, and it was powered
		// off): it never served, and the one the table names ended when
		// it registered. One named later changes the epoch, on which the
		// accept is conditional. (An incarnation below the table's is a
		// verdict of the past: the table was read first, review 77.)
		return fmt.Sprintf("node %d is dead to the failure detector (incarnation %d, never named; the table names %d, which it replaced)", uNode, v.UpInc, rec.Inc[up]), nil
	case v.UpRegistered && v.UpInc != rec.Inc[up]:
		return "", fmt.Errorf("%w: node %d runs incarnation %d, not the %d the table names: its copy will serve once loaded (if its disk was replaced, it reports it lost)", ErrAccept, uNode, v.UpInc, rec.Inc[up])
	case v.UpRegistered && !v.UpAlive:
		return fmt.Sprintf("node %d is dead to the failure detector", uNode), nil
	case !v.UpRegistered:
		return "", fmt.Errorf("%w: node %d is not registered: whether it is dead cannot be told", ErrAccept, uNode)
	}
	return "", fmt.Errorf("%w: node %d's copy is up to date and its node is alive: it may serve again, and accepting node %d's stale copy would give up the writes only it holds. It is accepted only once node %d is dead to the failure detector or reports its copy lost", ErrAccept, uNode, sNode, uNode)
}

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
	nr.Primary, nr.State, nr.FullCopy, nr.Owed, nr.StaleGivenUp, nr.MovingFailed = seg, Degraded, true, false, true, false
	nr.Progress, nr.ProgressTotal = 0, 0
	nr.Epoch++
	nr.AcceptedEpoch = nr.Epoch
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
