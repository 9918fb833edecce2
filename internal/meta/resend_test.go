package meta

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/grovestore/grove/api/grovepb"
)

func withID(d *pb.Decree, id string) *pb.Decree {
	d.Id = []byte(id)
	return d
}

// A resent decree (the same id) that finds the namespace moved past its
// expected version by its own earlier copy is answered with the version
// that copy made, and changes nothing; any other decree conditioned on a
// past version is still stale. The ids survive a snapshot, and are
// forgotten after RecentDecreeIDs more decrees.
func TestResentDecreeIsIdempotent(t *testing.T) {
	f := NewFSM(slog.New(slog.NewTextHandler(io.Discard, nil)))
	idx := uint64(0)
	apply := func(d *pb.Decree) ApplyResult { idx++; return applyDecree(t, f, idx, d) }

	if r := apply(withID(put("ns", 0, "k", "first"), "A")); r.Err != nil || r.Version != 1 || r.Duplicate {
		t.Fatalf("first decree: %+v", r)
	}
	if r := apply(withID(put("ns", 1, "k", "second"), "B")); r.Err != nil || r.Version != 2 {
		t.Fatalf("second decree: %+v", r)
	}
	// A's resend, after B: answered as applied at version 1.
	if r := apply(withID(put("ns", 0, "k", "first"), "A")); r.Err != nil || r.Version != 1 || !r.Duplicate {
		t.Fatalf("resend of A: %+v, want version 1, duplicate", r)
	}
	ns, _ := f.Namespace("ns")
	if ns.Version != 2 || value(ns, "k") != "second" {
		t.Fatalf("a resend changed the namespace: version %d, k=%q", ns.Version, value(ns, "k"))
	}
	// Another proposer's decree at version 0, and one without an id: stale.
	for _, d := range []*pb.Decree{withID(put("ns", 0, "k", "x"), "C"), put("ns", 0, "k", "first"), withID(put("ns", 1, "k", "x"), "A")} {
		if r := apply(d); !errors.Is(r.Err, ErrStaleVersion) || r.Version != 2 {
			t.Fatalf("decree %q at %d: %+v, want stale at 2", d.Id, d.ExpectedVersion, r)
		}
	}
	// The same id in another namespace means nothing there.
	if r := apply(withID(put("other", 0, "k", "v"), "A")); r.Err != nil || r.Duplicate {
		t.Fatalf("other namespace: %+v", r)
	}

	// Through a snapshot.
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	sink := &memSink{}
	if err := snap.Persist(sink); err != nil {
		t.Fatal(err)
	}
	g := NewFSM(slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := g.Restore(io.NopCloser(bytes.NewReader(sink.Bytes()))); err != nil {
		t.Fatal(err)
	}
	if r := applyDecree(t, g, idx+1, withID(put("ns", 1, "k", "second"), "B")); r.Err != nil || r.Version != 2 || !r.Duplicate {
		t.Fatalf("resend of B on a restored replica: %+v", r)
	}

	// B stays recognised while at most RecentDecreeIDs decrees (B
	// included) followed version 1, and is forgotten after: stale again.
	for i := 0; i < RecentDecreeIDs-1; i++ {
		v := uint64(2 + i)
		if r := apply(withID(put("ns", v, "k", "n"), fmt.Sprintf("n%d", i))); r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	if r := apply(withID(put("ns", 1, "k", "second"), "B")); r.Err != nil || !r.Duplicate || r.Version != 2 {
		t.Fatalf("resend of B, %d decrees back: %+v, want duplicate at 2", RecentDecreeIDs, r)
	}
	if r := apply(withID(put("ns", uint64(RecentDecreeIDs+1), "k", "n"), "last")); r.Err != nil {
		t.Fatal(r.Err)
	}
	if r := apply(withID(put("ns", 1, "k", "second"), "B")); !errors.Is(r.Err, ErrStaleVersion) {
		t.Fatalf("resend of B, %d decrees back: %+v, want stale", RecentDecreeIDs+1, r)
	}

	// A snapshot of a build without ids (no recent decrees) restores, its
	// namespaces with no ids: resends are stale there, as before.
	old, err := proto.Marshal(&pb.ConfigSnapshot{Namespaces: []*pb.Namespace{{Name: "ns", Version: 3, Entries: []*pb.Entry{{Key: "k", Value: []byte("v")}}}}})
	if err != nil {
		t.Fatal(err)
	}
	h := NewFSM(slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := h.Restore(io.NopCloser(bytes.NewReader(old))); err != nil {
		t.Fatalf("an old snapshot: %v", err)
	}
	if r := applyDecree(t, h, 1, withID(put("ns", 2, "k", "x"), "B")); !errors.Is(r.Err, ErrStaleVersion) {
		t.Fatalf("a resend on a replica restored from an old snapshot: %+v", r)
	}
	// A snapshot whose ids do not end at its namespace's version is refused.
	bad, _ := proto.Marshal(&pb.ConfigSnapshot{Namespaces: []*pb.Namespace{{Name: "ns", Version: 3}},
		Recent: []*pb.RecentDecrees{{Namespace: "ns", Version: 2, Ids: [][]byte{[]byte("x")}}}})
	if err := NewFSM(slog.New(slog.NewTextHandler(io.Discard, nil))).Restore(io.NopCloser(bytes.NewReader(bad))); err == nil {
		t.Fatal("a snapshot with mismatched ids restored")
	}

	// A log entry with an oversized id (a build without ids let it in)
	// applies, its id ignored, as that build applied it.
	if r := applyDecree(t, h, 2, withID(put("ns", 3, "k", "y"), strings.Repeat("i", MaxDecreeIDLen+1))); r.Err != nil || r.Version != 4 {
		t.Fatalf("an entry with an oversized id: %+v", r)
	}

	// An oversized id is a bad decree.
	if err := ValidateDecree(withID(put("ns", 0, "k", "v"), strings.Repeat("i", MaxDecreeIDLen+1))); !errors.Is(err, ErrBadDecree) {
		t.Fatalf("oversized id: %v", err)
	}
}

type memSink struct{ bytes.Buffer }

func (s *memSink) ID() string    { return "mem" }
func (s *memSink) Cancel() error { return nil }
func (s *memSink) Close() error  { return nil }

// The client's resend after a lost answer: the leader commits the decree
// but its answer never arrives (an interceptor turns it into Unavailable),
// so the client sends it again. The resend is answered as applied, so
// Update's builder runs once and the namespace moves by one version. Before
// decree ids the resend met "stale", and Update ran the builder again on a
// namespace its own decree had changed (btree.CreateTree then took its own
// entry for a clash and freed the chunks the directory named).
func TestClientResendAfterLostAnswer(t *testing.T) {
	var lose atomic.Int32
	lose.Store(1)
	var lost atomic.Int32
	drop := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		if r, ok := resp.(*pb.ProposeResponse); ok && err == nil && !r.NotLeader && !r.Stale && lose.Add(-1) >= 0 {
			lost.Add(1)
			return nil, status.Error(codes.Unavailable, "test: the answer is lost")
		}
		return resp, err
	}
	_, members := grpcGroup(t, 3, grpc.ChainUnaryInterceptor(drop))
	c := NewClient(members)
	defer c.Close()

	builds := 0
	v, err := c.Update(ctx(t), "dir", "test", func(ns *pb.Namespace) ([]*pb.Op, error) {
		builds++
		if value(ns, "tree") != "" {
			return nil, errors.New("the name is taken") // what a builder says on meeting its own entry
		}
		return []*pb.Op{{Kind: pb.Op_KIND_PUT, Key: "tree", Value: []byte("mine")}}, nil
	})
	if lost.Load() != 1 {
		t.Fatalf("%d answers lost, want 1 (the test's fault did not fire)", lost.Load())
	}
	if err != nil || builds != 1 || v != 1 {
		t.Fatalf("Update after a lost answer: version %d, err %v, builder ran %d times; want version 1, nil, once", v, err, builds)
	}
	ns, err := c.Read(ctx(t), "dir")
	if err != nil || ns.Version != 1 || value(ns, "tree") != "mine" {
		t.Fatalf("namespace after: %v, %v", ns, err)
	}
}

// TestChangeMembersAfterLostAnswer: a membership change whose answer is
// lost is asked again; the leader then refuses it as already made ("not
// in the configuration"). The client takes that for done, having checked
// the configuration, instead of reporting the change refused (what it did
// before: `grove member remove` failed although the member was removed).
func TestChangeMembersAfterLostAnswer(t *testing.T) {
	var lose, lost atomic.Int32
	lose.Store(1)
	drop := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		if r, ok := resp.(*pb.ChangeMembersResponse); ok && err == nil && !r.NotLeader && lose.Add(-1) >= 0 {
			lost.Add(1)
			return nil, status.Error(codes.Unavailable, "test: the answer is lost")
		}
		return resp, err
	}
	g, members := grpcGroup(t, 3, grpc.ChainUnaryInterceptor(drop))
	c := NewClient(members)
	defer c.Close()
	victim := g.members[(g.leader()+1)%3].ID
	idx, err := c.ChangeMembers(ctx(t), false, victim, "")
	if lost.Load() != 1 {
		t.Fatalf("%d answers lost, want 1 (the test's fault did not fire)", lost.Load())
	}
	if err != nil || idx == 0 {
		t.Fatalf("a removal whose answer was lost: index %d, %v; want done", idx, err)
	}
	mr, err := c.Members(ctx(t))
	if err != nil || hasMember(mr, victim) || len(mr.Members) != 2 {
		t.Fatalf("members after: %v %v", mr, err)
	}
	// A removal of a member that is not there, asked once, is still refused.
	if _, err := c.ChangeMembers(ctx(t), false, victim, ""); !errors.Is(err, ErrMembership) {
		t.Fatalf("removing a member that is not in the configuration: %v, want ErrMembership", err)
	}
}
