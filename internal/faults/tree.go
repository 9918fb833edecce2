package faults

import (
	"context"
	"fmt"
	"math/rand"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/btree/linload"
	"github.com/grovestore/grove/internal/transport"
)

// TreeEnv carries the tree client's configuration (JSON) to the test binary
// re-executed in the client namespace; its presence is what makes
// TestFaultTreeClient run.
const TreeEnv = "GROVE_FAULTS_TREE"

// TreeConfig is the tree client's configuration.
type TreeConfig struct {
	Seed   int64
	Rounds int // each on a new tree, seeds Seed, Seed+1, ...
	Faults int // faults per round
	Nodes  int
	// PIDs are the nodes' `grove server` processes (PIDs[i-1]: node i),
	// which the client pauses (SIGSTOP) as one kind of fault: it runs in
	// another network namespace, not another PID namespace.
	PIDs []int
	// LongPause: some pauses last 16–20 s, past the chunk clerk's 15 s
	// attempt timeout, so that a write-back sent to a paused chunk
	// manager is retried at its pair's new primary while the first
	// attempt may still land (the fence renewal's path).
	LongPause bool
}

// RunTree is the B-link tree's network-fault scenario, run after the lock
// scenarios on the same cluster: it gives the cluster a chunk store (one
// chunk manager pair per adjacent node pair, as grove up does), then runs
// the tree client (TestFaultTreeClient) in the client namespace. That client
// runs the real-process linearizability workload (package linload: clients
// on every node, conditional writes, scans, counts, the etcd endpoint,
// porcupine, the walker) while it makes network faults: a node isolated
// (it fences itself, is declared dead, and its B-tree server's log is
// replayed elsewhere), a cut between two nodes only, both ways, while both
// stay alive to the observers (among them the replicas of one chunk
// manager pair and of some RLDevs), a one-way cut, random loss on every
// link, and a node's process paused (a zombie once it resumes). A history that is not linearizable, a broken tree, or a round that
// cannot finish is a violation.
func (s *Suite) RunTree(bin, dir string, seed int64) *Result {
	r := &Result{Name: "tree: linearizable under network faults", Victim: "—", M: map[string]time.Duration{}, Expected: map[string]bool{},
		Targets: map[string]time.Duration{}, Fences: map[int]int{}, Rate: -1, Elections: -1}
	s.Results = append(s.Results, r)
	defer s.report(r)
	start := time.Now()
	if _, err := s.healthy(90*time.Second, false); err != nil {
		r.violate("the cluster is not healthy before the tree scenario: %v", err)
		r.broken = true
		return r
	}
	m0 := s.scrape()
	n := s.nodes()
	for a := 1; a <= n; a++ {
		b := a%n + 1
		var out []byte
		var err error
		for attempt := 0; attempt < 10; attempt++ {
			out, err = Exec(clientNS, bin, "chunk", "add-pair", "--nodes", fmt.Sprintf("%d,%d", a, b), "--size", "16MiB", "--addr", GRPC(a)).CombinedOutput()
			if err == nil {
				break
			}
			time.Sleep(time.Second)
		}
		if err != nil {
			r.violate("grove chunk add-pair --nodes %d,%d: %v: %s", a, b, err, out)
			return r
		}
	}
	cfg := TreeConfig{Seed: seed, Rounds: s.Mode.TreeRounds, Faults: s.Mode.TreeFaults, Nodes: n, LongPause: s.Mode.TreeLongPause, PIDs: s.pids()}
	s.Logf("tree scenario: seed %d (GROVE_SEED=%d replays its choices; the interleaving is the machine's), %d round(s) of %d network faults; the client's log: %s",
		seed, seed, cfg.Rounds, cfg.Faults, filepath.Join(dir, "tree-client.log"))
	// (a round: up to 5 minutes of load and final reads, two porcupine
	// checks of up to 240 s each, the walk)
	s.runClient(r, clientRun{test: "TestFaultTreeClient", env: TreeEnv, cfg: cfg, log: filepath.Join(dir, "tree-client.log"),
		timeout: 13 * time.Minute * time.Duration(cfg.Rounds), done: treeRoundDone, mark: "tree round", rounds: cfg.Rounds, seed: seed})
	r.Length = time.Since(start)
	r.note("the scenario took %v", r.Length.Round(time.Second))
	s.countFences(r, m0)
	return r
}

