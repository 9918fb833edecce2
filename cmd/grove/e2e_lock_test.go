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

// cliHold runs `grove lock acquire NAME --addr ADDR` and reports its lines
// (stdout) and its error lines (stderr).
type cliHold struct {
	cmd    *exec.Cmd
	lines  chan string
	errors chan string
}

func startHold(t *testing.T, bin, name, addr string) *cliHold {
	t.Helper()
	cmd := exec.Command(bin, "lock", "acquire", name, "--mode", "exclusive", "--addr", addr)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &cliHold{cmd: cmd, lines: make(chan string, 10), errors: make(chan string, 10)}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			t.Logf("lock acquire --addr %s (stderr): %s", addr, sc.Text())
			h.errors <- sc.Text()
		}
	}()
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

// verdictPoller polls the failure-detector service about one node.
type verdictPoller struct {
	done  chan struct{}
	out   chan verdictPolls
	polls []verdictPoll
}

type verdictPoll struct {
	start               time.Time
	dead, conclusive    bool
	deadVotes, answered uint32
}

type verdictPolls struct {
	polls []verdictPoll
	first time.Time // end of the first poll that found the node dead
}

func startVerdictPoller(ctx context.Context, u *bench.UpCluster, id uint64) *verdictPoller {
	p := &verdictPoller{done: make(chan struct{}), out: make(chan verdictPolls, 1)}
	go func() {
		var r verdictPolls
		for {
			select {
			case <-p.done:
				p.out <- r
				return
			case <-time.After(10 * time.Millisecond):
			}
			start := time.Now()
			st, err := u.Status(ctx)
			if err != nil {
				continue
			}
			for _, n := range st.Nodes {
				if n.Id != id {
					continue
				}
				vp := verdictPoll{start: start, dead: !n.Alive, deadVotes: n.ObserversDead, answered: n.ObserversAnswered,
					conclusive: !n.Alive || int(n.ObserversAnswered) > u.Observers/2}
				r.polls = append(r.polls, vp)
				if vp.dead && r.first.IsZero() {
					r.first = time.Now() // the verdict existed by the time the answers came
				}
			}
		}
	}()
	return p
}

func (p *verdictPoller) stop() verdictPolls {
	close(p.done)
	return <-p.out
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
	bin, u, ctx := startCluster(t, 8000)
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
	// An independent observer of the verdict, started before the kill: it
	// polls the failure detector's service (grove status) every 10 ms.
	polls := startVerdictPoller(ctx, u, H)
	killed := time.Now()
	if err := u.Kill(H); err != nil {
		t.Fatal(err)
	}
	if !waiter.granted(20 * time.Second) {
		t.Fatal("waiter not granted after the holder's node died")
	}
	granted := time.Now()
	after := granted.Sub(killed)
	time.Sleep(300 * time.Millisecond) // let the poller see past the grant
	verdict := polls.stop()
	// The lock may change hands only after the verdict. Verdicts are
	// permanent, so a poll that started after the grant and still found H
	// alive (with answers from a majority of observers) proves the grant
	// came first.
	for _, p := range verdict.polls {
		if p.start.After(granted) && p.conclusive && !p.dead {
			t.Fatalf("lock granted to W at +%v, but a status poll started at +%v still found H alive (%d/%d dead votes)",
				after, p.start.Sub(killed), p.deadVotes, p.answered)
		}
	}
	if verdict.first.IsZero() {
		t.Fatal("the poller never saw H declared dead")
	}
	if after < fd.DefaultGracePeriod/2 {
		t.Fatalf("lock handed over %v after SIGKILL: sooner than any verdict could come", after)
	}
	t.Logf("holder's node SIGKILLed → verdict seen at +%v, lock granted to the waiter at +%v", verdict.first.Sub(killed), after)

	// Bring H back (the config service and the detector need 2 of 3), and
	// wait until its observer hears W too, then kill the master.
	if err := u.Restart(H); err != nil {
		t.Fatal(err)
	}
	if err := u.WaitAllHeard(ctx); err != nil {
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
		if lk.Lock != "L" {
			continue
		}
		for _, h := range lk.Holders {
			if strings.HasPrefix(h.Clerk, strconv.FormatUint(W, 10)+".") && h.Mode == "exclusive" && len(lk.Holders) == 1 {
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
	bin, u, ctx := startCluster(t, 8100)
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
	// The holder learns that its lease is gone, and why: its node fenced
	// itself (not just any end of the stream).
	select {
	case l := <-holder.errors:
		if !strings.Contains(l, `lease on "P" lost`) || !strings.Contains(l, "fenced") {
			t.Fatalf("paused holder's error does not say the lease was lost to a fence: %q", l)
		}
	case l, ok := <-holder.lines:
		if !ok {
			// stdout closed as the process exited: its error line is on
			// stderr, read by another goroutine.
			select {
			case l := <-holder.errors:
				if !strings.Contains(l, `lease on "P" lost`) || !strings.Contains(l, "fenced") {
					t.Fatalf("paused holder's error does not say the lease was lost to a fence: %q", l)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("paused holder exited without saying why")
			}
			break
		}
		t.Fatalf("paused holder printed %q instead of losing its lease", l)
	case <-time.After(10 * time.Second):
		t.Fatal("paused holder never learned that its lease was lost")
	}
	if err := holder.cmd.Wait(); err == nil {
		t.Fatal("grove lock acquire exited 0 after losing its lease")
	}
	n, _, err := u.WaitNode(ctx, P, 50*time.Millisecond, func(n *pb.NodeStatus) bool { return n.Alive && n.Incarnation > before })
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("node %d fenced itself and came back: incarnation %d → %d", P, before, n.Incarnation)
}
