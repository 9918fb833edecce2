package txn

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/grovestore/grove/internal/lock"
	"github.com/grovestore/grove/internal/rldev"
	"golang.org/x/sync/errgroup"
)

// Device is the log's RLDev as the log uses it: an RLDev whose dirty-region
// log is off, written through its primary and read and repaired one replica
// at a time. The runtime's is RLDevDevice; the simulator's keeps two
// replicas in memory and crashes between them.
type Device interface {
	// Blocks is the device's size in 4 KiB blocks.
	Blocks() uint64
	// Write writes whole blocks at block index block on both replicas (on
	// the survivor alone once the RLDev is degraded), durable when it
	// returns nil; a replica that missed it never serves again before it
	// has it. A write that returns an error may have landed, in part, on
	// either replica (each block whole, old or new). A write under a token
	// older than one the device has admitted for f.Name fails with
	// rldev.ErrStaleToken; once a write under a newer token has returned,
	// no write under an older one changes a replica any more (Recover
	// relies on it after its fence write).
	Write(ctx context.Context, block uint64, data []byte, f *rldev.Fence) error
	// ReadReplica reads n blocks of replica 0 or 1; an error if that
	// replica cannot serve (down, or it may have missed writes).
	ReadReplica(ctx context.Context, replica int, block, n uint64) ([]byte, error)
	// WriteReplica writes whole blocks to one replica only, fenced as
	// Write is.
	WriteReplica(ctx context.Context, replica int, block uint64, data []byte, f *rldev.Fence) error
}

// Applier applies the images recovery replays: bytes [off, off+len(data))
// of target become data, durably, before Apply returns nil, with the
// write fenced by f (the recovering owner's lock and token: once a newer
// owner has written the same store, a stalled recovery's late image must
// be refused, as ChunkApplier's chunk writes are). The images are physical,
// so applying one twice leaves the same bytes; an applier applies every
// image it is given, unconditionally, in the order given: redo images in
// log order, then undo images with the LSN of the update they undo (an
// applier that skipped an image older than its page's LSN would skip
// every undo). lsn identifies the record. A target that no longer exists
// (a chunk freed since) is the applier's to skip.
type Applier interface {
	Apply(ctx context.Context, target []byte, off uint64, data []byte, lsn LSN, f *rldev.Fence) error
}

// Selector is an Applier that chooses what recovery applies: given the
// plan (every record to redo in log order, every loser's update to undo,
// latest first), it returns the records to redo and to undo instead.
// Recovery's end (the new header) is the same. A client that never writes
// back an uncommitted change (no steal) and orders its images by versions
// of its own keeps only its committed updates, and no undo: the B-link
// tree, whose nodes move between servers' logs.
type Selector interface {
	Applier
	Select(p Plan) (redo, undo []Record)
}

// ParallelApplier is a Selector whose redo records, as its Select returns
// them, may be applied in any order and at once: none needs another
// applied before it, and those that share a target commute (the B-link
// tree keeps one image per node; a chunk's disowns and frees are
// idempotent and a write of a freed chunk is skipped). Recovery then applies up to Parallel() of them at once, and
// writes the new header only once every one is applied; the undo records,
// if any, go one at a time after them.
type ParallelApplier interface {
	Selector
	Parallel() int
}

// ErrUnavailable: recovery cannot decide without a replica that cannot be
// read now; it may succeed once that replica serves again.
var ErrUnavailable = errors.New("txn: the log cannot be recovered now")

// ErrFenced: the device admitted a newer token for the log's lock; another
// owner or recovery has the log, and this one may not write it again.
var ErrFenced = errors.New("txn: the log was taken over (its lock's token is stale)")

// Unsafe switches break rules on purpose, so that tests can show the
// oracle catches each (never set outside tests).
type Unsafe struct {
	AckBeforeWrite bool // a flush's commits count as durable before its write
	NoUndo         bool // recovery does not roll back losers
	NoFloor        bool // recovery ignores tokens when it scans
	NoReconcile    bool // recovery reads replica 0 alone and repairs nothing
	NoPreHeader    bool // recovery acts on a header it did not make the newest
}

