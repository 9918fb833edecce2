package rldev

// pageLog is a region bitmap kept durable in an A/B page pair of a
// segment: the dirty-region log and the degraded-mode log. One write is in
// flight at a time; marks made meanwhile wait for the next write, which
// carries them all. Not safe for concurrent use.
type pageLog struct {
	r       *replica
	kind    uint16
	durable Bitmap // on disk
	seq     uint64 // sequence number of the durable copy
	set     Bitmap // to set in the next write
	clear   Bitmap // to clear in the next write
	writing *Bitmap
	cur     []func(error) []any // waiting for the write in flight
	next    []func(error) []any // waiting for the next write
}

func newPageLog(r *replica, kind uint16, b Bitmap, seq uint64) *pageLog {
	return &pageLog{r: r, kind: kind, durable: b, seq: seq,
		set: NewBitmap(b.RegionBlocks, b.Regions()*b.RegionBlocks), clear: NewBitmap(b.RegionBlocks, b.Regions()*b.RegionBlocks)}
}

// has reports whether region x is durable and stays so through the write
// in flight.
func (l *pageLog) has(x uint64) bool {
	return l.durable.Has(x) && (l.writing == nil || l.writing.Has(x)) && !l.clear.Has(x)
}

// mark makes regions [first, last] durable in the log, then runs then
// (at once if they already are; once the write in flight lands if it
// carries every one that is not).
func (l *pageLog) mark(first, last uint64, then func(error) []any) []any {
	need, inFlight := false, false
	for x := first; x <= last; x++ {
		if l.has(x) {
			continue
		}
		l.clear.Clear(x) // it stays marked, whatever the next write was to do
		if l.writing == nil && l.durable.Has(x) {
			continue // only its clearing was to come: cancelled
		}
		if l.writing != nil && l.writing.Has(x) {
			inFlight = true // durable once the write in flight lands
			continue
		}
		l.set.Set(x)
		need = true
	}
	switch {
	case need:
		l.next = append(l.next, then)
		return l.flush()
	case inFlight:
		l.cur = append(l.cur, then)
		return nil
	}
	return then(nil)
}

// markAhead adds region x to the next write, which no one waits for (a
// region marked that is not written only costs a copy after a crash, and
// is cleared lazily), unless it is marked or being marked already.
func (l *pageLog) markAhead(x uint64) {
	if x >= l.durable.Regions() || l.has(x) || l.set.Has(x) || l.writing != nil && l.writing.Has(x) && !l.clear.Has(x) {
		return
	}
	l.set.Set(x)
	l.clear.Clear(x)
	l.r.e.stats.DRLAhead++
}

// unmark clears regions in the next write (no one waits for it: a region
// left marked only costs a copy after a crash).
func (l *pageLog) unmark(x uint64) {
	if l.durable.Has(x) || l.set.Has(x) {
		l.clear.Set(x)
		l.set.Clear(x)
	}
}

// pending reports whether a write is due.
func (l *pageLog) pending() bool { return !l.set.Empty() || !l.clear.Empty() || len(l.next) > 0 }

// flush writes the log if something changed and no write is in flight.
func (l *pageLog) flush() []any {
	if l.writing != nil || !l.pending() || l.r.state == repFailed || l.r.state == repRetired {
		return nil
	}
	nb := l.durable.Clone()
	for i := range nb.Bits {
		nb.Bits[i] = (nb.Bits[i] | l.set.Bits[i]) &^ l.clear.Bits[i]
	}
	clear(l.set.Bits)
	clear(l.clear.Bits)
	l.writing = &nb
	l.cur, l.next = l.next, nil
	seq := l.seq + 1
	page, err := EncodePage(l.kind, seq, encodeBitmap(nb), PageSize)
	if err != nil {
		panic(err) // sized at creation: a bitmap always fits its page
	}
	off, _ := pageSlot(l.kind, seq%2)
	r := l.r
	if l.kind == PageDRL {
		r.e.stats.DRLWrites++
	} else {
		r.e.stats.DegradedWrites++
	}
	return r.writeDurable(r.base+off, page, func(err error) []any {
		waiters := l.cur
		l.cur = nil
		l.writing = nil
		if err == nil {
			l.durable, l.seq = nb, seq
		}
		var out []any
		if err != nil {
			out = append(out, r.fail(err)...)
		}
		for _, fn := range waiters {
			out = append(out, fn(err)...)
		}
		return append(out, l.flush()...)
	})
}
