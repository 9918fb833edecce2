package rldev

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"slices"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/grovestore/grove/api/grovepb"
)

// The framed TCP data path.
//
// RLDev blocks travel between clerks and nodes, and between the two
// replicas of an RLDev, on plain TCP connections to the node's gRPC port
// (the port's guard tells them from gRPC by their first bytes); the
// control calls (status, moves, the config service) stay on gRPC. Through
// gRPC every message is an HTTP/2 stream or frame with its flow control,
// a handful of goroutine hand-offs on each side and a write system call
// of its own; here a connection's reader delivers each frame where it is
// read, and its writer sends every frame queued meanwhile in one writev.
// `grove bench rldev --data-path` measures both.
//
// A connection opens with WireMagic, a version byte and a kind byte
// (connClient: a clerk's requests, answered in any order; connClientSeq:
// the same, with the clerk's identity and the connection's sequence
// number, two u64s, after the kind byte: see Service.admitClerkConn;
// connPeer: an engine's peer link, whose first frame each way is a
// hello). Then frames, each:
//
//	u32 length of what follows | u8 type | u64 request id | u32 meta length | meta | bulk
//
// meta is a protocol-buffer message (api/rldev.proto); bulk is the raw
// data of a write request or a read response (kept out of meta so that
// neither side copies it again). Request ids are the client's, echoed in
// the response. Both ends close the connection on a frame they cannot
// decode; a request or a peer message that is lost with a connection is
// what the gRPC path loses with a stream: the clerk tries again (a write
// then counts as maybe written), the engine resends what matters.
// FeatureSeqConns, in a node's membership record (pb.Node.Features), says
// its build sequences a clerk's data-path connections (connClientSeq).
// A clerk opens such connections only to nodes that say so: an earlier
// build, met in a rolling upgrade, refuses them; with it the clerk opens
// connClient ones, and WriteReport counts their lost attempts as it does
// on gRPC.
const FeatureSeqConns = "rldev.seq-conns"

const (
	// WireMagic opens every data-path connection.
	WireMagic   = "GRVD"
	wireVersion = 1

	connClient    = 1
	connPeer      = 2
	connClientSeq = 3

	frameHello     = 1 // meta: RLDevHello
	framePeer      = 2 // meta: RLDevServicePeerRequest
	frameRead      = 3 // meta: RLDevServiceReadRequest
	frameWrite     = 4 // meta: RLDevServiceWriteRequest without its data; bulk: the data
	frameReadResp  = 5 // meta: RLDevServiceReadResponse without its data; bulk: the data
	frameWriteResp = 6 // meta: RLDevServiceWriteResponse
	framePing      = 7 // nothing: the sender is alive
	frameCancel    = 8 // nothing: the client gave up request id

	frameHeader = 4 + 1 + 8 + 4
	// maxFrame bounds what follows a frame's length: the largest request
	// (MaxIO) or peer message (a copy or pull of at most MaxIO, with one
	// generation per block) and its metadata.
	maxFrame = MaxIO + MaxIO/BlockSize*8 + 64<<10

	// maxPipelined and maxInflight bound a client connection's requests in
	// progress on a node (more are refused as busy), maxQueued the bytes of
	// its replies not sent yet (its reader waits).
	maxPipelined = 256
	maxInflight  = 64 << 20
	maxQueued    = 64 << 20
	// frameTimeout bounds the time a frame's body takes to arrive once its
	// header has.
	frameTimeout = 30 * time.Second
)

// errFrame marks a malformed frame; the connection is closed.
var errFrame = errors.New("rldev data path: malformed frame")

// frame is one decoded frame; meta and bulk share one buffer.
type frame struct {
	typ  byte
	id   uint64
	meta []byte
	bulk []byte
}

