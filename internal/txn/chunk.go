package txn

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/grovestore/grove/internal/chunk"
	"github.com/grovestore/grove/internal/rldev"
)

// Records whose target is a chunk: the B-link tree and the file system
// log byte ranges of chunks, and recovery writes the images back through
// the chunk store.

// ChunkTarget is the target of a record for chunk h.
func ChunkTarget(h chunk.Handle) []byte {
	b := []byte{'c'}
	b = binary.LittleEndian.AppendUint32(b, h.CM)
	return binary.LittleEndian.AppendUint64(b, h.ID)
}

// ParseChunkTarget decodes ChunkTarget.
func ParseChunkTarget(t []byte) (chunk.Handle, error) {
	if len(t) != 13 || t[0] != 'c' {
		return chunk.Handle{}, fmt.Errorf("txn: target %x is not a chunk's", t)
	}
	h := chunk.Handle{CM: binary.LittleEndian.Uint32(t[1:]), ID: binary.LittleEndian.Uint64(t[5:])}
	if h.CM == 0 || h.ID == 0 {
		return chunk.Handle{}, fmt.Errorf("txn: target %x: %w", t, chunk.ErrBadHandle)
	}
	return h, nil
}

// ChunkApplier replays records onto chunks through a chunk clerk, each
// write fenced with the recovering owner's lock and token: a recovery that
// stalls while a newer one (or the new owner) writes the same RLDev has
// its late writes refused (chunk.ErrFenced). The owner fences its own
// write-backs the same way (Log.Fence). A chunk freed since the record was
// logged is skipped: its id is never allocated again, so nothing can read
// what the replay would have written. (A free cannot be rolled back: a
// caller frees a chunk only once the transaction that dropped it has
// committed.) Images are whole byte ranges, so replaying one twice is
// harmless.
type ChunkApplier struct {
	Clerk *chunk.Clerk
}

// Apply writes data at off of the target chunk.
func (a ChunkApplier) Apply(ctx context.Context, target []byte, off uint64, data []byte, lsn LSN, f *rldev.Fence) error {
	h, err := ParseChunkTarget(target)
	if err != nil {
		return err
	}
	err = a.Clerk.WriteFenced(ctx, h, off, data, f)
	if errors.Is(err, chunk.ErrUnallocated) {
		return nil
	}
	return err
}
