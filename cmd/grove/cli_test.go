package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/bench"
	"github.com/grovestore/grove/internal/transport"
)

// ran is one run of the grove binary.
type ran struct {
	stdout, stderr string
	code           int
	took           time.Duration
}

func (r ran) String() string {
	return fmt.Sprintf("exit %d after %v\nstdout:\n%s\nstderr:\n%s", r.code, r.took.Round(time.Millisecond), r.stdout, r.stderr)
}

// grove runs the binary with GROVE_ENDPOINTS cleared (plus env) and
// returns its outputs and exit code; a run longer than 90 s fails the test.
func grove(t *testing.T, bin string, env []string, args ...string) ran {
	t.Helper()
	return groveWithin(t, 90*time.Second, bin, env, args...)
}

// groveWithin is grove with its own limit (a benchmark's smoke run).
func groveWithin(t *testing.T, limit time.Duration, bin string, env []string, args ...string) ran {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(append(os.Environ(), "GROVE_ENDPOINTS="), env...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	start := time.Now()
	err := cmd.Run()
	r := ran{stdout: o.String(), stderr: e.String(), took: time.Since(start)}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	case err != nil:
		t.Fatalf("grove %v: %v", args, err)
	}
	return r
}

// TestCLIUsageAndExitCodes: bad usage exits 2 with the usage printed and
// writes nothing; unknown commands are refused at every level; invalid
// flags of grove up are refused before a directory is made.
func TestCLIUsageAndExitCodes(t *testing.T) {
	bin := buildGrove(t)
	dir := t.TempDir()
	badCfg := filepath.Join(dir, "bad.toml")
	if err := os.WriteFile(badCfg, []byte("id = 1\ndata_dir = \"d\"\n[fd]\ngrace = \"2s\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	empty := t.TempDir()
	for _, c := range []struct {
		args []string
		code int
		want []string // in stderr (stdout for exit 0)
	}{
		{[]string{"nosuch"}, 2, []string{`unknown command "nosuch" for "grove"`}},
		{[]string{"lock", "nosuch"}, 2, []string{`unknown command "nosuch" for "grove lock"`, "grove lock nosuch -- COMMAND"}},
		{[]string{"bench", "nosuch"}, 2, []string{`unknown command "nosuch" for "grove bench"`}},
		{[]string{"member", "lsit"}, 2, []string{"did you mean list"}},
		{[]string{"lock", "acquire"}, 2, []string{"missing NAME", "Usage:", "grove lock acquire NAME"}},
		{[]string{"lock", "acquire", "x", "--hold", "-1s"}, 2, []string{"--hold -1s"}},
		{[]string{"lock", "acquire", "x", "--mode", "write"}, 2, []string{`--mode "write"`}},
		{[]string{"lock", "x", "--", "/nonexistent/command"}, 127, []string{"not found"}},
		{[]string{"status", "-o", "yaml"}, 2, []string{`-o "yaml"`}},
		{[]string{"status", "--endpoints", "nohost"}, 2, []string{"want HOST:PORT"}},
		{[]string{"status", "--bogus"}, 2, []string{"unknown flag: --bogus"}},
		{[]string{"status", "--addr", "127.0.0.1:1", "--endpoints", "127.0.0.1:2"}, 2, []string{"not both"}},
		{[]string{"up", "--meta", "2", "--data", filepath.Join(dir, "m2")}, 2, []string{"--meta 2: want an odd number"}},
		{[]string{"up", "--base-port", "70000", "--data", filepath.Join(dir, "p")}, 2, []string{"--base-port 70000"}},
		{[]string{"up", "--nodes", "2", "--meta", "3", "--data", filepath.Join(dir, "n2")}, 2, []string{"more members than --nodes 2"}},
		{[]string{"up", "--log-level", "loud", "--data", filepath.Join(dir, "l")}, 2, []string{"--log-level"}},
		{[]string{"down", "--data", empty}, 5, []string{"not a grove up data directory"}},
		{[]string{"server"}, 2, []string{"--config FILE is required"}},
		{[]string{"server", "--config", badCfg}, 2, []string{"bad.toml:4:1: unknown key \"fd.grace\" in [fd]; did you mean \"grace_period\"?"}},
		{[]string{"version"}, 0, []string{"grove ", "go1."}},
		{[]string{"--version"}, 0, []string{"grove "}},
		{[]string{"lock"}, 0, []string{"Usage:", "grove lock [flags] [NAME -- COMMAND [ARGS...]]"}},
		{[]string{"completion", "bash"}, 0, []string{"bash completion"}},
	} {
		r := grove(t, bin, nil, c.args...)
		out := r.stderr
		if c.code == 0 {
			out = r.stdout
		}
		ok := r.code == c.code
		for _, w := range c.want {
			ok = ok && strings.Contains(out, w)
		}
		if !ok {
			t.Errorf("grove %s: want exit %d and %q; got %v", strings.Join(c.args, " "), c.code, c.want, r)
		}
	}
	for _, d := range []string{"m2", "p", "n2", "l"} {
		if _, err := os.Stat(filepath.Join(dir, d, "node-1")); err == nil {
			t.Errorf("grove up with bad flags wrote %s", filepath.Join(dir, d))
		}
	}
	// Help texts: placeholders name the value, every command has an example.
	r := grove(t, bin, nil, "status", "--help")
	for _, w := range []string{"--endpoints HOST:PORT,...", "--addr HOST:PORT", "--dial-timeout DURATION", "-o, --output table|json", "Examples:"} {
		if !strings.Contains(r.stdout, w) {
			t.Errorf("grove status --help lacks %q:\n%s", w, r.stdout)
		}
	}
	var v map[string]string
	r = grove(t, bin, nil, "version", "-o", "json")
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil || v["version"] == "" || !strings.HasPrefix(v["go"], "go1.") {
		t.Errorf("version -o json: %v %v", v, r)
	}
}

// hangingStatus is a gRPC server whose Status never answers.
type hangingStatus struct {
	pb.UnimplementedClusterServiceServer
}

func (hangingStatus) Status(ctx context.Context, _ *pb.StatusRequest) (*pb.StatusResponse, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestCLIUnreachable: a closed port fails at once (3, "refused"); a
// listener that accepts and never answers fails when --dial-timeout
// elapses (4); a server that never finishes a call fails when
// --command-timeout elapses (4); endpoints are tried in order and every
// failure is named.
// refusingAddr is a loopback address that refuses connections for the
// whole test: a socket bound to it that never listens (connections get a
// reset: "connection refused"). A listener closed at once would free its
// port for the next one bound here or by a concurrent test, which then
// answered the calls meant to be refused (a CI run: this test's own
// hanging server got the port).
func refusingAddr(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
}

func TestCLIUnreachable(t *testing.T) {
	bin := buildGrove(t)
	closed := refusingAddr(t)
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	var held []net.Conn
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			held = append(held, c) // never read, never answered
		}
	}()
	hl, err := transport.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	pb.RegisterClusterServiceServer(gs, hangingStatus{})
	go gs.Serve(hl)
	defer gs.Stop()
	hang := hl.Addr().String()

	for _, c := range []struct {
		name    string
		env     []string
		args    []string
		code    int
		want    []string
		maxTook time.Duration
	}{
		{"closed port", nil, []string{"status", "--endpoints", closed}, 3,
			[]string{"status: " + closed + " refused the connection; is the cluster running? (grove up)"}, 3 * time.Second},
		{"silent listener", nil, []string{"status", "--addr", silent.Addr().String(), "--dial-timeout", "500ms"}, 4,
			[]string{silent.Addr().String() + " accepted the connection but did not answer within 500ms"}, 4 * time.Second},
		{"hanging call", nil, []string{"health", "--endpoints", hang, "--command-timeout", "1s"}, 4,
			[]string{"health: " + hang + " did not finish within 1s"}, 5 * time.Second},
		{"environment, in order", []string{"GROVE_ENDPOINTS=" + closed + "," + hang}, []string{"status", "--command-timeout", "1s"}, 4,
			[]string{closed + " refused the connection", hang}, 5 * time.Second},
		{"lock acquire", nil, []string{"lock", "acquire", "x", "--endpoints", closed}, 3, []string{"refused the connection"}, 3 * time.Second},
		{"a name that does not resolve", nil, []string{"status", "--endpoints", "nohost.invalid:12"}, 3,
			[]string{"status: nohost.invalid:12 cannot be resolved"}, 5 * time.Second},
		{"command timeout while connecting", nil, []string{"health", "--endpoints", silent.Addr().String(), "--dial-timeout", "30s", "--command-timeout", "1s"}, 4,
			[]string{silent.Addr().String() + " was still connecting after", "--command-timeout"}, 5 * time.Second},
		{"bad environment", []string{"GROVE_ENDPOINTS=nohost"}, []string{"status"}, 2, []string{"$GROVE_ENDPOINTS: endpoint \"nohost\""}, 3 * time.Second},
		{"lock list", nil, []string{"lock", "list", "--endpoints", closed + "," + silent.Addr().String(), "--dial-timeout", "300ms"}, 3,
			[]string{"no endpoint could serve", closed, silent.Addr().String()}, 4 * time.Second},
	} {
		r := grove(t, bin, c.env, c.args...)
		ok := r.code == c.code && r.took <= c.maxTook && !strings.Contains(r.stderr, "rpc error")
		for _, w := range c.want {
			ok = ok && strings.Contains(r.stderr, w)
		}
		if !ok {
			t.Errorf("%s: want exit %d within %v and %q; got %v", c.name, c.code, c.maxTook, c.want, r)
		}
	}
}

// TestCLIOnCluster: the operator commands against a real `grove up
// --processes` cluster: JSON keys are the table's headers, lists are in a
// stable order; `grove lock NAME -- COMMAND` passes the command's status
// through and hands it its fencing token; Ctrl-C on an acquire that was not
// granted withdraws the request; a node killed mid-command ends a command
// running under its lease (exit 7, the command stopped); health and status
// exit 6 when a node is dead and, without quorum, status still says what it
// can; grove down stops everything.
func TestCLIOnCluster(t *testing.T) {
	bin, u, ctx := startCluster(t, 8400)
	if err := u.WaitAllHeard(ctx); err != nil {
		t.Fatal(err)
	}
	gw := []string{"--endpoints", u.Gateway}

	// Healthy: status and health exit 0; JSON mirrors the table.
	r := grove(t, bin, nil, append([]string{"status"}, gw...)...)
	if r.code != 0 || !strings.Contains(r.stdout, "NODE  STATE  INCARNATION  HEARD-BY  DEAD-VOTES  ANSWERED  GRPC") {
		t.Fatalf("status: %v", r)
	}
	r = grove(t, bin, nil, append([]string{"status", "-o", "json"}, gw...)...)
	s := parseStatus(t, []byte(r.stdout))
	if r.code != 0 || !s.Healthy || s.Leader == 0 || len(s.Nodes) != 3 || len(s.Members) != 3 || s.Nodes[0].Node != 1 || s.Nodes[2].Node != 3 {
		t.Fatalf("status -o json: %v", r)
	}
	var raw map[string][]map[string]any
	json.Unmarshal([]byte(strings.Replace(r.stdout, `"healthy"`, `"_"`, 1)), &raw) // tables only
	for _, k := range []string{"node", "state", "incarnation", "heard_by", "dead_votes", "answered", "grpc", "beacon", "roles"} {
		if _, ok := raw["nodes"][0][k]; !ok {
			t.Errorf("status -o json: nodes lack %q: %v", k, raw["nodes"][0])
		}
	}
	if r = grove(t, bin, nil, append([]string{"health"}, gw...)...); r.code != 0 || !strings.HasPrefix(r.stdout, "healthy: 3/3 nodes alive") {
		t.Fatalf("health: %v", r)
	}
	leader := s.Leader
	l := waitLockServing(t, bin, u.Gateway, 3)
	var victim uint64
	for id := uint64(1); id <= 3; id++ {
		if id != leader && id != l.Master {
			victim = id
			break
		}
	}
	if victim == 0 {
		victim = 1 + l.Master%3
		if victim == leader {
			victim = 1 + victim%3
		}
	}
	other := uint64(0)
	for id := uint64(1); id <= 3; id++ {
		if id != victim && id != l.Master {
			other = id
		}
	}
	t.Logf("leader %d, lock master %d, victim %d, other %d", leader, l.Master, victim, other)

	// grove lock NAME -- COMMAND: the command's status, its token.
	r = grove(t, bin, nil, "lock", "run-status", "--endpoints", u.Nodes[other].GRPC, "--", "sh", "-c", `echo "token=$GROVE_LOCK_TOKEN mode=$GROVE_LOCK_MODE"; exit 3`)
	if r.code != 3 || !strings.Contains(r.stdout, "mode=exclusive") || !strings.Contains(r.stdout, "token=") || strings.Contains(r.stdout, "token= ") {
		t.Fatalf("lock -- sh exit 3: %v", r)
	}

	// Ctrl-C on an acquire that was never granted withdraws the request.
	holder := startHold(t, bin, "contended", u.Nodes[other].GRPC)
	if !holder.granted(20 * time.Second) {
		t.Fatal("holder not granted")
	}
	waiter := exec.Command(bin, "lock", "acquire", "contended", "--endpoints", u.Nodes[victim].GRPC)
	var wout, werr bytes.Buffer
	waiter.Stdout, waiter.Stderr = &wout, &werr
	if err := waiter.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "the waiter queued at the master", func() bool {
		for _, lk := range lockList(t, bin, u.Gateway).Locks {
			if lk.Lock == "contended" && len(lk.Waiters) == 1 {
				return true
			}
		}
		return false
	})
	waiter.Process.Signal(syscall.SIGINT)
	err := waiter.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 130 || !strings.Contains(werr.String(), "withdrawn") || strings.Contains(wout.String(), "released") {
		t.Fatalf("interrupted waiter: %v\nstdout %s\nstderr %s", err, wout.String(), werr.String())
	}
	waitFor(t, 10*time.Second, "the withdrawn request gone from the queue", func() bool {
		for _, lk := range lockList(t, bin, u.Gateway).Locks {
			if lk.Lock == "contended" && len(lk.Waiters) != 0 {
				return false
			}
		}
		return true
	})
	holder.cmd.Process.Signal(syscall.SIGINT)
	if err := holder.cmd.Wait(); !errors.As(err, &ee) || ee.ExitCode() != 130 {
		t.Fatalf("interrupted holder: %v, want exit 130", err)
	}

	// A node killed mid-command: the command running under its lease is
	// stopped and grove exits 7.
	run := exec.Command(bin, "lock", "doomed", "--endpoints", u.Nodes[victim].GRPC, "--", "sh", "-c", "echo child $$; exec sleep 60")
	rout, err := run.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var rerr bytes.Buffer
	run.Stderr = &rerr
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(rout)
	if !sc.Scan() || !strings.HasPrefix(sc.Text(), "child ") {
		t.Fatalf("command under lock did not start: %q %s", sc.Text(), rerr.String())
	}
	child, _ := strconv.Atoi(strings.TrimPrefix(sc.Text(), "child "))
	if err := u.Kill(victim); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- run.Wait() }()
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		run.Process.Kill()
		t.Fatalf("grove lock -- sleep still running 30 s after its node was killed; stderr %s", rerr.String())
	}
	if !errors.As(err, &ee) || ee.ExitCode() != 7 || !strings.Contains(rerr.String(), "lease on \"doomed\"") {
		t.Fatalf("command under a lost lease: %v, stderr %s", err, rerr.String())
	}
	if syscall.Kill(child, 0) == nil && !bench.Exited(child) {
		t.Fatalf("the command (pid %d) outlived its lease", child)
	}

	// A dead node: health and status exit 6, naming it; status still prints.
	waitFor(t, 15*time.Second, "health to report the dead node", func() bool {
		r = grove(t, bin, nil, append([]string{"health"}, gw...)...)
		return r.code == 6 && strings.Contains(r.stdout, fmt.Sprintf("node %d is dead", victim))
	})
	r = grove(t, bin, nil, append([]string{"status"}, gw...)...)
	if r.code != 6 || !strings.Contains(r.stdout, "dead") || !strings.Contains(r.stderr, "degraded") {
		t.Fatalf("status with a dead node: %v", r)
	}

	// No quorum: status answers within its timeout with what it knows.
	var second uint64
	for id := uint64(1); id <= 3; id++ {
		if id != victim && second == 0 {
			second = id
		}
	}
	if err := u.Kill(second); err != nil {
		t.Fatal(err)
	}
	r = grove(t, bin, nil, append([]string{"status", "-o", "json", "--command-timeout", "8s"}, gw...)...)
	s = parseStatus(t, []byte(r.stdout))
	unreachable := 0
	for _, m := range s.Members {
		if m.RaftState == "unreachable" {
			unreachable++
		}
	}
	if r.code != 6 || s.Leader != 0 || s.LastLeader == 0 || !s.Stale || unreachable != 2 || len(s.Nodes) != 3 || r.took > 8*time.Second {
		t.Fatalf("status without quorum: %v", r)
	}
	if r = grove(t, bin, nil, append([]string{"health"}, gw...)...); r.code != 6 || !strings.Contains(r.stdout, "no leader") {
		t.Fatalf("health without quorum: %v", r)
	}
	// The lock master's node was not killed, but finding it takes the
	// config service: through another node's endpoint, lock list says
	// "unavailable" in seconds, not after the command's timeout.
	r = grove(t, bin, nil, "lock", "list", "--endpoints", u.Gateway)
	if r.code != 3 && r.code != 0 || r.took > 6*time.Second {
		t.Fatalf("lock list without quorum: %v", r)
	}

	// grove down stops grove up, and with it every node.
	r = grove(t, bin, nil, "down", "--data", u.Dir)
	if r.code != 0 || !strings.Contains(r.stdout, "stopped grove up") {
		t.Fatalf("grove down: %v", r)
	}
	for id, n := range u.Nodes {
		if !bench.Exited(n.PID) {
			t.Errorf("node %d (pid %d) still running after grove down", id, n.PID)
		}
	}
	if r = grove(t, bin, nil, "down", "--data", u.Dir); r.code != 0 || !strings.Contains(r.stdout, "nothing running") {
		t.Fatalf("second grove down: %v", r)
	}
}

