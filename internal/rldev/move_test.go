package rldev

import (
	"fmt"
	"strings"
	"testing"
	"time"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/disk"
)

// TestRLDevMoveCrashPoints interrupts a segment move at each of its
// phases by crashing each participant (the primary, the secondary, the
// target, the node the segment moves from, which holds the old extent),
// for a move of the primary's segment and of the secondary's, under the
// simulation's clients and oracle: each time the RLDev ends normal, the
// move resolved (the segment at its target, or rebuilt there), its old
// extent freed, every block linearizable and both copies identical.
func TestRLDevMoveCrashPoints(t *testing.T) {
	if testing.Short() {
		t.Skip("single-threaded simulations (32 runs): the full suite runs them; the race pass would spend minutes on them")
	}
	phases := []string{"asked", "copying", "switching", "retiring"}
	runs, resolved := 0, map[string]int{}
	for _, dest := range []string{"node", "disk"} {
		// To another disk of the same node, the target and the origin
		// are the moving replica's node; its old disk may fail instead
		// (the move empties a failing disk).
		victims := []string{"primary", "secondary", "target", "origin"}
		if dest == "disk" {
			victims = []string{"primary", "secondary", "origin disk"}
		}
		for _, seg := range []string{"primary", "secondary"} {
			for _, phase := range phases {
				for _, victim := range victims {
					seed := int64(1000 + runs)
					runs++
					var log []string
					crashed := false
					s := runRSim(t, seed, simOpts{quiet: true, script: func(s *rsim) { moveAndCrash(s, dest, seg, phase, victim, &crashed, &log) }})
					name := fmt.Sprintf("move the %s segment to another %s, crash the %s while %s", seg, dest, victim, phase)
					if len(s.o.fails) > 0 {
						t.Logf("%s: %s", name, strings.Join(log, "; "))
						reportRSim(t, "TestRLDevMoveCrashPoints", seed, s)
					}
					if !crashed {
						t.Errorf("%s (seed %d): the move never reached that phase: %s", name, seed, strings.Join(log, "; "))
						continue
					}
					rec := s.table().RLDevs[1]
					where := "back where it was"
					if rec.Segs != s.origin[1] {
						where = "at its target"
					}
					resolved[where]++
					t.Logf("%s: %s; the segment ends %s", name, strings.Join(log, "; "), where)
				}
			}
		}
	}
	t.Logf("%d crash points, every one resolved: %v", runs, resolved)
}

