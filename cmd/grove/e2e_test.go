package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/bench"
	"github.com/grovestore/grove/internal/fd"
	"github.com/grovestore/grove/internal/metrics"
)

// buildGrove compiles the binary once per test run (TestMain removes it).
func buildGrove(t *testing.T) string {
	t.Helper()
	builtOnce.Do(func() {
		dir, err := os.MkdirTemp("", "grove-test-bin-")
		if err != nil {
			builtErr = err
			return
		}
		builtDir = dir
		bin := filepath.Join(dir, "grove")
		out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
		if err != nil {
			builtErr = fmt.Errorf("go build: %v\n%s", err, out)
			return
		}
		builtBin = bin
	})
	if builtErr != nil {
		t.Fatal(builtErr)
	}
	return builtBin
}

var (
	builtOnce          sync.Once
	builtBin, builtDir string
	builtErr           error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if builtDir != "" {
		os.RemoveAll(builtDir)
	}
	os.Exit(code)
}

// TestEndToEndKillRestart: `grove up --processes`, SIGKILL one node, `grove
// status` reports it dead; restart it with its printed command, it is alive
// with a higher incarnation. Then the same for the config-service leader's
// node, which also forces a raft election.
func TestEndToEndKillRestart(t *testing.T) {
	_, u, ctx := startCluster(t, 7800)
	if len(u.Nodes) != 3 {
		t.Fatalf("grove up printed %d node lines, want 3", len(u.Nodes))
	}
	for _, n := range u.Nodes {
		if n.PID == os.Getpid() || n.PID <= 0 {
			t.Fatalf("node %d has no process of its own: pid %d", n.ID, n.PID)
		}
	}
	// A non-leader node: the failure detector alone decides.
	trials, err := bench.FDFailover(ctx, u, 1, testWriter{t})
	if err != nil {
		t.Fatal(err)
	}
	tr := trials[0]
	// Observers say dead only after GracePeriod of silence since the last
	// beacon they heard. That beacon normally left less than ΔT before the
	// kill, but a process starved of CPU (a loaded CI machine) may have sent
	// it earlier, so the only sound floor relative to the kill is loose: a
	// verdict sooner than GracePeriod/2 means the detector did not wait.
	if min := fd.DefaultGracePeriod / 2; tr.ToDead < min {
		t.Fatalf("node %d reported dead %v after SIGKILL, before GracePeriod/2 = %v", tr.Node, tr.ToDead, min)
	}

	// The leader's node: status must survive the election and agree.
	if err := u.WaitAllHeard(ctx); err != nil {
		t.Fatal(err)
	}
	leader, err := u.Leader(ctx)
	if err != nil || leader == 0 {
		t.Fatalf("leader: %d %v", leader, err)
	}
	before, _, err := u.WaitNode(ctx, leader, 50*time.Millisecond, func(n *pb.NodeStatus) bool { return n.Alive })
	if err != nil {
		t.Fatal(err)
	}
	if err := u.Kill(leader); err != nil {
		t.Fatal(err)
	}
	if _, _, err := u.WaitNode(ctx, leader, 50*time.Millisecond, func(n *pb.NodeStatus) bool { return !n.Alive }); err != nil {
		t.Fatal(err)
	}
	if l, err := u.Leader(ctx); err != nil || l == leader || l == 0 {
		t.Fatalf("after killing leader %d: leader %d, %v", leader, l, err)
	}
	if err := u.Restart(leader); err != nil {
		t.Fatal(err)
	}
	if _, _, err := u.WaitNode(ctx, leader, 50*time.Millisecond, func(n *pb.NodeStatus) bool {
		return n.Alive && n.Incarnation > before.Incarnation
	}); err != nil {
		t.Fatal(err)
	}
	// Every node is alive at the end.
	r, err := u.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range r.Nodes {
		if !n.Alive {
			t.Fatalf("node %d dead at the end: %v", n.Id, n)
		}
	}
	// Every node serves its metrics at its gRPC port + 3; the observers
	// counted the verdicts the test saw, the nodes their beacons.
	deadAnswers := 0.0
	for _, n := range u.Nodes {
		m := scrapeMetrics(t, n.GRPC)
		if m["grove_fd_datagrams_sent_total{kind=beacon}"] == 0 || m["grove_fd_incarnation"] == 0 {
			t.Fatalf("node %d metrics: no beacons or no incarnation: %v", n.ID, m)
		}
		deadAnswers += m["grove_fd_answers_total{answer=dead}"]
	}
	if deadAnswers == 0 {
		t.Fatal("no observer counted a dead answer, though two nodes were declared dead")
	}
}

