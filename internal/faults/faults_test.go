package faults

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestFaults runs the multi-host fault suite (README "Fault suite"): three
// grove server processes and a client, each in its own network namespace,
// joined by a bridge in another; faults are nftables rules on the bridge,
// SIGSTOP, and noise from the client. GROVE_FAULTS=short (CI, a few
// minutes) or full (the README's figures); scripts/faults.sh runs it.
func TestFaults(t *testing.T) {
	name := os.Getenv("GROVE_FAULTS")
	if name == "" {
		t.Skip("GROVE_FAULTS is not set: GROVE_FAULTS=short (CI) or full runs the multi-host fault suite (root, ip, nft; scripts/faults.sh)")
	}
	mode, ok := Modes[name]
	if !ok {
		t.Fatalf("GROVE_FAULTS=%q: want short or full", name)
	}
	if v := os.Getenv("GROVE_FAULTS_TRIALS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("GROVE_FAULTS_TRIALS=%q: want a positive number", v)
		}
		mode.Trials = n
	}
	if v := os.Getenv("GROVE_FAULTS_LOSS_FOR"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("GROVE_FAULTS_LOSS_FOR=%q: want a duration", v)
		}
		mode.LossFor = d
	}
	if os.Geteuid() != 0 {
		t.Skip("the fault suite creates network namespaces: it needs root")
	}
	for _, tool := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is missing (scripts/faults.sh installs iproute2 and nftables)", tool)
		}
	}
	start := time.Now()
	if err := CleanStale(t.Logf); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if keep := os.Getenv("GROVE_FAULTS_KEEP"); keep != "" {
		// The nodes' logs, configs and data, and the tree client's log,
		// kept after the run (t.TempDir's are removed).
		var err error
		if dir, err = os.MkdirTemp(keep, "grove-faults-"); err != nil {
			t.Fatal(err)
		}
		t.Logf("GROVE_FAULTS_KEEP: the run's files are in %s", dir)
	}
	bin, err := Build(dir)
	if err != nil {
		t.Fatal(err)
	}
	n, err := Setup(3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	c, err := StartCluster(bin, dir, 3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // before the namespaces go (cleanups run last first)
		for _, msg := range c.Close() {
			t.Error(msg)
		}
	})
	agentLog, err := os.Create(filepath.Join(dir, "agent.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer agentLog.Close()
	cfg := AgentConfig{StatusEveryMS: 150, VerdictEvery: 20}
	for i := 1; i <= 3; i++ {
		cfg.Nodes = append(cfg.Nodes, AgentNode{ID: uint64(i), GRPC: GRPC(i), Raft: Raft(i), Beacon: Beacon(i), Metrics: Metrics(i)})
	}
	a, err := StartAgent(cfg, "^TestFaultAgent$", agentLog, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close) // before the cluster and the namespaces
	s := &Suite{Mode: mode, Net: n, Cluster: c, Agent: a, Logf: t.Logf, Trace: os.Getenv("GROVE_FAULTS_TRACE") != ""}
	if only := os.Getenv("GROVE_FAULTS_ONLY"); only != "" {
		if s.Only, err = regexp.Compile(only); err != nil {
			t.Fatalf("GROVE_FAULTS_ONLY: %v", err)
		}
	}
	if _, err := s.healthy(90*time.Second, true); err != nil {
		dumpLogs(t, c, agentLog.Name())
		t.Fatalf("the cluster did not come up: %v", err)
	}
	t.Logf("cluster up after %v; `grove status` from the client namespace:\n%s", time.Since(start).Round(time.Second), cliStatus(bin))
	s.Run()
	seed := time.Now().UnixNano() % 1_000_000
	if v := os.Getenv("GROVE_SEED"); v != "" {
		if seed, err = strconv.ParseInt(v, 10, 64); err != nil {
			t.Fatalf("GROVE_SEED=%q: %v", v, err)
		}
	}
	unbroken := func() bool { n := len(s.Results); return n == 0 || !s.Results[n-1].broken }
	if unbroken() && (s.Only == nil || s.Only.MatchString("rldev")) {
		s.RunRLDev(dir, seed)
	}
	if unbroken() && (s.Only == nil || s.Only.MatchString("tree")) {
		s.RunTree(bin, dir, seed)
	}
	table := s.Table()
	t.Logf("results (%s run, %v):\n%s", mode.Name, time.Since(start).Round(time.Second), table)
	fmt.Printf("\nfault suite results (%s run, %v):\n%s\n", mode.Name, time.Since(start).Round(time.Second), table)
	var violations []string
	for _, r := range s.Results {
		for _, v := range r.Violations {
			violations = append(violations, fmt.Sprintf("%s: %s", r.Name, v))
		}
	}
	if len(violations) > 0 {
		// The logs first, the violations last: CI shows only the tail
		// of a failed run.
		dumpLogs(t, c, agentLog.Name())
		for _, v := range violations {
			t.Error(v)
		}
	}
}

// cliStatus runs `grove status` inside the client namespace, as an operator
// on the client host would.
func cliStatus(bin string) string {
	out, err := Exec(clientNS, bin, "status", "--addr", GRPC(1)).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("grove status: %v\n%s", err, out)
	}
	return string(out)
}

func dumpLogs(t *testing.T, c *Cluster, agentLog string) {
	for _, x := range c.Nodes {
		t.Logf("n%d's log, tail:\n%s", x.ID, x.Tail(6000))
	}
	if b, err := os.ReadFile(agentLog); err == nil {
		if len(b) > 3000 {
			b = b[len(b)-3000:]
		}
		t.Logf("agent's stderr, tail:\n%s", b)
	}
}

// TestFaultTreeClient is the B-link tree scenario's client (tree.go) when
// TestFaults re-executes the test binary inside the client namespace;
// otherwise it does nothing.
func TestFaultTreeClient(t *testing.T) {
	env := os.Getenv(TreeEnv)
	if env == "" {
		t.Skip("runs only as TestFaults' tree client")
	}
	var cfg TreeConfig
	if err := json.NewDecoder(strings.NewReader(env)).Decode(&cfg); err != nil {
		t.Fatal(err)
	}
	if err := runTreeClient(cfg, t.Logf); err != nil {
		t.Fatal(err)
	}
}

// TestFaultRLDevClient is the RLDev scenario's client (rldev.go) when
// TestFaults re-executes the test binary inside the client namespace;
// otherwise it does nothing.
func TestFaultRLDevClient(t *testing.T) {
	env := os.Getenv(RLDevEnv)
	if env == "" {
		t.Skip("runs only as TestFaults' RLDev client")
	}
	var cfg RLDevConfig
	if err := json.NewDecoder(strings.NewReader(env)).Decode(&cfg); err != nil {
		t.Fatal(err)
	}
	if err := runRLDevClient(cfg, t.Logf); err != nil {
		t.Fatal(err)
	}
}

// TestFaultAgent is the agent (agent.go) when TestFaults re-executes the
// test binary inside the client namespace; otherwise it does nothing.
func TestFaultAgent(t *testing.T) {
	env := os.Getenv(AgentEnv)
	if env == "" {
		t.Skip("runs only as TestFaults' agent")
	}
	var cfg AgentConfig
	if err := json.NewDecoder(strings.NewReader(env)).Decode(&cfg); err != nil {
		t.Fatal(err)
	}
	if err := RunAgent(cfg, os.Stdin, os.Stdout); err != nil {
		t.Fatal(err)
	}
}