// TestUpStopsItsNodes: the children of `grove up --processes` never outlive
// it: SIGHUP (a closed terminal) stops them cleanly; SIGKILL of grove up
// stops them too (parent-death signal); a node restarted by hand is stopped
// with the cluster by grove down. A running cluster is not started twice,
// and flags that contradict an existing directory are refused.
func TestUpStopsItsNodes(t *testing.T) {
	if testing.Short() {
		t.Skip("real processes")
	}
	bin := buildGrove(t)
	dir := t.TempDir()
	const port = 8500
	start := func() *bench.UpCluster {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		u, err := bench.StartUp(ctx, bin, dir, port, testWriter{t})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(u.Close)
		return u
	}
	allGone := func(what string, pids ...int) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			var left []string
			for _, p := range pids {
				if !bench.Exited(p) {
					stat, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p))
					cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p))
					left = append(left, fmt.Sprintf("pid %d (%s): %s", p, bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '}), stat))
				}
			}
			if len(left) == 0 {
				return
			}
			if time.Now().After(deadline) {
				// What is left, and what it was doing (a node's log
				// ends with its last steps).
				for _, n := range []string{"node-1", "node-2", "node-3"} {
					if b, err := os.ReadFile(filepath.Join(dir, n, "grove.log")); err == nil {
						if len(b) > 4000 {
							b = b[len(b)-4000:]
						}
						t.Logf("%s/grove.log, its end:\n%s", n, b)
					}
				}
				t.Fatalf("%s: not within 20s; still running:\n%s", what, strings.Join(left, "\n"))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	childPIDs := func(u *bench.UpCluster) []int {
		var ps []int
		for _, n := range u.Nodes {
			ps = append(ps, n.PID)
		}
		return ps
	}

	u := start()
	u.Up().Process.Signal(syscall.SIGHUP)
	if err := u.Up().Wait(); err != nil {
		t.Fatalf("grove up on SIGHUP: %v, want a clean stop", err)
	}
	allGone("children stopped on SIGHUP", childPIDs(u)...)

	u = start()
	u.Up().Process.Kill()
	u.Up().Wait()
	allGone("children stopped when grove up was killed", childPIDs(u)...)

	u = start()
	if r := grove(t, bin, nil, "up", "--processes", "--data", dir, "--base-port", strconv.Itoa(port)); r.code != 1 || !strings.Contains(r.stderr, "already running") {
		t.Fatalf("second grove up on a running directory: %v", r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	before, _, err := u.WaitNode(ctx, 2, 50*time.Millisecond, func(n *pb.NodeStatus) bool { return n.Alive })
	if err != nil {
		t.Fatal(err)
	}
	if err := u.Kill(2); err != nil {
		t.Fatal(err)
	}
	if err := u.Restart(2); err != nil { // by hand, with the printed command
		t.Fatal(err)
	}
	hand := u.Nodes[2].PID
	// The new incarnation: the killed one still shows alive until it is
	// declared dead, and grove down run then found the hand-started node
	// before it held its lock (CI, 2026-12-02) and so could not stop it.
	if _, _, err := u.WaitNode(ctx, 2, 50*time.Millisecond, func(n *pb.NodeStatus) bool {
		return n.Alive && n.ObserversHeard >= 2 && n.Incarnation > before.Incarnation
	}); err != nil {
		t.Fatal(err)
	}
	r := grove(t, bin, nil, "down", "--data", dir)
	if r.code != 0 || !strings.Contains(r.stdout, "stopped grove up") {
		t.Fatalf("grove down: %v", r)
	}
	t.Logf("grove down: %v", r)
	allGone("every node, the hand-started one too, stopped by grove down", append(childPIDs(u), hand, u.Up().Process.Pid)...)

	if r := grove(t, bin, nil, "up", "--data", dir, "--base-port", "9990"); r.code != 2 || !strings.Contains(r.stderr, "holds a cluster created with") || !strings.Contains(r.stderr, "--base-port 9990 (it has 8500)") {
		t.Fatalf("grove up with a contradicting --base-port: %v", r)
	}
}

// waitFor polls cond every 100 ms until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); !cond(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
	}
}

