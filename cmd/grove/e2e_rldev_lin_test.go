package main

import (
	"context"
	"math/rand"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/rldev"
	"github.com/grovestore/grove/internal/rldev/blockload"
)

// TestEndToEndRLDevLinearizable is the real-process counterpart of the
// RLDev simulator (internal/rldev's TestRLDevSimulation): what runs here
// is what users run -- `grove up --processes` (three nodes, each a config
// service member, an observer and a store node with its real disk file,
// fdatasync and disk workers), the clerk over the framed data path with
// its retries and its watched table. Four clients write unique values to
// random 1-4 block ranges of the first blocks of three RLDevs and read
// them back, through the primary or from one replica named (a stale one
// must refuse); an operator moves random segments to the node that holds
// neither copy (the move's copy, its switch and the old extent's wipe run
// under the faults); meanwhile processFaults SIGKILLs a node and restarts
// it, stops one cleanly, SIGSTOPs one past the failure detector's grace
// period (it is declared dead, the RLDevs degrade without it, and it
// fences itself when it resumes), or SIGKILLs every node at once.
//
// The workload and its oracle are package blockload's (the multi-host
// fault suite runs them under network faults). The oracle, independent of
// the engine: every block, taken as a
// register, has a linearizable history (porcupine: a write whose error
// says it may have taken effect, or that timed out, may have happened at
// any time after it began; one refused otherwise must never be read); a
// block never reads as corrupt and never holds bytes no write wrote (a
// SIGKILL keeps the page cache: nothing acknowledged may be lost, even
// with both copies killed at once); after the faults every RLDev is
// normal again, with no move in progress and no old extent left, and its
// two replicas, each read alone, hold identical blocks, which are the
// last value of each block's history.
//
// GROVE_SEED=S replays the fault, move and operation choices (the
// interleaving is the machine's).
func TestEndToEndRLDevLinearizable(t *testing.T) {
	t.Parallel() // its own ports and directories: see parallelTests
	seed := time.Now().UnixNano() % 1_000_000
	if s := os.Getenv("GROVE_SEED"); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		seed = v
	}
	t.Logf("seed %d (GROVE_SEED=%d replays its choices)", seed, seed)
	_, u, _ := startCluster(t, 10300)
	keepLogsOnFailure(t, u, "grove-e2e-rldev-lin")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	mc := upMeta(t, ctx, u)
	cl := rldev.NewClerk(mc)
	defer cl.Close()
	res, err := blockload.Run(ctx, blockload.Config{Clerk: cl, Seed: seed, Nodes: []uint64{1, 2, 3},
		Faults: func(ctx context.Context, r *rand.Rand, event func(string, ...any)) []string {
			return processFaults(ctx, t, u, r, event, 4)
		},
		Healed: u.WaitAllHeard})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("seed %d: %s", seed, res)
}
