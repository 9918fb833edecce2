package chunk

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Handle names a chunk: the chunk manager pair that manages it (CM) and an
// identifier that pair never hands out again (ID). Handles are opaque to
// users; their text form (String, ParseHandle) is "CM:ID" in decimal.
type Handle struct {
	CM uint32
	ID uint64
}

func (h Handle) String() string { return fmt.Sprintf("%d:%d", h.CM, h.ID) }

// IsZero reports whether h is the zero handle (never a chunk's).
func (h Handle) IsZero() bool { return h.CM == 0 && h.ID == 0 }

// ParseHandle parses a handle's text form.
func ParseHandle(s string) (Handle, error) {
	cm, id, ok := strings.Cut(strings.TrimSpace(s), ":")
	if !ok {
		return Handle{}, fmt.Errorf("%w: %q: a handle is CM:ID (two decimal numbers, as grove chunk alloc prints it)", ErrBadHandle, s)
	}
	c, err1 := strconv.ParseUint(cm, 10, 32)
	i, err2 := strconv.ParseUint(id, 10, 64)
	if err1 != nil || err2 != nil || c == 0 || i == 0 {
		return Handle{}, fmt.Errorf("%w: %q: a handle is CM:ID, both decimal and above zero", ErrBadHandle, s)
	}
	return Handle{CM: uint32(c), ID: i}, nil
}

// Errors a chunk operation returns. Each names what the caller can rely on.
var (
	// ErrBadHandle: the handle is malformed (nothing was done).
	ErrBadHandle = errors.New("chunk: malformed handle")
	// ErrUnallocated: the handle is not allocated: never, or freed (a
	// freed handle is never allocated again); nothing was done, and no
	// data is ever returned for it.
	ErrUnallocated = errors.New("chunk: handle not allocated (never, or freed)")
	// ErrUnknownManager: no chunk manager pair has this id.
	ErrUnknownManager = errors.New("chunk: no such chunk manager")
	// ErrNotPrimary: this manager is not its pair's primary (allocations
	// and frees go there); the clerk refreshes the pair table and retries.
	ErrNotPrimary = errors.New("chunk: not the primary chunk manager")
	// ErrNotServing: this manager is not serving the pair now (starting,
	// recovering, fenced, or not one of its nodes); the clerk retries.
	ErrNotServing = errors.New("chunk: chunk manager not serving")
	// ErrOutOfRange: a read or write past the end of the chunk.
	ErrOutOfRange = errors.New("chunk: access past the end of the chunk")
	// ErrTooLarge: an allocation larger than MaxChunk.
	ErrTooLarge = errors.New("chunk: chunk too large")
	// ErrFull: no RLDev of the pair has a free run large enough.
	ErrFull = errors.New("chunk: no space")
	// ErrMapFull: the pair's map (its checkpoint area or log) has no room
	// for the change: the pair manages as many chunks as it can.
	ErrMapFull = errors.New("chunk: the chunk map is full")
	// ErrFenced: a fenced write was refused: the chunk's RLDev admitted a
	// newer token of the write's lock (a newer holder wrote). Parts of a
	// write longer than the RLDev's largest I/O may have landed before.
	ErrFenced = errors.New("chunk: write fenced out (a newer holder of its lock wrote)")
	// ErrMaybeDone: the operation failed after it may have taken effect (a
	// write may have landed, an allocation or free may be in the map).
	ErrMaybeDone = errors.New("chunk: the operation may have taken effect")
	// ErrBadRequest: a malformed request (size zero, a negative offset...).
	ErrBadRequest = errors.New("chunk: bad request")
	// ErrRetired: an allocation for an owner whose log's owners were
	// retired below a newer token (Owner): its holder is dead or gone;
	// nothing was allocated.
	ErrRetired = errors.New("chunk: the allocation's owner is retired")
	// ErrCorrupt: the map on its RLDev does not decode (both copies of a
	// record lost): the pair does not serve until an operator acts.
	ErrCorrupt = errors.New("chunk: chunk map corrupt")
)

// Limits.
const (
	// BlockSize is the unit of space: a chunk takes whole RLDev blocks
	// (sector-aligned runs, the RLDev's sector being 4 KiB).
	BlockSize = 4096
	// MaxChunk is the largest chunk (64 MiB): a chunk is one run of one
	// RLDev, zeroed as it is allocated.
	MaxChunk = 64 << 20
)

// blocksFor is the blocks a chunk of n bytes takes.
func blocksFor(n uint64) uint64 { return (n + BlockSize - 1) / BlockSize }
