package main

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
)

// TestBenchTableSmoke runs `grove bench table` briefly and checks that it
// reports figures: the benchmark is kept working; README quotes a full run.
func TestBenchTableSmoke(t *testing.T) {
	t.Parallel() // its own ports and directories: see parallelTests
	if testing.Short() {
		t.Skip("a cluster in the benchmark's process")
	}
	bin := buildGrove(t)
	r := grove(t, bin, nil, "bench", "table", "--outstanding", "1,4", "--duration", "500ms", "--rounds", "1", "--keys", "200", "--value-sizes", "50,4000", "--recovery-keys", "300", "-o", "json")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	var out struct {
		Cells []struct {
			System  string  `json:"system"`
			Op      string  `json:"op"`
			OpsPerS float64 `json:"ops_per_s"`
		} `json:"cells"`
		Checkpoint string `json:"checkpoint"`
		Split      string `json:"split"`
		Merge      string `json:"merge"`
		Move       string `json:"move"`
		Timeline   []struct {
			Reads int    `json:"reads"`
			Event string `json:"event"`
		} `json:"timeline"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
		t.Fatalf("%v\n%s", err, r.stdout)
	}
	want := 2*2 + 2 // 2 in-flight counts, puts and gets; 2 value sizes' gets
	_, e1 := exec.LookPath("redis-server")
	_, e2 := exec.LookPath("redis-benchmark")
	if e1 == nil && e2 == nil {
		want *= 2 // and redis's
	}
	if len(out.Cells) != want {
		t.Fatalf("%d cells, want %d:\n%s", len(out.Cells), want, r.stdout)
	}
	for _, c := range out.Cells {
		if c.OpsPerS <= 0 {
			t.Fatalf("cell %+v has no figure", c)
		}
	}
	if !strings.Contains(out.Checkpoint, "written") || out.Split == "" || out.Merge == "" || !strings.Contains(out.Move, "hand-off") {
		t.Fatalf("no checkpoint, split, merge or move figures:\n%s", r.stdout)
	}
	// DDS Figure 8: 20 seconds, reads in each, node 3's crash and its
	// brick's return.
	events, reads := "", 0
	for _, s := range out.Timeline {
		events += s.Event + ";"
		if s.Reads > 0 {
			reads++
		}
	}
	if len(out.Timeline) != 20 || reads < 15 || !strings.Contains(events, "crashed") || !strings.Contains(events, "joined the group") {
		t.Fatalf("figure 8's timeline: %d seconds, %d with reads, events %q", len(out.Timeline), reads, events)
	}
}
