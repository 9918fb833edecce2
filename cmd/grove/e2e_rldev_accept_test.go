package main

import (
	"bytes"
	"crypto/rand"
	"strconv"
	"testing"
	"time"
)

// TestEndToEndRLDevAcceptStaleSIGKILL, through the CLI on `grove up
// --processes`: an RLDev's secondary's node is SIGKILLed, a write lands
// on the primary alone (degraded), then the primary's node is SIGKILLed
// too; the secondary's node comes back, stale, and nothing serves the
// RLDev (grove rldev list says why and what to run). `grove rldev
// accept-stale` without --lose-writes says what it would give up and
// exits 2; with it, the stale copy serves what it held (the degraded
// write is given up, as the operator was told) and takes writes; the old
// primary's node comes back and is copied whole from it: both copies end
// equal. Refusals: a normal RLDev, an unknown one, one whose up-to-date
// copy is alive.
func TestEndToEndRLDevAcceptStaleSIGKILL(t *testing.T) {
	t.Parallel() // its own ports and directories: see parallelTests
	bin, u, ctx := startCluster(t, 7500)
	keepLogsOnFailure(t, u, "acceptstale")
	cl := rldevCLI{t: t, bin: bin, ep: u.Gateway}
	run, must, list := cl.run, cl.must, cl.list
	must(run(nil, "rldev", "create", "--size", "16MiB", "--count", "2"))
	l := list()
	id, other := l.RLDevs[0].RLDev, l.RLDevs[1].RLDev
	ids := strconv.FormatUint(id, 10)
	p, s := l.RLDevs[0].Primary.Node, l.RLDevs[0].Secondary.Node
	old := make([]byte, 4<<20)
	rand.Read(old)
	must(run(old, "rldev", "write", ids, "0"))
	if r := run(nil, "rldev", "accept-stale", ids); r.code != 1 || !contains(r.stderr, "normal") {
		t.Fatalf("accept-stale of a normal RLDev: exit %d: %s", r.code, r.stderr)
	}
	if r := run(nil, "rldev", "accept-stale", "999"); r.code != 5 {
		t.Fatalf("accept-stale of an unknown RLDev: exit %d: %s", r.code, r.stderr)
	}

	// The secondary dies; a write lands on the primary alone.
	if err := u.Kill(s); err != nil {
		t.Fatal(err)
	}
	missed := make([]byte, 1<<20)
	rand.Read(missed)
	must(run(missed, "rldev", "write", ids, "0"))
	// Its up-to-date copy alive: refused.
	if r := run(nil, "rldev", "accept-stale", ids, "--lose-writes"); r.code != 1 && r.code != 3 {
		t.Fatalf("accept-stale with the up-to-date copy alive (and the stale one down): exit %d: %s", r.code, r.stderr)
	}

	// Then the primary dies; the secondary comes back, stale.
	if err := u.Kill(p); err != nil {
		t.Fatal(err)
	}
	if err := u.Restart(s); err != nil {
		t.Fatal(err)
	}
	var before ran
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(300 * time.Millisecond) {
		// Once node p is declared dead and node s has loaded its copy.
		before = run(nil, "rldev", "accept-stale", ids)
		if before.code == 2 {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("accept-stale (without --lose-writes) never said what it would give up: exit %d: %s", before.code, before.stderr)
		}
	}
	if !contains(before.stderr, "--lose-writes") || !contains(before.stderr, "dead") {
		t.Fatalf("accept-stale without --lose-writes: %s", before.stderr)
	}
	t.Logf("accept-stale without --lose-writes: %s", before.stderr)
	if r := run(nil, "rldev", "read", ids, "0", "4096"); r.code == 0 {
		t.Fatal("the stale copy served a read before it was accepted")
	}
	if r := must(run(nil, "rldev", "list")); !contains(r.stdout, "accept-stale "+ids) {
		t.Errorf("rldev list does not point at accept-stale:\n%s", r.stdout)
	} else {
		t.Logf("rldev list, both copies out of reach:\n%s", r.stdout)
	}
	r := must(run(nil, "rldev", "accept-stale", ids, "--lose-writes"))
	t.Logf("accept-stale --lose-writes: %s", r.stdout)

	// The stale copy serves what it held: the write it missed is gone.
	var got string
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if r := run(nil, "rldev", "read", ids, "0", "4MiB"); r.code == 0 {
			got = r.stdout
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the accepted copy never served: %+v", list())
		}
	}
	if !bytes.Equal([]byte(got), old) {
		t.Fatal("the accepted copy does not hold what it held before the write it missed")
	}
	more := make([]byte, 1<<20)
	rand.Read(more)
	must(run(more, "rldev", "write", ids, "1MiB"))
	want := append(append(append([]byte{}, old[:1<<20]...), more...), old[2<<20:]...)

	// The old primary comes back, stale, and is copied whole.
	if err := u.Restart(p); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		n := 0
		for _, x := range list().RLDevs {
			if (x.RLDev == id || x.RLDev == other) && x.State == "normal" {
				n++
			}
		}
		if n == 2 {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("never normal again: %+v", list())
		}
	}
	for _, rep := range []string{"1", "2"} {
		if got := must(run(nil, "rldev", "read", "--replica", rep, ids, "0", "4MiB")).stdout; !bytes.Equal([]byte(got), want) {
			t.Fatalf("replica %s differs after the copy", rep)
		}
	}
}
