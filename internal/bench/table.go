package bench

import (
	"bytes"
	"context"
	"encoding/csv"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/grovestore/grove/internal/ddstable"
	"github.com/grovestore/grove/internal/meta"
	"github.com/grovestore/grove/internal/ports"
)

// TableOptions shape the DDS hash-table benchmark (DDS §5.1, Figure 4).
type TableOptions struct {
	// Outstanding: operations each client keeps in flight (DDS: "a
	// pipeline of 100 operations"), one list entry per cell.
	Outstanding []int
	Clients     int // libraries (DDS: service instances)
	Partitions  int
	Replicas    int // DDS §5.1: 2
	ValueSize   int // DDS §5.1: 150 bytes
	Keys        int // the key space, loaded before the gets
	Duration    time.Duration
	Rounds      int
	// Redis adds the peer: redis-server on loopback (no persistence, as
	// DDS's bricks keep their replicas in memory; one instance, no
	// replica) driven by redis-benchmark with the same value size and as
	// many connections as the cell has operations in flight.
	Redis bool
	// ValueSizes, if set, adds DDS's Figure 7: gets at the largest
	// Outstanding after the table's keys were written again with each
	// size (and redis's, its keys SET with that size first).
	ValueSizes []int
	// RecoveryKeys, if not 0, adds DDS's Figure 8 (availability and
	// recovery) with a partition of that many keys (tableRecovery).
	RecoveryKeys int
}

// TableCell is one measurement: operations per second, all clients.
type TableCell struct {
	System      string // grove or redis
	Op          string // put or get
	Outstanding int    // in flight, all clients together
	ValueSize   int    // bytes
	OpsPerS     float64
	P50         time.Duration
}

// TableResults are the benchmark's cells, and the table's maintenance
// on the loaded table: a checkpoint (every replica written to disk,
// synced; writes wait meanwhile), a split of one partition and its merge
// back; and redis's SAVE of its data set (an fsynced dump) as the peer's.
type TableResults struct {
	Cells           []TableCell
	Nodes           int
	Checkpoint      time.Duration
	CheckpointBytes int64 // every replica's files
	Split, Merge    time.Duration
	// Move: a replica of one partition moved to the node outside its
	// group (the copy, the hand-off, the swap), MoveBytes its values; 0
	// when every node holds every partition.
	Move           time.Duration
	MoveBytes      int64
	Timeline       []TableSample // DDS's Figure 8, if asked
	RedisSave      time.Duration
	RedisSaveBytes int64
}

