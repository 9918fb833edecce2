package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/grovestore/grove/internal/disk"
	"github.com/grovestore/grove/internal/meta"
	"github.com/grovestore/grove/internal/rldev"
	"syscall"

	"golang.org/x/sys/unix"
)

// RLDevCluster is `grove up --processes` with a clerk on it.
type RLDevCluster struct {
	Up    *UpCluster
	Meta  *meta.Client
	Clerk *rldev.Clerk
}

// StartRLDevCluster runs n server processes (one config-service member)
// under dir, each with a disk file of diskSize, their blocks and the
// clerk's on dataPath (rldev.DataPathTCP or DataPathGRPC); extra are more
// flags of grove up.
func StartRLDevCluster(ctx context.Context, bin, dir string, port, n int, diskSize, dataPath string, log io.Writer, extra ...string) (*RLDevCluster, error) {
	meta1 := "1"
	if n >= 3 {
		meta1 = "3"
	}
	if dataPath == "" {
		dataPath = rldev.DataPathTCP
	}
	u, err := StartUp(ctx, bin, dir, port, log, append([]string{"--nodes", strconv.Itoa(n), "--meta", meta1, "--disk-size", diskSize, "--data-path", dataPath, "--chunk-size", "0"}, extra...)...)
	if err != nil {
		return nil, err
	}
	st, err := u.Status(ctx)
	if err != nil {
		u.Close()
		return nil, err
	}
	var ms []meta.Member
	for _, m := range st.Members {
		ms = append(ms, meta.Member{ID: m.Id, RaftAddr: m.RaftAddr, GRPCAddr: m.GrpcAddr})
	}
	mc := meta.NewClient(ms)
	return &RLDevCluster{Up: u, Meta: mc, Clerk: rldev.NewClerkWith(mc, rldev.ClerkOptions{DataPath: dataPath})}, nil
}

// Close stops the cluster.
func (c *RLDevCluster) Close() {
	c.Clerk.Close()
	c.Meta.Close()
	c.Up.Close()
}

// Create makes count RLDevs of size bytes and waits until their nodes
// serve them.
func (c *RLDevCluster) Create(ctx context.Context, size uint64, count int) ([]*rldev.Record, error) {
	recs, err := c.Clerk.Create(ctx, size, count, false)
	if err != nil {
		return nil, err
	}
	return recs, c.WaitNormal(ctx)
}

// WaitNormal waits until every RLDev is normal with both segments served.
func (c *RLDevCluster) WaitNormal(ctx context.Context) error {
	for {
		t, err := c.Clerk.Table(ctx, true)
		if err == nil {
			ok := true
			for _, r := range t.RLDevs {
				ok = ok && r.State == rldev.Normal && r.Inc[0] != 0 && r.Inc[1] != 0
			}
			if ok {
				return nil
			}
		}
		if !sleepCtx(ctx, 50*time.Millisecond) {
			return fmt.Errorf("RLDevs not normal: %w", ctx.Err())
		}
	}
}

// IOLoad is one cell of an RLDev workload.
type IOLoad struct {
	IDs     []uint64 // RLDevs to spread over (one worker group per RLDev)
	Size    uint64   // bytes per request
	QD      int      // requests outstanding per RLDev
	Write   bool
	Replica int    // reads: 0 any, 1 or 2 that segment
	Span    uint64 // bytes of each RLDev addressed (from 0)
	Seq     bool   // sequential (each worker its own stride) rather than random
	For     time.Duration
}

// IOResult is an IOLoad's outcome.
type IOResult struct {
	Result
	Bytes uint64
}

// MBps is megabytes (10^6) per second.
func (r IOResult) MBps() float64 { return float64(r.Bytes) / 1e6 / r.Elapsed.Seconds() }

// RunIO runs l on the clerk for l.For.
func RunIO(ctx context.Context, cl *rldev.Clerk, l IOLoad) (IOResult, error) {
	qd := max(l.QD, 1)
	lat, elapsed, err := runWorkers(ctx, len(l.IDs)*l.QD, l.Size, l.Span, qd, l.Seq, l.For,
		func(w int) int64 { return int64(w)*7919 + int64(l.IDs[w/qd]) },
		func(ctx context.Context, w int, b uint64, buf []byte) error {
			id := l.IDs[w/qd]
			if l.Write {
				return cl.Write(ctx, id, b*l.Size, buf, rldev.WriteOptions{})
			}
			// Into the worker's buffer, used again, as fio's is.
			return cl.ReadInto(ctx, id, b*l.Size, buf, l.Replica)
		})
	if err != nil {
		return IOResult{}, err
	}
	return IOResult{Result: Result{System: "grove", Concurrency: l.QD * len(l.IDs), Ops: len(lat), Elapsed: elapsed,
		P50: Percentile(lat, 50), P99: Percentile(lat, 99)}, Bytes: uint64(len(lat)) * l.Size}, nil
}

