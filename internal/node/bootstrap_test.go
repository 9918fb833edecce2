package node

import (
	"strings"
	"testing"
)

// TestVouched: a member without state joins a cluster that has run only if
// every other member of the configuration answers, has raft state, keeps a
// record, and has not counted it; a member that counted it, or one that
// cannot vouch, is final; a member that did not answer, or has no state
// yet, is asked again.
func TestVouched(t *testing.T) {
	ran := func(id uint64, counted bool) probeAnswer {
		return probeAnswer{id: id, answered: true, commit: 5, state: true, known: true, countedMe: counted, config: []uint64{1, 2, 3}}
	}
	for _, tc := range []struct {
		name    string
		answers []probeAnswer
		mode    startMode
		final   bool
		why     string
	}{
		{"all vouch", []probeAnswer{ran(1, false), ran(3, false)}, startJoinNew, true, ""},
		{"one counted it", []probeAnswer{ran(1, true), ran(3, false)}, startReplacement, true, "member 1 counted"},
		{"one cannot vouch", []probeAnswer{ran(1, false), func() probeAnswer { a := ran(3, false); a.known = false; return a }()}, startReplacement, true, "member 3 keeps no record"},
		{"one silent", []probeAnswer{ran(1, false), {id: 3}}, startReplacement, false, "member 3 did not answer"},
		{"counted beats silent", []probeAnswer{{id: 1}, ran(3, true)}, startReplacement, true, "member 3 counted"},
		{"not listed", []probeAnswer{func() probeAnswer { a := ran(1, false); a.config = []uint64{1, 3, 4}; return a }(), func() probeAnswer { a := ran(3, false); a.config = []uint64{1, 3, 4}; return a }()}, startReplacement, true, "no answering member's configuration lists"},
		// A configuration member outside the config file must answer too.
		{"member outside the file", []probeAnswer{func() probeAnswer { a := ran(1, false); a.config = []uint64{1, 2, 3, 4, 5}; return a }(), ran(3, false)}, startReplacement, false, "member 4 did not answer"},
		// A member without state answers with a record as new as it is:
		// it may have lost one that counted this member. Asked again.
		{"an empty member answers", []probeAnswer{ran(1, false), {id: 3, answered: true, known: true}}, startReplacement, false, "member 3 has no raft state yet"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := map[uint64]probeAnswer{}
			for _, a := range tc.answers {
				m[a.id] = a
			}
			mode, why, final := vouched(2, m)
			if mode != tc.mode || final != tc.final || !strings.Contains(why, tc.why) {
				t.Fatalf("vouched: mode %d final %v why %q; want %d %v %q", mode, final, why, tc.mode, tc.final, tc.why)
			}
		})
	}
}

// TestHasRun: a member that has run shows it by its commit index or, just
// after a restart (hashicorp/raft keeps no commit index on disk: it
// answers 0 until a leader is elected), by its term; a member that only
// bootstrapped (term 1, the configuration entry) or has no state has not.
func TestHasRun(t *testing.T) {
	for _, tc := range []struct {
		a    probeAnswer
		want bool
	}{
		{probeAnswer{answered: true, state: true, commit: 5, term: 2}, true},
		{probeAnswer{answered: true, state: true, commit: 0, term: 3}, true}, // restarted, no leader yet (outside review 116)
		{probeAnswer{answered: true, state: true, commit: 1, term: 1}, false},
		{probeAnswer{answered: true, state: true, commit: 0, term: 1}, false},
		{probeAnswer{answered: true}, false},
		{probeAnswer{}, false},
	} {
		if got := hasRun(tc.a); got != tc.want {
			t.Errorf("hasRun(%+v) = %v, want %v", tc.a, got, tc.want)
		}
	}
}