// Report says what a recovery did.
type Report struct {
	Header    Header // the header it found
	Replicas  []int  // the replicas it read
	Winner    int    // the replica whose log it replayed
	Repaired  int    // blocks written to the other replica to match
	Rewritten int    // blocks written to both (one replica could not be read)
	Records   int
	Committed []uint64
	Aborted   []uint64
	Losers    []uint64
	Redone    int
	Undone    int
	End       LSN // after the last whole record
	Next      LSN // where the log goes on (the new head)
	Why       string
	NewHeader Header
	Scanned   []Result
	NewLog    bool
}

// readBlocks is how many blocks recovery reads at once.
const readBlocks = 256

// Recover makes a log's state whole, on any node: it fences the device with
// the fence's token (a write of the fence block, so that from here on the
// old owner's log writes are refused and a replica that missed this write
// serves nothing until it has it; its page writes and a stalled earlier
// recovery's images are refused where they carry their token too: the
// Applier's writes are fenced with this recovery's), reads the log from every replica that can serve,
// makes the replicas identical from the head to the end of the longest
// whole log, replays it (redo of every update in log order, then undo of
// the transactions with no commit or abort record, latest first) through
// ap, and writes a header whose head is past the end and whose floor is
// tok, which truncates the log. A crash at any point leaves a state the
// next Recover finishes from (every step is idempotent; the header write
// is the commit point).
func Recover(ctx context.Context, dev Device, fence rldev.Fence, ap Applier, u Unsafe) (Report, error) {
	var rep Report
	n := dev.Blocks()
	if n < HeaderBlocks+8 {
		return rep, fmt.Errorf("txn: a log device of %d blocks (at least %d)", n, HeaderBlocks+8)
	}
	ring := n - HeaderBlocks
	// Fence first, before reading anything: from here on the old owner's
	// (or an older recovery's) writes are refused, and a replica that
	// misses this write serves nothing until it has it, so what the reads
	// below see cannot change under them except by this recovery's own
	// writes.
	if err := writeFenced(ctx, dev, FenceBlock, EncodeFence(fence.Token), &fence); err != nil {
		return rep, err
	}
	h, served, err := readHeader(ctx, dev, ring)
	if errors.Is(err, ErrNoHeader) {
		rep.NewLog = true
		h = Header{Ring: ring}
	} else if err != nil {
		return rep, err
	}
	if h.Ring != ring {
		return rep, fmt.Errorf("%w: the header says %d ring blocks, the device has %d", ErrCorrupt, h.Ring, ring)
	}
	if !h.Writer.Less(fence.Token) && !rep.NewLog {
		// A recovery must outrank every earlier writer, its own earlier
		// sessions included: under an equal token, blocks a failed flush of
		// that session left past the end would pass the floor.
		return rep, fmt.Errorf("%w: token %v is not newer than %v, under which the log's header was written (take the log's lock anew)", ErrFenced, fence.Token, h.Writer)
	}
	rep.Header = h
	// Make the header this recovery acts on the newest on both replicas
	// before it acts. A replica it cannot read may hold a newer header
	// (a checkpoint's header write that landed there alone as its owner
	// died): a later recovery reading that replica would start from that
	// head and skip records this one may have half replayed, leaving the
	// chunks older than the log says. Written under this recovery's token,
	// this header outranks any header an earlier owner wrote, and the
	// RLDev copies it to a replica that misses it before that replica
	// serves again. It keeps the floor it found: the log it reads was
	// written under older tokens.
	if !u.NoReconcile && !u.NoPreHeader {
		pre := Header{Gen: h.Gen + 1, Floor: h.Floor, Head: h.Head, Ring: ring, Writer: fence.Token}
		if err := writeFenced(ctx, dev, pre.Gen%2, EncodeHeader(pre), &fence); err != nil {
			return rep, err
		}
		h.Gen = pre.Gen
	}
	// Read every replica that can serve.
	scans := map[int]Result{}
	raw := map[int]map[uint64][]byte{}
	var readErrs []error
	for _, r := range served {
		if u.NoReconcile && len(scans) > 0 {
			break // one replica only
		}
		res, blocks, err := scanReplica(ctx, dev, r, h, u)
		if err != nil {
			if ctx.Err() != nil {
				return rep, ctx.Err()
			}
			readErrs = append(readErrs, fmt.Errorf("replica %d: %w", r, err))
			continue // this replica cannot serve
		}
		scans[r], raw[r] = res, blocks
		rep.Replicas = append(rep.Replicas, r)
	}
	if len(scans) == 0 {
		return rep, fmt.Errorf("txn: no replica of the log can serve: %w", errors.Join(readErrs...))
	}
	win := -1
	for _, r := range rep.Replicas {
		if win < 0 || scans[r].End > scans[win].End || (scans[r].End == scans[win].End && scans[r].Blocks > scans[win].Blocks) {
			win = r
		}
	}
	rep.Winner = win
	res := scans[win]
	rep.Scanned = []Result{scans[0], scans[1]}
	// Make the other replica hold the same log (the reason the log turns
	// the RLDev's dirty-region log off: it knows which blocks can differ).
	headSeq, _ := SeqOf(h.Head)
	for _, r := range rep.Replicas {
		if r == win || u.NoReconcile {
			continue
		}
		for i := 0; i < res.Blocks; i++ {
			b := RingBlock(headSeq+uint64(i), ring)
			theirs, ok := raw[r][b]
			if !ok {
				x, err := dev.ReadReplica(ctx, r, b, 1)
				if err != nil {
					return rep, fmt.Errorf("txn: reading replica %d to repair it: %w", r, err)
				}
				theirs = x
			}
			if !bytes.Equal(theirs, raw[win][b]) {
				if err := dev.WriteReplica(ctx, r, b, raw[win][b], &fence); err != nil {
					return rep, fenced(fmt.Errorf("txn: repairing block %d of replica %d: %w", b, r, err))
				}
				rep.Repaired++
			}
		}
	}
	// A replica that could not be read (down, or stale and waiting for its
	// resync) may hold a different tail, and it may be the only one left
	// when the next recovery runs: this one is about to act on the
	// winner's tail, so it writes that tail through the RLDev, which
	// copies it to the missing replica before that serves again (the
	// blocks are in its degraded-mode log).
	if len(rep.Replicas) < 2 && !u.NoReconcile {
		for i := 0; i < res.Blocks; {
			b := RingBlock(headSeq+uint64(i), ring)
			run := 0
			var buf []byte
			for i+run < res.Blocks && b+uint64(run) < HeaderBlocks+ring && run < readBlocks {
				buf = append(buf, raw[win][b+uint64(run)]...)
				run++
			}
			if err := writeFenced(ctx, dev, b, buf, &fence); err != nil {
				return rep, err
			}
			rep.Rewritten += run
			i += run
		}
	}
	plan := Analyze(res.Records)
	rep.Records, rep.End, rep.Next, rep.Why = len(res.Records), res.End, res.Next, res.Why
	rep.Committed, rep.Aborted, rep.Losers = plan.Committed, plan.Aborted, plan.Losers
	if sel, ok := ap.(Selector); ok {
		plan.Redo, plan.Undo = sel.Select(plan)
	}
	if pa, ok := ap.(ParallelApplier); ok && pa.Parallel() > 1 {
		n, err := applyParallel(ctx, ap, plan.Redo, pa.Parallel(), fence)
		rep.Redone += n
		if err != nil {
			return rep, err
		}
	} else {
		for _, r := range plan.Redo {
			if err := ap.Apply(ctx, r.Target, r.Off, r.Redo, r.LSN, &fence); err != nil {
				return rep, fmt.Errorf("txn: redo of the record at %d: %w", r.LSN, err)
			}
			rep.Redone++
		}
	}
	if !u.NoUndo {
		for _, r := range plan.Undo {
			if err := ap.Apply(ctx, r.Target, r.Off, r.Undo, r.LSN, &fence); err != nil {
				return rep, fmt.Errorf("txn: undo of the record at %d: %w", r.LSN, err)
			}
			rep.Undone++
		}
	}
	nh := Header{Gen: h.Gen + 1, Floor: fence.Token, Head: res.Next, Ring: ring, Writer: fence.Token}
	if err := writeFenced(ctx, dev, nh.Gen%2, EncodeHeader(nh), &fence); err != nil {
		return rep, err
	}
	rep.NewHeader = nh
	return rep, nil
}

