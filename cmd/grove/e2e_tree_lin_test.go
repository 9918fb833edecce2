package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/grovestore/grove/api/etcdpb"
	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/client"
	"github.com/grovestore/grove/internal/bench"
	"github.com/grovestore/grove/internal/btree"
	"github.com/grovestore/grove/internal/btree/lincheck"
	"github.com/grovestore/grove/internal/transport"
)

// TestEndToEndTreeLinearizable is the real-process counterpart of the
// B-tree simulator: what runs here is what users run — `grove up
// --processes`, the public Go client with its routing and retries, the
// B-tree service, the real lock service (master, standbys, recovery runs),
// the config service, the chunk store and the log on real disks. Four
// clients (one routed over every node, two pinned to one node each without
// routing, one routed over two nodes) put, conditionally put and delete,
// get, count and scan (one atomic page, through the gRPC API) on one tree
// of 12 keys with fanout 4 (splits and merges all the time; a sixth of the
// values are large enough for chunks of their own); two etcd clients put,
// get and delete (with prev_kv) through random nodes' etcd endpoints, whose
// calls are forwarded to the etcd tree's home. Meanwhile a seeded fault
// schedule SIGKILLs one node and restarts it, stops one node cleanly
// (SIGTERM: its B-tree server must close without leaving its leases to a
// recovery) and restarts it, SIGSTOPs one node for up to
// three times the failure detector's grace period (it is declared dead,
// its log is replayed elsewhere, and it fences itself when it resumes), or
// SIGKILLs every node at once and restarts them (the new lock master
// recovers every B-tree server before granting). After the faults, every
// key is read through every node; each history is checked with porcupine
// (package lincheck: a write that failed without saying whether it took
// effect stays open-ended; one the client reports as ErrUnavailable must
// have changed nothing and is left out, so a false report shows), and the
// tree is walked (grove tree stat's walker: keys in order, high keys,
// right links, separators).
//
// GROVE_SEED=S replays round 1's fault and operation choices (the
// interleaving is the machine's); GROVE_TREE_LIN_ROUNDS=N runs N rounds on
// the same cluster (seeds S, S+1, ...), each on a new tree; the default is
// one round of four faults.
func TestEndToEndTreeLinearizable(t *testing.T) {
	seed := time.Now().UnixNano() % 1_000_000
	if s := os.Getenv("GROVE_SEED"); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		seed = v
	}
	rounds := 1
	if s := os.Getenv("GROVE_TREE_LIN_ROUNDS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil {
			t.Fatal(err)
		}
		rounds = v
	}
	_, u, _ := startCluster(t, 8300, "--chunk-size", "64MiB")
	keepLogsOnFailure(t, u, "grove-e2e-lin")
	for r := 0; r < rounds; r++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		res, err := linRound(t, ctx, u, seed+int64(r))
		cancel()
		if err != nil {
			// Each node's goroutines go to its log (kept by
			// keepLogsOnFailure): a Go process dumps them on SIGQUIT.
			for _, n := range u.Nodes {
				_ = syscall.Kill(n.PID, syscall.SIGQUIT)
			}
			time.Sleep(2 * time.Second)
			t.Fatalf("seed %d (GROVE_SEED=%d replays its choices): %v", seed+int64(r), seed+int64(r), err)
		}
		t.Logf("seed %d: %s", seed+int64(r), res)
	}
}

// linKeys keys, "k00".."k11": few, so that operations meet on them.
const linKeys = 12

func linKey(i int) string { return fmt.Sprintf("k%02d", i) }

// linValue is the value written for name: name itself, or, for a sixth of
// the names, name and filler that make it larger than half a node, so that
// it goes to a chunk of its own. linName reads the name back, checking the
// filler (a torn or mixed-up value shows as a name no write used).
func linValue(name string) []byte {
	sum := 0
	for _, c := range name {
		sum += int(c)
	}
	if sum%6 != 0 {
		return []byte(name)
	}
	return []byte(name + "|" + strings.Repeat(name+".", 5000/(len(name)+1)))
}

func linName(v []byte) string {
	name, fill, ok := strings.Cut(string(v), "|")
	if !ok {
		return name
	}
	if fill != strings.Repeat(name+".", 5000/(len(name)+1)) {
		return "CORRUPT(" + name + ")"
	}
	return name
}

