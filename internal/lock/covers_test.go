package lock

import "testing"

// TestCovers pins what a recovery run may touch (outside review 16): the
// names of a names run; for an "all" run, every name it does not exclude.
// Recovery (the recovery function's) and Recover (the master's message)
// agree.
func TestCovers(t *testing.T) {
	const fence, log = "btree/fence/1", "txn/btree-1"
	for i, c := range []struct {
		all            bool
		names, exclude []string
		want           bool
	}{
		{false, []string{fence, log}, nil, true},
		{false, []string{fence}, nil, false}, // died between its fence lock and its log's
		{false, nil, nil, false},
		{true, nil, nil, true},
		{true, nil, []string{fence}, true},
		{true, nil, []string{log}, false},
		{true, []string{log}, []string{log}, false}, // an "all" run's names say nothing
	} {
		r := Recovery{All: c.all, Names: c.names, Exclude: c.exclude}
		q := Recover{All: c.all, Names: c.names, Exclude: c.exclude}
		if got := r.Covers(log); got != c.want {
			t.Errorf("case %d: Recovery.Covers = %v, want %v", i, got, c.want)
		}
		if got := q.Covers(log); got != c.want {
			t.Errorf("case %d: Recover.Covers = %v, want %v", i, got, c.want)
		}
	}
}
