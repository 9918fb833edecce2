package rldev

import (
	"os"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/disk"
	"github.com/grovestore/grove/internal/sim"
)

// TestRLDevSimulationHungDisk runs its hang alone: with a script, the
// simulator injects no other fault and moves nothing (runRSim's fault
// loop and moveOp are off when opts.script is set). This script hangs
// disks while the operator moves segments and a node crashes: a hang of
// a move's target, of a resync's source or target, of a primary
// recovering its dirty regions; one seed in two hangs the same disk
// again soon after it answers (a failed replica reloading, resynced, and
// failing again).
func review76HangMix(s *rsim, kinds *[]string) {
	w := s.w
	for at := w.Now(); at < simSafety; at += w.Between(500*time.Millisecond, 2*time.Second) {
		w.At(at, s.moveOp)
	}
	// A crash of a random node, before or during the hang.
	if w.Rand.Intn(2) == 0 {
		w.After(w.Between(0, 5*time.Second), func() {
			rn := s.n[NodeID(1+w.Rand.Intn(simNodes))]
			s.o.logf("CRASH node %d", rn.id)
			s.crash(rn, false)
			w.After(w.Between(500*time.Millisecond, 3*time.Second), func() { s.restart(rn) })
		})
	}
	tries := new(int)
	var hang func(n int)
	hang = func(n int) {
		type place struct {
			node NodeID
			disk uint32
			why  string
		}
		var pref, any []place
		t := s.table()
		for _, id := range t.IDs() {
			rec := t.RLDevs[id]
			for i, sg := range rec.Segs {
				p := place{NodeID(sg.Node), sg.Disk, "segment"}
				any = append(any, p)
				if rec.State == Resyncing {
					p.why = "resync source"
					if rec.Stale[i] {
						p.why = "resync target"
					}
					pref = append(pref, p)
				}
			}
			if m := rec.Move; m != nil {
				pref = append(pref, place{NodeID(m.To.Node), m.To.Disk, "move target"})
			}
		}
		if len(any) == 0 || len(pref) == 0 && *tries < 100 {
			*tries++
			w.After(100*time.Millisecond, func() { hang(n) })
			return
		}
		p := any[w.Rand.Intn(len(any))]
		if len(pref) > 0 && w.Rand.Intn(5) != 0 {
			p = pref[w.Rand.Intn(len(pref))]
		}
		d := w.Between(simDiskTimeout+time.Second, simDiskTimeout+6*time.Second)
		rn := s.n[p.node]
		rn.hungUntil[p.disk] = w.Now() + d
		s.o.logf("DISK HANG node %d disk %d (%s) for %v", p.node, p.disk, p.why, d)
		*kinds = append(*kinds, p.why)
		if w.Rand.Intn(2) == 0 {
			// The hang ends as a SCSI timeout does: what was queued fails
			// (writes with EIO, syncs losing what they covered).
			dev := rn.devs[p.disk]
			w.After(d-time.Millisecond, func() {
				s.o.logf("DISK node %d disk %d: the hang ends in errors", p.node, p.disk)
				dev.SetFaults(disk.MemFaults{WriteEIO: 0.3, ReadEIO: 0.3, SyncLoses: 0.5})
				s.o.failing[rn.id] = true
			})
			w.After(d+3*time.Millisecond, func() { dev.SetFaults(disk.MemFaults{}) })
			w.After(d+2*time.Second, func() { delete(s.o.failing, rn.id) })
		}
		if n > 0 {
			// Again, once it answered and its replicas reloaded.
			w.After(d+w.Between(1500*time.Millisecond, 4*time.Second), func() {
				rn.hungUntil[p.disk] = w.Now() + w.Between(simDiskTimeout+time.Second, simDiskTimeout+3*time.Second)
				s.o.logf("DISK HANG AGAIN node %d disk %d until %v", p.node, p.disk, rn.hungUntil[p.disk])
			})
		}
	}
	w.After(w.Between(500*time.Millisecond, 6*time.Second), func() { hang(w.Rand.Intn(2)) })
}

func TestReview76SimHangMix(t *testing.T) {
	if os.Getenv("GROVE_SEED_BASE") == "" && os.Getenv("GROVE_SEED") == "" {
		t.Setenv("GROVE_SEED_BASE", "7601")
	}
	n := 20
	if testing.Short() {
		n = 4
	}
	for _, seed := range sim.Seeds(t, n) {
		var kinds []string
		s := runRSim(t, seed, simOpts{quiet: true, suspect: true, syncLoses: true, script: func(s *rsim) { review76HangMix(s, &kinds) }})
		if len(s.o.fails) > 0 {
			reportRSim(t, "TestReview76SimHangMix", seed, s)
		}
		hangs := uint64(0)
		for _, rn := range s.n {
			if rn.e != nil {
				hangs += rn.e.Stats().DiskHangs
			}
		}
		t.Logf("seed %d: hung %v; %d moves, %d cancels; disk hangs found (last engines) %d", seed, kinds, s.moves, s.cancels, hangs)
	}
}
