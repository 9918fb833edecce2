package btree

// This file is the completion record of a tokened write (RIFL, Lee et al.,
// SOSP 2015): what lets a client send a put or delete again after an answer
// it did not get, without the write taking effect twice. It does no I/O
// (the lint test keeps it so).
//
// A write that carries a WriteToken is looked up, under its leaf's
// exclusive lock and before anything else, among the leaf's completion
// records: one found is the answer (the write happened, or failed its
// condition, once, at that record's change). None found, the write is
// evaluated, and its outcome is recorded in the same image (and so the
// same log record) as its change, whether or not its condition held: an
// attempt delayed past a retry that failed its condition must not apply
// later, after the client was told "not applied".
//
// Records follow their keys (each holds its key): a split, a merge and a
// rebalance partition them as they partition entries, so the record of a
// write to k is always in the leaf covering k, beside k's entry.
//
// Forgetting. A record cannot be kept for ever, so attempts age. A write
// with no record applies only while now < Stamp + TokenWindow on the
// server's clock (Stamp is the client's first send); a record is dropped
// only once now > Stamp + TokenWindow + 2·ClockSkew. With every server's
// clock within ClockSkew of true time, no attempt that could still apply
// can arrive after its record is gone. Safety rests on the servers' clocks
// alone: a client's wrong clock costs it only liveness (a stamp later than
// now + 2·ClockSkew is refused; one too early ages at once).
//
// Room. Records take the room a leaf's entries leave (entries decide
// splits and merges, never records): when a leaf's image would be too
// large, its oldest records are evicted and Horizon rises to the newest
// stamp evicted. A write with no record whose stamp is at or below the
// horizon may have had its record evicted: it is refused. The horizon is
// cleared once past its time (now > Horizon + TokenWindow + 2·ClockSkew:
// every write stamped at or below it is refused for age by then).
//
// Floors (RIFL's acknowledgement of answers). A client numbers its writes
// and sends with each attempt its floor: the lowest sequence number among
// its writes still waiting for an answer (so every write of it numbered
// below has its answer, or was given up). When a tokened write commits in
// a leaf, its client's records there numbered below the floor are dropped,
// and the leaf keeps one Floor for that client in their place: an attempt
// of the client numbered below it, with no record, is refused (it is a
// stale duplicate of a write the client no longer waits for; the client
// never sent it again, so its refusal reaches nobody). A leaf does so only
// once its records take half the room its entries leave (raiseFloor says
// why). A floor lives as long as the newest record it replaced would have
// (its Stamp), is evicted for room as records are (raising the horizon to
// its Stamp), goes to both halves of a split, and a merge keeps the higher
// of two. So a client that keeps writing to a leaf keeps there its records
// since the last batch and one floor, where without floors its records
// stayed for the whole token window and, on a busy leaf, were evicted,
// raising the horizon that refuses every late resend.
//
// A refusal (ErrTokenExpired) says only that this attempt did nothing and
// that the write's record, if it had one, is gone. Whether the write did
// nothing is for the client to say: it did if no other attempt of it was
// sent (WriteToken.Attempt 1, by the client's rule), and its outcome is
// unknown otherwise. (The server cannot tell: an attempt numbered 1 may
// arrive after a later one that applied and whose record was evicted, or
// on a server whose clock is ahead of the one that applied it.)

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"sort"
	"sync/atomic"
	"time"
)

const (
	// TokenWindow bounds how long after its first send a tokened write
	// may still take effect (on the server's clock). An attempt sent past
	// it is refused (ErrTokenExpired): the Go client's default call
	// timeout (30 s) and the CLI's resends (30 s with no command timeout)
	// end within it; a longer call timeout costs only that refusal. A
	// cluster-wide constant: a server with a longer one could apply an
	// attempt whose record another server already dropped.
	TokenWindow = 60 * time.Second
	// ClockSkew bounds how far a server's clock is from true time (the
	// loose synchrony garbage deadlines already assume).
	ClockSkew = 30 * time.Second
	// completionFixed is a record's encoded size beside its key;
	// doneOverhead a version 2 image's beside its records (its trailer:
	// the horizon, the count and the section's offset), which fits counts
	// in a leaf that has them (and MaxEntry always), so that a horizon
	// never makes an image too big.
	completionFixed = 2 + 16 + 8 + 8 + 8 + 1
	doneOverhead    = 8 + 2 + 4
	// maxDone bounds a leaf's records and floors (the encoding's u16
	// count).
	maxDone = 1<<16 - 1
	// floorFlag marks a floor in the records section: a record with no
	// key, whose Seq is the floor and Print zero.
	floorFlag = 4
)

