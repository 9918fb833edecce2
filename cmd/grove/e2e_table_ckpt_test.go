package main

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// DDS checkpoints through the CLI on real processes: a table is written,
// checkpointed (grove table checkpoint), written again; every node is
// SIGKILLed at once (every replica lost: they live in memory) and
// restarted; grove table restore brings every partition back from the
// checkpoint: the checkpointed values read back, the later writes are
// gone, and recovery refills the groups.
func TestEndToEndTableCheckpointSIGKILLAll(t *testing.T) {
	t.Parallel() // its own ports and directories: see parallelTests
	bin, u, _ := startCluster(t, 11100)
	keepLogsOnFailure(t, u, "table-ckpt")
	ep := u.Gateway
	run := func(args ...string) ran {
		t.Helper()
		return grove(t, bin, nil, append(args, "--addr", ep)...)
	}
	must := func(r ran) ran {
		t.Helper()
		if r.code != 0 {
			t.Fatalf("exit %d: %s", r.code, r.stderr)
		}
		return r
	}
	must(run("table", "create", "users", "--partitions", "2", "--replicas", "3"))
	if r := run("table", "restore", "users"); r.code != 1 || !strings.Contains(r.stderr, "never been checkpointed") {
		t.Fatalf("restore without a checkpoint: exit %d: %s", r.code, r.stderr)
	}
	for k := range 20 {
		must(run("table", "put", "users", strconv.Itoa(k), fmt.Sprintf("v%d", k)))
	}
	r := must(run("table", "checkpoint", "users"))
	var id uint64
	if _, err := fmt.Sscanf(r.stdout, "table users: checkpoint %d written by every replica of its 2 partitions", &id); err != nil {
		t.Fatalf("checkpoint: %q: %v", r.stdout, err)
	}
	if r := must(run("table", "list", "-o", "json")); !strings.Contains(r.stdout, fmt.Sprintf(`"checkpoint":"%d"`, id)) {
		t.Fatalf("list: %s", r.stdout)
	}
	// Partitions with live replicas are not touched.
	if r := must(run("table", "restore", "users")); strings.Count(r.stdout, "not lost: a replica is not declared dead") != 2 {
		t.Fatalf("restore of a live table: %s", r.stdout)
	}
	must(run("table", "put", "users", "3", "after the checkpoint"))

	for id := uint64(1); id <= 3; id++ {
		if err := syscall.Kill(u.Nodes[id].PID, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	}
	for id := uint64(1); id <= 3; id++ {
		if err := u.Kill(id); err != nil && !strings.Contains(err.Error(), "no such process") {
			t.Fatal(err)
		}
	}
	killed := time.Now()
	for id := uint64(1); id <= 3; id++ {
		if err := u.Restart(id); err != nil {
			t.Fatal(err)
		}
	}
	// Until the failure detector declares the old incarnations dead (and,
	// just after the restarts, until the nodes register their new ones:
	// "not lost" meanwhile, exit 0).
	restored := map[string]bool{}
	for {
		r := run("table", "restore", "users", "-o", "json")
		if r.code == 0 || r.code == 1 {
			var out struct {
				Partitions []struct{ Partition, Result, Brick string }
			}
			if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || len(out.Partitions) != 2 {
				t.Fatalf("restore -o json: exit %d: %v: %s %s", r.code, err, r.stdout, r.stderr)
			}
			for _, p := range out.Partitions {
				if p.Result == "restored" {
					restored[p.Partition] = true // a later run says "not lost"
				}
			}
			if len(restored) == 2 && r.code == 0 {
				break
			}
		} else {
			t.Fatalf("restore: exit %d: %s", r.code, r.stderr)
		}
		if time.Since(killed) > 90*time.Second {
			t.Fatalf("never restored: exit %d: %s %s", r.code, r.stdout, r.stderr)
		}
		time.Sleep(time.Second)
	}
	t.Logf("every partition restored %v after the SIGKILLs", time.Since(killed).Round(time.Millisecond))
	for k := range 20 {
		r := must(run("table", "get", "users", strconv.Itoa(k)))
		if want := fmt.Sprintf("v%d\n", k); r.stdout != want {
			t.Fatalf("get %d: %q, want %q (the checkpoint's)", k, r.stdout, want)
		}
	}
	// Recovery gives every partition three replicas again.
	for {
		var s TableStatJSON
		r := must(run("table", "stat", "users", "-o", "json"))
		if err := json.Unmarshal([]byte(r.stdout), &s); err != nil {
			t.Fatal(err)
		}
		full := len(s.Replicas) == 6
		for _, x := range s.Replicas {
			full = full && x.Keys != nil
		}
		if full {
			break
		}
		if time.Since(killed) > 120*time.Second {
			t.Fatalf("the groups did not refill: %+v", s.Replicas)
		}
		time.Sleep(500 * time.Millisecond)
	}
	must(run("table", "put", "users", "3", "after the restore"))
	if r := must(run("table", "get", "users", "3")); r.stdout != "after the restore\n" {
		t.Fatalf("get 3: %q", r.stdout)
	}
}