// TestLockCommandGroup: `grove lock NAME -- COMMAND` stops COMMAND's whole
// process group, not only COMMAND, when grove is interrupted: a background
// job COMMAND started must not go on after the lock is released; the
// signal grove got is passed on (exit 130 for SIGINT).
func TestLockCommandGroup(t *testing.T) {
	bin, u, _ := startCluster(t, 8600)
	run := exec.Command(bin, "lock", "grp", "--endpoints", u.Gateway, "--", "sh", "-c", "sleep 60 & echo $!; wait")
	out, err := run.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	run.Stderr = &stderr
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	if !sc.Scan() {
		t.Fatalf("no output from the command: %s", stderr.String())
	}
	grandchild, err := strconv.Atoi(strings.TrimSpace(sc.Text()))
	if err != nil {
		t.Fatalf("%q: %v", sc.Text(), err)
	}
	run.Process.Signal(syscall.SIGINT)
	err = run.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 130 {
		t.Fatalf("grove lock -- sh after SIGINT: %v, want exit 130; stderr %s", err, stderr.String())
	}
	waitFor(t, 5*time.Second, "the command's background job stopped with it", func() bool { return bench.Exited(grandchild) })
	// The lock is free again: another holder gets it at once.
	r := grove(t, bin, nil, "lock", "grp", "--endpoints", u.Gateway, "--command-timeout", "10s", "--", "true")
	if r.code != 0 {
		t.Fatalf("lock after the interrupted command: %v", r)
	}
}

