package faults

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/grovestore/grove/internal/node"
)

// Ports every node uses on its own address (each node has a namespace).
const (
	grpcPort    = 7410
	raftPort    = 7411
	beaconPort  = 7412
	metricsPort = 7413
)

// Build compiles the grove binary into dir once per run: the suite tests
// the real binary, as an operator runs it.
func Build(dir string) (string, error) {
	bin := filepath.Join(dir, "grove")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/grovestore/grove/cmd/grove").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, out)
	}
	return bin, nil
}

// Cluster is a real cluster of `grove server` processes, one per node
// namespace, every node a config-service member, observer, lock-master
// candidate and store, as in the README's three-machine example.
type Cluster struct {
	Nodes []*Node // Nodes[i-1] is node i
	FD    node.FDConfig
}

// Node is one `grove server` process and its files.
type Node struct {
	ID     int
	Config string // its config file
	Log    string // its stdout and stderr: slog text lines
	// Tombstones is the observer's file of durable dead verdicts
	// (internal/fd/driver.go: a JSON object, node id → incarnation).
	Tombstones string
	cmd        *exec.Cmd
	exited     chan struct{}
	mu         sync.Mutex
	pauses     []span // when it was stopped (SIGSTOP..SIGCONT)
}

// span is a closed or open interval of wall-clock time (an open span has a
// zero end).
type span struct{ from, to time.Time }

// GRPC, Raft and Beacon are node i's addresses.
func GRPC(i int) string   { return fmt.Sprintf("%s:%d", NodeAddr(i), grpcPort) }
func Raft(i int) string   { return fmt.Sprintf("%s:%d", NodeAddr(i), raftPort) }
func Beacon(i int) string { return fmt.Sprintf("%s:%d", NodeAddr(i), beaconPort) }

// Metrics is node i's Prometheus address.
func Metrics(i int) string { return fmt.Sprintf("%s:%d", NodeAddr(i), metricsPort) }

// StartCluster writes n node configs under dir (one fresh cluster key, the
// README's failure-detector settings) and starts every node with
// --bootstrap inside its namespace. The suite never restarts a node, so
// every start is a first start.
func StartCluster(bin, dir string, n int) (*Cluster, error) {
	c := &Cluster{FD: node.DefaultFD}
	key := node.NewClusterKey()
	var members []node.MemberConfig
	for i := 1; i <= n; i++ {
		members = append(members, node.MemberConfig{ID: uint64(i), GRPC: GRPC(i), Raft: Raft(i), Beacon: Beacon(i)})
	}
	for i := 1; i <= n; i++ {
		nd := filepath.Join(dir, fmt.Sprintf("node-%d", i))
		if err := os.MkdirAll(nd, 0o755); err != nil {
			return nil, err
		}
		cfg := &node.Config{ID: uint64(i), DataDir: filepath.Join(nd, "data"), GRPCAddr: GRPC(i), RaftAddr: Raft(i), BeaconAddr: Beacon(i), MetricsAddr: Metrics(i),
			Roles: []string{node.RoleMeta, node.RoleObserver, node.RoleLock, node.RoleStore}, Disks: []string{"disk0.img"}, DiskSize: 512 << 20, FD: c.FD,
			ClusterKey: key, AcceptClusterKeys: []string{}, Members: members}
		if err := cfg.Validate(); err != nil {
			return nil, err
		}
		x := &Node{ID: i, Config: filepath.Join(nd, "grove.toml"), Log: filepath.Join(nd, "grove.log"),
			Tombstones: filepath.Join(nd, "data", "fd-tombstones.json")}
		if err := cfg.Write(x.Config); err != nil {
			return nil, err
		}
		c.Nodes = append(c.Nodes, x)
	}
	for _, x := range c.Nodes {
		if err := x.start(bin); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

func (x *Node) start(bin string) error {
	lf, err := os.OpenFile(x.Log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	// `ip netns exec` enters the namespace and execs grove: the pid is
	// grove's own, so signals reach the node itself.
	x.cmd = Exec(NodeNS(x.ID), bin, "server", "--config", x.Config, "--bootstrap", "--log-file", x.Log)
	x.cmd.Stdout, x.cmd.Stderr = lf, lf
	x.exited = make(chan struct{})
	if err := x.cmd.Start(); err != nil {
		lf.Close()
		return err
	}
	go func() {
		x.cmd.Wait()
		lf.Close()
		close(x.exited)
	}()
	return nil
}

// DeadVerdicts returns the dead verdicts this node's observer has made
// durable (its tombstone file: node id → newest incarnation declared dead).
func (x *Node) DeadVerdicts() (map[uint64]uint64, error) {
	b, err := os.ReadFile(x.Tombstones)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var m map[uint64]uint64
	return m, json.Unmarshal(b, &m)
}

// Exited reports whether the node's process has ended.
func (x *Node) Exited() bool {
	select {
	case <-x.exited:
		return true
	default:
		return false
	}
}

// Pause stops the node's process (SIGSTOP): a process that is alive but
// does nothing, as under a long GC pause or a VM stall.
func (x *Node) Pause() (time.Time, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if err := x.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		return time.Time{}, err
	}
	// The signal is delivered asynchronously: the pause counts from when
	// the process is seen stopped, so that the checks that rely on "it did
	// nothing while stopped" never cover a moment it still ran.
	for deadline := time.Now().Add(5 * time.Second); !stopped(x.cmd.Process.Pid); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("n%d not stopped 5 s after SIGSTOP", x.ID)
		}
	}
	now := time.Now()
	x.pauses = append(x.pauses, span{from: now})
	return now, nil
}

