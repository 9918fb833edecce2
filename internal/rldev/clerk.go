package rldev

import (
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/meta"
	"github.com/grovestore/grove/internal/transport"
)

// Clerk is an RLDev client: what every layer above (and the CLI) reads and
// writes RLDevs through. It keeps the RLDev table and the nodes' addresses
// from watches on the config service (not polled), sends a write to the
// primary the table names and a read to a replica that may serve, and on
// a refusal ("not the primary", "not serving", "configuration changed")
// reads the table afresh and tries again, until its context ends.
//
// A write that failed after it began to land (ErrMaybeWritten) or whose
// answer was lost is tried again too: the write is then applied at least
// once. On the gRPC data path the attempt that succeeded is not always
// the last to land: an earlier one whose answer was lost may still be on
// its way to the same node (WriteReport says when), and land later, over
// anything written to those blocks meanwhile, by this writer too, under
// the same token (the framed data path sequences a clerk's connections at
// each node, so there it cannot: Service.admitClerkConn). A
// writer that rewrites blocks, or whose lock may pass on, must act on it
// (write again under a newer token, or stop: the chunk store's map and
// zeroing, the transaction log and the B-tree's node writes do; review
// 36). A write of another writer to the same blocks between the attempts
// may be overwritten by the later attempt: writers of a block hold a lock
// on it (the layers above do), and a writer whose lock may have passed on
// carries the lock's fencing token (WriteOptions.Fence), which replicas
// check.
type Clerk struct {
	meta  *meta.Client
	opts  ClerkOptions
	conns transport.Pool
	data  dataConns
	ctx   context.Context
	stop  context.CancelFunc
	wg    sync.WaitGroup
	mu    struct {
		sync.Mutex
		table *Table
	}
	book    *meta.AddressBook
	refresh sync.Mutex // one linearizable read at a time
	// wrapData, set only by tests (before the first call), stands in
	// front of every data connection (to lose answers).
	wrapData func(dataClient) dataClient
	// writer and writeSeq name each write (WriteID): a random writer,
	// so that two clerks, of one process or of two, never share one.
	writer   uint64
	writeSeq atomic.Uint64
}

// ClerkOptions tune a clerk.
type ClerkOptions struct {
	// DataPath carries reads and writes: DataPathTCP (the default, the
	// framed data path) or DataPathGRPC.
	DataPath string
}

// NewClerk starts a clerk on the config service m (which it does not
// close).
func NewClerk(m *meta.Client) *Clerk { return NewClerkWith(m, ClerkOptions{}) }

// NewClerkWith starts a clerk with options.
func NewClerkWith(m *meta.Client, o ClerkOptions) *Clerk {
	c := &Clerk{meta: m, opts: o}
	var b [8]byte
	for c.writer == 0 {
		if _, err := crand.Read(b[:]); err != nil {
			panic(fmt.Sprintf("rldev: no randomness for the clerk's writer id: %v", err)) // crypto/rand does not fail on Linux
		}
		c.writer = binary.LittleEndian.Uint64(b[:])
	}
	c.ctx, c.stop = context.WithCancel(context.Background())
	c.book = meta.NewAddressBook(m)
	c.wg.Add(1)
	go c.watchTable()
	return c
}

