package treecall

import "sync"

// Pending numbers a client's tokened writes and keeps those whose call has
// not ended. The least of them is the floor each attempt carries (RIFL's
// acknowledgement of answers): every write numbered below has its answer,
// or its call gave up (its outcome unknown), and is never sent again, so a
// node may drop their completion records and refuse a stale attempt of
// one (internal/btree/completion.go, "Floors"). A write's own number is
// open while it is sent, so no floor its client sends is above it. Safe
// for concurrent use; the zero value is ready.
type Pending struct {
	mu   sync.Mutex
	last uint64 // the last number given
	open map[uint64]struct{}
	min  uint64 // the least open number, 0 if none
}

// Begin numbers a new write, open until End.
func (p *Pending) Begin() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.open == nil {
		p.open = make(map[uint64]struct{})
	}
	p.last++
	p.open[p.last] = struct{}{}
	if p.min == 0 {
		p.min = p.last
	}
	return p.last
}

// End closes seq: its call ended (answered, given up, or its token replaced
// after an attempt that did nothing), and it is never sent again.
func (p *Pending) End(seq uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.open, seq)
	if seq != p.min {
		return
	}
	p.min = 0
	for s := range p.open {
		if p.min == 0 || s < p.min {
			p.min = s
		}
	}
}

// Floor is the least open number (the last given plus one if none).
func (p *Pending) Floor() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.min == 0 {
		return p.last + 1
	}
	return p.min
}