// encodeFrame returns a frame's header and meta in one buffer; the caller
// sends bulk (bulkLen bytes) right after it.
func encodeFrame(typ byte, id uint64, meta proto.Message, bulkLen int) ([]byte, error) {
	buf := make([]byte, frameHeader, frameHeader+64)
	if meta != nil {
		var err error
		buf = slices.Grow(buf, proto.Size(meta))
		if buf, err = (proto.MarshalOptions{}).MarshalAppend(buf, meta); err != nil {
			return nil, err
		}
	}
	n := len(buf) - 4 + bulkLen
	if n > maxFrame {
		return nil, fmt.Errorf("%w: a %d-byte frame (at most %d)", ErrBadRequest, n, maxFrame)
	}
	binary.BigEndian.PutUint32(buf, uint32(n))
	buf[4] = typ
	binary.BigEndian.PutUint64(buf[5:], id)
	binary.BigEndian.PutUint32(buf[13:], uint32(len(buf)-frameHeader))
	return buf, nil
}

// parseHeader checks a frame's header: the length of its body (meta and
// bulk), its type, request id and meta length.
func parseHeader(h []byte) (body int, typ byte, id uint64, meta int, err error) {
	if len(h) < frameHeader {
		return 0, 0, 0, 0, fmt.Errorf("%w: a %d-byte header", errFrame, len(h))
	}
	n := binary.BigEndian.Uint32(h)
	typ, id, m := h[4], binary.BigEndian.Uint64(h[5:]), binary.BigEndian.Uint32(h[13:])
	switch {
	case n < frameHeader-4 || n > maxFrame:
		return 0, 0, 0, 0, fmt.Errorf("%w: length %d (at most %d)", errFrame, n, maxFrame)
	case typ < frameHello || typ > frameCancel:
		return 0, 0, 0, 0, fmt.Errorf("%w: unknown type %d", errFrame, typ)
	case m > n-(frameHeader-4):
		return 0, 0, 0, 0, fmt.Errorf("%w: %d bytes of meta in a %d-byte frame", errFrame, m, n)
	}
	body = int(n) - (frameHeader - 4)
	return body, typ, id, int(m), nil
}

// readFrame reads the next frame from r, the reader of c (nil: no
// deadlines): within idle if idle > 0, and its body within frameTimeout
// of its header.
func readFrame(r *bufio.Reader, c net.Conn, idle time.Duration) (frame, error) {
	return readFrameTo(r, c, idle, nil)
}

// readFrameTo is readFrame, where dst, if not nil, may give the buffer a
// frame's bulk is read into: asked once the frame's header is here, it
// returns a buffer of exactly bulkLen bytes and a check, or nil for a new
// buffer. The bulk is read into the buffer as it arrives, the check asked
// before each read (each returns what the connection holds: a slow stream
// is checked often, a fast one in large reads straight from the socket,
// past the reader's buffer); once it says no, the rest of the bulk is
// read into nothing and the frame returned without it.
func readFrameTo(r *bufio.Reader, c net.Conn, idle time.Duration, dst func(typ byte, id uint64, bulkLen int) ([]byte, func() bool)) (frame, error) {
	if c != nil {
		var d time.Time
		if idle > 0 && r.Buffered() < frameHeader {
			d = time.Now().Add(idle)
		}
		c.SetReadDeadline(d)
	}
	var h [frameHeader]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return frame{}, err
	}
	body, typ, id, m, err := parseHeader(h[:])
	if err != nil {
		return frame{}, err
	}
	if c != nil && r.Buffered() < body {
		c.SetReadDeadline(time.Now().Add(frameTimeout))
	}
	if dst != nil && body > m {
		if bulk, still := dst(typ, id, body-m); bulk != nil {
			if len(bulk) != body-m {
				panic(fmt.Sprintf("rldev: a bulk buffer of %d bytes for %d", len(bulk), body-m))
			}
			meta := make([]byte, m)
			_, err := io.ReadFull(r, meta)
			for off := 0; err == nil && off < len(bulk); {
				if !still() {
					if _, err = io.CopyN(io.Discard, r, int64(len(bulk)-off)); err == nil {
						return frame{typ: typ, id: id, meta: meta}, nil // its call ended: nobody wants it
					}
					break
				}
				var k int
				k, err = r.Read(bulk[off:])
				off += k
			}
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			if err != nil {
				return frame{}, err
			}
			return frame{typ: typ, id: id, meta: meta, bulk: bulk}, nil
		}
	}
	// The body is allocated once its first bytes (up to the read
	// buffer's size) are here: a header alone, a length with nothing
	// behind it, pins no more than the buffer.
	if r.Buffered() < body {
		if _, err := r.Peek(min(body, r.Size())); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return frame{}, err
		}
	}
	buf := make([]byte, body)
	if _, err := io.ReadFull(r, buf); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return frame{}, err
	}
	return frame{typ: typ, id: id, meta: buf[:m], bulk: buf[m:]}, nil
}

