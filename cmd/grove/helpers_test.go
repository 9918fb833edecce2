package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/bench"
	"github.com/grovestore/grove/internal/cli"
	"github.com/grovestore/grove/internal/meta"
)

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

// StatusJSON is `grove status -o json` as the tests read it: the keys are
// the table's headers.
type StatusJSON struct {
	Healthy    bool   `json:"healthy"`
	Leader     uint64 `json:"leader"`
	LastLeader uint64 `json:"last_leader"`
	Stale      bool   `json:"stale"`
	Members    []struct {
		Member    uint64 `json:"member"`
		Raft      string `json:"raft"`
		GRPC      string `json:"grpc"`
		Voter     bool   `json:"voter"`
		RaftState string `json:"raft_state"`
	} `json:"members"`
	Nodes []struct {
		Node        uint64   `json:"node"`
		State       string   `json:"state"`
		Incarnation uint64   `json:"incarnation"`
		HeardBy     int      `json:"heard_by"`
		DeadVotes   int      `json:"dead_votes"`
		Answered    int      `json:"answered"`
		GRPC        string   `json:"grpc"`
		Roles       []string `json:"roles"`
	} `json:"nodes"`
	Problems []string `json:"problems"`
}

// LockListJSON is `grove lock list -o json`.
type LockListJSON struct {
	Master  uint64 `json:"master"`
	Epoch   uint64 `json:"epoch"`
	Serving bool   `json:"serving"`
	Locks   []struct {
		Lock    string       `json:"lock"`
		Holders []HolderJSON `json:"holders"`
		Waiters []string     `json:"waiters"`
	} `json:"locks"`
	Clerks []struct {
		Clerk     string `json:"clerk"`
		Connected bool   `json:"connected"`
		Dead      bool   `json:"dead"`
		Leases    int    `json:"leases"`
	} `json:"clerks"`
}

// MemberListJSON is `grove member list -o json`.
type MemberListJSON struct {
	Members []struct {
		Member uint64 `json:"member"`
		Leader bool   `json:"leader"`
	} `json:"members"`
}

func parseStatus(t *testing.T, b []byte) StatusJSON {
	t.Helper()
	var s StatusJSON
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatalf("status --json does not parse: %v\n%s", err, b)
	}
	return s
}

// parallelTests: the longest real-process tests call t.Parallel (two at
// a time on a 2-core machine, once the package's other tests have run):
// they mostly wait on processes and timers, and one after the other they
// were half of this package's time. Each has a base port of its own, a
// block of 100 (a node uses base + 10i .. + 3; the tests use at most 5
// nodes), which startCluster claims: a test that reuses another's block
// while it runs fails at once, naming both. Tests that time what they
// observe (the failure detector's verdicts, TestEndToEndKillRestart) stay
// sequential.
var portBlocks = struct {
	sync.Mutex
	owner map[int]string
}{owner: map[int]string{}}

// claimPorts claims port's block of 100 for t until it ends.
func claimPorts(t *testing.T, port int) {
	t.Helper()
	b := port / 100
	portBlocks.Lock()
	defer portBlocks.Unlock()
	if o, ok := portBlocks.owner[b]; ok {
		t.Fatalf("base port %d: its block (%d-%d) is %s's while it runs: give this test a block of its own", port, b*100, b*100+99, o)
	}
	portBlocks.owner[b] = t.Name()
	t.Cleanup(func() {
		portBlocks.Lock()
		defer portBlocks.Unlock()
		delete(portBlocks.owner, b)
	})
}

// startCluster builds grove and runs `grove up --processes` on base port
// port for a real-process test; it is stopped when the test ends.
func startCluster(t *testing.T, port int, extra ...string) (string, *bench.UpCluster, context.Context) {
	t.Helper()
	if testing.Short() {
		t.Skip("real processes")
	}
	claimPorts(t, port)
	bin := buildGrove(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	if !slices.Contains(extra, "--chunk-size") {
		// The chunk store's pairs only where a test asks for them: the
		// other layers' tests count RLDevs and locks of their own.
		extra = append(extra, "--chunk-size", "0")
	}
	u, err := bench.StartUp(ctx, bin, t.TempDir(), port, testWriter{t}, extra...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(u.Close)
	return bin, u, ctx
}

// keepLogsOnFailure copies the nodes' logs of a failed run to
// $TMPDIR/<prefix>-node-N.log (the cluster's directory goes with the test).
func keepLogsOnFailure(t *testing.T, u *bench.UpCluster, prefix string) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for id, n := range u.Nodes {
			b, _ := os.ReadFile(filepath.Join(filepath.Dir(n.Config), "grove.log"))
			_ = os.WriteFile(filepath.Join(os.TempDir(), fmt.Sprintf("%s-node-%d.log", prefix, id)), b, 0o644)
		}
		t.Logf("the nodes' logs are in %s/%s-node-N.log", os.TempDir(), prefix)
	})
}

