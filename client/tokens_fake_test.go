package client_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/client"
	"github.com/grovestore/grove/internal/btree"
)

// fakeTrees is a tree service whose answers a test scripts: each PutOnce
// takes the next scripted error (nil: success), and every call is logged.
type fakeTrees struct {
	pb.UnimplementedTreeServiceServer
	noOnce bool // a build from before tokens: PutOnce is unimplemented
	mu     sync.Mutex
	script []error
	sent   []*pb.TreePutRequest // PutOnce's and Put's requests, in order
}

func (f *fakeTrees) next(r *pb.TreePutRequest) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sent = append(f.sent, r)
	if len(f.script) == 0 {
		return nil
	}
	err := f.script[0]
	f.script = f.script[1:]
	return err
}

func (f *fakeTrees) PutOnce(ctx context.Context, r *pb.TreePutRequest) (*pb.TreePutResponse, error) {
	if f.noOnce {
		return nil, status.Error(codes.Unimplemented, "unknown method PutOnce")
	}
	if err := f.next(r); err != nil {
		return nil, err
	}
	return &pb.TreePutResponse{Applied: true}, nil
}

func (f *fakeTrees) Put(ctx context.Context, r *pb.TreePutRequest) (*pb.TreePutResponse, error) {
	f.next(r)
	return &pb.TreePutResponse{Applied: true}, nil
}

func (f *fakeTrees) requests() []*pb.TreePutRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*pb.TreePutRequest(nil), f.sent...)
}

func serveFake(t *testing.T, f *fakeTrees) string { return serveTrees(t, f) }

// serveTrees serves a stand-in tree service on a loopback port.
func serveTrees(t *testing.T, f pb.TreeServiceServer) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	pb.RegisterTreeServiceServer(s, f)
	go s.Serve(l)
	t.Cleanup(s.Stop)
	return l.Addr().String()
}

// How the client reacts to each answer of a tokened write, against
// scripted nodes.
func TestClientTokenAnswers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tokensOff := func() error {
		return btreeReason(codes.FailedPrecondition, "off", btree.TokensOff)
	}
	cases := []struct {
		name    string
		a, b    *fakeTrees
		want    error // nil: success
		attempt []uint32
		sameSeq bool
		plain   int // Put calls (untokened)
	}{
		{name: "an attempt of unknown outcome, then success: attempt 2 elsewhere",
			a: &fakeTrees{script: []error{status.Error(codes.Unknown, "node died")}}, b: &fakeTrees{},
			attempt: []uint32{1, 2}, sameSeq: true},
		{name: "refused before any change, then success: still attempt 1",
			a: &fakeTrees{script: []error{btree.NotAppliedError(codes.Unavailable, "starting")}}, b: &fakeTrees{},
			attempt: []uint32{1, 1}, sameSeq: true},
		{name: "a build from before tokens: the write goes untokened",
			a: &fakeTrees{noOnce: true}, b: &fakeTrees{}, plain: 1},
		{name: "tokens off: the write goes untokened",
			a: &fakeTrees{script: []error{tokensOff()}}, b: &fakeTrees{}, attempt: []uint32{1}, plain: 1},
		{name: "an attempt of unknown outcome, then tokens off: unknown, not sent untokened",
			a: &fakeTrees{script: []error{status.Error(codes.Unknown, "node died")}}, b: &fakeTrees{script: []error{tokensOff()}},
			want: client.ErrUnknownOutcome, attempt: []uint32{1, 2}, sameSeq: true},
		{name: "a first attempt too old: a new token",
			a: &fakeTrees{script: []error{btreeReason(codes.FailedPrecondition, "old", btree.TokenExpired)}}, b: &fakeTrees{},
			attempt: []uint32{1, 1}, sameSeq: false},
		{name: "an attempt of unknown outcome, then too old: unknown",
			a:    &fakeTrees{script: []error{status.Error(codes.Unknown, "node died")}},
			b:    &fakeTrees{script: []error{btreeReason(codes.FailedPrecondition, "gone", btree.TokenExpired)}},
			want: client.ErrUnknownOutcome, attempt: []uint32{1, 2}, sameSeq: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cl, err := client.DialOptions(ctx, client.Options{NoRouting: true}, serveFake(t, c.a), serveFake(t, c.b))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			err = cl.Tree("t").Put(ctx, []byte("k"), []byte("v"))
			if c.want == nil && err != nil || c.want != nil && !errors.Is(err, c.want) {
				t.Fatalf("put: %v, want %v", err, c.want)
			}
			var toks []*pb.TreeWriteToken
			plain := 0
			for _, r := range append(c.a.requests(), c.b.requests()...) {
				if r.Token == nil {
					plain++
					continue
				}
				toks = append(toks, r.Token)
			}
			if plain != c.plain || len(toks) != len(c.attempt) {
				t.Fatalf("%d tokened attempts and %d untokened sends, want %d and %d", len(toks), plain, len(c.attempt), c.plain)
			}
			for i, tk := range toks {
				if tk.Attempt != c.attempt[i] || len(tk.Client) != 16 || tk.Stamp <= 0 {
					t.Fatalf("attempt %d: %+v, want attempt number %d", i, tk, c.attempt[i])
				}
			}
			if len(toks) == 2 && (toks[0].Seq == toks[1].Seq) != c.sameSeq {
				t.Fatalf("sequence numbers %d and %d (one token: %v)", toks[0].Seq, toks[1].Seq, c.sameSeq)
			}
		})
	}
}

func btreeReason(code codes.Code, msg, reason string) error {
	return btree.ReasonError(code, msg, reason)
}
