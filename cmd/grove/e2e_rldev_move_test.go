package main

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestEndToEndRLDevMoveSIGKILL, through the CLI on `grove up --processes`:
// move an RLDev's secondary to the third node while data is on it, SIGKILL
// the target node in the middle of the move, write while it is down, start
// it again and follow the move to its end by running the same command
// again; everything reads back from both copies, the old node no longer
// matters (SIGKILLed, the RLDev stays normal), and once it is back its old
// extent is freed. Bad requests get clear errors.
func TestEndToEndRLDevMoveSIGKILL(t *testing.T) {
	t.Parallel() // its own ports and directories: see parallelTests
	bin, u, ctx := startCluster(t, 9800)
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
	type moveJSON struct {
		Phase    string   `json:"phase"`
		Retiring []string `json:"retiring"`
	}
	type listJSON struct {
		Forgotten map[string][]uint32 `json:"forgotten"`
		RLDevs    []struct {
			RLDev     uint64 `json:"rldev"`
			State     string `json:"state"`
			Primary   segJSON
			Secondary segJSON
			Move      moveJSON `json:"move"`
			Note      []string `json:"note"`
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
	p, s := l.RLDevs[0].Primary.Node, l.RLDevs[0].Secondary.Node
	var target uint64
	for n := uint64(1); n <= 3; n++ {
		if n != p && n != s {
			target = n
		}
	}
	want := make([]byte, 8<<20)
	rand.Read(want)
	must(run(want, "rldev", "write", ids, "0"))
	late := append([]byte(nil), want[:4<<20]...)
	must(run(late, "rldev", "write", ids, "200MiB")) // data where the copy gets late

	// Bad requests: clear errors, nothing asked.
	to := strconv.FormatUint(target, 10)
	for _, c := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"rldev", "move", ids, "--segment", "middle", "--to", to}, 2, "primary or secondary"},
		{[]string{"rldev", "move", ids, "--segment", "secondary", "--to", strconv.FormatUint(p, 10)}, 1, "other segment"},
		{[]string{"rldev", "move", ids, "--segment", "secondary", "--to", to + ":7"}, 1, "no disk 7"},
		{[]string{"rldev", "move", "99", "--segment", "secondary", "--to", to}, 5, "no such RLDev"},
		{[]string{"rldev", "move", ids, "--cancel"}, 1, "not moving"},
		{[]string{"rldev", "create", "--size", "64GiB"}, 1, "no room for the segment"}, // the disks are 8 GiB
	} {
		if r := run(nil, c.args...); r.code != c.code || !strings.Contains(r.stderr, c.says) {
			t.Fatalf("%v: exit %d (want %d): %s", c.args, r.code, c.code, r.stderr)
		}
	}

	// The move starts; the target is SIGKILLed once it receives the copy
	// (or, on a slow machine, whatever phase the move is in when seen).
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
	if err := u.Kill(target); err != nil {
		t.Fatal(err)
	}
	t.Logf("target node %d SIGKILLed while the move was %s", target, phase)
	more := make([]byte, 1<<20)
	rand.Read(more)
	start := time.Now()
	must(run(more, "rldev", "write", ids, "1MiB")) // waits for the target's verdict, then goes on without it
	copy(want[1<<20:], more)
	t.Logf("a write with the move's target killed took %v", time.Since(start).Round(time.Millisecond))
	if got := must(run(nil, "rldev", "read", ids, "0", "4MiB")).stdout; !bytes.Equal([]byte(got), want[:4<<20]) {
		t.Fatal("with the target down: the data read back differs")
	}
	if err := u.Restart(target); err != nil {
		t.Fatal(err)
	}
	// Following the move again: it ends with the segment on the target.
	r := must(run(nil, "rldev", "move", ids, "--segment", "secondary", "--to", to, "-o", "json"))
	var done struct {
		Move          string `json:"move"`
		State         string `json:"state"`
		SecondaryNode uint64 `json:"secondary_node"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &done); err != nil || done.Move != "moved" || done.SecondaryNode != target || done.State != "normal" {
		t.Fatalf("move: %v %+v\n%s\n%s", err, done, r.stdout, r.stderr)
	}
	t.Logf("grove rldev move, following the move again:\n%s", r.stderr)
	if !strings.Contains(r.stderr, "rldev "+ids) {
		t.Fatalf("no progress on standard error: %q", r.stderr)
	}
	// Once more, the move done: nothing to do, exit 0 (it said "name the
	// disk", exit 1).
	if r := must(run(nil, "rldev", "move", ids, "--segment", "secondary", "--to", to)); !strings.Contains(r.stderr, "already") {
		t.Fatalf("the move run again once done: %s", r.stderr)
	}
	for _, replica := range []string{"1", "2"} {
		if got := must(run(nil, "rldev", "read", "--replica", replica, ids, "0", "4MiB")).stdout; !bytes.Equal([]byte(got), want[:4<<20]) {
			t.Fatalf("replica %s after the move: the data read back differs", replica)
		}
		if got := must(run(nil, "rldev", "read", "--replica", replica, ids, "200MiB", "4MiB")).stdout; !bytes.Equal([]byte(got), late) {
			t.Fatalf("replica %s after the move: the data at 200MiB differs", replica)
		}
	}

	// The node the segment left no longer matters.
	if err := u.Kill(s); err != nil {
		t.Fatal(err)
	}
	must(run(more, "rldev", "write", ids, "5MiB"))
	copy(want[5<<20:], more)
	if got := must(run(nil, "rldev", "read", ids, "0", "8MiB")).stdout; !bytes.Equal([]byte(got), want) {
		t.Fatal("with the old node down: the data read back differs")
	}
	l = list()
	// Its old extent is retiring, or already wiped and freed: the node
	// wipes it as soon as the RLDev is normal, which may end before the
	// SIGKILL (a CI run under load read back both copies slowly).
	if l.RLDevs[0].State != "normal" || len(l.RLDevs[0].Move.Retiring) > 1 {
		t.Fatalf("with the old node down: %+v", l.RLDevs[0])
	}
	// Back, it wipes and frees its old extent.
	if err := u.Restart(s); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(60 * time.Second); len(list().RLDevs[0].Move.Retiring) > 0; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the old extent was never freed: %+v", list().RLDevs[0])
		}
	}

	// A node lost for good: the target, now the secondary, is SIGKILLed
	// and never restarted. The RLDev degrades (writes go on); its stale
	// segment is re-placed on node s by a move, rebuilt there by a full
	// copy from the primary, and the RLDev is normal again with both
	// copies whole (outside review 81: such a move waited for ever).
	// Two more RLDevs, each with a segment on that node (chained over
	// the three), for forget-node --re-place below.
	must(run(nil, "rldev", "create", "--size", "16MiB", "--count", "2"))
	small := map[uint64][]byte{}
	for _, rd := range list().RLDevs[1:] {
		if rd.Primary.Node != target && rd.Secondary.Node != target {
			t.Fatalf("rldev %d is not on node %d: %+v", rd.RLDev, target, rd)
		}
		small[rd.RLDev] = make([]byte, 1<<20)
		rand.Read(small[rd.RLDev])
		must(run(small[rd.RLDev], "rldev", "write", strconv.FormatUint(rd.RLDev, 10), "4MiB"))
	}
	if err := u.Kill(target); err != nil {
		t.Fatal(err)
	}
	rand.Read(more)
	must(run(more, "rldev", "write", ids, "2MiB"))
	copy(want[2<<20:], more)
	degraded := func() bool {
		for _, rd := range list().RLDevs {
			if rd.State != "degraded" {
				return false
			}
		}
		return true
	}
	for deadline := time.Now().Add(30 * time.Second); !degraded(); time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("not degraded with node %d gone: %+v", target, list().RLDevs)
		}
	}
	// The lost node cannot be forgotten while it holds the segment;
	// --re-place would re-place it (said, without --gone-for-good).
	lost := strconv.FormatUint(target, 10)
	if r := run(nil, "rldev", "forget-node", lost, "--gone-for-good"); r.code != 1 || !strings.Contains(r.stderr, "still holds rldev "+ids+"'s secondary") {
		t.Fatalf("forget-node of a node holding a segment: %v", r)
	}
	if r := run(nil, "rldev", "forget-node", lost, "--re-place"); r.code != 2 || !strings.Contains(r.stderr, fmt.Sprintf("its secondary re-placed on node %d", s)) {
		t.Fatalf("forget-node --re-place without --gone-for-good: %v", r)
	} else {
		t.Logf("grove rldev forget-node %s --re-place: %s", lost, r.stderr)
	}
	from := strconv.FormatUint(s, 10)
	r = must(run(nil, "rldev", "move", ids, "--segment", "secondary", "--to", from, "-o", "json"))
	t.Logf("grove rldev move of the lost node's stale segment:\n%s", r.stderr)
	if err := json.Unmarshal([]byte(r.stdout), &done); err != nil || done.Move != "moved" || done.SecondaryNode != s || done.State != "normal" {
		t.Fatalf("re-place: %v %+v\n%s\n%s", err, done, r.stdout, r.stderr)
	}
	if !strings.Contains(r.stderr, "re-placed") {
		t.Fatalf("the move did not say it re-placed the segment: %s", r.stderr)
	}
	for _, replica := range []string{"1", "2"} {
		if got := must(run(nil, "rldev", "read", "--replica", replica, ids, "0", "8MiB")).stdout; !bytes.Equal([]byte(got), want) {
			t.Fatalf("replica %s after the re-place: the data read back differs", replica)
		}
		if got := must(run(nil, "rldev", "read", "--replica", replica, ids, "200MiB", "4MiB")).stdout; !bytes.Equal([]byte(got), late) {
			t.Fatalf("replica %s after the re-place: the data at 200MiB differs", replica)
		}
	}

	// The lost node is forgotten, with --re-place: the other two RLDevs'
	// segments there are re-placed on the nodes left and copied whole,
	// rldev 1's old extent (retiring: only the lost node could wipe it)
	// and theirs are dropped, and its disk is marked so that nothing is
	// placed there again. Refused for a live node; without --re-place
	// while it holds segments; without --gone-for-good (it says what it
	// would do).
	if r := run(nil, "rldev", "forget-node", strconv.FormatUint(p, 10), "--gone-for-good"); r.code != 1 || !strings.Contains(r.stderr, "is alive") {
		t.Fatalf("forget-node of a live node: %v", r)
	}
	if r := run(nil, "rldev", "forget-node", lost, "--gone-for-good"); r.code != 1 || !strings.Contains(r.stderr, "still holds rldev 2's") {
		t.Fatalf("forget-node of a node still holding segments: %v", r)
	}
	if r := run(nil, "rldev", "forget-node", lost, "--re-place"); r.code != 2 || !strings.Contains(r.stderr, "rldev 2: its") || !strings.Contains(r.stderr, "rldev 3: its") || !strings.Contains(r.stderr, "--gone-for-good") {
		t.Fatalf("forget-node --re-place without --gone-for-good: %v", r)
	} else {
		t.Logf("grove rldev forget-node %s --re-place: %s", lost, r.stderr)
	}
	if got := list().RLDevs[0].Move.Retiring; len(got) != 1 {
		t.Fatalf("before the forget, retiring %v: want the lost node's old extent", got)
	}
	var forgot struct {
		Node    uint64              `json:"node"`
		Disks   []uint32            `json:"disks_forgotten"`
		Dropped map[string][]string `json:"retiring_dropped"`
	}
	r = must(run(nil, "rldev", "forget-node", lost, "--re-place", "--gone-for-good", "-o", "json"))
	t.Logf("grove rldev forget-node %s --re-place --gone-for-good -o json: %s\n%s", lost, r.stderr, r.stdout)
	if err := json.Unmarshal([]byte(r.stdout), &forgot); err != nil || forgot.Node != target || len(forgot.Disks) != 1 || len(forgot.Dropped) != 3 || len(forgot.Dropped[ids]) != 1 {
		t.Fatalf("forget-node: %v %+v\n%s", err, forgot, r.stdout)
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		l, settled := list(), true
		for _, rd := range l.RLDevs {
			if rd.State != "normal" || len(rd.Move.Retiring) > 0 || rd.Primary.Node == target || rd.Secondary.Node == target {
				settled = false
			}
		}
		if settled {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("not settled after forget-node --re-place: %+v", l.RLDevs)
		}
	}
	if f := list().Forgotten; len(f) != 1 || len(f[lost]) != 1 {
		t.Fatalf("rldev list -o json: forgotten %v, want node %s's disk", f, lost)
	}
	if r := must(run(nil, "rldev", "list")); !strings.Contains(r.stdout, "forgotten: node "+lost) {
		t.Fatalf("rldev list does not show the forgotten node:\n%s", r.stdout)
	}
	// Lost for good and forgotten, the node is no longer a problem of the
	// cluster's health: status shows it forgotten, health does not list
	// it (here the node was a config-service member too, which still does
	// not answer: that stays a problem until the member is replaced).
	if r := run(nil, "health"); strings.Contains(r.stdout, "node "+lost+" is dead") || !strings.Contains(r.stdout, "forgotten: 1") ||
		r.code == 6 && !strings.Contains(r.stdout, "member "+lost+" does not answer") {
		t.Fatalf("grove health once the lost node was forgotten: %v", r)
	}
	if r := run(nil, "status"); !regexp.MustCompile(`(?m)^\s*` + lost + `\s+forgotten\s`).MatchString(r.stdout) {
		t.Fatalf("grove status does not show node %s forgotten:\n%s", lost, r.stdout)
	}
	for id, data := range small {
		for _, replica := range []string{"1", "2"} {
			if got := must(run(nil, "rldev", "read", "--replica", replica, strconv.FormatUint(id, 10), "4MiB", "1MiB")).stdout; !bytes.Equal([]byte(got), data) {
				t.Fatalf("rldev %d replica %s after forget-node --re-place: the data read back differs", id, replica)
			}
		}
	}
	// New RLDevs chain over the two nodes left.
	must(run(nil, "rldev", "create", "--size", "16MiB", "--count", "3"))
	for _, rd := range list().RLDevs {
		if rd.Primary.Node == target || rd.Secondary.Node == target {
			t.Fatalf("rldev %d placed on the forgotten node %d", rd.RLDev, target)
		}
	}
}
