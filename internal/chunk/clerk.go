package chunk

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/lock"
	"github.com/grovestore/grove/internal/meta"
	"github.com/grovestore/grove/internal/rldev"
	"github.com/grovestore/grove/internal/transport"
)

// Clerk is a chunk-store client: what the layers above (and the CLI)
// allocate, free, read and write chunks through. It keeps the pair table
// and the nodes' addresses from watches on the config service (not
// polled), sends an allocation or free to the manager the table names
// primary and a read or write to either manager of the chunk's pair, and
// on a refusal ("not the primary", "not serving") or a lost answer reads
// the table afresh and tries again, until its context ends.
//
// What a caller can rely on:
//   - Allocate returning a handle: the chunk is allocated, zeroed, and in
//     the map on its RLDev (and at the secondary): it survives any crash.
//     An allocation whose answer was lost and that was tried again may
//     leave one chunk allocated that no handle was returned for (it uses
//     space until the pair's map is scanned by an operator; ids are never
//     reused either way).
//   - Free returning nil: the chunk is freed; a retried free that finds
//     the chunk gone after an earlier attempt may have freed it returns
//     nil too.
//   - Write returning nil: the bytes are durable on both replicas of the
//     chunk's RLDev. A write tried again after an attempt failed midway
//     lands at least once (writers of one chunk order their writes
//     themselves, with a lock, as on any shared disk). The attempt that
//     failed midway may still land after Write returned, as late as the
//     RLDev allows a write its writer was told failed to land (30 s after
//     it was sent), over a later write of the same bytes: a caller that
//     must not see that rewrites only after that long, or writes a new
//     chunk instead (as a log or a copy-on-write tree does). Never over
//     another chunk's bytes: freed space is quarantined longer.
//   - Read returns the bytes of the last write that returned before it
//     began, or of one in flight meanwhile; never another chunk's.
type Clerk struct {
	meta  *meta.Client
	conns transport.Pool
	ctx   context.Context
	stop  context.CancelFunc
	wg    sync.WaitGroup
	book  *meta.AddressBook
	mu    struct {
		sync.Mutex
		table *Table
	}
	refresh sync.Mutex
	// next: round robin over the pairs for allocations, from a random
	// pair: a clerk per command (grove chunk alloc) started at the same
	// pair every time, and many short-lived clients loaded that one alone.
	next atomic.Uint32
	// maybeStrays counts owned allocations with an attempt that may have
	// landed without its answer reaching the clerk (MaybeStrays).
	maybeStrays atomic.Uint64
}

// NewClerk starts a clerk on the config service m (which it does not
// close).
func NewClerk(m *meta.Client) *Clerk {
	c := newClerk(m)
	c.book = meta.NewAddressBook(m)
	c.wg.Add(1)
	go c.watchTable()
	return c
}

// newClerk is a clerk watching nothing yet (no table, no addresses).
func newClerk(m *meta.Client) *Clerk {
	c := &Clerk{meta: m}
	c.next.Store(rand.Uint32())
	c.ctx, c.stop = context.WithCancel(context.Background())
	return c
}

// Close stops the clerk's watches and connections.
func (c *Clerk) Close() {
	c.stop()
	c.wg.Wait()
	c.book.Close()
	c.conns.Close()
}

func (c *Clerk) watchTable() {
	defer c.wg.Done()
	for ns := range c.meta.Watch(c.ctx, Namespace, 0) {
		if t, err := DecodeTable(ns); err == nil {
			c.setTable(t)
		}
	}
}

func (c *Clerk) setTable(t *Table) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mu.table == nil || t.Version > c.mu.table.Version {
		c.mu.table = t
	}
}

