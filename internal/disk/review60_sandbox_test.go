package disk

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Outside review 60: FileDevice.DropCache takes only ENOSYS from
// cachestat(2) as "cannot tell" (Linux before 6.5). A sandbox that denies
// the call answers EPERM instead: Docker/containerd default profiles
// (defaultErrnoRet EPERM for a syscall they do not list), systemd units
// with SystemCallFilter= and SystemCallErrorNumber=EPERM, and sandboxes
// that deny cachestat on purpose (a page-cache side channel). There every
// DropCache fails with a plain error, not ErrStillCached: replica.dropCache
// fails the replica at once (no retry), want() marks it stale with
// FullCopy, and every reload fails the same way. As the Service starts
// every engine suspect, every replica's first load drops: every replica
// on every node of such a deployment fails, and no RLDev is served.
//
// The test runs DropCache in a child process whose seccomp filter makes
// cachestat fail with the errno given (ENOSYS: a kernel without it;
// EPERM: a sandbox that denies it).
func TestReview60DropCacheWhereCachestatIsDenied(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("the filter is written for x86-64")
	}
	if errno := os.Getenv("REVIEW60_CACHESTAT_ERRNO"); errno != "" {
		review60Child(t, errno)
		return
	}
	for _, errno := range []string{"ENOSYS", "EPERM"} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestReview60DropCacheWhereCachestatIsDenied$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), "REVIEW60_CACHESTAT_ERRNO="+errno, "REVIEW60_DIR="+t.TempDir())
		out, err := cmd.CombinedOutput()
		res := ""
		for _, l := range strings.Split(string(out), "\n") {
			if i := strings.Index(l, "RESULT "); i >= 0 {
				res = l[i+len("RESULT "):]
			}
		}
		t.Logf("cachestat denied with %s: DropCache -> %s", errno, res)
		if res == "" {
			t.Fatalf("child: %v\n%s", err, out)
		}
		if res != "<nil>" {
			t.Errorf("with cachestat denied by %s, DropCache fails hard (%s): the engine fails every replica at its first load (Suspect is always true) and at every reload", errno, res)
		}
	}
}

func review60Child(t *testing.T, errno string) {
	review60DenyCachestat(t, errno)
	d, err := OpenFile(filepath.Join(os.Getenv("REVIEW60_DIR"), "dev"), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := d.WriteAt(bytes.Repeat([]byte{7}, 64<<10), 0); err != nil {
		t.Fatal(err)
	}
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
	fmt.Printf("RESULT %v\n", d.DropCache(0, 64<<10))
}

// review60DenyCachestat makes every thread's cachestat(2) fail with errno.
func review60DenyCachestat(t *testing.T, errno string) {
	e := map[string]syscall.Errno{"ENOSYS": unix.ENOSYS, "EPERM": unix.EPERM}[errno]
	const ldAbs = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
	const jeq = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
	const ret = unix.BPF_RET | unix.BPF_K
	filter := []unix.SockFilter{
		{Code: ldAbs, K: 4}, // arch
		{Code: jeq, K: unix.AUDIT_ARCH_X86_64, Jt: 0, Jf: 3},
		{Code: ldAbs, K: 0}, // syscall number
		{Code: jeq, K: unix.SYS_CACHESTAT, Jt: 0, Jf: 1},
		{Code: ret, K: unix.SECCOMP_RET_ERRNO | uint32(e)},
		{Code: ret, K: unix.SECCOMP_RET_ALLOW},
	}
	prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		t.Fatal(err)
	}
	if _, _, en := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&prog))); en != 0 {
		t.Fatalf("seccomp: %v", en)
	}
}

// TestReview60NoCachestatLeavesLostPages: where cachestat is missing
// (ENOSYS: Linux before 6.5, e.g. Debian 12's 6.1, with XFS, whose page
// cache has had large folios since 5.18) DropCache skips its check and
// returns nil over review 59's case: a lost page whose large folio a
// neighbour's write keeps dirty. The replica then loads from the cache
// the write its failed sync lost. Run on the review 59 rig (block device,
// whose page cache has large folios on this kernel) in a child process
// whose cachestat answers ENOSYS.
func TestReview60NoCachestatLeavesLostPages(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("the filter is written for x86-64")
	}
	if os.Getenv("REVIEW60_NOCACHESTAT") != "" {
		review60DenyCachestat(t, "ENOSYS")
		r := newLostPagesRig(t)
		const off, n = 1 << 20, 64 << 10
		d := r.lostWrite(off, n)
		// The neighbour (the folio's last page) writes; the replica's
		// drop: a Sync, then, the neighbour writing again, DropCache.
		page := bytes.Repeat([]byte{0xC}, 4096)
		d.WriteAt(page, off+n-4096)
		if err := d.Sync(); err != nil {
			t.Fatal(err)
		}
		d.WriteAt(page, off+n-4096)
		err := d.DropCache(off, n-4096)
		fmt.Printf("RESULT DropCache %v; read %#x; disk %#x\n", err, readByte(t, d, off), directByte(t, r.loop, off))
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestReview60NoCachestatLeavesLostPages$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), "REVIEW60_NOCACHESTAT=1")
	out, err := cmd.CombinedOutput()
	res := ""
	for _, l := range strings.Split(string(out), "\n") {
		if i := strings.Index(l, "RESULT "); i >= 0 {
			res = l[i+len("RESULT "):]
		}
		if strings.Contains(l, "SKIP") {
			t.Skip(string(out))
		}
	}
	if res == "" {
		t.Fatalf("child: %v\n%s", err, out)
	}
	t.Logf("without cachestat: %s", res)
	if strings.HasPrefix(res, "DropCache <nil>; read 0xb; disk 0x0") {
		t.Errorf("without cachestat, DropCache returned nil and reads still see the lost write (0xb) where the disk holds 0x0")
	}
}
