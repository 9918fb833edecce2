package main

import (
	"bytes"
	"crypto/rand"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestEndToEndRLDevOwedSIGKILL, through the CLI on `grove up
// --processes`: an RLDev's primary is SIGKILLed right after a write, its
// dirty regions still marked, and its secondary at once after it (before
// any verdict). The primary's node comes back alone: it must pull those
// regions from the secondary, which is down. Once the secondary is
// declared dead the RLDev degrades with the regions owed (owed.go): they
// answer "unavailable" (exit 3) at once, the rest of the RLDev is read
// and written, and grove rldev list says which node's copy they wait for.
// The secondary comes back: the owed regions are pulled from it, the
// resync follows, and both copies end equal to what was written. (Before
// owed ranges the RLDev stayed normal, every write waiting for the
// secondary.)
func TestEndToEndRLDevOwedSIGKILL(t *testing.T) {
	t.Parallel() // its own ports and directories: see parallelTests
	bin, u, ctx := startCluster(t, 10200)
	keepLogsOnFailure(t, u, "owed")
	cl := rldevCLI{t: t, bin: bin, ep: u.Gateway}
	run, must, list := cl.run, cl.must, cl.list
	must(run(nil, "rldev", "create", "--size", "16MiB"))
	l := list()
	id := l.RLDevs[0].RLDev
	ids := strconv.FormatUint(id, 10)
	p, s := l.RLDevs[0].Primary.Node, l.RLDevs[0].Secondary.Node
	want := make([]byte, 16<<20)
	rand.Read(want)
	must(run(want[8<<20:], "rldev", "write", ids, "8MiB")) // regions 8-15, cleared lazily before the kill
	time.Sleep(3 * time.Second)
	// Regions 0-1 dirty (lazily cleared: marked for a second or more
	// after the write), then both nodes killed before any verdict.
	must(run(want[:2<<20], "rldev", "write", ids, "0"))
	if err := u.Kill(p); err != nil {
		t.Fatal(err)
	}
	if err := u.Kill(s); err != nil {
		t.Fatal(err)
	}
	if err := u.Restart(p); err != nil {
		t.Fatal(err)
	}

	// Degraded with the dirty regions owed to node s's copy.
	var note string
	for deadline := time.Now().Add(45 * time.Second); note == ""; time.Sleep(300 * time.Millisecond) {
		for _, x := range list().RLDevs {
			for _, n := range x.Note {
				if x.RLDev == id && x.State == "degraded" && strings.Contains(n, "wait for node "+strconv.FormatUint(s, 10)+"'s copy") {
					note = n
				}
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("never degraded with owed ranges: %+v", list())
		}
	}
	t.Logf("rldev list: %s", note)
	r := run(nil, "rldev", "read", ids, "0", "4096")
	if r.code != 3 || !contains(r.stderr, "unavailable") {
		t.Fatalf("a read of an owed region: exit %d: %s", r.code, r.stderr)
	}
	t.Logf("read of an owed region: %s", strings.TrimSpace(r.stderr))
	if r := run(want[:4096], "rldev", "write", ids, "0"); r.code != 3 {
		t.Fatalf("a write of an owed region: exit %d: %s", r.code, r.stderr)
	}
	// The rest is served: read, and written (degraded).
	if got := must(run(nil, "rldev", "read", ids, "8MiB", "8MiB")).stdout; !bytes.Equal([]byte(got), want[8<<20:]) {
		t.Fatal("regions 8-15 read back wrong from the degraded primary")
	}
	rand.Read(want[12<<20 : 13<<20])
	must(run(want[12<<20:13<<20], "rldev", "write", ids, "12MiB"))
	// Regions 2-7 were never written: zeros, read and written.
	clear(want[2<<20 : 8<<20])
	if got := must(run(nil, "rldev", "read", ids, "4MiB", "1MiB")).stdout; !bytes.Equal([]byte(got), want[4<<20:5<<20]) {
		t.Fatal("region 4 read back wrong")
	}

	// The secondary comes back: the owed regions are pulled from it, then
	// the resync.
	if err := u.Restart(s); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(300 * time.Millisecond) {
		if x := list().RLDevs[0]; x.State == "normal" && !strings.Contains(strings.Join(x.Note, ";"), "wait") {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("never normal again: %+v", list())
		}
	}
	for _, rep := range []string{"1", "2"} {
		if got := must(run(nil, "rldev", "read", "--replica", rep, ids, "0", "16MiB")).stdout; !bytes.Equal([]byte(got), want) {
			t.Fatalf("replica %s does not hold what was written", rep)
		}
	}
}
