package txn

import (
	"fmt"
	"slices"

	"github.com/grovestore/grove/internal/lock"
)

// BuildFlush lays out one flush (a group commit): buf, the record stream
// from LSNOf(seq, 0) on, in whole blocks from sequence number seq, stamped
// with the writer's token. starts are the offsets in buf where records
// begin (ascending; buf begins with one). The last block is padded.
func BuildFlush(seq uint64, tok lock.Token, buf []byte, starts []int) [][]byte {
	if len(buf) == 0 || len(starts) == 0 || starts[0] != 0 {
		panic("txn: a flush must begin with a record")
	}
	var blocks [][]byte
	si := 0
	for off := 0; off < len(buf); off += Payload {
		end := min(off+Payload, len(buf))
		first := NoRecord
		for si < len(starts) && starts[si] < off {
			si++
		}
		if si < len(starts) && starts[si] < end {
			first = starts[si] - off
		}
		blocks = append(blocks, EncodeBlock(seq+uint64(len(blocks)), tok, first, buf[off:end]))
	}
	return blocks
}

// Scanner reads a log from its head: the runtime feeds it the ring's blocks
// in order (as read from one replica) until Feed says the log ended. A
// block belongs to the log only if it decodes, has the next sequence
// number, and was written under a token no older than the floor and than
// the block before it: a block a dead owner's torn or late flush left
// beyond the end (on one replica or both) is older than the token of
// whoever recovered the log and every owner since, so it is never taken
// for the log, even once the ring has been written past it.
type Scanner struct {
	ring    uint64
	next    uint64 // sequence number of the next block
	tok     lock.Token
	skip    int    // bytes of the head block before the head record
	fresh   bool   // the next block must begin with a record (a flush starts)
	pending []byte // a record begun in earlier blocks
	pendLSN LSN
	ended   bool
	why     string
	lastSeq uint64 // the last block the log holds (valid if blocks > 0)
	blocks  int
	records []Record
	endLSN  LSN
	// ignoreTokens is Unsafe.NoFloor.
	ignoreTokens bool
}

// NewScanner starts a scan at header h.
func NewScanner(h Header) *Scanner {
	seq, off := SeqOf(h.Head)
	return &Scanner{ring: h.Ring, next: seq, tok: h.Floor, skip: off, fresh: true, endLSN: h.Head}
}

// Next is the ring block the scan reads next.
func (s *Scanner) Next() uint64 { return RingBlock(s.next, s.ring) }

// Wanted is how many more blocks the scan may read before it has been
// once around the ring (at most).
func (s *Scanner) Wanted() uint64 {
	if s.ended {
		return 0
	}
	return s.ring - uint64(s.blocks)
}

// Feed takes the next block (BlockSize bytes) and reports whether the log
// may go on after it.
func (s *Scanner) Feed(b []byte) bool {
	if s.ended {
		return false
	}
	if uint64(s.blocks) == s.ring {
		return s.end("once around the ring")
	}
	k, err := DecodeBlock(b)
	switch {
	case err != nil:
		return s.end(err.Error())
	case k.Seq != s.next:
		return s.end(fmt.Sprintf("block %d found where %d belongs", k.Seq, s.next))
	case !s.ignoreTokens && k.Token.Less(s.tok):
		return s.end(fmt.Sprintf("block %d written under token %v, older than %v", k.Seq, k.Token, s.tok))
	}
	data := k.Data
	if s.blocks == 0 && s.skip > 0 {
		if s.skip > len(data) {
			return s.end("the head is past the end of its block")
		}
		data = data[s.skip:]
		s.fresh = true
	} else if s.fresh && (k.First != 0) {
		// A flush starts here: its first record starts the block.
		if len(s.pending) > 0 {
			return s.end("a record runs into a new flush")
		}
		if k.Used == 0 && k.First == NoRecord {
			return s.end("an empty block")
		}
		return s.end(fmt.Sprintf("block %d begins a flush but no record at its start", k.Seq))
	} else if !s.fresh && len(s.pending) == 0 && k.First != 0 {
		return s.end(fmt.Sprintf("block %d does not begin with a record", k.Seq))
	} else if !s.fresh && len(s.pending) > 0 && k.First == 0 {
		return s.end(fmt.Sprintf("block %d begins a record inside another", k.Seq))
	}
	s.tok = k.Token
	s.blocks++
	s.lastSeq = k.Seq
	s.next++
	base := LSNOf(k.Seq, k.Used-len(data))
	s.parse(base, data)
	if s.ended {
		return false
	}
	// A block not filled ends its flush: the next block starts another.
	s.fresh = k.Used < Payload
	if s.fresh && len(s.pending) > 0 {
		return s.end(fmt.Sprintf("block %d ends a flush inside a record", k.Seq))
	}
	return true
}

