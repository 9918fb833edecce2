package client_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/client"
)

// review53Trees takes tokened puts (and counts the handler's runs).
type review53Trees struct {
	pb.UnimplementedTreeServiceServer
	ran atomic.Int64
}

func (f *review53Trees) PutOnce(ctx context.Context, r *pb.TreePutRequest) (*pb.TreePutResponse, error) {
	f.ran.Add(1)
	return &pb.TreePutResponse{Applied: true}, nil
}

// TestReview53OversizeTokenedPut (outside review 53): a tokened put whose
// request is over the node's gRPC receive limit (ResourceExhausted from
// gRPC itself, before any handler: nothing was done) is an attempt of
// unknown outcome to treecall (Next, Resend), so the client sends the
// whole value to every endpoint, rotating off each, until the call's time
// ends, and then returns ErrUnknownOutcome. run's new special case for
// ResourceExhausted (no rotation, at once) is reached only by untokened
// writes, or at the very end. The value is also over client.MaxValue: a
// local check would answer ErrInvalid without sending anything. (The
// stand-in nodes keep gRPC's 4 MiB default; nodes' limit is 33 MiB.)
func TestReview53OversizeTokenedPut(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, b := &review53Trees{}, &review53Trees{}
	cl, err := client.DialOptions(ctx, client.Options{NoRouting: true, CallTimeout: 2 * time.Second}, serveReview53(t, a), serveReview53(t, b))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	start := time.Now()
	pctx, pcancel := context.WithTimeout(ctx, 3*time.Second)
	defer pcancel()
	err = cl.Tree("t").Put(pctx, []byte("k"), make([]byte, 5<<20))
	took := time.Since(start)
	t.Logf("a 5 MiB tokened put: %v after %v (%d resent; handlers ran %d, %d)", err, took.Round(time.Millisecond), cl.Stats().Resent, a.ran.Load(), b.ran.Load())
	if a.ran.Load()+b.ran.Load() != 0 {
		t.Fatal("a handler ran")
	}
	if errors.Is(err, client.ErrUnknownOutcome) {
		t.Errorf("a put refused by gRPC before any handler ran: ErrUnknownOutcome (after %v, %d resends); want a definite error (ErrInvalid: over MaxValue)", took.Round(time.Millisecond), cl.Stats().Resent)
	}
}

func serveReview53(t *testing.T, f *review53Trees) string { return serveTrees(t, f) }
