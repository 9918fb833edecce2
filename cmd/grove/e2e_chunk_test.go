package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	mrand "math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/grovestore/grove/internal/chunk"
)

// ChunkStatJSON is `grove chunk stat -o json`.
type ChunkStatJSON struct {
	Managers []struct {
		CM     uint32   `json:"cm"`
		Node   uint64   `json:"node"`
		Role   string   `json:"role"`
		Chunks uint64   `json:"chunks"`
		Data   []string `json:"data_rldevs"`
	} `json:"managers"`
}

// TestEndToEndChunkSIGKILL, through the CLI on `grove up --processes`
// (three nodes: three chunk manager pairs, on nodes 1-2, 2-3 and 3-1):
// allocate, write, read back and free chunks; clear errors for malformed,
// unknown, freed handles and writes past a chunk's end; SIGKILL node 1
// (pair 1's primary, pair 3's secondary): pair 1's chunks read back
// whole through node 2, which took over; both pairs allocate again, with
// ids never handed out before; node 1 restarts and rejoins as secondary.
func TestEndToEndChunkSIGKILL(t *testing.T) {
	t.Parallel() // its own ports and directories: see parallelTests
	bin, u, _ := startCluster(t, 9600, "--chunk-size", "32MiB")
	ep := u.Gateway
	tmp := t.TempDir()
	files := 0
	run := func(stdin []byte, args ...string) ran {
		t.Helper()
		full := append(args, "--addr", ep)
		if stdin == nil {
			return grove(t, bin, nil, full...)
		}
		files++
		f := filepath.Join(tmp, strconv.Itoa(files))
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
	stat := func() ChunkStatJSON {
		t.Helper()
		var s ChunkStatJSON
		r := must(run(nil, "chunk", "stat", "-o", "json"))
		if err := json.Unmarshal([]byte(r.stdout), &s); err != nil {
			t.Fatalf("chunk stat -o json: %v\n%s", err, r.stdout)
		}
		return s
	}
	roles := func(s ChunkStatJSON, cm uint32) map[uint64]string {
		m := map[uint64]string{}
		for _, x := range s.Managers {
			if x.CM == cm && x.Role != "no answer" {
				m[x.Node] = x.Role
			}
		}
		return m
	}
	waitRoles := func(cm uint32, want map[uint64]string) {
		t.Helper()
		var got map[uint64]string
		for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
			if got = roles(stat(), cm); len(got) == len(want) {
				ok := true
				for n, r := range want {
					ok = ok && got[n] == r
				}
				if ok {
					return
				}
			}
		}
		t.Fatalf("pair %d: roles %v, want %v", cm, got, want)
	}
	waitRoles(1, map[uint64]string{1: "primary", 2: "secondary"})
	waitRoles(3, map[uint64]string{3: "primary", 1: "secondary"})

	want := map[chunk.Handle][]byte{}
	var last map[uint32]uint64 = map[uint32]uint64{}
	alloc := func(cm uint32, size int) chunk.Handle {
		t.Helper()
		r := must(run(nil, "chunk", "alloc", strconv.Itoa(size), "--cm", strconv.Itoa(int(cm))))
		h, err := chunk.ParseHandle(strings.TrimSuffix(r.stdout, "\n"))
		if err != nil || strings.Count(r.stdout, "\n") != 1 {
			t.Fatalf("chunk alloc printed %q: %v", r.stdout, err)
		}
		if h.CM != cm || h.ID <= last[cm] {
			t.Fatalf("handle %s after id %d of pair %d", h, last[cm], cm)
		}
		last[cm] = h.ID
		want[h] = make([]byte, size)
		return h
	}
	write := func(h chunk.Handle, off int, data []byte) {
		t.Helper()
		must(run(data, "chunk", "write", h.String(), "--offset", strconv.Itoa(off)))
		copy(want[h][off:], data)
	}
	check := func(cms ...uint32) {
		t.Helper()
		for h, w := range want {
			for _, cm := range cms {
				if h.CM != cm {
					continue
				}
				if got := must(run(nil, "chunk", "read", h.String())).stdout; got != string(w) {
					t.Fatalf("chunk %s: the data read back differs (%d bytes, want %d)", h, len(got), len(w))
				}
			}
		}
	}
	random := func(n int) []byte {
		b := make([]byte, n)
		rand.Read(b)
		return b
	}

	a := alloc(1, 100<<10)
	b := alloc(1, 1)
	c := alloc(1, 5000)
	d := alloc(3, 9000)
	write(a, 0, random(100<<10))
	write(b, 0, []byte{42})
	write(c, 4000, random(1000))
	write(d, 1, random(8999))
	check(1, 3)
	if got := must(run(nil, "chunk", "read", c.String(), "--offset", "4090", "--length", "20")).stdout; got != string(want[c][4090:4110]) {
		t.Fatal("a read across a block boundary differs")
	}

	// Bad requests: clear errors, exit codes by the conventions, nothing done.
	e := alloc(1, 4096)
	must(run(nil, "chunk", "free", e.String()))
	delete(want, e)
	for _, x := range []struct {
		stdin []byte
		args  []string
		code  int
		says  string
	}{
		{nil, []string{"chunk", "read", "nonsense"}, 2, "CM:ID"},
		{nil, []string{"chunk", "read", "0:5"}, 2, "above zero"},
		{nil, []string{"chunk", "read", "1:999999"}, 5, "not allocated"},
		{nil, []string{"chunk", "read", e.String()}, 5, "not allocated"},
		{nil, []string{"chunk", "free", e.String()}, 5, "not allocated"},
		{[]byte("x"), []string{"chunk", "write", e.String()}, 5, "not allocated"},
		{nil, []string{"chunk", "read", "77:1"}, 5, "no such chunk manager"},
		{[]byte("xy"), []string{"chunk", "write", b.String()}, 2, "past the end"},
		{nil, []string{"chunk", "read", c.String(), "--offset", "4999", "--length", "2"}, 2, "past the end"},
		{nil, []string{"chunk", "alloc", "0"}, 2, "SIZE"},
		{nil, []string{"chunk", "alloc", "65MiB"}, 2, "SIZE"},
	} {
		if r := run(x.stdin, x.args...); r.code != x.code || !strings.Contains(r.stderr, x.says) {
			t.Fatalf("%v: exit %d (want %d, %q): %s", x.args, r.code, x.code, x.says, r.stderr)
		}
	}
	check(1, 3)

	// Node 1 is SIGKILLed: node 2 takes pair 1 over; pair 3 goes on
	// without its secondary.
	if err := u.Kill(1); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	f := alloc(1, 20000)
	t.Logf("the first allocation of pair 1 after its primary was SIGKILLed took %v", time.Since(start).Round(time.Millisecond))
	write(f, 100, random(300))
	g := alloc(3, 4096)
	write(g, 0, random(4096))
	check(1, 3)
	waitRoles(1, map[uint64]string{2: "primary"})
	// Node 2, pair 1's primary now, counted the allocation it served.
	if m := scrapeMetrics(t, u.Nodes[2].GRPC); m["grove_chunk_requests_total{op=allocate,result=ok}"] == 0 {
		t.Fatalf("node 2's chunk metrics count no allocation: %v", m["grove_chunk_requests_total{op=allocate,result=ok}"])
	}

	// Node 1 comes back: secondary of both pairs; everything reads back,
	// frees and allocations go on.
	if err := u.Restart(1); err != nil {
		t.Fatal(err)
	}
	waitRoles(1, map[uint64]string{2: "primary", 1: "secondary"})
	waitRoles(3, map[uint64]string{3: "primary", 1: "secondary"})
	check(1, 3)
	must(run(nil, "chunk", "free", a.String()))
	delete(want, a)
	h := alloc(1, 777)
	write(h, 0, bytes.Repeat([]byte("z"), 777))
	check(1, 3)
	s := stat()
	for _, m := range s.Managers {
		if m.CM == 1 && m.Chunks != 4 { // b, c, f, h
			t.Fatalf("pair 1 at node %d: %d chunks, want 4", m.Node, m.Chunks)
		}
	}

	// Growth, by decree: a data RLDev added to pair 1 (its managers load
	// the map again; the new RLDev, with the most free space, takes the
	// next allocation); a fourth pair on nodes 1 and 3.
	for _, x := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"chunk", "grow", "99"}, 5, "no such chunk manager"},
		{[]string{"chunk", "grow", "1", "--size", "1000"}, 2, "--size"},
		{[]string{"chunk", "add-pair", "--nodes", "1,1"}, 2, "two different"},
	} {
		if r := run(nil, x.args...); r.code != x.code || !strings.Contains(r.stderr, x.says) {
			t.Fatalf("%v: exit %d (want %d, %q): %s", x.args, r.code, x.code, x.says, r.stderr)
		}
	}
	must(run(nil, "chunk", "grow", "1", "--size", "64MiB"))
	k := alloc(1, 50000)
	write(k, 7, random(1000))
	check(1)
	must(run(nil, "chunk", "add-pair", "--nodes", "1,3", "--size", "8MiB"))
	waitRoles(4, map[uint64]string{1: "primary", 3: "secondary"})
	m := alloc(4, 3000)
	write(m, 0, random(3000))
	check(1, 3, 4)
	for _, x := range stat().Managers {
		if x.CM == 1 && (len(x.Data) != 2 || x.Chunks != 5) {
			t.Fatalf("pair 1 at node %d after growing: data RLDevs %v, %d chunks (want 2, 5)", x.Node, x.Data, x.Chunks)
		}
	}

	// The other node of pair 1, its primary since the first SIGKILL, is
	// SIGKILLed too, once node 1's replicas are resynced (every RLDev
	// normal): node 1 takes pair 1 over; everything reads back again, and
	// pair 1 allocates with ids above the old.
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(300 * time.Millisecond) {
		var l RLDevListJSON
		if err := json.Unmarshal([]byte(must(run(nil, "rldev", "list", "-o", "json")).stdout), &l); err != nil {
			t.Fatal(err)
		}
		normal := true
		for _, x := range l.RLDevs {
			normal = normal && x.State == "normal"
		}
		if normal {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the RLDevs are not all normal: %+v", l)
		}
	}
	hctx, hcancel := context.WithTimeout(context.Background(), time.Minute)
	defer hcancel()
	if err := u.WaitAllHeard(hctx); err != nil { // node 1 among the observers again
		t.Fatal(err)
	}
	if err := u.Kill(2); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	n := alloc(1, 1234)
	t.Logf("pair 1's first allocation after its second primary was SIGKILLed took %v", time.Since(start).Round(time.Millisecond))
	write(n, 0, random(1234))
	waitRoles(1, map[uint64]string{1: "primary"})
	check(1, 3, 4)
}