// runWorkers runs op for d (or until ctx ends) on n workers at once, each
// with its own random stream (seed(w)) and a buffer of size random bytes,
// used again, on blocks of size bytes within span: random, or (seq) in
// order from worker w's start, w*blocks/qd. It returns the requests'
// latencies, sorted, the time taken, and the first error (an error
// after ctx ended ends the load, keeping what was measured).
func runWorkers(ctx context.Context, n int, size, span uint64, qd int, seq bool, d time.Duration, seed func(w int) int64,
	op func(ctx context.Context, w int, b uint64, buf []byte) error) ([]time.Duration, time.Duration, error) {
	blocks := span / size
	if blocks == 0 {
		return nil, 0, fmt.Errorf("span %d smaller than the request size %d", span, size)
	}
	var (
		mu       sync.Mutex
		lat      []time.Duration
		firstErr error
		wg       sync.WaitGroup
	)
	deadline := time.Now().Add(d)
	start := time.Now()
	for w := 0; w < n; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewSource(seed(w)))
			buf := make([]byte, size)
			r.Read(buf)
			var mine []time.Duration
			next := uint64(w) * (blocks / uint64(max(qd, 1)))
			for time.Now().Before(deadline) && ctx.Err() == nil {
				var b uint64
				if seq {
					b = next % blocks
					next++
				} else {
					b = uint64(r.Int63n(int64(blocks)))
				}
				t := time.Now()
				err := op(ctx, w, b, buf)
				if err != nil && ctx.Err() != nil {
					break // the caller ended the load: keep what was measured
				}
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					return
				}
				mine = append(mine, time.Since(t))
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return nil, 0, firstErr
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	return lat, time.Since(start), nil
}

// FioLoad is the same cell on a raw file, with fio: writes each followed
// by fdatasync (psync, one job per outstanding request), reads through
// the page cache as the RLDev's are.
type FioLoad struct {
	File  string
	Size  uint64 // bytes per request
	QD    int
	Write bool
	Seq   bool
	Span  uint64
	For   time.Duration
}

// RunFio runs l with fio and parses its JSON report.
func RunFio(ctx context.Context, l FioLoad) (IOResult, error) {
	rw := "randread"
	switch {
	case l.Write && l.Seq:
		rw = "write"
	case l.Write:
		rw = "randwrite"
	case l.Seq:
		rw = "read"
	}
	args := []string{"--name=raw", "--filename=" + l.File, "--rw=" + rw, "--bs=" + strconv.FormatUint(l.Size, 10),
		"--size=" + strconv.FormatUint(l.Span, 10), "--ioengine=psync", "--numjobs=" + strconv.Itoa(l.QD), "--group_reporting",
		"--time_based", "--runtime=" + strconv.FormatInt(max(l.For.Milliseconds(), 100), 10) + "ms", "--output-format=json", "--direct=0"}
	if l.Write {
		args = append(args, "--fdatasync=1")
	}
	if l.Seq && l.QD > 1 {
		args = append(args, "--offset_increment="+strconv.FormatUint(l.Span/uint64(l.QD), 10))
	}
	cmd := exec.CommandContext(ctx, "fio", args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return IOResult{}, fmt.Errorf("fio %s: %v: %s", strings.Join(args, " "), err, errb.String())
	}
	var rep struct {
		Jobs []struct {
			Read, Write struct {
				IOBytes uint64  `json:"io_bytes"`
				IOs     uint64  `json:"total_ios"`
				Runtime float64 `json:"runtime"` // ms
				Lat     struct {
					Percentile map[string]float64 `json:"percentile"`
				} `json:"clat_ns"`
			}
		}
	}
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil || len(rep.Jobs) == 0 {
		return IOResult{}, fmt.Errorf("fio's report does not parse: %v", err)
	}
	x := rep.Jobs[0].Read
	if l.Write {
		x = rep.Jobs[0].Write
	}
	ns := func(p string) time.Duration { return time.Duration(x.Lat.Percentile[p]) }
	return IOResult{Result: Result{System: "fio", Concurrency: l.QD, Ops: int(x.IOs), Elapsed: time.Duration(x.Runtime * float64(time.Millisecond)),
		P50: ns("50.000000"), P99: ns("99.000000")}, Bytes: x.IOBytes}, nil
}