// TableBench runs puts and gets of random 64-bit keys on a 3-node
// in-process cluster (every node a brick) through Clients libraries,
// each with the cell's operations in flight, for Duration, Rounds times
// (medians); then, if asked, redis at the same concurrency.
func TableBench(ctx context.Context, dir string, o TableOptions, progress io.Writer) (*TableResults, error) {
	c, err := StartCluster(filepath.Join(dir, "cluster"), 3, ClusterOptions{})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	mc := meta.NewClient(c.Members())
	defer mc.Close()
	for {
		ns, err := mc.Read(ctx, meta.NodesNamespace)
		if err == nil {
			if b, err := ddstable.Bricks(ns); err == nil && len(b) >= 3 {
				break
			}
		}
		if !sleepCtx(ctx, 100*time.Millisecond) {
			return nil, ctx.Err()
		}
	}
	if _, err := ddstable.CreateTable(ctx, mc, "bench", o.Partitions, o.Replicas); err != nil {
		return nil, err
	}
	libs := make([]*ddstable.Library, o.Clients)
	for i := range libs {
		libs[i] = ddstable.NewLibrary(ddstable.LibraryConfig{Meta: mc})
		defer libs[i].Close()
	}
	value := bytes.Repeat([]byte("v"), o.ValueSize)
	fmt.Fprintf(progress, "loading %d keys of %d bytes\n", o.Keys, o.ValueSize)
	if err := runTableLoad(ctx, libs, 16, 0, func(lib *ddstable.Library, i int) error {
		if i >= o.Keys {
			return errStop
		}
		return lib.Put(ctx, "bench", uint64(i)*0x9E3779B97F4A7C15, value)
	}, nil); err != nil {
		return nil, err
	}
	res := &TableResults{Nodes: 3}
	for _, out := range o.Outstanding {
		for _, op := range []string{"put", "get"} {
			var rates []float64
			var p50s []time.Duration
			for r := 0; r < o.Rounds; r++ {
				var lats []time.Duration
				var mu sync.Mutex
				start := time.Now()
				n := 0
				err := runTableLoad(ctx, libs, out, o.Duration, func(lib *ddstable.Library, _ int) error {
					k := uint64(rand.IntN(o.Keys)) * 0x9E3779B97F4A7C15
					t0 := time.Now()
					var err error
					if op == "put" {
						err = lib.Put(ctx, "bench", k, value)
					} else {
						_, _, err = lib.Get(ctx, "bench", k)
					}
					mu.Lock()
					lats = append(lats, time.Since(t0))
					n++
					mu.Unlock()
					return err
				}, nil)
				if err != nil {
					return nil, err
				}
				rate := float64(n) / time.Since(start).Seconds()
				slices.Sort(lats)
				rates = append(rates, rate)
				if len(lats) > 0 {
					p50s = append(p50s, lats[len(lats)/2])
				}
				fmt.Fprintf(progress, "grove %s, %d in flight: round %d: %.0f/s\n", op, out, r+1, rate)
			}
			res.Cells = append(res.Cells, TableCell{System: "grove", Op: op, Outstanding: out, ValueSize: o.ValueSize, OpsPerS: medianF(rates), P50: medianOrZero(p50s)})
		}
	}
	if err := tableMaintenance(ctx, c, mc, res, progress); err != nil {
		return nil, err
	}
	for _, size := range o.ValueSizes {
		cell, err := tableValueSize(ctx, libs, o, size, progress)
		if err != nil {
			return nil, err
		}
		res.Cells = append(res.Cells, cell)
	}
	if o.RecoveryKeys > 0 {
		if res.Timeline, err = tableRecovery(ctx, c, mc, libs, o, progress); err != nil {
			return nil, err
		}
	}
	if o.Redis {
		cells, err := redisBench(ctx, o, res, progress)
		if err != nil {
			return nil, err
		}
		res.Cells = append(res.Cells, cells...)
	}
	return res, nil
}

// tableValueSize is one point of DDS's Figure 7: the table's keys
// written again with values of size bytes, then gets at the largest
// Outstanding, Rounds times (median).
func tableValueSize(ctx context.Context, libs []*ddstable.Library, o TableOptions, size int, progress io.Writer) (TableCell, error) {
	value := bytes.Repeat([]byte("v"), size)
	if err := runTableLoad(ctx, libs, 16, 0, func(lib *ddstable.Library, i int) error {
		if i >= o.Keys {
			return errStop
		}
		return lib.Put(ctx, "bench", uint64(i)*0x9E3779B97F4A7C15, value)
	}, nil); err != nil {
		return TableCell{}, err
	}
	out := slices.Max(o.Outstanding)
	var rates []float64
	var p50s []time.Duration
	for r := 0; r < o.Rounds; r++ {
		var lats []time.Duration
		var mu sync.Mutex
		start := time.Now()
		err := runTableLoad(ctx, libs, out, o.Duration, func(lib *ddstable.Library, _ int) error {
			k := uint64(rand.IntN(o.Keys)) * 0x9E3779B97F4A7C15
			t0 := time.Now()
			_, _, err := lib.Get(ctx, "bench", k)
			mu.Lock()
			lats = append(lats, time.Since(t0))
			mu.Unlock()
			return err
		}, nil)
		if err != nil {
			return TableCell{}, err
		}
		rates = append(rates, float64(len(lats))/time.Since(start).Seconds())
		slices.Sort(lats)
		if len(lats) > 0 {
			p50s = append(p50s, lats[len(lats)/2])
		}
	}
	c := TableCell{System: "grove", Op: "get", Outstanding: out, ValueSize: size, OpsPerS: medianF(rates), P50: medianOrZero(p50s)}
	fmt.Fprintf(progress, "grove get, %d-byte values, %d in flight: %.0f/s (%.1f MB/s)\n", size, out, c.OpsPerS, c.OpsPerS*float64(size)/1e6)
	return c, nil
}