// countFences sets r's elections and self-fences columns: what the nodes'
// metrics counted since m0.
func (s *Suite) countFences(r *Result, m0 map[int]map[string]float64) {
	m1 := s.scrape()
	r.Elections = int(deltaMax(m0, m1, "grove_meta_raft_term"))
	r.MetricFences = int(deltaSum(m0, m1, "grove_fd_self_fences_total"))
	for id, after := range m1 { // the self-fences column, per node
		if before, ok := m0[id]; ok {
			if d := int(after["grove_fd_self_fences_total"] - before["grove_fd_self_fences_total"]); d > 0 {
				r.Fences[id] = d
			}
		}
	}
}

// pids are the nodes' server processes, in node order.
func (s *Suite) pids() []int {
	var out []int
	for _, x := range s.Cluster.Nodes {
		out = append(out, x.cmd.Process.Pid)
	}
	return out
}

// treeRoundDone matches the line the tree client logs for each round that
// passed.
var treeRoundDone = regexp.MustCompile(`tree round seed [0-9]+: `)

// runTreeClient is TestFaultTreeClient's body, in the client namespace: the
// rounds of the linearizability workload, each with its network faults.
func runTreeClient(cfg TreeConfig, logf func(string, ...any)) error {
	return clientRounds("tree", cfg.Seed, cfg.Rounds, logf, func(ctx context.Context, seed int64, eps []string, healed func(context.Context) error, faults faultsFunc) (string, error) {
		res, err := linload.Run(ctx, linload.Config{Tree: fmt.Sprintf("netfault-%d", seed), Seed: seed, Endpoints: eps,
			Faults: faults(cfg.Faults, cfg.Nodes, cfg.PIDs, cfg.LongPause), Healed: healed, Logf: logf, Trace: true})
		if err != nil {
			return "", err
		}
		return res + fmt.Sprintf("\ntree round seed %d, each node's B-tree server (since its start): %s", seed, treeCounters(eps, fmt.Sprintf("netfault-%d", seed))), nil
	}, cfg.Nodes)
}

