package meta

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/transport"
)

func applyDecree(t *testing.T, f *FSM, index uint64, d *pb.Decree) ApplyResult {
	t.Helper()
	b, err := proto.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	return f.Apply(&raft.Log{Index: index, Type: raft.LogCommand, Data: b}).(ApplyResult)
}

// Since sends the whole namespace to a new watcher, then only the ops of
// newer decrees; the whole namespace again once the history no longer
// reaches back; nothing to a watcher ahead of the replica. A decree wakes
// the watchers of its own namespace only.
func TestFSMSinceDeltas(t *testing.T) {
	f := NewFSM(slog.New(slog.NewTextHandler(io.Discard, nil)))
	if v, d, full, _ := f.Since("a", 0); v != 0 || d != nil || full != nil {
		t.Fatalf("empty namespace: %d %v %v", v, d, full)
	}
	_, _, _, changedA := f.Since("a", 0)
	_, _, _, changedB := f.Since("b", 0)
	applyDecree(t, f, 1, put("b", 0, "k", "v"))
	select {
	case <-changedA:
		t.Fatal("a decree on b woke a's watchers")
	case <-changedB:
	default:
		t.Fatal("a decree on b did not wake b's watchers")
	}
	for i := uint64(0); i < 3; i++ {
		applyDecree(t, f, 2+i, put("a", i, fmt.Sprint("k", i), fmt.Sprint("v", i)))
	}
	select {
	case <-changedA:
	default:
		t.Fatal("decrees on a did not wake a's watchers")
	}
	v, d, full, _ := f.Since("a", 0)
	if v != 3 || d != nil || full == nil || len(full.Entries) != 3 {
		t.Fatalf("new watcher: %d %v %v", v, d, full)
	}
	v, d, full, _ = f.Since("a", 1)
	if v != 3 || full != nil || len(d) != 2 || d[0].Key != "k1" || d[1].Key != "k2" {
		t.Fatalf("watcher at 1: %d %v %v", v, d, full)
	}
	if v, d, full, _ = f.Since("a", 7); v != 3 || d != nil || full != nil {
		t.Fatalf("watcher ahead of the replica: %d %v %v", v, d, full)
	}
	for i := uint64(3); i < 3+HistoryDecrees; i++ {
		applyDecree(t, f, 10+i, put("a", i, "k", fmt.Sprint(i)))
	}
	if _, d, full, _ = f.Since("a", 1); full == nil || d != nil {
		t.Fatalf("watcher behind the history got no whole namespace: %v %v", d, full)
	}
	if _, d, full, _ = f.Since("a", 3); full != nil || len(d) != HistoryDecrees {
		t.Fatalf("watcher at the history's start: %d ops, full %v", len(d), full != nil)
	}
}

// grpcGroup serves each replica of g over gRPC on loopback (with the
// nodes' server options, and opts).
func grpcGroup(t *testing.T, n int, opts ...grpc.ServerOption) (*group, []Member) {
	var lis []net.Listener
	for i := 0; i < n; i++ {
		l, err := transport.Listen("127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lis = append(lis, l)
	}
	g := newGroupWith(t, n, func(i int) string { return lis[i].Addr().String() })
	for i, s := range g.servers {
		gs := grpc.NewServer(append(transport.ServerOptions(), opts...)...)
		s.RegisterGRPC(gs)
		go gs.Serve(lis[i])
		t.Cleanup(gs.Stop)
	}
	return g, g.members
}

// A watch attached to a replica that is cut off from the others leaves it
// (the replica refuses to serve a namespace that no longer moves) and
// follows the decrees the majority commits; the namespace it assembles from
// deltas equals a linearizable read.
func TestWatchLeavesIsolatedReplica(t *testing.T) {
	g, members := grpcGroup(t, 3)
	l := g.leader()
	follower := (l + 1) % 3
	// The watching client lists the follower first and is used for nothing
	// else, so its watch attaches there; c proposes.
	wc := NewClient([]Member{members[follower], members[(follower+1)%3], members[(follower+2)%3]})
	defer wc.Close()
	c := NewClient(members)
	defer c.Close()
	cx := ctx(t)
	w := wc.Watch(cx, "w", 0)
	if _, err := c.Propose(cx, put("w", 0, "a", "1")); err != nil {
		t.Fatal(err)
	}
	if ns := <-w; ns.Version != 1 || value(ns, "a") != "1" {
		t.Fatalf("first watch event: %v", ns)
	}
	g.isolate(follower)
	cut := time.Now()
	for v := uint64(1); v < 5; v++ {
		if _, err := c.Propose(cx, &pb.Decree{Namespace: "w", ExpectedVersion: v, Ops: []*pb.Op{
			{Kind: pb.Op_KIND_PUT, Key: fmt.Sprint("k", v), Value: []byte("x")},
			{Kind: pb.Op_KIND_DELETE, Key: "a"},
		}}); err != nil {
			t.Fatal(err)
		}
	}
	var got *pb.Namespace
	for got == nil || got.Version < 5 {
		select {
		case got = <-w:
		case <-cx.Done():
			t.Fatalf("the watch never left the isolated replica (last %v)", got)
		}
	}
	t.Logf("watch followed the majority %v after the cut", time.Since(cut).Round(time.Millisecond))
	if d := time.Since(cut); d > 3*time.Second {
		t.Fatalf("watch took %v to leave the isolated replica", d)
	}
	read, err := c.Read(cx, "w")
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(read, got) {
		t.Fatalf("watch assembled %v, read %v", got, read)
	}
}

// A replica directory made by an older version (a bolt raft.db) keeps its
// bolt store; a new one gets the WAL; both reopen after Close.
func TestLogStoreChoice(t *testing.T) {
	legacy := t.TempDir()
	b, err := raftboltdb.NewBoltStore(filepath.Join(legacy, boltFile))
	if err != nil {
		t.Fatal(err)
	}
	b.SetUint64([]byte("CurrentTerm"), 7)
	b.Close()
	for _, dir := range []string{legacy, t.TempDir()} {
		for i := 0; i < 2; i++ {
			s, err := openLogStore(dir, hclog.NewNullLogger())
			if err != nil {
				t.Fatal(err)
			}
			_, isBolt := s.(*raftboltdb.BoltStore)
			if isBolt != (dir == legacy) {
				t.Fatalf("%s: bolt store %v", dir, isBolt)
			}
			if dir == legacy {
				if v, _ := s.GetUint64([]byte("CurrentTerm")); v != 7 {
					t.Fatalf("legacy term %d", v)
				}
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
		}
	}
}
