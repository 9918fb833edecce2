package meta

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/grovestore/grove/internal/disk"
)

// TestCountedRecord: a replica without state starts knowing (and vouches),
// one with state but no record starts not knowing; a note is on disk when
// note returns, and a note whose write fails is an error and is not kept.
func TestCountedRecord(t *testing.T) {
	fs := disk.NewMem()
	c, err := openCounted(fs, "/a", false)
	if err != nil {
		t.Fatal(err)
	}
	if known, peers := c.list(0); !known || len(peers) != 0 {
		t.Fatalf("fresh record: known %v peers %v", known, peers)
	}
	for _, id := range []raft.ServerID{"3", "2", "3"} {
		if err := c.note(id, time.Time{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.note("x", time.Time{}); err == nil {
		t.Fatal("a peer id that is no member id was noted")
	}
	// What a crash leaves: the file as written, read by a new open (with
	// state now: the record's own "known" stands).
	c2, err := openCounted(fs, "/a", true)
	if err != nil {
		t.Fatal(err)
	}
	if known, peers := c2.list(0); !known || len(peers) != 2 || peers[0] != 2 || peers[1] != 3 {
		t.Fatalf("reopened: known %v peers %v, want true [2 3]", known, peers)
	}

	fs.FailWrites(errors.New("disk full"))
	if err := c2.note("5", time.Time{}); err == nil {
		t.Fatal("a note whose write failed returned nil: raft would count an answer not recorded")
	}
	fs.FailWrites(nil)
	if _, peers := c2.list(0); len(peers) != 2 {
		t.Fatalf("a failed note was kept: %v", peers)
	}

	// State from before the record: it may have counted anybody.
	old, err := openCounted(disk.NewMem(), "/b", true)
	if err != nil {
		t.Fatal(err)
	}
	if known, _ := old.list(0); known {
		t.Fatal("a replica with state and no record vouches")
	}
	bad := disk.NewMem()
	bad.WriteFileSync("/c/"+countedFile, []byte(`{"version":2,"known":true}`))
	if _, err := openCounted(bad, "/c", false); err == nil {
		t.Fatal("a record of an unknown version was read")
	}
}

// TestCountedTransport: over a real TCP transport, a granted vote, an
// acknowledged append and an acknowledged snapshot are recorded before the
// caller sees them; a refusal is not; a write that fails turns the answer
// into an error (raft counts nothing).
func TestCountedTransport(t *testing.T) {
	peer, err := raft.NewTCPTransportWithLogger("127.0.0.1:0", nil, 2, 5*time.Second, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	var grant atomic.Bool
	go answer(peer.Consumer(), &grant)
	self, err := raft.NewTCPTransportWithLogger("127.0.0.1:0", nil, 2, 5*time.Second, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer self.Close()
	fs := disk.NewMem()
	c, err := openCounted(fs, "/d", false)
	if err != nil {
		t.Fatal(err)
	}
	g := &gatedTransport{NetworkTransport: self, counted: c}
	to := peer.LocalAddr()
	onDisk := func() []uint64 { t.Helper(); return countedOnDisk(t, fs) }

	grant.Store(false)
	var vr raft.RequestVoteResponse
	if err := g.RequestVote("2", to, &raft.RequestVoteRequest{Term: 1}, &vr); err != nil || vr.Granted {
		t.Fatalf("refused vote: %v %+v", err, vr)
	}
	if p := onDisk(); len(p) != 0 {
		t.Fatalf("a refused vote was recorded: %v", p)
	}
	grant.Store(true)
	if err := g.RequestVote("2", to, &raft.RequestVoteRequest{Term: 1}, &vr); err != nil || !vr.Granted {
		t.Fatalf("granted vote: %v %+v", err, vr)
	}
	var ar raft.AppendEntriesResponse
	if err := g.AppendEntries("3", to, &raft.AppendEntriesRequest{Term: 1}, &ar); err != nil || !ar.Success {
		t.Fatalf("append: %v %+v", err, ar)
	}
	if p := onDisk(); len(p) != 2 || p[0] != 2 || p[1] != 3 {
		t.Fatalf("recorded %v, want [2 3]", p)
	}
	fs.FailWrites(errors.New("disk full"))
	var sr raft.InstallSnapshotResponse
	if err := g.InstallSnapshot("4", to, &raft.InstallSnapshotRequest{Term: 1}, &sr, strings.NewReader("")); err == nil {
		t.Fatal("an acknowledged snapshot whose record failed reached raft")
	}
	if err := g.RequestVote("5", to, &raft.RequestVoteRequest{Term: 1}, &vr); err == nil {
		t.Fatal("a granted vote whose record failed reached raft")
	}
	// Already recorded: nothing to write, the answer goes through.
	if err := g.AppendEntries("2", to, &raft.AppendEntriesRequest{Term: 1}, &ar); err != nil {
		t.Fatalf("append to a recorded peer with the disk failing: %v", err)
	}
	fs.FailWrites(nil)
	if err := g.InstallSnapshot("4", to, &raft.InstallSnapshotRequest{Term: 1}, &sr, strings.NewReader("")); err != nil || !sr.Success {
		t.Fatalf("snapshot: %v %+v", err, sr)
	}
	if p := onDisk(); len(p) != 3 || p[2] != 4 {
		t.Fatalf("recorded %v, want [2 3 4]", p)
	}
}

// countedOnDisk is the record's peers as written in /d.
func countedOnDisk(t *testing.T, fs *disk.Mem) []uint64 {
	t.Helper()
	b, err := fs.ReadFile("/d/" + countedFile)
	if err != nil {
		t.Fatal(err)
	}
	r, err := decodeCounted(b)
	if err != nil {
		t.Fatal(err)
	}
	return r.Peers
}

// answer answers every RPC from rpcs, positively while grant holds.
func answer(rpcs <-chan raft.RPC, grant *atomic.Bool) {
	for rpc := range rpcs {
		g := grant.Load()
		switch rpc.Command.(type) {
		case *raft.RequestVoteRequest:
			rpc.Respond(&raft.RequestVoteResponse{Granted: g}, nil)
		case *raft.AppendEntriesRequest:
			rpc.Respond(&raft.AppendEntriesResponse{Success: g}, nil)
		case *raft.InstallSnapshotRequest:
			rpc.Respond(&raft.InstallSnapshotResponse{Success: g}, nil)
		default:
			rpc.Respond(nil, errors.New("unexpected"))
		}
	}
}

// TestCountedAnswers: the receiving side. A vote granted, an append or a
// heartbeat accepted, a snapshot accepted: the asking peer is on disk
// before the answer reaches it; a refusal records nothing; a record that
// cannot be written reaches the asker as an error; an answer to a
// recorded peer goes through with the disk failing; Close ends the
// forwarding.
func TestCountedAnswers(t *testing.T) {
	newTrans := func() *raft.NetworkTransport {
		nt, err := raft.NewTCPTransportWithLogger("127.0.0.1:0", nil, 2, 5*time.Second, hclog.NewNullLogger())
		if err != nil {
			t.Fatal(err)
		}
		return nt
	}
	asker := newTrans()
	defer asker.Close()
	fs := disk.NewMem()
	c, err := openCounted(fs, "/d", false)
	if err != nil {
		t.Fatal(err)
	}
	g := &gatedTransport{NetworkTransport: newTrans(), counted: c}
	defer g.Close()
	var grant atomic.Bool
	g.SetHeartbeatHandler(func(rpc raft.RPC) {
		rpc.Respond(&raft.AppendEntriesResponse{Success: grant.Load()}, nil)
	})
	go answer(g.Consumer(), &grant)
	to := g.LocalAddr()
	onDisk := func() []uint64 { t.Helper(); return countedOnDisk(t, fs) }
	from := func(id string) raft.RPCHeader {
		return raft.RPCHeader{ID: []byte(id), Addr: []byte(asker.LocalAddr())}
	}
	// A heartbeat: the transport's fast path (Term set, nothing else).
	heartbeat := func(id string) *raft.AppendEntriesRequest {
		return &raft.AppendEntriesRequest{RPCHeader: from(id), Term: 1}
	}
	append_ := func(id string) *raft.AppendEntriesRequest {
		return &raft.AppendEntriesRequest{RPCHeader: from(id), Term: 1, PrevLogEntry: 1, PrevLogTerm: 1}
	}

	var vr raft.RequestVoteResponse
	var ar raft.AppendEntriesResponse
	var sr raft.InstallSnapshotResponse
	if err := asker.RequestVote("self", to, &raft.RequestVoteRequest{RPCHeader: from("2"), Term: 1}, &vr); err != nil || vr.Granted {
		t.Fatalf("refused vote: %v %+v", err, vr)
	}
	if err := asker.AppendEntries("self", to, heartbeat("2"), &ar); err != nil || ar.Success {
		t.Fatalf("refused heartbeat: %v %+v", err, ar)
	}
	if p := onDisk(); len(p) != 0 {
		t.Fatalf("a refusal was recorded: %v", p)
	}
	grant.Store(true)
	if err := asker.RequestVote("self", to, &raft.RequestVoteRequest{RPCHeader: from("2"), Term: 1}, &vr); err != nil || !vr.Granted {
		t.Fatalf("granted vote: %v %+v", err, vr)
	}
	if p := onDisk(); len(p) != 1 || p[0] != 2 {
		t.Fatalf("after a granted vote the record is %v, want [2]", p)
	}
	if err := asker.AppendEntries("self", to, heartbeat("3"), &ar); err != nil || !ar.Success {
		t.Fatalf("heartbeat: %v %+v", err, ar)
	}
	if p := onDisk(); len(p) != 2 || p[1] != 3 {
		t.Fatalf("after an accepted heartbeat the record is %v, want [2 3]", p)
	}
	fs.FailWrites(errors.New("disk full"))
	if err := asker.AppendEntries("self", to, append_("4"), &ar); err == nil {
		t.Fatal("an accepted append whose record failed was answered")
	}
	if err := asker.InstallSnapshot("self", to, &raft.InstallSnapshotRequest{RPCHeader: from("5"), Term: 1}, &sr, strings.NewReader("")); err == nil {
		t.Fatal("an accepted snapshot whose record failed was answered")
	}
	if err := asker.AppendEntries("self", to, append_("2"), &ar); err != nil || !ar.Success {
		t.Fatalf("append from a recorded peer with the disk failing: %v %+v", err, ar)
	}
	fs.FailWrites(nil)
	if err := asker.InstallSnapshot("self", to, &raft.InstallSnapshotRequest{RPCHeader: from("5"), Term: 1}, &sr, strings.NewReader("")); err != nil || !sr.Success {
		t.Fatalf("snapshot: %v %+v", err, sr)
	}
	if p := onDisk(); len(p) != 3 || p[2] != 5 {
		t.Fatalf("recorded %v, want [2 3 5]", p)
	}
	// An answer to a sender that is not a member id is an error, not a
	// count nobody could name.
	if err := asker.AppendEntries("self", to, append_("x"), &ar); err == nil {
		t.Fatal("an append from a non-member id was answered")
	}
	g.Close()
	select {
	case <-g.forwarded:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not end the forwarding goroutine")
	}
	if err := asker.AppendEntries("self", to, append_("2"), &ar); err == nil {
		t.Fatal("a closed transport answered")
	}
}

// FuzzDecodeCounted: the record's decoder refuses what it cannot read, and
// what it accepts survives a write and a read.
func FuzzDecodeCounted(f *testing.F) {
	f.Add([]byte(`{"version":1,"known":true,"peers":[1,3]}`))
	f.Add([]byte(`{"version":1,"known":false,"peers":[]}`))
	f.Add([]byte(`{"version":1,"peers":[0]}`))
	f.Add([]byte(`nope`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeCounted(b)
		if err != nil {
			return
		}
		fs := disk.NewMem()
		fs.WriteFileSync("/f/"+countedFile, b)
		c, err := openCounted(fs, "/f", true)
		if err != nil {
			t.Fatalf("decoded but did not open: %v", err)
		}
		known, _ := c.list(0)
		if known != r.Known {
			t.Fatalf("known %v, record says %v", known, r.Known)
		}
	})
}

// TestCountedFence: outside review 116's race. A leader's append is on its
// way to member 2; member 2 answers it, dies, loses its directory, starts
// again and asks to be vouched for; the leader answers "never counted",
// and only then does the old answer arrive. It must not be counted: the
// RPC was sent before the fence. An RPC sent after it is counted (the new
// incarnation answers it).
func TestCountedFence(t *testing.T) {
	peer, err := raft.NewTCPTransportWithLogger("127.0.0.1:0", nil, 2, 5*time.Second, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	hold, held := make(chan struct{}), make(chan struct{}, 1)
	go func() {
		for rpc := range peer.Consumer() {
			held <- struct{}{}
			<-hold
			rpc.Respond(&raft.AppendEntriesResponse{Success: true}, nil)
		}
	}()
	self, err := raft.NewTCPTransportWithLogger("127.0.0.1:0", nil, 2, 5*time.Second, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer self.Close()
	c, err := openCounted(disk.NewMem(), "/d", false)
	if err != nil {
		t.Fatal(err)
	}
	g := &gatedTransport{NetworkTransport: self, counted: c}
	errc := make(chan error, 1)
	go func() {
		var ar raft.AppendEntriesResponse
		errc <- g.AppendEntries("2", peer.LocalAddr(), &raft.AppendEntriesRequest{Term: 1}, &ar)
	}()
	<-held // the append reached member 2, its answer not yet sent
	if _, peers := c.list(2); len(peers) != 0 {
		t.Fatalf("member 2 asks before any answer: the list is %v", peers)
	}
	hold <- struct{}{}
	if err := <-errc; err == nil {
		t.Fatal("an answer to an append sent before member 2 asked to be vouched for was counted")
	}
	if _, peers := c.list(0); len(peers) != 0 {
		t.Fatalf("after the refused answer the list is %v", peers)
	}
	go func() { <-held; hold <- struct{}{} }()
	var ar raft.AppendEntriesResponse
	if err := g.AppendEntries("2", peer.LocalAddr(), &raft.AppendEntriesRequest{Term: 1}, &ar); err != nil || !ar.Success {
		t.Fatalf("an append sent after the fence: %v %+v", err, ar)
	}
	if _, peers := c.list(0); len(peers) != 1 || peers[0] != 2 {
		t.Fatalf("after an answer to an append sent after the fence the list is %v, want [2]", peers)
	}
}
