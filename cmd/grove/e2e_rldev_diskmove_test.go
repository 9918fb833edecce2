package main

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestEndToEndRLDevDiskMoveSIGKILL, through the CLI on `grove up
// --processes --disks 2`: empty a disk by moving an RLDev's secondary to
// the other disk of its own node while data is on it, SIGKILL that node
// (the moving replica and the target at once) in the middle of the copy,
// write while it is down, restart it and follow the move to its end by
// running the same command again (the move completes as a rebuild on the
// new disk); the old extent is freed, the secondary's node is then the
// only copy left when the primary's node is SIGKILLed, and everything
// reads back from it. Bad requests get clear errors.
func TestEndToEndRLDevDiskMoveSIGKILL(t *testing.T) {
	t.Parallel() // its own ports and directories: see parallelTests
	bin, u, ctx := startCluster(t, 9300, "--disks", "2")
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
	type seg struct {
		Node uint64 `json:"node"`
		Disk uint32 `json:"disk"`
	}
	type listJSON struct {
		RLDevs []struct {
			RLDev     uint64 `json:"rldev"`
			State     string `json:"state"`
			Primary   seg    `json:"primary"`
			Secondary seg    `json:"secondary"`
			Move      struct {
				Phase    string   `json:"phase"`
				Retiring []string `json:"retiring"`
			} `json:"move"`
		} `json:"rldevs"`
	}
	list := func() listJSON {
		t.Helper()
		r := must(run(nil, "rldev", "list", "-o", "json"))
		var l listJSON
		if err := json.Unmarshal([]byte(r.stdout), &l); err != nil {
			t.Fatalf("rldev list -o json: %v\n%s", err, r.stdout)
		}
		return l
	}
	must(run(nil, "rldev", "create", "--size", "512MiB"))
	l := list()
	id := l.RLDevs[0].RLDev
	ids := strconv.FormatUint(id, 10)
	p, s := l.RLDevs[0].Primary, l.RLDevs[0].Secondary
	if s.Disk != 0 {
		t.Fatalf("a new RLDev's secondary on disk %d: %+v", s.Disk, l)
	}
	want := make([]byte, 8<<20)
	rand.Read(want)
	must(run(want, "rldev", "write", ids, "0"))
	late := append([]byte(nil), want[:4<<20]...)
	must(run(late, "rldev", "write", ids, "300MiB")) // data where the copy gets late

	sn := strconv.FormatUint(s.Node, 10)
	for _, c := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"rldev", "move", ids, "--segment", "secondary", "--to", sn}, 0, "name the disk"},             // where it is (a move there run again to follow it, done): nothing to do
		{[]string{"rldev", "move", ids, "--segment", "secondary", "--to", sn + ":0"}, 0, "is at " + sn + ":0"}, // where it is: nothing to do
		{[]string{"rldev", "move", ids, "--segment", "secondary", "--to", strconv.FormatUint(p.Node, 10) + ":1"}, 1, "other segment"},
		{[]string{"rldev", "move", ids, "--segment", "secondary", "--to", sn + ":2"}, 1, "no disk 2"},
	} {
		if r := run(nil, c.args...); r.code != c.code || !strings.Contains(r.stderr, c.says) {
			t.Fatalf("%v: exit %d (want %d): %s", c.args, r.code, c.code, r.stderr)
		}
	}

	// The move to disk 1 starts; the node is SIGKILLed once the copy runs.
	to := sn + ":1"
	must(run(nil, "rldev", "move", ids, "--segment", "secondary", "--to", to, "--no-wait"))
	phase := ""
	for deadline := time.Now().Add(60 * time.Second); phase != "copying" && phase != "switching"; time.Sleep(20 * time.Millisecond) {
		l = list()
		if phase = l.RLDevs[0].Move.Phase; phase == "" {
			t.Fatalf("the move of 512 MiB ended before the test saw it: %+v", l)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("the move never reached its copy (phase %q): %+v", phase, l)
		}
	}
	if err := u.Kill(s.Node); err != nil {
		t.Fatal(err)
	}
	t.Logf("node %d (the moving secondary and the target) SIGKILLed while the move was %s", s.Node, phase)
	more := make([]byte, 1<<20)
	rand.Read(more)
	must(run(more, "rldev", "write", ids, "1MiB")) // degraded, once the node is declared dead
	copy(want[1<<20:], more)
	if err := u.Restart(s.Node); err != nil {
		t.Fatal(err)
	}
	r := must(run(nil, "rldev", "move", ids, "--segment", "secondary", "--to", to, "-o", "json"))
	var done struct {
		Move  string `json:"move"`
		State string `json:"state"`
		To    string `json:"to"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &done); err != nil || done.Move != "moved" || done.State != "normal" {
		t.Fatalf("move: %v %+v\n%s\n%s", err, done, r.stdout, r.stderr)
	}
	t.Logf("grove rldev move, following the move again:\n%s", r.stderr)
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		l = list()
		x := l.RLDevs[0]
		if x.State == "normal" && x.Secondary == (seg{s.Node, 1}) && len(x.Move.Retiring) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the segment never settled on disk 1 with its old extent freed: %+v", x)
		}
	}
	for _, replica := range []string{"1", "2"} {
		if got := must(run(nil, "rldev", "read", "--replica", replica, ids, "0", "8MiB")).stdout; !bytes.Equal([]byte(got), want) {
			t.Fatalf("replica %s after the move: the data read back differs", replica)
		}
		if got := must(run(nil, "rldev", "read", "--replica", replica, ids, "300MiB", "4MiB")).stdout; !bytes.Equal([]byte(got), late) {
			t.Fatalf("replica %s after the move: the data at 300MiB differs", replica)
		}
	}
	// The copy on the new disk is the one left: the primary's node dies.
	if err := u.Kill(p.Node); err != nil {
		t.Fatal(err)
	}
	if got := must(run(nil, "rldev", "read", ids, "0", "8MiB")).stdout; !bytes.Equal([]byte(got), want) {
		t.Fatal("from the moved segment alone: the data read back differs")
	}
	if got := must(run(nil, "rldev", "read", ids, "300MiB", "4MiB")).stdout; !bytes.Equal([]byte(got), late) {
		t.Fatal("from the moved segment alone: the data at 300MiB differs")
	}
}
