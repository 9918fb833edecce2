package rldev

// rangeLocks orders operations on overlapping block ranges of one replica:
// writes (and copies and repairs) take ranges exclusively, reads share
// them. Grants are FIFO among overlapping requests, so that a stream of
// reads cannot starve a write. Not safe for concurrent use (the engine is
// single-threaded).
type rangeLocks struct {
	held    []*rangeLock
	waiting []*rangeLock
}

type rangeLock struct {
	first, end uint64 // blocks [first, end)
	excl       bool
	granted    func(*rangeLock) []any // run when granted (it may emit effects)
	done       bool
}

func (a *rangeLock) overlaps(b *rangeLock) bool  { return a.first < b.end && b.first < a.end }
func (a *rangeLock) conflicts(b *rangeLock) bool { return a.overlaps(b) && (a.excl || b.excl) }

// acquire asks for blocks [first, first+n); granted runs, with the
// handle that releases it, when the range is held (at once, inside
// acquire, if it is free). The returned handle is the same: release it to
// give up a request still waiting.
func (l *rangeLocks) acquire(first, n uint64, excl bool, granted func(*rangeLock) []any) (*rangeLock, []any) {
	r := &rangeLock{first: first, end: first + n, excl: excl, granted: granted}
	if l.free(r, len(l.waiting)) {
		l.held = append(l.held, r)
		return r, granted(r)
	}
	l.waiting = append(l.waiting, r)
	return r, nil
}

// idle: no range is held or awaited.
func (l *rangeLocks) idle() bool { return len(l.held) == 0 && len(l.waiting) == 0 }

// free reports whether r conflicts with no held lock and no earlier waiter
// (the first upto waiters).
func (l *rangeLocks) free(r *rangeLock, upto int) bool {
	for _, h := range l.held {
		if h.conflicts(r) {
			return false
		}
	}
	for _, w := range l.waiting[:upto] {
		if w.overlaps(r) {
			return false // FIFO: an earlier overlapping waiter goes first
		}
	}
	return true
}

// release gives r up and grants the waiters it was holding back.
func (l *rangeLocks) release(r *rangeLock) []any {
	if r == nil || r.done {
		return nil
	}
	r.done = true
	for i, h := range l.held {
		if h == r {
			l.held = append(l.held[:i], l.held[i+1:]...)
			break
		}
	}
	for i, w := range l.waiting {
		if w == r { // released while still waiting (cancelled)
			l.waiting = append(l.waiting[:i], l.waiting[i+1:]...)
			break
		}
	}
	// Grant first, then run the continuations: one of them may release or
	// acquire in turn, and must find the lists consistent.
	var grant []*rangeLock
	for i := 0; i < len(l.waiting); {
		w := l.waiting[i]
		if l.free(w, i) {
			l.waiting = append(l.waiting[:i], l.waiting[i+1:]...)
			l.held = append(l.held, w)
			grant = append(grant, w)
			continue
		}
		i++
	}
	var out []any
	for _, w := range grant {
		if !w.done {
			out = append(out, w.granted(w)...)
		}
	}
	return out
}

// busy reports whether any lock is held or waited for on [first, end).
func (l *rangeLocks) busy(first, end uint64) bool {
	probe := &rangeLock{first: first, end: end}
	for _, h := range l.held {
		if h.overlaps(probe) {
			return true
		}
	}
	for _, w := range l.waiting {
		if w.overlaps(probe) {
			return true
		}
	}
	return false
}
