package transport

import (
	"bytes"
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// http2Preface is what every HTTP/2 client, hence every gRPC client, sends
// first on a connection.
const http2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// Guard limits: a connection has PrefaceTimeout to send the preface, and at
// most MaxHandshakes connections wait for theirs at once (more are closed:
// a flood of idle connections must not pin memory or file descriptors).
const (
	PrefaceTimeout = 10 * time.Second
	MaxHandshakes  = 256
)

// Guard wraps a gRPC listener so that a connection that does not open with
// the HTTP/2 preface (garbage, a port scan, a client of another protocol)
// is closed before gRPC sees it, and reported to bad with the reason. gRPC
// itself drops such connections without a word. A connection that opens
// with a magic registered by Handle goes to its handler instead (the
// RLDevs' framed data path shares the node's port this way).
func Guard(l net.Listener, bad func(remote net.Addr, reason string)) *Guarded {
	g := &Guarded{Listener: l, conns: make(chan net.Conn), done: make(chan struct{}), bad: bad, sem: make(chan struct{}, MaxHandshakes)}
	go g.acceptLoop()
	return g
}

// Guarded is a guarded listener: its Accept returns gRPC connections.
type Guarded struct {
	net.Listener
	conns chan net.Conn
	done  chan struct{}
	bad   func(remote net.Addr, reason string)
	sem   chan struct{}
	mu    sync.Mutex
	err   error // the underlying Accept's error, once it failed for good
	alt   map[string]func(net.Conn)
	once  sync.Once
}

// MagicSize is the length of a protocol's magic: the first bytes a client
// sends, which the guard reads to tell protocols apart.
const MagicSize = 4

// Handle sends connections that open with magic (MagicSize bytes, not a
// prefix of the HTTP/2 preface) to fn, on a goroutine of their own, with
// the magic consumed. fn owns the connection.
func (g *Guarded) Handle(magic string, fn func(net.Conn)) {
	if len(magic) != MagicSize || magic == http2Preface[:MagicSize] {
		panic("transport: a magic is 4 bytes, and not the HTTP/2 preface's")
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.alt == nil {
		g.alt = map[string]func(net.Conn){}
	}
	g.alt[magic] = fn
}

func (g *Guarded) acceptLoop() {
	for {
		c, err := g.Listener.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			g.mu.Lock()
			g.err = err
			g.mu.Unlock()
			g.Close()
			return
		}
		select {
		case g.sem <- struct{}{}:
		default:
			g.bad(c.RemoteAddr(), "too many connections waiting for their preface")
			c.Close()
			continue
		}
		go g.handshake(c)
	}
}

func (g *Guarded) handshake(c net.Conn) {
	defer func() { <-g.sem }()
	buf := make([]byte, len(http2Preface))
	c.SetReadDeadline(time.Now().Add(PrefaceTimeout))
	n, err := io.ReadFull(c, buf[:MagicSize])
	if err == nil {
		g.mu.Lock()
		fn := g.alt[string(buf[:MagicSize])]
		g.mu.Unlock()
		if fn != nil {
			c.SetReadDeadline(time.Time{})
			go fn(c)
			return
		}
		if string(buf[:MagicSize]) == http2Preface[:MagicSize] {
			var k int
			k, err = io.ReadFull(c, buf[MagicSize:])
			n += k
		}
	}
	switch {
	case err != nil && n == 0:
		g.bad(c.RemoteAddr(), "closed or idle before sending anything")
		c.Close()
		return
	case err != nil || !bytes.Equal(buf, []byte(http2Preface)):
		g.bad(c.RemoteAddr(), "not a gRPC client (no HTTP/2 preface)")
		c.Close()
		return
	}
	c.SetReadDeadline(time.Time{})
	select {
	case g.conns <- &prefixConn{Conn: c, prefix: buf}:
	case <-g.done:
		c.Close()
	}
}

// Accept returns the next connection that sent the preface.
func (g *Guarded) Accept() (net.Conn, error) {
	select {
	case c := <-g.conns:
		return c, nil
	case <-g.done:
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.err != nil {
			return nil, g.err
		}
		return nil, net.ErrClosed
	}
}

func (g *Guarded) Close() error {
	var err error
	g.once.Do(func() {
		close(g.done)
		err = g.Listener.Close()
	})
	return err
}

// prefixConn gives back the bytes the guard read.
type prefixConn struct {
	net.Conn
	prefix []byte
}

func (c *prefixConn) Read(b []byte) (int, error) {
	if len(c.prefix) > 0 {
		n := copy(b, c.prefix)
		c.prefix = c.prefix[n:]
		return n, nil
	}
	return c.Conn.Read(b)
}

// View is a listener over the guard's connections whose Close ends only
// the view: a server that serves for a while (a node deciding whether to
// bootstrap answers its probes) hands the port to the next one without
// closing the socket, so a client's connection attempt is never refused
// in between. A connection is taken by one view's Accept, or by the
// guard's own.
func (g *Guarded) View() net.Listener {
	return &view{g: g, done: make(chan struct{})}
}

type view struct {
	g    *Guarded
	done chan struct{}
	once sync.Once
}

func (v *view) Accept() (net.Conn, error) {
	select {
	case <-v.done:
		return nil, net.ErrClosed
	default:
	}
	select {
	case c := <-v.g.conns:
		select {
		case <-v.done:
			// Closed while taking it: it belongs to the next server.
			go func() {
				select {
				case v.g.conns <- c:
				case <-v.g.done:
					c.Close()
				}
			}()
			return nil, net.ErrClosed
		default:
			return c, nil
		}
	case <-v.done:
		return nil, net.ErrClosed
	case <-v.g.done:
		return v.g.Accept()
	}
}

func (v *view) Close() error {
	v.once.Do(func() { close(v.done) })
	return nil
}

func (v *view) Addr() net.Addr { return v.g.Addr() }
