package main

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/bench"
	"github.com/grovestore/grove/internal/btree/linload"
)

// TestEndToEndTreeLinearizable is the real-process counterpart of the
// B-tree simulator: what runs here is what users run — `grove up
// --processes`, the public Go client with its routing and retries, the
// B-tree service, the real lock service (master, standbys, recovery runs),
// the config service, the chunk store and the log on real disks. The
// workload is package linload's (the fault suite's tree scenario runs it
// too, under network faults): four clients (one routed over every node, two pinned to one node each without
// routing, one routed over two nodes) put, conditionally put and delete,
// get, count and scan (one atomic page, through the gRPC API) on one tree
// of 12 keys with fanout 4 (splits and merges all the time; a sixth of the
// values are large enough for chunks of their own); two etcd clients put,
// get and delete (with prev_kv) through random nodes' etcd endpoints, whose
// calls are forwarded to the etcd tree's home. Meanwhile a seeded fault
// schedule SIGKILLs one node and restarts it, stops one node cleanly
// (SIGTERM: its B-tree server must close without leaving its leases to a
// recovery) and restarts it, SIGSTOPs one node for up to
// three times the failure detector's grace period (it is declared dead,
// its log is replayed elsewhere, and it fences itself when it resumes), or
// SIGKILLs every node at once and restarts them (the new lock master
// recovers every B-tree server before granting). After the faults, every
// key is read through every node; each history is checked with porcupine
// (package lincheck: a write that failed without saying whether it took
// effect stays open-ended; one the client reports as ErrUnavailable must
// have changed nothing and is left out, so a false report shows), and the
// tree is walked (grove tree stat's walker: keys in order, high keys,
// right links, separators). Network faults between these processes are the
// fault suite's (internal/faults, RunTree).
//
// GROVE_SEED=S replays round 1's fault and operation choices (the
// interleaving is the machine's); GROVE_TREE_LIN_ROUNDS=N runs N rounds on
// the same cluster (seeds S, S+1, ...), each on a new tree; the default is
// one round of four faults.
func TestEndToEndTreeLinearizable(t *testing.T) {
	t.Parallel() // its own ports and directories: see parallelTests
	seed := time.Now().UnixNano() % 1_000_000
	if s := os.Getenv("GROVE_SEED"); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		seed = v
	}
	rounds := 1
	if s := os.Getenv("GROVE_TREE_LIN_ROUNDS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil {
			t.Fatal(err)
		}
		rounds = v
	}
	_, u, _ := startCluster(t, 8300, "--chunk-size", "64MiB")
	keepLogsOnFailure(t, u, "grove-e2e-lin")
	for r := 0; r < rounds; r++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		res, err := linload.Run(ctx, linload.Config{Tree: fmt.Sprintf("lin-%d", seed+int64(r)), Seed: seed + int64(r),
			Endpoints: []string{u.Nodes[1].GRPC, u.Nodes[2].GRPC, u.Nodes[3].GRPC},
			Faults: func(ctx context.Context, rr *rand.Rand, event func(string, ...any)) []string {
				return processFaults(ctx, t, u, rr, event, 4)
			},
			Healed: u.WaitAllHeard, Logf: t.Logf})
		cancel()
		if err != nil {
			// Each node's goroutines go to its log (kept by
			// keepLogsOnFailure): a Go process dumps them on SIGQUIT.
			for _, n := range u.Nodes {
				_ = syscall.Kill(n.PID, syscall.SIGQUIT)
			}
			time.Sleep(2 * time.Second)
			t.Fatalf("seed %d (GROVE_SEED=%d replays its choices): %v", seed+int64(r), seed+int64(r), err)
		}
		t.Logf("seed %d: %s", seed+int64(r), res)
	}
}

// processFaults runs n faults one after another, each begun 1–3 s after the last
// one healed: a node SIGKILLed and restarted 0.5–3 s later; a node
// stopped cleanly (SIGTERM) and restarted 0.2–2 s after it exited; a node
// SIGSTOPped for 0.2–3 s (the failure detector's grace period is 1 s); at
// most once, every node SIGKILLed at once and restarted. It returns what
// it did.
func processFaults(ctx context.Context, t *testing.T, u *bench.UpCluster, r *rand.Rand, event func(string, ...any), n int) []string {
	var did []string
	sleep := func(lo, hi time.Duration) time.Duration {
		d := lo + time.Duration(r.Int63n(int64(hi-lo)))
		bench.SleepCtx(ctx, d)
		return d
	}
	killedAll := false
	for f := 0; f < n && ctx.Err() == nil; f++ {
		sleep(time.Second, 3*time.Second)
		id := uint64(1 + r.Intn(3))
		switch x := r.Intn(10); {
		case x >= 8 && !killedAll:
			killedAll = true
			event("SIGKILL every node")
			for id := uint64(1); id <= 3; id++ {
				_ = syscall.Kill(u.Nodes[id].PID, syscall.SIGKILL)
			}
			for id := uint64(1); id <= 3; id++ {
				if err := u.Kill(id); err != nil && !strings.Contains(err.Error(), "no such process") {
					t.Errorf("kill node %d: %v", id, err)
				}
			}
			d := sleep(500*time.Millisecond, time.Second)
			for id := uint64(1); id <= 3; id++ {
				if err := u.Restart(id); err != nil {
					t.Errorf("restart node %d: %v", id, err)
				}
			}
			event("every node restarted")
			did = append(did, fmt.Sprintf("every node killed for %v", d.Round(time.Millisecond)))
		case x == 3:
			// A clean stop: the B-tree server refuses new commits, writes
			// every dirty node back, checkpoints its log and gives every
			// lease back (no recovery), while calls keep arriving.
			event("SIGTERM node %d", id)
			stopCleanly(t, u, id)
			d := sleep(200*time.Millisecond, 2*time.Second)
			if err := u.Restart(id); err != nil {
				t.Errorf("restart node %d: %v", id, err)
			}
			event("node %d restarted", id)
			did = append(did, fmt.Sprintf("node %d stopped (SIGTERM) for %v", id, d.Round(time.Millisecond)))
		case x < 4 || x >= 8:
			event("SIGKILL node %d", id)
			if err := u.Kill(id); err != nil {
				t.Errorf("kill node %d: %v", id, err)
			}
			d := sleep(500*time.Millisecond, 3*time.Second)
			if err := u.Restart(id); err != nil {
				t.Errorf("restart node %d: %v", id, err)
			}
			event("node %d restarted", id)
			did = append(did, fmt.Sprintf("node %d killed for %v", id, d.Round(time.Millisecond)))
		default:
			pid := u.Nodes[id].PID
			event("SIGSTOP node %d", id)
			_ = syscall.Kill(pid, syscall.SIGSTOP)
			d := sleep(200*time.Millisecond, 3*time.Second)
			_ = syscall.Kill(pid, syscall.SIGCONT)
			event("SIGCONT node %d", id)
			did = append(did, fmt.Sprintf("node %d paused for %v", id, d.Round(time.Millisecond)))
		}
	}
	return did
}