// Table returns the clerk's pair table, read linearizably the first time
// (or when fresh is set).
func (c *Clerk) Table(ctx context.Context, fresh bool) (*Table, error) {
	c.mu.Lock()
	t := c.mu.table
	c.mu.Unlock()
	if t != nil && !fresh {
		return t, nil
	}
	c.refresh.Lock()
	defer c.refresh.Unlock()
	ns, err := c.meta.Read(ctx, Namespace)
	if err != nil {
		return nil, fmt.Errorf("reading the chunk manager table: %w", err)
	}
	t, err = DecodeTable(ns)
	if err != nil {
		return nil, err
	}
	c.setTable(t)
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mu.table, nil
}

func (c *Clerk) client(ctx context.Context, node NodeID) (pb.ChunkServiceClient, error) {
	cc, err := c.conn(ctx, node)
	if err != nil {
		return nil, err
	}
	return pb.NewChunkServiceClient(cc), nil
}

func (c *Clerk) conn(ctx context.Context, node NodeID) (*grpc.ClientConn, error) {
	a, err := c.book.Addr(ctx, node)
	if err != nil {
		return nil, err
	}
	return c.conns.Get(a)
}

// errNotSent: the attempt found its connection down and sent nothing.
var errNotSent = errors.New("not connected: nothing was sent")

// connectWait bounds an attempt's wait for its connection.
const connectWait = 2 * time.Second

