package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/grovestore/grove/internal/node"
)

// hangSwitch makes a FUSE file's reads, writes and syncs wait while on: a
// disk that stops answering, as a dying disk whose commands the kernel
// keeps retrying, or a network block device whose server is gone.
type hangSwitch struct {
	mu   sync.Mutex
	cond *sync.Cond
	on   bool
	held int // operations waiting now
	// slow: each operation takes this long, one at a time (slowMu): an
	// overloaded disk, answering all the while.
	slow   time.Duration
	slowMu sync.Mutex
}

// setSlow makes every operation take d, one at a time (0: off).
func (h *hangSwitch) setSlow(d time.Duration) {
	h.mu.Lock()
	h.slow = d
	h.mu.Unlock()
}

func newHangSwitch() *hangSwitch {
	h := &hangSwitch{}
	h.cond = sync.NewCond(&h.mu)
	return h
}

func (h *hangSwitch) set(on bool) {
	h.mu.Lock()
	h.on = on
	h.mu.Unlock()
	h.cond.Broadcast()
}

func (h *hangSwitch) wait() {
	h.mu.Lock()
	for h.on {
		h.held++
		h.cond.Wait()
		h.held--
	}
	slow := h.slow
	h.mu.Unlock()
	if slow > 0 {
		h.slowMu.Lock()
		time.Sleep(slow)
		h.slowMu.Unlock()
	}
}

func (h *hangSwitch) waiting() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.held
}

// hangNode is a loopback node whose open files are hangFiles.
type hangNode struct {
	fs.LoopbackNode
	h *hangSwitch
}

func (n *hangNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	fh, fl, errno := n.LoopbackNode.Open(ctx, flags)
	if errno != 0 {
		return nil, 0, errno
	}
	return &hangFile{LoopbackFile: fh.(*fs.LoopbackFile), h: n.h}, fl, 0
}

// hangFile passes everything to the file beneath, waiting first while the
// switch is on for what a disk does (read, write, sync).
type hangFile struct {
	*fs.LoopbackFile
	h *hangSwitch
}

func (f *hangFile) Read(ctx context.Context, buf []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	f.h.wait()
	return f.LoopbackFile.Read(ctx, buf, off)
}

func (f *hangFile) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	f.h.wait()
	return f.LoopbackFile.Write(ctx, data, off)
}

func (f *hangFile) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	f.h.wait()
	return f.LoopbackFile.Fsync(ctx, flags)
}

// Every request reaches this process (not the kernel's passthrough).
func (f *hangFile) PassthroughFd() (int, bool) { return 0, false }

// mountHanging mounts a loopback of dir at mnt whose files hang on demand.
func mountHanging(t *testing.T, dir, mnt string) (*hangSwitch, *fuse.Server) {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(dir, &st); err != nil {
		t.Fatal(err)
	}
	h := newHangSwitch()
	rd := &fs.LoopbackRoot{Path: dir, Dev: uint64(st.Dev)}
	rd.NewNode = func(rd *fs.LoopbackRoot, _ *fs.Inode, _ string, _ *syscall.Stat_t) fs.InodeEmbedder {
		return &hangNode{LoopbackNode: fs.LoopbackNode{RootData: rd}, h: h}
	}
	root := &hangNode{LoopbackNode: fs.LoopbackNode{RootData: rd}, h: h}
	rd.RootNode = root
	srv, err := fs.Mount(mnt, root, &fs.Options{MountOptions: fuse.MountOptions{FsName: "grove-hangfs", Name: "hangfs", AllowOther: true}})
	if err != nil {
		t.Skipf("FUSE mount: %v (needs /dev/fuse and root)", err)
	}
	return h, srv
}

