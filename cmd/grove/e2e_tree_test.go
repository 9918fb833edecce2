package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/bench"
	"github.com/grovestore/grove/internal/btree"
	"github.com/grovestore/grove/internal/chunk"
	"github.com/grovestore/grove/internal/lock"
	"github.com/grovestore/grove/internal/transport"
)

// TestEndToEndTreeSIGKILL: a tree on `grove up --processes`, made with the
// CLI; two loaders put keys through nodes 1 and 2 at once; node 2 is
// SIGKILLed mid-load, with the changes of its acknowledged puts in its
// cache and log only. The lock service keeps its leases until another
// node's B-tree server replays its log; loading through node 1 goes on.
// Every acknowledged key is then read back through the CLI on node 3 (get,
// scan, count), and through node 2 once it has restarted.
func TestEndToEndTreeSIGKILL(t *testing.T) {
	t.Parallel() // its own ports and directories: see parallelTests
	bin, u, ctx := startCluster(t, 8800, "--chunk-size", "64MiB")
	keepLogsOnFailure(t, u, "grove-e2e-tree")
	ep := func(id uint64) string { return "--endpoints=" + u.Nodes[id].GRPC }
	var r ran
	for start := time.Now(); time.Since(start) < 90*time.Second; time.Sleep(500 * time.Millisecond) {
		// The first call starts node 1's B-tree server (its log is made).
		if r = grove(t, bin, nil, "tree", "create", "e2e", "--fanout", "8", ep(1)); r.code == 0 || strings.Contains(r.stderr, "exists") {
			break
		}
	}
	if r.code != 0 {
		t.Fatalf("tree create: %v", r)
	}
	if r := grove(t, bin, nil, "tree", "list", "-o", "json", ep(3)); r.code != 0 || !strings.Contains(r.stdout, `"e2e"`) {
		t.Fatalf("tree list: %v", r)
	}
	// Through grove up's gateway, the CLI's default endpoint: it serves no
	// trees, and the commands go on to the nodes it lists (they failed
	// with "does not serve this call": the README's own example did).
	gw := "--endpoints=" + u.Gateway
	for _, c := range []struct {
		args []string
		out  string
	}{
		{[]string{"tree", "put", "e2e", "gw-key", "gw-value"}, ""},
		{[]string{"tree", "put", "e2e", "gw-key2", "v2", "--if-absent"}, ""},
		{[]string{"tree", "get", "e2e", "gw-key"}, "gw-value"},
		{[]string{"tree", "list"}, "e2e"},
		{[]string{"tree", "count", "e2e"}, "2"},
		{[]string{"tree", "del", "e2e", "gw-key"}, ""},
		{[]string{"tree", "del", "e2e", "gw-key2"}, ""},
	} {
		if r := grove(t, bin, nil, append(c.args, gw)...); r.code != 0 || !strings.Contains(r.stdout, c.out) {
			t.Fatalf("%v through the gateway: %v", c.args, r)
		}
	}
	// The loaders work through nodes 1 and 2; the one killed is the lock
	// master's, if it is one of them: the new master does not know what the
	// dead node's B-tree server held, and recovers it in "all" mode, which
	// blocks only B-tree names (the chunk managers' takeover, which the
	// replay needs, goes on). GROVE_E2E_TREE_VICTIM=master|other chooses.
	var ll LockListJSON
	if r := grove(t, bin, nil, "lock", "list", "-o", "json", ep(3)); r.code != 0 || json.Unmarshal([]byte(r.stdout), &ll) != nil {
		t.Fatalf("lock list: %v", r)
	}
	victim, survivor := uint64(2), uint64(1)
	if (ll.Master == 1) != (os.Getenv("GROVE_E2E_TREE_VICTIM") == "other") {
		victim, survivor = 1, 2
	}
	t.Logf("the lock master is node %d: node %d will be killed, node %d's loader goes on", ll.Master, victim, survivor)
	dial := func(id uint64) pb.TreeServiceClient {
		cc, err := grpc.NewClient(u.Nodes[id].GRPC, transport.DialOptions()...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return pb.NewTreeServiceClient(cc)
	}
	var mu sync.Mutex
	acked := map[string]string{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := map[uint64]error{}
	for _, id := range []uint64{1, 2} {
		wg.Add(1)
		go func(id uint64) {
			defer wg.Done()
			tc := dial(id)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k, v := fmt.Sprintf("key-%d-%05d", id, i), fmt.Sprintf("v%d", i)
				if i%8 == 4 {
					// Larger than half a node: the value goes to a chunk
					// of its own, which the replay's leaves name.
					v = strings.Repeat(v+".", 12000/len(v))
				}
				cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				_, err := tc.Put(cctx, &pb.TreePutRequest{Tree: "e2e", Key: []byte(k), Value: []byte(v)})
				cancel()
				mu.Lock()
				if err == nil {
					acked[k] = v
				} else {
					errs[id] = err
				}
				mu.Unlock()
				if err != nil {
					return // node 2's loader stops at its node's death
				}
			}
		}(id)
	}
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(acked)
	}
	countOf := func(id uint64) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for k := range acked {
			if strings.HasPrefix(k, fmt.Sprintf("key-%d-", id)) {
				n++
			}
		}
		return n
	}
	waitFor := func(n int) {
		t.Helper()
		for start := time.Now(); count() < n; time.Sleep(50 * time.Millisecond) {
			if time.Since(start) > 90*time.Second {
				t.Fatalf("only %d puts acknowledged (want %d); errors %v", count(), n, errs)
			}
		}
	}
	waitFor(300)
	// The victim must have acknowledged puts of its own (their changes in
	// its cache and log are what the replay must not lose). Before this
	// wait, a run in which node 2's first put had not been answered by the
	// time of the kill checked its first key as if acknowledged: the
	// "get misses a key the scan returned" of earlier sessions (the scan
	// check covers acknowledged keys only; that key was never one).
	for start := time.Now(); countOf(victim) < 50; time.Sleep(50 * time.Millisecond) {
		if time.Since(start) > 90*time.Second {
			t.Fatalf("node %d acknowledged only %d puts of its own in 90 s while node %d's loader went on (%d in all); errors %v", victim, countOf(victim), survivor, count(), errs)
		}
	}
	t.Logf("before the kill: node %d acknowledged %d puts, node %d %d", victim, countOf(victim), survivor, countOf(survivor))
	if err := u.Kill(victim); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	before := count()
	waitFor(before + 200) // the survivor goes on (its puts wait for the replay where they meet the dead node's leases)
	close(stop)
	wg.Wait()
	t.Logf("%d puts acknowledged (%d before node %d's SIGKILL); node %d went on, %d more within %v; node %d's loader stopped with %v",
		len(acked), before, victim, survivor, len(acked)-before, time.Since(killed).Round(time.Millisecond), victim, errs[victim])

	// Every acknowledged key, through the CLI on node 3.
	r = grove(t, bin, nil, "tree", "scan", "e2e", ep(3))
	if r.code != 0 {
		t.Fatalf("tree scan: %v", r)
	}
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		k, v, ok := strings.Cut(line, "\t")
		if !ok {
			t.Fatalf("scan line %q", line)
		}
		got[k] = v
	}
	for k, v := range acked {
		if got[k] != v {
			t.Fatalf("acknowledged %s=%s; the scan through node 3 has %q", k, v, got[k])
		}
	}
	// The survivors' metrics show the replay of the victim's log and
	// their caches at work.
	replays, hits, took, writes, deltas := 0.0, 0.0, 0.0, 0.0, 0.0
	for _, n := range u.Nodes {
		if n.ID == victim {
			continue
		}
		m := scrapeMetrics(t, n.GRPC)
		replays += m["grove_btree_replays_total{outcome=done}"]
		hits += m["grove_btree_cache_events_total{event=hit}"]
		took += m["grove_btree_replay_seconds_sum"]
		writes += m["grove_btree_replay_writes_total"]
		deltas += m["grove_btree_cache_events_total{event=delta}"]
		// (The CLI's puts go under tokens: their events are exported.)
		if _, ok := m["grove_btree_token_events_total{event=record_evicted}"]; !ok {
			t.Fatalf("node %d exports no grove_btree_token_events_total", n.ID)
		}
	}
	if replays == 0 || hits == 0 || deltas == 0 {
		t.Fatalf("the survivors' metrics: %v replays done, %v cache hits, %v node changes logged as deltas", replays, hits, deltas)
	}
	t.Logf("the survivors replayed node %d's log %v time(s): %.0f records applied in %.0f ms; they logged %.0f node changes as deltas", victim, replays, writes, took*1000, deltas)
	r = grove(t, bin, nil, "tree", "count", "e2e", ep(3))
	if n, err := strconv.Atoi(strings.TrimSpace(r.stdout)); r.code != 0 || err != nil || n != len(got) {
		t.Fatalf("tree count: %v (the scan has %d)", r, len(got))
	}
	for _, k := range []string{fmt.Sprintf("key-%d-00000", survivor), fmt.Sprintf("key-%d-00000", victim), fmt.Sprintf("key-%d-00004", victim)} {
		if _, ok := acked[k]; !ok {
			t.Fatalf("%s was not acknowledged", k) // (the waits above make sure it was)
		}
		if r := grove(t, bin, nil, "tree", "get", "e2e", k, ep(3)); r.code != 0 || strings.TrimSpace(r.stdout) != acked[k] {
			// Diagnose (an open defect seen about once in three CI runs
			// before, never since): is the miss transient, and do the
			// other nodes see the key?
			for i := 0; i < 3; i++ {
				time.Sleep(time.Second)
				t.Logf("get %s again through node 3: %v", k, grove(t, bin, nil, "tree", "get", "e2e", k, ep(3)))
			}
			t.Logf("through node %d: %v", survivor, grove(t, bin, nil, "tree", "get", "e2e", k, ep(survivor)))
			t.Logf("stat through node 3: %v", grove(t, bin, nil, "tree", "stat", "e2e", ep(3)))
			dumpDescent(t, ctx, u, "e2e", k)
			t.Fatalf("tree get %s: %v", k, r)
		}
	}
	if r := grove(t, bin, nil, "tree", "get", "e2e", "no-such-key", ep(3)); r.code != 5 || r.stdout != "" {
		t.Fatalf("a missing key: %v", r)
	}
	if r := grove(t, bin, nil, "tree", "get", "no-such-tree", "k", ep(3)); r.code != 5 {
		t.Fatalf("an unknown tree: %v", r)
	}
	if r := grove(t, bin, nil, "tree", "put", "e2e", strings.Repeat("k", 2000), "v", ep(3)); r.code != 2 {
		t.Fatalf("an oversized key: %v", r)
	}
	big := strings.Repeat("0123456789abcdef", 6<<10) // 96 KiB (an argument may have up to 128 KiB)
	if r := grove(t, bin, nil, "tree", "put", "e2e", "big", big, ep(3)); r.code != 0 {
		t.Fatalf("a 96 KiB value: %v", r)
	}
	if r := grove(t, bin, nil, "tree", "get", "e2e", "big", ep(survivor)); r.code != 0 || strings.TrimSpace(r.stdout) != big {
		t.Fatalf("the 96 KiB value through node %d: exit %d, %d bytes", survivor, r.code, len(r.stdout))
	}
	if r := grove(t, bin, nil, "tree", "del", "e2e", "big", ep(3)); r.code != 0 {
		t.Fatalf("deleting the 96 KiB value: %v", r)
	}
	if r := grove(t, bin, nil, "tree", "put", "e2e", "cas", "1", "--if-absent", ep(3)); r.code != 0 {
		t.Fatalf("put --if-absent: %v", r)
	}
	if r := grove(t, bin, nil, "tree", "put", "e2e", "cas", "2", "--if-absent", ep(3)); r.code != 1 {
		t.Fatalf("a second put --if-absent: %v", r)
	}
	if r := grove(t, bin, nil, "tree", "put", "e2e", "cas", "2", "--if-equals", "1", ep(3)); r.code != 0 {
		t.Fatalf("put --if-equals: %v", r)
	}
	var last []string // the three largest keys below key-2, largest first
	for k := range got {
		if k < "key-2" {
			last = append(last, k)
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(last)))
	if r := grove(t, bin, nil, "tree", "scan", "e2e", "--to", "key-2", "--limit", "3", "--reverse", "--keys-only", ep(survivor)); r.code != 0 ||
		strings.Join(strings.Fields(r.stdout), " ") != strings.Join(last[:3], " ") {
		t.Fatalf("a reverse scan (want %v): %v", last[:3], r)
	}

	// The dead node comes back: its server opens its (replayed) log and
	// reads.
	if err := u.Restart(victim); err != nil {
		t.Fatal(err)
	}
	waitTreeGet(t, bin, "e2e", fmt.Sprintf("key-%d-00000", victim), ep(victim), fmt.Sprintf("node %d after its restart", victim))
	if r := grove(t, bin, nil, "tree", "stat", "e2e", "-o", "json", ep(victim)); r.code != 0 || !strings.Contains(r.stdout, fmt.Sprintf(`"keys": %d`, len(got)+1)) ||
		!strings.Contains(r.stdout, `"value-chunks": `) || strings.Contains(r.stdout, `"value-chunks": 0,`) {
		t.Fatalf("tree stat (every 8th value is in a chunk of its own): %v", r)
	}
	// Exact, while the survivor runs on: an allocation of the survivor's
	// whose answer was lost as the victim (a chunk pair's primary) died
	// may have landed, tagged with the survivor's live log; the survivor's
	// stray collection frees it within seconds (btree.Cache.CollectStrays;
	// before it, two CI runs met one such chunk here).
	checkNoChunkLeaked(t, ctx, bin, u, "e2e", ep(victim))

	// The survivor stops cleanly (SIGTERM) and comes back: its close
	// writes back, checkpoints, frees its node pool and gives its leases
	// back (no recovery); its restart finds nothing to collect. Still no
	// chunk leaked.
	stopCleanly(t, u, survivor)
	if err := u.Restart(survivor); err != nil {
		t.Fatal(err)
	}
	waitTreeGet(t, bin, "e2e", fmt.Sprintf("key-%d-00000", survivor), ep(survivor), fmt.Sprintf("node %d after its clean stop and restart", survivor))
	checkNoChunkLeaked(t, ctx, bin, u, "e2e", ep(survivor))
	if r := grove(t, bin, nil, "tree", "drop", "e2e", ep(victim)); r.code != 0 {
		t.Fatalf("tree drop: %v", r)
	}
	if r := grove(t, bin, nil, "tree", "get", "e2e", "cas", ep(1)); r.code != 5 {
		t.Fatalf("a dropped tree: %v", r)
	}
}

