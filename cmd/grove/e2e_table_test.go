package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/ddstable"
)

// TableStatJSON is `grove table stat -o json`.
type TableStatJSON struct {
	Table    string `json:"table"`
	Epoch    uint64 `json:"epoch"`
	Replicas []struct {
		Partition string  `json:"partition"`
		Group     string  `json:"group"`
		Brick     string  `json:"brick"`
		Keys      *uint64 `json:"keys"`
		InDoubt   *uint64 `json:"in_doubt"`
		Note      string  `json:"note"`
	} `json:"replicas"`
}

// TestEndToEndTableSIGKILL, through the CLI and the Go library on `grove up
// --processes` (three nodes): a table of four partitions, three replicas
// each; clear errors for bad keys, names and unknown tables; two libraries
// write keys while node 3 is SIGKILLed under them: writes go on once the
// failure detector declares it and its brick leaves every group; every
// acknowledged write reads back, through the CLI, from each survivor. Node
// 3 restarts (a new incarnation, its replicas having died with it) and
// recovers into every group by copying whole partitions; then node 1 is
// SIGKILLed too, and every key still reads back, from nodes 2 and 3.
func TestEndToEndTableSIGKILL(t *testing.T) {
	t.Parallel() // its own ports and directories: see parallelTests
	bin, u, ctx := startCluster(t, 11000)
	keepLogsOnFailure(t, u, "table")
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
	exits := func(code int, args ...string) {
		t.Helper()
		if r := run(args...); r.code != code {
			t.Fatalf("grove %s: exit %d (want %d): %s", strings.Join(args, " "), r.code, code, r.stderr)
		}
	}
	stat := func() TableStatJSON {
		t.Helper()
		var s TableStatJSON
		r := must(run("table", "stat", "users", "-o", "json"))
		if err := json.Unmarshal([]byte(r.stdout), &s); err != nil {
			t.Fatalf("table stat -o json: %v\n%s", err, r.stdout)
		}
		return s
	}

	must(run("table", "create", "users", "--partitions", "4", "--replicas", "3"))
	exits(1, "table", "create", "users")
	exits(2, "table", "create", "bad name!")
	exits(1, "table", "create", "wide", "--replicas", "4")
	exits(2, "table", "create", "odd", "--partitions", "3")
	exits(2, "table", "put", "users", "not-a-key", "v")
	exits(2, "table", "get", "users", "-1")
	exits(5, "table", "get", "nosuch", "1")
	exits(5, "table", "put", "nosuch", "1", "v")
	exits(5, "table", "get", "users", "12345")
	must(run("table", "put", "users", "7", "seven"))
	must(run("table", "put", "users", "0x10", "sixteen"))
	if r := must(run("table", "get", "users", "16")); r.stdout != "sixteen\n" {
		t.Fatalf("get 16: %q", r.stdout)
	}
	must(run("table", "del", "users", "16"))
	exits(5, "table", "get", "users", "16")
	must(run("table", "del", "users", "16")) // absent: still succeeds
	if r := must(run("table", "list", "-o", "json")); !strings.Contains(r.stdout, `"users"`) {
		t.Fatalf("table list: %s", r.stdout)
	}
	s := stat()
	if len(s.Replicas) != 12 {
		t.Fatalf("stat: %d replicas, want 12: %+v", len(s.Replicas), s)
	}

	mc := upMeta(t, ctx, u)
	var mu sync.Mutex
	want := map[uint64][]byte{7: []byte("seven")}
	maybe := map[uint64][][]byte{} // writes whose outcome is unknown: any of these, or what was before
	stop := make(chan struct{})
	var stopOnce sync.Once
	halt := func() { stopOnce.Do(func() { close(stop) }) }
	var wg sync.WaitGroup
	defer func() { halt(); wg.Wait() }()
	writes := make([]int, 2)
	for w := range 2 {
		lib := ddstable.NewLibrary(ddstable.LibraryConfig{Meta: mc})
		defer lib.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Bounded in count and time: 600 writes, one at a time.
			for i := range 600 {
				select {
				case <-stop:
					return
				default:
				}
				k := uint64(1000 + w*1000 + i%300)
				v := []byte(fmt.Sprintf("w%d-%d", w, i))
				cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				err := lib.Put(cctx, "users", k, v)
				cancel()
				mu.Lock()
				switch {
				case err == nil:
					want[k] = v
					delete(maybe, k)
					writes[w]++
				case errors.Is(err, ddstable.ErrOutcomeUnknown):
					maybe[k] = append(maybe[k], v)
				default:
					mu.Unlock()
					t.Errorf("writer %d: put %d: %v", w, k, err)
					halt()
					return
				}
				mu.Unlock()
				time.Sleep(2 * time.Millisecond)
			}
		}()
	}
	// SIGKILL node 3 once the writers are well under way.
	for {
		mu.Lock()
		n := writes[0] + writes[1]
		mu.Unlock()
		if n >= 200 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	// A split under the writers' load (DDS §4.3: the replicas settle
	// under a lease, then split their data in place), and bad requests.
	exits(2, "table", "split", "users", "0x1")
	exits(5, "table", "split", "users", "111")
	exits(5, "table", "merge", "users", "111")
	exits(5, "table", "split", "nosuch", "01")
	start := time.Now()
	if r := must(run("table", "split", "users", "01")); !strings.Contains(r.stdout, "01 split into 001 and 101") {
		t.Fatalf("split: %q", r.stdout)
	}
	t.Logf("partition 01 split under load in %v", time.Since(start).Round(time.Millisecond))
	exits(1, "table", "merge", "users", "0") // 00 and 10: groups in another order (1,2,3 and 2,3,1)
	if err := u.Kill(3); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	wg.Wait()
	if t.Failed() {
		return
	}
	t.Logf("writers: %d and %d acknowledged, %d keys uncertain; the last ended %v after the SIGKILL", writes[0], writes[1], len(maybe), time.Since(killed).Round(time.Millisecond))

	// Node 3 is out of every group; each survivor holds every key.
	s = stat()
	for _, r := range s.Replicas {
		if strings.HasPrefix(r.Brick, "3.") || strings.Contains(r.Group, "3.") {
			t.Fatalf("node 3 still listed: %+v", r)
		}
		if r.InDoubt == nil || *r.InDoubt != 0 {
			t.Fatalf("replica %+v: in doubt, or no answer", r)
		}
	}
	// check reads every key back through a library of its own, and one in
	// ten through the CLI too; the stat's key counts must agree across each
	// partition's replicas.
	reader := ddstable.NewLibrary(ddstable.LibraryConfig{Meta: mc})
	defer reader.Close()
	check := func(what string) {
		t.Helper()
		mu.Lock()
		defer mu.Unlock()
		get := func(k uint64) ([]byte, bool) {
			if k%10 == 7 {
				r := run("table", "get", "users", strconv.FormatUint(k, 10), "--raw")
				if r.code != 0 && r.code != 5 {
					t.Fatalf("%s: get %d: exit %d: %s", what, k, r.code, r.stderr)
				}
				return []byte(r.stdout), r.code == 0
			}
			v, found, err := reader.Get(ctx, "users", k)
			if err != nil {
				t.Fatalf("%s: get %d: %v", what, k, err)
			}
			return v, found
		}
		for k, v := range want {
			if _, unsure := maybe[k]; unsure {
				continue
			}
			if got, found := get(k); !found || !bytes.Equal(got, v) {
				t.Fatalf("%s: key %d: %q (found %v), want %q", what, k, got, found, v)
			}
		}
		for k, vs := range maybe {
			got, found := get(k)
			ok := found && bytes.Equal(got, want[k])
			for _, v := range vs {
				ok = ok || (found && bytes.Equal(got, v))
			}
			if !ok {
				t.Fatalf("%s: key %d (outcome unknown): %q (found %v)", what, k, got, found)
			}
		}
		keys := map[string]uint64{}
		for _, r := range stat().Replicas {
			if r.Keys == nil {
				t.Fatalf("%s: replica %+v did not answer", what, r)
			}
			if n, ok := keys[r.Partition]; ok && n != *r.Keys {
				t.Fatalf("%s: partition %s: replicas hold %d and %d keys", what, r.Partition, n, *r.Keys)
			}
			keys[r.Partition] = *r.Keys
		}
	}
	check("after node 3's SIGKILL")

	// Node 3 comes back: a new incarnation, which recovers into every
	// group (DDS §4.3: write lease, whole-partition copy, join).
	if err := u.Restart(3); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()
	for {
		s = stat()
		full := len(s.Replicas) == 15 // 5 partitions since the split
		for _, r := range s.Replicas {
			full = full && strings.Count(r.Group, ",") == 2 && r.Keys != nil
		}
		if full {
			break
		}
		if time.Since(restarted) > 90*time.Second {
			t.Fatalf("the groups did not get their third replica back: %+v", s.Replicas)
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("node 3 recovered into every group %v after its restart", time.Since(restarted).Round(time.Millisecond))
	check("after node 3 recovered")
	// Merged back, with node 3's recovered replicas among the merged.
	if r := must(run("table", "merge", "users", "01")); !strings.Contains(r.stdout, "001 and 101 merged into 01") {
		t.Fatalf("merge: %q", r.stdout)
	}
	check("after the merge")

	// Node 1 is SIGKILLed: every partition is left with nodes 2 and 3, and
	// node 3's replicas are the recovered ones.
	if err := u.Kill(1); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	must(run("table", "put", "users", "7", "seven again"))
	t.Logf("the first write after node 1's SIGKILL took %v", time.Since(start).Round(time.Millisecond))
	mu.Lock()
	want[7] = []byte("seven again")
	mu.Unlock()
	check("after node 1's SIGKILL, from nodes 2 and 3")
	s = stat()
	for _, r := range s.Replicas {
		if strings.Contains(r.Group, "1.") || strings.Count(r.Group, ",") != 1 {
			t.Fatalf("after node 1's SIGKILL: %+v", r)
		}
	}
}
