package meta

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	pb "github.com/grovestore/grove/api/grovepb"
)

// TestReview112UncommittedRemovalFoolsConfirmNotVoter: a member that lost
// its disk is removed (`grove member remove`) on a leader that cannot
// commit the removal (the other follower is cut off from it). The deposed
// leader's plain Members answer already leaves the member out
// (GetConfiguration is the latest entry, committed or not), which was all
// node.confirmNotVoter asked of any one member: the member started empty,
// voted for the cut-off follower (which still lists it), and a decree
// that had committed on {leader, lost member} was gone. It now asks for a
// confirmed answer (the leader's, verified, its configuration
// committed), which neither member can give here: the member does not
// start. If one did, the rest of the test shows the decree lost.
func TestReview112UncommittedRemovalFoolsConfirmNotVoter(t *testing.T) {
	g := newGroup(t, 3)
	g.mustPropose(put("n", 0, "a", "1"))
	L := g.leader()
	F, V := (L+1)%3, (L+2)%3
	// Let F have the first decree, then cut it off.
	for deadline := time.Now().Add(5 * time.Second); g.servers[F].FSM().Version("n") < 1; {
		if time.Now().After(deadline) {
			t.Fatal("F did not apply the first decree")
		}
		time.Sleep(10 * time.Millisecond)
	}
	g.isolate(F)
	g.heal2(L, V)
	c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if !g.servers[L].IsLeader() {
		t.Skip("leadership moved; rerun")
	}
	v, err := g.servers[L].Propose(c, put("n", 1, "b", "committed-on-L-and-V"))
	if err != nil || v != 2 {
		t.Skipf("decree D not committed on {L,V}: %v %v", v, err)
	}
	t.Logf("decree D committed at version %d by L=%d with V=%d; F=%d (cut off) has version %d", v, g.members[L].ID, g.members[V].ID, g.members[F].ID, g.servers[F].FSM().Version("n"))

	// V loses its disk.
	g.stop(V)
	g.dirs[V] = t.TempDir()
	// The operator removes V first, as the README says.
	done := make(chan error, 1)
	go func() { _, err := g.servers[L].RemoveMember(g.members[V].ID); done <- err }()
	time.Sleep(50 * time.Millisecond)
	// What confirmNotVoter asks (a confirmed answer) of L and of F, while
	// the removal is in progress and after it failed: no member may give
	// a confirmed answer that leaves V out. (Before the fix it asked for
	// the plain answer, and L's left V out.)
	omits := func(i int) bool {
		r, err := (&grpcService{s: g.servers[i]}).Members(c, &pb.MembersRequest{Confirmed: true})
		if err != nil || r.NotLeader || !r.Confirmed {
			t.Logf("member %d: no confirmed answer (%v, not leader %v)", g.members[i].ID, err, r.GetNotLeader())
			return false
		}
		for _, m := range r.Members {
			if m.Id == g.members[V].ID {
				return false
			}
		}
		return true
	}
	listed := !omits(L) && !omits(F)
	r, _ := (&grpcService{s: g.servers[L]}).Members(c, &pb.MembersRequest{})
	t.Logf("plain Members on L (state %s): %d members", r.RaftState, len(r.Members))
	err = <-done
	t.Logf("RemoveMember on L returned: %v", err)
	listed = listed && !omits(L) && !omits(F)
	if listed {
		return // confirmNotVoter refuses: V does not start
	}
	// confirmNotVoter passes: V starts empty. L is cut off from F (the
	// partition that kept the removal from committing) and from V.
	g.startWith(V, false)
	g.isolate(L)
	g.heal2(F, V)
	if got := g.leader(F, V); got != F {
		t.Fatalf("leader %d", got)
	}
	var ns *pb.Namespace
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if ns, err = g.servers[F].Read(c, "n"); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("after V rejoined empty: F=%d leads with V's vote; Read(n) = version %d, b=%q", g.members[F].ID, ns.Version, value(ns, "b"))
	if ns.Version < 2 || value(ns, "b") == "" {
		t.Errorf("a committed decree (version 2, acknowledged to its proposer) is lost")
	}
}

// heal2 connects replicas i and j both ways.
func (g *group) heal2(i, j int) {
	g.trans[i].Connect(g.trans[j].LocalAddr(), g.trans[j])
	g.trans[j].Connect(g.trans[i].LocalAddr(), g.trans[i])
}

// gateWriter blocks the log lines of one replica that contain "rejected
// decree" until released (a slow log sink: a full stderr pipe, journald
// throttling).
type gateWriter struct {
	mu      sync.Mutex
	block   string // "replica=N"
	release chan struct{}
	blocked chan struct{}
	once    sync.Once
}

// newGateWriter returns a gate open until its block is set
// (newLoggedGroup opens it for good before the servers close).
func newGateWriter() *gateWriter {
	return &gateWriter{release: make(chan struct{}), blocked: make(chan struct{}, 1)}
}

// unblock releases the line held up, and every later one.
func (w *gateWriter) unblock() { w.once.Do(func() { close(w.release) }) }

func (w *gateWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	b := w.block
	w.mu.Unlock()
	if b != "" && bytes.Contains(p, []byte("rejected decree")) && bytes.Contains(p, []byte(b+" ")) {
		select {
		case w.blocked <- struct{}{}:
		default:
		}
		<-w.release
	}
	return len(p), nil
}

