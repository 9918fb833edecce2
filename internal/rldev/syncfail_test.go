package rldev

import (
	"errors"
	"testing"
)

// TestSyncFailureFailsWritesInFlight: a sync of a disk fails. The writes
// it covered fail, and so do the writes in flight meanwhile, though the
// next sync, which covers them, succeeds: their pages may have been in
// the failed writeback, and Linux reports a writeback error once (to the
// failed fdatasync), having marked the pages clean. A write issued after
// the failure is acknowledged by the next sync.
func TestSyncFailureFailsWritesInFlight(t *testing.T) {
	e := NewEngine(Config{Node: 1, Inc: 1, Disks: []LocalDisk{{Index: 0, Size: 1 << 20}}})
	env := Env{}
	outcome := map[string]error{}
	done := map[string]bool{}
	write := func(name string, off int64) OpID {
		out := e.writeDurable(0, off, make([]byte, BlockSize), func(err error) []any {
			outcome[name], done[name] = err, true
			return nil
		})
		return out[0].(DiskWrite).Op
	}
	syncOf := func(out []any) OpID {
		t.Helper()
		for _, o := range out {
			if s, ok := o.(DiskSync); ok {
				return s.Op
			}
		}
		t.Fatalf("no sync started: %v", out)
		return 0
	}
	// a's write lands; its sync starts.
	s1 := syncOf(e.DiskDone(env, write("a", 0), nil, nil))
	// b is written while s1 runs (its write returns during the sync);
	// c is issued during s1 and returns only after s1 failed.
	if out := e.DiskDone(env, write("b", 1<<16), nil, nil); len(out) != 0 {
		t.Fatalf("a second sync started beside the first: %v", out)
	}
	c := write("c", 2<<16)
	s2 := syncOf(e.DiskDone(env, s1, nil, errors.New("EIO (injected)")))
	if !done["a"] || outcome["a"] == nil {
		t.Fatalf("a's sync failed, a: done %v, %v", done["a"], outcome["a"])
	}
	if out := e.DiskDone(env, c, nil, nil); len(out) != 0 {
		t.Fatalf("a sync started beside s2: %v", out)
	}
	// d is issued after the failure, and returns while s2 runs.
	if out := e.DiskDone(env, write("d", 3<<16), nil, nil); len(out) != 0 {
		t.Fatalf("a sync started beside s2: %v", out)
	}
	s3 := syncOf(e.DiskDone(env, s2, nil, nil)) // s2 covered b; s3 covers c and d
	e.DiskDone(env, s3, nil, nil)
	for _, name := range []string{"b", "c"} {
		if !done[name] || outcome[name] == nil {
			t.Errorf("%s, in flight while a sync failed, acknowledged as durable by the next sync (done %v)", name, done[name])
		}
	}
	if !done["d"] || outcome["d"] != nil {
		t.Errorf("d, issued after the failure: done %v, %v", done["d"], outcome["d"])
	}
}
