package rldev

import (
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/sim"
)

// A disk that stops answering (Config.DiskTimeout): its node stays alive
// to the failure detector, so no verdict ever degrades its RLDevs, and
// without the watchdog every write of theirs waits for it -- on the
// primary's own sync, or for the secondary's acknowledgement -- for as
// long as it hangs.

// simHang is how long the hung-disk script's disk hangs: well past the
// disk timeout, so that the window it leaves after detection shows
// whether writes flow again, even when the decree that marks the hung
// segments stale is lost twice (each loss costs the config service's
// call timeout, 3 s: seed 8244 lost two and had 10 s of hang).
const simHang = simDiskTimeout + 12*time.Second

// simHangSlack is how long after the disk timeout writes may still wait:
// detection (a retry tick), the decree (lost twice, 6 s), the clients'
// retries.
const simHangSlack = 8 * time.Second

// hungDisk is what the hung-disk script did.
type hungDisk struct {
	node     NodeID
	disk     uint32
	from, to time.Duration
	ids      []uint64 // the RLDevs with a segment on the disk
	killed   bool     // the node was killed at the hang's end instead
}

// hangScript hangs one disk holding a segment (primary or secondary) for
// simHang; one seed in three, the node is killed at the end of the hang
// (an operator's way out) and comes back a second later.
func hangScript(s *rsim, h *hungDisk) {
	w := s.w
	t := s.table()
	if len(t.RLDevs) < simRLDevs {
		w.After(200*time.Millisecond, func() { hangScript(s, h) })
		return
	}
	type place struct {
		node NodeID
		disk uint32
	}
	var places []place
	for _, id := range t.IDs() {
		for _, seg := range t.RLDevs[id].Segs {
			places = append(places, place{NodeID(seg.Node), seg.Disk})
		}
	}
	p := places[w.Rand.Intn(len(places))]
	h.node, h.disk, h.from, h.to = p.node, p.disk, w.Now(), w.Now()+simHang
	for _, id := range t.IDs() {
		for _, seg := range t.RLDevs[id].Segs {
			if NodeID(seg.Node) == p.node && seg.Disk == p.disk && !slices.Contains(h.ids, id) {
				h.ids = append(h.ids, id)
			}
		}
	}
	rn := s.n[p.node]
	rn.hungUntil[p.disk] = h.to
	s.o.logf("DISK HANG node %d disk %d for %v (rldevs %v)", p.node, p.disk, simHang, h.ids)
	if w.Rand.Intn(3) == 0 {
		h.killed = true
		w.After(simHang-time.Millisecond, func() {
			s.o.logf("KILL node %d (its disk hung)", p.node)
			s.crash(rn, false)
			w.After(time.Second, func() { s.restart(rn) })
		})
	}
}

// checkHangAvailability: every RLDev with a segment on the hung disk
// acknowledged writes in the last seconds of the hang, from simHangSlack
// after the disk timeout on.
func checkHangAvailability(s *rsim, h *hungDisk) {
	from := h.from + hangTimeout(s.opts.diskTimeout) + simHangSlack
	for _, id := range h.ids {
		n := 0
		for _, at := range s.acks[id] {
			if at >= from && at < h.to {
				n++
			}
		}
		if n == 0 {
			s.o.fail("availability: rldev %d acknowledged no write from %v to %v, its segment's disk (node %d disk %d) hung since %v", id, from, h.to, h.node, h.disk, h.from)
		}
	}
}

// hangTimeout is the disk timeout the engines ran with (the check's, with
// the watchdog off, as if it were on).
func hangTimeout(d time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return simDiskTimeout
}

// TestRLDevSimulationHungDisk: one disk of a node hangs (every operation
// of it completes only after simHang) while clients write and read; the
// rest of the simulation's oracle as always (linearizable blocks, no
// stale replica serving, every RLDev normal and both copies identical
// after the faults). Besides: the RLDevs with a segment on that disk keep
// acknowledging writes during the hang, once the disk timeout has passed.
func TestRLDevSimulationHungDisk(t *testing.T) {
	if os.Getenv("GROVE_SEED_BASE") == "" && os.Getenv("GROVE_SEED") == "" {
		t.Setenv("GROVE_SEED_BASE", "8001")
	}
	var acked, killed, hung int
	for _, seed := range sim.Seeds(t, 30) {
		h := &hungDisk{}
		s := runRSim(t, seed, simOpts{quiet: true, suspect: true, syncLoses: true, script: func(s *rsim) { hangScript(s, h) }})
		checkHangAvailability(s, h)
		if len(s.o.fails) > 0 {
			reportRSim(t, "TestRLDevSimulationHungDisk", seed, s)
		}
		for _, id := range h.ids {
			for _, at := range s.acks[id] {
				if at >= h.from && at < h.to {
					acked++
				}
			}
		}
		hung += len(h.ids)
		if h.killed {
			killed++
		}
	}
	t.Logf("%d hung segments (%d nodes killed at the hang's end): %d writes of their RLDevs acknowledged during the hangs", hung, killed, acked)
}

// TestRLDevSimTeethHungDisk: without the watchdog (DiskTimeout off), the
// availability check catches the RLDevs of a hung disk acknowledging
// nothing while it hangs.
func TestRLDevSimTeethHungDisk(t *testing.T) {
	for seed := int64(8001); seed < 8006; seed++ {
		h := &hungDisk{}
		s := runRSim(t, seed, simOpts{quiet: true, suspect: true, syncLoses: true, diskTimeout: -1, script: func(s *rsim) { hangScript(s, h) }})
		checkHangAvailability(s, h)
		for _, f := range s.o.fails {
			if strings.Contains(f, "availability:") {
				t.Logf("seed %d: caught: %s", seed, f)
				return
			}
		}
		t.Logf("seed %d: not caught (%d failures: %v)", seed, len(s.o.fails), s.o.fails)
	}
	t.Fatal("5 seeds with hung disks and no disk timeout passed: the availability check cannot see it")
}
