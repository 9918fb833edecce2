package transport

import (
	"context"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
)

// A guarded gRPC port serves real gRPC clients and drops, with a reason,
// connections that send garbage or close without a word.
func TestGuardDropsGarbageAndServesGRPC(t *testing.T) {
	l, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var reasons []string
	g := Guard(l, func(_ net.Addr, reason string) {
		mu.Lock()
		reasons = append(reasons, reason)
		mu.Unlock()
	})
	gs := grpc.NewServer(ServerOptions()...)
	go gs.Serve(g)
	defer gs.Stop()

	for _, junk := range []string{"GET / HTTP/1.1\r\nHost: x\r\n\r\n", strings.Repeat("\x00\xff", 20), ""} {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		c.Write([]byte(junk))
		c.Close()
	}
	cc, err := grpc.NewClient(l.Addr().String(), DialOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = cc.Invoke(ctx, "/grove.Nothing/Here", &emptypb.Empty{}, &emptypb.Empty{})
	if status.Code(err) != codes.Unimplemented {
		t.Fatalf("a real gRPC call through the guard: %v (want Unimplemented from the server)", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		n := len(reasons)
		got := append([]string(nil), reasons...)
		mu.Unlock()
		if n == 3 {
			if strings.Count(strings.Join(got, "|"), "no HTTP/2 preface") != 2 || strings.Count(strings.Join(got, "|"), "before sending anything") != 1 {
				t.Fatalf("reasons: %q", got)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("garbage reported %d times, want 3: %q", n, got)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A connection that opens with a registered magic goes to its handler,
// magic consumed, next to gRPC on the same port; one whose first bytes
// are neither is dropped at once (not after PrefaceTimeout).
func TestGuardHandsOverMagic(t *testing.T) {
	l, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	bad := make(chan string, 4)
	g := Guard(l, func(_ net.Addr, reason string) { bad <- reason })
	defer g.Close()
	got := make(chan string, 1)
	g.Handle("TEST", func(c net.Conn) {
		defer c.Close()
		b := make([]byte, 5)
		if _, err := io.ReadFull(c, b); err != nil {
			got <- err.Error()
			return
		}
		got <- string(b)
	})
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("TESThello"))
	select {
	case s := <-got:
		if s != "hello" {
			t.Fatalf("the handler read %q, want %q", s, "hello")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the handler never got the connection")
	}
	c2, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	c2.Write([]byte("NOPE"))
	select {
	case r := <-bad:
		if !strings.Contains(r, "no HTTP/2 preface") {
			t.Fatalf("reason %q", r)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("an unknown magic was not dropped at once")
	}
	for _, m := range []string{"PRI ", "TOOLONG"} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Handle(%q) did not panic", m)
				}
			}()
			g.Handle(m, func(net.Conn) {})
		}()
	}
}

// A view hands the port from one gRPC server to the next: stopping the
// first closes only its view, and the next server answers on the same
// socket (a node that answered probes while it decided whether to
// bootstrap, then its real server).
func TestGuardViewHandsOver(t *testing.T) {
	l, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := Guard(l, func(net.Addr, string) {})
	answer := func(code codes.Code) *grpc.Server {
		return grpc.NewServer(append(ServerOptions(), grpc.UnknownServiceHandler(func(any, grpc.ServerStream) error {
			return status.Error(code, "marker")
		}))...)
	}
	call := func() codes.Code {
		cc, err := grpc.NewClient(l.Addr().String(), DialOptions()...)
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return status.Code(cc.Invoke(ctx, "/grove.Nothing/Here", &emptypb.Empty{}, &emptypb.Empty{}))
	}
	first := answer(codes.Unavailable)
	go first.Serve(g.View())
	if c := call(); c != codes.Unavailable {
		t.Fatalf("through the view: %v, want the first server's Unavailable", c)
	}
	first.Stop()
	second := answer(codes.AlreadyExists)
	go second.Serve(g)
	defer second.Stop()
	for i := 0; i < 3; i++ {
		if c := call(); c != codes.AlreadyExists {
			t.Fatalf("call %d after the hand-over: %v, want the second server's AlreadyExists", i, c)
		}
	}
}