// waitTreeGet waits (up to 90 s) until `grove tree get TREE KEY` through
// the node at ep succeeds: a restarted node's server is open and serving.
func waitTreeGet(t *testing.T, bin, tree, key, ep, what string) {
	t.Helper()
	for start := time.Now(); ; time.Sleep(500 * time.Millisecond) {
		r := grove(t, bin, nil, "tree", "get", tree, key, ep)
		if r.code == 0 {
			return
		}
		if time.Since(start) > 90*time.Second {
			t.Fatalf("%s: %v", what, r)
		}
	}
}

// checkNoChunkLeaked checks that the cluster's chunks (its one tree is
// their only user) are exactly the tree's: its nodes, its removed nodes
// waiting for their grace period, its values in chunks of their own, and
// its anchor, with the node chunks each server allocated ahead (its pool,
// as its tree stat reports it). What the SIGKILLed node's server had allocated and not
// linked (a put's value, a split's node, cut off by the kill) is freed by
// the recovery of its log, or by its restarted server (owned allocations):
// nothing leaks. Both sides are read again until they agree (the
// collections run in the background), for up to a minute.
func checkNoChunkLeaked(t *testing.T, ctx context.Context, bin string, u *bench.UpCluster, tree, ep string) {
	t.Helper()
	cl := chunk.NewClerk(upMeta(t, ctx, u))
	defer cl.Close()
	var last string
	for start := time.Now(); time.Since(start) < time.Minute; time.Sleep(time.Second) {
		type stat struct {
			Nodes, Removed uint64
			Values         uint64 `json:"value-chunks"`
			Pooled         uint64 `json:"pooled-chunks"`
		}
		var st stat
		pooled := uint64(0)
		ok := true
		for id := range u.Nodes {
			r := grove(t, bin, nil, "tree", "stat", tree, "-o", "json", "--endpoints="+u.Nodes[id].GRPC)
			var s stat
			if r.code != 0 || json.Unmarshal([]byte(r.stdout), &s) != nil {
				last, ok = fmt.Sprintf("tree stat through node %d: %v", id, r), false
				break
			}
			st, pooled = s, pooled+s.Pooled
		}
		if !ok {
			continue
		}
		tbl, err := cl.Table(ctx, true)
		if err != nil {
			last = err.Error()
			continue
		}
		var chunks uint64
		for _, id := range tbl.IDs() {
			p := tbl.Pairs[id]
			sr, err := cl.Stat(ctx, p.PrimaryNode(), id, 0)
			if err != nil || len(sr.Managers) != 1 || sr.Managers[0].Role != "primary" {
				ok = false
				last = fmt.Sprintf("pair %d's primary: %v %v", id, sr, err)
				break
			}
			chunks += sr.Managers[0].Chunks
		}
		if !ok {
			continue
		}
		want := st.Nodes + st.Removed + st.Values + 1 + pooled
		if chunks == want {
			t.Logf("no chunk leaked: %d chunks allocated = %d nodes + %d removed + %d values + the anchor + %d in the servers' pools", chunks, st.Nodes, st.Removed, st.Values, pooled)
			return
		}
		last = fmt.Sprintf("%d chunks allocated; the tree has %d nodes, %d removed, %d values and its anchor, the servers' pools %d (%d)", chunks, st.Nodes, st.Removed, st.Values, pooled, want)
	}
	// The evidence for the next engineer: how many chunks each node's log
	// still tags (its pool, links not yet disowned, and any allocation
	// whose answer was lost that no collection freed).
	var tagged []string
	for id := range u.Nodes {
		hs, err := cl.Owned(ctx, btree.OwnerLog(id), lock.Token{Epoch: ^lock.Epoch(0), Seq: ^uint64(0)})
		tagged = append(tagged, fmt.Sprintf("node %d's log: %d (%v)", id, len(hs), err))
	}
	sort.Strings(tagged)
	last += "; chunks tagged: " + strings.Join(tagged, ", ")
	t.Fatalf("chunks leaked: %s", last)
}

