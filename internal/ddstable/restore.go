package ddstable

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/grpc/status"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/meta"
	"github.com/grovestore/grove/internal/transport"
)

// RestoreResult is what RestoreTable did with one partition.
type RestoreResult struct {
	Partition Partition
	// By is the brick that restored it (zero if none), with Keys keys.
	By   BrickID
	Keys uint64
	// Err says why it was not restored: ErrLive (a member is not
	// declared dead: nothing to restore), or no brick with its file, or a
	// brick's refusal.
	Err error
}

// RestoreTable restarts every partition of table name whose every member
// is dead from the table's last checkpoint (checkpoint.go): for each, it
// asks the registered bricks whose disks hold the partition's file, in
// node order, until one restores it. Partitions with a live member are
// left alone (their Err wraps ErrLive, or ErrVerdictPending if every
// member's node has restarted since: try again). What was written to a restored
// partition after the checkpoint is lost: an operator's decision.
func RestoreTable(ctx context.Context, mc *meta.Client, name string) ([]RestoreResult, error) {
	ts, err := ListTables(ctx, mc)
	if err != nil {
		return nil, err
	}
	i := slices.IndexFunc(ts, func(m *Maps) bool { return m.Table == name })
	if i < 0 {
		return nil, fmt.Errorf("%w: %q", ErrNoTable, name)
	}
	m := ts[i]
	if m.Checkpoint.ID == 0 {
		return nil, fmt.Errorf("%w: table %q has never been checkpointed", ErrNoCheckpoint, name)
	}
	nodes, err := mc.Read(ctx, meta.NodesNamespace)
	if err != nil {
		return nil, err
	}
	bricks, err := Bricks(nodes)
	if err != nil {
		return nil, err
	}
	incs := map[uint64]uint64{} // each node's registered incarnation
	for _, b := range bricks {
		incs[b.Node] = b.Inc
	}
	book := meta.NewAddressBook(mc)
	defer book.Close()
	var conns transport.Pool
	defer conns.Close()
	// Which brick holds which partition's file of the last checkpoint.
	holders := map[Partition][]BrickID{}
	for _, b := range bricks {
		cl, err := dialBrick(ctx, book, &conns, b.Node)
		if err != nil {
			continue
		}
		st, err := cl.Status(ctx, &pb.TableBrickStatusRequest{})
		if err != nil || st.Inc != b.Inc {
			continue
		}
		for _, f := range st.Checkpoints {
			if p, ok := partOf(f.Partition); ok && f.Table == name && f.Gen == m.Gen && f.Id == m.Checkpoint.ID {
				holders[p] = append(holders[p], b)
			}
		}
	}
	var out []RestoreResult
	for _, p := range m.DP.Leaves() {
		r := RestoreResult{Partition: p, Err: fmt.Errorf("no registered brick has the file of checkpoint %d of partition %v", m.Checkpoint.ID, p)}
		for _, b := range holders[p] {
			cl, err := dialBrick(ctx, book, &conns, b.Node)
			if err != nil {
				r.Err = err
				continue
			}
			a, err := cl.Restore(ctx, &pb.TableRestoreRequest{Table: name, Gen: m.Gen, Id: m.Checkpoint.ID, Partition: partPB(p), To: brickPB(b)})
			if err == nil {
				r.By, r.Keys, r.Err = b, a.Keys, nil
				break
			}
			r.Err = fmt.Errorf("brick %v: %s", b, status.Convert(err).Message())
			if strings.HasPrefix(status.Convert(err).Message(), ErrLive.Error()) {
				r.Err = fmt.Errorf("%w (%s)", ErrLive, status.Convert(err).Message())
				replaced := true
				for _, b := range m.RG[p] {
					replaced = replaced && incs[b.Node] > b.Inc
				}
				if replaced {
					r.Err = fmt.Errorf("%w (%s)", ErrVerdictPending, status.Convert(err).Message())
				}
				break // not lost, or not yet known lost: nothing to restore now
			}
		}
		out = append(out, r)
	}
	return out, nil
}