// moveAndCrash moves RLDev 1's seg ("primary" or "secondary") segment to
// a node holding none (dest "node") or to another disk of its node (dest
// "disk"), and crashes victim (restarting it 1 s later) when the move
// reaches phase; victim "origin disk" is the moving segment's disk, which
// fails every write for 1 s instead.
func moveAndCrash(s *rsim, dest, seg, phase, victim string, crashed *bool, log *[]string) {
	w := s.w
	var target NodeID
	var segIdx int
	var start func()
	start = func() {
		s.svc.Update(s.adm, Namespace, "move", func(ns *pb.Namespace) ([]*pb.Op, error) {
			tb, err := DecodeTable(ns)
			if err != nil || tb.RLDevs[1] == nil || tb.RLDevs[1].State != Normal {
				return nil, err
			}
			rec := tb.RLDevs[1]
			segIdx = rec.Primary
			if seg == "secondary" {
				segIdx = rec.Secondary()
			}
			for n := NodeID(1); n <= simNodes; n++ {
				if rec.SegmentOf(n) < 0 {
					target = n
					break
				}
			}
			if dest == "disk" {
				target = rec.Segs[segIdx].Node
			}
			disk := -1
			if dest == "disk" {
				disk = 1 - int(rec.Segs[segIdx].Disk)
			}
			nr, err := tb.StartMove(1, segIdx, target, disk)
			if err != nil {
				return nil, err
			}
			return []*pb.Op{nr.PutOp()}, nil
		}, func(_ uint64, err error) {
			if err != nil || target == 0 {
				w.After(100*time.Millisecond, start)
				return
			}
			*log = append(*log, fmt.Sprintf("%.3fs move of segment %d to node %d (another %s) asked", w.Now().Seconds(), segIdx, target, dest))
		})
	}
	start()
	var watch func()
	watch = func() {
		if *crashed || w.Now() > simSafety-2*time.Second {
			return
		}
		rec := s.table().RLDevs[1]
		at := ""
		if rec == nil {
			w.After(time.Millisecond, watch)
			return
		}
		switch m := rec.Move; {
		case m == nil && len(rec.Retiring) > 0:
			at = "retiring"
		case m == nil:
		case m.Switch:
			at = "switching"
		case m.Inc != 0:
			// Copying: the primary's copy under way (the table's
			// progress is recorded only now and then).
			if pe := s.n[rec.Segs[rec.Primary].Node].e; pe != nil {
				if r := pe.reps[1]; r != nil && r.mv != nil && r.mv.copied > 0 && !r.mv.done() {
					at = "copying"
				}
			}
		case m.Inc == 0:
			at = "asked"
		}
		if at != phase || target == 0 {
			w.After(time.Millisecond, watch)
			return
		}
		var node NodeID
		moving := s.origin[1][segIdx].Node
		switch victim {
		case "primary":
			node = rec.Segs[rec.Primary].Node
		case "secondary":
			node = rec.Segs[rec.Secondary()].Node
		case "target":
			node = target
		case "origin": // the moving replica's node, whose old extent retires
			node = moving
		case "origin disk":
			*crashed = true
			from := s.origin[1][segIdx]
			*log = append(*log, fmt.Sprintf("%.3fs disk %d of node %d (the moving replica's) fails writes at %s", w.Now().Seconds(), from.Disk, from.Node, phase))
			dev := s.n[from.Node].devs[from.Disk]
			dev.SetFaults(disk.MemFaults{WriteEIO: 1})
			w.After(time.Second, func() { dev.SetFaults(disk.MemFaults{}) })
			return
		}
		role := victim
		if node == moving {
			role += ", the moving replica"
		}
		*crashed = true
		*log = append(*log, fmt.Sprintf("%.3fs crash node %d (%s) at %s", w.Now().Seconds(), node, role, phase))
		rn := s.n[node]
		s.crash(rn, false)
		w.After(time.Second, func() { s.restart(rn) })
	}
	watch()
}

// TestRLDevResyncSurvivorCrash: a replica's node crashes (the RLDev
// degrades), writes go on, it comes back; the survivor, the only
// up-to-date copy, then crashes while degraded, while it asks for the
// resync, and in the middle of the copy. Nothing acknowledged may be lost
// (the oracle is strict: a crash without torn writes of the only
// up-to-date copy is no excuse); the RLDev ends normal with identical
// copies.
func TestRLDevResyncSurvivorCrash(t *testing.T) {
	if testing.Short() {
		t.Skip("single-threaded simulations: the full suite runs them")
	}
	for i, phase := range []string{"degraded", "resyncing", "copying"} {
		seed := int64(2000 + i)
		var log []string
		crashed := false
		s := runRSim(t, seed, simOpts{quiet: true, strict: true, script: func(s *rsim) { survivorCrash(s, phase, &crashed, &log) }})
		if len(s.o.fails) > 0 {
			t.Logf("%s: %s", phase, strings.Join(log, "; "))
			reportRSim(t, "TestRLDevResyncSurvivorCrash", seed, s)
		}
		if !crashed {
			t.Fatalf("survivor crash while %s (seed %d): never reached: %s", phase, seed, strings.Join(log, "; "))
		}
		if s.o.double[1] {
			t.Fatalf("survivor crash while %s (seed %d): counted as a double fault", phase, seed)
		}
		t.Logf("survivor crash while %s: %s; %d writes, %d reads checked", phase, strings.Join(log, "; "), s.o.writes, s.o.reads)
	}
}