// tableMaintenance times a checkpoint, a split and a merge of the loaded
// table, each from its request to the decree that ends it.
func tableMaintenance(ctx context.Context, c *InProcessCluster, mc *meta.Client, res *TableResults, progress io.Writer) error {
	wait := func(what string, done func(*ddstable.Maps) (bool, error)) error {
		for {
			ts, err := ddstable.ListTables(ctx, mc)
			if err == nil && len(ts) == 1 {
				ok, err := done(ts[0])
				if err != nil || ok {
					return err
				}
			}
			if !sleepCtx(ctx, 5*time.Millisecond) {
				return fmt.Errorf("%s: %w", what, ctx.Err())
			}
		}
	}
	start := time.Now()
	m, err := ddstable.RequestCheckpoint(ctx, mc, "bench")
	if err != nil {
		return err
	}
	id := m.Freeze.ID
	if err := wait("checkpoint", func(m *ddstable.Maps) (bool, error) {
		if m.Freeze.ID != id && m.Checkpoint.ID != id {
			return false, fmt.Errorf("checkpoint %d given up", id)
		}
		return m.Checkpoint.ID == id, nil
	}); err != nil {
		return err
	}
	res.Checkpoint = time.Since(start)
	for _, n := range c.Nodes {
		if n == nil {
			continue
		}
		st, err := n.Tables().Status(ctx, nil)
		if err != nil {
			return err
		}
		for _, f := range st.Checkpoints {
			if f.Table == "bench" && f.Id == id {
				res.CheckpointBytes += int64(f.Bytes)
			}
		}
	}
	fmt.Fprintf(progress, "checkpoint: %v, %d bytes written\n", res.Checkpoint.Round(time.Millisecond), res.CheckpointBytes)
	p := m.DP.Leaves()[0]
	zero, _, _ := p.Children()
	start = time.Now()
	if _, err := ddstable.RequestSplit(ctx, mc, "bench", p); err != nil {
		return err
	}
	if err := wait("split", func(m *ddstable.Maps) (bool, error) { return m.DP.Has(zero), nil }); err != nil {
		return err
	}
	res.Split = time.Since(start)
	start = time.Now()
	if _, err := ddstable.RequestMerge(ctx, mc, "bench", p); err != nil {
		return err
	}
	if err := wait("merge", func(m *ddstable.Maps) (bool, error) { return m.DP.Has(p), nil }); err != nil {
		return err
	}
	res.Merge = time.Since(start)
	fmt.Fprintf(progress, "split of %v: %v; merge back: %v\n", p, res.Split.Round(time.Millisecond), res.Merge.Round(time.Millisecond))
	ts, err := ddstable.ListTables(ctx, mc)
	if err != nil || len(ts) != 1 {
		return fmt.Errorf("the table's maps: %v", err)
	}
	g := ts[0].RG[p]
	to := uint64(0)
	for id := uint64(1); id <= uint64(len(c.Nodes)); id++ {
		if !slices.ContainsFunc(g, func(b ddstable.BrickID) bool { return b.Node == id }) {
			to = id
			break
		}
	}
	if to == 0 {
		return nil // every node holds every partition: nowhere to move to
	}
	if st, err := c.Nodes[g[0].Node-1].Tables().Status(ctx, nil); err == nil {
		for _, r := range st.Replicas {
			if r.Table == "bench" && r.Partition.GetBits() == p.Bits && r.Partition.GetDepth() == uint32(p.Depth) {
				res.MoveBytes = int64(r.Bytes)
			}
		}
	}
	start = time.Now()
	lm, err := ddstable.RequestMove(ctx, mc, "bench", p, g[0].Node, to)
	if err != nil {
		return err
	}
	target := lm.Joining[p]
	if err := wait("move", func(m *ddstable.Maps) (bool, error) {
		if slices.Contains(m.RG[p], target) {
			return true, nil
		}
		if m.Joining[p] != target {
			return false, fmt.Errorf("the move of %v to %v was given up", p, target)
		}
		return false, nil
	}); err != nil {
		return err
	}
	res.Move = time.Since(start)
	fmt.Fprintf(progress, "move of %v (%d bytes of values) from node %d to node %d: %v\n", p, res.MoveBytes, g[0].Node, to, res.Move.Round(time.Millisecond))
	return nil
}