// frameReady reports whether r holds a whole frame already (reading it
// will not block).
func frameReady(r *bufio.Reader) bool {
	if r.Buffered() < frameHeader {
		return false
	}
	h, _ := r.Peek(frameHeader)
	body, _, _, _, err := parseHeader(h)
	return err != nil || r.Buffered() >= frameHeader+body
}

// preamble is what a client of kind sends first.
func preamble(kind byte) []byte { return append([]byte(WireMagic), wireVersion, kind) }

// clientPreamble is what a clerk sends first: connClientSeq, its identity
// and the connection's sequence number (among its connections, every
// node's: later dials have higher ones).
func clientPreamble(clerk, seq uint64) []byte {
	b := preamble(connClientSeq)
	b = binary.BigEndian.AppendUint64(b, clerk)
	return binary.BigEndian.AppendUint64(b, seq)
}

// readPreamble reads the version and kind that follow the magic (which
// the port's guard consumed).
func readPreamble(r io.Reader) (byte, error) {
	var b [2]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return 0, err
	}
	if b[0] != wireVersion {
		return 0, fmt.Errorf("%w: version %d (this node speaks %d)", errFrame, b[0], wireVersion)
	}
	if b[1] != connClient && b[1] != connPeer && b[1] != connClientSeq {
		return 0, fmt.Errorf("%w: connection kind %d", errFrame, b[1])
	}
	return b[1], nil
}

// frameWriter sends the frames queued on a connection: whatever was
// queued while the last batch was being written goes in one writev.
// Sending never blocks; a failed write closes the connection, and every
// later send fails.
type frameWriter struct {
	c      net.Conn
	mu     sync.Mutex
	q      net.Buffers
	after  []func()  // run once the frames queued so far are written (sendThen)
	queued int64     // bytes queued or being written
	room   sync.Cond // signalled when queued drops
	seq    uint64    // sends so far
	sent   uint64    // sends written whole
	err    error
	wake   chan struct{}
	done   chan struct{}
	exited chan struct{} // closed when the writer no longer touches any buffer
	// join: when one send is queued, let the goroutines ready to run go
	// first (runtime.Gosched) so that the sends they make go out with it
	// (the clerk's: see newClerkFrameWriter).
	join bool
}

func newFrameWriter(c net.Conn) *frameWriter { return startFrameWriter(c, false) }

func startFrameWriter(c net.Conn, join bool) *frameWriter {
	w := &frameWriter{c: c, wake: make(chan struct{}, 1), done: make(chan struct{}), exited: make(chan struct{}), join: join}
	w.room.L = &w.mu
	go w.run()
	return w
}

// newClerkFrameWriter is a clerk's frameWriter: its callers, each with
// one request at a time, are woken together by a read of several replies
// and send their next requests within microseconds of each other. Without
// joining them a clerk at queue depth 32 made 0.89 writev calls per 4 KiB
// write (perf stat), each a system call and a wake-up of the node's
// reader.
func newClerkFrameWriter(c net.Conn) *frameWriter { return startFrameWriter(c, true) }