// TestLogsAndHandStartedNode: `grove up --processes --log-format json`
// writes one JSON log per node, raft's lines included, and prints restart
// commands that keep the format; a node started by hand from a config file
// with a relative data_dir and a partial [fd] logs to its data_dir, prints
// where, serves, and stops cleanly on SIGTERM.
func TestLogsAndHandStartedNode(t *testing.T) {
	if testing.Short() {
		t.Skip("real processes")
	}
	bin := buildGrove(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var lines bytes.Buffer
	u, err := bench.StartUp(ctx, bin, dir, 8700, &lines, "--log-format", "json", "--log-level", "debug")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(lines.String(), "--log-format json --log-level debug") || !strings.Contains(lines.String(), "logs in "+filepath.Join(dir, "node-*", "grove.log")) {
		t.Errorf("grove up's restart command or ready line: %s", lines.String())
	}
	u.Close()
	for i := 1; i <= 3; i++ {
		b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("node-%d", i), "grove.log"))
		if err != nil {
			t.Fatal(err)
		}
		raft := 0
		for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			var m map[string]any
			if err := json.Unmarshal([]byte(l), &m); err != nil {
				t.Fatalf("node %d's log has a line that is not JSON: %q", i, l)
			}
			if m["component"] == "raft" {
				raft++
			}
		}
		if raft == 0 {
			t.Errorf("node %d's log has no line of raft's", i)
		}
	}

	// A node by hand: relative data_dir, partial [fd], its own log.
	nd := t.TempDir()
	cfg := fmt.Sprintf(`id = 1
data_dir = "data"
grpc_addr = "127.0.0.1:8760"
raft_addr = "127.0.0.1:8761"
beacon_addr = "127.0.0.1:8762"
roles = ["meta", "observer", "lock"]
cluster_key = "%s"

[fd]
grace_period = "1500ms"

[[members]]
id = 1
grpc = "127.0.0.1:8760"
raft = "127.0.0.1:8761"
beacon = "127.0.0.1:8762"
`, strings.Repeat("ab", 32))
	if err := os.WriteFile(filepath.Join(nd, "node.toml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	srv := exec.Command(bin, "server", "--config", "node.toml", "--bootstrap")
	srv.Dir = nd
	sout, err := srv.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer srv.Process.Kill()
	first := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(sout)
		if sc.Scan() {
			first <- sc.Text()
		}
		close(first)
	}()
	select {
	case l := <-first:
		if want := "logs=" + filepath.Join(nd, "data", "grove.log"); !strings.Contains(l, want) {
			t.Fatalf("start line %q lacks %q", l, want)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no start line from grove server")
	}
	waitFor(t, 30*time.Second, "the hand-started node healthy", func() bool {
		return grove(t, bin, nil, "health", "--endpoints", "127.0.0.1:8760").code == 0
	})
	// Healthy is the config service answering; the node registers a moment
	// later (a CI run under load stopped it in between: no "registered").
	waitFor(t, 30*time.Second, "the hand-started node registered (its own log)", func() bool {
		b, _ := os.ReadFile(filepath.Join(nd, "data", "grove.log"))
		return strings.Contains(string(b), "msg=registered")
	})
	srv.Process.Signal(syscall.SIGTERM)
	if err := srv.Wait(); err != nil {
		t.Fatalf("grove server on SIGTERM: %v, want exit 0", err)
	}
	b, err := os.ReadFile(filepath.Join(nd, "data", "grove.log"))
	if err != nil || !strings.Contains(string(b), "msg=registered") || !strings.Contains(string(b), "msg=stopped") {
		t.Fatalf("the node's own log (relative data_dir): %v\n%s", err, b)
	}
}

// TestHelpTexts: every command has an example, and every flag that takes a
// value names it with a placeholder (`--addr HOST:PORT`, not `--addr
// string`).
func TestHelpTexts(t *testing.T) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if !c.Hidden && c.Example == "" {
			t.Errorf("%s has no example", c.CommandPath())
		}
		c.Flags().VisitAll(func(f *pflag.Flag) {
			if f.Value.Type() == "bool" || f.Name == "help" {
				return
			}
			// Without a backquoted word in the usage, pflag shows the
			// value's Go type ("string", "duration").
			name, _ := pflag.UnquoteUsage(f)
			if name == "" || name == f.Value.Type() || strings.Contains("stringsintsuintsdurationfloat64", name) {
				t.Errorf("%s --%s: placeholder %q, want one naming the value (HOST:PORT, DURATION, table|json)", c.CommandPath(), f.Name, name)
			}
		})
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(rootCmd())
}