// applyParallel applies the independent records rs (ParallelApplier), up
// to n at once: it returns how many were applied, and the first failure
// (the others in flight are cancelled).
func applyParallel(ctx context.Context, ap Applier, rs []Record, n int, fence rldev.Fence) (int, error) {
	// The first failure cancels the others.
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(n)
	var applied atomic.Int64
	for _, r := range rs {
		if gctx.Err() != nil {
			break
		}
		g.Go(func() error {
			f := fence
			if err := ap.Apply(gctx, r.Target, r.Off, r.Redo, r.LSN, &f); err != nil {
				return fmt.Errorf("txn: redo of the record at %d: %w", r.LSN, err)
			}
			applied.Add(1)
			return nil
		})
	}
	err := g.Wait()
	if err == nil {
		err = ctx.Err()
	}
	return int(applied.Load()), err
}

func fenced(err error) error {
	if errors.Is(err, rldev.ErrStaleToken) || errors.Is(err, lock.ErrStaleToken) {
		return fmt.Errorf("%w: %w", ErrFenced, err)
	}
	return err
}

func writeFenced(ctx context.Context, dev Device, block uint64, data []byte, f *rldev.Fence) error {
	if err := dev.Write(ctx, block, data, f); err != nil {
		return fenced(fmt.Errorf("txn: writing log block %d: %w", block, err))
	}
	return nil
}

