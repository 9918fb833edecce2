package btree

import (
	"context"
	"testing"
	"time"
)

// TestServerWaitOutlivesIncarnation: a call waiting for the node's B-tree
// server while the node moves to its next incarnation gets the next
// incarnation's server. Before, it waited on the old incarnation's ready
// channel, which nothing would close, until its deadline. (With no next
// incarnation started, it fails at once: TestReview7*.)
func TestServerWaitOutlivesIncarnation(t *testing.T) {
	s := NewService(ServiceConfig{Node: 1})
	// Incarnation 1, its server starting (run is not started here).
	begin := func(inc uint64) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.mu.inc = inc
		s.mu.ctx, s.mu.cancel = context.WithCancel(context.Background())
		s.mu.ready, s.mu.gone, s.mu.started = make(chan struct{}), make(chan struct{}), true
	}
	begin(1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got := make(chan *Server, 1)
	errs := make(chan error, 1)
	go func() {
		srv, err := s.Server(ctx)
		if err != nil {
			errs <- err
			return
		}
		got <- srv
	}()
	time.Sleep(20 * time.Millisecond)
	// The node fenced itself before incarnation 1's server was ready, and
	// its next incarnation starts (as Start does: one step under the lock).
	s.mu.Lock()
	s.stopLocked()
	s.mu.Unlock()
	begin(2)
	want := &Server{}
	s.mu.Lock()
	s.mu.srv = want
	close(s.mu.ready)
	s.mu.Unlock()
	select {
	case srv := <-got:
		if srv != want {
			t.Fatal("Server returned another server than incarnation 2's")
		}
	case err := <-errs:
		t.Fatalf("Server failed instead of waiting for the next incarnation: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("Server still waits on incarnation 1's server, which will never be ready")
	}
}
