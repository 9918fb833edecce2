package chunk

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	pb "github.com/grovestore/grove/api/grovepb"
)

// Allocation batching (Boxwood §4.3): a Batcher hands out chunks of one
// size without a message per allocation. It reserves Count chunks at a
// time at the pair's primary (Manager.Reserve: their ids and space set
// aside and zeroed, durable in the map's log before the answer), hands
// them out one by one, and ends each reservation with a commit that names
// the chunks it handed out and that were not freed meanwhile (a free of
// one not yet sent costs nothing: neither its allocation nor its free
// reaches the manager). A commit is sent when the reservation is used up,
// every FlushEvery, before any read or write of one of its chunks
// (nothing can read a chunk before its commit), and at Flush and Close.
//
// What the caller can rely on: a handle Allocate returned is never handed
// to anyone else (its id is the reservation's alone), and is never lost:
// if the clerk's process dies before it commits, the primary keeps every
// chunk of the reservation once its life (60 s by default, the node's
// [chunk] reservation_life) has passed without a commit, zeroed and
// allocated. The price of that death: the chunks it had not handed out,
// and those it had handed out and that were freed before the commit,
// stay allocated (a leak, never a reuse); so do, without a death, the
// chunks of a reservation whose answer was lost and that was asked for
// again. A reservation's life must be well above FlushEvery, or live
// clerks' reservations expire (correct, but each then costs a free per
// chunk not kept). Until its commit, or that
// deadline, a chunk handed out reads as unallocated through any clerk but
// this one (which commits first).
type Batcher struct {
	c     *Clerk
	cm    uint32
	size  uint64
	count int
	every time.Duration
	mu    sync.Mutex
	cur   *resv
	done  chan struct{}
	once  sync.Once
	stats BatcherStats
}

// BatcherStats count a batcher's work.
type BatcherStats struct {
	Allocations, Reservations, Commits, Cancelled uint64
}

type resv struct {
	r      Handle
	next   int             // chunks handed out
	live   map[uint64]bool // handed out and not freed
	opened time.Time
	// sealed is the list its first commit attempt sent: from then on
	// nothing more is handed out from it, a free of one of its chunks
	// waits for the commit, and every retry sends the same list (the
	// manager answers a different one "not open").
	sealed []uint64
}

// BatcherOptions configure a batcher.
type BatcherOptions struct {
	// CM is the pair (0: the first in the table).
	CM uint32
	// Count is the chunks per reservation (1 to MaxReserve; default 100).
	Count int
	// FlushEvery is how often a reservation is committed at the latest
	// (default 5 s; well inside the reservation's life).
	FlushEvery time.Duration
}

// NewBatcher returns a batcher of chunks of size bytes.
func (c *Clerk) NewBatcher(size uint64, o BatcherOptions) (*Batcher, error) {
	if o.Count == 0 {
		o.Count = 100
	}
	if o.FlushEvery == 0 {
		o.FlushEvery = 5 * time.Second
	}
	if size == 0 || size > MaxChunk || o.Count < 1 || o.Count > MaxReserve || uint64(o.Count)*blocksFor(size) > MaxChunk/BlockSize*4 {
		return nil, fmt.Errorf("%w: a batcher of chunks of %d bytes, %d per reservation (1 to %d, at most %d MiB in all)", ErrBadRequest, size, o.Count, MaxReserve, 4*MaxChunk>>20)
	}
	b := &Batcher{c: c, cm: o.CM, size: size, count: o.Count, every: o.FlushEvery, done: make(chan struct{})}
	go b.flusher()
	return b, nil
}

func (b *Batcher) flusher() {
	t := time.NewTicker(b.every / 4)
	defer t.Stop()
	for {
		select {
		case <-b.done:
			return
		case <-t.C:
		}
		b.mu.Lock()
		if b.cur != nil && time.Since(b.cur.opened) >= b.every {
			ctx, cancel := context.WithTimeout(context.Background(), b.every)
			_ = b.commitLocked(ctx) // tried again at the next tick or use
			cancel()
		}
		b.mu.Unlock()
	}
}

// Allocate hands out a chunk: at once from the open reservation, or after
// committing a used-up one and reserving the next.
func (b *Batcher) Allocate(ctx context.Context) (Handle, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case <-b.done:
		return Handle{}, fmt.Errorf("%w: the batcher is closed", ErrBadRequest)
	default:
	}
	if b.cur != nil && (b.cur.next == b.count || b.cur.sealed != nil) {
		if err := b.commitLocked(ctx); err != nil {
			return Handle{}, err
		}
	}
	if b.cur == nil {
		if err := b.reserveLocked(ctx); err != nil {
			return Handle{}, err
		}
	}
	r := b.cur
	r.next++
	h := Handle{CM: r.r.CM, ID: r.r.ID + uint64(r.next)}
	r.live[h.ID] = true
	b.stats.Allocations++
	return h, nil
}