// Errors of tokened writes. Neither is ErrNotApplied: a tokened write is
// not resent on another server on these answers.
var (
	// ErrTokenExpired: an attempt arrived too late (past the token window,
	// at or below its leaf's horizon, or stamped in the future) and did
	// nothing; the write's record, if it had one, is gone. If no other
	// attempt of the write was sent, the write did nothing, and the client
	// may send it again under a new token; otherwise its outcome is
	// unknown.
	ErrTokenExpired = errors.New("btree: the write's token is too old, or its record was evicted (or it is stamped in the future): this attempt did nothing")
	// ErrTokenFloor: the token's floor is above its own sequence number
	// (a write waits for its own answer, so its floor is at most its
	// number): nothing was done. A client defect.
	ErrTokenFloor = errors.New("btree: the write token's floor is above its sequence number")
	// ErrTreeChanged: the token names another tree than the one under
	// its name now (dropped and made again since the client looked it
	// up): this attempt did nothing.
	ErrTreeChanged = errors.New("btree: the tree this write was meant for was dropped, and a tree of its name made since: this attempt did nothing")
	// ErrTokenReused: the token names another write (another operation,
	// key, value, condition or stamp): nothing was done. A client defect.
	ErrTokenReused = errors.New("btree: the write's token was used for another write")
)

// WriteToken identifies one logical write across its attempts. Every
// attempt carries the same Client, Seq and Stamp.
type WriteToken struct {
	Client [16]byte // random, per client process
	Seq    uint64   // the client's sequence number of the write (unique per client)
	// Attempt is 1 while no attempt of unknown outcome was sent before
	// (the client's rule; diagnostic to the server, see ErrTokenExpired).
	Attempt uint32
	Stamp   int64 // the client's clock at the first send, in Unix nanoseconds
	// Floor: every write of Client numbered below it has its answer or
	// was given up, and is not sent again (0: the client says nothing).
	// At most Seq. It may differ between attempts of one write.
	Floor uint64
	// Tree is the anchor of the tree the write was meant for, the same in
	// every attempt (zero: not said). An attempt that reaches another
	// tree under the name is refused (Service, ErrTreeChanged): records
	// live in their tree, and a tree made again under a dropped one's name
	// has none of the old one's.
	Tree Handle
}

// Floor stands for the records of Client's writes numbered below Seq that
// a leaf dropped (see "Floors" above). Stamp is the newest of their stamps.
type Floor struct {
	Client [16]byte
	Seq    uint64
	Stamp  int64
}

// Completion is a tokened write's completion record, kept in the leaf that
// covers Key.
type Completion struct {
	Key    []byte
	Client [16]byte
	Seq    uint64
	Print  uint64 // fingerprint of the write (fingerprint)
	Stamp  int64
	// The write's answer: whether its change applied, and whether the key
	// was present before it.
	Applied, Found bool
}

// Teeth of completion.go's tests (Tree.unsafeDone): each breaks one rule.
const (
	unsafeDoneSplitDrops     = iota + 1 // a split's new node gets no records
	unsafeDoneMergeDrops                // a merge keeps only the left node's records
	unsafeDoneRebalanceDrops            // a rebalance drops the records of keys that move
	unsafeDoneNoFailure                 // a failed condition leaves no record
	unsafeDoneNoAge                     // no age check
	unsafeDoneNoHorizon                 // eviction does not raise the horizon
	unsafeDoneFloorForgets              // records dropped by a floor leave no floor
)

// Write kinds, for fingerprints.
const (
	opPut    = 1
	opDelete = 2
)

