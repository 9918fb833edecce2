package btree

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/status"

	"github.com/grovestore/grove/api/etcdpb"
	pb "github.com/grovestore/grove/api/grovepb"
)

// TestReview55NoDeadlineWaitsForever: a call that arrives without a
// deadline (an etcd clientv3 user's context.Background(), any gRPC client
// that sets none) while the node's B-tree server is starting — making or
// recovering its log, waiting for a dead server's recovery, or failing to
// start and retrying for ever (run's loop) — waits in Service.Server for
// as long as that lasts: the operation timeout (OpContext) is applied only
// after the server and the tree are found. The etcd endpoint's calls and
// the TreeService's alike; a forwarded etcd call with no deadline holds its
// caller on the forwarding node the same way. Each such call holds a
// goroutine and its request for ever if the server never starts. Expected:
// the wait bounded by the operation timeout (or a start timeout), answered
// NOT_APPLIED/Unavailable, as a call with a deadline is.
func TestReview55NoDeadlineWaitsForever(t *testing.T) {
	s := NewService(ServiceConfig{Node: 1, Server: ServerConfig{OpTimeout: 500 * time.Millisecond}})
	// Incarnation 1, its server starting and never ready (run is not
	// started here: as a start that keeps failing).
	s.mu.inc = 1
	s.mu.ctx, s.mu.cancel = context.WithCancel(context.Background())
	s.mu.ready, s.mu.gone, s.mu.started = make(chan struct{}), make(chan struct{}), true
	kv := NewEtcdKV(s, "", false)
	defer kv.Close()
	for _, c := range []struct {
		name string
		call func(ctx context.Context) error
	}{
		{"TreeService.Get", func(ctx context.Context) error {
			_, err := s.Get(ctx, &pb.TreeGetRequest{Tree: "t", Key: []byte("k")})
			return err
		}},
		{"etcd Put", func(ctx context.Context) error {
			_, err := kv.Put(ctx, &etcdpb.PutRequest{Key: []byte("k"), Value: []byte("v")})
			return err
		}},
	} {
		ctx, cancel := context.WithCancel(context.Background()) // no deadline
		errs := make(chan error, 1)
		go func() { errs <- c.call(ctx) }()
		select {
		case err := <-errs:
			if err == nil || !IsNotApplied(status.Convert(err)) {
				t.Errorf("%s: %v, want a not-applied error", c.name, err)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("%s without a deadline still waits for the B-tree server after 5 s (the operation timeout is 500 ms)", c.name)
			cancel()
			<-errs
		}
		cancel()
	}
}
