package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/grovestore/grove/internal/bench"
	"github.com/grovestore/grove/internal/cli"
	"github.com/grovestore/grove/internal/rldev"
	"github.com/grovestore/grove/internal/units"
)

func benchRLDevCmd() *cobra.Command {
	var out cli.Output
	var parts []string
	var cell time.Duration
	var port int
	var servers []int
	var paths []string
	repeat := 1
	var cold, direct bool
	resyncSize := units.Size(1 << 30)
	iopsSize := units.Size(512 << 20)
	cmd := &cobra.Command{
		Use:   "rldev",
		Short: "RLDev throughput and latency (Boxwood Table 1, Figures 4-5), IOPS next to fio, resync and move speed",
		Long: `Re-runs Boxwood's RLDev experiments on server processes of this machine (grove up
--processes), next to fio on a raw file on the same file system in the same run:

  table1   two servers, several RLDevs each, primary on one and secondary on the
           other; writes to RLDevs whose primary is local (a local write and a
           forward to the mirror), reads from the remote replica; 4, 8, 64 and
           256 KiB; one outstanding request per disk. fio: the same request
           size and count of outstanding requests, fdatasync after each write.
  iops     one RLDev: 4 KiB random writes and reads at queue depth 1 and 32,
           1 MiB sequential writes and reads at queue depth 1 and 8 (8
           streams); fio likewise. Run once per
           --data-path (blocks on the framed TCP data path, and on gRPC).
  resync   a replica's node is killed (SIGKILL), --resync-size is written in
           degraded mode, the node restarts: the copy's MB/s and duration, and
           the latency of 4 KiB writes during the resync next to before it.
  move     three servers: a full RLDev of --resync-size has its secondary moved
           to the third (grove rldev move) while 4 KiB writes go on: the time
           to the switch, the copy's MB/s, the writes' latency during it.
  scaling  the table1 workload on 2 to 8 servers (Figures 4-5).

Every server shares this machine's 2 cores and one disk: each replicated write
is two writes and two fdatasyncs on the same device, so half of fio's write
figure is the ceiling. The iops part's writes are also run as two fio
processes at once, one per file (two copies, each synced, as many outstanding
on each as Grove has): FIO-PAIR-OPS-S is their pairs a second. And as a
replicated write with nothing else (BARE-PAIR-OPS-S, in this process): each
write to both files, done when both are durable, each file's fdatasyncs
group-committed one at a time as an RLDev replica's are; no network, block
headers or logs: the ceiling of that design on this machine, RATIO-BARE
Grove's share of it.

The RLDev files are buffered, and filled before the iops cells, so Grove's
cells start with the device's blocks in the page cache; fio drops its file's
pages as each job starts (its default), so its cells start from the disk.
--cold drops the RLDev files' pages before each Grove cell too: then both
start from the disk, as on a device larger than memory (a 4 KiB write of an
RLDev, 4 608 bytes on disk, then reads two pages first). Progress goes to
standard error.`,
		Example: `  grove bench rldev
  grove bench rldev --parts iops --cell 10s
  grove bench rldev --parts scaling --servers 2,4,8 -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.Resolve(); err != nil {
				return err
			}
			for _, p := range parts {
				if !slices.Contains([]string{"table1", "iops", "resync", "move", "scaling"}, p) {
					return cli.Usagef("--parts %q: want table1, iops, resync, move, scaling", p)
				}
			}
			for _, p := range paths {
				if p != rldev.DataPathTCP && p != rldev.DataPathGRPC {
					return cli.Usagef("--data-path %q: want tcp, grpc", p)
				}
			}
			if len(paths) == 0 {
				return cli.Usagef("--data-path: name at least one")
			}
			if repeat < 1 || repeat > 9 {
				return cli.Usagef("--repeat %d: want 1..9", repeat)
			}
			if iopsSize < 16<<20 || iopsSize%(1<<20) != 0 {
				return cli.Usagef("--iops-size %s: want a whole number of MiB, at least 16 MiB", units.FormatSize(int64(iopsSize)))
			}
			if cell < 100*time.Millisecond {
				return cli.Usagef("--cell %v: want at least 100ms (cells under a second are for smoke tests: their figures are noisy)", cell)
			}
			if _, err := os.Stat("/usr/bin/fio"); err != nil && (slices.Contains(parts, "table1") || slices.Contains(parts, "iops")) {
				return cli.Failf("bench rldev", "fio is not installed (apt-get install fio): the raw-file figures need it")
			}
			bin, err := os.Executable()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), time.Hour)
			defer cancel()
			dir, err := os.MkdirTemp("", "grove-bench-rldev-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(dir)
			d := &cli.Doc{}
			progress := func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
			b := &rldevBench{ctx: ctx, bin: bin, dir: dir, port: port, cell: cell, d: d, log: progress, paths: paths, repeat: repeat, cold: cold, direct: direct, iopsSpan: uint64(iopsSize)}
			for _, p := range parts {
				var err error
				switch p {
				case "table1":
					err = b.table1()
				case "iops":
					err = b.iops()
				case "resync":
					err = b.resync(uint64(resyncSize))
				case "move":
					err = b.move(uint64(resyncSize))
				case "scaling":
					err = b.scaling(servers)
				}
				if err != nil {
					return cli.Failf("bench rldev", "%s: %v", p, err)
				}
			}
			return out.Print(os.Stdout, d)
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&parts, "parts", []string{"table1", "iops", "resync", "move", "scaling"}, "run these `PARTS` (table1, iops, resync, move, scaling)")
	f.DurationVar(&cell, "cell", 5*time.Second, "measure each cell for `DURATION`")
	f.IntVar(&port, "base-port", 9300, "run the servers from `PORT` (as grove up --base-port)")
	f.IntSliceVar(&servers, "servers", []int{2, 4, 8}, "scaling: `N,...` server processes")
	f.IntVar(&repeat, "repeat", 1, "iops: measure each cell `N` times, grove and fio in turn, and report the medians (the ratios: the median of each round's own)")
	f.BoolVar(&direct, "direct-writes", false, "run the servers with small writes past the page cache ([rldev] direct_writes)")
	f.BoolVar(&cold, "cold", false, "iops: drop the RLDev files' pages from the page cache before each grove cell, as fio drops its file's (both start from the disk)")
	f.StringSliceVar(&paths, "data-path", []string{rldev.DataPathTCP, rldev.DataPathGRPC}, "iops: run once per `PATH,...` blocks travel on (tcp, grpc); the other parts use the first")
	f.Var(&iopsSize, "iops-size", "iops: the RLDev and fio's files are `SIZE` (written first; the README's figures are of 512 MiB)")
	f.Var(&resyncSize, "resync-size", "resync: write `SIZE` in degraded mode (the RLDev is that size); move: the size of the RLDev moved")
	out.Register(cmd)
	return cmd
}

type rldevBench struct {
	ctx    context.Context
	bin    string
	dir    string
	port   int
	cell   time.Duration
	d      *cli.Doc
	log    func(string, ...any)
	n      int
	paths  []string // data paths: iops runs on each, the others on the first
	repeat int      // iops: runs per cell (medians)
	cold   bool     // iops: each grove cell starts with the RLDev files out of the page cache (--cold)
	direct bool     // the servers write small blocks past the page cache (--direct-writes)
	// iopsSpan: iops: the RLDev's and fio's files' size, written first
	// (--iops-size)
	iopsSpan uint64
}

// cluster starts n servers with disks of diskSize.
func (b *rldevBench) cluster(n int, diskSize string) (*bench.RLDevCluster, error) {
	return b.clusterOn(n, diskSize, b.paths[0])
}

// clusterOn starts n servers whose blocks travel on path.
func (b *rldevBench) clusterOn(n int, diskSize, path string) (*bench.RLDevCluster, error) {
	b.n++
	var extra []string
	if b.direct {
		extra = append(extra, "--direct-writes")
	}
	b.log("starting %d servers (grove up --processes --nodes %d --data-path %s %s)", n, n, path, strings.Join(extra, " "))
	return bench.StartRLDevCluster(b.ctx, b.bin, b.clusterDir(), b.port, n, diskSize, path, nil, extra...)
}

// clusterDir is the directory of the cluster clusterOn started last.
func (b *rldevBench) clusterDir() string { return filepath.Join(b.dir, fmt.Sprintf("c%d", b.n)) }

// cpu returns each server's CPU time now.
func cpu(c *bench.RLDevCluster) map[uint64]time.Duration {
	m := map[uint64]time.Duration{}
	for id, n := range c.Up.Nodes {
		if t, err := bench.CPUTime(n.PID); err == nil {
			m[id] = t
		}
	}
	return m
}

// cpuPct is the mean CPU % per server between two samples over elapsed.
func cpuPct(a, b map[uint64]time.Duration, elapsed time.Duration) float64 {
	var sum time.Duration
	for id, t := range b {
		sum += t - a[id]
	}
	if len(b) == 0 {
		return 0
	}
	return 100 * sum.Seconds() / elapsed.Seconds() / float64(len(b))
}

// busySample is the data directory's disk busy time at one moment.
type busySample struct {
	busy time.Duration
	ok   bool
}

func diskBusy(dir string) busySample {
	d, ok := bench.DiskBusy(dir)
	return busySample{d, ok}
}

// pct is the disk's utilisation (%) between a and s, over elapsed; a
// cell is the text "-" where the device's statistics are not found.
func (s busySample) pct(a busySample, elapsed time.Duration) cli.Cell {
	if !s.ok || !a.ok || elapsed <= 0 {
		return cli.C("-", nil)
	}
	p := round1(min(100, 100*(s.busy-a.busy).Seconds()/elapsed.Seconds()))
	return cli.C(fmt.Sprintf("%.1f", p), p)
}

// localPrimaries picks, per server, one RLDev whose primary is there.
func localPrimaries(t *rldev.Table) []*rldev.Record {
	seen := map[uint64]bool{}
	var out []*rldev.Record
	for _, id := range t.IDs() {
		r := t.RLDevs[id]
		if p := r.Segs[r.Primary].Node; !seen[p] {
			seen[p] = true
			out = append(out, r)
		}
	}
	return out
}

func idsOf(rs []*rldev.Record) []uint64 {
	var out []uint64
	for _, r := range rs {
		out = append(out, r.ID)
	}
	return out
}

func (b *rldevBench) fioFile(span uint64) (string, error) {
	return b.fioFileNamed("fio.raw", span)
}

// fioFileNamed is a raw file of span bytes for fio, made once.
func (b *rldevBench) fioFileNamed(name string, span uint64) (string, error) {
	path := filepath.Join(b.dir, name)
	if st, err := os.Stat(path); err == nil && uint64(st.Size()) >= span {
		return path, nil
	}
	return path, bench.PrepareFile(path, span)
}

// table1: Boxwood §4.2 Table 1 on two servers.
func (b *rldevBench) table1() error {
	const span = 256 << 20
	c, err := b.cluster(2, "4GiB")
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := c.Create(b.ctx, span, 4); err != nil {
		return err
	}
	t, err := c.Clerk.Table(b.ctx, true)
	if err != nil {
		return err
	}
	locals := localPrimaries(t)
	for _, r := range locals {
		b.log("  filling rldev %d (%s)", r.ID, units.FormatSize(span))
		if err := bench.Fill(b.ctx, c.Clerk, r.ID, span); err != nil {
			return err
		}
	}
	raw, err := b.fioFile(span)
	if err != nil {
		return err
	}
	tb := b.d.Table("table1", "OP", "SIZE", "GROVE-MB-S", "GROVE-P50-US", "CPU-PCT", "DISK-PCT", "FIO-MB-S", "FIO-DISK-PCT", "RATIO")
	for _, write := range []bool{true, false} {
		for _, size := range []uint64{4 << 10, 8 << 10, 64 << 10, 256 << 10} {
			l := bench.IOLoad{IDs: idsOf(locals), Size: size, QD: 1, Write: write, Span: span, For: b.cell}
			if !write {
				l.Replica = 2 // segment 1, the secondary: the remote server
			}
			c0, t0 := cpu(c), time.Now()
			d0 := diskBusy(b.dir)
			g, err := bench.RunIO(b.ctx, c.Clerk, l)
			if err != nil {
				return err
			}
			pct := cpuPct(c0, cpu(c), time.Since(t0))
			dpct := diskBusy(b.dir).pct(d0, time.Since(t0))
			d0, t0 = diskBusy(b.dir), time.Now()
			f, err := bench.RunFio(b.ctx, bench.FioLoad{File: raw, Size: size, QD: len(locals), Write: write, Span: span, For: b.cell})
			if err != nil {
				return err
			}
			fpct := diskBusy(b.dir).pct(d0, time.Since(t0))
			op := map[bool]string{true: "write", false: "read"}[write]
			b.log("  table1 %s %s: grove %.1f MB/s (p50 %v, CPU %.0f%%, disk %v), fio %.1f MB/s (disk %v)", op, units.FormatSize(int64(size)), g.MBps(), g.P50, pct, dpct, f.MBps(), fpct)
			tb.Row(op, units.FormatSize(int64(size)), round1(g.MBps()), g.P50.Microseconds(), round1(pct), dpct, round1(f.MBps()), fpct, round2(g.MBps()/f.MBps()))
		}
	}
	return nil
}

// iops: one RLDev, 4 KiB random at QD 1 and 32, 1 MiB sequential at QD 1
// and 8.
func (b *rldevBench) iops() error {
	tb := b.d.Table("iops", "PATH", "OP", "SIZE", "QD", "GROVE-OPS-S", "GROVE-MB-S", "GROVE-P50-US", "GROVE-P99-US", "FIO-OPS-S", "FIO-MB-S", "FIO-P50-US", "RATIO", "FIO-PAIR-OPS-S", "RATIO-PAIR", "BARE-PAIR-OPS-S", "RATIO-BARE")
	for _, path := range b.paths {
		if err := b.iopsOn(path, tb); err != nil {
			return err
		}
	}
	// One hop of a replicated write's data on this machine: its 1 MiB
	// writes make two in a row (clerk to primary, primary to secondary),
	// fio's none.
	var hops []time.Duration
	for i := 0; i < max(b.repeat, 1); i++ {
		h, err := bench.RunLoopback(b.ctx, 1<<20, b.cell)
		if err != nil {
			return fmt.Errorf("loopback: %w", err)
		}
		hops = append(hops, h.P50)
	}
	slices.Sort(hops)
	hop := hops[len(hops)/2]
	b.log("  loopback TCP: 1 MiB there and one byte back, p50 %v (median of %d)", hop, len(hops))
	b.d.FieldText("loopback-1mib-p50-us", hop.Microseconds(), fmt.Sprintf("%d (1 MiB over loopback TCP and a byte back: one of a replicated write's two hops)", hop.Microseconds()))
	return nil
}

func (b *rldevBench) iopsOn(path string, tb *cli.Table) error {
	span := b.iopsSpan
	c, err := b.clusterOn(2, "4GiB", path)
	cdir := b.clusterDir()
	if err != nil {
		return err
	}
	defer c.Close()
	recs, err := c.Create(b.ctx, span, 1)
	if err != nil {
		return err
	}
	id := recs[0].ID
	b.log("  filling rldev %d (%s)", id, units.FormatSize(int64(span)))
	if err := bench.Fill(b.ctx, c.Clerk, id, span); err != nil {
		return err
	}
	raw, err := b.fioFile(span)
	if err != nil {
		return err
	}
	raw2, err := b.fioFileNamed("fio2.raw", span)
	if err != nil {
		return err
	}
	cells := []struct {
		write, seq bool
		size       uint64
		qd         int
	}{{true, false, 4 << 10, 1}, {true, false, 4 << 10, 32}, {false, false, 4 << 10, 1}, {false, false, 4 << 10, 32},
		{true, true, 1 << 20, 1}, {false, true, 1 << 20, 1},
		// Sequential 1 MiB streams at queue depth 8 (fio: 8 jobs, each its
		// own stretch of the file, an fdatasync per write): a stream's
		// writes overlap their transfers and share syncs, as a client
		// that streams data would have them.
		{true, true, 1 << 20, 8}, {false, true, 1 << 20, 8}}
	for _, x := range cells {
		// grove and fio in turn, --repeat times: this shared machine's
		// figures drift by a fifth between minutes, fio's as much as ours
		// (and by up to threefold: README). The ratios are the medians of
		// each round's own (bench.MedianRatio), the rates the medians of
		// the rates.
		var gs, fs, ps, bs []bench.IOResult
		for i := 0; i < max(b.repeat, 1); i++ {
			if b.cold {
				if err := bench.DropCache(cdir); err != nil {
					return err
				}
			}
			g, err := bench.RunIO(b.ctx, c.Clerk, bench.IOLoad{IDs: []uint64{id}, Size: x.size, QD: x.qd, Write: x.write, Seq: x.seq, Span: span, For: b.cell})
			if err != nil {
				return err
			}
			fl := bench.FioLoad{File: raw, Size: x.size, QD: x.qd, Write: x.write, Seq: x.seq, Span: span, For: b.cell}
			f, err := bench.RunFio(b.ctx, fl)
			if err != nil {
				return err
			}
			gs, fs = append(gs, g), append(fs, f)
			if x.write {
				// The same writes as two copies on this one disk, each
				// synced: what a replicated write asks of it when both
				// replicas share it (the bound, not the target's peer).
				p, err := bench.RunFioPair(b.ctx, fl, raw2)
				if err != nil {
					return err
				}
				ps = append(ps, p)
				// And as the replicated write's design alone would do them.
				bp, err := bench.RunBarePair(b.ctx, fl, raw2)
				if err != nil {
					return err
				}
				bs = append(bs, bp)
			}
		}
		g, f := bench.MedianIO(gs), bench.MedianIO(fs)
		op := map[bool]string{true: "randwrite", false: "randread"}[x.write]
		if x.seq {
			op = map[bool]string{true: "write", false: "read"}[x.write]
		}
		pairOps, pairRatio := any("-"), any("-")
		pairNote := ""
		if len(ps) > 0 {
			p := bench.MedianIO(ps)
			r := bench.MedianRatio(gs, ps)
			pairOps, pairRatio = round0(p.PerSec()), round2(r)
			pairNote = fmt.Sprintf(", fio two copies %.0f pairs/s (grove %.2f of it)", p.PerSec(), r)
		}
		bareOps, bareRatio := any("-"), any("-")
		if len(bs) > 0 {
			bp := bench.MedianIO(bs)
			r := bench.MedianRatio(gs, bs)
			bareOps, bareRatio = round0(bp.PerSec()), round2(r)
			pairNote += fmt.Sprintf(", bare two-copy writes %.0f/s (grove %.2f of it)", bp.PerSec(), r)
		}
		b.log("  iops %s %s %s qd%d: grove %.0f ops/s %.1f MB/s (p50 %v p99 %v), fio %.0f ops/s %.1f MB/s%s", path, op, units.FormatSize(int64(x.size)), x.qd,
			g.PerSec(), g.MBps(), g.P50, g.P99, f.PerSec(), f.MBps(), pairNote)
		tb.Row(path, op, units.FormatSize(int64(x.size)), x.qd, round0(g.PerSec()), round1(g.MBps()), g.P50.Microseconds(), g.P99.Microseconds(),
			round0(f.PerSec()), round1(f.MBps()), f.P50.Microseconds(), round2(bench.MedianRatio(gs, fs)), pairOps, pairRatio, bareOps, bareRatio)
	}
	return nil
}

// resync: kill a replica's node, write size bytes degraded, restart it,
// time the copy, with 4 KiB writes going on.
func (b *rldevBench) resync(size uint64) error {
	c, err := b.cluster(2, units.FormatSize(int64(size*2+(256<<20))))
	if err != nil {
		return err
	}
	defer c.Close()
	recs, err := c.Create(b.ctx, size, 1)
	if err != nil {
		return err
	}
	r := recs[0]
	before, err := bench.RunIO(b.ctx, c.Clerk, bench.IOLoad{IDs: []uint64{r.ID}, Size: 4 << 10, QD: 1, Write: true, Span: size, For: b.cell})
	if err != nil {
		return err
	}
	victim := r.Segs[1].Node
	b.log("  resync: SIGKILL node %d (rldev %d's secondary), %s written degraded", victim, r.ID, units.FormatSize(int64(size)))
	if err := c.Up.Kill(victim); err != nil {
		return err
	}
	if err := bench.Fill(b.ctx, c.Clerk, r.ID, size); err != nil {
		return err
	}
	if err := c.Up.Restart(victim); err != nil {
		return err
	}
	// While it resyncs: 4 KiB writes at QD 1, and the table polled.
	restart := time.Now()
	var started, done time.Time
	var during bench.IOResult
	errc := make(chan error, 1)
	stop, cancel := context.WithCancel(b.ctx)
	defer cancel()
	for done.IsZero() {
		t, err := c.Clerk.Table(b.ctx, true)
		if err == nil {
			x := t.RLDevs[r.ID]
			if x.State == rldev.Resyncing && started.IsZero() {
				started = time.Now()
				go func() {
					res, err := bench.RunIO(stop, c.Clerk, bench.IOLoad{IDs: []uint64{r.ID}, Size: 4 << 10, QD: 1, Write: true, Span: size, For: time.Hour})
					during = res
					errc <- err
				}()
			}
			if x.State == rldev.Normal && !started.IsZero() {
				done = time.Now()
			}
		}
		if !bench.SleepCtx(b.ctx, 20*time.Millisecond) {
			return b.ctx.Err()
		}
	}
	cancel()
	if err := <-errc; err != nil {
		return err
	}
	copyTime := done.Sub(started)
	mbps := float64(size) / 1e6 / copyTime.Seconds()
	b.log("  resync of %s: %v (%.0f MB/s), %v from the restart; 4 KiB writes p50 %v p99 %v during, %v %v before",
		units.FormatSize(int64(size)), copyTime.Round(time.Millisecond), mbps, done.Sub(restart).Round(time.Millisecond), during.P50, during.P99, before.P50, before.P99)
	tb := b.d.Table("resync", "SIZE", "COPY-S", "COPY-MB-S", "FROM-RESTART-S", "WRITE-P50-US-DURING", "WRITE-P99-US-DURING", "WRITE-P50-US-BEFORE", "WRITE-P99-US-BEFORE")
	tb.Row(units.FormatSize(int64(size)), round2(copyTime.Seconds()), round0(mbps), round2(done.Sub(restart).Seconds()),
		during.P50.Microseconds(), during.P99.Microseconds(), before.P50.Microseconds(), before.P99.Microseconds())
	return nil
}

// move: an RLDev of size, full, has its secondary moved to a third node
// (grove rldev move) while 4 KiB writes go on; the time from the request
// to the switch, and the writes' latency during the move next to before.
func (b *rldevBench) move(size uint64) error {
	c, err := b.cluster(3, units.FormatSize(int64(size*2+(256<<20))))
	if err != nil {
		return err
	}
	defer c.Close()
	recs, err := c.Create(b.ctx, size, 1)
	if err != nil {
		return err
	}
	r := recs[0]
	if err := bench.Fill(b.ctx, c.Clerk, r.ID, size); err != nil {
		return err
	}
	before, err := bench.RunIO(b.ctx, c.Clerk, bench.IOLoad{IDs: []uint64{r.ID}, Size: 4 << 10, QD: 1, Write: true, Span: size, For: b.cell})
	if err != nil {
		return err
	}
	var target uint64
	for n := range c.Up.Nodes {
		if r.SegmentOf(n) < 0 {
			target = n
		}
	}
	sec := r.Secondary()
	stop, cancel := context.WithCancel(b.ctx)
	defer cancel()
	var during bench.IOResult
	errc := make(chan error, 1)
	go func() {
		res, err := bench.RunIO(stop, c.Clerk, bench.IOLoad{IDs: []uint64{r.ID}, Size: 4 << 10, QD: 1, Write: true, Span: size, For: time.Hour})
		during = res
		errc <- err
	}()
	start := time.Now()
	mv, err := c.Clerk.Move(b.ctx, r.ID, sec, target, -1)
	if err != nil {
		cancel()
		<-errc
		return err
	}
	b.log("  move: rldev %d's secondary (%v) to node %d, %s, 4 KiB writes going on", r.ID, r.Segs[sec], target, units.FormatSize(int64(size)))
	var copied time.Time
	for {
		t, err := c.Clerk.Table(b.ctx, false)
		if err == nil {
			x := t.RLDevs[r.ID]
			if x.Move != nil && x.Move.Switch && copied.IsZero() {
				copied = time.Now()
			}
			if x.Move == nil && x.Segs[sec] == mv.Move.To && x.State == rldev.Normal {
				break
			}
			if x.Move == nil && x.Segs[sec] != mv.Move.To {
				// The watch may lag the decree: ask the leader.
				if t, err = c.Clerk.Table(b.ctx, true); err == nil && t.RLDevs[r.ID].Move == nil && t.RLDevs[r.ID].Segs[sec] != mv.Move.To {
					cancel()
					<-errc
					return fmt.Errorf("the move was abandoned: %+v", t.RLDevs[r.ID])
				}
			}
		}
		if !bench.SleepCtx(b.ctx, 20*time.Millisecond) {
			return b.ctx.Err()
		}
	}
	switched := time.Since(start)
	cancel()
	if err := <-errc; err != nil {
		return err
	}
	if copied.IsZero() {
		copied = start.Add(switched)
	}
	mbps := float64(size) / 1e6 / copied.Sub(start).Seconds()
	b.log("  move of %s: switched after %v (copy %.0f MB/s); 4 KiB writes p50 %v p99 %v during, %v %v before",
		units.FormatSize(int64(size)), switched.Round(time.Millisecond), mbps, during.P50, during.P99, before.P50, before.P99)
	tb := b.d.Table("move", "SIZE", "SWITCHED-S", "COPY-MB-S", "WRITE-P50-US-DURING", "WRITE-P99-US-DURING", "WRITE-P50-US-BEFORE", "WRITE-P99-US-BEFORE")
	tb.Row(units.FormatSize(int64(size)), round2(switched.Seconds()), round0(mbps),
		during.P50.Microseconds(), during.P99.Microseconds(), before.P50.Microseconds(), before.P99.Microseconds())
	return nil
}

// scaling: the table1 workload on more servers (Figures 4-5).
func (b *rldevBench) scaling(servers []int) error {
	const span = 64 << 20
	tb := b.d.Table("scaling", "SERVERS", "OP", "SIZE", "MB-S", "PER-SERVER-MB-S")
	sort.Ints(servers)
	for _, n := range servers {
		if n < 2 {
			return fmt.Errorf("--servers %d: at least 2", n)
		}
		c, err := b.cluster(n, "1GiB")
		if err != nil {
			return err
		}
		if _, err := c.Create(b.ctx, span, 2*n); err != nil {
			c.Close()
			return err
		}
		t, err := c.Clerk.Table(b.ctx, true)
		if err != nil {
			c.Close()
			return err
		}
		locals := localPrimaries(t)
		for _, r := range locals {
			if err := bench.Fill(b.ctx, c.Clerk, r.ID, span); err != nil {
				c.Close()
				return err
			}
		}
		for _, write := range []bool{true, false} {
			for _, size := range []uint64{4 << 10, 64 << 10} {
				l := bench.IOLoad{IDs: idsOf(locals), Size: size, QD: 1, Write: write, Span: span, For: b.cell}
				if !write {
					l.Replica = 2
				}
				g, err := bench.RunIO(b.ctx, c.Clerk, l)
				if err != nil {
					c.Close()
					return err
				}
				op := map[bool]string{true: "write", false: "read"}[write]
				b.log("  scaling %d servers %s %s: %.1f MB/s", n, op, units.FormatSize(int64(size)), g.MBps())
				tb.Row(n, op, units.FormatSize(int64(size)), round1(g.MBps()), round1(g.MBps()/float64(n)))
			}
		}
		c.Close()
	}
	return nil
}

func round0(x float64) float64 { return float64(int64(x + 0.5)) }
func round1(x float64) float64 { return float64(int64(x*10+0.5)) / 10 }
func round2(x float64) float64 { return float64(int64(x*100+0.5)) / 100 }