// fingerprint identifies a write by what it asks: a token sent again with
// another write is refused (ErrTokenReused) rather than answered with the
// first write's outcome.
func fingerprint(op byte, key, val []byte, cond Cond) uint64 {
	h := fnv.New64a()
	var b [13]byte
	b[0] = op
	b[1] = byte(cond.Kind)
	binary.LittleEndian.PutUint32(b[2:], uint32(len(key)))
	binary.LittleEndian.PutUint32(b[6:], uint32(len(val)))
	if cond.Kind == IfEquals {
		b[10] = 1
	}
	h.Write(b[:])
	h.Write(key)
	h.Write(val)
	if cond.Kind == IfEquals {
		h.Write(cond.Value)
	}
	return h.Sum64()
}

// version2 reports whether n's image needs format version 2.
func (n *Node) version2() bool { return len(n.Done) > 0 || len(n.Floors) > 0 || n.Horizon != 0 }

func (n *Node) doneSize() int {
	if !n.version2() {
		return 0
	}
	s := doneOverhead
	for _, c := range n.Done {
		s += completionFixed + len(c.Key)
	}
	return s + len(n.Floors)*completionFixed
}

// appendDone appends the records section of the image that starts at
// b[start]: the horizon, the records, and the section's offset in the
// image (a node delta cuts the image there: delta.go).
func (n *Node) appendDone(b []byte, start int) []byte {
	off := len(b) - start
	for _, c := range n.Done {
		b = binary.LittleEndian.AppendUint16(b, uint16(len(c.Key)))
		b = append(b, c.Key...)
		b = append(b, c.Client[:]...)
		b = binary.LittleEndian.AppendUint64(b, c.Seq)
		b = binary.LittleEndian.AppendUint64(b, c.Print)
		b = binary.LittleEndian.AppendUint64(b, uint64(c.Stamp))
		var f byte
		if c.Applied {
			f |= 1
		}
		if c.Found {
			f |= 2
		}
		b = append(b, f)
	}
	// Floors after the records, each as a record with no key.
	for _, f := range n.Floors {
		b = binary.LittleEndian.AppendUint16(b, 0)
		b = append(b, f.Client[:]...)
		b = binary.LittleEndian.AppendUint64(b, f.Seq)
		b = binary.LittleEndian.AppendUint64(b, 0)
		b = binary.LittleEndian.AppendUint64(b, uint64(f.Stamp))
		b = append(b, floorFlag)
	}
	// The horizon and the count after the records, beside the offset: a
	// record added or evicted changes the bytes around it and these (which
	// a delta carries whole), not the section's start.
	b = binary.LittleEndian.AppendUint64(b, uint64(n.Horizon))
	b = binary.LittleEndian.AppendUint16(b, uint16(len(n.Done)+len(n.Floors)))
	return binary.LittleEndian.AppendUint32(b, uint32(off))
}

// doneOffset is the offset of a version 2 image's records section (its
// length given, CRC included), read from its trailer: 0 if b is no such
// image, or the offset is out of its bounds.
func doneOffset(b []byte) int {
	if len(b) < headerSize+doneOverhead+4 || string(b[:4]) != nodeMagic2 {
		return 0
	}
	length := int(binary.LittleEndian.Uint32(b[4:]))
	if length > len(b) || length < headerSize+doneOverhead+4 {
		return 0
	}
	off := int(binary.LittleEndian.Uint32(b[length-8:]))
	if off < headerSize || off > length-4-doneOverhead {
		return 0
	}
	return off
}

func (r *reader) done(n *Node) {
	off := r.off
	// The trailer (horizon, count, offset) ends the reader's bytes (the
	// CRC is cut off).
	if len(r.b) < r.off+doneOverhead {
		r.err = fmt.Errorf("truncated at byte %d", r.off)
		return
	}
	n.Horizon = int64(binary.LittleEndian.Uint64(r.b[len(r.b)-doneOverhead:]))
	count := int(binary.LittleEndian.Uint16(r.b[len(r.b)-6:]))
	for i := 0; i < count && r.err == nil; i++ {
		c := Completion{Key: r.bytes16()}
		copy(c.Client[:], r.take(16))
		c.Seq = r.u64()
		c.Print = r.u64()
		c.Stamp = int64(r.u64())
		f := r.take(1)
		if f == nil {
			return
		}
		if f[0] == floorFlag {
			if len(c.Key) != 0 || c.Print != 0 {
				r.err = fmt.Errorf("completion record %d: a floor with a key or a fingerprint", i)
				return
			}
			n.Floors = append(n.Floors, Floor{Client: c.Client, Seq: c.Seq, Stamp: c.Stamp})
			continue
		}
		if f[0]&^3 != 0 {
			r.err = fmt.Errorf("completion record %d: unknown flags %#x", i, f[0])
			return
		}
		if len(n.Floors) > 0 {
			r.err = fmt.Errorf("completion record %d after a floor", i)
			return
		}
		c.Applied, c.Found = f[0]&1 != 0, f[0]&2 != 0
		n.Done = append(n.Done, c)
	}
	if r.err == nil && count == 0 && n.Horizon == 0 {
		// Encode writes such a node as version 1: one image, one encoding.
		r.err = errors.New("a version 2 image with neither records nor a horizon")
	}
	if r.err == nil && r.off != len(r.b)-doneOverhead {
		r.err = fmt.Errorf("the records end at byte %d, not at the trailer", r.off)
		return
	}
	r.take(8 + 2) // (read above)
	if at := r.take(4); at != nil && int(binary.LittleEndian.Uint32(at)) != off {
		r.err = fmt.Errorf("the records section is at %d, its trailer says %d", off, binary.LittleEndian.Uint32(at))
	}
}