// RunFioPair runs l on two files at once, one fio process each: the load
// of a replicated write on one disk (two copies, each written and
// fdatasync'd, l.QD outstanding on each, as an RLDev whose two replicas
// share the disk has). Its rate is the pairs of copies a second (the mean
// of the two processes' rates; their runs overlap but for fio's start-up)
// and its latencies the slower process's.
func RunFioPair(ctx context.Context, l FioLoad, second string) (IOResult, error) {
	var (
		res  [2]IOResult
		errs [2]error
		wg   sync.WaitGroup
	)
	for i, file := range []string{l.File, second} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			x := l
			x.File = file
			res[i], errs[i] = RunFio(ctx, x)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs[:]...); err != nil {
		return IOResult{}, err
	}
	a, b := res[0], res[1]
	rate := (a.PerSec() + b.PerSec()) / 2
	out := a
	if b.P50 > a.P50 {
		out.P50 = b.P50
	}
	if b.P99 > a.P99 {
		out.P99 = b.P99
	}
	out.System = "fio-pair"
	out.Elapsed = max(a.Elapsed, b.Elapsed)
	out.Ops = int(rate * out.Elapsed.Seconds())
	out.Bytes = uint64(out.Ops) * l.Size
	return out, nil
}

// DropCache drops from the page cache the pages of the RLDev disk files
// (*.img) under dir, written back first, as fio drops its file's pages as
// a job starts (its default, invalidate=1): a cell then starts from the
// disk on both sides.
func DropCache(dir string) error {
	return filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".img") {
			return err
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		return nil
	})
}

// PrepareFile makes a file of size bytes filled with data (fio's reads
// read it back; its writes overwrite it in place, as the RLDev's do). It
// is written in pieces of disk.WriteChunk, as the RLDevs' disk files are,
// so that fio's page cache holds folios of the same size as theirs (see
// disk.WriteChunk: large folios slow small writes down).
func PrepareFile(path string, size uint64) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	buf := make([]byte, disk.WriteChunk)
	rand.Read(buf)
	for n := uint64(0); n < size; n += uint64(len(buf)) {
		if _, err := f.Write(buf[:min(uint64(len(buf)), size-n)]); err != nil {
			return err
		}
	}
	return f.Sync()
}

// Fill writes every block of [0, span) of RLDev id (reads then read
// written blocks, as fio's read a written file).
func Fill(ctx context.Context, cl *rldev.Clerk, id, span uint64) error {
	buf := make([]byte, 1<<20)
	rand.Read(buf)
	for off := uint64(0); off < span; off += uint64(len(buf)) {
		if err := cl.Write(ctx, id, off, buf[:min(uint64(len(buf)), span-off)], rldev.WriteOptions{}); err != nil {
			return err
		}
	}
	return nil
}

// CPUTime is a process's user+system CPU time so far.
func CPUTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	f := strings.Fields(s[i+2:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: too short", pid)
	}
	ut, _ := strconv.ParseUint(f[11], 10, 64)
	st, _ := strconv.ParseUint(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100, nil // USER_HZ = 100
}

// DiskBusy is the time the block device holding path has spent doing I/O
// so far (io_ticks, /sys/dev/block/MAJ:MIN/stat, field 10): the disk
// utilisation of Boxwood's Table 1 is its growth over a cell's duration.
// ok is false where the device's statistics cannot be found (overlay or
// network file systems, no sysfs).
func DiskBusy(path string) (busy time.Duration, ok bool) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return 0, false
	}
	maj, min := unix.Major(st.Dev), unix.Minor(st.Dev)
	for _, p := range []string{fmt.Sprintf("/sys/dev/block/%d:%d/stat", maj, min), fmt.Sprintf("/sys/dev/block/%d:0/stat", maj)} {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		f := strings.Fields(string(b))
		if len(f) < 10 {
			continue
		}
		ms, err := strconv.ParseUint(f[9], 10, 64)
		if err != nil {
			continue
		}
		return time.Duration(ms) * time.Millisecond, true
	}
	return 0, false
}

// MedianRatio is the median, over rounds, of a[i]'s rate over b[i]'s (a
// round's two measurements are taken one right after the other, so that
// the ratio of each pair cancels most of what moves this machine's figures
// between minutes); 0 if there are none.
func MedianRatio(a, b []IOResult) float64 {
	var rs []float64
	for i := range min(len(a), len(b)) {
		if b[i].PerSec() > 0 {
			rs = append(rs, a[i].PerSec()/b[i].PerSec())
		}
	}
	if len(rs) == 0 {
		return 0
	}
	slices.Sort(rs)
	return rs[len(rs)/2]
}

// MedianIO is the run of rs with the median rate, with the median p50
// and p99 of all of them.
func MedianIO(rs []IOResult) IOResult {
	if len(rs) == 0 {
		return IOResult{}
	}
	byRate := append([]IOResult(nil), rs...)
	sort.Slice(byRate, func(i, j int) bool { return byRate[i].PerSec() < byRate[j].PerSec() })
	m := byRate[len(byRate)/2]
	var p50, p99 []time.Duration
	for _, r := range rs {
		p50, p99 = append(p50, r.P50), append(p99, r.P99)
	}
	slices.Sort(p50)
	slices.Sort(p99)
	m.P50, m.P99 = Percentile(p50, 50), Percentile(p99, 50)
	return m
}