var errStop = fmt.Errorf("stop")

// runTableLoad runs outstanding workers spread over the libraries, each
// calling op until it returns errStop or the duration (if any) passes.
func runTableLoad(ctx context.Context, libs []*ddstable.Library, outstanding int, d time.Duration, op func(*ddstable.Library, int) error, _ any) error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	next := 0
	var first error
	deadline := time.Now().Add(d)
	for w := range outstanding {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lib := libs[w%len(libs)]
			for ctx.Err() == nil && (d == 0 || time.Now().Before(deadline)) {
				mu.Lock()
				i := next
				next++
				stop := first != nil
				mu.Unlock()
				if stop {
					return
				}
				if err := op(lib, i); err != nil {
					if err != errStop {
						mu.Lock()
						first = err
						mu.Unlock()
					}
					return
				}
			}
		}()
	}
	wg.Wait()
	if first != nil {
		return first
	}
	return ctx.Err()
}

// redisBench runs redis-server (no persistence) and redis-benchmark's SET
// and GET at each cell's concurrency.
func redisBench(ctx context.Context, o TableOptions, res *TableResults, progress io.Writer) ([]TableCell, error) {
	p, err := ports.Free(1)
	if err != nil {
		return nil, err
	}
	port := strconv.Itoa(p[0])
	dir, err := os.MkdirTemp("", "grove-bench-redis-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	srv := exec.CommandContext(ctx, "redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir)
	if err := srv.Start(); err != nil {
		return nil, err
	}
	defer func() { _ = srv.Process.Kill(); _ = srv.Wait() }()
	for i := 0; ; i++ {
		if err := exec.CommandContext(ctx, "redis-cli", "-p", port, "ping").Run(); err == nil {
			break
		}
		if i > 100 || !sleepCtx(ctx, 50*time.Millisecond) {
			return nil, fmt.Errorf("redis-server did not answer on port %s", port)
		}
	}
	var cells []TableCell
	for _, out := range o.Outstanding {
		for _, op := range []string{"put", "get"} {
			t := map[string]string{"put": "set", "get": "get"}[op]
			var rates []float64
			var p50s []time.Duration
			for r := 0; r < o.Rounds; r++ {
				n := max(1000, int(float64(out)*o.Duration.Seconds()*2000))
				b, err := exec.CommandContext(ctx, "redis-benchmark", "-p", port, "-t", t, "-c", strconv.Itoa(out), "-n", strconv.Itoa(n),
					"-d", strconv.Itoa(o.ValueSize), "-r", strconv.Itoa(o.Keys), "--csv").Output()
				if err != nil {
					return nil, fmt.Errorf("redis-benchmark: %w", err)
				}
				rate, p50, err := parseRedisCSV(b)
				if err != nil {
					return nil, err
				}
				rates = append(rates, rate)
				p50s = append(p50s, p50)
				fmt.Fprintf(progress, "redis %s, %d connections: round %d: %.0f/s\n", op, out, r+1, rate)
			}
			cells = append(cells, TableCell{System: "redis", Op: op, Outstanding: out, ValueSize: o.ValueSize, OpsPerS: medianF(rates), P50: medianD(p50s)})
		}
	}
	// SAVE writes the data set to dump.rdb and fsyncs it, in the
	// foreground (commands wait), as a checkpoint does.
	start := time.Now()
	if b, err := exec.CommandContext(ctx, "redis-cli", "-p", port, "save").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("redis-cli save: %v: %s", err, b)
	}
	res.RedisSave = time.Since(start)
	if fi, err := os.Stat(filepath.Join(dir, "dump.rdb")); err == nil {
		res.RedisSaveBytes = fi.Size()
	}
	fmt.Fprintf(progress, "redis SAVE: %v, %d bytes\n", res.RedisSave.Round(time.Millisecond), res.RedisSaveBytes)
	// Figure 7's points: every key SET with the size first (redis-benchmark's
	// GET sends no value; its keys must hold one), then GETs.
	out := slices.Max(o.Outstanding)
	for _, size := range o.ValueSizes {
		if b, err := exec.CommandContext(ctx, "redis-benchmark", "-p", port, "-t", "set", "-c", "16", "-n", strconv.Itoa(8*o.Keys),
			"-d", strconv.Itoa(size), "-r", strconv.Itoa(o.Keys), "--csv").CombinedOutput(); err != nil {
			return nil, fmt.Errorf("redis-benchmark set: %v: %s", err, b)
		}
		var rates []float64
		var p50s []time.Duration
		for r := 0; r < o.Rounds; r++ {
			n := max(1000, int(float64(out)*o.Duration.Seconds()*2000))
			b, err := exec.CommandContext(ctx, "redis-benchmark", "-p", port, "-t", "get", "-c", strconv.Itoa(out), "-n", strconv.Itoa(n),
				"-r", strconv.Itoa(o.Keys), "--csv").Output()
			if err != nil {
				return nil, fmt.Errorf("redis-benchmark: %w", err)
			}
			rate, p50, err := parseRedisCSV(b)
			if err != nil {
				return nil, err
			}
			rates, p50s = append(rates, rate), append(p50s, p50)
		}
		c := TableCell{System: "redis", Op: "get", Outstanding: out, ValueSize: size, OpsPerS: medianF(rates), P50: medianD(p50s)}
		fmt.Fprintf(progress, "redis get, %d-byte values, %d connections: %.0f/s (%.1f MB/s)\n", size, out, c.OpsPerS, c.OpsPerS*float64(size)/1e6)
		cells = append(cells, c)
	}
	return cells, nil
}