// treeCounters reports, per node, what its B-tree server counted since it
// started (a node that fenced itself started a new one): its fence
// renewals after node writes of unknown outcome (the path a write whose
// earlier attempt may still land takes) and the stray chunks it freed.
func treeCounters(eps []string, tree string) string {
	var out []string
	for i, ep := range eps {
		cc, err := grpc.NewClient(ep, transport.DialOptions()...)
		if err != nil {
			out = append(out, fmt.Sprintf("node %d: %v", i+1, err))
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		r, err := pb.NewTreeServiceClient(cc).Stat(ctx, &pb.TreeStatRequest{Tree: tree})
		cancel()
		cc.Close()
		if err != nil {
			out = append(out, fmt.Sprintf("node %d: %v", i+1, err))
			continue
		}
		out = append(out, fmt.Sprintf("node %d: %d fence renewals, %d stray chunks freed, %d write-backs, %d revocations", i+1, r.FenceRenewals, r.StrayChunks, r.WriteBacks, r.Revocations))
	}
	return strings.Join(out, "; ")
}

// netFaults makes n network faults one after another, each begun 1–3 s
// after the last one healed:
//   - a node isolated from everything for 0.5–5 s (past the failure
//     detector's 1 s grace period it fences itself, is declared dead, and
//     another B-tree server replays its log);
//   - a cut between two nodes only, both ways, for 0.5–5 s: both stay
//     alive to the observers (the third node hears both), so nothing is
//     declared dead, while the replicas on those two nodes (a chunk
//     manager pair, RLDevs, log segments) cannot reach each other;
//   - a one-way cut between two nodes for 0.5–5 s;
//   - 5–25 % loss on every link for 1–5 s;
//   - with pids (the nodes' processes), a node paused (SIGSTOP, then
//     SIGCONT) for 0.5–5 s: past the grace period it is declared dead
//     while it cannot fence itself, and resumes as a zombie whose calls in
//     flight (node write-backs, chunk manager changes, log writes) go out
//     late and must be refused; with long, one pause in three lasts
//     16–20 s instead, past the chunk clerk's 15 s attempt timeout.
//
// It returns what it did, and the faults it could not make or heal.
func netFaults(ctx context.Context, net *Net, r *rand.Rand, event func(string, ...any), n, nodes int, pids []int, long bool) (did, failed []string) {
	sleep := func(lo, hi time.Duration) time.Duration {
		d := lo + time.Duration(r.Int63n(int64(hi-lo)))
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
		return d
	}
	for f := 0; f < n && ctx.Err() == nil; f++ {
		sleep(time.Second, 3*time.Second)
		a := 1 + r.Intn(nodes)
		b := (a-1+1+r.Intn(nodes-1))%nodes + 1 // any other node
		var what string
		var err error
		kinds := 8
		if len(pids) == nodes {
			kinds = 10
		}
		switch x := r.Intn(kinds); {
		case x >= 8:
			what = fmt.Sprintf("node %d paused", a)
			if err = pauseProcess(pids[a-1]); err != nil {
				_ = syscall.Kill(pids[a-1], syscall.SIGCONT)
				event("fault %q failed: %v", what, err)
				failed = append(failed, fmt.Sprintf("%s: %v", what, err))
				continue
			}
			event("%s", what)
			lo, hi := 500*time.Millisecond, 5*time.Second
			if long && r.Intn(3) == 0 {
				lo, hi = 16*time.Second, 20*time.Second
			}
			d := sleep(lo, hi)
			if err := syscall.Kill(pids[a-1], syscall.SIGCONT); err != nil {
				event("resume failed: %v", err)
				failed = append(failed, fmt.Sprintf("resuming %s: %v", what, err))
			}
			event("resumed")
			did = append(did, fmt.Sprintf("%s for %v", what, d.Round(time.Millisecond)))
			continue
		case x < 3:
			what = fmt.Sprintf("node %d isolated", a)
			_, err = net.Isolate(a)
		case x < 5:
			what = fmt.Sprintf("nodes %d and %d cut from each other", a, b)
			if _, err = net.Cut(a, b); err == nil {
				_, err = net.Cut(b, a)
			}
		case x < 7:
			what = fmt.Sprintf("node %d cut from node %d one way", a, b)
			_, err = net.Cut(a, b)
		default:
			pct := 5 + r.Intn(21)
			what = fmt.Sprintf("%d%% loss on every link", pct)
			_, err = net.Loss(pct)
		}
		if err != nil {
			event("fault %q failed: %v", what, err)
			_, _ = net.Heal()
			failed = append(failed, fmt.Sprintf("%s: %v", what, err))
			continue
		}
		event("%s", what)
		d := sleep(500*time.Millisecond, 5*time.Second)
		if _, err := net.Heal(); err != nil {
			event("heal failed: %v", err)
			failed = append(failed, fmt.Sprintf("healing %s: %v", what, err))
		}
		event("healed")
		did = append(did, fmt.Sprintf("%s for %v", what, d.Round(time.Millisecond)))
	}
	return did, failed
}

// pauseProcess stops process pid (SIGSTOP) and waits until it is seen
// stopped (the signal is delivered asynchronously).
func pauseProcess(pid int) error {
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return err
	}
	for deadline := time.Now().Add(5 * time.Second); !stopped(pid); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			return fmt.Errorf("process %d not stopped 5 s after SIGSTOP", pid)
		}
	}
	return nil
}