// stopped reports whether process pid is in the stopped state.
func stopped(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] == 'T'
}

// Resume continues a paused node (SIGCONT).
func (x *Node) Resume() (time.Time, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	// The pause ends when SIGCONT is sent (the process may run at once,
	// before this goroutine reads the clock again).
	now := time.Now()
	err := x.cmd.Process.Signal(syscall.SIGCONT)
	if n := len(x.pauses); n > 0 && x.pauses[n-1].to.IsZero() {
		x.pauses[n-1].to = now
	}
	return now, err
}

// PausedAt reports whether the node was stopped at time t, and if so when
// it was resumed (zero if it still is stopped).
func (x *Node) PausedAt(t time.Time) (bool, time.Time) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, p := range x.pauses {
		if !t.Before(p.from) && (p.to.IsZero() || t.Before(p.to)) {
			return true, p.to
		}
	}
	return false, time.Time{}
}

// stoppedWithin returns the first stop of the node within [from, to) and
// when it was resumed (zero if never).
func (x *Node) stoppedWithin(from, to time.Time) (stop, resumed time.Time, ok bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, p := range x.pauses {
		if !p.from.Before(from) && p.from.Before(to) {
			return p.from, p.to, true
		}
	}
	return time.Time{}, time.Time{}, false
}

// StopTimeout is how long a node has to stop after SIGTERM (graceful
// shutdown) before the suite dumps its goroutines and kills it.
const StopTimeout = 10 * time.Second