// TestEndToEndChunkLoadSIGKILL: four clients of the Go clerk allocate,
// write whole chunks and free some, on `grove up --processes`, while the
// pair's primary's node is SIGKILLed under them. Afterwards: no handle was
// returned twice; every chunk whose write was acknowledged reads back its
// bytes (through the new primary, and after the node's restart); every
// acknowledged free reads as unallocated; the new primary holds them all.
func TestEndToEndChunkLoadSIGKILL(t *testing.T) {
	t.Parallel() // its own ports and directories: see parallelTests
	_, u, ctx := startCluster(t, 9900, "--chunk-size", "64MiB")
	mc := upMeta(t, ctx, u)
	cl := chunk.NewClerk(mc)
	defer cl.Close()
	if _, err := cl.Allocate(ctx, 1, 1); err != nil { // the pair serves
		t.Fatal(err)
	}

	type rec struct {
		data  []byte
		freed bool
	}
	var mu sync.Mutex
	got := map[chunk.Handle]*rec{}
	uncertain := 0
	stop := make(chan struct{})
	var stopOnce sync.Once
	halt := func() { stopOnce.Do(func() { close(stop) }) }
	var wg sync.WaitGroup
	// The workers log and report through t: they end before the test
	// does, even one that fails early (t.Fatal below).
	defer func() { halt(); wg.Wait() }()
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			r := mrand.New(mrand.NewSource(int64(w)))
			var mine []chunk.Handle
			// Bounded in count and paced (at most 125 operations a
			// second per worker): the pair's 64 MiB must hold what is
			// live plus what was freed in the last 30 s (freed space is
			// quarantined that long), whatever the machine's speed; at
			// full speed a fast disk filled it within the 7 s.
			next := time.Now()
			for i := 0; i < 2000; i++ {
				select {
				case <-stop:
					return
				case <-time.After(time.Until(next)):
				}
				next = next.Add(8 * time.Millisecond)
				octx, cancel := context.WithTimeout(ctx, 30*time.Second)
				if len(mine) > 3 && r.Intn(4) == 0 || len(mine) > 150 {
					k := r.Intn(len(mine))
					h := mine[k]
					mine = append(mine[:k], mine[k+1:]...)
					err := cl.Free(octx, h)
					cancel()
					mu.Lock()
					if err == nil {
						got[h].freed = true
					} else {
						delete(got, h) // may or may not be freed
						uncertain++
						t.Logf("free of %s: %v", h, err)
					}
					mu.Unlock()
					continue
				}
				size := 1 + r.Intn(20000)
				h, err := cl.Allocate(octx, uint64(size), 1)
				if err != nil {
					cancel()
					t.Errorf("allocation: %v", err)
					return
				}
				mu.Lock()
				if got[h] != nil {
					t.Errorf("handle %s returned twice", h)
				}
				got[h] = nil
				mu.Unlock()
				data := make([]byte, size)
				r.Read(data)
				err = cl.Write(octx, h, 0, data)
				cancel()
				mu.Lock()
				if err == nil {
					got[h] = &rec{data: data}
					mine = append(mine, h)
				} else {
					delete(got, h) // its content is uncertain
					uncertain++
					t.Logf("write of %s: %v", h, err)
				}
				mu.Unlock()
			}
		}(w)
	}
	time.Sleep(2 * time.Second)
	if err := u.Kill(1); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	time.Sleep(5 * time.Second)
	halt()
	wg.Wait()
	verify := func(when string) {
		t.Helper()
		live, freed := 0, 0
		for h, x := range got {
			if x == nil {
				continue
			}
			b, err := cl.Read(ctx, h, 0, uint64(len(x.data)))
			switch {
			case x.freed && !errors.Is(err, chunk.ErrUnallocated):
				t.Fatalf("%s: freed chunk %s: read %d bytes, %v", when, h, len(b), err)
			case x.freed:
				freed++
			case err != nil:
				t.Fatalf("%s: chunk %s: %v", when, h, err)
			case !bytes.Equal(b, x.data):
				t.Fatalf("%s: chunk %s: the data read back differs", when, h)
			default:
				live++
			}
		}
		t.Logf("%s: %d chunks read back, %d freed ones unallocated, %d operations uncertain", when, live, freed, uncertain)
		if live < 20 {
			t.Fatalf("%s: only %d chunks written", when, live)
		}
	}
	verify(fmt.Sprintf("after node 1 was SIGKILLed (%v ago)", time.Since(killed).Round(time.Second)))
	if err := u.Restart(1); err != nil {
		t.Fatal(err)
	}
	verify("after node 1 restarted")
}

