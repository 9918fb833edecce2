package btree

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc/status"
)

// TestReview7ServerFailsFastBetweenIncarnations: a call waiting for the
// node's B-tree server while the node leaves its incarnation, with no next
// incarnation started yet, fails at once as not applied (the client moves
// on to another node), not at its deadline. An outside review (a helper's,
// 2026-11-26) found the doc comment claimed it waited for the next
// incarnation; failing fast is what a client wants from a node that may
// stay out (a partition) while others serve.
func TestReview7ServerFailsFastBetweenIncarnations(t *testing.T) {
	s := NewService(ServiceConfig{Node: 1})
	s.mu.inc = 1
	s.mu.ctx, s.mu.cancel = context.WithCancel(context.Background())
	s.mu.ready, s.mu.gone, s.mu.started = make(chan struct{}), make(chan struct{}), true
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	errs := make(chan error, 1)
	go func() {
		_, err := s.Server(ctx)
		errs <- err
	}()
	time.Sleep(20 * time.Millisecond)
	start := time.Now()
	s.Fence(1)
	select {
	case err := <-errs:
		if err == nil || !IsNotApplied(status.Convert(err)) {
			t.Fatalf("Server between incarnations: %v, want a not-applied error", err)
		}
		if d := time.Since(start); d > time.Second {
			t.Fatalf("Server failed %v after the incarnation ended", d)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("Server still waits for an incarnation that ended")
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatal("the call's deadline passed")
	}
}