// checkDone: records and floors only in a live leaf; records for keys it
// covers, sorted by key, each token once; at most one floor per client,
// none zero.
func (n *Node) checkDone() error {
	if len(n.Done) == 0 && len(n.Floors) == 0 && n.Horizon == 0 {
		return nil
	}
	if !n.Leaf() || n.Deleted {
		return errors.New("completion records, floors or a horizon in an internal or removed node")
	}
	if len(n.Done)+len(n.Floors) > maxDone {
		return fmt.Errorf("%d completion records and %d floors", len(n.Done), len(n.Floors))
	}
	floors := make(map[[16]byte]bool, len(n.Floors))
	for i, f := range n.Floors {
		if f.Seq == 0 || floors[f.Client] {
			return fmt.Errorf("floor %d: zero, or a second floor of one client", i)
		}
		floors[f.Client] = true
	}
	// (A token reused for keys of two leaves is refused only within one
	// leaf: a merge may bring two records of it together, each of its key.)
	type id struct {
		client [16]byte
		seq    uint64
		key    string
	}
	seen := make(map[id]bool, len(n.Done))
	for i, c := range n.Done {
		if len(c.Key) == 0 || len(c.Key) > MaxKey || !n.Covers(c.Key) {
			return fmt.Errorf("completion record %d: key %q outside [%q, %q)", i, c.Key, n.Low, n.High)
		}
		if i > 0 && bytes.Compare(n.Done[i-1].Key, c.Key) > 0 {
			return fmt.Errorf("completion records %d and %d out of order", i-1, i)
		}
		k := id{c.Client, c.Seq, string(c.Key)}
		if seen[k] {
			return fmt.Errorf("completion record %d: a second record of one token and key", i)
		}
		seen[k] = true
	}
	return nil
}

// findDone returns the index of tok's record in n, or -1: the record of
// key if there is one, else any record of tok (a reuse of it).
func (n *Node) findDone(tok *WriteToken, key []byte) int {
	found := -1
	for i := range n.Done {
		if n.Done[i].Seq == tok.Seq && n.Done[i].Client == tok.Client {
			if bytes.Equal(n.Done[i].Key, key) {
				return i
			}
			found = i
		}
	}
	return found
}

// addDone inserts c in key order (after the records of the same key).
func (n *Node) addDone(c Completion) {
	i := sort.Search(len(n.Done), func(i int) bool { return bytes.Compare(n.Done[i].Key, c.Key) > 0 })
	n.Done = insertAt(n.Done, i, c)
}

// floorOf returns the index of client's floor in n, or -1.
func (n *Node) floorOf(client [16]byte) int {
	for i := range n.Floors {
		if n.Floors[i].Client == client {
			return i
		}
	}
	return -1
}