// Close stops every node: SIGCONT (a paused node cannot handle SIGTERM)
// and SIGTERM. A node still running StopTimeout later gets SIGQUIT (the Go
// runtime writes every goroutine's stack to its log and exits), then
// SIGKILL; Close names those nodes: a node that does not stop when asked
// is a defect an operator meets.
func (c *Cluster) Close() (stuck []string) {
	for _, x := range c.Nodes {
		if x.cmd != nil && x.cmd.Process != nil && !x.Exited() {
			x.cmd.Process.Signal(syscall.SIGCONT)
			x.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	deadline := time.Now().Add(StopTimeout)
	for _, x := range c.Nodes {
		if x.cmd == nil || x.cmd.Process == nil {
			continue
		}
		select {
		case <-x.exited:
			continue
		case <-time.After(time.Until(deadline)):
		}
		x.cmd.Process.Signal(syscall.SIGQUIT)
		select {
		case <-x.exited:
		case <-time.After(3 * time.Second):
			x.cmd.Process.Kill()
			<-x.exited
		}
		stuck = append(stuck, fmt.Sprintf("n%d did not stop within %v of SIGTERM; its goroutines in Grove's code and raft's (SIGQUIT):\n%s", x.ID, StopTimeout, x.ownGoroutines()))
	}
	return stuck
}

// ownGoroutines returns the goroutine stacks of the node's last SIGQUIT
// dump (the end of its log) that pass through Grove's own code or raft's
// state machine: the ones that say why it did not stop.
func (x *Node) ownGoroutines() string {
	b, err := os.ReadFile(x.Log)
	if err != nil {
		return err.Error()
	}
	s := string(b)
	if i := strings.LastIndex(s, "SIGQUIT: quit"); i >= 0 {
		s = s[i:]
	}
	var keep []string
	for _, g := range strings.Split(s, "\ngoroutine ") {
		if strings.Contains(g, "grovestore/grove/") || strings.Contains(g, "raft.(*Raft)") || strings.Contains(g, "raft-wal") {
			keep = append(keep, "goroutine "+g)
		}
	}
	if len(keep) == 0 {
		return "(no goroutine in Grove's code; log tail:)\n" + x.Tail(4000)
	}
	return strings.Join(keep, "\n")
}

// LogEvent is one line of a node's log that the suite cares about.
type LogEvent struct {
	Node int
	At   time.Time
	Kind string // "fence", "registered", "alive", "dropped", "hold-grant" or "hold-end"
	Inc  uint64 // for fence, registered and alive
	// Lock and Token (epoch.seq): a remote hold this node granted
	// ("hold-grant", logged after the grant), or is about to release
	// because its caller's stream ended ("hold-end", logged before the
	// release).
	Lock, Token string
}

var (
	logTime = regexp.MustCompile(`^time=(\S+) `)
	logInc  = regexp.MustCompile(` incarnation=(\d+)`)
	logLock = regexp.MustCompile(` lock=("((?:[^"\\]|\\.)*)"|(\S+))`)
	logTok  = regexp.MustCompile(` token=(\d+\.\d+)`)
)

// Events parses the node's log. It relies on these messages: the failure
// detector's driver logs "self-fence: ..." with the incarnation when the
// node fences itself (internal/fd/driver.go), the node logs "registered"
// with the incarnation when a new one is registered and starts its
// services (internal/node/node.go), the driver logs "incarnation
// acknowledged ..." when a majority of observers first acknowledge an
// incarnation (from then on it may act), and bad datagrams are logged as
// "datagram dropped" (rate-limited), and the lock service logs "remote
// hold granted" with the lock and the grant's token once a Hold stream's
// lock is granted, and "remote hold ended: ..." before it releases a hold
// whose caller went away (internal/lock/service.go). The timestamps are
// slog's, in
// milliseconds, from the host's clock that every process shares.
func (x *Node) Events() ([]LogEvent, error) {
	f, err := os.Open(x.Log)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []LogEvent
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		var kind string
		switch {
		case strings.Contains(line, `msg="self-fence`):
			kind = "fence"
		case strings.Contains(line, "msg=registered "):
			kind = "registered"
		case strings.Contains(line, `msg="incarnation acknowledged`):
			kind = "alive"
		case strings.Contains(line, `msg="datagram dropped"`):
			kind = "dropped"
		case strings.Contains(line, `msg="remote hold ended`):
			kind = "hold-end"
		case strings.Contains(line, `msg="remote hold granted"`):
			kind = "hold-grant"
		default:
			continue
		}
		m := logTime.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, m[1])
		if err != nil {
			continue
		}
		e := LogEvent{Node: x.ID, At: at, Kind: kind}
		if m := logInc.FindStringSubmatch(line); m != nil {
			e.Inc, _ = strconv.ParseUint(m[1], 10, 64)
		}
		if kind == "hold-end" || kind == "hold-grant" {
			if m := logLock.FindStringSubmatch(line); m != nil {
				e.Lock = m[3]
				if strings.HasPrefix(m[1], `"`) {
					e.Lock, _ = strconv.Unquote(m[1])
				}
			}
			if m := logTok.FindStringSubmatch(line); m != nil {
				e.Token = m[1]
			}
		}
		out = append(out, e)
	}
	return out, sc.Err()
}

// Tail returns the last n bytes of the node's log.
func (x *Node) Tail(n int) string {
	b, err := os.ReadFile(x.Log)
	if err != nil {
		return err.Error()
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