// TestEndToEndChunkBatchSIGKILL: `grove chunk alloc --count --batch`
// hands out chunks from reservations of 50 while the test's own clerk
// allocates beside it; the command is SIGKILLed in the middle of a
// reservation. Every handle it printed is distinct from every other; the
// chunks of its last reservation, printed but never sent, read as "not yet
// sent", and as zeros once the reservation's life (3 s here) has passed:
// the primary kept them; every other chunk it printed reads as zeros.
func TestEndToEndChunkBatchSIGKILL(t *testing.T) {
	bin, u, ctx := startCluster(t, 9200, "--chunk-size", "64MiB", "--chunk-reservation-life", "3s")
	mc := upMeta(t, ctx, u)
	cl := chunk.NewClerk(mc)
	defer cl.Close()
	if _, err := cl.Allocate(ctx, 1, 1); err != nil { // the pair serves
		t.Fatal(err)
	}
	const batch = 50
	cmd := exec.CommandContext(ctx, bin, "chunk", "alloc", "8KiB", "--cm", "1", "--count", "100000", "--batch", strconv.Itoa(batch), "--addr", u.Gateway)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// A small pipe that the test leaves unread: the command blocks on a
	// write in the middle of a reservation (about 450 handles in), with
	// the chunks printed so far handed out and the reservation not sent.
	if f, ok := out.(*os.File); ok {
		if _, err := unix.FcntlInt(f.Fd(), unix.F_SETPIPE_SZ, 4096); err != nil {
			t.Fatal(err)
		}
	}
	var mine []chunk.Handle
	for i := 0; i < 8; i++ { // the other clerk allocates meanwhile
		x, err := cl.Allocate(ctx, 8192, 1)
		if err != nil {
			t.Fatal(err)
		}
		mine = append(mine, x)
	}
	time.Sleep(2 * time.Second)
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var printed []chunk.Handle
	rd := bufio.NewReader(out)
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			break // a last line without its newline was not printed whole
		}
		h, err := chunk.ParseHandle(line)
		if err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		printed = append(printed, h)
	}
	_ = cmd.Wait()
	if len(printed) < batch {
		t.Fatalf("%d handles printed before the command ended: %s", len(printed), stderr.String())
	}
	seen := map[chunk.Handle]bool{}
	for _, h := range append(append([]chunk.Handle(nil), printed...), mine...) {
		if seen[h] {
			t.Fatalf("%s handed out twice", h)
		}
		seen[h] = true
	}
	// The last reservation's chunks were printed and not sent (a commit
	// goes out when the next is reserved).
	k := len(printed) % batch
	if k == 0 {
		k = batch
	}
	last := printed[len(printed)-k:]
	start := time.Now()
	refused := 0
	for _, h := range last {
		for {
			got, err := cl.Read(ctx, h, 0, 8192)
			if err == nil {
				if !bytes.Equal(got, make([]byte, 8192)) {
					t.Fatalf("%s is not zeroed", h)
				}
				break
			}
			if !errors.Is(err, chunk.ErrUnallocated) || time.Since(start) > 30*time.Second {
				t.Fatalf("%s, printed before the SIGKILL: %v after %v", h, err, time.Since(start))
			}
			if refused == 0 {
				t.Logf("an unsent chunk, before the reservation's life passed: %v", err)
			}
			refused++
			time.Sleep(200 * time.Millisecond)
		}
	}
	if refused == 0 {
		t.Fatalf("the last reservation's chunks (%d) read at once: not left unsent", k)
	}
	kept := time.Since(start)
	for _, h := range printed[:len(printed)-k] {
		got, err := cl.Read(ctx, h, 0, 8192)
		if err != nil || !bytes.Equal(got, make([]byte, 8192)) {
			t.Fatalf("%s, printed and committed: %v", h, err)
		}
	}
	t.Logf("%d handles printed (%d in the reservation left open), %d by the other clerk, all distinct; the open reservation's chunks read as zeros %v after the SIGKILL",
		len(printed), k, len(mine), kept.Round(100*time.Millisecond))
}
