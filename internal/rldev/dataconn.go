package rldev

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/transport"
)

// The node's end of the framed data path (frames.go): connections the
// port's guard hands over, and the peer links this node dials.

// Bounds and timers of the data path.
const (
	// connBuffer is the size of a data connection's read buffer (larger
	// frames are read past it) and of a peer link's write buffer.
	connBuffer = 256 << 10
	// maxDataConns bounds the data-path connections a node serves.
	maxDataConns = 256
	// pingEvery is how often an idle end pings; linkIdle how long one
	// waits for any frame before it drops the connection (gRPC's
	// keepalive did the same).
	pingEvery = time.Second
	linkIdle  = transport.UserTimeout
)

// ServeConn serves a data-path connection whose magic the port's guard
// read; it returns when the connection ends. At most maxDataConns are
// served at once (more are closed at once).
func (s *Service) ServeConn(c net.Conn) {
	defer c.Close()
	select {
	case s.dataConns <- struct{}{}:
		defer func() { <-s.dataConns }()
	default:
		s.warn("too many data-path connections", "from", c.RemoteAddr(), "limit", maxDataConns)
		return
	}
	stop := context.AfterFunc(s.ctx, func() { c.Close() }) // the service's Close ends it
	defer stop()
	c.SetReadDeadline(time.Now().Add(transport.PrefaceTimeout))
	br := bufio.NewReaderSize(c, connBuffer)
	kind, err := readPreamble(br)
	if err != nil {
		s.warn("rldev data path: connection dropped", "from", c.RemoteAddr(), "err", err)
		return
	}
	var cc *clientConn
	if kind == connClientSeq {
		var b [16]byte
		if _, err := io.ReadFull(br, b[:]); err != nil {
			s.warn("rldev data path: connection dropped", "from", c.RemoteAddr(), "err", err)
			return
		}
		cc = &clientConn{c: c, clerk: binary.BigEndian.Uint64(b[:8]), seq: binary.BigEndian.Uint64(b[8:])}
		if err := s.admitClerkConn(cc); err != nil {
			s.warn("rldev data path: connection dropped", "from", c.RemoteAddr(), "err", err)
			return
		}
		defer s.endClerkConn(cc)
	}
	c.SetReadDeadline(time.Time{})
	switch kind {
	case connClient, connClientSeq:
		s.serveClient(c, br, cc)
	case connPeer:
		s.servePeerConn(c, br)
	}
}

// clientConn is a clerk's sequenced data connection (connClientSeq).
type clientConn struct {
	c          net.Conn
	clerk, seq uint64
	superseded bool // under s.mu: a later connection of the clerk opened
}

// clerkConns is what a node knows of one clerk's sequenced connections.
type clerkConns struct {
	seq   uint64      // the latest admitted
	cur   *clientConn // nil once it ended
	ended time.Time
}

// errSuperseded: a request read on a clerk's connection after a later
// connection of the same clerk opened here; it is dropped with the
// connection, unanswered (the clerk has given that connection up).
var errSuperseded = errors.New("rldev data path: a later connection of this clerk has opened")

// clerkForget is how long a node remembers a clerk whose connections all
// ended: a connection older than its last, held up in the network longer
// than this before its preamble arrives, would be admitted again.
const clerkForget = 10 * time.Minute

// admitClerkConn admits cc if it is the latest of its clerk's connections
// here, and supersedes the one before it: from then on that one starts
// nothing more on the engine (begin checks, under the same lock) and is
// closed. So a write whose answer the clerk lost, with the connection it
// was sent on, and which the clerk then sent again on a later connection,
// either was started on the engine before the retry — and lands before it:
// the engine orders writes of overlapping blocks as they start — or never
// starts. Without this, its frame could be read after the retry was
// answered, and land over whatever the clerk wrote to those blocks next
// (review 36). A write given up on a live connection is sent again on that
// connection, behind the first.
func (s *Service) admitClerkConn(cc *clientConn) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if s.mu.clerks == nil {
		s.mu.clerks = map[uint64]*clerkConns{}
	}
	if now.Sub(s.mu.clerksPruned) > time.Minute || len(s.mu.clerks) >= clerkMax {
		s.pruneClerksLocked(now)
	}
	k := s.mu.clerks[cc.clerk]
	if k == nil {
		k = &clerkConns{}
		s.mu.clerks[cc.clerk] = k
	}
	if cc.seq <= k.seq {
		return fmt.Errorf("%w: connection %d of clerk %x opened after its connection %d", errFrame, cc.seq, cc.clerk, k.seq)
	}
	if old := k.cur; old != nil {
		old.superseded = true
		old.c.Close() // its reader, and the requests it started, end
	}
	k.seq, k.cur = cc.seq, cc
	return nil
}

