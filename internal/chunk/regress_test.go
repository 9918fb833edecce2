package chunk

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// From an outside review (failed before its fix, seed 1): the runtime's
// transport may deliver a peer message twice, seconds late. Every
// AckNotReady is delivered a second time, 0.2-1.5 s late: a stale one
// arriving after the secondary joined made the primary stop waiting for
// it, and the secondary served an old map. Acks now echo the token of the
// message they answer; the primary takes only those of its lease. (The
// simulation itself now duplicates peer messages of every kind, late.)
func TestRegressLateNotReady(t *testing.T) {
	bad := 0
	for seed := int64(1); seed <= shortSweep(40) && bad == 0; seed++ {
		s := newCSim(t, seed, simOpts{})
		w := s.w
		late := 0
		s.net.Tap = func(from, to uint64, payload any) {
			pm, ok := payload.(peerMsg)
			if !ok {
				return
			}
			a, ok := pm.msg.(Ack)
			if !ok || a.Code != AckNotReady {
				return
			}
			dst := s.nodes[to]
			if dst == nil {
				return
			}
			late++
			w.After(w.Between(200*time.Millisecond, 1500*time.Millisecond), func() {
				dst.p.Go(0, func() {
					if dst.mg != nil && !dst.isolated {
						s.logf("review: late duplicate AckNotReady (inc %d) from node %d delivered to node %d", a.Inc, from, to)
						s.exec(dst, dst.mg, dst.mg.Deliver(s.env(dst), from, a))
					}
				})
			})
		}
		for _, n := range s.sortedNodes() {
			w.At(w.Between(0, 500*time.Millisecond), func() { s.start(n) })
		}
		s.faults = true
		s.rl.faulty = w.Rand.Intn(2) == 0
		s.rl.lateOdds = []int{300, 40}[w.Rand.Intn(2)]
		for at := 2 * time.Second; at < simSafety; at += w.Between(500*time.Millisecond, 2500*time.Millisecond) {
			w.At(at, s.fault)
		}
		w.At(simSafety, s.heal)
		w.RunUntil(simLiveness)
		s.finalChecks()
		if len(s.o.fails) > 0 {
			bad++
			var tail []string
			for _, l := range s.trace {
				if strings.Contains(l, "review:") || strings.Contains(l, "granted") || strings.Contains(l, "VIOLATION") && len(tail) < 20 || strings.Contains(l, "serves nothing") || strings.Contains(l, "serving as secondary") || strings.Contains(l, "revoked") {
					tail = append(tail, l)
				}
			}
			t.Logf("seed %d: %d late duplicates; %d violations:\n%s\nrelevant trace:\n%s", seed, late, len(s.o.fails),
				strings.Join(s.o.fails[:min(6, len(s.o.fails))], "\n"), strings.Join(tail[:min(len(tail), 30)], "\n"))
		}
	}
	if bad > 0 {
		t.Errorf("a late AckNotReady (which the runtime's transport allows) breaks the pair")
	}
}

// From an outside review (failed before its fix): an error that says an
// allocation or free may have taken effect lost that on the wire, behind
// "not serving" (resultOf took the first code that matched).
func TestRegressMaybeDoneOnWire(t *testing.T) {
	err := fmt.Errorf("%w (%w)", fmt.Errorf("%w: node 1: the node fenced itself", ErrNotServing), ErrMaybeDone)
	code, text := resultOf(err)
	got := ResultError(code, text)
	if !errors.Is(got, ErrMaybeDone) {
		t.Errorf("sent %q as %v; the clerk sees %v, not ErrMaybeDone", err, code, got)
	}
}
