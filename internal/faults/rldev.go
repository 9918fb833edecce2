package faults

import (
	"context"
	"path/filepath"
	"regexp"
	"time"

	"github.com/grovestore/grove/internal/meta"
	"github.com/grovestore/grove/internal/rldev"
	"github.com/grovestore/grove/internal/rldev/blockload"
)

// RLDevEnv carries the RLDev client's configuration (JSON) to the test
// binary re-executed in the client namespace; its presence is what makes
// TestFaultRLDevClient run.
const RLDevEnv = "GROVE_FAULTS_RLDEV"

// RLDevConfig is the RLDev client's configuration.
type RLDevConfig struct {
	Seed   int64
	Rounds int // each on three new RLDevs, seeds Seed, Seed+1, ...
	Faults int // faults per round
	Nodes  int
	PIDs   []int // the nodes' server processes, paused as one kind of fault
}

// RunRLDev is the RLDevs' network-fault scenario: the real-process block
// workload (package blockload, cmd/grove's TestEndToEndRLDevLinearizable's
// too: clients writing unique values to three RLDevs through a clerk in
// the client namespace and reading them back through the primary or from
// one named copy, an operator moving segments, porcupine per block, both
// copies identical after healing) while the client makes netFaults: a
// node isolated (it fences itself; its RLDevs degrade and resync when it
// returns), the two nodes of some RLDevs cut from each other only while
// both stay alive to the observers (their writes wait; nothing is declared
// dead, nothing may be lost), a one-way cut, loss on every link, a node's
// process paused past its grace period (a zombie replica once it resumes).
func (s *Suite) RunRLDev(dir string, seed int64) *Result {
	r := &Result{Name: "rldev: linearizable under network faults", Victim: "—", M: map[string]time.Duration{}, Expected: map[string]bool{},
		Targets: map[string]time.Duration{}, Fences: map[int]int{}, Rate: -1, Elections: -1}
	s.Results = append(s.Results, r)
	defer s.report(r)
	start := time.Now()
	if _, err := s.healthy(90*time.Second, false); err != nil {
		r.violate("the cluster is not healthy before the RLDev scenario: %v", err)
		r.broken = true
		return r
	}
	m0 := s.scrape()
	cfg := RLDevConfig{Seed: seed, Rounds: s.Mode.RLDevRounds, Faults: s.Mode.TreeFaults, Nodes: s.nodes(), PIDs: s.pids()}
	log := filepath.Join(dir, "rldev-client.log")
	s.Logf("rldev scenario: seed %d (GROVE_SEED=%d replays its choices; the interleaving is the machine's), %d round(s) of %d network faults; the client's log: %s",
		seed, seed, cfg.Rounds, cfg.Faults, log)
	// (a round: the faults, up to 90 s to settle, the final reads and the
	// checks, within the round's 5 minutes)
	s.runClient(r, clientRun{test: "TestFaultRLDevClient", env: RLDevEnv, cfg: cfg, log: log,
		timeout: 6 * time.Minute * time.Duration(cfg.Rounds), done: rldevRoundDone, mark: "rldev round", rounds: cfg.Rounds, seed: seed})
	r.Length = time.Since(start)
	r.note("the scenario took %v", r.Length.Round(time.Second))
	s.countFences(r, m0)
	return r
}

// rldevRoundDone matches the line the RLDev client logs for each round
// that passed.
var rldevRoundDone = regexp.MustCompile(`rldev round seed [0-9]+: `)

// runRLDevClient is TestFaultRLDevClient's body, in the client namespace.
func runRLDevClient(cfg RLDevConfig, logf func(string, ...any)) error {
	var ms []meta.Member
	var nodes []uint64
	for i := 1; i <= cfg.Nodes; i++ {
		ms = append(ms, meta.Member{ID: uint64(i), RaftAddr: Raft(i), GRPCAddr: GRPC(i)})
		nodes = append(nodes, uint64(i))
	}
	mc := meta.NewClient(ms)
	defer mc.Close()
	cl := rldev.NewClerk(mc)
	defer cl.Close()
	return clientRounds("rldev", cfg.Seed, cfg.Rounds, logf, func(ctx context.Context, seed int64, _ []string, healed func(context.Context) error, faults faultsFunc) (string, error) {
		res, err := blockload.Run(ctx, blockload.Config{Clerk: cl, Seed: seed, Nodes: nodes,
			Faults: faults(cfg.Faults, cfg.Nodes, cfg.PIDs, false), Healed: healed})
		if err != nil {
			return "", err
		}
		return res.String(), nil
	}, cfg.Nodes)
}