// written reports whether the send numbered seq was written whole.
func (w *frameWriter) written(seq uint64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.sent >= seq
}

// waitRoom waits until at most limit bytes are queued.
func (w *frameWriter) waitRoom(limit int64) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	for w.queued > limit && w.err == nil {
		w.room.Wait()
	}
	return w.err
}

// send queues bufs (one frame, or several) and returns their number: the
// buffers are the writer's until written(seq) or the writer exited.
func (w *frameWriter) send(bufs ...[]byte) (uint64, error) { return w.sendThen(nil, bufs...) }

// sendThen is send, and then, if not nil, runs on the writer's goroutine
// once the writev that carried bufs returned, whether it wrote them or
// failed: from then on the writer holds none of them. If they are never
// taken to be written (the connection failed first), then never runs.
func (w *frameWriter) sendThen(then func(), bufs ...[]byte) (uint64, error) {
	w.mu.Lock()
	if w.err != nil {
		w.mu.Unlock()
		return 0, w.err
	}
	if then != nil {
		w.after = append(w.after, then)
	}
	for _, b := range bufs {
		if len(b) > 0 {
			w.q = append(w.q, b)
			w.queued += int64(len(b))
		}
	}
	w.seq++
	seq := w.seq
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
	return seq, nil
}

func (w *frameWriter) run() {
	defer close(w.exited)
	for {
		select {
		case <-w.wake:
		case <-w.done:
			return
		}
		if w.join {
			w.mu.Lock()
			one := w.seq == w.sent+1
			w.mu.Unlock()
			if one {
				runtime.Gosched()
			}
		}
		w.mu.Lock()
		q, upTo, after := w.q, w.seq, w.after
		w.q, w.after = nil, nil
		w.mu.Unlock()
		if len(q) == 0 {
			for _, f := range after {
				f()
			}
			continue
		}
		n, err := q.WriteTo(w.c)
		for _, f := range after {
			f()
		}
		if err != nil {
			w.close(err)
			return
		}
		w.mu.Lock()
		w.queued -= n
		w.sent = upTo
		w.room.Broadcast()
		w.mu.Unlock()
	}
}

// close fails every later send with err and closes the connection.
func (w *frameWriter) close(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return
	}
	w.err = err
	w.q, w.after = nil, nil
	w.room.Broadcast()
	close(w.done)
	w.c.Close()
}

// splitBulk takes a peer message's blocks out of it, to travel as its
// frame's bulk (not copied into and out of the meta); joinBulk puts them
// back on arrival.
func splitBulk(f *pb.RLDevServicePeerRequest) []byte {
	var d []byte
	switch x := f.Msg.(type) {
	case *pb.RLDevServicePeerRequest_Forward:
		if x.Forward != nil {
			d, x.Forward.Data = x.Forward.Data, nil
		}
	case *pb.RLDevServicePeerRequest_PullData:
		if x.PullData != nil {
			d, x.PullData.Data = x.PullData.Data, nil
		}
	case *pb.RLDevServicePeerRequest_Copy:
		if x.Copy != nil {
			d, x.Copy.Data = x.Copy.Data, nil
		}
	}
	return d
}

func joinBulk(f *pb.RLDevServicePeerRequest, bulk []byte) error {
	if len(bulk) == 0 {
		return nil
	}
	var dst *[]byte
	switch x := f.Msg.(type) {
	case *pb.RLDevServicePeerRequest_Forward:
		if x.Forward != nil {
			dst = &x.Forward.Data
		}
	case *pb.RLDevServicePeerRequest_PullData:
		if x.PullData != nil {
			dst = &x.PullData.Data
		}
	case *pb.RLDevServicePeerRequest_Copy:
		if x.Copy != nil {
			dst = &x.Copy.Data
		}
	}
	if dst == nil || len(*dst) != 0 {
		return fmt.Errorf("%w: %d bytes of bulk on a message that carries none or has its own", errFrame, len(bulk))
	}
	*dst = bulk
	return nil
}