type linWorld struct {
	t     *testing.T
	u     *bench.UpCluster
	tree  string
	start time.Time
	h     lincheck.History
	// eh is the history of the etcd clients, on the etcd endpoint's tree
	// (keys "r<seed>/kNN": a new set each round).
	eh     lincheck.History
	prefix string

	mu      sync.Mutex
	events  []string
	written []string // values written so far (CompareAndSwap expects one)
	// notApplied: writes the client reported as ErrUnavailable (nothing
	// changed); dropped: reads that failed.
	notApplied, dropped int
}

func (w *linWorld) now() int64 { return int64(time.Since(w.start)) }

func (w *linWorld) event(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.events = append(w.events, fmt.Sprintf("EVENT %d ", w.now()/1000)+fmt.Sprintf(format, args...))
}

// linClient is one client: its Go client and a raw gRPC client per node
// (for scans, whose pages the Go client's iterator does not show).
type linClient struct {
	id   int
	c    *client.Client
	raw  []pb.TreeServiceClient
	etcd []etcdpb.KVClient // an etcd client (c nil): a node's endpoint per call
	r    *rand.Rand
}

func linRound(t *testing.T, ctx context.Context, u *bench.UpCluster, seed int64) (_ string, err error) {
	w := &linWorld{t: t, u: u, tree: fmt.Sprintf("lin-%d", seed), start: time.Now()}
	defer func() {
		if err != nil {
			w.mu.Lock()
			for _, e := range w.events {
				t.Log(e)
			}
			w.mu.Unlock()
		}
	}()
	r := rand.New(rand.NewSource(seed))
	eps := []string{u.Nodes[1].GRPC, u.Nodes[2].GRPC, u.Nodes[3].GRPC}
	var raw []pb.TreeServiceClient
	var etcd []etcdpb.KVClient
	for _, ep := range eps {
		cc, err := grpc.NewClient(ep, transport.DialOptions()...)
		if err != nil {
			return "", err
		}
		defer cc.Close()
		raw = append(raw, pb.NewTreeServiceClient(cc))
		etcd = append(etcd, etcdpb.NewKVClient(cc))
	}
	dial := func(opts client.Options, eps ...string) *client.Client {
		c, err := client.DialOptions(ctx, opts, eps...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	clients := []*linClient{
		{c: dial(client.Options{}, eps...)},
		{c: dial(client.Options{NoRouting: true}, eps[0])},
		{c: dial(client.Options{NoRouting: true}, eps[1])},
		{c: dial(client.Options{}, eps[2], eps[0])},
		// Two etcd clients, each call through a random node's endpoint
		// (forwarded to the etcd tree's home).
		{etcd: etcd},
		{etcd: etcd},
	}
	for i, c := range clients {
		c.id, c.raw, c.r = i, raw, rand.New(rand.NewSource(seed*100+int64(i)))
	}
	w.prefix = fmt.Sprintf("r%d/", seed)
	if err := u.WaitAllHeard(ctx); err != nil {
		return "", err
	}
	for start := time.Now(); ; time.Sleep(500 * time.Millisecond) {
		err := clients[0].c.CreateTree(ctx, w.tree, client.TreeOptions{Fanout: 4})
		if err == nil || errors.Is(err, client.ErrExists) {
			break
		}
		if time.Since(start) > 90*time.Second {
			return "", fmt.Errorf("create: %v", err)
		}
	}
	w.event("tree %s created", w.tree)

	faultsDone := make(chan struct{})
	var faults []string
	go func() {
		defer close(faultsDone)
		faults = w.faults(ctx, r, 4)
	}()
	var wg sync.WaitGroup
	for _, c := range clients {
		wg.Add(1)
		go func(c *linClient) {
			defer wg.Done()
			// Operations go on until the faults are over and at least 60
			// were made, at most 400 (porcupine's work grows with them).
			for i := 0; i < 400 && ctx.Err() == nil; i++ {
				select {
				case <-faultsDone:
					if i >= 60 {
						return
					}
				default:
				}
				w.op(ctx, c, i)
				time.Sleep(time.Duration(c.r.Intn(30)) * time.Millisecond)
			}
		}(c)
	}
	wg.Wait()
	<-faultsDone
	w.event("the load is over: %d operations recorded", len(w.h.Ops()))
	if ctx.Err() != nil {
		return "", fmt.Errorf("the round ran out of time: %v", ctx.Err())
	}

	// Every node back and heard; then every key read through every node
	// (a client per node, no routing), the last operations of the history.
	if err := u.WaitAllHeard(ctx); err != nil {
		return "", err
	}
	finalKeys := map[int]int{} // keys each node's final reads found
	for n := 1; n <= 3; n++ {
		c := dial(client.Options{NoRouting: true}, eps[n-1])
		tr := c.Tree(w.tree)
		for k := 0; k < linKeys; k++ {
			key := linKey(k)
			for attempt := 0; ; attempt++ {
				call := w.now()
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				v, err := tr.Get(cctx, []byte(key))
				cancel()
				if err == nil || errors.Is(err, client.ErrNotFound) {
					w.h.Add(10+n, lincheck.In{Kind: "get", Key: key}, lincheck.Out{Found: err == nil, Val: linName(v)}, call, w.now(), "final read, node ", n)
					if err == nil {
						finalKeys[n]++
					}
					break
				}
				if attempt == 60 {
					return "", fmt.Errorf("node %d: the final read of %s failed for a minute: %v", n, key, err)
				}
				time.Sleep(time.Second)
			}
		}
	}
	for n := 1; n <= 3; n++ { // and the whole tree, one page through each node
		var resp *pb.TreeScanResponse
		var call int64
		for attempt := 0; ; attempt++ {
			// (this connection may still be in its reconnection backoff
			// after the node's restart)
			call = w.now()
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			var err error
			resp, err = raw[n-1].Scan(cctx, &pb.TreeScanRequest{Tree: w.tree}, grpc.WaitForReady(true))
			cancel()
			if err == nil {
				break
			}
			if attempt == 6 {
				return "", fmt.Errorf("node %d: the final scan: %v", n, err)
			}
		}
		out := lincheck.Out{Lo: string(resp.Lo), Hi: string(resp.Hi), HiInf: resp.HiUnbounded, More: resp.More}
		for j, k := range resp.Keys {
			out.Keys = append(out.Keys, string(k))
			out.Vals = append(out.Vals, linName(resp.Values[j]))
		}
		w.h.Add(20+n, lincheck.In{Kind: "scan"}, out, call, w.now(), "final scan, node ", n)
	}
	// The etcd clients' keys, read through every node's endpoint.
	for n := 1; n <= 3; n++ {
		for k := 0; k < linKeys; k++ {
			key := w.prefix + linKey(k)
			for attempt := 0; ; attempt++ {
				call := w.now()
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				resp, err := etcd[n-1].Range(cctx, &etcdpb.RangeRequest{Key: []byte(key)}, grpc.WaitForReady(true))
				cancel()
				if err == nil {
					out := lincheck.Out{Found: len(resp.Kvs) > 0}
					if out.Found {
						out.Val = linName(resp.Kvs[0].Value)
					}
					w.eh.Add(10+n, lincheck.In{Kind: "get", Key: key}, out, call, w.now(), "final etcd read, node ", n)
					break
				}
				if attempt == 60 {
					return "", fmt.Errorf("node %d: the final etcd read of %s failed for a minute: %v", n, key, err)
				}
				time.Sleep(time.Second)
			}
		}
	}
	ops := w.h.Ops()
	eops := w.eh.Ops()
	unknown := lincheck.Unknown(ops) + lincheck.Unknown(eops)
	for _, x := range []struct {
		what  string
		model porcupine.Model
		ops   []porcupine.Operation
	}{{"tree", lincheck.Model, ops}, {"etcd", lincheck.PointModel, eops}} {
		check, info := porcupine.CheckOperationsVerbose(x.model, x.ops, 90*time.Second)
		if check == porcupine.Ok {
			continue
		}
		for _, l := range lincheck.Explain(x.ops, 10*time.Second) {
			t.Log(l)
		}
		w.mu.Lock()
		events := append([]string(nil), w.events...)
		w.mu.Unlock()
		path := filepath.Join(os.TempDir(), fmt.Sprintf("grove-e2e-lin-%d-%s.txt", seed, x.what))
		if err := lincheck.WriteFailure(path, x.ops, info, events); err == nil {
			t.Logf("the history and the faults are in %s, the visualization in %s.html", path, path)
		}
		if check == porcupine.Unknown {
			return "", fmt.Errorf("porcupine timed out on the %s clients' %d operations (%d of unknown outcome)", x.what, len(x.ops), lincheck.Unknown(x.ops))
		}
		return "", fmt.Errorf("the %s clients' history of %d operations (%d of unknown outcome) is not linearizable; faults: %s", x.what, len(x.ops), lincheck.Unknown(x.ops), strings.Join(faults, "; "))
	}
	// The walker: grove tree stat walks every node through the answering
	// node's cache and fails on a broken order, high key, right link or
	// separator.
	var st *pb.TreeStatResponse
	for n := 1; n <= 3; n++ {
		var err error
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		st, err = raw[n-1].Stat(cctx, &pb.TreeStatRequest{Tree: w.tree}, grpc.WaitForReady(true))
		cancel()
		if err != nil {
			return "", fmt.Errorf("walking the tree through node %d: %v", n, err)
		}
	}
	if int(st.Keys) != finalKeys[3] { // (st: node 3's walk)
		return "", fmt.Errorf("the walk through node 3 found %d keys, its final reads %d", st.Keys, finalKeys[3])
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return fmt.Sprintf("%d operations, %d of them through etcd (%d writes of unknown outcome, %d reported not applied, %d reads failed), faults: %s; then height %d, %d nodes, %d keys, %d missing downlinks",
		len(ops)+len(eops), len(eops), unknown, w.notApplied, w.dropped, strings.Join(faults, "; "), st.Height, st.Nodes, st.Keys, st.MissingDownlinks), nil
}

// op makes one random operation through c and records it.
func (w *linWorld) op(ctx context.Context, c *linClient, i int) {
	if c.etcd != nil {
		w.etcdOp(ctx, c, i)
		return
	}
	r := c.r
	in := lincheck.In{Key: linKey(r.Intn(linKeys))}
	w.mu.Lock()
	var eq string
	if len(w.written) > 0 {
		eq = w.written[len(w.written)-1-r.Intn(min(len(w.written), 8))]
	}
	w.mu.Unlock()
	switch x := r.Intn(100); {
	case x < 35:
		in.Kind, in.Val = "put", fmt.Sprintf("c%d.%d", c.id, i)
		switch r.Intn(6) {
		case 0:
			in.Cond = lincheck.IfAbsent
		case 1, 2:
			in.Cond, in.Eq = lincheck.IfEquals, eq
		}
	case x < 55:
		in.Kind = "del"
		if r.Intn(4) == 0 {
			in.Cond, in.Eq = lincheck.IfEquals, eq
		}
	case x < 75:
		in.Kind = "get"
	case x < 92:
		in.Kind, in.Limit, in.Reverse = "scan", r.Intn(6), r.Intn(2) == 0
		a, b := r.Intn(linKeys+1), r.Intn(linKeys+1)
		if a > b {
			a, b = b, a
		}
		if a > 0 {
			in.From = linKey(a)
		}
		if b < linKeys && b > a {
			in.To = linKey(b)
		}
	default:
		in.Kind = "count"
		a := r.Intn(linKeys)
		in.From, in.To = linKey(a), linKey(a+1+r.Intn(linKeys-a))
	}
	node := r.Intn(3)
	cctx, cancel := context.WithTimeout(ctx, 4*time.Second)
	defer cancel()
	tr := c.c.Tree(w.tree)
	var out lincheck.Out
	var err error
	call := w.now()
	switch in.Kind {
	case "get":
		var v []byte
		v, err = tr.Get(cctx, []byte(in.Key))
		if errors.Is(err, client.ErrNotFound) {
			err = nil
		} else if err == nil {
			out.Found, out.Val = true, linName(v)
		}
	case "put":
		v := linValue(in.Val)
		switch in.Cond {
		case lincheck.Always:
			err = tr.Put(cctx, []byte(in.Key), v)
			out.Applied, out.NoPrev = true, true
		case lincheck.IfAbsent:
			out.Applied, err = tr.PutIfAbsent(cctx, []byte(in.Key), v)
			out.NoPrev = true
		case lincheck.IfEquals:
			var cur []byte
			out.Applied, cur, out.Found, err = tr.CompareAndSwap(cctx, []byte(in.Key), linValue(in.Eq), v)
			out.Prev = linName(cur)
		}
	case "del":
		if in.Cond == lincheck.IfEquals {
			out.Applied, err = tr.CompareAndDelete(cctx, []byte(in.Key), linValue(in.Eq))
			out.NoPrev = true
		} else {
			out.Found, err = tr.Delete(cctx, []byte(in.Key))
			out.Applied, out.NoPrev = out.Found, true
		}
	case "count":
		var n uint64
		n, err = tr.Count(cctx, client.Range{From: []byte(in.From), To: []byte(in.To)})
		out.Count = int(n)
	case "scan":
		var resp *pb.TreeScanResponse
		resp, err = c.raw[node].Scan(cctx, &pb.TreeScanRequest{Tree: w.tree, From: []byte(in.From), To: []byte(in.To), HasTo: in.To != "", Limit: uint32(in.Limit), Reverse: in.Reverse})
		if err == nil {
			for j, k := range resp.Keys {
				out.Keys = append(out.Keys, string(k))
				out.Vals = append(out.Vals, linName(resp.Values[j]))
			}
			out.Lo, out.Hi, out.HiInf, out.More = string(resp.Lo), string(resp.Hi), resp.HiUnbounded, resp.More
		}
	}
	ret := w.now()
	if time.Duration(ret-call) > 2*time.Second {
		w.event("client %d: %s of %s took %v: %v", c.id, in.Kind, in.Key, time.Duration(ret-call).Round(time.Millisecond), err)
	}
	if in.Kind == "put" || in.Kind == "del" {
		if err == nil && in.Kind == "put" {
			w.mu.Lock()
			w.written = append(w.written, in.Val)
			w.mu.Unlock()
		}
		switch {
		case err == nil:
			w.h.Add(c.id, in, out, call, ret, "client ", c.id)
		case errors.Is(err, client.ErrUnavailable):
			// The client says nothing was changed: left out, so that a
			// write it did make shows as a value no operation wrote.
			w.mu.Lock()
			w.notApplied++
			w.mu.Unlock()
		default:
			w.h.Add(c.id, in, lincheck.Out{Unknown: true}, call, math.MaxInt64, "client ", c.id, " err ", err)
			w.mu.Lock()
			w.written = append(w.written, in.Val)
			w.mu.Unlock()
		}
		return
	}
	if err != nil {
		w.mu.Lock()
		w.dropped++
		w.mu.Unlock()
		return
	}
	w.h.Add(c.id, in, out, call, ret, "client ", c.id)
}

// etcdOp makes one random put, get or delete through a random node's etcd
// endpoint and records it in w.eh. The puts and deletes ask for the
// previous value (prev_kv), which the model checks. Every failed write is
// of unknown outcome (etcd's errors do not say), every failed read dropped.
func (w *linWorld) etcdOp(ctx context.Context, c *linClient, i int) {
	r := c.r
	in := lincheck.In{Key: w.prefix + linKey(r.Intn(linKeys))}
	switch x := r.Intn(10); {
	case x < 4:
		in.Kind, in.Val = "put", fmt.Sprintf("e%d.%d", c.id, i)
	case x < 6:
		in.Kind = "del"
	default:
		in.Kind = "get"
	}
	kv := c.etcd[r.Intn(len(c.etcd))]
	cctx, cancel := context.WithTimeout(ctx, 4*time.Second)
	defer cancel()
	var out lincheck.Out
	var err error
	call := w.now()
	switch in.Kind {
	case "put":
		var resp *etcdpb.PutResponse
		resp, err = kv.Put(cctx, &etcdpb.PutRequest{Key: []byte(in.Key), Value: linValue(in.Val), PrevKv: true})
		if err == nil {
			out.Applied = true
			if resp.PrevKv != nil {
				out.Found, out.Prev = true, linName(resp.PrevKv.Value)
			}
		}
	case "del":
		var resp *etcdpb.DeleteRangeResponse
		resp, err = kv.DeleteRange(cctx, &etcdpb.DeleteRangeRequest{Key: []byte(in.Key), PrevKv: true})
		if err == nil {
			out.Applied, out.Found = resp.Deleted > 0, resp.Deleted > 0
			if len(resp.PrevKvs) > 0 {
				out.Prev = linName(resp.PrevKvs[0].Value)
			}
		}
	case "get":
		var resp *etcdpb.RangeResponse
		resp, err = kv.Range(cctx, &etcdpb.RangeRequest{Key: []byte(in.Key)})
		if err == nil && len(resp.Kvs) > 0 {
			out.Found, out.Val = true, linName(resp.Kvs[0].Value)
		}
	}
	ret := w.now()
	if time.Duration(ret-call) > 2*time.Second {
		w.event("etcd client %d: %s of %s took %v: %v", c.id, in.Kind, in.Key, time.Duration(ret-call).Round(time.Millisecond), err)
	}
	switch {
	case err == nil:
		w.eh.Add(c.id, in, out, call, ret, "etcd client ", c.id)
	case in.Kind != "get" && notSent(err):
		// Refused before any change: left out, as the Go client's
		// ErrUnavailable.
		w.mu.Lock()
		w.notApplied++
		w.mu.Unlock()
	case in.Kind != "get":
		w.eh.Add(c.id, in, lincheck.Out{Unknown: true}, call, math.MaxInt64, "etcd client ", c.id, " err ", err)
	default:
		w.mu.Lock()
		w.dropped++
		w.mu.Unlock()
	}
}

// notSent says whether an etcd call's error shows that it changed nothing:
// the node's service refused it before any change (btree.NotAppliedError),
// or gRPC never sent it (no connection to the node).
func notSent(err error) bool {
	st := status.Convert(err)
	return btree.IsNotApplied(st) || st.Code() == codes.Unavailable && strings.Contains(st.Message(), "while dialing")
}

// faults runs n faults one after another, each begun 1–3 s after the last
// one healed: a node SIGKILLed and restarted 0.5–3 s later; a node
// stopped cleanly (SIGTERM) and restarted 0.2–2 s after it exited; a node
// SIGSTOPped for 0.2–3 s (the failure detector's grace period is 1 s); at
// most once, every node SIGKILLed at once and restarted. It returns what
// it did.
func (w *linWorld) faults(ctx context.Context, r *rand.Rand, n int) []string {
	var did []string
	sleep := func(lo, hi time.Duration) time.Duration {
		d := lo + time.Duration(r.Int63n(int64(hi-lo)))
		bench.SleepCtx(ctx, d)
		return d
	}
	killedAll := false
	for f := 0; f < n && ctx.Err() == nil; f++ {
		sleep(time.Second, 3*time.Second)
		id := uint64(1 + r.Intn(3))
		switch x := r.Intn(10); {
		case x >= 8 && !killedAll:
			killedAll = true
			w.event("SIGKILL every node")
			for id := uint64(1); id <= 3; id++ {
				_ = syscall.Kill(w.u.Nodes[id].PID, syscall.SIGKILL)
			}
			for id := uint64(1); id <= 3; id++ {
				if err := w.u.Kill(id); err != nil && !strings.Contains(err.Error(), "no such process") {
					w.t.Errorf("kill node %d: %v", id, err)
				}
			}
			d := sleep(500*time.Millisecond, time.Second)
			for id := uint64(1); id <= 3; id++ {
				if err := w.u.Restart(id); err != nil {
					w.t.Errorf("restart node %d: %v", id, err)
				}
			}
			w.event("every node restarted")
			did = append(did, fmt.Sprintf("every node killed for %v", d.Round(time.Millisecond)))
		case x == 3:
			// A clean stop: the B-tree server refuses new commits, writes
			// every dirty node back, checkpoints its log and gives every
			// lease back (no recovery), while calls keep arriving.
			w.event("SIGTERM node %d", id)
			stopCleanly(w.t, w.u, id)
			d := sleep(200*time.Millisecond, 2*time.Second)
			if err := w.u.Restart(id); err != nil {
				w.t.Errorf("restart node %d: %v", id, err)
			}
			w.event("node %d restarted", id)
			did = append(did, fmt.Sprintf("node %d stopped (SIGTERM) for %v", id, d.Round(time.Millisecond)))
		case x < 4 || x >= 8:
			w.event("SIGKILL node %d", id)
			if err := w.u.Kill(id); err != nil {
				w.t.Errorf("kill node %d: %v", id, err)
			}
			d := sleep(500*time.Millisecond, 3*time.Second)
			if err := w.u.Restart(id); err != nil {
				w.t.Errorf("restart node %d: %v", id, err)
			}
			w.event("node %d restarted", id)
			did = append(did, fmt.Sprintf("node %d killed for %v", id, d.Round(time.Millisecond)))
		default:
			pid := w.u.Nodes[id].PID
			w.event("SIGSTOP node %d", id)
			_ = syscall.Kill(pid, syscall.SIGSTOP)
			d := sleep(200*time.Millisecond, 3*time.Second)
			_ = syscall.Kill(pid, syscall.SIGCONT)
			w.event("SIGCONT node %d", id)
			did = append(did, fmt.Sprintf("node %d paused for %v", id, d.Round(time.Millisecond)))
		}
	}
	return did
}