// scrapeMetrics reads a node's /metrics (at its gRPC port + 3).
func scrapeMetrics(t *testing.T, grpcAddr string) map[string]float64 {
	t.Helper()
	host, port, _ := net.SplitHostPort(grpcAddr)
	p, _ := strconv.Atoi(port)
	resp, err := http.Get("http://" + net.JoinHostPort(host, strconv.Itoa(p+3)) + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	m, err := metrics.Scrape(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestUpRestartSameCluster: `grove up` (in one process) twice on the same
// data directory gives the same node ids and higher incarnations.
func TestUpRestartSameCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("real processes")
	}
	bin := buildGrove(t)
	dir := t.TempDir()
	incs := map[uint64]uint64{}
	for run := 0; run < 2; run++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		cmd := exec.Command(bin, "up", "--data", dir, "--base-port", "7900")
		cmd.Stderr = testWriter{t}
		out, _ := cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		buf := make([]byte, 4096)
		got := ""
		for !contains(got, "ready") {
			n, err := out.Read(buf)
			if err != nil {
				t.Fatalf("run %d: grove up: %v; output %q", run, err, got)
			}
			got += string(buf[:n])
		}
		st, err := exec.CommandContext(ctx, bin, "status", "--json", "--addr", "127.0.0.1:7900").Output()
		if err != nil {
			t.Fatal(err)
		}
		s := parseStatus(t, st)
		if len(s.Nodes) != 3 || s.Leader == 0 {
			t.Fatalf("run %d: status %s", run, st)
		}
		if run == 0 {
			// A second `grove up` on the same ports fails at once, naming
			// the address, and disturbs nothing.
			out, err := exec.CommandContext(ctx, bin, "up", "--data", t.TempDir(), "--base-port", "7900").CombinedOutput()
			if err == nil || !contains(string(out), "127.0.0.1:7900 is taken") {
				t.Fatalf("second grove up on taken ports: err=%v output %q", err, out)
			}
		}
		for _, n := range s.Nodes {
			if run == 1 && n.Incarnation <= incs[n.Node] {
				t.Fatalf("node %d incarnation %d not above %d after restart", n.Node, n.Incarnation, incs[n.Node])
			}
			incs[n.Node] = n.Incarnation
		}
		cmd.Process.Signal(os.Interrupt)
		if err := cmd.Wait(); err != nil {
			t.Fatalf("run %d: grove up did not stop cleanly: %v", run, err)
		}
		cancel()
	}
}

// TestEndToEndWipedMember: a config-service member loses its data directory
// (SIGKILL, then everything but its config is gone). Restarted, it refuses
// to rejoin as a voter that forgot its vote and says how to replace it;
// after `grove member remove`, it starts and waits; `grove member add`
// brings it back, and it comes back with an incarnation above every one the
// cluster registered for it (not 1 again).
func TestEndToEndWipedMember(t *testing.T) {
	bin, u, ctx := startCluster(t, 8200)
	const victim = 3
	before, _, err := u.WaitNode(ctx, victim, 50*time.Millisecond, func(n *pb.NodeStatus) bool { return n.Alive })
	if err != nil {
		t.Fatal(err)
	}
	if err := u.Kill(victim); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Dir(u.Nodes[victim].Config)
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if e.Name() != "grove.toml" && e.Name() != "grove.log" {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				t.Fatal(err)
			}
		}
	}
	out, err := exec.CommandContext(ctx, bin, "server", "--config", u.Nodes[victim].Config).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "grove member remove 3") {
		t.Fatalf("a wiped member started, or without saying how to replace it: err=%v\n%s", err, out)
	}
	run := func(args ...string) string {
		t.Helper()
		out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("grove %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	run("member", "remove", "3", "--addr", u.Gateway)
	if err := u.Restart(victim); err != nil {
		t.Fatal(err)
	}
	// The restarted member waits for a while to be added; add it.
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, err := exec.CommandContext(ctx, bin, "member", "add", "3", "--addr", u.Gateway).CombinedOutput()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("member add: %v\n%s", err, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
	var ms MemberListJSON
	if err := json.Unmarshal([]byte(run("member", "list", "--json", "--addr", u.Gateway)), &ms); err != nil || len(ms.Members) != 3 {
		t.Fatalf("member list after add: %v %v", ms, err)
	}
	wctx, wcancel := context.WithTimeout(ctx, time.Minute)
	defer wcancel()
	n, took, err := u.WaitNode(wctx, victim, 50*time.Millisecond, func(n *pb.NodeStatus) bool {
		return n.Alive && n.Incarnation > before.Incarnation && int(n.ObserversHeard) > u.Observers/2
	})
	if err != nil {
		lg, _ := os.ReadFile(filepath.Join(dir, "grove.log"))
		if len(lg) > 4000 {
			lg = lg[len(lg)-4000:]
		}
		t.Fatalf("%v\nnode %d's log, tail:\n%s", err, victim, lg)
	}
	t.Logf("wiped member back as incarnation %d (was %d) in %v", n.Incarnation, before.Incarnation, took)
}