// parse takes the stream bytes data, which begin at LSN base.
func (s *Scanner) parse(base LSN, data []byte) {
	for len(data) > 0 {
		if len(s.pending) == 0 {
			s.pendLSN = base
		}
		need := recHdr
		if len(s.pending) >= recHdr {
			n, _, err := recordLen(s.pending)
			if err != nil {
				s.end(err.Error())
				return
			}
			need = n
		}
		take := min(need-len(s.pending), len(data))
		s.pending = append(s.pending, data[:take]...)
		data, base = data[take:], base+LSN(take)
		if len(s.pending) < need {
			continue
		}
		if need == recHdr {
			n, _, err := recordLen(s.pending)
			if err != nil {
				s.end(err.Error())
				return
			}
			if n > recHdr {
				continue
			}
		}
		r, err := DecodeRecord(s.pending)
		if err != nil {
			s.end(err.Error())
			return
		}
		// Copy: the record must not alias the scan's buffer.
		r.Target, r.Redo, r.Undo = slices.Clone(r.Target), slices.Clone(r.Redo), slices.Clone(r.Undo)
		r.LSN = s.pendLSN
		s.records = append(s.records, r)
		s.pending = s.pending[:0]
		s.endLSN = base
	}
}

func (s *Scanner) end(why string) bool {
	if !s.ended {
		s.ended, s.why = true, why
	}
	return false
}

// Result is what a finished scan found.
type Result struct {
	Records []Record
	// End is the LSN after the last whole record.
	End LSN
	// Next is where the next flush may begin: the block after the last one
	// the log holds (a fresh block, whatever a torn tail left in it).
	Next LSN
	// Blocks is how many blocks the log holds from its head.
	Blocks int
	// Why the scan stopped.
	Why string
}

// Result ends the scan.
func (s *Scanner) Result() Result {
	s.end("the caller stopped")
	next := LSN(0)
	if s.blocks > 0 {
		next = LSNOf(s.lastSeq+1, 0)
	} else {
		seq, off := SeqOf(s.endLSN)
		if off > 0 {
			seq++
		}
		next = LSNOf(seq, 0)
	}
	return Result{Records: s.records, End: s.endLSN, Next: next, Blocks: s.blocks, Why: s.why}
}

// Plan is what recovery does with the records of a log.
type Plan struct {
	// Redo is every update and compensation, in log order: recovery
	// repeats history, losers included — but a redo-only update only if
	// its transaction committed (nothing would undo it).
	Redo []Record
	// Undo is every update of a loser (a transaction with no commit or
	// abort record) that has an undo image, latest first: applied after
	// Redo, each restores its before-image.
	Undo []Record
	// Committed and Aborted are the transactions by outcome, in the order
	// of their commit or abort records; Losers in the order they began.
	Committed, Aborted, Losers []uint64
}

// Analyze plans recovery from records (in log order).
func Analyze(recs []Record) Plan {
	var p Plan
	ended := map[uint64]Kind{}
	var order []uint64
	seen := map[uint64]bool{}
	committed := map[uint64]bool{}
	for _, r := range recs {
		if r.Kind == KindCommit {
			committed[r.Txn] = true
		}
	}
	for _, r := range recs {
		if !seen[r.Txn] {
			seen[r.Txn] = true
			order = append(order, r.Txn)
		}
		switch r.Kind {
		case KindUpdate, KindCompensation:
			if r.RedoOnly() && !committed[r.Txn] {
				continue // an aborted or lost no-steal change: its target never had it
			}
			p.Redo = append(p.Redo, r)
		case KindCommit:
			ended[r.Txn] = r.Kind
			p.Committed = append(p.Committed, r.Txn) // in commit order
		case KindAbort:
			ended[r.Txn] = r.Kind
			p.Aborted = append(p.Aborted, r.Txn)
		}
	}
	for i := len(recs) - 1; i >= 0; i-- {
		if r := recs[i]; r.Kind == KindUpdate && ended[r.Txn] == 0 && !r.RedoOnly() {
			p.Undo = append(p.Undo, r)
		}
	}
	for _, t := range order {
		if ended[t] == 0 {
			p.Losers = append(p.Losers, t)
		}
	}
	return p
}
