package bench

import (
	"context"
	"fmt"
	"io"
	"sort"
	"time"

	pb "github.com/grovestore/grove/api/grovepb"
)

// FDTrial is one SIGKILL-and-restart of a node.
type FDTrial struct {
	Node        uint64
	ToDead      time.Duration // SIGKILL → status reports dead
	ToAlive     time.Duration // restart → a majority of observers hear a higher incarnation
	Incarnation uint64        // the incarnation it came back with
}

// FDFailover re-runs Boxwood §3.2's detection on real processes: it kills a
// node that is not the config-service leader (so that the time measured is
// the failure detector's, not a raft election's), polls `grove status`
// every 10 ms until the node is reported dead, restarts it with its printed
// command, and polls until a majority of observers acknowledge it with a
// higher incarnation.
func FDFailover(ctx context.Context, u *UpCluster, trials int, progress io.Writer) ([]FDTrial, error) {
	var out []FDTrial
	for t := 0; t < trials; t++ {
		// Every observer hears every node before each kill: a trial
		// measures one failure, not the previous trial's aftermath.
		if err := u.WaitAllHeard(ctx); err != nil {
			return out, err
		}
		leader, err := u.Leader(ctx)
		if err != nil {
			return out, err
		}
		var victim uint64
		for id := uint64(1); id <= uint64(len(u.Nodes)); id++ {
			if id != leader && (victim == 0 || (t+int(id))%2 == 0) {
				victim = id
			}
		}
		before, _, err := u.WaitNode(ctx, victim, 10*time.Millisecond, func(n *pb.NodeStatus) bool { return n.Alive })
		if err != nil {
			return out, err
		}
		if err := u.Kill(victim); err != nil {
			return out, err
		}
		_, dead, err := u.WaitNode(ctx, victim, 10*time.Millisecond, func(n *pb.NodeStatus) bool { return !n.Alive })
		if err != nil {
			return out, err
		}
		if err := u.Restart(victim); err != nil {
			return out, err
		}
		// Up means acknowledged: a majority of observers hear the new
		// incarnation (not merely "not yet declared dead").
		n, alive, err := u.WaitNode(ctx, victim, 10*time.Millisecond, func(n *pb.NodeStatus) bool {
			return n.Alive && n.Incarnation > before.Incarnation && int(n.ObserversHeard) > u.Observers/2
		})
		if err != nil {
			return out, err
		}
		tr := FDTrial{Node: victim, ToDead: dead, ToAlive: alive, Incarnation: n.Incarnation}
		out = append(out, tr)
		if progress != nil {
			fmt.Fprintf(progress, "trial %d/%d: node %d SIGKILL→dead %v, restart→alive %v (incarnation %d→%d)\n",
				t+1, trials, victim, dead.Round(time.Millisecond), alive.Round(time.Millisecond), before.Incarnation, n.Incarnation)
		}
	}
	return out, nil
}

// Median returns the median of durations.
func Median(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}
