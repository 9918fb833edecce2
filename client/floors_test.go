package client_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/client"
	"github.com/grovestore/grove/internal/btree"
)

// floorTrees answers every PutOnce, holding those of key "slow" until
// released, and logs each token's number and floor.
type floorTrees struct {
	pb.UnimplementedTreeServiceServer
	release chan struct{}
	mu      sync.Mutex
	seen    []*pb.TreeWriteToken
	slow    chan uint64 // the slow write's number, once it arrived
}

func (f *floorTrees) PutOnce(ctx context.Context, r *pb.TreePutRequest) (*pb.TreePutResponse, error) {
	f.mu.Lock()
	f.seen = append(f.seen, r.Token)
	f.mu.Unlock()
	if string(r.Key) == "slow" {
		f.slow <- r.Token.Seq
		select {
		case <-f.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return &pb.TreePutResponse{Applied: true}, nil
}

func (f *floorTrees) last() *pb.TreeWriteToken {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.seen[len(f.seen)-1]
}

// TestClientFloors: each attempt's floor is the least number of the
// client's writes still waiting for an answer: held at a slow write's while
// it waits, past it once it is answered, and past a write given up with
// its outcome unknown.
func TestClientFloors(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f := &floorTrees{release: make(chan struct{}), slow: make(chan uint64, 2)}
	cl, err := client.DialOptions(ctx, client.Options{NoRouting: true}, serveTrees(t, f))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	tr := cl.Tree("t")
	slowDone := make(chan error, 1)
	go func() { slowDone <- tr.Put(ctx, []byte("slow"), []byte("v")) }()
	slow := <-f.slow
	for i := 0; i < 3; i++ {
		if err := tr.Put(ctx, []byte("fast"), []byte("v")); err != nil {
			t.Fatal(err)
		}
		if tk := f.last(); tk.Floor != slow || tk.Seq <= slow {
			t.Fatalf("write %d while write %d waits: floor %d", tk.Seq, slow, tk.Floor)
		}
	}
	close(f.release)
	if err := <-slowDone; err != nil {
		t.Fatal(err)
	}
	if err := tr.Put(ctx, []byte("fast"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	if tk := f.last(); tk.Floor != tk.Seq {
		t.Fatalf("write %d with none other waiting: floor %d", tk.Seq, tk.Floor)
	}
	// A write given up (its call's time ends while its attempt is held):
	// its outcome is unknown, and the floor passes it.
	f.release = make(chan struct{})
	sctx, scancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err = tr.Put(sctx, []byte("slow"), []byte("v"))
	scancel()
	if err == nil {
		t.Fatal("a held write answered")
	}
	gone := <-f.slow
	if err := tr.Put(ctx, []byte("fast"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	if tk := f.last(); tk.Floor != tk.Seq || tk.Seq <= gone {
		t.Fatalf("write %d after write %d was given up: floor %d", tk.Seq, gone, tk.Floor)
	}
}

// TestClientFloorsAfterRenewal: a token refused as too old at its first
// attempt is replaced (the write did nothing), and a build that refuses
// tokens turns them off; neither leaves a number open, which would hold
// every later floor at it. The next tokened write's floor is its own
// number.
func TestClientFloorsAfterRenewal(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f := &fakeTrees{script: []error{btreeReason(codes.FailedPrecondition, "old", btree.TokenExpired)}}
	cl, err := client.DialOptions(ctx, client.Options{NoRouting: true}, serveFake(t, f))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	tr := cl.Tree("t")
	for i := 0; i < 2; i++ {
		if err := tr.Put(ctx, []byte("k"), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	reqs := f.requests()
	if len(reqs) != 3 || reqs[1].Token.Seq == reqs[0].Token.Seq {
		t.Fatalf("%d requests (want a refused token, its renewal, the next write)", len(reqs))
	}
	if last := reqs[2].Token; last.Floor != last.Seq {
		t.Fatalf("the write after a renewal: number %d, floor %d (a number left open)", last.Seq, last.Floor)
	}
}