// Free frees chunk h: a chunk of the open reservation is dropped from it
// (no message); any other is freed at its pair (Clerk.Free).
func (b *Batcher) Free(ctx context.Context, h Handle) error {
	b.mu.Lock()
	if r := b.cur; r != nil && r.live[h.ID] && h.CM == r.r.CM {
		if r.sealed == nil {
			delete(r.live, h.ID)
			b.stats.Cancelled++
			b.mu.Unlock()
			return nil
		}
		// In a commit already sent: it must be resolved first.
		if err := b.commitLocked(ctx); err != nil {
			b.mu.Unlock()
			return err
		}
	}
	b.mu.Unlock()
	return b.c.Free(ctx, h)
}

// Read reads a chunk, committing the open reservation first if it holds
// the chunk.
func (b *Batcher) Read(ctx context.Context, h Handle, off, n uint64) ([]byte, error) {
	if err := b.sent(ctx, h); err != nil {
		return nil, err
	}
	return b.c.Read(ctx, h, off, n)
}

// Write writes a chunk, committing the open reservation first if it holds
// the chunk.
func (b *Batcher) Write(ctx context.Context, h Handle, off uint64, data []byte) error {
	if err := b.sent(ctx, h); err != nil {
		return err
	}
	return b.c.Write(ctx, h, off, data)
}

func (b *Batcher) sent(ctx context.Context, h Handle) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if r := b.cur; r != nil && r.live[h.ID] && h.CM == r.r.CM {
		return b.commitLocked(ctx)
	}
	return nil
}

// Flush commits the open reservation (the chunks handed out become
// readable by anyone).
func (b *Batcher) Flush(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.commitLocked(ctx)
}

// Close commits the open reservation and stops the batcher.
func (b *Batcher) Close(ctx context.Context) error {
	b.once.Do(func() { close(b.done) })
	return b.Flush(ctx)
}

// Stats returns the batcher's counters.
func (b *Batcher) Stats() BatcherStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.stats
}

func (b *Batcher) reserveLocked(ctx context.Context) error {
	cm := b.cm
	if cm == 0 {
		t, err := b.c.Table(ctx, false)
		if err != nil {
			return err
		}
		ids := t.IDs()
		if len(ids) == 0 {
			return fmt.Errorf("reserving: %w: the cluster has no chunk manager pair", ErrUnknownManager)
		}
		cm = ids[int(b.c.next.Add(1))%len(ids)]
	}
	var id uint64
	err := b.c.retry(ctx, cm, fmt.Sprintf("reserving %d chunks of %d bytes", b.count, b.size), func(ctx context.Context, p *Pair, _ int) (NodeID, error) {
		node := p.PrimaryNode()
		cl, err := b.c.client(ctx, node)
		if err != nil {
			return node, err
		}
		r, err := cl.Reserve(ctx, &pb.ChunkServiceReserveRequest{Cm: cm, Size: b.size, Count: uint32(b.count)})
		if err != nil {
			return node, err
		}
		id = r.Id
		return node, ResultError(r.Result, r.Error)
	})
	if err != nil {
		return err
	}
	b.cur = &resv{r: Handle{CM: cm, ID: id}, live: map[uint64]bool{}, opened: time.Now()}
	b.stats.Reservations++
	return nil
}

// commitLocked ends the open reservation, with the list sealed at its
// first attempt. A reservation the primary says is not open was
// committed by an earlier attempt whose answer was lost, or kept whole
// after its life (or ended by another list, which sealing rules out):
// the chunks not kept are then freed one by one (a free that finds one
// unallocated is done); if that fails part way, it is all done again at
// the next attempt.
func (b *Batcher) commitLocked(ctx context.Context) error {
	r := b.cur
	if r == nil {
		return nil
	}
	if r.sealed == nil {
		r.sealed = make([]uint64, 0, len(r.live))
		for i := 1; i <= r.next; i++ {
			if id := r.r.ID + uint64(i); r.live[id] {
				r.sealed = append(r.sealed, id)
			}
		}
	}
	live := r.sealed
	err := b.c.retry(ctx, r.r.CM, fmt.Sprintf("committing reservation %s", r.r), func(ctx context.Context, p *Pair, _ int) (NodeID, error) {
		node := p.PrimaryNode()
		cl, err := b.c.client(ctx, node)
		if err != nil {
			return node, err
		}
		resp, err := cl.Commit(ctx, &pb.ChunkServiceCommitRequest{Cm: r.r.CM, Id: r.r.ID, Live: live})
		if err != nil {
			return node, err
		}
		return node, ResultError(resp.Result, resp.Error)
	})
	if errors.Is(err, ErrUnallocated) {
		for i := 1; i <= b.count; i++ {
			id := r.r.ID + uint64(i)
			if r.live[id] {
				continue
			}
			if ferr := b.c.Free(ctx, Handle{CM: r.r.CM, ID: id}); ferr != nil && !errors.Is(ferr, ErrUnallocated) {
				return ferr
			}
		}
		err = nil
	}
	if err != nil {
		return err
	}
	b.cur = nil
	b.stats.Commits++
	return nil
}