func survivorCrash(s *rsim, phase string, crashed *bool, log *[]string) {
	w := s.w
	var stale, survivor NodeID
	var step func()
	step = func() {
		if *crashed || w.Now() > simSafety-3*time.Second {
			return
		}
		rec := s.table().RLDevs[1]
		if rec == nil {
			w.After(time.Millisecond, step)
			return
		}
		if stale == 0 {
			if rec.State != Normal {
				w.After(time.Millisecond, step)
				return
			}
			stale, survivor = rec.Segs[rec.Secondary()].Node, rec.Segs[rec.Primary].Node
			*log = append(*log, fmt.Sprintf("%.3fs crash node %d (secondary)", w.Now().Seconds(), stale))
			s.crash(s.n[stale], false)
			w.After(2*time.Second, func() { s.restart(s.n[stale]) })
			w.After(time.Millisecond, step)
			return
		}
		at := ""
		switch {
		case rec.State == Degraded && phase == "degraded":
			at = phase
		case rec.State == Resyncing:
			at = "resyncing"
			if pe := s.n[survivor].e; pe != nil {
				if r := pe.reps[1]; r != nil && r.resync != nil && r.resync.copied > 0 && !r.resync.done() {
					at = "copying"
				}
			}
		}
		if at != phase {
			w.After(time.Millisecond, step)
			return
		}
		*crashed = true
		*log = append(*log, fmt.Sprintf("%.3fs crash node %d (the survivor) while %s", w.Now().Seconds(), survivor, phase))
		s.crash(s.n[survivor], false)
		w.After(time.Second, func() { s.restart(s.n[survivor]) })
	}
	step()
}

// TestCopyRateBoundsMove: a move (every block copied) of a 2 MiB RLDev
// takes at least 2 s at copy_rate 1 MiB/s, and well under it unbounded.
func TestCopyRateBoundsMove(t *testing.T) {
	took := func(rate int64) time.Duration {
		h := newHarness(t, 3, testDisk, func(h *harness) { h.copyRate = rate })
		r := h.create(512)
		h.mustWrite(r.Segs[0].Node, r.ID, 0, pattern(3, 512))
		h.rmStartMove(r.ID, 1, 3)
		start := h.now
		if !h.rvTickUntil(30*time.Second, func() bool { return h.rec(r.ID).Move == nil && h.rec(r.ID).Segs[1].Node == 3 }) {
			t.Fatalf("rate %d: the move did not end: %+v", rate, h.rec(r.ID))
		}
		d := h.now.Sub(start)
		h.tick(time.Second)
		h.mustRead(3, r.ID, 0, pattern(3, 512))
		return d
	}
	free, bounded := took(0), took(1<<20)
	t.Logf("a 2 MiB move took %v unbounded, %v at 1 MiB/s", free, bounded)
	if bounded < 2*time.Second || free >= time.Second {
		t.Fatalf("copy_rate not applied: %v unbounded, %v at 1 MiB/s", free, bounded)
	}
}

// TestMoveTargetCrashAtSwitchKeepsItsCopy: a move's target that crashes
// once the switch is under way (its whole copy received and durable)
// restarts to find the table naming its past incarnation in the
// segment's place. Its copy is whole (Super.TargetInc): it must not count
// as lost, which costs a full copy and, should its peer fail meanwhile,
// leaves the RLDev nothing to serve (simulator seed 2000316 of the
// default stream, whose other copy's disk was lost next). Before the
// mark, the new incarnation found the segment incomplete every time.
func TestMoveTargetCrashAtSwitchKeepsItsCopy(t *testing.T) {
	if testing.Short() {
		t.Skip("single-threaded simulations: the full suite runs them; the race pass would spend minutes on them")
	}
	kept := 0
	for i := 0; i < 6; i++ {
		seed := int64(3100 + i)
		var log []string
		crashed := false
		s := runRSim(t, seed, simOpts{quiet: true, script: func(s *rsim) {
			moveAndCrash(s, "node", []string{"primary", "secondary"}[i%2], "switching", "target", &crashed, &log)
		}})
		if len(s.o.fails) > 0 {
			reportRSim(t, "TestMoveTargetCrashAtSwitchKeepsItsCopy", seed, s)
		}
		if !crashed {
			t.Fatalf("seed %d: the move never reached the switch: %s", seed, strings.Join(log, "; "))
		}
		rec := s.table().RLDevs[1]
		if rec.Segs == s.origin[1] {
			t.Logf("seed %d: the segment ends back where it was (the switch did not name the crashed target): %s", seed, strings.Join(log, "; "))
			continue
		}
		for _, line := range s.o.trace {
			if strings.Contains(line, "segment incomplete") || strings.Contains(line, "segment lost with its disk") {
				t.Fatalf("seed %d: DEFECT: the target's copy, whole and switched to, counted as lost after its node restarted: %s\n%s", seed, line, strings.Join(log, "; "))
			}
		}
		kept++
	}
	if kept == 0 {
		t.Fatalf("no seed switched to the crashed target: the test checks nothing")
	}
	t.Logf("%d of 6 seeds switched to the crashed target, whose copy was kept", kept)
}