// clerkMax bounds the clerks a node remembers (every CLI command is a
// clerk of its own; the connections themselves are bounded by
// maxDataConns, so most remembered clerks have none open).
const clerkMax = 16384

// pruneClerksLocked forgets the clerks whose connections all ended more
// than clerkForget ago and, if it found clerkMax remembered, those whose
// connections ended longest ago, down to half of it.
func (s *Service) pruneClerksLocked(now time.Time) {
	s.mu.clerksPruned = now
	full := len(s.mu.clerks) >= clerkMax
	var ended []uint64
	for id, k := range s.mu.clerks {
		switch {
		case k.cur != nil:
		case now.Sub(k.ended) > clerkForget:
			delete(s.mu.clerks, id)
		default:
			ended = append(ended, id)
		}
	}
	if !full {
		return
	}
	slices.SortFunc(ended, func(a, b uint64) int { return s.mu.clerks[a].ended.Compare(s.mu.clerks[b].ended) })
	for _, id := range ended {
		if len(s.mu.clerks) <= clerkMax/2 {
			break
		}
		delete(s.mu.clerks, id)
	}
}

// endClerkConn notes that cc ended.
func (s *Service) endClerkConn(cc *clientConn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if k := s.mu.clerks[cc.clerk]; k != nil && k.cur == cc {
		k.cur, k.ended = nil, time.Now()
	}
}

// warn logs a data-path problem, at most once per key every few seconds
// (a flood of bad connections must not flood the log).
func (s *Service) warn(msg string, args ...any) {
	if ok, n := s.warned.Allow(msg); ok {
		s.log.Warn(msg, append(args, "suppressed", n)...)
	}
}

// serveClient answers a clerk's requests, in the order they end. The
// connection's reader starts each request on the engine as it is read;
// replies are queued on its writer from the engine's effects. A request
// past the connection's bounds (maxPipelined requests, maxInflight bytes
// asked) is refused at once as busy (the clerk tries again), so that the
// reader never stops for them and still reads the cancels that free them.
// A request the clerk gave up (a cancel frame), and every one still in
// progress when the connection ends, is cancelled on the engine (a write
// may still land, as with a gRPC call cancelled). The node pings the
// clerk every pingEvery, so that a clerk notices a stopped node.
func (s *Service) serveClient(c net.Conn, br *bufio.Reader, cc *clientConn) {
	w := newFrameWriter(c)
	defer w.close(net.ErrClosed)
	go pinger(w)
	type live struct {
		g    *generation
		req  ReqID
		id   uint64 // the clerk's
		size int64
	}
	// Guarded by s.mu: the requests in progress, by waiter and by the
	// clerk's id, and what they ask for.
	open := map[*waiter]*live{}
	byID := map[uint64]*waiter{}
	var asked int64
	end := func(wt *waiter) { // under s.mu
		if l := open[wt]; l != nil {
			delete(open, wt)
			delete(byID, l.id)
			asked -= l.size
		}
	}
	cancel := func(wt *waiter) { // under s.mu
		if l := open[wt]; l != nil && s.mu.reqs[l.req] == wt {
			delete(s.mu.reqs, l.req)
			delete(s.mu.loans, l.req)
			if s.mu.gen == l.g && s.mu.eng != nil {
				l.g.e.Cancel(l.req)
			}
		}
		end(wt)
	}
	defer func() {
		s.mu.Lock()
		for wt := range open {
			cancel(wt)
		}
		s.mu.Unlock()
	}()
	answer := func(respond func(Reply, uint64, uint64) ([]byte, []byte, error), err error) bool {
		buf, bulk, err := respond(Reply{Err: err}, 0, 0)
		if err == nil {
			_, err = w.send(buf, bulk)
		}
		return err == nil
	}
	for {
		// The replies not sent yet are bounded too: a clerk that does not
		// read them is not read from.
		if w.waitRoom(maxQueued) != nil {
			return
		}
		f, err := readFrame(br, c, 0)
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				s.warn("rldev data path: client connection dropped", "from", c.RemoteAddr(), "err", err)
			}
			return
		}
		if f.typ == frameCancel {
			s.mu.Lock()
			if wt := byID[f.id]; wt != nil {
				cancel(wt)
			}
			s.mu.Unlock()
			continue
		}
		start, id, size, respond, err := clientRequest(f)
		if err != nil && (errors.Is(err, errFrame) || start == nil && !errors.Is(err, ErrBadRequest)) {
			s.warn("rldev data path: client connection dropped", "from", c.RemoteAddr(), "err", err)
			return
		}
		if err != nil { // a request that is well formed but wrong: answered
			if !answer(respond, err) {
				return
			}
			continue
		}
		wt := &waiter{write: f.typ == frameWrite, id: id}
		s.mu.Lock()
		nopen := len(open)
		busy := nopen >= maxPipelined || nopen > 0 && asked+size > maxInflight || byID[f.id] != nil
		if !busy {
			l := &live{id: f.id, size: size}
			open[wt], byID[f.id] = l, wt
			asked += size
		}
		s.mu.Unlock()
		if busy {
			if !answer(respond, fmt.Errorf("%w: node %d: this connection has %d requests in progress (at most %d, or %d bytes)",
				ErrNotServing, s.cfg.Node, nopen, maxPipelined, maxInflight)) {
				return
			}
			continue
		}
		wt.fn = func(r Reply, back func()) { // under s.mu
			end(wt)
			buf, bulk, err := respond(r, s.epochLocked(id), wt.inc)
			if err != nil {
				w.close(err)
				return
			}
			w.sendThen(back, buf, bulk)
		}
		g, req, err := s.begin(wt, start, cc)
		if errors.Is(err, errSuperseded) {
			s.mu.Lock()
			end(wt)
			s.mu.Unlock()
			return
		}
		s.mu.Lock()
		if l := open[wt]; l != nil {
			if err != nil {
				end(wt)
			} else {
				l.g, l.req = g, req
			}
		}
		s.mu.Unlock()
		if err != nil && !answer(respond, err) {
			return
		}
	}
}

