package disk

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// WriteAtVec goes through (*os.File).SyscallConn's RawConn.Write, which
// takes the file's fdMutex write lock (internal/poll.FD.RawWrite), while
// WriteAt (pwrite) takes only a reference (poll.FD.Pwrite: "Call incref,
// not writeLock"). So two vectored writes on one device never run at
// once: while one is in the kernel (held here by holding the same lock,
// as a pwritev blocked in the kernel holds it), every other block write of
// the disk waits in user space. Buffered writes to a block device take no
// inode lock in the kernel, so there the disk workers' parallelism is
// lost; on ext4/xfs files i_rwsem serializes buffered writes anyway.
func TestReview95WriteAtVecSerializedByFdMutex(t *testing.T) {
	d, err := OpenFile(filepath.Join(t.TempDir(), "disk"), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	rc, err := d.f.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	inKernel, release := make(chan struct{}), make(chan struct{})
	held := make(chan error, 1)
	go func() { // another write, stalled in the kernel
		held <- rc.Write(func(fd uintptr) bool {
			close(inKernel)
			<-release
			return true
		})
	}()
	<-inKernel
	defer func() { close(release); <-held }()

	done := make(chan error, 2)
	go func() { _, err := d.WriteAt(make([]byte, 4608), 0); done <- err }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("WriteAt waited for another write")
	}
	go func() { _, err := d.WriteAtVec([][]byte{make([]byte, 512), make([]byte, 4096)}, 8192); done <- err }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("WriteAtVec of other sectors waited 2s for another write on the same file to leave the kernel: vectored block writes of a disk are serialized (fdMutex write lock), WriteAt's are not")
	}
}

// After Close, WriteAt fails with an error that is os.ErrClosed (wrapped
// in a *PathError); WriteAtVec returns poll's raw "use of closed file",
// which is not.
func TestReview95WriteAtVecClosedError(t *testing.T) {
	d, err := OpenFile(filepath.Join(t.TempDir(), "disk"), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
	_, werr := d.WriteAt(make([]byte, 512), 0)
	_, verr := d.WriteAtVec([][]byte{make([]byte, 512)}, 0)
	t.Logf("WriteAt: %v; WriteAtVec: %v", werr, verr)
	if !errors.Is(werr, os.ErrClosed) {
		t.Fatalf("WriteAt after Close: %v", werr)
	}
	var pe *os.PathError
	if !errors.Is(verr, os.ErrClosed) || !errors.As(verr, &pe) {
		t.Fatalf("WriteAtVec after Close: %v (%T), not os.ErrClosed in a *PathError as WriteAt's", verr, verr)
	}
}