// TestEndToEndRLDevHungDiskSIGKILL, on `grove up --processes`: node 2's
// disk is a file behind a FUSE mount of this test that can stop
// answering. With it hung, writes to an RLDev whose primary is on node 2
// and to one whose secondary is there go on (the node, alive to the
// failure detector, fails its segments after its disk timeout, 3 s here,
// and their peers serve alone); `grove rldev list` shows the segments
// stale and why. Then the hung node is SIGKILLed (an operator's way out),
// its disk answers again, it restarts, and both RLDevs resync: every
// byte reads back from node 2's copies.
func TestEndToEndRLDevHungDiskSIGKILL(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("FUSE needs root")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("no /dev/fuse")
	}
	bin, u, ctx := startCluster(t, 7600)
	keepLogsOnFailure(t, u, "hungdisk")
	cl := rldevCLI{t: t, bin: bin, ep: u.Gateway}
	run, must, list := cl.run, cl.must, cl.list

	// Node 2's disk goes behind the FUSE mount, with a 3 s disk timeout.
	const victim = 2
	if err := u.Stop(victim, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	cfgPath := u.Nodes[victim].Config
	cfg, err := node.ReadConfig(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	ndir := filepath.Dir(cfgPath)
	backing, mnt := filepath.Join(t.TempDir(), "backing"), filepath.Join(t.TempDir(), "mnt")
	for _, d := range []string{backing, mnt} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	disk := cfg.Disks[0]
	if !filepath.IsAbs(disk) {
		disk = filepath.Join(ndir, disk)
	}
	if err := os.Rename(disk, filepath.Join(backing, "disk.img")); err != nil {
		t.Fatal(err)
	}
	h, srv := mountHanging(t, backing, mnt)
	t.Cleanup(func() {
		// The nodes first (a node holding the file keeps the mount busy).
		h.set(false)
		u.Close()
		if err := srv.Unmount(); err != nil {
			t.Logf("unmount %s: %v", mnt, err)
		}
	})
	if err := os.Symlink(filepath.Join(mnt, "disk.img"), disk); err != nil {
		t.Fatal(err)
	}
	cfg.RLDev.DiskTimeout = node.Duration(3 * time.Second)
	if err := cfg.Write(cfgPath); err != nil {
		t.Fatal(err)
	}
	if err := u.Restart(victim); err != nil {
		t.Fatal(err)
	}

	// Three RLDevs on the chain of three nodes: node 2 is the primary of
	// one and the secondary of another.
	must(run(nil, "rldev", "create", "--size", "16MiB", "--count", "3"))
	var asPrimary, asSecondary uint64
	for _, r := range list().RLDevs {
		switch {
		case r.Primary.Node == victim:
			asPrimary = r.RLDev
		case r.Secondary.Node == victim:
			asSecondary = r.RLDev
		}
	}
	if asPrimary == 0 || asSecondary == 0 {
		t.Fatalf("no RLDev with node %d as primary and one as secondary: %+v", victim, list())
	}
	ids := []uint64{asPrimary, asSecondary}
	want := map[uint64][]byte{}
	for _, id := range ids {
		want[id] = make([]byte, 4<<20)
		rand.Read(want[id])
		must(run(want[id][:2<<20], "rldev", "write", strconv.FormatUint(id, 10), "0"))
	}

	// The disk is slow first: each operation 50 ms, one at a time (its
	// two scrubbers keep it busy), so a forward to node 2 goes unanswered
	// past the primary's 500 ms and is sent again. The write still
	// succeeds, and the disk is not hung: its RLDevs stay normal (before
	// 2026-11-30 (night) each copy sent again was written again, and the disk
	// was failed for an operation's age in its queue). With 100 ms a
	// write took 4-5 s here; with 400 ms the queue grew without end and
	// an operation waited three disk timeouts: hung, rightly.
	h.setSlow(50 * time.Millisecond)
	start := time.Now()
	must(run(want[asSecondary][2<<20:2<<20+64<<10], "rldev", "write", strconv.FormatUint(asSecondary, 10), "2MiB"))
	t.Logf("rldev %d: a 64 KiB write with node %d's disk slow took %v", asSecondary, victim, time.Since(start).Round(time.Millisecond))
	h.setSlow(0)
	for _, r := range list().RLDevs {
		if r.State != "normal" {
			t.Fatalf("rldev %d is %s after writes with node %d's disk slow, not hung: %+v", r.RLDev, r.State, victim, list())
		}
	}
	if m := scrapeMetrics(t, u.Nodes[victim].GRPC); m["grove_rldev_events_total{event=disk_hang}"] != 0 {
		t.Fatalf("node %d's slow disk was found hung", victim)
	} else {
		t.Logf("node %d, its disk slow: %v forwards received again while being written", victim, m["grove_rldev_events_total{event=forward_duplicate}"])
	}

	// The disk hangs: writes go on once its node fails its segments.
	h.set(true)
	for _, id := range ids {
		start := time.Now()
		must(run(want[id][2<<20:], "rldev", "write", strconv.FormatUint(id, 10), "2MiB"))
		t.Logf("rldev %d: a write with node %d's disk hung took %v", id, victim, time.Since(start).Round(time.Millisecond))
	}
	if h.waiting() == 0 {
		t.Fatal("nothing waited on the hung disk: the test hung nothing")
	}
	for _, id := range ids {
		if got := must(run(nil, "rldev", "read", strconv.FormatUint(id, 10), "0", "4MiB")).stdout; !bytes.Equal([]byte(got), want[id]) {
			t.Fatalf("rldev %d, disk hung: the data read back differs", id)
		}
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		stale := 0
		for _, r := range list().RLDevs {
			for _, s := range []segJSON{r.Primary, r.Secondary} {
				if r.State == "degraded" && s.Node == victim && s.Stale {
					stale++
				}
			}
		}
		if stale >= 2 {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("node %d's segments never listed stale with its disk hung: %+v", victim, list())
		}
	}
	if r := must(run(nil, "rldev", "list")); !contains(r.stdout, "hung") {
		t.Errorf("rldev list does not say the disk hung:\n%s", r.stdout)
	} else {
		t.Logf("rldev list, node %d's disk hung:\n%s", victim, r.stdout)
	}

	// The operator kills the hung node; the disk answers again; it
	// comes back and both RLDevs are resynced onto it.
	pid := u.Nodes[victim].PID
	// SIGKILL alone, not u.Kill, which waits for the process to exit: a
	// thread blocked in the hung disk's request -- the leader itself, as
	// it happens -- exits only once the disk answers (a CI run: "still
	// running 10 s after SIGKILL").
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	h.set(false)
	// Its threads blocked in a request this file system had taken (as
	// in a hung disk's I/O) wait uninterruptibly for the answer: the
	// process is gone, and its data directory's lock with it, only once
	// the disk answers and they end. (Its leader is a zombie before.)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %d (pid %d) not gone 20 s after SIGKILL and its disk answering", victim, pid)
		}
	}
	if err := u.Restart(victim); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		normal := 0
		for _, r := range list().RLDevs {
			if (r.RLDev == asPrimary || r.RLDev == asSecondary) && r.State == "normal" {
				normal++
			}
		}
		if normal == 2 {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("the RLDevs never normal again after the disk answered: %+v", list())
		}
	}
	for _, id := range ids {
		for _, rep := range []string{"1", "2"} { // both copies, node 2's among them
			if got := must(run(nil, "rldev", "read", "--replica", rep, strconv.FormatUint(id, 10), "0", "4MiB")).stdout; !bytes.Equal([]byte(got), want[id]) {
				t.Fatalf("rldev %d: replica %s differs after the resync", id, rep)
			}
		}
	}
}
