package meta

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/grovestore/grove/api/grovepb"
)

// TestReview113ReadTermChange stalls Server.Read (testStall) between the
// barrier check (term T == barrierTerm) and VerifyLeader, during which the replica loses the lead and wins it again
// in term T+2. VerifyLeader then confirms the lead of T+2, not of T; the
// read index ci recorded in T does not cover a decree W committed (and
// acknowledged) in T+1 before the read began, and the FSM has not applied
// W yet (held up, as in review 112's test). The read answered without W;
// it now takes its term before its index and fails if the term moved.
// Replica 1 has a long leader lease, so that it still believes it leads
// after the others elected a new leader (what VerifyLeader is for).
func TestReview113ReadTermChange(t *testing.T) {
	w := newGateWriter()
	g := newLoggedGroup(t, w, true)
	unblock := w.unblock
	g.mustPropose(put("n", 0, "a", "0"))
	const L = 0
	s := g.servers[L]
	if cur := g.leader(); cur != L {
		if err := g.servers[cur].raft.LeadershipTransferToServer(serverID(g.members[L].ID), raft.ServerAddress(g.members[L].RaftAddr)).Error(); err != nil {
			t.Skip(err)
		}
	}
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := s.Read(c, "n"); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Skip("replica 1 did not lead: ", err)
		}
	}
	T := s.raft.CurrentTerm()

	// Replica 1 is cut off; the others elect a leader N in T+1, which
	// commits W (version 2), after an entry that does not decode.
	g.isolate(L)
	N := g.leader(1, 2)
	g.servers[N].raft.Apply([]byte{0xff, 0xff, 0xff}, time.Second)
	if v, err := g.servers[N].Propose(c, put("n", 1, "a", "W")); err != nil || v != 2 {
		t.Skipf("W not committed: %v %v", v, err)
	}
	wIndex := g.servers[N].raft.LastIndex()

	// W has completed. Now a Read begins on replica 1, which still
	// believes it leads in T: it takes its read index and stalls before
	// confirming its lead (Server.testStall).
	if s.raft.State() != raft.Leader {
		t.Skip("replica 1 stepped down already")
	}
	if s.barrierTerm.Load() != T {
		t.Skipf("barrier term %d, T %d", s.barrierTerm.Load(), T)
	}
	stalled, resume := make(chan struct{}), make(chan struct{})
	var stallOnce sync.Once
	s.testStall = func(p string) {
		if p == "read" {
			stallOnce.Do(func() { close(stalled); <-resume })
		}
	}
	type res struct {
		ns  *pb.Namespace
		err error
	}
	read := make(chan res, 1)
	go func() { ns, err := s.Read(c, "n"); read <- res{ns, err} }()
	<-stalled
	// ... the goroutine stalls here. Replica 1 hears of T+1, takes W
	// (its FSM held up on the entry before it), and is elected in T+2.
	w.mu.Lock()
	w.block = fmt.Sprintf("replica=%d", g.members[L].ID)
	w.mu.Unlock()
	g.heal()
	select {
	case <-w.blocked:
	case <-time.After(5 * time.Second):
		t.Fatal("replica 1's FSM did not reach the bad entry")
	}
	for deadline := time.Now().Add(5 * time.Second); s.raft.LastIndex() < wIndex; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("replica 1 did not get W")
		}
	}
	if err := g.servers[N].raft.LeadershipTransferToServer(serverID(g.members[L].ID), raft.ServerAddress(g.members[L].RaftAddr)).Error(); err != nil {
		t.Skip("transfer back: ", err)
	}
	for deadline := time.Now().Add(5 * time.Second); !s.IsLeader(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("replica 1 not leader again")
		}
	}
	// ... and the goroutine resumes: the rest of Read.
	close(resume)
	var r res
	select {
	case r = <-read:
	case <-time.After(500 * time.Millisecond):
		unblock()
		r = <-read
	}
	a := ""
	if r.ns != nil {
		a = value(r.ns, "a")
	}
	t.Logf("read began in term %d; W at index %d committed in term %d before it; resumed in term %d: version %d a=%q, err %v",
		T, wIndex, g.servers[N].raft.CurrentTerm(), s.raft.CurrentTerm(), r.ns.GetVersion(), a, r.err)
	if r.err == nil && r.ns.GetVersion() < 2 {
		t.Errorf("Read answered version %d after W (version 2) had completed before it began: its lead was confirmed in term %d, not the read's term %d",
			r.ns.GetVersion(), s.raft.CurrentTerm(), T)
	}
	// Without the stall, Read in T+2 does its term's Barrier and is right.
	done := make(chan *pb.Namespace, 1)
	go func() { ns, _ := s.Read(c, "n"); done <- ns }()
	time.Sleep(100 * time.Millisecond)
	unblock()
	if ns := <-done; ns.GetVersion() != 2 {
		t.Errorf("a Read without the stall: version %d", ns.GetVersion())
	}
}

