package faults

import (
	"os"
	"path/filepath"
	"testing"
)

// TestNodeEventsHoldEnd: the lock service's "remote hold ended" line is
// read with its lock (quoted or not) and token; other lines keep their
// kinds.
func TestNodeEventsHoldEnd(t *testing.T) {
	log := `time=2026-11-27T04:52:19.801Z level=INFO msg="remote hold ended: its caller's stream ended" node=1 layer=lock incarnation=4 lock=loss-30pct-20s-7 token=3.12 clerk=1.4.1
time=2026-11-27T04:52:19.802Z level=INFO msg="remote hold ended: its caller's stream ended" node=1 layer=lock incarnation=4 lock="a \"b\" c" token=3.13 clerk=1.4.1
time=2026-11-27T04:52:20.001Z level=WARN msg="self-fence: no acknowledgement from a majority of observers within the grace period" node=1 layer=fd incarnation=4
time=2026-11-27T04:52:20.002Z level=INFO msg="recovery done" node=1 layer=lock clerk=1.4.2 dead=1.3.2 token=3.19
`
	path := filepath.Join(t.TempDir(), "grove.log")
	if err := os.WriteFile(path, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	evs, err := (&Node{ID: 1, Log: path}).Events()
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 3 {
		t.Fatalf("%d events, want 3: %+v", len(evs), evs)
	}
	if e := evs[0]; e.Kind != "hold-end" || e.Lock != "loss-30pct-20s-7" || e.Token != "3.12" || e.Node != 1 {
		t.Fatalf("first: %+v", e)
	}
	if e := evs[1]; e.Kind != "hold-end" || e.Lock != `a "b" c` || e.Token != "3.13" {
		t.Fatalf("second: %+v", e)
	}
	if e := evs[2]; e.Kind != "fence" || e.Inc != 4 || e.Lock != "" {
		t.Fatalf("third: %+v", e)
	}
}
