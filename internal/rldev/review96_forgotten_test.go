package rldev

import (
	"testing"

	pb "github.com/grovestore/grove/api/grovepb"
)

// forget-node --re-place's first decree (NextEvacStep: ForgetDisks) marks
// every disk of the lost node forgotten while its RLDevs' segments are
// still there: Table.Forgotten, which the status service (398a36f) uses
// to show a dead node "forgotten, not a problem", is then already true.
// A command stopped here (interrupted, timed out, a lost answer) leaves
// the RLDev on one copy with nothing re-placed, and grove health exits 0.
func TestReview96ForgottenBeforeEvacuated(t *testing.T) {
	h, id, s, _, cands := lostSecondary(t)
	tb := h.table()
	st, err := tb.NextEvacStep(uint64(s.id), cands)
	if err != nil || st.ID != 0 || st.Final {
		t.Fatalf("first step: %+v %v", st, err)
	}
	if err := h.propose(&pb.Decree{Namespace: Namespace, ExpectedVersion: tb.Version, Ops: st.Ops}); err != nil {
		t.Fatal(err)
	}
	h.run()
	tb = h.table()
	if seg := tb.RLDevs[id].SegmentOf(uint64(s.id)); seg >= 0 && tb.Forgotten(uint64(s.id)) {
		t.Fatalf("node %d still holds rldev %d's %s (nothing re-placed yet), yet Forgotten says it was forgotten: status shows it \"forgotten\", not a problem",
			s.id, id, tb.RLDevs[id].SegmentName(seg))
	}
}