// pinger sends a ping on w every pingEvery until w fails.
func pinger(w *frameWriter) {
	t := time.NewTicker(pingEvery)
	defer t.Stop()
	ping, _ := encodeFrame(framePing, 0, nil, 0)
	for {
		select {
		case <-t.C:
			if _, err := w.send(ping); err != nil {
				return
			}
		case <-w.done:
			return
		}
	}
}

// clientRequest decodes a client's request frame: how to start it, its
// RLDev, and how to encode its reply. An error wrapping errFrame (or a
// meta that does not decode: start is nil) ends the connection; one
// wrapping ErrBadRequest is answered.
func clientRequest(f frame) (start func(e *Engine, env Env, req ReqID) []any, id uint64, size int64, respond func(r Reply, epoch, inc uint64) ([]byte, []byte, error), err error) {
	respond = func(Reply, uint64, uint64) ([]byte, []byte, error) { return nil, nil, errFrame }
	switch f.typ {
	case frameRead:
		var m pb.RLDevServiceReadRequest
		if err = proto.Unmarshal(f.meta, &m); err == nil && len(f.bulk) != 0 {
			err = fmt.Errorf("%w: a read request with data", errFrame)
		}
		if err == nil {
			id, size = m.Rldev, int64(m.Length)
			start, err = readStart(&m)
		}
		respond = func(r Reply, epoch, inc uint64) ([]byte, []byte, error) {
			buf, err := encodeFrame(frameReadResp, f.id, &pb.RLDevServiceReadResponse{Result: ResultOf(r.Err, epoch, inc)}, len(r.Data))
			return buf, r.Data, err
		}
	case frameWrite:
		var m pb.RLDevServiceWriteRequest
		if err = proto.Unmarshal(f.meta, &m); err == nil && len(m.Data) != 0 {
			err = fmt.Errorf("%w: a write request's data in its meta", errFrame)
		}
		if err == nil {
			m.Data, id, size = f.bulk, m.Rldev, int64(len(f.bulk))
			start, err = writeStart(&m)
		}
		respond = func(r Reply, epoch, inc uint64) ([]byte, []byte, error) {
			res := ResultOf(r.Err, epoch, inc)
			res.LandedBefore = r.LandedBefore
			buf, err := encodeFrame(frameWriteResp, f.id, &pb.RLDevServiceWriteResponse{Result: res}, 0)
			return buf, nil, err
		}
	default:
		err = fmt.Errorf("%w: type %d from a client", errFrame, f.typ)
	}
	return start, id, size, respond, err
}

