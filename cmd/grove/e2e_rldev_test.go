package main

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// RLDevListJSON is `grove rldev list -o json`.
type RLDevListJSON struct {
	RLDevs []struct {
		RLDev     uint64 `json:"rldev"`
		State     string `json:"state"`
		Primary   segJSON
		Secondary segJSON
		Note      []string `json:"note"`
	} `json:"rldevs"`
}

type segJSON struct {
	Node        uint64 `json:"node"`
	Stale       bool   `json:"stale"`
	Incarnation uint64 `json:"incarnation"`
}

// TestEndToEndRLDevSIGKILL, through the CLI on `grove up --processes`:
// write a pattern to an RLDev, SIGKILL its secondary's node, keep writing
// (degraded mode), read everything back; restart the node, wait for the
// resync; SIGKILL the other replica's node (the primary), read everything
// again from the resynced copy, and write through it.
func TestEndToEndRLDevSIGKILL(t *testing.T) {
	bin, u, ctx := startCluster(t, 9100)
	ep := u.Gateway
	run := func(stdin []byte, args ...string) ran {
		t.Helper()
		full := append(args, "--addr", ep)
		if stdin == nil {
			return grove(t, bin, nil, full...)
		}
		f := filepath.Join(t.TempDir(), "in")
		if err := os.WriteFile(f, stdin, 0o644); err != nil {
			t.Fatal(err)
		}
		return grove(t, bin, nil, append(full[:len(full):len(full)], f)...)
	}
	must := func(r ran) ran {
		t.Helper()
		if r.code != 0 {
			t.Fatalf("exit %d: %s", r.code, r.stderr)
		}
		return r
	}
	list := func() RLDevListJSON {
		t.Helper()
		r := must(run(nil, "rldev", "list", "-o", "json"))
		var l RLDevListJSON
		if err := json.Unmarshal([]byte(r.stdout), &l); err != nil {
			t.Fatalf("rldev list -o json: %v\n%s", err, r.stdout)
		}
		return l
	}
	waitState := func(id uint64, want string, pred func(segJSON, segJSON) bool) {
		t.Helper()
		for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			for _, r := range list().RLDevs {
				if r.RLDev == id && r.State == want && pred(r.Primary, r.Secondary) {
					return
				}
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				t.Fatalf("rldev %d never %s: %+v", id, want, list())
			}
		}
	}
	must(run(nil, "rldev", "create", "--size", "16MiB", "--count", "3"))
	l := list()
	if len(l.RLDevs) != 3 {
		t.Fatalf("%d RLDevs listed", len(l.RLDevs))
	}
	id := l.RLDevs[0].RLDev
	p, s := l.RLDevs[0].Primary.Node, l.RLDevs[0].Secondary.Node
	want := make([]byte, 8<<20)
	rand.Read(want)
	ids := strconv.FormatUint(id, 10)
	must(run(want[:4<<20], "rldev", "write", ids, "0"))

	// The secondary's node dies; writes go on once it is declared dead.
	if err := u.Kill(s); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	must(run(want[4<<20:], "rldev", "write", ids, "4MiB"))
	t.Logf("a write with the secondary killed took %v (the failure detector's verdict, then the degraded decree)", time.Since(start).Round(time.Millisecond))
	if got := must(run(nil, "rldev", "read", ids, "0", "8MiB")).stdout; !bytes.Equal([]byte(got), want) {
		t.Fatal("degraded: the data read back differs")
	}
	waitState(id, "degraded", func(pr, sc segJSON) bool { return pr.Node == p && sc.Stale })

	// It comes back and is resynced.
	if err := u.Restart(s); err != nil {
		t.Fatal(err)
	}
	waitState(id, "normal", func(pr, sc segJSON) bool { return !sc.Stale })
	if got := must(run(nil, "rldev", "read", "--replica", "2", ids, "0", "8MiB")).stdout; !bytes.Equal([]byte(got), want) {
		t.Fatal("the resynced copy differs")
	}

	// The primary's node dies: everything reads from the resynced copy,
	// and writes go on through it.
	if err := u.Kill(p); err != nil {
		t.Fatal(err)
	}
	if got := must(run(nil, "rldev", "read", ids, "0", "8MiB")).stdout; !bytes.Equal([]byte(got), want) {
		t.Fatal("after the primary's death: the data read back differs")
	}
	more := make([]byte, 1<<20)
	rand.Read(more)
	must(run(more, "rldev", "write", ids, "2MiB"))
	copy(want[2<<20:], more)
	if got := must(run(nil, "rldev", "read", ids, "0", "8MiB")).stdout; !bytes.Equal([]byte(got), want) {
		t.Fatal("after a write through the survivor: the data read back differs")
	}
	waitState(id, "degraded", func(pr, sc segJSON) bool { return pr.Node == s && sc.Stale })
	// The survivor's metrics count the client writes it served and the
	// ones it logged in degraded mode.
	if m := scrapeMetrics(t, u.Nodes[uint64(s)].GRPC); m["grove_rldev_events_total{event=write}"] == 0 || m["grove_rldev_events_total{event=degraded_write}"] == 0 {
		t.Fatalf("node %d's RLDev metrics: %v writes, %v degraded writes", s, m["grove_rldev_events_total{event=write}"], m["grove_rldev_events_total{event=degraded_write}"])
	}

	// Bad input: clear errors and exit codes, nothing written.
	if r := run(nil, "rldev", "read", "999", "0", "4096"); r.code != 5 {
		t.Fatalf("unknown RLDev: exit %d: %s", r.code, r.stderr)
	}
	if r := run(nil, "rldev", "read", ids, "100", "4096"); r.code != 2 {
		t.Fatalf("unaligned offset: exit %d: %s", r.code, r.stderr)
	}
	if r := run(nil, "rldev", "read", ids, "16MiB", "4096"); r.code != 2 || !contains(r.stderr, "outside") {
		t.Fatalf("past the end: exit %d: %s", r.code, r.stderr)
	}
	// Starting inside and running past the end: refused before any I/O
	// (the read wrote what it could read to the output first, the write
	// its first parts).
	if r := run(nil, "rldev", "read", ids, "8MiB", "16MiB"); r.code != 2 || !contains(r.stderr, "outside") || r.stdout != "" {
		t.Fatalf("a read past the end: exit %d, %d bytes out: %s", r.code, len(r.stdout), r.stderr)
	}
	big := filepath.Join(t.TempDir(), "big.bin")
	if err := os.WriteFile(big, bytes.Repeat([]byte{0xee}, 2<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := run(nil, "rldev", "write", ids, "15MiB", big); r.code != 2 || !contains(r.stderr, "outside") {
		t.Fatalf("a write past the end: exit %d: %s", r.code, r.stderr)
	}
	if r := run([]byte("hello"), "rldev", "write", ids, "0"); r.code != 2 || !contains(r.stderr, "--pad") {
		t.Fatalf("a short write: exit %d: %s", r.code, r.stderr)
	}
	if got := must(run(nil, "rldev", "read", ids, "0", "8MiB")).stdout; !bytes.Equal([]byte(got), want) {
		t.Fatal("bad input changed the data")
	}
}