// stopCleanly stops node id as an operator does (SIGTERM, up to 30 s) and
// reports it as an error if the node's log says its B-tree server's clean
// close failed (its leases were then left to a recovery, as after a
// crash). It reports, and does not stop the test: callers may be load
// goroutines.
func stopCleanly(t *testing.T, u *bench.UpCluster, id uint64) {
	log := filepath.Join(filepath.Dir(u.Nodes[id].Config), "grove.log")
	before, _ := os.ReadFile(log)
	if err := u.Stop(id, 30*time.Second); err != nil {
		t.Errorf("stop node %d: %v", id, err)
		_ = u.Kill(id)
	}
	if after, _ := os.ReadFile(log); len(after) >= len(before) {
		if l := bytes.Index(after[len(before):], []byte("closing the B-tree server")); l >= 0 {
			line, _, _ := bytes.Cut(after[len(before)+l:], []byte("\n"))
			t.Errorf("node %d's clean stop failed to close its B-tree server (its leases were left to a recovery): %s", id, line)
		}
	}
}

// upMeta is a config-service client of u's members (closed when the test
// ends), for tests that use the Go clerks on a `grove up` cluster.
func upMeta(t *testing.T, ctx context.Context, u *bench.UpCluster) *meta.Client {
	t.Helper()
	st, err := u.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ms []meta.Member
	for _, m := range st.Members {
		ms = append(ms, meta.Member{ID: m.Id, RaftAddr: m.RaftAddr, GRPCAddr: m.GrpcAddr})
	}
	mc := meta.NewClient(ms)
	t.Cleanup(mc.Close)
	return mc
}

// rldevCLI runs grove commands against one endpoint of a cluster, as an
// operator's shell does (the real-process RLDev tests).
type rldevCLI struct {
	t   *testing.T
	bin string
	ep  string
}

// run runs grove with args and --addr; stdin, if not nil, is written to
// a file given as the last argument.
func (c rldevCLI) run(stdin []byte, args ...string) ran {
	c.t.Helper()
	full := append(args[:len(args):len(args)], "--addr", c.ep)
	if stdin == nil {
		return grove(c.t, c.bin, nil, full...)
	}
	f := filepath.Join(c.t.TempDir(), "in")
	if err := os.WriteFile(f, stdin, 0o644); err != nil {
		c.t.Fatal(err)
	}
	return grove(c.t, c.bin, nil, append(full, f)...)
}

// must fails the test unless r exited 0.
func (c rldevCLI) must(r ran) ran {
	c.t.Helper()
	if r.code != 0 {
		c.t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	return r
}

// list is `grove rldev list -o json`. A list that finds no config-service
// leader (exit 3 or 4: after a test killed two of the three members, one
// restarted must rejoin first, which took past the command's timeout on a
// loaded CI machine) is asked again for up to 30 s, as an operator would.
func (c rldevCLI) list() RLDevListJSON {
	c.t.Helper()
	r := c.run(nil, "rldev", "list", "-o", "json")
	for deadline := time.Now().Add(30 * time.Second); (r.code == cli.ExitUnavailable || r.code == cli.ExitTimeout) && time.Now().Before(deadline); {
		c.t.Logf("rldev list: exit %d (%s): asking again", r.code, strings.TrimSpace(r.stderr))
		time.Sleep(time.Second)
		r = c.run(nil, "rldev", "list", "-o", "json")
	}
	c.must(r)
	var l RLDevListJSON
	if err := json.Unmarshal([]byte(r.stdout), &l); err != nil {
		c.t.Fatalf("rldev list -o json: %v\n%s", err, r.stdout)
	}
	return l
}