// parseRedisCSV reads redis-benchmark --csv: a header line, then
// "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms",...
func parseRedisCSV(b []byte) (float64, time.Duration, error) {
	rows, err := csv.NewReader(bytes.NewReader(b)).ReadAll()
	if err != nil || len(rows) < 2 || len(rows[1]) < 5 {
		return 0, 0, fmt.Errorf("redis-benchmark printed %q", b)
	}
	rate, err := strconv.ParseFloat(rows[1][1], 64)
	if err != nil {
		return 0, 0, fmt.Errorf("redis-benchmark rate %q", rows[1][1])
	}
	p50, err := strconv.ParseFloat(rows[1][4], 64)
	if err != nil {
		return 0, 0, fmt.Errorf("redis-benchmark p50 %q", rows[1][4])
	}
	return rate, time.Duration(p50 * float64(time.Millisecond)), nil
}

func medianOrZero(x []time.Duration) time.Duration {
	if len(x) == 0 {
		return 0
	}
	return medianD(x)
}

// TableSample is one second of DDS's Figure 8 (availability and
// recovery): reads and writes completed in it, and what happened in it.
type TableSample struct {
	Second int
	Reads  int
	Writes int
	Event  string `json:",omitempty"`
}

// tableRecovery re-runs DDS's Figure 8 on the benchmark's cluster: a
// table of one partition with three replicas and keys of ValueSize bytes,
// read by the libraries at the largest Outstanding and written by one more
// operation in flight; node 3 is crashed at 5 s and started again at 10 s
// (a new incarnation, which recovers into the group: write lease, whole
// copy, join); completions are counted per second for 20 s.
func tableRecovery(ctx context.Context, c *InProcessCluster, mc *meta.Client, libs []*ddstable.Library, o TableOptions, progress io.Writer) ([]TableSample, error) {
	if _, err := ddstable.CreateTable(ctx, mc, "avail", 1, 3); err != nil {
		return nil, err
	}
	value := bytes.Repeat([]byte("a"), o.ValueSize)
	keys := o.RecoveryKeys
	fmt.Fprintf(progress, "figure 8: loading %d keys of %d bytes into one partition of 3 replicas\n", keys, o.ValueSize)
	if err := runTableLoad(ctx, libs, 16, 0, func(lib *ddstable.Library, i int) error {
		if i >= keys {
			return errStop
		}
		return lib.Put(ctx, "avail", uint64(i)*0x9E3779B97F4A7C15, value)
	}, nil); err != nil {
		return nil, err
	}
	const seconds = 20
	samples := make([]TableSample, seconds)
	for i := range samples {
		samples[i].Second = i + 1
	}
	var mu sync.Mutex
	start := time.Now()
	count := func(write bool) {
		s := int(time.Since(start) / time.Second)
		mu.Lock()
		if s < seconds {
			if write {
				samples[s].Writes++
			} else {
				samples[s].Reads++
			}
		}
		mu.Unlock()
	}
	event := func(format string, args ...any) {
		s := min(int(time.Since(start)/time.Second), seconds-1)
		msg := fmt.Sprintf(format, args...)
		mu.Lock()
		if samples[s].Event != "" {
			samples[s].Event += "; "
		}
		samples[s].Event += msg
		mu.Unlock()
		fmt.Fprintf(progress, "figure 8: %5.1fs %s\n", time.Since(start).Seconds(), msg)
	}
	d := seconds * time.Second
	errs := make(chan error, 2)
	go func() {
		errs <- runTableLoad(ctx, libs, slices.Max(o.Outstanding), d, func(lib *ddstable.Library, _ int) error {
			k := uint64(rand.IntN(keys)) * 0x9E3779B97F4A7C15
			if _, _, err := lib.Get(ctx, "avail", k); err != nil {
				return err
			}
			count(false)
			return nil
		}, nil)
	}()
	go func() {
		errs <- runTableLoad(ctx, libs[:1], 1, d, func(lib *ddstable.Library, _ int) error {
			k := uint64(rand.IntN(keys)) * 0x9E3779B97F4A7C15
			wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			err := lib.Put(wctx, "avail", k, value)
			cancel()
			if err == nil {
				count(true)
			}
			return nil // a write refused or timed out while the partition is leased is expected
		}, nil)
	}()
	if !sleepCtx(ctx, 5*time.Second-time.Since(start)) {
		return nil, ctx.Err()
	}
	c.Crash(2)
	event("node 3 crashed")
	gone, back := false, false
	for time.Since(start) < d {
		if !sleepCtx(ctx, 20*time.Millisecond) {
			return nil, ctx.Err()
		}
		ts, err := ddstable.ListTables(ctx, mc)
		if err != nil {
			continue
		}
		var m *ddstable.Maps
		for _, t := range ts {
			if t.Table == "avail" {
				m = t
			}
		}
		if m == nil {
			continue
		}
		g := m.RG[m.DP.Leaves()[0]]
		switch {
		case !gone && len(g) == 2:
			gone = true
			event("node 3's brick decreed out of the group")
		case gone && c.Nodes[2] == nil && time.Since(start) >= 10*time.Second:
			if err := c.Start(2); err != nil {
				return nil, err
			}
			event("node 3 started again")
		case gone && !back && len(m.Joining) > 0:
			back = true
			event("node 3's brick took the write lease: copying")
		case gone && len(g) == 3:
			back, gone = false, false
			event("node 3's brick joined the group")
		}
	}
	for range 2 {
		if err := <-errs; err != nil {
			return nil, err
		}
	}
	return samples, nil
}
