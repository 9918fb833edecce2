package txn

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/grovestore/grove/internal/rldev"
)

// RLDevDevice is a log's RLDev through the RLDev clerk.
type RLDevDevice struct {
	Clerk *rldev.Clerk
	ID    uint64
	Size  uint64 // blocks
	// ReplicaTimeout bounds one replica read (a replica that is down but
	// not yet declared so answers nothing; recovery then goes on with the
	// other). Default 3 s.
	ReplicaTimeout time.Duration
}

var _ Device = (*RLDevDevice)(nil)

// Blocks is the RLDev's size.
func (d *RLDevDevice) Blocks() uint64 { return d.Size }

// Write writes through the RLDev's primary, on both replicas. A write
// that succeeded on a retry while an earlier attempt, its answer lost, may
// still land fails (ErrEarlierMayLand): under the log's unchanged token
// that attempt would be admitted whenever it arrived, over a block the log
// has written again since (the tail block, which every flush rewrites with
// more records; the header two checkpoints on; the ring after it wrapped),
// and recovery would then stop short of committed records. (On the framed
// data path the RLDev clerk reports none: a node sequences its
// connections.)
// The log fails; its owner opens it again under a newer token, which the
// recovery's fence write makes the RLDev admit, refusing the late attempt
// (review 36).
func (d *RLDevDevice) Write(ctx context.Context, block uint64, data []byte, f *rldev.Fence) error {
	maybe, err := d.Clerk.WriteReport(ctx, d.ID, block*BlockSize, data, rldev.WriteOptions{Fence: f})
	if err == nil && maybe {
		err = fmt.Errorf("txn: log RLDev %d, block %d: %w", d.ID, block, ErrEarlierMayLand)
	}
	return err
}

// ErrEarlierMayLand: a log write succeeded on a retry while an earlier
// attempt of it may still land (RLDevDevice.Write).
var ErrEarlierMayLand = errors.New("an earlier attempt of the write, whose answer was lost, may still land")

// ReadReplica reads one replica (ReadReplica of the RLDev), refusing at once
// one the table marks stale.
func (d *RLDevDevice) ReadReplica(ctx context.Context, replica int, block, n uint64) ([]byte, error) {
	t, err := d.Clerk.Table(ctx, false)
	if err != nil {
		return nil, err
	}
	rec := t.RLDevs[d.ID]
	if rec == nil {
		return nil, fmt.Errorf("txn: log RLDev %d is not in the table", d.ID)
	}
	if rec.Stale[replica] {
		return nil, fmt.Errorf("txn: replica %d of RLDev %d: %w", replica, d.ID, rldev.ErrNotServing)
	}
	to := d.ReplicaTimeout
	if to == 0 {
		to = 3 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, to)
	defer cancel()
	var out []byte
	for off := uint64(0); off < n; {
		m := min(n-off, rldev.MaxIO/BlockSize)
		b, err := d.Clerk.Read(ctx, d.ID, (block+off)*BlockSize, m*BlockSize, replica+1)
		if err != nil {
			return nil, err
		}
		out = append(out, b...)
		off += m
	}
	return out, nil
}

// WriteReplica writes one replica alone (WriteReplica of the RLDev). As
// Write, it fails with ErrEarlierMayLand if it succeeded on a retry while
// an earlier attempt may still land: the recovery's repair of a replica
// writes the log's tail block, which every flush after it rewrites under
// the same token, and a late attempt would rewind it (outside review 40).
// The recovery then fails, and the log is recovered under a newer token.
func (d *RLDevDevice) WriteReplica(ctx context.Context, replica int, block uint64, data []byte, f *rldev.Fence) error {
	maybe, err := d.Clerk.WriteReport(ctx, d.ID, block*BlockSize, data, rldev.WriteOptions{Fence: f, Replica: replica + 1})
	if err == nil && maybe {
		err = fmt.Errorf("txn: log RLDev %d, replica %d, block %d: %w", d.ID, replica, block, ErrEarlierMayLand)
	}
	return err
}
