package rldev

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/transport"
)

// The node's end of the framed data path (frames.go): connections the
// port's guard hands over, and the peer links this node dials.

// connBuffer is the size of a data connection's read buffer and of a peer
// link's write buffer.
const connBuffer = 256 << 10

// ServeConn serves a data-path connection whose magic the port's guard
// read; it returns when the connection ends.
func (s *Service) ServeConn(c net.Conn) {
	defer c.Close()
	stop := context.AfterFunc(s.ctx, func() { c.Close() }) // the service's Close ends it
	defer stop()
	c.SetReadDeadline(time.Now().Add(transport.PrefaceTimeout))
	br := bufio.NewReaderSize(c, connBuffer)
	kind, err := readPreamble(br)
	if err != nil {
		s.log.Warn("rldev data path: connection dropped", "from", c.RemoteAddr(), "err", err)
		return
	}
	c.SetReadDeadline(time.Time{})
	switch kind {
	case connClient:
		s.serveClient(c, br)
	case connPeer:
		s.servePeerConn(c, br)
	}
}

// serveClient answers a clerk's requests, in the order they end. The
// connection's reader starts each request on the engine as it is read (at
// most maxPipelined at once); replies are queued on its writer from the
// engine's effects. Requests still in progress when the connection ends
// are cancelled (a write may still land, as with a gRPC call cancelled).
func (s *Service) serveClient(c net.Conn, br *bufio.Reader) {
	w := newFrameWriter(c)
	defer w.close(net.ErrClosed)
	slots := make(chan struct{}, maxPipelined)
	type live struct {
		g   *generation
		req ReqID
	}
	open := map[*waiter]live{} // guarded by s.mu
	defer func() {
		s.mu.Lock()
		for wt, l := range open {
			if s.mu.reqs[l.req] == wt {
				delete(s.mu.reqs, l.req)
				if s.mu.gen == l.g && s.mu.eng != nil {
					l.g.e.Cancel(l.req)
				}
			}
		}
		s.mu.Unlock()
	}()
	for {
		f, err := readFrame(br)
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				s.log.Warn("rldev data path: client connection dropped", "from", c.RemoteAddr(), "err", err)
			}
			return
		}
		start, id, respond, err := clientRequest(f)
		if err != nil && (errors.Is(err, errFrame) || start == nil && !errors.Is(err, ErrBadRequest)) {
			s.log.Warn("rldev data path: client connection dropped", "from", c.RemoteAddr(), "err", err)
			return
		}
		if err != nil { // a request that is well formed but wrong: answered
			buf, bulk, err := respond(Reply{Err: err}, 0)
			if err != nil || w.send(buf, bulk) != nil {
				return
			}
			continue
		}
		// Bounded: replies free slots, and the writer's queue drains.
		slots <- struct{}{}
		if w.waitRoom(maxQueued) != nil {
			return
		}
		wt := &waiter{write: f.typ == frameWrite, id: id}
		wt.fn = func(r Reply) { // under s.mu
			delete(open, wt)
			<-slots
			buf, bulk, err := respond(r, s.epochLocked(id))
			if err != nil {
				w.close(err)
				return
			}
			w.send(buf, bulk)
		}
		s.mu.Lock()
		open[wt] = live{}
		s.mu.Unlock()
		g, req, err := s.begin(wt, start)
		s.mu.Lock()
		if err != nil {
			delete(open, wt)
			<-slots
		} else if _, ok := open[wt]; ok {
			open[wt] = live{g, req}
		}
		s.mu.Unlock()
		if err != nil {
			buf, bulk, err := respond(Reply{Err: err}, 0)
			if err != nil || w.send(buf, bulk) != nil {
				return
			}
		}
	}
}

// clientRequest decodes a client's request frame: how to start it, its
// RLDev, and how to encode its reply. An error wrapping errFrame (or a
// meta that does not decode: start is nil) ends the connection; one
// wrapping ErrBadRequest is answered.
func clientRequest(f frame) (start func(e *Engine, env Env, req ReqID) []any, id uint64, respond func(r Reply, epoch uint64) ([]byte, []byte, error), err error) {
	respond = func(Reply, uint64) ([]byte, []byte, error) { return nil, nil, errFrame }
	switch f.typ {
	case frameRead:
		var m pb.RLDevServiceReadRequest
		if err = proto.Unmarshal(f.meta, &m); err == nil && len(f.bulk) != 0 {
			err = fmt.Errorf("%w: a read request with data", errFrame)
		}
		if err == nil {
			id = m.Rldev
			start, err = readStart(&m)
		}
		respond = func(r Reply, epoch uint64) ([]byte, []byte, error) {
			buf, err := encodeFrame(frameReadResp, f.id, &pb.RLDevServiceReadResponse{Result: ResultOf(r.Err, epoch)}, len(r.Data))
			return buf, r.Data, err
		}
	case frameWrite:
		var m pb.RLDevServiceWriteRequest
		if err = proto.Unmarshal(f.meta, &m); err == nil && len(m.Data) != 0 {
			err = fmt.Errorf("%w: a write request's data in its meta", errFrame)
		}
		if err == nil {
			m.Data, id = f.bulk, m.Rldev
			start, err = writeStart(&m)
		}
		respond = func(r Reply, epoch uint64) ([]byte, []byte, error) {
			buf, err := encodeFrame(frameWriteResp, f.id, &pb.RLDevServiceWriteResponse{Result: ResultOf(r.Err, epoch)}, 0)
			return buf, nil, err
		}
	default:
		err = fmt.Errorf("%w: type %d from a client", errFrame, f.typ)
	}
	return start, id, respond, err
}

// servePeerConn accepts a link from another node's engine over the data
// path: a hello each way, then the peer's messages, delivered as they are
// read (every whole frame already buffered in one turn of the engine).
func (s *Service) servePeerConn(c net.Conn, br *bufio.Reader) {
	c.SetReadDeadline(time.Now().Add(transport.PrefaceTimeout))
	f, err := readFrame(br)
	var h pb.RLDevHello
	if err == nil && f.typ != frameHello {
		err = fmt.Errorf("%w: the first frame of a link must be a hello", errFrame)
	}
	if err == nil {
		err = proto.Unmarshal(f.meta, &h)
	}
	if err != nil {
		s.log.Warn("rldev data path: link dropped", "from", c.RemoteAddr(), "err", err)
		return
	}
	c.SetReadDeadline(time.Time{})
	in, err := s.acceptPeer(context.Background(), &h)
	if err != nil {
		s.log.Info("rldev data path: link refused", "from", c.RemoteAddr(), "err", err)
		return
	}
	defer in.close()
	stop := context.AfterFunc(in.ctx, func() { c.Close() })
	defer stop()
	buf, err := encodeFrame(frameHello, 0, in.hello, 0)
	if err != nil {
		return
	}
	if _, err := c.Write(buf); err != nil {
		return
	}
	var batch []*pb.RLDevServicePeerRequest
	for {
		batch = batch[:0]
		for first := true; first || frameReady(br); first = false {
			f, err := readFrame(br)
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
					s.log.Warn("rldev data path: link dropped", "from", in.from, "err", err)
				}
				return
			}
			batch = append(batch, m)
		}
		if err := in.deliver(batch...); err != nil {
			return
		}
	}
}

// dialPeerTCP opens a link over the data path and exchanges hellos. The
// link ends (cancel) when the connection does.
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
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReaderSize(c, 4096)
	f, err := readFrame(br)
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
	c.SetReadDeadline(time.Time{})
	go func() {
		// Nothing comes back after the hello: a read returns when the
		// connection ends.
		io.Copy(io.Discard, br)
		cancel()
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