// TestUpUnderGoRun: `go run ./cmd/grove up --processes` runs a binary from
// Go's build cache, which goes away; grove up copies itself to DIR/bin and
// prints restart commands that use the copy.
func TestUpUnderGoRun(t *testing.T) {
	if testing.Short() {
		t.Skip("real processes")
	}
	bin := buildGrove(t) // for grove down
	dir := t.TempDir()
	cmd := exec.Command("go", "run", ".", "up", "--processes", "--data", dir, "--base-port", "8800")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		grove(t, bin, nil, "down", "--data", dir)
		cmd.Wait()
	}()
	var got []string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		got = append(got, sc.Text())
		if strings.HasPrefix(sc.Text(), "ready") {
			break
		}
	}
	copyPath := filepath.Join(dir, "bin", "grove")
	want := "restart a node that exits with: " + copyPath + " server --config "
	if !strings.Contains(strings.Join(got, "\n"), want) || !strings.Contains(stderr.String(), "copied it to "+copyPath) {
		t.Fatalf("grove up under go run: want %q; stdout:\n%s\nstderr:\n%s", want, strings.Join(got, "\n"), stderr.String())
	}
	if r := grove(t, copyPath, nil, "version"); r.code != 0 {
		t.Fatalf("the copied binary: %v", r)
	}
}