// servePeerConn accepts a link from another node's engine over the data
// path: a hello each way, then the peer's messages, delivered as they are
// read (every whole frame already buffered in one turn of the engine).
// Both ends ping every pingEvery; a link silent for linkIdle is dropped
// (a stopped process whose kernel still answers).
func (s *Service) servePeerConn(c net.Conn, br *bufio.Reader) {
	f, err := readFrame(br, c, transport.PrefaceTimeout)
	var h pb.RLDevHello
	if err == nil && f.typ != frameHello {
		err = fmt.Errorf("%w: the first frame of a link must be a hello", errFrame)
	}
	if err == nil {
		err = proto.Unmarshal(f.meta, &h)
	}
	if err != nil {
		s.warn("rldev data path: link dropped", "from", c.RemoteAddr(), "err", err)
		return
	}
	in, err := s.acceptPeer(context.Background(), &h)
	if err != nil {
		s.log.Info("rldev data path: link refused", "from", c.RemoteAddr(), "err", err)
		return
	}
	defer in.close()
	w := newFrameWriter(c)
	defer w.close(net.ErrClosed)
	stop := context.AfterFunc(in.ctx, func() { w.close(net.ErrClosed) })
	defer stop()
	buf, err := encodeFrame(frameHello, 0, in.hello, 0)
	if err != nil {
		return
	}
	if _, err := w.send(buf); err != nil {
		return
	}
	go pinger(w)
	var batch []*pb.RLDevServicePeerRequest
	for {
		batch = batch[:0]
		for first := true; first || frameReady(br); first = false {
			f, err := readFrame(br, c, linkIdle)
			if err == nil && f.typ == framePing {
				continue
			}
			if err == nil && f.typ != framePeer {
				err = fmt.Errorf("%w: type %d on a link", errFrame, f.typ)
			}
			m := new(pb.RLDevServicePeerRequest)
			if err == nil {
				err = proto.Unmarshal(f.meta, m)
			}
			if err == nil {
				err = joinBulk(m, f.bulk)
			}
			if err != nil {
				if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && in.ctx.Err() == nil {
					s.warn("rldev data path: link dropped", "from", in.from, "err", err)
				}
				return
			}
			batch = append(batch, m)
		}
		if len(batch) > 0 {
			if err := in.deliver(batch...); err != nil {
				return
			}
		}
	}
}

// dialPeerTCP opens a link over the data path and exchanges hellos. The
// link ends (cancel) when the connection does, or when nothing (not even
// a ping) came from the peer for linkIdle.
func (s *Service) dialPeerTCP(ctx context.Context, cancel context.CancelFunc, addr string, hello *pb.RLDevHello) (peerOut, *pb.RLDevHello, error) {
	dctx, dcancel := context.WithTimeout(ctx, 5*time.Second)
	defer dcancel()
	c, err := transport.DialContext(dctx, addr)
	if err != nil {
		return nil, nil, err
	}
	context.AfterFunc(ctx, func() { c.Close() })
	buf, err := encodeFrame(frameHello, 0, hello, 0)
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	bw := bufio.NewWriterSize(c, connBuffer)
	bw.Write(preamble(connPeer))
	bw.Write(buf)
	if err := bw.Flush(); err != nil {
		c.Close()
		return nil, nil, err
	}
	br := bufio.NewReaderSize(c, 4096)
	f, err := readFrame(br, c, 5*time.Second)
	var h pb.RLDevHello
	if err == nil && f.typ != frameHello {
		err = fmt.Errorf("%w: the answer to a hello is type %d", errFrame, f.typ)
	}
	if err == nil {
		err = proto.Unmarshal(f.meta, &h)
	}
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	go func() {
		// Only pings come back after the hello.
		for {
			f, err := readFrame(br, c, linkIdle)
			if err != nil || f.typ != framePing {
				cancel()
				return
			}
		}
	}()
	return &tcpPeerOut{bw: bw}, &h, nil
}

type tcpPeerOut struct {
	bw *bufio.Writer
}

func (o *tcpPeerOut) send(f *pb.RLDevServicePeerRequest) error {
	bulk := splitBulk(f)
	buf, err := encodeFrame(framePeer, 0, f, len(bulk))
	if err != nil {
		return err
	}
	if _, err = o.bw.Write(buf); err != nil {
		return err
	}
	_, err = o.bw.Write(bulk)
	return err
}

func (o *tcpPeerOut) flush() error { return o.bw.Flush() }

func (o *tcpPeerOut) ping() error {
	p, _ := encodeFrame(framePing, 0, nil, 0)
	o.bw.Write(p)
	return o.bw.Flush()
}