// fakeCS answers as grpcService does on a new leader whose log holds the
// add of member 4, appended by the previous leader, not yet committed: the
// first ChangeMembers lost its answer (the previous leader lost the lead:
// Unavailable), the second is refused as already done (AddMember checks
// the latest configuration), a confirmed Members is Unavailable until the
// entry commits (server.go, configCommitted), then lists 4. The client
// used to take the Unavailable for the refusal; it now asks again.
type fakeCS struct {
	pb.UnimplementedConfigServiceServer
	changes, confirmed atomic.Int32
}

func (f *fakeCS) ChangeMembers(context.Context, *pb.ChangeMembersRequest) (*pb.ChangeMembersResponse, error) {
	if f.changes.Add(1) == 1 {
		return nil, status.Error(codes.Unavailable, "meta: leadership lost during the membership change (it may have committed): leadership lost while committing log")
	}
	return nil, status.Error(codes.FailedPrecondition, "meta: membership change refused: member 4 is already in the configuration (remove it first if it lost its state)")
}

func (f *fakeCS) Members(_ context.Context, req *pb.MembersRequest) (*pb.MembersResponse, error) {
	ms := []*pb.Member{{Id: 1, Voter: true}, {Id: 2, Voter: true}, {Id: 3, Voter: true}, {Id: 4, Voter: true}}
	if !req.Confirmed {
		return &pb.MembersResponse{LeaderId: 1, Members: ms, RaftState: "leader"}, nil
	}
	if f.confirmed.Add(1) == 1 {
		return nil, status.Error(codes.Unavailable, "meta: a membership change is being committed; ask again")
	}
	return &pb.MembersResponse{LeaderId: 1, Members: ms, RaftState: "leader", Confirmed: true, CommitIndex: 10}, nil
}

// TestReview113ChangeMembersLostAnswerWhileCommitting: `grove member add
// 4` whose first answer was lost gets a refusal ("already in the
// configuration, remove it first if it lost its state") although its own
// add is committing, because the confirmed answer it asks for is
// Unavailable for that short time and any error is taken for a refusal.
func TestReview113ChangeMembersLostAnswerWhileCommitting(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	f := &fakeCS{}
	pb.RegisterConfigServiceServer(gs, f)
	go gs.Serve(l)
	defer gs.Stop()
	c := NewClient([]Member{{ID: 1, GRPCAddr: l.Addr().String()}})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	idx, err := c.ChangeMembers(ctx, true, 4, "inmem-4")
	t.Logf("ChangeMembers: index %d, err %v (ChangeMembers calls %d, confirmed Members calls %d)", idx, err, f.changes.Load(), f.confirmed.Load())
	if errors.Is(err, ErrMembership) {
		t.Errorf("the add, committing, was reported refused: %v", err)
	}
}

// TestReview113ConfirmedMembersStaleConfiguration: the review replayed
// grpcService.Members(confirmed) with a stall between GetConfiguration
// (then read first) and the leader checks: the configuration read in
// term T held a removal of member 3 that never committed, and the answer,
// given in T+2, was "confirmed" and left member 3 out. The configuration
// is now read after the checks, and checked again (no configuration entry
// past the commit index, the same term): here the stall (testStall) is
// between the checks and the read, while a removal that will never commit
// is appended; the answer must not be a confirmed one without member 3.
func TestReview113ConfirmedMembersStaleConfiguration(t *testing.T) {
	g := newLoggedGroup(t, io.Discard, true)
	g.mustPropose(put("n", 0, "a", "0"))
	const L, V = 0, 2
	s := g.servers[L]
	if cur := g.leader(); cur != L {
		if err := g.servers[cur].raft.LeadershipTransferToServer(serverID(g.members[L].ID), raft.ServerAddress(g.members[L].RaftAddr)).Error(); err != nil {
			t.Skip(err)
		}
	}
	for deadline := time.Now().Add(5 * time.Second); !s.IsLeader(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Skip("replica 1 not leader")
		}
	}
	if _, err := s.Read(context.Background(), "n"); err != nil { // its term's first commit: the configuration is stable
		t.Skip(err)
	}
	// Members(confirmed) begins, confirms the lead and finds the
	// configuration committed, and stalls before reading it; meanwhile
	// replica 1 is cut off and a removal of member 3 is appended there,
	// never to commit.
	stalled, resume := make(chan struct{}), make(chan struct{})
	var stallOnce sync.Once
	s.testStall = func(p string) {
		if p == "members" {
			stallOnce.Do(func() { close(stalled); <-resume })
		}
	}
	type res struct {
		r   *pb.MembersResponse
		err error
	}
	answer := make(chan res, 1)
	go func() {
		r, err := (&grpcService{s: s}).Members(context.Background(), &pb.MembersRequest{Confirmed: true})
		answer <- res{r, err}
	}()
	<-stalled
	term := s.raft.CurrentTerm()
	g.isolate(L)
	go s.RemoveMember(g.members[V].ID) // appended, never committed
	for deadline := time.Now().Add(2 * time.Second); inConfiguration(s, g.members[V].ID); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Skip("removal not appended")
		}
	}
	close(resume)
	r := <-answer
	listed := false
	for _, m := range r.r.GetMembers() {
		listed = listed || m.Id == g.members[V].ID
	}
	t.Logf("lead confirmed in term %d; the configuration read after a removal of member %d was appended: err %v, confirmed %v, member listed %v",
		term, g.members[V].ID, r.err, r.r.GetConfirmed(), listed)
	if r.err == nil && r.r.GetConfirmed() && !listed {
		t.Errorf("a confirmed answer leaves out member %d, whose removal never committed", g.members[V].ID)
	}
}

