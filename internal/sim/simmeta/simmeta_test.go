package simmeta

import (
	"testing"
	"time"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/sim"
)

// MaxPerSecond counts the decrees committed in the busiest second: the
// RLDev simulator's livelock check rests on it.
func TestMaxPerSecond(t *testing.T) {
	w := sim.NewWorld(1)
	s := New(w)
	p := w.NewProcess(1)
	propose := func() {
		s.Update(p, "ns", "test", func(ns *pb.Namespace) ([]*pb.Op, error) {
			return []*pb.Op{{Kind: pb.Op_KIND_PUT, Key: "k", Value: []byte{byte(ns.Version)}}}, nil
		}, func(uint64, error) {})
	}
	// 5 decrees spread over 5 s, then 30 within 300 ms, then 5 more spread.
	for i := 0; i < 5; i++ {
		w.After(time.Duration(i)*time.Second, propose)
	}
	for i := 0; i < 30; i++ {
		w.After(6*time.Second+time.Duration(i)*10*time.Millisecond, propose)
	}
	for i := 0; i < 5; i++ {
		w.After(8*time.Second+time.Duration(i)*time.Second, propose)
	}
	w.RunUntil(20 * time.Second)
	if s.Decrees != 40 {
		t.Fatalf("%d decrees committed (want 40)", s.Decrees)
	}
	if s.MaxPerSecond != 30 {
		t.Fatalf("MaxPerSecond %d (want 30: the burst)", s.MaxPerSecond)
	}
}
