package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"os"
	"regexp"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/transport"
)

// A scenario's client, shared by the tree and RLDev scenarios: the test
// binary re-executed in the client namespace (runClient, on the suite's
// side), running rounds of a workload with network faults (clientRounds,
// in the client).

// clientRun is a scenario's client: this test binary re-executed in the
// client namespace, running test with cfg (JSON) in env.
type clientRun struct {
	test, env string
	cfg       any
	log       string         // its output
	timeout   time.Duration  // the test binary's -test.timeout
	done      *regexp.Regexp // a line it logs for each round that passed
	mark      string         // its lines that go into the result's notes
	rounds    int
	seed      int64
}

// runClient runs c to its end, heals whatever fault it left on, and
// notes in r what it logged and whether it passed every round.
func (s *Suite) runClient(r *Result, c clientRun) {
	self, err := os.Executable()
	if err != nil {
		r.violate("%v", err)
		return
	}
	b, _ := json.Marshal(c.cfg)
	lf, err := os.Create(c.log)
	if err != nil {
		r.violate("%v", err)
		return
	}
	defer lf.Close()
	cmd := Exec(clientNS, self, "-test.run=^"+c.test+"$", "-test.count=1", "-test.v", fmt.Sprintf("-test.timeout=%v", c.timeout))
	cmd.Env = append(os.Environ(), c.env+"="+string(b))
	cmd.Stdout, cmd.Stderr = lf, lf
	runErr := cmd.Run()
	_, _ = s.Net.Heal() // (the client heals after each fault; this is for one that died mid-fault)
	for _, x := range s.Cluster.Nodes {
		_ = x.cmd.Process.Signal(syscall.SIGCONT) // (the same for a pause)
	}
	out, _ := os.ReadFile(c.log)
	passed := 0 // rounds the client reports done (a client that skipped, or never ran, reports none)
	why := ""   // the round's error, which goes into the violation: CI shows only the tail of a failed run
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, c.mark) {
			r.note("%s", strings.TrimSpace(l))
		}
		if c.done.MatchString(l) {
			passed++
		} else if strings.Contains(l, c.mark+" seed ") && strings.Contains(l, "GROVE_SEED=") && why == "" {
			why = strings.TrimSpace(l)
			if len(why) > 1500 {
				why = why[:1500] + "…"
			}
		}
	}
	if runErr == nil && passed != c.rounds {
		runErr = fmt.Errorf("the client exited without error but reports %d of %d rounds done", passed, c.rounds)
	}
	if runErr != nil {
		tail := string(out)
		if len(tail) > 6000 {
			tail = tail[len(tail)-6000:]
		}
		s.Logf("the client's log (%s), tail:\n%s", c.test, tail)
		if why != "" {
			why = "; it said: " + why
		}
		r.violate("the client failed (%v): seed %d; see %s%s", runErr, c.seed, c.log, why)
	}
}

// faultsFunc makes a round's network faults (netFaults with n faults on
// nodes, pids and long) as a workload's Faults.
type faultsFunc func(n, nodes int, pids []int, long bool) func(ctx context.Context, r *rand.Rand, event func(string, ...any)) []string

// clientRounds runs a scenario client's rounds, each of seed seed+round
// and at most 5 minutes: round runs one, given the nodes' endpoints, a
// function that waits until they are healed, and its faults. A fault that
// could not be made or healed fails the round (it proves less than it
// says). Each round that passes logs "KIND round seed S: ...".
func clientRounds(kind string, seed0 int64, rounds int, logf func(string, ...any),
	round func(ctx context.Context, seed int64, eps []string, healed func(context.Context) error, faults faultsFunc) (string, error), nodes int) error {
	net := &Net{Nodes: nodes}
	var eps []string
	for i := 1; i <= nodes; i++ {
		eps = append(eps, GRPC(i))
	}
	var conns []pb.ClusterServiceClient
	for _, ep := range eps {
		cc, err := grpc.NewClient(ep, transport.DialOptions()...)
		if err != nil {
			return err
		}
		defer cc.Close()
		conns = append(conns, pb.NewClusterServiceClient(cc))
	}
	healed := healedFunc(conns, nodes)
	for k := 0; k < rounds; k++ {
		seed := seed0 + int64(k)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		var failed []string
		faults := func(n, nodes int, pids []int, long bool) func(ctx context.Context, r *rand.Rand, event func(string, ...any)) []string {
			return func(ctx context.Context, r *rand.Rand, event func(string, ...any)) []string {
				did, errs := netFaults(ctx, net, r, event, n, nodes, pids, long)
				failed = errs
				return did
			}
		}
		res, err := round(ctx, seed, eps, healed, faults)
		cancel()
		if _, herr := net.Heal(); herr != nil {
			failed = append(failed, fmt.Sprintf("the final heal: %v", herr))
		}
		if err == nil && len(failed) > 0 {
			err = fmt.Errorf("faults failed: %s", strings.Join(failed, "; "))
		}
		if err != nil {
			return fmt.Errorf("%s round seed %d (GROVE_SEED=%d replays its choices): %w", kind, seed, seed, err)
		}
		logf("%s round seed %d: %s", kind, seed, res)
	}
	return nil
}

// healedFunc returns a function that waits until every node is alive and
// heard by a majority of the observers, as some node's status says. (Not
// by every observer: an observer's dead verdict on a live incarnation,
// after a one-way cut, lasts until the node's next incarnation; see
// Suite.fullCoverage.)
func healedFunc(conns []pb.ClusterServiceClient, nodes int) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		last := "no status answer"
		for {
			for _, c := range conns {
				cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				st, err := c.Status(cctx, &pb.StatusRequest{})
				cancel()
				if err != nil {
					last = err.Error()
					continue
				}
				ok := len(st.Nodes) == nodes
				for _, x := range st.Nodes {
					ok = ok && x.Alive && int(x.ObserversHeard) > nodes/2
				}
				if ok {
					return nil
				}
				last = fmt.Sprintf("%d nodes in the status", len(st.Nodes))
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("not every node is alive and heard (last: %s): %w", last, ctx.Err())
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
}
