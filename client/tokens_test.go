package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/grovestore/grove/client"
)

// replyDropper is a TCP proxy to a node that, once armed, still carries
// the requests of the connections open then to the node but drops every
// byte of their answers, and breaks them a while later: a write that took
// effect whose answer was lost. Connections made after are not touched.
type replyDropper struct {
	l     net.Listener
	mu    sync.Mutex
	conns []*droppedConn
}

type droppedConn struct {
	c, s  net.Conn
	armed atomic.Bool
}

func newReplyDropper(t *testing.T, to string) *replyDropper {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &replyDropper{l: l}
	t.Cleanup(func() {
		l.Close()
		p.mu.Lock()
		for _, dc := range p.conns {
			dc.c.Close()
			dc.s.Close()
		}
		p.mu.Unlock()
	})
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", to)
			if err != nil {
				c.Close()
				continue
			}
			dc := &droppedConn{c: c, s: s}
			p.mu.Lock()
			p.conns = append(p.conns, dc)
			p.mu.Unlock()
			go func() { io.Copy(s, c); s.Close() }()
			go func() {
				buf := make([]byte, 32<<10)
				for {
					n, err := s.Read(buf)
					if n > 0 && !dc.armed.Load() {
						if _, werr := c.Write(buf[:n]); werr != nil {
							break
						}
					}
					if err != nil {
						break
					}
				}
				c.Close()
			}()
		}
	}()
	return p
}

func (p *replyDropper) addr() string { return p.l.Addr().String() }

// arm drops the answers of the connections open now, and breaks them
// after d.
func (p *replyDropper) arm(d time.Duration) {
	p.mu.Lock()
	doomed := p.conns
	p.conns = nil
	p.mu.Unlock()
	for _, dc := range doomed {
		dc.armed.Store(true)
	}
	time.AfterFunc(d, func() {
		for _, dc := range doomed {
			dc.c.Close()
			dc.s.Close()
		}
	})
}

