package btree

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/grovestore/grove/api/etcdpb"
	"github.com/grovestore/grove/internal/transport"
)

// review5Home is a stand-in home node: handler runs each Forward stream.
type review5Home struct {
	etcdpb.UnimplementedGroveForwardServer
	handler func(etcdpb.GroveForward_ForwardServer) error
}

func (h *review5Home) Forward(s etcdpb.GroveForward_ForwardServer) error { return h.handler(s) }

// review5Link starts a gRPC server (the cluster's server options) with
// handler and returns a forwardLink to it (the cluster's dial options).
func review5Link(t *testing.T, ctx context.Context, handler func(etcdpb.GroveForward_ForwardServer) error) *forwardLink {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(transport.ServerOptions()...)
	etcdpb.RegisterGroveForwardServer(srv, &review5Home{handler: handler})
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	cc, err := grpc.NewClient(lis.Addr().String(), transport.DialOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return &forwardLink{cc: cc, close: ctx, sent: new(atomic.Uint64)}
}

// The home batches every answer ready at once into one ForwardAnswers
// message (the outbox then took them all, with no size bound). Two range
// answers of 17 MiB each — each well under transport.MaxMessage (33 MiB),
// each fine over the old unary path — travel together as one 34 MiB
// message, which the forwarding node's Recv refuses (ResourceExhausted):
// the stream breaks and every call on it fails, among them a put the home
// applied and answered, which the endpoint reports as Unknown.
func TestReview5ForwardBatchOverMessageLimit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	big := bytes.Repeat([]byte{'v'}, 17<<20)
	l := review5Link(t, ctx, func(s etcdpb.GroveForward_ForwardServer) error {
		// Gather the three calls, then answer them as EtcdKV.Forward does
		// when they complete together: one outbox, one sender.
		var calls []*etcdpb.ForwardCall
		for len(calls) < 3 {
			m, err := s.Recv()
			if err != nil {
				return nil
			}
			calls = append(calls, m.Calls...)
		}
		out := newOutbox(func(a []*etcdpb.ForwardAnswer) error {
			return s.Send(&etcdpb.ForwardAnswers{Answers: a})
		}, nil)
		var answers []*etcdpb.ForwardAnswer
		for _, c := range calls {
			ans := &etcdpb.ForwardAnswer{Id: c.Id}
			if c.GetPut() != nil {
				ans.Result = &etcdpb.ForwardAnswer_Put{Put: &etcdpb.PutResponse{}}
			} else {
				ans.Result = &etcdpb.ForwardAnswer_Range{Range: &etcdpb.RangeResponse{Kvs: []*etcdpb.KeyValue{{Key: c.GetRange().Key, Value: big}}, Count: 1}}
			}
			answers = append(answers, ans)
		}
		// All three queued while a sender is busy, then sent together.
		out.mu.Lock()
		out.items = append(out.items, answers...)
		out.flushLocked()
		for {
			if _, err := s.Recv(); err != nil {
				return nil
			}
		}
	})
	var wg sync.WaitGroup
	var putErr error
	for _, k := range []string{"a", "b"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = l.call(ctx, 1, &etcdpb.ForwardCall{Op: &etcdpb.ForwardCall_Range{Range: &etcdpb.RangeRequest{Key: []byte(k)}}})
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, putErr = l.call(ctx, 1, &etcdpb.ForwardCall{Op: &etcdpb.ForwardCall_Put{Put: &etcdpb.PutRequest{Key: []byte("k"), Value: []byte("v")}}})
	}()
	wg.Wait()
	if putErr != nil {
		t.Fatalf("a put the home applied and answered: the endpoint answers %v (%v): the batch of two 17 MiB range answers broke the stream", status.Code(forwarded(putErr, true)), putErr)
	}
}

// (Review 5 found that a call stuck behind a large one on the stream — a
// 24 MiB put whose Send waits on flow control — was still sent after its
// caller gave up, with the time it had when it was queued. Calls larger
// than forwardCallMax, which no tree accepts anyway, are now served where
// they land, never sent; a call whose caller gave up before it left the
// outbox is not sent; one already in the transport may still arrive, as
// an expired unary call's bytes may: its outcome was reported unknown.)
func TestReview5ForwardOversizedCallNotSent(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	got := make(chan *etcdpb.ForwardCall, 16)
	l := review5Link(t, ctx, func(s etcdpb.GroveForward_ForwardServer) error {
		for {
			m, err := s.Recv()
			if err != nil {
				return nil
			}
			for _, c := range m.Calls {
				got <- c
				_ = s.Send(&etcdpb.ForwardAnswers{Answers: []*etcdpb.ForwardAnswer{{Id: c.Id, Result: &etcdpb.ForwardAnswer_Put{Put: &etcdpb.PutResponse{}}}}})
			}
		}
	})
	big := bytes.Repeat([]byte{'v'}, 24<<20)
	if _, err := l.call(ctx, 1, &etcdpb.ForwardCall{Op: &etcdpb.ForwardCall_Put{Put: &etcdpb.PutRequest{Key: []byte("big"), Value: big}}}); !errors.Is(err, errNotSent) {
		t.Fatalf("a 24 MiB put: %v (want errNotSent: served where it landed)", err)
	}
	start := time.Now()
	if _, err := l.call(ctx, 1, &etcdpb.ForwardCall{Op: &etcdpb.ForwardCall_Put{Put: &etcdpb.PutRequest{Key: []byte("small"), Value: []byte("v")}}}); err != nil {
		t.Fatalf("the small put: %v", err)
	}
	if c := <-got; string(c.GetPut().GetKey()) != "small" || time.Since(start) > 2*time.Second {
		t.Fatalf("the home received %q after %v", c.GetPut().GetKey(), time.Since(start))
	}
}
