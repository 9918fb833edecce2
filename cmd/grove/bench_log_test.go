package main

import (
	"encoding/json"
	"testing"
)

// TestBenchLogSmoke runs `grove bench log` briefly and checks that it
// reports figures: the benchmark is kept working; README quotes a full run.
func TestBenchLogSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("a cluster in the benchmark's process")
	}
	bin := buildGrove(t)
	r := grove(t, bin, nil, "bench", "log", "--committers", "1,8", "--for", "300ms", "--rounds", "1", "--no-fio", "-o", "json")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	var out struct {
		Commits []struct {
			Committers  int     `json:"committers"`
			CommitsPerS float64 `json:"commits_per_s"`
			PerFlush    float64 `json:"per_flush"`
		} `json:"commits"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
		t.Fatalf("%v\n%s", err, r.stdout)
	}
	if len(out.Commits) != 2 || out.Commits[1].Committers != 8 || out.Commits[0].CommitsPerS <= 0 || out.Commits[1].PerFlush < 1 {
		t.Fatalf("figures missing:\n%s", r.stdout)
	}
	if r := grove(t, bin, nil, "bench", "log", "--committers", "0"); r.code != 2 {
		t.Fatalf("--committers 0: exit %d, want 2 (usage)", r.code)
	}
}
