package lock

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

	"github.com/grovestore/grove/internal/ports"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/meta"
)

// fakeDetector declares dead exactly the node incarnations the test kills.
type fakeDetector struct {
	mu   sync.Mutex
	dead map[[2]uint64]bool
}

func (d *fakeDetector) Dead(_ context.Context, subjects []Subject) ([]bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]bool, len(subjects))
	for i, x := range subjects {
		out[i] = d.dead[[2]uint64{x.Node, x.Inc}]
	}
	return out, nil
}

func (d *fakeDetector) kill(node, inc uint64) {
	d.mu.Lock()
	d.dead[[2]uint64{node, inc}] = true
	d.mu.Unlock()
}

// fakeLive is a node's self-view: incarnation inc alive unless fenced.
type fakeLive struct {
	dead atomic.Bool
	inc  atomic.Uint64
}

func (l *fakeLive) AliveAs(inc uint64) bool { return !l.dead.Load() && l.inc.Load() == inc }

func (l *fakeLive) Deadline(inc uint64) (time.Time, bool) {
	if !l.AliveAs(inc) {
		return time.Time{}, false
	}
	return time.Now().Add(time.Second), true
}

type testNode struct {
	svc  *Service
	live *fakeLive
	gs   *grpc.Server
}

// startServices runs a real config service (3 raft replicas on loopback) and
// n lock services, each on its own gRPC server.
func startServices(t *testing.T, n int, det *fakeDetector) []*testNode {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	var members []meta.Member
	var lis []net.Listener
	raftAddrs, err := ports.FreeAddrs(3) // (below the ephemeral range: no connection takes one meanwhile)
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		members = append(members, meta.Member{ID: uint64(i), GRPCAddr: l.Addr().String(), RaftAddr: raftAddrs[i-1]})
		lis = append(lis, l)
	}
	timing := meta.Timing{Heartbeat: 100 * time.Millisecond, Election: 100 * time.Millisecond, LeaderLease: 50 * time.Millisecond}
	var nodes []*testNode
	for i := 0; i < n; i++ {
		gs := grpc.NewServer()
		var l net.Listener
		if i < 3 {
			s, err := meta.Open(meta.Config{Bootstrap: true, ID: members[i].ID, Dir: t.TempDir(), Members: members, Timing: timing, Logger: quiet, RaftLog: io.Discard})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			s.RegisterGRPC(gs)
			l = lis[i]
		} else {
			l, _ = net.Listen("tcp", "127.0.0.1:0")
		}
		live := &fakeLive{}
		live.inc.Store(1)
		svc := NewService(ServiceConfig{Node: uint64(i + 1), GRPCAddr: l.Addr().String(), Candidate: i == 0 || i == 1,
			Meta: meta.NewClient(members), Detector: det, Live: live, Log: quiet, Tick: 50 * time.Millisecond})
		Register(gs, svc)
		go gs.Serve(l)
		nodes = append(nodes, &testNode{svc: svc, live: live, gs: gs})
	}
	t.Cleanup(func() {
		for _, nd := range nodes {
			nd.svc.Close()
			nd.gs.Stop()
		}
	})
	for _, nd := range nodes {
		nd.svc.Start(1)
	}
	return nodes
}