// final errors: trying again cannot help.
func final(err error) bool {
	for _, e := range []error{ErrBadHandle, ErrUnallocated, ErrOutOfRange, ErrTooLarge, ErrFull, ErrMapFull, ErrBadRequest, ErrCorrupt, ErrFenced, ErrRetired} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// retry runs attempts on pair cm until one succeeds, fails for good, or
// ctx ends; between attempts it reads the table afresh. attempt gets the
// pair and the attempt's number.
func (c *Clerk) retry(ctx context.Context, cm uint32, what string, attempt func(ctx context.Context, p *Pair, n int) (NodeID, error)) error {
	fresh := false
	var last error
	var lastNode NodeID
	n := 0
	for wait := 20 * time.Millisecond; ; wait = min(2*wait, 500*time.Millisecond) {
		t, err := c.Table(ctx, fresh)
		if err != nil {
			if last == nil {
				last = err
			}
			break
		}
		p := t.Pairs[cm]
		if p == nil && !fresh {
			fresh = true
			continue
		}
		if p == nil {
			return fmt.Errorf("%s: %w: %d", what, ErrUnknownManager, cm)
		}
		actx, cancel := context.WithTimeout(ctx, 15*time.Second)
		node, err := attempt(actx, p, n)
		cancel()
		n++
		if err == nil {
			return nil
		}
		last, lastNode = err, node
		if final(err) {
			return fmt.Errorf("%s (chunk manager %d on node %d): %w", what, cm, node, err)
		}
		fresh = true
		select {
		case <-ctx.Done():
		case <-time.After(wait):
			continue
		}
		break
	}
	if ctx.Err() != nil {
		return fmt.Errorf("%s: gave up (%w); the last attempt, on node %d: %w", what, ctx.Err(), lastNode, last)
	}
	return fmt.Errorf("%s: %w", what, last)
}

// Allocate allocates a zeroed chunk of size bytes from pair cm (0: the
// pairs in turn, the next one when a pair is full).
func (c *Clerk) Allocate(ctx context.Context, size uint64, cm uint32) (Handle, error) {
	return c.AllocateOwned(ctx, size, cm, Owner{})
}

// allocOrder is the order in which an allocation with no pair named
// tries the pairs ids: all of them, from the next in turn.
func (c *Clerk) allocOrder(ids []uint32) []uint32 {
	k := int(c.next.Add(1) % uint32(len(ids)))
	return append(slices.Clone(ids[k:]), ids[:k]...)
}

// AllocateOwned is Allocate for owner (Owner; zero: none): the chunk keeps
// owner's tag until Disown. An allocation whose answer was lost and that
// is retried leaves a chunk no handle was returned for; with an owner,
// Owned lists it, so that the owner's recovery (or the owner itself, at
// its next start, or while it runs: MaybeStrays) frees it.
func (c *Clerk) AllocateOwned(ctx context.Context, size uint64, cm uint32, owner Owner) (Handle, error) {
	if !owner.IsZero() && owner.Token.IsZero() {
		return Handle{}, fmt.Errorf("allocating %d bytes: %w: an owner (log %d) without a token", size, ErrBadRequest, owner.Log)
	}
	if size == 0 || size > MaxChunk {
		return Handle{}, fmt.Errorf("allocating %d bytes: %w (1 to %d)", size, ErrBadRequest, uint64(MaxChunk))
	}
	cms := []uint32{cm}
	if cm == 0 {
		t, err := c.Table(ctx, false)
		if err != nil {
			return Handle{}, err
		}
		if len(t.Pairs) == 0 {
			if t, err = c.Table(ctx, true); err != nil {
				return Handle{}, err
			}
		}
		ids := t.IDs()
		if len(ids) == 0 {
			return Handle{}, fmt.Errorf("allocating %d bytes: %w: the cluster has no chunk manager pair (grove up --chunk-size)", size, ErrUnknownManager)
		}
		cms = c.allocOrder(ids)
	}
	var err error
	for _, cm := range cms {
		var id uint64
		maybe := false // an attempt may have allocated a chunk whose id never came back
		err = c.retry(ctx, cm, fmt.Sprintf("allocating %d bytes", size), func(ctx context.Context, p *Pair, _ int) (NodeID, error) {
			node := p.PrimaryNode()
			cc, err := c.conn(ctx, node)
			if err != nil {
				return node, err
			}
			// An attempt that finds its connection down sends nothing: it
			// cannot have allocated (as WriteFencedReport's).
			if !transport.Ready(ctx, cc, connectWait) {
				return node, errNotSent
			}
			req := &pb.ChunkServiceAllocateRequest{Cm: cm, Size: size}
			if !owner.IsZero() {
				req.OwnerLog, req.OwnerToken = owner.Log, tokenPB(owner.Token)
			}
			r, err := pb.NewChunkServiceClient(cc).Allocate(ctx, req)
			if err != nil {
				maybe = true // it may have arrived
				return node, err
			}
			id = r.Id
			err = ResultError(r.Result, r.Error)
			if errors.Is(err, ErrMaybeDone) {
				maybe = true
			}
			return node, err
		})
		if maybe && !owner.IsZero() {
			c.maybeStrays.Add(1)
		}
		if err == nil {
			return Handle{CM: cm, ID: id}, nil
		}
		if !errors.Is(err, ErrFull) && !errors.Is(err, ErrMapFull) {
			return Handle{}, err
		}
	}
	return Handle{}, err
}

// MaybeStrays counts the owned allocations so far (AllocateOwned with an
// owner) of which an attempt may have allocated a chunk whose id never
// reached the clerk: the answer lost with the connection or the pair's
// primary, the allocation then retried, or failed. Each may have left a
// chunk tagged with its owner that no handle names. The owner, which
// alone knows what it allocated and linked, collects such chunks when the
// count moves (btree.Cache.CollectStrays).
func (c *Clerk) MaybeStrays() uint64 { return c.maybeStrays.Load() }

// Free deallocates chunk h.
func (c *Clerk) Free(ctx context.Context, h Handle) error {
	if h.CM == 0 || h.ID == 0 {
		return fmt.Errorf("freeing %s: %w", h, ErrBadHandle)
	}
	maybe := false
	err := c.retry(ctx, h.CM, fmt.Sprintf("freeing chunk %s", h), func(ctx context.Context, p *Pair, _ int) (NodeID, error) {
		node := p.PrimaryNode()
		cl, err := c.client(ctx, node)
		if err != nil {
			return node, err
		}
		r, err := cl.Free(ctx, &pb.ChunkServiceFreeRequest{Cm: h.CM, Id: h.ID})
		if err != nil {
			maybe = true // it may have arrived
			return node, err
		}
		err = ResultError(r.Result, r.Error)
		if errors.Is(err, ErrMaybeDone) {
			maybe = true
		}
		if errors.Is(err, ErrUnallocated) && maybe {
			return node, nil // an earlier attempt freed it
		}
		return node, err
	})
	return err
}

// Disown takes the owner tag off chunks hs (their owner linked them
// durably: Owner), in batches of at most MaxDisown per pair. A chunk not
// allocated, or without an owner, is skipped.
func (c *Clerk) Disown(ctx context.Context, hs []Handle) error {
	by := map[uint32][]uint64{}
	for _, h := range hs {
		if h.CM == 0 || h.ID == 0 {
			return fmt.Errorf("disowning %s: %w", h, ErrBadHandle)
		}
		by[h.CM] = append(by[h.CM], h.ID)
	}
	cms := make([]uint32, 0, len(by))
	for cm := range by {
		cms = append(cms, cm)
	}
	slices.Sort(cms)
	for _, cm := range cms {
		for ids := by[cm]; len(ids) > 0; {
			batch := ids[:min(len(ids), MaxDisown)]
			ids = ids[len(batch):]
			err := c.retry(ctx, cm, fmt.Sprintf("disowning %d chunks of pair %d", len(batch), cm), func(ctx context.Context, p *Pair, _ int) (NodeID, error) {
				node := p.PrimaryNode()
				cl, err := c.client(ctx, node)
				if err != nil {
					return node, err
				}
				r, err := cl.Disown(ctx, &pb.ChunkServiceDisownRequest{Cm: cm, Ids: batch})
				if status.Code(err) == codes.Unimplemented {
					return node, nil // a manager that predates owners tagged nothing
				}
				if err != nil {
					return node, err
				}
				return node, ResultError(r.Result, r.Error)
			})
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// RetireOwners makes every pair refuse the allocations of owners of log
// whose token is below below (Manager.Retire). It asks every pair of the
// table read afresh.
func (c *Clerk) RetireOwners(ctx context.Context, log uint64, below lock.Token) error {
	t, err := c.Table(ctx, true)
	if err != nil {
		return err
	}
	for _, cm := range t.IDs() {
		err := c.retry(ctx, cm, fmt.Sprintf("retiring log %d's owners below %v", log, below), func(ctx context.Context, p *Pair, _ int) (NodeID, error) {
			node := p.PrimaryNode()
			cl, err := c.client(ctx, node)
			if err != nil {
				return node, err
			}
			r, err := cl.Retire(ctx, &pb.ChunkServiceRetireRequest{Cm: cm, Log: log, Below: tokenPB(below)})
			if status.Code(err) == codes.Unimplemented {
				return node, nil // a manager that predates owners: nothing of it is tagged
			}
			if err != nil {
				return node, err
			}
			return node, ResultError(r.Result, r.Error)
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// Owned lists the chunks of every pair that owners of log below token
// below allocated and did not disown or free (Manager.Owned), reading the
// table afresh.
func (c *Clerk) Owned(ctx context.Context, log uint64, below lock.Token) ([]Handle, error) {
	t, err := c.Table(ctx, true)
	if err != nil {
		return nil, err
	}
	var out []Handle
	for _, cm := range t.IDs() {
		after, more := uint64(0), true
		for more {
			var ids []uint64
			err := c.retry(ctx, cm, fmt.Sprintf("listing log %d's chunks below %v", log, below), func(ctx context.Context, p *Pair, _ int) (NodeID, error) {
				node := p.PrimaryNode()
				cl, err := c.client(ctx, node)
				if err != nil {
					return node, err
				}
				r, err := cl.Owned(ctx, &pb.ChunkServiceOwnedRequest{Cm: cm, Log: log, Below: tokenPB(below), After: after})
				if status.Code(err) == codes.Unimplemented {
					ids, more = nil, false // a manager that predates owners: nothing of it is tagged
					return node, nil
				}
				if err != nil {
					return node, err
				}
				ids, more = r.Ids, r.More
				return node, ResultError(r.Result, r.Error)
			})
			if err != nil {
				return nil, err
			}
			for _, id := range ids {
				out = append(out, Handle{CM: cm, ID: id})
				after = id
			}
			if len(ids) == 0 {
				more = false
			}
		}
	}
	return out, nil
}

// node picks the manager of pair p for a read or write's attempt n: the
// primary, and every other attempt the secondary.
func ioNode(p *Pair, n int) NodeID {
	if n%2 == 1 {
		return p.Peer(p.PrimaryNode())
	}
	return p.PrimaryNode()
}

// Read reads n bytes at off of chunk h.
func (c *Clerk) Read(ctx context.Context, h Handle, off, n uint64) ([]byte, error) {
	if h.CM == 0 || h.ID == 0 {
		return nil, fmt.Errorf("reading %s: %w", h, ErrBadHandle)
	}
	out := make([]byte, 0, n)
	for done := uint64(0); done < n || n == 0; {
		k := min(n-done, MaxIO)
		var data []byte
		err := c.retry(ctx, h.CM, fmt.Sprintf("reading %d bytes at %d of chunk %s", k, off+done, h), func(ctx context.Context, p *Pair, a int) (NodeID, error) {
			node := ioNode(p, a)
			cl, err := c.client(ctx, node)
			if err != nil {
				return node, err
			}
			r, err := cl.Read(ctx, &pb.ChunkServiceReadRequest{Cm: h.CM, Id: h.ID, Offset: off + done, Length: k})
			if err != nil {
				return node, err
			}
			if err := ResultError(r.Result, r.Error); err != nil {
				return node, err
			}
			if uint64(len(r.Data)) != k {
				return node, fmt.Errorf("%w: %d bytes for a read of %d", ErrFailed, len(r.Data), k)
			}
			data = r.Data
			return node, nil
		})
		if err != nil {
			return nil, err
		}
		out = append(out, data...)
		if done += k; n == 0 {
			break
		}
	}
	return out, nil
}

// Write writes data at off of chunk h.
func (c *Clerk) Write(ctx context.Context, h Handle, off uint64, data []byte) error {
	return c.WriteFenced(ctx, h, off, data, nil)
}

// WriteFenced writes data at off of chunk h, fenced by f (nil: none): the
// chunk's RLDev refuses it (rldev.ErrStaleToken, through ErrFailed) once
// it admitted a newer token of f's lock, so that a writer that lost its
// lock cannot overwrite a newer holder's data. An RLDev keeps tokens for
// rldev.MaxTokenNames lock names: fence with a few coarse locks (a log's,
// a tree's), not one per chunk.
func (c *Clerk) WriteFenced(ctx context.Context, h Handle, off uint64, data []byte, f *rldev.Fence) error {
	_, err := c.WriteFencedReport(ctx, h, off, data, f)
	return err
}

// WriteFencedReport is WriteFenced that also reports, on success, whether
// an earlier attempt of the write (retried by the clerk, after an answer
// it did not get) may still land later: a writer that hands its lock on
// must then write again under a newer token, so that the RLDev refuses
// the earlier attempt when it lands.
func (c *Clerk) WriteFencedReport(ctx context.Context, h Handle, off uint64, data []byte, f *rldev.Fence) (earlierMayLand bool, _ error) {
	var fname string
	var ftok *pb.ChunkToken
	if f != nil {
		fname, ftok = f.Name, tokenPB(f.Token)
	}
	if h.CM == 0 || h.ID == 0 {
		return false, fmt.Errorf("writing %s: %w", h, ErrBadHandle)
	}
	for done := 0; done < len(data) || len(data) == 0; {
		k := min(len(data)-done, MaxIO)
		part := data[done : done+k]
		at := off + uint64(done)
		maybe := false
		err := c.retry(ctx, h.CM, fmt.Sprintf("writing %d bytes at %d of chunk %s", k, at, h), func(ctx context.Context, p *Pair, a int) (NodeID, error) {
			node := ioNode(p, a)
			cc, err := c.conn(ctx, node)
			if err != nil {
				return node, err
			}
			// An attempt that finds its connection down sends nothing, so
			// it cannot land later: only attempts sent and unanswered count
			// as "may have landed" (a pair member that is down costs no
			// rewrite under a new token).
			if !transport.Ready(ctx, cc, connectWait) {
				return node, errNotSent
			}
			r, err := pb.NewChunkServiceClient(cc).Write(ctx, &pb.ChunkServiceWriteRequest{Cm: h.CM, Id: h.ID, Offset: at, Data: part, FenceName: fname, FenceToken: ftok})
			if err != nil {
				maybe = true
				return node, err
			}
			err = ResultError(r.Result, r.Error)
			if errors.Is(err, ErrMaybeDone) || r.EarlierMayLand {
				// (the manager's own RLDev write retried an attempt it
				// sent and got no answer to: that attempt may land too)
				maybe = true
			}
			return node, err
		})
		if err != nil {
			if maybe && !errors.Is(err, ErrMaybeDone) {
				err = fmt.Errorf("%w (%w: an earlier attempt may have landed)", err, ErrMaybeDone)
			}
			return maybe || earlierMayLand, err
		}
		earlierMayLand = earlierMayLand || maybe
		if done += k; len(data) == 0 {
			break
		}
	}
	return earlierMayLand, nil
}

// Stat asks node for its managers' status (cm 0: all of them; with cm and
// id: that chunk's extent as well).
func (c *Clerk) Stat(ctx context.Context, node NodeID, cm uint32, id uint64) (*pb.ChunkServiceStatResponse, error) {
	cl, err := c.client(ctx, node)
	if err != nil {
		return nil, err
	}
	return cl.Stat(ctx, &pb.ChunkServiceStatRequest{Cm: cm, Id: id})
}

// CreatePair adds a chunk manager pair on nodes (the first its first
// primary) by decree: a map RLDev of mapSize bytes and a data RLDev of
// dataSize bytes, each with its segments on those two nodes' disks, then
// the pair's record. The two decrees are in two namespaces: a crash
// between them leaves the RLDevs unused (grove rldev list shows them).
func CreatePair(ctx context.Context, m *meta.Client, nodes [2]uint64, mapSize, dataSize uint64) (*Pair, error) {
	if nodes[0] == nodes[1] || nodes[0] == 0 || nodes[1] == 0 {
		return nil, fmt.Errorf("%w: a pair on nodes %v: two different nodes needed", ErrBadRequest, nodes)
	}
	mapBlocks := (mapSize + BlockSize - 1) / BlockSize
	if _, err := NewLayout(mapBlocks); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadRequest, err)
	}
	dataBlocks := (dataSize + BlockSize - 1) / BlockSize
	if dataBlocks < 2 {
		return nil, fmt.Errorf("%w: a data RLDev of %d bytes", ErrBadRequest, dataSize)
	}
	var mapRec, dataRec *rldev.Record
	_, err := m.Update(ctx, rldev.Namespace, "chunk manager pair on nodes "+fmt.Sprint(nodes), func(ns *pb.Namespace) ([]*pb.Op, error) {
		t, err := rldev.DecodeTable(ns)
		if err != nil {
			return nil, err
		}
		if mapRec, err = t.CreateOn(mapBlocks, false, nodes[0], nodes[1]); err != nil {
			return nil, err
		}
		t.RLDevs[mapRec.ID] = mapRec
		// The data RLDev's primary segment on the other node: reads and
		// writes of chunks spread over both.
		if dataRec, err = t.CreateOn(dataBlocks, false, nodes[1], nodes[0]); err != nil {
			return nil, err
		}
		return []*pb.Op{mapRec.PutOp(), dataRec.PutOp()}, nil
	})
	if err != nil {
		return nil, fmt.Errorf("creating the pair's RLDevs: %w", err)
	}
	var p *Pair
	_, err = m.Update(ctx, Namespace, "chunk manager pair on nodes "+fmt.Sprint(nodes), func(ns *pb.Namespace) ([]*pb.Op, error) {
		t, err := DecodeTable(ns)
		if err != nil {
			return nil, err
		}
		id := uint32(1)
		for cm := range t.Pairs {
			id = max(id, cm+1)
		}
		p = &Pair{ID: id, Nodes: nodes, MapRLDev: mapRec.ID, MapBlocks: mapBlocks,
			Data: []DataRLDev{{ID: dataRec.ID, Blocks: dataBlocks}}}
		if err := p.Check(); err != nil {
			return nil, err
		}
		return []*pb.Op{p.PutOp()}, nil
	})
	if err != nil {
		return nil, fmt.Errorf("recording the pair (its RLDevs %d and %d were made): %w", mapRec.ID, dataRec.ID, err)
	}
	return p, nil
}

// AddData adds a data RLDev of dataSize bytes to pair cm, by decree: the
// RLDev with its segments on the pair's two nodes (its primary on the node
// whose segment count is lower), then the pair's record with it appended
// (its managers then load the map again, knowing it). As with CreatePair,
// a crash between the two decrees leaves the RLDev unused.
func AddData(ctx context.Context, m *meta.Client, cm uint32, dataSize uint64) (*Pair, error) {
	blocks := (dataSize + BlockSize - 1) / BlockSize
	if blocks < 2 {
		return nil, fmt.Errorf("%w: a data RLDev of %d bytes", ErrBadRequest, dataSize)
	}
	ns, err := m.Read(ctx, Namespace)
	if err != nil {
		return nil, err
	}
	t, err := DecodeTable(ns)
	if err != nil {
		return nil, err
	}
	p := t.Pairs[cm]
	if p == nil {
		return nil, fmt.Errorf("%w: %d", ErrUnknownManager, cm)
	}
	// Alternate the data RLDevs' primaries over the pair's nodes.
	first, second := p.Nodes[1], p.Nodes[0]
	if len(p.Data)%2 == 1 {
		first, second = second, first
	}
	var rec *rldev.Record
	_, err = m.Update(ctx, rldev.Namespace, fmt.Sprintf("data RLDev for chunk manager pair %d", cm), func(ns *pb.Namespace) ([]*pb.Op, error) {
		rt, err := rldev.DecodeTable(ns)
		if err != nil {
			return nil, err
		}
		if rec, err = rt.CreateOn(blocks, false, first, second); err != nil {
			return nil, err
		}
		return []*pb.Op{rec.PutOp()}, nil
	})
	if err != nil {
		return nil, fmt.Errorf("creating the RLDev: %w", err)
	}
	var out *Pair
	_, err = m.Update(ctx, Namespace, fmt.Sprintf("data RLDev %d for chunk manager pair %d", rec.ID, cm), func(ns *pb.Namespace) ([]*pb.Op, error) {
		t, err := DecodeTable(ns)
		if err != nil {
			return nil, err
		}
		p := t.Pairs[cm]
		if p == nil {
			return nil, fmt.Errorf("%w: %d", ErrUnknownManager, cm)
		}
		p = p.Clone()
		p.Data = append(p.Data, DataRLDev{ID: rec.ID, Blocks: blocks})
		if err := p.Check(); err != nil {
			return nil, err
		}
		out = p
		return []*pb.Op{p.PutOp()}, nil
	})
	if err != nil {
		return nil, fmt.Errorf("adding RLDev %d (made) to pair %d: %w", rec.ID, cm, err)
	}
	return out, nil
}
