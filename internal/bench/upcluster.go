package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/transport"
)

// UpCluster drives a real `grove up --processes` cluster: real processes,
// real sockets, real fsync. The end-to-end tests and `grove bench fd` use it.
type UpCluster struct {
	Bin       string
	Dir       string // --data
	Gateway   string
	Nodes     map[uint64]*UpNode
	Observers int // config-service members (the failure detector's observers)
	up        *exec.Cmd
	conn      *grpc.ClientConn
	mu        sync.Mutex
	extra     []*exec.Cmd // nodes restarted by hand with `grove server`
	lines     chan string
	Log       io.Writer // up's stdout lines are copied here (nil: dropped)
}

// UpNode is one node as `grove up` printed it.
type UpNode struct {
	ID     uint64
	PID    int
	GRPC   string
	Config string
}

// StartUp runs `bin up --processes --data dir --base-port port` and waits for
// its ready line.
func StartUp(ctx context.Context, bin, dir string, port int, log io.Writer, extra ...string) (*UpCluster, error) {
	args := append([]string{"up", "--processes", "--data", dir, "--base-port", strconv.Itoa(port)}, extra...)
	cmd := exec.Command(bin, args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	u := &UpCluster{Bin: bin, Dir: dir, Gateway: fmt.Sprintf("127.0.0.1:%d", port), Nodes: map[uint64]*UpNode{}, up: cmd, lines: make(chan string, 100), Log: log}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if u.Log != nil {
				fmt.Fprintln(u.Log, "grove up:", sc.Text())
			}
			select {
			case u.lines <- sc.Text():
			default:
			}
		}
		close(u.lines)
	}()
	for {
		select {
		case <-ctx.Done():
			u.Close()
			return nil, fmt.Errorf("grove up did not get ready: %w", ctx.Err())
		case l, ok := <-u.lines:
			if !ok {
				u.Close()
				return nil, fmt.Errorf("grove up exited before ready")
			}
			if strings.HasPrefix(l, "ready") {
				u.conn, err = grpc.NewClient(u.Gateway, transport.DialOptions()...)
				if err != nil {
					u.Close()
					return nil, err
				}
				st, err := u.Status(ctx)
				if err != nil {
					u.Close()
					return nil, err
				}
				u.Observers = len(st.Members)
				return u, nil
			}
			if n, err := ParseNodeLine(l); err == nil {
				u.Nodes[n.ID] = n
			}
		}
	}
}

// ParseNodeLine parses `node <id> pid=<pid> grpc=<addr> beacon=<addr> config=<path>`.
func ParseNodeLine(l string) (*UpNode, error) {
	f := strings.Fields(l)
	if len(f) != 6 || f[0] != "node" {
		return nil, fmt.Errorf("not a node line: %q", l)
	}
	id, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil {
		return nil, err
	}
	kv := map[string]string{}
	for _, p := range f[2:] {
		k, v, ok := strings.Cut(p, "=")
		if !ok {
			return nil, fmt.Errorf("bad field %q in %q", p, l)
		}
		kv[k] = v
	}
	pid, err := strconv.Atoi(kv["pid"])
	if err != nil {
		return nil, err
	}
	return &UpNode{ID: id, PID: pid, GRPC: kv["grpc"], Config: kv["config"]}, nil
}

// Up is the `grove up` process (tests signal it).
func (u *UpCluster) Up() *exec.Cmd { return u.up }

// Status asks the gateway.
func (u *UpCluster) Status(ctx context.Context) (*pb.StatusResponse, error) {
	c, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return pb.NewClusterServiceClient(u.conn).Status(c, &pb.StatusRequest{})
}

// Kill sends SIGKILL to a node's process and waits until it has exited
// (its sockets are closed then; a restart on the same ports right after
// would otherwise find them taken on a loaded machine).
func (u *UpCluster) Kill(id uint64) error {
	pid := u.Nodes[id].PID
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return err
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if Exited(pid) {
			return nil
		}
	}
	return fmt.Errorf("node %d (pid %d) still running 10 s after SIGKILL", id, pid)
}

