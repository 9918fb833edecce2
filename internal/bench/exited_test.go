package bench

import (
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// TestExited: a running process is not exited; SIGKILLed and not yet
// reaped (a zombie), it is, once every thread is gone.
func TestExited(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Skip(err)
	}
	pid := cmd.Process.Pid
	defer cmd.Wait()
	if Exited(pid) {
		t.Fatal("a running process is taken for exited")
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !Exited(pid) {
		if time.Now().After(deadline) {
			t.Fatal("a killed process, not reaped, is not taken for exited after 5 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
