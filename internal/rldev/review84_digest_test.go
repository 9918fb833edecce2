package rldev

import (
	"crypto/sha256"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"
)

var r84UUID = regexp.MustCompile(`uuid [0-9a-f]+`)

// Outside review 84, question 2 (commit dde06ea): the refactor seen from outside.

// Differential (passes when run in both trees and the digests compared by
// hand): the simulation with random moves, cancels, crashes, partitions
// and disk faults, seed by seed, reduced to a digest of the oracle's
// trace, the decrees, and every live engine's counters. A
// behaviour-preserving refactor leaves every digest as it was. Set
// GROVE_R84_DIGEST=path to write the digests. Review 84: seeds 1-40
// identical in dde06ea^ and HEAD (git archive of each into /tmp); teeth:
// send no longer resetting resends on a first send changes 8 of 40.
func TestReview84SimDigest(t *testing.T) {
	path := os.Getenv("GROVE_R84_DIGEST")
	if path == "" {
		t.Skip("GROVE_R84_DIGEST not set")
	}
	var lines []string
	for seed := int64(1); seed <= 40; seed++ {
		s := runRSim(t, seed, simOpts{slowCopies: true})
		hs := sha256.New()
		for _, l := range s.o.trace {
			fmt.Fprintln(hs, r84UUID.ReplaceAllString(l, "uuid X")) // disk UUIDs are random
		}
		var ids []NodeID
		for i := range s.n {
			ids = append(ids, i)
		}
		sort.Slice(ids, func(a, b int) bool { return ids[a] < ids[b] })
		var stats []string
		for _, i := range ids {
			if rn := s.n[i]; rn.e != nil {
				stats = append(stats, fmt.Sprintf("%d:%+v", rn.id, rn.e.Stats()))
			}
		}
		fmt.Fprintln(hs, strings.Join(stats, ";"))
		lines = append(lines, fmt.Sprintf("seed %d: trace %d lines, decrees %d, moves %d cancels %d, writes %d reads %d, fails %d, digest %x",
			seed, len(s.o.trace), s.svc.Decrees, s.moves, s.cancels, s.o.writes, s.o.reads, len(s.o.fails), hs.Sum(nil)[:8]))
	}
	os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644)
	t.Log(strings.Join(lines, "\n"))
}