// Close stops the clerk's watches and connections.
func (c *Clerk) Close() {
	c.stop()
	c.wg.Wait()
	c.book.Close()
	c.conns.Close()
	c.data.close()
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

// Table returns the clerk's table, reading it linearizably the first time
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
		return nil, fmt.Errorf("reading the RLDev table: %w", err)
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

func (c *Clerk) addr(ctx context.Context, node NodeID) (string, error) { return c.book.Addr(ctx, node) }

// WriteOptions modify a write.
type WriteOptions struct {
	// Fence is the writer's lock and fencing token: a replica that has
	// admitted a newer token of the lock refuses the write.
	Fence *Fence
	// Replica, if 1 or 2, writes segment 0 or 1 alone (WriteReplica, for
	// an RLDev whose dirty-region log is off); 0 goes through the primary.
	Replica int
}

// Write writes data (whole 4 KiB blocks, at most MaxIO) at byte offset off
// of RLDev id, durably on both replicas (on the one alone in degraded
// mode) when it returns nil.
//
// An attempt whose outcome the clerk could not learn (its answer lost, or
// ErrMaybeWritten: the node failed over mid-way) is sent again, through
// the primary the table then names, with the same WriteID: a copy on
// which an earlier attempt landed, in its current engine and within
// LandedFor, does not apply it again (landed.go). Elsewhere (that copy's
// engine ended since: a crash, a restart, a fence) the retry is a new
// write of the same data, so the write may take effect more than once
// (WriteInfo says how many times it may have), and a write of another
// writer to the same blocks may land between two of them. Writers of a
// block share a lock, as every layer above does, for a write to be one
// register write whatever fails.
func (c *Clerk) Write(ctx context.Context, id, off uint64, data []byte, o WriteOptions) error {
	_, err := c.WriteReport(ctx, id, off, data, o)
	return err
}

// WriteReport is Write that also reports, on success, whether an earlier
// attempt of the write (sent, its answer never received, then retried)
// may still land later, under the same fence, over this attempt and over
// anything written to those blocks after it: a writer that hands its
// lock on, or writes those blocks again, must first write under a newer
// token (the chunk store passes this on to its clients:
// chunk.Clerk.WriteFencedReport).
func (c *Clerk) WriteReport(ctx context.Context, id, off uint64, data []byte, o WriteOptions) (earlierMayLand bool, _ error) {
	info, err := c.WriteInfo(ctx, id, off, data, o)
	return info.EarlierMayLand, err
}

// WriteResult is what a successful write reports beyond its success.
type WriteResult struct {
	// EarlierMayLand: see WriteReport.
	EarlierMayLand bool
	// Applied is how many times the write may have been applied: 1, and
	// 1 more for each earlier attempt that may have landed (its answer
	// lost, or ErrMaybeWritten) before the clerk sent it again, unless
	// the success says it applied nothing, an earlier attempt having
	// landed on the copy that answered (landed.go): then only the earlier
	// attempts count. With Applied above 1 a write of another writer to
	// those blocks may have landed between two of them, and a reader may
	// have seen this write's data, then the other's, then this one's
	// again. The replicas stay identical and each application is
	// linearizable as a write of its own; writers of a block that share a
	// lock (every layer above) never see the difference.
	Applied int
	// LandedBefore: the attempt that succeeded applied nothing, an
	// earlier one having landed on the copy that answered (landed.go).
	LandedBefore bool
}

// WriteInfo is Write that also reports, on success, what WriteResult
// says: whether an earlier attempt may land later, and how many times the
// write may have been applied.
func (c *Clerk) WriteInfo(ctx context.Context, id, off uint64, data []byte, o WriteOptions) (WriteResult, error) {
	if _, _, err := blockRange(off, uint64(len(data))); err != nil {
		return WriteResult{}, fmt.Errorf("rldev %d: write at %d: %w", id, off, err)
	}
	// One WriteID for every attempt: a copy on which an earlier attempt
	// landed does not apply it again (landed.go).
	req := &pb.RLDevServiceWriteRequest{Rldev: id, Offset: off, Data: data, Fence: fenceToPB(o.Fence), Replica: uint32(o.Replica),
		Writer: c.writer, WriteSeq: c.writeSeq.Add(1)}
	// Which attempts whose answer was lost may still land after a later
	// one succeeded:
	//   - one on a sequenced connection (the framed data path, to a node
	//     whose record says FeatureSeqConns): none at the node that
	//     answered the success, since that node started it before the
	//     retry, which it then landed after, or never starts it
	//     (Service.admitClerkConn); none at another node, which refuses
	//     it once no longer primary, or fenced itself before it was
	//     declared dead;
	//   - one a node answered ErrMaybeWritten: the engine incarnation
	//     that answered may still be writing it (a disk write that hangs
	//     past its replica's failure), so it counts if the success is
	//     from that incarnation of that node (maybeAt; or from that node
	//     when either answer names no incarnation: an earlier build).
	//     Not if from a later one: a node's next engine starts only once
	//     every disk operation of the one before has landed (Service's
	//     generation.ops), and a fenced engine's forwards are refused by
	//     a peer that names its successor, or were begun there first, in
	//     which case the peer's range holds the retry behind them, as for
	//     a success at another node (real processes, 2026-12-01: a node
	//     SIGSTOPped past its grace fenced itself, answering a write in
	//     progress ErrMaybeWritten, and its next engine took the retry;
	//     that was reported as an attempt that might land later);
	//   - one on an unsequenced connection (gRPC, a node of an earlier
	//     build): the node may read it after the retry was answered, and
	//     the address the clerk had may reach another node's process (a
	//     record that lags, an address taken over), which this build
	//     refuses (the request names its node) but an earlier one does
	//     not: it counts whatever node succeeds (lostAnywhere);
	//   - a sequenced one at a node whose record then lost the feature,
	//     the success coming on an unsequenced connection to it, which
	//     does not supersede the sequenced one there: it counts (sent).
	maybe, lost, sent, lostAnywhere := false, map[NodeID]bool{}, map[NodeID]bool{}, false
	landed := 0                             // attempts that may have landed, the successful one aside (WriteResult.Applied)
	landedBefore := false                   // the success applied nothing: an earlier attempt had landed there
	maybeAt := map[NodeID]map[uint64]bool{} // ErrMaybeWritten answers, by the incarnation that gave them (0: not named)
	var ok NodeID
	err := c.retry(ctx, id, fmt.Sprintf("write of %d bytes at %d", len(data), off), func(ctx context.Context, rec *Record) (NodeID, bool, error) {
		node := rec.Segs[rec.Primary].Node
		if o.Replica > 0 {
			node = rec.Segs[o.Replica-1].Node
		}
		cl, sequenced, err := c.dataClientSeq(ctx, node)
		if err != nil {
			return node, false, err
		}
		req.Node = uint64(node)
		r, err := cl.Write(ctx, req)
		if err != nil {
			maybe, sent[node] = true, true // the request may have arrived
			landed++
			lostAnywhere = lostAnywhere || !sequenced
			return node, false, err
		}
		err = ResultError(r.Result)
		inc := r.Result.GetIncarnation()
		if errors.Is(err, ErrMaybeWritten) {
			// The node started it and answered: sequencing says nothing
			// of a write the node itself still has in progress (a disk
			// write that hangs past its replica's failure).
			maybe = true
			landed++
			if maybeAt[node] == nil {
				maybeAt[node] = map[uint64]bool{}
			}
			maybeAt[node][inc] = true
		}
		if err == nil {
			ok = node
			landedBefore = r.Result.GetLandedBefore()
			at := maybeAt[node]
			lost[node] = lost[node] || !sequenced && sent[node] || at[inc] || at[0] || inc == 0 && len(at) > 0
		}
		return node, err == nil, err
	})
	if err != nil && maybe && !errors.Is(err, ErrMaybeWritten) {
		err = fmt.Errorf("%w (%w: an earlier attempt may have landed)", err, ErrMaybeWritten)
	}
	if err != nil {
		return WriteResult{}, err
	}
	applied := 1 + landed
	if landedBefore {
		// The success wrote the range's content as it was: one of the
		// earlier attempts had landed, and only they may have applied it.
		applied = max(landed, 1)
	}
	return WriteResult{EarlierMayLand: lost[ok] || lostAnywhere, Applied: applied, LandedBefore: landedBefore}, nil
}

// Read reads n bytes (whole blocks, at most MaxIO) at byte offset off of
// RLDev id, from the primary, or the other replica if the primary cannot
// serve. replica 1 or 2 reads segment 0 or 1 only (ReadReplica).
func (c *Clerk) Read(ctx context.Context, id, off, n uint64, replica int) ([]byte, error) {
	return c.read(ctx, id, off, n, replica, nil)
}

// ReadInto is Read of len(buf) bytes into buf, which a caller that reads
// often can use again: on the framed data path the blocks are read from
// the connection straight into it (a 1 MiB read then allocates nothing;
// Read's fresh buffer, zeroed first, cost about a tenth of a 1 MiB read's
// time). buf is the caller's again once ReadInto returned, whatever
// happened; after an error its content is undefined.
func (c *Clerk) ReadInto(ctx context.Context, id, off uint64, buf []byte, replica int) error {
	_, err := c.read(ctx, id, off, uint64(len(buf)), replica, buf)
	return err
}

func (c *Clerk) read(ctx context.Context, id, off, n uint64, replica int, dst []byte) ([]byte, error) {
	if _, _, err := blockRange(off, n); err != nil {
		return nil, fmt.Errorf("rldev %d: read at %d: %w", id, off, err)
	}
	var data []byte
	attempt := 0
	err := c.retry(ctx, id, fmt.Sprintf("read of %d bytes at %d", n, off), func(ctx context.Context, rec *Record) (NodeID, bool, error) {
		seg := rec.Primary
		if attempt%2 == 1 && !rec.Stale[1-seg] {
			seg = 1 - seg // every other attempt: the other replica, if it may serve
		}
		attempt++
		if replica > 0 {
			seg = replica - 1
		}
		node := rec.Segs[seg].Node
		cl, err := c.dataClient(ctx, node)
		if err != nil {
			return node, false, err
		}
		r, err := cl.Read(ctx, &pb.RLDevServiceReadRequest{Rldev: id, Offset: off, Length: n, Replica: uint32(replica)}, dst)
		if err != nil {
			return node, false, err
		}
		if err := ResultError(r.Result); err != nil {
			return node, false, err
		}
		if uint64(len(r.Data)) != n {
			return node, false, fmt.Errorf("%w: %d bytes for a read of %d", ErrBadMessage, len(r.Data), n)
		}
		if len(dst) > 0 && &r.Data[0] != &dst[0] {
			copy(dst, r.Data)
		}
		data = r.Data
		return node, true, nil
	})
	return data, err
}

// final errors: trying again cannot help. ErrUnavailable too: the blocks
// wait for a peer that is down (owed.go), which takes longer than a
// request should wait; the caller is told at once.
func final(err error) bool {
	return errors.Is(err, ErrBadRequest) || errors.Is(err, ErrStaleToken) || errors.Is(err, ErrCorrupt) || errors.Is(err, ErrBadMessage) ||
		errors.Is(err, ErrUnavailable)
}

// retry runs one attempt at a time until one succeeds, fails for good, or
// ctx ends; between attempts it reads the table afresh.
func (c *Clerk) retry(ctx context.Context, id uint64, what string, attempt func(ctx context.Context, rec *Record) (NodeID, bool, error)) error {
	fresh := false
	var last error
	var lastNode NodeID
	for wait := 20 * time.Millisecond; ; wait = min(2*wait, 500*time.Millisecond) {
		t, err := c.Table(ctx, fresh)
		if err != nil {
			if last == nil {
				last = err
			}
			break
		}
		rec := t.RLDevs[id]
		if rec == nil && !fresh {
			fresh = true
			continue
		}
		if rec == nil {
			return fmt.Errorf("rldev %d: %s: %w", id, what, ErrUnknown)
		}
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		node, ok, err := attempt(actx, rec)
		cancel()
		if ok {
			return nil
		}
		last, lastNode = err, node
		if final(err) {
			return fmt.Errorf("rldev %d: %s on node %d: %w", id, what, node, err)
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
		return fmt.Errorf("rldev %d: %s: gave up (%w); the last attempt, on node %d: %v", id, what, ctx.Err(), lastNode, last)
	}
	return fmt.Errorf("rldev %d: %s: %w", id, what, last)
}

// dataClient is how reads and writes reach node.
func (c *Clerk) dataClient(ctx context.Context, node NodeID) (dataClient, error) {
	d, _, err := c.dataClientSeq(ctx, node)
	return d, err
}

// dataClientSeq is dataClient, and whether the node sequences the
// connection (WriteReport): only on the framed data path, and only with a
// node whose build says it does (FeatureSeqConns; an earlier build, met in
// a rolling upgrade, refuses such connections).
func (c *Clerk) dataClientSeq(ctx context.Context, node NodeID) (dataClient, bool, error) {
	d, sequenced, err := c.rawDataClient(ctx, node)
	if err == nil && c.wrapData != nil {
		d = c.wrapData(d)
	}
	return d, sequenced, err
}

func (c *Clerk) rawDataClient(ctx context.Context, node NodeID) (dataClient, bool, error) {
	if c.opts.DataPath == DataPathGRPC {
		a, err := c.addr(ctx, node)
		if err != nil {
			return nil, false, err
		}
		cc, err := c.conns.Get(a)
		if err != nil {
			return nil, false, err
		}
		// A connection that is down sends nothing: an attempt that finds
		// it so is not one that "may have arrived" (WriteReport).
		if !transport.Ready(ctx, cc, 2*time.Second) {
			return nil, false, fmt.Errorf("node %d at %s: not connected", node, a)
		}
		return grpcData{pb.NewRLDevServiceClient(cc)}, false, nil
	}
	a, err := c.addr(ctx, node)
	if err != nil {
		return nil, false, err
	}
	sequenced := c.book.Has(uint64(node), FeatureSeqConns)
	d, err := c.data.get(ctx, a, sequenced)
	if err != nil {
		return nil, false, fmt.Errorf("node %d at %s: %w", node, a, err)
	}
	return d, sequenced, nil
}

func (c *Clerk) client(ctx context.Context, node NodeID) (pb.RLDevServiceClient, error) {
	a, err := c.addr(ctx, node)
	if err != nil {
		return nil, err
	}
	cc, err := c.conns.Get(a)
	if err != nil {
		return nil, err
	}
	return pb.NewRLDevServiceClient(cc), nil
}

// Status asks node for its replicas' status.
func (c *Clerk) Status(ctx context.Context, node NodeID) (*pb.RLDevServiceStatusResponse, error) {
	cl, err := c.client(ctx, node)
	if err != nil {
		return nil, err
	}
	return cl.Status(ctx, &pb.RLDevServiceStatusRequest{})
}

// Create makes count RLDevs of the given size (rounded up to whole blocks)
// by decree, placed by chained declustering, and returns their records.
func (c *Clerk) Create(ctx context.Context, size uint64, count int, drlOff bool) ([]*Record, error) {
	if size == 0 || count < 1 {
		return nil, fmt.Errorf("%w: %d RLDevs of %d bytes", ErrBadRequest, count, size)
	}
	blocks := (size + BlockSize - 1) / BlockSize
	var made []*Record
	_, err := c.meta.Update(ctx, Namespace, "grove rldev create", func(ns *pb.Namespace) ([]*pb.Op, error) {
		t, err := DecodeTable(ns)
		if err != nil {
			return nil, err
		}
		made = nil
		var ops []*pb.Op
		for i := 0; i < count; i++ {
			r, err := t.Create(blocks, drlOff)
			if err != nil {
				return nil, err
			}
			t.RLDevs[r.ID] = r // the next one is placed after it
			made = append(made, r)
			ops = append(ops, r.PutOp())
		}
		return ops, nil
	})
	if err != nil {
		return nil, err
	}
	return made, nil
}

// Move asks, by decree, for segment seg of RLDev id to move to a disk of
// node (disk < 0: the first with room); the nodes do the rest (move.go).
// A move already going to that node is returned as it is, so that the
// command can be run again to follow it.
func (c *Clerk) Move(ctx context.Context, id uint64, seg int, node NodeID, disk int) (*Record, error) {
	var rec *Record
	_, err := c.meta.Update(ctx, Namespace, "grove rldev move", func(ns *pb.Namespace) ([]*pb.Op, error) {
		t, err := DecodeTable(ns)
		if err != nil {
			return nil, err
		}
		r, err := t.StartMove(id, seg, node, disk)
		if err != nil {
			return nil, err
		}
		rec = r
		if old := t.RLDevs[id]; old.Move != nil {
			return nil, nil // already asked: nothing to change
		}
		return []*pb.Op{r.PutOp()}, nil
	})
	if err != nil {
		return nil, err
	}
	return rec, nil
}

// CancelMove abandons RLDev id's move; its target's extent is freed.
func (c *Clerk) CancelMove(ctx context.Context, id uint64) error {
	_, err := c.meta.Update(ctx, Namespace, "grove rldev move --cancel", func(ns *pb.Namespace) ([]*pb.Op, error) {
		t, err := DecodeTable(ns)
		if err != nil {
			return nil, err
		}
		r, err := t.CancelMove(id)
		if err != nil {
			return nil, err
		}
		return []*pb.Op{r.PutOp()}, nil
	})
	return err
}
