package node

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/fd"
	"github.com/grovestore/grove/internal/meta"
)

// membership builds a nodes namespace at version v: node id → incarnation.
func membership(t *testing.T, v uint64, incs map[uint64]uint64) *pb.Namespace {
	ns := &pb.Namespace{Version: v}
	for id := uint64(1); id <= 4; id++ {
		b, err := proto.Marshal(&pb.Node{Id: id, Incarnation: incs[id], BeaconAddr: "127.0.0.1:1"})
		if err != nil {
			t.Fatal(err)
		}
		ns.Entries = append(ns.Entries, &pb.Entry{Key: meta.NodeKey(id), Value: b})
	}
	return ns
}

// TestReview110ReplacementFirstMembershipIsRead: outside review 110. A
// replacement observer (a config-service member that lost its disk) takes
// every incarnation in the first membership it is given as registered
// before it started, whose verdict it cannot know, and never echoes it. A
// watch may be served by a replica that lags: if that stale snapshot came
// first, an incarnation registered before the start (one the lost observer
// may have condemned) was echoed. The node now feeds the detector a
// linearizable read first; a stale watch version after it changes
// nothing. Without the read, the replacement echoes (4, 2).
func TestReview110ReplacementFirstMembershipIsRead(t *testing.T) {
	cfg := fd.Config{Interval: fd.DefaultInterval, GracePeriod: fd.DefaultGracePeriod, MaxDrift: fd.DefaultMaxDrift, Observers: []fd.NodeID{1, 2, 3}}
	key := fd.Key("0123456789abcdef0123456789abcdef")
	now := time.Unix(1_000_000, 0)
	e, err := fd.NewEngine(fd.EngineConfig{Config: cfg, Self: 3, Observe: true, Keys: fd.Keyring{Sign: key}, Replacement: true}, now, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The truth when the replacement starts: node 4 runs incarnation 2
	// (version 2). The watch's first event comes from a replica at
	// version 1.
	current := membership(t, 2, map[uint64]uint64{1: 1, 2: 1, 3: 1, 4: 2})
	var reads int
	read := func(ctx context.Context, name string) (*pb.Namespace, error) {
		if name != meta.NodesNamespace {
			t.Fatalf("read of %q", name)
		}
		if reads++; reads == 1 {
			return nil, errors.New("no leader yet") // tried again
		}
		return current, nil
	}
	var after uint64
	watch := func(ctx context.Context, name string, a uint64) <-chan *pb.Namespace {
		after = a
		ch := make(chan *pb.Namespace, 1)
		ch <- membership(t, 1, map[uint64]uint64{1: 1, 2: 1, 3: 1, 4: 1}) // a lagging replica
		close(ch)
		return ch
	}
	var versions []uint64
	set := func(v uint64, regs map[fd.NodeID]fd.Registration) {
		versions = append(versions, v)
		incs := map[fd.NodeID]fd.Incarnation{}
		for n, r := range regs {
			incs[n] = r.Incarnation
		}
		e.SetRegistered(now, v, incs)
	}
	feedMembership(context.Background(), read, watch, set, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if len(versions) == 0 || versions[0] != 2 || after != 2 || reads != 2 {
		t.Fatalf("versions given to the detector %v (watch after %d, %d reads): the first must be the linearizable read's, 2", versions, after, reads)
	}
	now = now.Add(10 * time.Millisecond)
	out, err := e.Receive(now, 4, fd.Packet{Kind: fd.KindBeacon, Subject: 4, Incarnation: 2, Seq: 1}.Seal(nil, key))
	if !errors.Is(err, fd.ErrPreexisting) || len(out) > 0 {
		t.Fatalf("a beacon of (4, 2), registered before the replacement started: %v, %d effects; want ErrPreexisting and no echo", err, len(out))
	}
	// Incarnation 3, registered after the start, is echoed.
	e.SetRegistered(now, 3, map[fd.NodeID]fd.Incarnation{1: 1, 2: 1, 3: 1, 4: 3})
	out, err = e.Receive(now, 4, fd.Packet{Kind: fd.KindBeacon, Subject: 4, Incarnation: 3, Seq: 1}.Seal(nil, key))
	if err != nil || len(out) == 0 {
		t.Fatalf("a beacon of (4, 3), registered after the start: %v, %d effects; want an echo", err, len(out))
	}
}
