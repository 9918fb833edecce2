package meta

import (
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// TestHeartbeatGate: Close's fence waits for a heartbeat that is running on
// the transport's fast path (the one that raced the store's close in CI:
// hashicorp/raft#717), and answers later ones with an error instead of
// running them.
func TestHeartbeatGate(t *testing.T) {
	newTrans := func() *raft.NetworkTransport {
		nt, err := raft.NewTCPTransportWithConfig("127.0.0.1:0", nil, &raft.NetworkTransportConfig{MaxPool: 1, Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return nt
	}
	g := &gatedTransport{NetworkTransport: newTrans()}
	defer g.Close()
	sender := newTrans()
	defer sender.Close()

	entered, release := make(chan struct{}), make(chan struct{})
	ran := 0
	g.SetHeartbeatHandler(func(rpc raft.RPC) {
		ran++
		close(entered)
		<-release
		rpc.Respond(&raft.AppendEntriesResponse{Term: 1, Success: true}, nil)
	})
	heartbeat := func() error {
		req := &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{Addr: []byte(sender.LocalAddr())}, Term: 1}
		var resp raft.AppendEntriesResponse
		return sender.AppendEntries("g", g.LocalAddr(), req, &resp)
	}
	first := make(chan error, 1)
	go func() { first <- heartbeat() }()
	select {
	case <-entered:
	case <-time.After(5 * time.Second):
		t.Fatal("the heartbeat never reached the handler")
	}
	fenced := make(chan struct{})
	go func() { g.fence(); close(fenced) }()
	select {
	case <-fenced:
		t.Fatal("fence returned while a heartbeat was running")
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	<-fenced
	if err := <-first; err != nil {
		t.Fatalf("the running heartbeat: %v", err)
	}
	err := heartbeat()
	if err == nil || !strings.Contains(err.Error(), errHeartbeatFenced.Error()) {
		t.Fatalf("a heartbeat after the fence: %v, want %v", err, errHeartbeatFenced)
	}
	if ran != 1 {
		t.Fatalf("the handler ran %d times, want 1", ran)
	}
}