// dumpDescent logs, for the open defect's diagnosis, the path a lookup of
// key takes through tree's chunks (each node's bounds, right link, keys or
// children, and the child it follows), and what a walk of the chunks finds
// wrong. Images a server holds dirty are not in the chunks yet: read the
// tree through another node first (its shared leases make the holders
// write back).
func dumpDescent(t *testing.T, ctx context.Context, u *bench.UpCluster, tree, key string) {
	mc := upMeta(t, ctx, u)
	cl := chunk.NewClerk(mc)
	defer cl.Close()
	e, err := btree.LookupTree(ctx, mc, tree)
	if err != nil {
		t.Logf("dump: %v", err)
		return
	}
	r := btree.ChunkReader{Chunks: cl, Entry: e}
	sh, werr := btree.Walk(ctx, r, false)
	t.Logf("dump: walk of the chunks: height %d, %d keys, %d chunks, err %v", sh.Height, len(sh.Keys), len(sh.Chunks), werr)
	a, err := r.Anchor(ctx)
	if err != nil {
		t.Logf("dump: anchor: %v", err)
		return
	}
	t.Logf("dump: anchor root %v leftmost %v", a.Root, a.Leftmost)
	h := a.Root
	for steps := 0; steps < 64 && !h.IsZero(); steps++ {
		n, err := r.Read(ctx, h)
		if err != nil {
			t.Logf("dump: node %v: %v", h, err)
			return
		}
		t.Logf("dump: node %v v%d level %d low %q high %q (inf %v) right %v deleted %v keys %q kids %v", h, n.Version, n.Level, n.Low, n.High, n.HighInf, n.Right, n.Deleted, n.Keys, n.Kids)
		switch {
		case !n.HighInf && key >= string(n.High):
			h = n.Right
		case n.Leaf():
			return
		default:
			i := sort.Search(len(n.Keys), func(i int) bool { return string(n.Keys[i]) > key }) - 1
			if i < 0 {
				t.Logf("dump: the key is below node %v's first separator", h)
				return
			}
			h = n.Kids[i]
		}
	}
}
