package main

import (
	"bufio"
	"context"
	"encoding/json"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/bench"
	"github.com/grovestore/grove/internal/fd"
)

// cliHold runs `grove lock acquire NAME --addr ADDR` and reports its lines.
type cliHold struct {
	cmd   *exec.Cmd
	lines chan string
}

func startHold(t *testing.T, bin, name, addr string) *cliHold {
	t.Helper()
	cmd := exec.Command(bin, "lock", "acquire", name, "--mode", "exclusive", "--addr", addr)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = testWriter{t}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &cliHold{cmd: cmd, lines: make(chan string, 10)}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			t.Logf("lock acquire --addr %s: %s", addr, sc.Text())
			h.lines <- sc.Text()
		}
		close(h.lines)
	}()
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return h
}

// granted waits up to d for the "granted" line; false if it did not come.
func (h *cliHold) granted(d time.Duration) bool {
	select {
	case l, ok := <-h.lines:
		return ok && strings.HasPrefix(l, "granted")
	case <-time.After(d):
		return false
	}
}

// waitLockServing waits until the lock master serves with n clerks.
func waitLockServing(t *testing.T, bin, addr string, n int) LockListJSON {
	t.Helper()
	var l LockListJSON
	for deadline := time.Now().Add(30 * time.Second); ; {
		out, err := exec.Command(bin, "lock", "list", "--json", "--addr", addr).Output()
		if err == nil && json.Unmarshal(out, &l) == nil && l.Serving && len(l.Clerks) == n {
			return l
		}
		if time.Now().After(deadline) {
			t.Fatalf("lock service not serving with %d clerks: %v %s", n, err, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func lockList(t *testing.T, bin, addr string) LockListJSON {
	t.Helper()
	out, err := exec.Command(bin, "lock", "list", "--json", "--addr", addr).Output()
	if err != nil {
		t.Fatalf("grove lock list: %v", err)
	}
	var l LockListJSON
	if err := json.Unmarshal(out, &l); err != nil {
		t.Fatalf("lock list json: %v\n%s", err, out)
	}
	return l
}

// TestEndToEndLock: `grove up --processes`; node H's clerk holds an
// exclusive lock through the CLI, node W's clerk waits for it; SIGKILL H:
// the lock goes to W only after the failure detector's verdict. Then H is
// restarted and the lock master's node is killed: a standby takes over and
// `grove lock list` agrees that W holds the lock.
func TestEndToEndLock(t *testing.T) {
	if testing.Short() {
		t.Skip("real processes")
	}
	bin := buildGrove(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	u, err := bench.StartUp(ctx, bin, t.TempDir(), 8000, testWriter{t})
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	l := waitLockServing(t, bin, u.Gateway, 3)
	master := l.Master
	var others []uint64
	for id := uint64(1); id <= 3; id++ {
		if id != master {
			others = append(others, id)
		}
	}
	H, W := others[0], others[1]
	holder := startHold(t, bin, "L", u.Nodes[H].GRPC)
	if !holder.granted(10 * time.Second) {
		t.Fatal("holder on node H not granted")
	}
	waiter := startHold(t, bin, "L", u.Nodes[W].GRPC)
	if waiter.granted(2 * time.Second) {
		t.Fatal("waiter granted while the holder holds an exclusive lease")
	}
	killed := time.Now()
	if err := u.Kill(H); err != nil {
		t.Fatal(err)
	}
	if !waiter.granted(20 * time.Second) {
		t.Fatal("waiter not granted after the holder's node died")
	}
	after := time.Since(killed)
	// The lock may change hands only after the failure detector's verdict.
	// Verdicts are permanent (a majority of observers tombstoned H), so the
	// very next status query must already report H dead.
	st, err := u.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range st.Nodes {
		if n.Id == H && n.Alive {
			t.Fatalf("lock handed to W %v after SIGKILL while the failure detector still reports H alive (%d/%d dead votes)", after, n.ObserversDead, n.ObserversAnswered)
		}
	}
	if after < fd.DefaultGracePeriod/2 {
		t.Fatalf("lock handed over %v after SIGKILL: sooner than any verdict could come", after)
	}
	t.Logf("holder's node SIGKILLed → lock granted to the waiter in %v", after)

	// Bring H back (the config service needs 2 of 3), then kill the master.
	if err := u.Restart(H); err != nil {
		t.Fatal(err)
	}
	if _, _, err := u.WaitNode(ctx, H, 50*time.Millisecond, func(n *pb.NodeStatus) bool { return n.Alive }); err != nil {
		t.Fatal(err)
	}
	if err := u.Kill(master); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		out, err := exec.Command(bin, "lock", "list", "--json", "--addr", u.Nodes[W].GRPC).Output()
		if err == nil && json.Unmarshal(out, &l) == nil && l.Master != master && l.Serving {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no standby took over from master %d: %v %s", master, err, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("standby on node %d took over (epoch %d)", l.Master, l.Epoch)
	found := false
	for _, lk := range l.Locks {
		if lk.Name != "L" {
			continue
		}
		for c, m := range lk.Holders {
			if strings.HasPrefix(c, strconv.FormatUint(W, 10)+".") && m == "exclusive" && len(lk.Holders) == 1 {
				found = true
			}
		}
	}
	if !found {
		t.Fatalf("new master lost W's exclusive lease on L: %+v", l.Locks)
	}
	// Same answer through the gateway.
	if g := lockList(t, bin, u.Gateway); g.Master != l.Master || g.Epoch != l.Epoch {
		t.Fatalf("gateway sees master %d epoch %d, node sees %d/%d", g.Master, g.Epoch, l.Master, l.Epoch)
	}
}

// TestEndToEndPauseFences: a node paused (SIGSTOP) for longer than
// GracePeriod while its clerk holds a lock is declared dead; the waiter gets
// the lock; when the node resumes it finds itself dead, fences (its holder is
// told the lease is lost) and comes back with a higher incarnation.
func TestEndToEndPauseFences(t *testing.T) {
	if testing.Short() {
		t.Skip("real processes")
	}
	bin := buildGrove(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	u, err := bench.StartUp(ctx, bin, t.TempDir(), 8100, testWriter{t})
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	l := waitLockServing(t, bin, u.Gateway, 3)
	r, err := u.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The paused node is neither the lock master nor the config leader.
	var P, W uint64
	for id := uint64(1); id <= 3; id++ {
		if id != l.Master && id != r.Leader && P == 0 {
			P = id
		}
	}
	if P == 0 {
		P = 1 + l.Master%3 // master and leader coincide on one node: pick another
	}
	for id := uint64(1); id <= 3; id++ {
		if id != P && W == 0 {
			W = id
		}
	}
	var before uint64
	for _, n := range r.Nodes {
		if n.Id == P {
			before = n.Incarnation
		}
	}
	holder := startHold(t, bin, "P", u.Nodes[P].GRPC)
	if !holder.granted(10 * time.Second) {
		t.Fatal("holder not granted")
	}
	waiter := startHold(t, bin, "P", u.Nodes[W].GRPC)
	pid := u.Nodes[P].PID
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	if !waiter.granted(20 * time.Second) {
		syscall.Kill(pid, syscall.SIGCONT)
		t.Fatal("waiter not granted while the holder's node is paused")
	}
	t.Logf("paused node's lock granted to the waiter after %v", time.Since(stopped))
	time.Sleep(500 * time.Millisecond)
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	// The holder learns its lease is gone (the node fenced itself).
	select {
	case l, ok := <-holder.lines:
		if ok && strings.HasPrefix(l, "released") {
			t.Fatalf("paused holder reports an orderly release: %q", l)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("paused holder never learned that its lease was lost")
	}
	n, _, err := u.WaitNode(ctx, P, 50*time.Millisecond, func(n *pb.NodeStatus) bool { return n.Alive && n.Incarnation > before })
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("node %d fenced itself and came back: incarnation %d → %d", P, before, n.Incarnation)
}