// TestServiceRecoveryAndFailover: a "wal" clerk dies holding an exclusive
// lock; recovery runs on the other "wal" clerk (blocking until the test lets
// it finish) and only then is the lock granted to a waiter. Then the master
// dies and the standby takes over with the lease intact.
func TestServiceRecoveryAndFailover(t *testing.T) {
	det := &fakeDetector{dead: map[[2]uint64]bool{}}
	nodes := startServices(t, 4, det)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	type call struct {
		dead   ClerkID
		names  []string
		tokens []Token // the run's token, then its renewals'
		err    error
	}
	calls := make(chan call, 10)
	release := make(chan struct{})
	walA, err := nodes[2].svc.NewClerk("wal", func(ctx context.Context, r Recovery) error {
		return fmt.Errorf("node 3's wal clerk must not be asked to recover itself")
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = nodes[3].svc.NewClerk("wal", func(ctx context.Context, r Recovery) error {
		// The run renews its token twice (as a replay whose writes lost
		// their answers does): each newer than the last.
		c := call{dead: r.Dead, names: r.Names, tokens: []Token{r.Token}}
		for i := 0; i < 2 && c.err == nil; i++ {
			var tok Token
			tok, c.err = r.Renew(ctx)
			c.tokens = append(c.tokens, tok)
		}
		calls <- c
		<-release
		return c.err
	})
	if err != nil {
		t.Fatal(err)
	}
	h, err := walA.Acquire(ctx, "x", Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	if !h.Valid() {
		t.Fatal("fresh hold not valid")
	}
	// A waiter on node 2's default clerk.
	// (Its error travels with it: the goroutine may outlive a test that
	// failed, and must not call t.Error then.)
	type heldErr struct {
		h   *Held
		err error
	}
	got := make(chan heldErr, 1)
	go func() {
		h2, err := nodes[1].svc.DefaultClerk().Acquire(ctx, "x", Exclusive)
		got <- heldErr{h2, err}
	}()
	time.Sleep(300 * time.Millisecond)
	select {
	case <-got:
		t.Fatal("waiter granted while the wal clerk holds the lock")
	default:
	}
	// Node 3 fences itself (its leases are gone locally), then the detector
	// declares it dead.
	nodes[2].live.dead.Store(true)
	nodes[2].svc.Fence(1)
	if h.Valid() {
		t.Fatal("hold valid after its node fenced")
	}
	det.kill(3, 1)
	var c call
	select {
	case c = <-calls:
	case <-ctx.Done():
		t.Fatal("recovery never ran")
	}
	if c.dead != walA.ID() || len(c.names) != 1 || c.names[0] != "x" {
		t.Fatalf("recovery of %v for %v, want %v [x]", c.dead, c.names, walA.ID())
	}
	if c.err != nil {
		t.Fatalf("renewing the run's token: %v (tokens %v)", c.err, c.tokens)
	}
	for i := 1; i < len(c.tokens); i++ {
		if !c.tokens[i-1].Less(c.tokens[i]) {
			t.Fatalf("the run's renewed tokens do not grow: %v", c.tokens)
		}
	}
	select {
	case <-got:
		t.Fatal("waiter granted before recovery finished")
	case <-time.After(300 * time.Millisecond):
	}
	close(release)
	var h2 *Held
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatalf("the waiter: %v", r.err)
		}
		h2 = r.h
	case <-ctx.Done():
		t.Fatal("waiter never granted after recovery")
	}
	if last := c.tokens[len(c.tokens)-1]; !last.Less(h2.Token()) {
		t.Fatalf("the lease was granted again under %v, not above the run's renewed token %v", h2.Token(), last)
	}
	// The lease moved only after the decree removing the dead clerk's
	// records committed (otherwise a new master would run its recovery
	// again under the new holder).
	ns, err := nodes[0].svc.cfg.Meta.Read(ctx, Namespace)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ns.Entries {
		if e.Key == clerkKey(walA.ID()) || e.Key == recoveryKey(walA.ID()) {
			t.Fatalf("waiter granted while %s is still in the config service", e.Key)
		}
	}
	if !h.Token().Less(h2.Token()) {
		t.Fatalf("waiter's token %v not above the dead holder's %v", h2.Token(), h.Token())
	}

	// The master (node 1 or 2, whichever won) dies; the other takes over
	// and keeps node 2's lease.
	list, err := nodes[0].svc.List(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	m := list.Master.Node
	nodes[m-1].live.dead.Store(true)
	nodes[m-1].svc.Fence(1)
	det.kill(m, 1)
	other := nodes[2-m] // the other candidate (nodes 1 and 2 are candidates)
	for {
		l, err := other.svc.List(ctx, nil)
		if err == nil && l.Master.Node != m && l.Serving {
			list = l
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("no takeover: %v %v", l, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if m == 2 {
		// The waiter's own node was the master and died with it: its lease
		// is gone; nothing more to check about it.
		return
	}
	held := false
	for _, l := range list.Locks {
		if string(l.Name) == "x" && len(l.Holders) == 1 && l.Holders[0].Clerk.Node == 2 {
			held = true
		}
	}
	if !held || !h2.Valid() {
		t.Fatalf("new master lost node 2's lease on x: %v", list.Locks)
	}
}

// Bad Hold requests get InvalidArgument and change nothing.
func TestHoldRejectsBadInput(t *testing.T) {
	det := &fakeDetector{dead: map[[2]uint64]bool{}}
	nodes := startServices(t, 3, det)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, req := range []*pb.HoldRequest{
		{Name: nil, Mode: pb.LockMode_LOCK_MODE_SHARED},
		{Name: make([]byte, MaxNameLen+1), Mode: pb.LockMode_LOCK_MODE_SHARED},
		{Name: []byte("x")},
		{Name: []byte("x"), Mode: 9},
	} {
		err := nodes[0].svc.Hold(req, nil)
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("hold %v: %v", req, err)
		}
	}
	if c := nodes[0].svc.DefaultClerk(); c != nil {
		if _, err := c.Acquire(ctx, "", Shared); err != ErrBadName {
			t.Errorf("empty name: %v", err)
		}
		if _, err := c.Acquire(ctx, "x", None); err != ErrBadMode {
			t.Errorf("mode none: %v", err)
		}
	}
}

// Defect 2 of the safety review: leases are bound to the incarnation that
// acquired them. A clerk cannot be made between a fence and the next
// incarnation; a hold of the fenced incarnation never becomes valid again,
// even when the node is alive in its next incarnation; its Lost channel
// says why.
func TestLeaseBoundToIncarnation(t *testing.T) {
	det := &fakeDetector{dead: map[[2]uint64]bool{}}
	nodes := startServices(t, 3, det)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n := nodes[2]
	h, err := n.svc.DefaultClerk().Acquire(ctx, "x", Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	if !h.Valid() || h.ValidUntil().IsZero() || h.Token().IsZero() {
		t.Fatalf("fresh hold: valid=%v until=%v token=%v", h.Valid(), h.ValidUntil(), h.Token())
	}
	n.live.dead.Store(true)
	n.svc.Fence(1)
	if _, err := n.svc.NewClerk("", nil); !errors.Is(err, ErrFenced) {
		t.Fatalf("clerk made between a fence and the next incarnation: %v", err)
	}
	select {
	case <-h.Lost():
	default:
		t.Fatal("Lost not closed at the fence")
	}
	if !errors.Is(h.LostReason(), ErrFenced) {
		t.Fatalf("lost reason %v", h.LostReason())
	}
	// The node comes back as incarnation 2: the old hold stays invalid.
	n.live.inc.Store(2)
	n.live.dead.Store(false)
	n.svc.Start(2)
	if h.Valid() || !h.ValidUntil().IsZero() {
		t.Fatal("a hold of the fenced incarnation is valid in the next one")
	}
	if _, err := n.svc.DefaultClerk().Acquire(ctx, "y", Shared); err != nil {
		t.Fatalf("the new incarnation's clerk: %v", err)
	}
}

// TestClerkClose: a clerk of a kind that caches an exclusive lease closes:
// the master frees the lease at once (no failure-detector verdict, no
// recovery), the clerk's record leaves the lock namespace and the master's
// clerk list, and the closed clerk can no longer acquire. A clerk with a
// hold that is not released refuses to close; the default clerk is never
// closed.
func TestClerkClose(t *testing.T) {
	det := &fakeDetector{dead: map[[2]uint64]bool{}}
	nodes := startServices(t, 3, det)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	recovered := make(chan ClerkID, 1)
	wal, err := nodes[2].svc.NewClerk("wal", func(ctx context.Context, r Recovery) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nodes[1].svc.NewClerk("wal", func(ctx context.Context, r Recovery) error { recovered <- r.Dead; return nil }); err != nil {
		t.Fatal(err)
	}
	h, err := wal.Acquire(ctx, "x", Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	if err := wal.Close(ctx); !errors.Is(err, ErrStillHeld) {
		t.Fatalf("close with a hold: %v, want ErrStillHeld", err)
	}
	h.Release() // the lease stays cached at the clerk
	holders := func() map[ClerkID]bool {
		r, err := nodes[0].svc.List(ctx, &pb.ListRequest{})
		if err != nil {
			t.Fatal(err)
		}
		out := map[ClerkID]bool{}
		for _, l := range r.Locks {
			for _, hd := range l.Holders {
				id, _ := ClerkIDFromPB(hd.Clerk)
				out[id] = true
			}
		}
		for _, c := range r.Clerks {
			if id, _ := ClerkIDFromPB(c.Id); id == wal.ID() {
				out[ClerkID{}] = true // listed as a clerk
			}
		}
		return out
	}
	if hs := holders(); !hs[wal.ID()] {
		t.Fatalf("the master does not show the cached lease of %v: %v", wal.ID(), hs)
	}
	start := time.Now()
	if err := wal.Close(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("closed in %v", time.Since(start).Round(time.Millisecond))
	// The master forgets the clerk when its own Forget decree returns,
	// which may be just after the clerk saw its record go.
	for hs := holders(); hs[wal.ID()] || hs[ClerkID{}]; hs = holders() {
		if time.Since(start) > 5*time.Second {
			t.Fatalf("after Close the master still has the clerk or its lease: %v", hs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	ns, err := nodes[0].svc.cfg.Meta.Read(ctx, Namespace)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := DecodeState(ns)
	if st.hasClerk(wal.ID()) {
		t.Fatalf("closed clerk %v still registered", wal.ID())
	}
	if _, err := wal.Acquire(ctx, "y", Shared); !errors.Is(err, ErrClosed) {
		t.Fatalf("acquire on a closed clerk: %v, want ErrClosed", err)
	}
	if err := wal.Close(ctx); err != nil {
		t.Fatalf("a second Close: %v, want nil", err)
	}
	h2, err := nodes[0].svc.DefaultClerk().Acquire(ctx, "x", Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	h2.Release()
	select {
	case d := <-recovered:
		t.Fatalf("a recovery ran for %v: a closed clerk is not a dead one", d)
	case <-time.After(200 * time.Millisecond):
	}
	if err := nodes[0].svc.DefaultClerk().Close(ctx); err == nil {
		t.Fatal("the default clerk closed")
	}
}