// A write whose answer is lost is sent again under its token, to the next
// endpoint, and answered with the first attempt's outcome: a
// compare-and-swap that took effect says so (sent again plainly, it would
// fail its condition against its own new value), and a delete that took
// effect is not applied again to the key put back meanwhile. Without
// tokens (the control) the same loss is an unknown outcome.
func TestClientResendsUnderToken(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, eps := cluster(t, ctx)
	p := newReplyDropper(t, eps[0])
	dial := func(o client.Options) *client.Client {
		o.NoRouting = true
		o.AttemptTimeout = 5 * time.Second
		c, err := client.DialOptions(ctx, o, p.addr(), eps[1])
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	c := dial(client.Options{})
	other, err := client.Dial(ctx, eps[2])
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := c.CreateTree(ctx, "tok", client.TreeOptions{}); err != nil {
		t.Fatal(err)
	}
	tr, otr := c.Tree("tok"), other.Tree("tok")
	for _, k := range []string{"cas", "plain"} {
		if err := otr.Put(ctx, []byte(k), []byte("a")); err != nil {
			t.Fatal(err)
		}
	}
	// Warm the proxied connections (the first endpoint answers), and the
	// client's anchor of the tree (looked up before its first write: a
	// lookup whose answer is lost is only sent elsewhere).
	if err := tr.Put(ctx, []byte("warm"), []byte("w")); err != nil {
		t.Fatal(err)
	}

	p.arm(time.Second)
	applied, cur, found, err := tr.CompareAndSwap(ctx, []byte("cas"), []byte("a"), []byte("b"))
	if err != nil || !applied || !found || cur != nil {
		t.Fatalf("a compare-and-swap whose answer was lost: applied %v, cur %q, found %v, %v", applied, cur, found, err)
	}
	if v, err := otr.Get(ctx, []byte("cas")); err != nil || string(v) != "b" {
		t.Fatalf("after it: %q %v", v, err)
	}

	// A delete whose answer is lost, the key put back by another client
	// before the retry: the retry's answer is the delete's, and the key
	// stays.
	if err := otr.Put(ctx, []byte("del"), []byte("x")); err != nil {
		t.Fatal(err)
	}
	// (A client dialed after the cut, so its first endpoint is the
	// proxy's: the first one moved on to the next endpoint.)
	c2 := dial(client.Options{})
	tr2 := c2.Tree("tok")
	if err := tr2.Put(ctx, []byte("warm"), []byte("w")); err != nil {
		t.Fatal(err)
	}
	var putBack sync.WaitGroup
	putBack.Add(1)
	p.arm(time.Second)
	go func() {
		defer putBack.Done()
		for ctx.Err() == nil { // once the delete took effect
			if _, err := otr.Get(ctx, []byte("del")); errors.Is(err, client.ErrNotFound) {
				if err := otr.Put(ctx, []byte("del"), []byte("y")); err != nil {
					t.Error(err)
				}
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	found, err = tr2.Delete(ctx, []byte("del"))
	putBack.Wait()
	if err != nil || !found {
		t.Fatalf("a delete whose answer was lost: found %v, %v", found, err)
	}
	if v, err := otr.Get(ctx, []byte("del")); err != nil || string(v) != "y" {
		t.Fatalf("the delete's retry removed the key put back after it: %q %v", v, err)
	}

	for _, cl := range []*client.Client{c, c2} {
		if st := cl.Stats(); st.Resent != 1 || st.Repeats != 1 || st.Unknown != 0 {
			t.Fatalf("a client's counts: %+v (want 1 resent, 1 repeat, none unknown)", st)
		}
	}

	// The control: untokened, the same loss is an unknown outcome (a
	// client dialed after the cuts above, so its first endpoint is the
	// proxy's).
	ptr := dial(client.Options{NoTokens: true}).Tree("tok")
	if _, err := ptr.Get(ctx, []byte("plain")); err != nil {
		t.Fatal(err)
	}
	p.arm(time.Second)
	start := time.Now()
	if ok, cur, _, err := ptr.CompareAndSwap(ctx, []byte("plain"), []byte("a"), []byte("b")); !errors.Is(err, client.ErrUnknownOutcome) {
		t.Fatalf("untokened, a lost answer: %v %v %q after %v (the proxy lost nothing?)", ok, cur, err, time.Since(start))
	}
}

// BenchmarkClientTokens: what completion records cost a put (256-byte
// values, 8 goroutines on one routed client): new keys, and updates of 64
// hot keys (records pile up in few leaves and are evicted), with tokens
// and without.
func BenchmarkClientTokens(b *testing.B) {
	for _, keys := range []string{"new", "hot"} {
		for _, tokens := range []bool{false, true} {
			b.Run(fmt.Sprintf("keys=%s/tokens=%v", keys, tokens), func(b *testing.B) {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
				defer cancel()
				_, eps := cluster(b, ctx)
				c, err := client.DialOptions(ctx, client.Options{NoTokens: !tokens}, eps...)
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				if err := c.CreateTree(ctx, "bench", client.TreeOptions{}); err != nil {
					b.Fatal(err)
				}
				tr := c.Tree("bench")
				for i := 0; i < 64; i++ { // warm up, and let routing learn the nodes
					if err := tr.Put(ctx, []byte(fmt.Sprintf("hot%03d", i)), make([]byte, 256)); err != nil {
						b.Fatal(err)
					}
				}
				time.Sleep(1500 * time.Millisecond)
				b.ResetTimer()
				var wg sync.WaitGroup
				const workers = 8
				for w := 0; w < workers; w++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for i := w; i < b.N; i += workers {
							k := fmt.Sprintf("key%08d", i)
							if keys == "hot" {
								k = fmt.Sprintf("hot%03d", i%64)
							}
							if err := tr.Put(ctx, []byte(k), make([]byte, 256)); err != nil {
								b.Error(err)
								return
							}
						}
					}()
				}
				wg.Wait()
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "puts/s")
			})
		}
	}
}