// raiseFloor applies a tokened write's floor to n, a new image that
// records the write's outcome: the client's records numbered below the
// floor give way to one floor. It returns the number of records dropped.
// Only records need a floor: with none to drop, n is left as it is (no
// attempt that could apply here is below the floor then, since an
// answered write's record is in its key's leaf, and one dropped before is
// below the floor kept then).
//
// It acts only once the records take half the room the entries leave:
// until then a put only adds its record, which its log delta carries in a
// few bytes at the records' end (delta.go), where a dropped record and a
// changed floor would make the delta span the records between; a batch
// dropped at once keeps most puts small. (Measured with BenchmarkPutDeltas,
// 64 hot keys: dropping at every put logged 1 497 bytes a put against
// 1 160 without floors.)
func (t *Tree) raiseFloor(n *Node, tok *WriteToken) int {
	if tok.Floor == 0 || !t.cfg.eagerFloors && n.doneSize() <= (t.cfg.NodeSize-n.entriesSize())/2 {
		return 0
	}
	j := n.floorOf(tok.Client)
	stamp, dropped := int64(0), 0
	keep := n.Done[:0:0]
	for _, c := range n.Done {
		if c.Client == tok.Client && c.Seq < tok.Floor {
			stamp = max(stamp, c.Stamp)
			dropped++
			continue
		}
		keep = append(keep, c)
	}
	if dropped == 0 {
		return 0
	}
	n.Done = keep
	if len(n.Done) == 0 {
		n.Done = nil
	}
	if t.unsafeDone == unsafeDoneFloorForgets {
		return dropped
	}
	if j < 0 {
		n.Floors = append(n.Floors, Floor{Client: tok.Client, Seq: tok.Floor, Stamp: stamp})
	} else {
		f := &n.Floors[j]
		f.Seq, f.Stamp = max(f.Seq, tok.Floor), max(f.Stamp, stamp)
	}
	return dropped
}

