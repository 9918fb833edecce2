package rldev

import (
	"errors"
	"testing"
	"time"
)

// Outside review 93: the deferred replace does not look at the target's
// node. The target's node is down (crashed) when the moving secondary's
// disk fails transiently: the primary replaces the secondary's copy (which
// reloads fine a moment later) by an extent on a node that is down, and
// the RLDev stays on one copy until that node returns.
func TestReview93ReplaceOntoDownTarget(t *testing.T) {
	h, r, p, s, third := slowMoveTrio(t)
	sseg := 1 - r.Primary
	h.mustWrite(p.id, r.ID, 0, pattern(1, 1))
	h.rmStartMove(r.ID, sseg, third.id)
	h.run()
	h.tick(time.Second)
	h.crash(third, false, nil)
	h.run()
	h.exec(s, s.e.reps[r.ID].fail(errors.New("EIO (injected, transient)")))
	h.exec(s, s.e.Tick(h.env(s)))
	h.run()
	h.tick(60 * time.Second)
	rec := h.rec(r.ID)
	t.Logf("60s later, target node down: %+v move %+v", rec, rec.Move)
	if NodeID(rec.Segs[sseg].Node) == third.id && rec.State != Normal {
		t.Errorf("the secondary's copy (reloaded, owed nothing) was given up for a target on a node that is down: RLDev %v on one copy", rec.State)
	}
}