// readHeader returns the newest whole header any replica holds.
func readHeader(ctx context.Context, dev Device, ring uint64) (Header, []int, error) {
	var best Header
	found, empty, blankTorn := false, 0, 0
	var served []int
	var errs []error
	for r := 0; r < 2; r++ {
		b, err := dev.ReadReplica(ctx, r, 0, 2)
		if err != nil {
			errs = append(errs, fmt.Errorf("replica %d: %w", r, err))
			continue
		}
		served = append(served, r)
		var bad []error
		blank := 0
		for i := 0; i < 2; i++ {
			h, err := DecodeHeader(b[i*BlockSize : (i+1)*BlockSize])
			switch {
			case errors.Is(err, ErrNoHeader):
				blank++
			case err != nil:
				bad = append(bad, fmt.Errorf("replica %d header %d: %w", r, i, err))
			case !found || h.newer(best):
				best, found = h, true
			}
		}
		if blank == 1 && len(bad) == 1 {
			// One slot never written and the other not whole: on this
			// replica, no header write but a cut one ever landed. If the
			// other replica says the same (or is blank), the log's first
			// header write was cut and nothing was appended: a new log.
			// Alone it proves nothing: the other may hold headers this one
			// missed when writes to it were cut.
			blankTorn++
			blank = 2
		}
		empty += blank
		errs = append(errs, bad...)
	}
	switch {
	case found:
		return best, served, nil
	case len(served) == 0:
		return best, nil, fmt.Errorf("txn: no replica of the log can serve: %w", errors.Join(errs...))
	case empty == 2*len(served) && (blankTorn == 0 || len(served) == 2):
		return best, served, ErrNoHeader
	case empty == 2*len(served):
		return best, nil, fmt.Errorf("%w: replica %d holds no whole header and the other cannot be read: waiting for it", ErrUnavailable, served[0])
	}
	return best, nil, fmt.Errorf("txn: no whole log header: %w", errors.Join(errs...))
}

// scanReplica reads replica r's log from h's head.
func scanReplica(ctx context.Context, dev Device, r int, h Header, u Unsafe) (Result, map[uint64][]byte, error) {
	s := NewScanner(h)
	s.ignoreTokens = u.NoFloor
	raw := map[uint64][]byte{}
	for s.Wanted() > 0 {
		start := s.Next()
		n := min(uint64(readBlocks), HeaderBlocks+h.Ring-start, s.Wanted())
		b, err := dev.ReadReplica(ctx, r, start, n)
		if err != nil {
			return Result{}, nil, err
		}
		more := true
		for i := uint64(0); i < n && more; i++ {
			blk := b[i*BlockSize : (i+1)*BlockSize]
			raw[start+i] = blk
			more = s.Feed(blk)
		}
		if !more {
			break
		}
	}
	return s.Result(), raw, nil
}