// mergeFloors is the floors of a merge of two leaves: per client, the
// higher floor, kept as long as the longer-lived.
func mergeFloors(a, b []Floor) []Floor {
	out := append([]Floor(nil), a...)
next:
	for _, f := range b {
		for i := range out {
			if out[i].Client == f.Client {
				out[i].Seq, out[i].Stamp = max(out[i].Seq, f.Seq), max(out[i].Stamp, f.Stamp)
				continue next
			}
		}
		out = append(out, f)
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// splitDone gives r (the upper half of a split or rebalance, from key
// r.Low on) the records of n at or above r.Low, and both halves the
// horizon and the floors (a floor is a client's, not a key's). n and r
// are new images (their Done slices are their own).
func splitDone(all []Completion, floors []Floor, horizon int64, l, r *Node) {
	i := sort.Search(len(all), func(i int) bool { return bytes.Compare(all[i].Key, r.Low) >= 0 })
	l.Done = append([]Completion(nil), all[:i]...)
	r.Done = append([]Completion(nil), all[i:]...)
	l.Horizon, r.Horizon = horizon, horizon
	l.Floors, r.Floors = nil, nil
	if len(floors) > 0 {
		l.Floors, r.Floors = append([]Floor(nil), floors...), append([]Floor(nil), floors...)
	}
	if len(l.Done) == 0 {
		l.Done = nil
	}
	if len(r.Done) == 0 {
		r.Done = nil
	}
}

// trimDone makes n's image fit size: records and floors past their time
// are dropped (now > Stamp + window + 2·skew), and so is a horizon past
// its time; then the oldest records and floors are evicted, raising the
// horizon, until it fits. Entries are never touched: a caller only trims
// an image whose entries fit (fits counts a horizon's bytes).
func trimDone(n *Node, size int, now int64, window, skew time.Duration) (dropped, evicted int) {
	life := int64(window) + 2*int64(skew)
	if n.Horizon != 0 && now > n.Horizon+life {
		n.Horizon = 0
	}
	if len(n.Done) == 0 && len(n.Floors) == 0 {
		n.Done, n.Floors = nil, nil
		return 0, 0
	}
	var aged int
	n.Done, dropped = unaged(n.Done, func(c Completion) int64 { return c.Stamp }, now, life)
	n.Floors, aged = unaged(n.Floors, func(f Floor) int64 { return f.Stamp }, now, life)
	dropped += aged
	over := n.Size() - size
	if over > 0 {
		// Evict down to three quarters of the records' room, not just
		// below it: the next puts then only add records (small deltas,
		// delta.go), and one evicts a batch.
		rec := len(n.Floors) * completionFixed
		for _, c := range n.Done {
			rec += completionFixed + len(c.Key)
		}
		room := size - (n.Size() - rec)
		over = rec - room*3/4
	}
	if len(n.Done)+len(n.Floors) > maxDone || over > 0 {
		// Records (i < len(n.Done)) and floors (the rest), oldest first.
		nd := len(n.Done)
		stamp := func(i int) int64 {
			if i < nd {
				return n.Done[i].Stamp
			}
			return n.Floors[i-nd].Stamp
		}
		order := make([]int, nd+len(n.Floors))
		for i := range order {
			order[i] = i
		}
		sort.SliceStable(order, func(a, b int) bool { return stamp(order[a]) < stamp(order[b]) })
		gone := make([]bool, len(order))
		left := len(order)
		for _, i := range order {
			if over <= 0 && left <= maxDone {
				break
			}
			gone[i] = true
			left--
			evicted++
			if i < nd {
				over -= completionFixed + len(n.Done[i].Key)
			} else {
				over -= completionFixed
			}
			if st := stamp(i); st > n.Horizon {
				n.Horizon = st
			}
		}
		keep := n.Done[:0:0]
		for i, c := range n.Done {
			if !gone[i] {
				keep = append(keep, c)
			}
		}
		keepF := n.Floors[:0:0]
		for i, f := range n.Floors {
			if !gone[nd+i] {
				keepF = append(keepF, f)
			}
		}
		n.Done, n.Floors = keep, keepF
	}
	if len(n.Done) == 0 {
		n.Done = nil
	}
	if len(n.Floors) == 0 {
		n.Floors = nil
	}
	return dropped, evicted
}

// unaged returns (in a new slice) the xs whose life has not ended at now
// (now <= stamp + life), and how many it left out.
func unaged[T any](xs []T, stamp func(T) int64, now, life int64) ([]T, int) {
	keep := xs[:0:0]
	for _, x := range xs {
		if now <= stamp(x)+life {
			keep = append(keep, x)
		}
	}
	return keep, len(xs) - len(keep)
}

// didNothing reports whether err is an update's answer that it changed
// nothing and never will (its value chunk, if any, is unnamed).
func didNothing(err error) bool {
	return errors.Is(err, ErrNotApplied) || errors.Is(err, ErrTokenExpired) || errors.Is(err, ErrTokenReused)
}

// lookupDone is a tokened write's first step, under its leaf's exclusive
// lock (n): its record's answer (done), or a refusal if it may not apply
// (done, with an error), or nothing (not done: evaluate the write).
func (t *Tree) lookupDone(ctx context.Context, n *Node, key []byte, tok *WriteToken, print uint64) (Result, bool, error) {
	if j := n.findDone(tok, key); j >= 0 {
		c := n.Done[j]
		if c.Print != print || c.Stamp != tok.Stamp || !bytes.Equal(c.Key, key) {
			return Result{}, true, ErrTokenReused
		}
		t.Stats.Repeats.Add(1)
		t.cfg.tokens.Repeats.Add(1)
		return Result{Applied: c.Applied, Found: c.Found, Repeat: true}, true, nil
	}
	now := t.s.Now()
	old := now >= tok.Stamp+int64(t.cfg.tokenWindow)
	if t.unsafeDone == unsafeDoneNoAge {
		old = false
	}
	// A stamp from the future is refused only past 2·ClockSkew: a client
	// and a server each within ClockSkew of true time may be that far
	// apart (review 52: refused past one ClockSkew, a correct client was
	// refused by every node whose clock was behind its own). Safety never
	// rests on stamps (an attempt's life and its record's are both counted
	// from the stamp, on the servers' clocks); the bound only keeps a client
	// whose clock is far ahead from pinning records for long.
	future := tok.Stamp > now+2*int64(t.cfg.clockSkew)
	horizon := tok.Stamp <= n.Horizon
	floored := false
	if j := n.floorOf(tok.Client); j >= 0 && tok.Seq < n.Floors[j].Seq {
		floored = true
	}
	if future || old || horizon || floored {
		t.Stats.TokensRefused.Add(1)
		switch {
		case future:
			t.Stats.RefusedFuture.Add(1)
			t.cfg.tokens.RefusedFuture.Add(1)
		case old:
			t.Stats.RefusedOld.Add(1)
			t.cfg.tokens.RefusedOld.Add(1)
		case floored:
			t.Stats.RefusedFloor.Add(1)
			t.cfg.tokens.RefusedFloor.Add(1)
		default:
			t.Stats.RefusedHorizon.Add(1)
			t.cfg.tokens.RefusedHorizon.Add(1)
		}
		return Result{}, true, ErrTokenExpired
	}
	return Result{}, false, nil
}

// sameTree refuses a tokened attempt meant for another tree than t
// (ErrTreeChanged, before anything is done): t was made under the name
// after that one was dropped and holds none of its records, so the attempt
// would apply afresh though an earlier one may have applied there (review
// 55). A token or a tree with no anchor is not checked (a client of a
// build from before anchors; a tree not opened through a Server). The
// Service opens the tree under the name again once before it answers so
// (its server may hold the dropped one open).
func (t *Tree) sameTree(tok *WriteToken) error {
	if tok == nil || tok.Tree.IsZero() || t.anchor.IsZero() || tok.Tree == t.anchor {
		return nil
	}
	return fmt.Errorf("%w (the token's tree %v, now %v)", ErrTreeChanged, tok.Tree, t.anchor)
}

// completion is the record of tok's write with its outcome.
func (t *Tree) completion(key []byte, tok *WriteToken, print uint64, applied, found bool) Completion {
	return Completion{Key: key, Client: tok.Client, Seq: tok.Seq, Print: print, Stamp: tok.Stamp, Applied: applied, Found: found}
}

// trimDone makes a leaf image about to be committed fit its chunk.
// Its counts go to tc, which the caller adds to the tree's Stats (count)
// once the image is committed: an image never committed (a rebalance left
// undone, a failed commit) dropped nothing.
func (t *Tree) trimDone(n *Node, tc *trims) {
	h := n.Horizon
	dropped, evicted := trimDone(n, t.cfg.NodeSize, t.s.Now(), t.cfg.tokenWindow, t.cfg.clockSkew)
	if t.unsafeDone == unsafeDoneNoHorizon {
		n.Horizon = h
	}
	tc.dropped += dropped
	tc.evicted += evicted
}

// trims counts what images about to be committed dropped: records (and
// floors) for age, evicted for room, and records dropped below a floor.
type trims struct{ dropped, evicted, floored int }

// count adds tc to the tree's Stats: the images it counted are committed.
func (t *Tree) count(tc trims) {
	t.Stats.RecordsDropped.Add(int64(tc.dropped))
	t.Stats.RecordsEvicted.Add(int64(tc.evicted))
	t.Stats.RecordsFloored.Add(int64(tc.floored))
	t.cfg.tokens.RecordsDropped.Add(uint64(tc.dropped))
	t.cfg.tokens.RecordsEvicted.Add(uint64(tc.evicted))
	t.cfg.tokens.RecordsFloored.Add(uint64(tc.floored))
}

// TokenCounters count the events of tokened writes over every tree a
// server has open (its metrics, grove_btree_token_events_total): answers
// from records; refusals past the window, of stamps from the future, at or
// below a horizon, below a floor; records dropped for age, evicted for
// room (each eviction may turn a later resend into an unknown outcome),
// and dropped below a floor.
type TokenCounters struct {
	Repeats                                                 atomic.Uint64
	RefusedOld, RefusedFuture, RefusedHorizon, RefusedFloor atomic.Uint64
	RecordsDropped, RecordsEvicted, RecordsFloored          atomic.Uint64
}

// outcome tells the test hook of a tokened write's outcome committed.
func (t *Tree) outcome(tok *WriteToken, key []byte, applied bool) {
	if tok != nil && t.onOutcome != nil {
		t.onOutcome(*tok, key, applied)
	}
}

// keepOwn (teeth) keeps the records of got that were in had already.
func keepOwn(got, had []Completion) []Completion {
	var out []Completion
	for _, c := range got {
		for _, h := range had {
			if c.Client == h.Client && c.Seq == h.Seq {
				out = append(out, c)
				break
			}
		}
	}
	return out
}

// durable waits for a change's durability; for a tokened write's, it
// tells the test hook.
func (t *Tree) durable(ctx context.Context, lsn uint64, tok *WriteToken) error {
	err := t.s.Durable(ctx, lsn)
	if err == nil && tok != nil && t.onDurable != nil {
		t.onDurable(*tok)
	}
	return err
}