// dropEntries is an in-memory transport whose AppendEntries carrying
// entries fail while drop is set; heartbeats (no entries) pass. (A
// follower's disk or link that lets heartbeats through but not the log.)
type dropEntries struct {
	*raft.InmemTransport
	drop atomic.Bool
}

func (d *dropEntries) AppendEntries(id raft.ServerID, target raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	if d.drop.Load() && len(args.Entries) > 0 {
		return errors.New("dropped")
	}
	return d.InmemTransport.AppendEntries(id, target, args, resp)
}

func (d *dropEntries) AppendEntriesPipeline(raft.ServerID, raft.ServerAddress) (raft.AppendPipeline, error) {
	return nil, raft.ErrPipelineReplicationNotSupported
}

// TestReview113ConfirmedUncommittedRemoval: hashicorp/raft v1.7.3's
// GetConfiguration never sets the index (api.go: configurations{latest:
// ...} only), so Members' "f.Index() > CommitIndex" (review 112's fix)
// never held: a verified leader answered confirmed with a removal it
// appended and had not committed; the leader then failed, and the
// survivor's configuration still listed the member "confirmed" out. The
// log past the commit index is now read for configuration entries
// (configCommitted).
func TestReview113ConfirmedUncommittedRemoval(t *testing.T) {
	g := &group{t: t}
	for i := 1; i <= 3; i++ {
		g.dirs = append(g.dirs, t.TempDir())
		g.members = append(g.members, Member{ID: uint64(i), RaftAddr: fmt.Sprintf("inmem-%d", i)})
	}
	g.servers = make([]*Server, 3)
	g.trans = make([]*raft.InmemTransport, 3)
	var dl *dropEntries
	for i := range g.members {
		_, tr := raft.NewInmemTransport(raft.ServerAddress(g.members[i].RaftAddr))
		g.trans[i] = tr
		for j := 0; j < i; j++ {
			g.heal2(i, j)
		}
		var rt raft.Transport = tr
		if i == 0 {
			dl = &dropEntries{InmemTransport: tr}
			rt = dl
		}
		s, err := Open(Config{Bootstrap: true, ID: g.members[i].ID, Dir: g.dirs[i], Members: g.members, Timing: fastTiming, Transport: rt,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), RaftLog: io.Discard})
		if err != nil {
			t.Fatal(err)
		}
		g.servers[i] = s
	}
	t.Cleanup(func() {
		for _, s := range g.servers {
			if s != nil {
				s.Close()
			}
		}
	})
	g.mustPropose(put("n", 0, "a", "0"))
	const L, F, V = 0, 1, 2
	s := g.servers[L]
	if cur := g.leader(); cur != L {
		if err := g.servers[cur].raft.LeadershipTransferToServer(serverID(g.members[L].ID), raft.ServerAddress(g.members[L].RaftAddr)).Error(); err != nil {
			t.Skip(err)
		}
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, err := s.Read(context.Background(), "n"); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Skip("replica 1 not leader: ", err)
		}
	}
	t.Logf("leader %d: GetConfiguration().Index() = %d, commit index %d", g.members[L].ID, s.raft.GetConfiguration().Index(), s.raft.CommitIndex())
	dl.drop.Store(true)
	go s.RemoveMember(g.members[V].ID)
	for deadline := time.Now().Add(2 * time.Second); inConfiguration(s, g.members[V].ID); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Skip("removal not appended")
		}
	}
	c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := (&grpcService{s: s}).Members(c, &pb.MembersRequest{Confirmed: true})
	listed := false
	for _, m := range r.GetMembers() {
		listed = listed || m.Id == g.members[V].ID
	}
	t.Logf("confirmed Members on the leader: err %v, confirmed %v, %d members, member %d listed %v; removal at index %d, commit index %d, GetConfiguration().Index() = %d",
		err, r.GetConfirmed(), len(r.GetMembers()), g.members[V].ID, listed, s.raft.LastIndex(), s.raft.CommitIndex(), s.raft.GetConfiguration().Index())
	// The leader fails before the removal reaches F.
	g.stop(L)
	t.Logf("after the leader failed: member %d in F's configuration: %v", g.members[V].ID, inConfiguration(g.servers[F], g.members[V].ID))
	if err == nil && r.GetConfirmed() && !listed && inConfiguration(g.servers[F], g.members[V].ID) {
		t.Errorf("a confirmed answer left out member %d; its removal was never committed", g.members[V].ID)
	}
}
