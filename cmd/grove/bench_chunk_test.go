package main

import (
	"encoding/json"
	"testing"
)

// TestBenchChunkSmoke runs `grove bench chunk` briefly and checks that it
// reports figures: the benchmark is kept working; README quotes a full run.
func TestBenchChunkSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("a cluster in the benchmark's process")
	}
	bin := buildGrove(t)
	r := grove(t, bin, nil, "bench", "chunk", "--batches", "1,10", "--ops", "40", "--rounds", "1", "-o", "json")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	var out struct {
		Table2 []struct {
			Batch   int     `json:"batch"`
			GroveMs float64 `json:"grove_ms"`
		} `json:"table2"`
		FreeMs   float64 `json:"free_ms"`
		DataPath []struct {
			Op    string  `json:"op"`
			Ratio float64 `json:"ratio"`
		} `json:"data_path"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
		t.Fatalf("%v\n%s", err, r.stdout)
	}
	if len(out.Table2) != 2 || out.Table2[0].Batch != 1 || out.Table2[1].GroveMs <= 0 || out.FreeMs <= 0 || len(out.DataPath) != 2 || out.DataPath[1].Ratio <= 0 {
		t.Fatalf("figures missing:\n%s", r.stdout)
	}
}