// Stop stops node id as an operator does (SIGTERM: a clean close) and
// waits up to timeout for its process to exit.
func (u *UpCluster) Stop(id uint64, timeout time.Duration) error {
	pid := u.Nodes[id].PID
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return err
	}
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if Exited(pid) {
			return nil
		}
	}
	return fmt.Errorf("node %d (pid %d) still running %v after SIGTERM", id, pid, timeout)
}

// Exited reports whether a process is gone, or a zombie with every thread
// gone (it has exited and released its resources, but its parent has not
// reaped it yet). The main thread turns zombie as soon as it exits, while
// other threads may still be leaving the kernel (one in an fdatasync): the
// process's files, and its flock on a data directory, are released only
// when the last of them has. Taken for gone before that, a SIGKILLed node
// restarted at once found its data directory still locked (CI, 2026-12-02:
// TestEndToEndRLDevOwedSIGKILL, "locked by another process", its own pid).
func Exited(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	// The state follows the command name, which is in parentheses.
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) && (s[i+2] == 'Z' || s[i+2] == 'X') {
		// A thread that has finished exiting is no longer listed; the
		// zombie main thread stays until the process is reaped.
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		return err != nil || len(tasks) <= 1
	}
	return false
}

// Restart runs the node's printed command, `grove server --config PATH`.
func (u *UpCluster) Restart(id uint64) error {
	n := u.Nodes[id]
	cmd := exec.Command(u.Bin, "server", "--config", n.Config)
	lf, err := os.OpenFile(filepath.Join(filepath.Dir(n.Config), "grove.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = lf, lf
	if err := cmd.Start(); err != nil {
		lf.Close()
		return err
	}
	go func() { cmd.Wait(); lf.Close() }()
	u.mu.Lock()
	u.extra = append(u.extra, cmd)
	u.mu.Unlock()
	n.PID = cmd.Process.Pid
	return nil
}

// WaitNode polls status until pred holds for node id, returning how long it
// took. Status errors (a config-service election in progress) are retried.
func (u *UpCluster) WaitNode(ctx context.Context, id uint64, every time.Duration, pred func(*pb.NodeStatus) bool) (*pb.NodeStatus, time.Duration, error) {
	start := time.Now()
	var last string
	for {
		r, err := u.Status(ctx)
		if err == nil {
			for _, n := range r.Nodes {
				if n.Id == id && pred(n) {
					return n, time.Since(start), nil
				}
				if n.Id == id {
					last = fmt.Sprintf("alive=%v incarnation=%d dead votes %d/%d", n.Alive, n.Incarnation, n.ObserversDead, n.ObserversAnswered)
				}
			}
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return nil, time.Since(start), fmt.Errorf("node %d: condition not met (last: %s): %w", id, last, ctx.Err())
		case <-time.After(every):
		}
	}
}

// WaitAllHeard waits until every node is alive and heard by every observer:
// the cluster can then lose any one node without anyone losing its
// majority of observers.
func (u *UpCluster) WaitAllHeard(ctx context.Context) error {
	for {
		r, err := u.Status(ctx)
		if err == nil {
			ok := len(r.Nodes) == len(u.Nodes)
			for _, n := range r.Nodes {
				ok = ok && n.Alive && int(n.ObserversHeard) == u.Observers
			}
			if ok {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not every node is heard by every observer: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Leader returns the config-service leader as the gateway reports it.
func (u *UpCluster) Leader(ctx context.Context) (uint64, error) {
	r, err := u.Status(ctx)
	if err != nil {
		return 0, err
	}
	return r.Leader, nil
}

// Close stops `grove up` (which stops its children) and every node that was
// restarted by hand.
func (u *UpCluster) Close() {
	if u.conn != nil {
		u.conn.Close()
	}
	u.mu.Lock()
	extra := u.extra
	u.extra = nil
	u.mu.Unlock()
	for _, c := range extra {
		c.Process.Signal(syscall.SIGTERM)
	}
	u.up.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { u.up.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		u.up.Process.Kill()
		<-done
	}
	for _, c := range extra {
		c.Process.Kill()
	}
}
