package main

import (
	"encoding/json"
	"os/exec"
	"testing"
)

// TestBenchTreeSmoke runs `grove bench tree` briefly and checks that it
// reports figures: the benchmark is kept working; README quotes a full run.
func TestBenchTreeSmoke(t *testing.T) {
	t.Parallel() // its own ports and directories: see parallelTests
	if testing.Short() {
		t.Skip("a cluster in the benchmark's process")
	}
	bin := buildGrove(t)
	r := grove(t, bin, nil, "bench", "tree", "--clients", "1,2", "--ops", "30", "--rounds", "1", "--shapes", "paper", "-o", "json")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	var out struct {
		Cells []struct {
			Figure  int     `json:"figure"`
			Clients int     `json:"clients"`
			Phase   string  `json:"phase"`
			OpsPerS float64 `json:"ops_per_s"`
		} `json:"cells"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
		t.Fatalf("%v\n%s", err, r.stdout)
	}
	want := 2 * 2 * 4 // figures 6 and 7, 2 client counts, 4 phases
	if _, err := exec.LookPath("etcd"); err == nil {
		want += 2 * 4 // the etcd comparison: 2 client counts, 4 phases
	}
	if len(out.Cells) != want {
		t.Fatalf("%d cells, want %d:\n%s", len(out.Cells), want, r.stdout)
	}
	for _, c := range out.Cells {
		if c.OpsPerS <= 0 {
			t.Fatalf("cell %+v has no figure", c)
		}
	}
}
