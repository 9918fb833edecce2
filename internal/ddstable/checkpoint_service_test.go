package ddstable_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/bench"
	"github.com/grovestore/grove/internal/ddstable"
)

// A checkpoint, then the loss of every replica (all three nodes crash at
// once and restart: new incarnations, empty bricks), then a restore:
// every partition comes back from the checkpoint, as of the checkpoint
// (later writes are lost, as in DDS), and recovery brings every group
// back to three replicas.
func TestServiceTableCheckpointRestore(t *testing.T) {
	ctx, c, mc := startTables(t, 3*time.Minute)
	if _, err := ddstable.CreateTable(ctx, mc, "t", 4, 3); err != nil {
		t.Fatal(err)
	}
	lib := ddstable.NewLibrary(ddstable.LibraryConfig{Meta: mc})
	defer lib.Close()
	put := func(from, to uint64, round int) {
		t.Helper()
		for k := from; k < to; k++ {
			if err := lib.Put(ctx, "t", k, []byte(fmt.Sprintf("%d/%d", k, round))); err != nil {
				t.Fatalf("put %d: %v", k, err)
			}
		}
	}
	if _, err := ddstable.RestoreTable(ctx, mc, "t"); !errors.Is(err, ddstable.ErrNoCheckpoint) {
		t.Fatalf("a restore without a checkpoint: %v", err)
	}
	put(0, 200, 0)
	// A writer runs through the checkpoint: its writes wait, then go on.
	errs := make(chan error, 1)
	go func() {
		for k := uint64(200); k < 300; k++ {
			if err := lib.Put(ctx, "t", k, []byte(fmt.Sprintf("%d/0", k))); err != nil {
				errs <- err
				return
			}
		}
		errs <- nil
	}()
	start := time.Now()
	m, err := ddstable.RequestCheckpoint(ctx, mc, "t")
	if err != nil {
		t.Fatal(err)
	}
	id := m.Freeze.ID
	if _, err := ddstable.RequestCheckpoint(ctx, mc, "t"); !errors.Is(err, ddstable.ErrCheckpointing) {
		t.Fatalf("a second checkpoint during the first: %v", err)
	}
	for {
		ts, err := ddstable.ListTables(ctx, mc)
		if err == nil && ts[0].Checkpoint.ID == id {
			break
		}
		if err == nil && ts[0].Freeze.ID != id {
			t.Fatalf("checkpoint %d given up: %+v", id, ts[0].Freeze)
		}
		if !bench.SleepCtx(ctx, 50*time.Millisecond) {
			t.Fatal("the checkpoint never completed")
		}
	}
	t.Logf("checkpoint %d done in %v", id, time.Since(start).Round(time.Millisecond))
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	// The writer's keys landed before or after the freeze: only those
	// before are in the checkpoint. Keys 0-199 are.
	want := map[uint64]string{}
	for k := uint64(0); k < 200; k++ {
		want[k] = fmt.Sprintf("%d/0", k)
	}
	// Partitions with live members are not restored.
	res, err := ddstable.RestoreTable(ctx, mc, "t")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if !errors.Is(r.Err, ddstable.ErrLive) {
			t.Fatalf("a restore of a live partition: %+v", r)
		}
	}
	put(0, 50, 1) // after the checkpoint: lost with every replica

	down := time.Now()
	for i := range 3 {
		c.Crash(i)
	}
	for i := range 3 {
		if err := c.Start(i); err != nil {
			t.Fatal(err)
		}
	}
	waitRegistered(t, ctx, mc, 3)
	t.Logf("the nodes were back %v after the crash", time.Since(down).Round(time.Millisecond))
	start = time.Now()
	for {
		res, err = ddstable.RestoreTable(ctx, mc, "t")
		restored := 0
		for _, r := range res {
			if r.Err == nil {
				restored++
			}
		}
		if err == nil && restored == len(res) {
			break
		}
		// Until the failure detector declares the old incarnations dead.
		if !bench.SleepCtx(ctx, 500*time.Millisecond) {
			t.Fatalf("never restored: %v %+v", err, res)
		}
	}
	t.Logf("every partition restored %v after the restart: %+v", time.Since(start).Round(time.Millisecond), res)
	for k, v := range want {
		got, found, err := lib.Get(ctx, "t", k)
		if err != nil || !found || string(got) != v {
			t.Fatalf("get %d after the restore: %q %v %v, want %q", k, got, found, err, v)
		}
	}
	// Recovery refills the groups; writes go on.
	start = time.Now()
	for {
		ts, err := ddstable.ListTables(ctx, mc)
		full := err == nil
		for _, g := range ts[0].RG {
			full = full && len(g) == 3
		}
		if full && len(ts[0].Joining) == 0 {
			break
		}
		if !bench.SleepCtx(ctx, 200*time.Millisecond) {
			t.Fatal("the groups never got three replicas back")
		}
	}
	t.Logf("every group has three replicas again %v after the restore", time.Since(start).Round(time.Millisecond))
	put(0, 10, 2)
}
