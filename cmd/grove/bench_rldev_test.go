package main

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestBenchRLDevSmoke runs `grove bench rldev` briefly (IOPS next to fio
// on both data paths, and a resync) and checks that it reports figures:
// the benchmark is kept working; README quotes a full run.
func TestBenchRLDevSmoke(t *testing.T) {
	t.Parallel() // its own ports and directories: see parallelTests
	if testing.Short() {
		t.Skip("real processes")
	}
	if _, err := exec.LookPath("fio"); err != nil {
		t.Skip("fio is not installed (scripts/test.sh installs it as root)")
	}
	bin := buildGrove(t)
	claimPorts(t, 9500)
	// Two fills and 64 short cells: 58 s alone on this 2-core machine with
	// the default 512 MiB fills, past 90 s beside the rest of the suite on
	// a slow-disk day (CI, 2026-12-01); hence 64 MiB here. Cells of 200 ms:
	// a figure above zero is all this test reads, and a 100 ms cell (24 s
	// alone, where 300 ms took 35 s) once completed no read at all beside
	// the suite (CI, 2026-12-03: "read qd 8: grove 0 ops/s").
	r := groveWithin(t, 4*time.Minute, bin, nil, "bench", "rldev", "--parts", "iops,resync", "--cell", "200ms", "--iops-size", "64MiB", "--resync-size", "32MiB", "--base-port", "9500", "-o", "json")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	var out struct {
		IOPS []struct {
			Path      string  `json:"path"`
			Op        string  `json:"op"`
			QD        int     `json:"qd"`
			GroveOpsS float64 `json:"grove_ops_s"`
			FioOpsS   float64 `json:"fio_ops_s"`
			FioPair   any     `json:"fio_pair_ops_s"`  // writes: fio's two copies; reads: "-"
			BarePair  any     `json:"bare_pair_ops_s"` // writes: the bare two-copy writes; reads: "-"
		} `json:"iops"`
		Resync []struct {
			CopyMBs float64 `json:"copy_mb_s"`
		} `json:"resync"`
		Hop float64 `json:"loopback-1mib-p50-us"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
		t.Fatalf("%v\n%s", err, r.stdout)
	}
	if len(out.IOPS) != 16 || len(out.Resync) != 1 || out.IOPS[0].Path != "tcp" || out.IOPS[8].Path != "grpc" {
		t.Fatalf("%d iops rows, %d resync rows:\n%s", len(out.IOPS), len(out.Resync), r.stdout)
	}
	for _, x := range out.IOPS {
		if x.GroveOpsS <= 0 || x.FioOpsS <= 0 {
			t.Fatalf("%s qd %d: grove %v ops/s, fio %v", x.Op, x.QD, x.GroveOpsS, x.FioOpsS)
		}
		pair, isNum := x.FioPair.(float64)
		if strings.Contains(x.Op, "write") != isNum || isNum && pair <= 0 {
			t.Fatalf("%s qd %d: fio's two copies %v", x.Op, x.QD, x.FioPair)
		}
		bare, isNum := x.BarePair.(float64)
		if strings.Contains(x.Op, "write") != isNum || isNum && bare <= 0 {
			t.Fatalf("%s qd %d: the bare two-copy writes %v", x.Op, x.QD, x.BarePair)
		}
	}
	if out.Hop <= 0 {
		t.Fatalf("loopback: %v µs\n%s", out.Hop, r.stdout)
	}
	if out.Resync[0].CopyMBs <= 0 {
		t.Fatalf("resync: %v MB/s", out.Resync[0].CopyMBs)
	}
}