// TestReview112ReadBehindFollower: Read on the leader answered from its
// FSM as soon as VerifyLeader succeeded (the Barrier runs once per term);
// it did not wait for the FSM to reach the commit index at which the read
// began (it now does: Server.awaitApplied). A follower applies a committed decree as soon as it learns the
// commit index. While the leader's FSM goroutine is held up (here: on its
// own log line for an undecodable entry, written to a slow sink), a
// follower (and a watch it serves) is at version v+1, and a Read that
// begins after that returns version v from the leader.
func TestReview112ReadBehindFollower(t *testing.T) {
	w := newGateWriter()
	g := newLoggedGroup(t, w, false)
	unblock := w.unblock
	g.mustPropose(put("n", 0, "a", "0"))
	L := g.leader()
	F := (L + 1) % 3
	s := g.servers[L]
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ns, err := s.Read(c, "n") // the term's Barrier, done
	if err != nil {
		t.Skip(err)
	}
	v := ns.Version
	w.mu.Lock()
	w.block = fmt.Sprintf("replica=%d", g.members[L].ID)
	w.mu.Unlock()
	// An entry that does not decode (raft.Apply directly: Server.Propose
	// validates), then a decree.
	s.raft.Apply([]byte{0xff, 0xff, 0xff}, time.Second)
	select {
	case <-w.blocked:
	case <-time.After(3 * time.Second):
		t.Fatal("the leader's FSM did not reach the bad entry")
	}
	propDone := make(chan error, 1)
	go func() { _, err := s.Propose(c, put("n", v, "a", "x")); propDone <- err }()
	deadline := time.Now().Add(3 * time.Second)
	for g.servers[F].FSM().Version("n") < v+1 && time.Now().Before(deadline) {
		time.Sleep(2 * time.Millisecond)
	}
	seen := g.servers[F].FSM().Version("n")
	// A watch served by the follower delivers v+1 ...
	wv, _, wfull, _ := g.servers[F].FSM().Since("n", v)
	// ... and only then does a Read begin, on the leader. It must not
	// answer before the leader's FSM has applied v+1: it waits while the
	// FSM is held up, and answers v+1 once it is released.
	type res struct {
		ns  *pb.Namespace
		err error
	}
	read := make(chan res, 1)
	go func() { ns, err := s.Read(c, "n"); read <- res{ns, err} }()
	var got res
	early := false
	select {
	case got = <-read:
		early = true
	case <-time.After(300 * time.Millisecond):
	}
	unblock()
	if !early {
		got = <-read
	}
	t.Logf("follower %d at version %d (a watch there gets version %d, full=%v); leader %d: Read = version %v, err %v (answered while the leader's FSM was held up: %v)",
		g.members[F].ID, seen, wv, wfull != nil, g.members[L].ID, got.ns.GetVersion(), got.err, early)
	t.Logf("proposal of version %d: %v", v+1, <-propDone)
	if got.err == nil && seen == v+1 && got.ns.Version < seen {
		t.Errorf("Read began after version %d was committed and delivered by a follower, and returned version %d", seen, got.ns.Version)
	}
	if seen != v+1 {
		t.Errorf("the follower did not reach version %d (%d): nothing was checked", v+1, seen)
	}
}

// newLoggedGroup starts three bootstrapped in-memory replicas whose logs
// go to out (a gateWriter can hold a replica's FSM up on its own log
// line); with slowFirst, replica 1 has a 4 s heartbeat, election timeout
// and leader lease, so that it goes on believing it leads after the
// others elected a new leader (what VerifyLeader is for). The servers
// close at the test's end (a gateWriter opened first).
func newLoggedGroup(t *testing.T, out io.Writer, slowFirst bool) *group {
	g := &group{t: t}
	for i := 1; i <= 3; i++ {
		g.dirs = append(g.dirs, t.TempDir())
		g.members = append(g.members, Member{ID: uint64(i), RaftAddr: fmt.Sprintf("inmem-%d", i)})
	}
	g.servers = make([]*Server, 3)
	g.trans = make([]*raft.InmemTransport, 3)
	for i := range g.members {
		_, tr := raft.NewInmemTransport(raft.ServerAddress(g.members[i].RaftAddr))
		g.trans[i] = tr
		for j := 0; j < i; j++ {
			g.heal2(i, j)
		}
		tm := fastTiming
		if slowFirst && i == 0 {
			tm = Timing{Heartbeat: 4 * time.Second, Election: 4 * time.Second, LeaderLease: 4 * time.Second}
		}
		s, err := Open(Config{Bootstrap: true, ID: g.members[i].ID, Dir: g.dirs[i], Members: g.members, Timing: tm, Transport: tr,
			Logger: slog.New(slog.NewTextHandler(out, nil)), RaftLog: io.Discard})
		if err != nil {
			t.Fatal(err)
		}
		g.servers[i] = s
	}
	t.Cleanup(func() {
		for _, s := range g.servers {
			s.Close()
		}
	})
	if w, ok := out.(*gateWriter); ok {
		t.Cleanup(w.unblock) // first: a replica held up on a log line could not close
	}
	return g
}
