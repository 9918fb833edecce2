package rldev

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/transport"
)

// dataClient is how a clerk reads and writes blocks on a node: a
// connection of the framed data path (frames.go), or gRPC.
type dataClient interface {
	// Read reads; if dst is not nil and the answer carries len(dst)
	// bytes, they are in dst (and the answer's Data is dst). dst is the
	// caller's again once Read returned, whatever happened.
	Read(ctx context.Context, r *pb.RLDevServiceReadRequest, dst []byte) (*pb.RLDevServiceReadResponse, error)
	Write(ctx context.Context, r *pb.RLDevServiceWriteRequest) (*pb.RLDevServiceWriteResponse, error)
}

type grpcData struct{ cl pb.RLDevServiceClient }

func (g grpcData) Read(ctx context.Context, r *pb.RLDevServiceReadRequest, dst []byte) (*pb.RLDevServiceReadResponse, error) {
	m, err := g.cl.Read(ctx, r)
	if err == nil && dst != nil && len(m.Data) == len(dst) {
		copy(dst, m.Data)
		m.Data = dst
	}
	return m, err
}

func (g grpcData) Write(ctx context.Context, r *pb.RLDevServiceWriteRequest) (*pb.RLDevServiceWriteResponse, error) {
	return g.cl.Write(ctx, r)
}

// dataConn is a clerk's connection to one node on the data path: requests
// are pipelined, each with an id its reply echoes. A connection that
// fails fails every request waiting on it; the next request dials again.
type dataConn struct {
	addr      string
	sequenced bool // opened as kind connClientSeq: the node orders this clerk's connections
	w         *frameWriter
	mu        sync.Mutex
	next      uint64
	wait      map[uint64]*pendingCall
	err       error
}

// pendingCall is a request waiting for its reply. A read with a buffer of
// its caller's (dst) has its reply's blocks read straight into it, so
// that a read allocates (and zeroes) nothing. The reader goroutine marks
// filling, under the connection's lock, before it reads into dst, and
// reads the blocks as they arrive (readFrameTo); a call that ends
// otherwise (given up, the connection lost) marks itself abandoned and,
// if filling, waits for filled: the reader checks before each read, reads
// the rest of an abandoned call's reply into nothing, and closes filled
// once it no longer writes into dst (at the latest when the frame ends,
// read or failed). So nothing writes into dst once the call returned, and
// a reply still streaming costs nothing but its own bytes.
type pendingCall struct {
	ch        chan frame
	dst       []byte
	filling   bool          // under dataConn.mu
	abandoned bool          // under dataConn.mu: the call ended; the reader stops filling
	released  bool          // under dataConn.mu: filled is closed
	filled    chan struct{} // closed when the reader no longer writes into dst
}

// abandon ends p's interest in its reply and waits until the reader no
// longer writes into p's buffer: at most one read, unless the node
// stalls mid-frame, which after settleGrace costs the connection (ending
// it ends the filling at once).
func (d *dataConn) abandon(p *pendingCall) {
	d.mu.Lock()
	p.abandoned = true
	wait := p.filling && !p.released
	d.mu.Unlock()
	if !wait {
		return
	}
	t := time.NewTimer(settleGrace)
	defer t.Stop()
	select {
	case <-p.filled:
	case <-t.C:
		d.fail(errors.New("a read given up while its reply stalled mid-frame"))
		<-p.filled
	}
}

// stillFilling reports whether the reader may read more of p's
// reply into p's buffer; once p is abandoned, it releases the buffer.
func (d *dataConn) stillFilling(p *pendingCall) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if p.abandoned {
		d.releaseLocked(p)
		return false
	}
	return true
}

func (d *dataConn) releaseLocked(p *pendingCall) {
	if !p.released {
		p.released = true
		close(p.filled)
	}
}

// settleGrace is how long a given-up read waits for the read of its reply
// in progress into its caller's buffer (which returns as soon as any of
// the reply arrives).
const settleGrace = 100 * time.Millisecond

// ErrConnLost is a data-path connection that ended with requests on it: a
// write among them may have landed.
var ErrConnLost = errors.New("the connection to the node was lost")

// dialData opens a data-path connection to addr: sequenced (kind
// connClientSeq, with the clerk's identity and the connection's sequence
// number) to a node whose build sequences them, else of the kind every
// build serves (connClient).
func dialData(ctx context.Context, addr string, clerk, seq uint64, sequenced bool) (*dataConn, error) {
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := transport.DialContext(dctx, addr)
	if err != nil {
		return nil, err
	}
	pre := preamble(connClient)
	if sequenced {
		pre = clientPreamble(clerk, seq)
	}
	if _, err := c.Write(pre); err != nil {
		c.Close()
		return nil, err
	}
	d := &dataConn{addr: addr, sequenced: sequenced, w: newClerkFrameWriter(c), wait: map[uint64]*pendingCall{}}
	go d.readLoop(c)
	return d, nil
}

func (d *dataConn) readLoop(c net.Conn) {
	br := bufio.NewReaderSize(c, connBuffer)
	for {
		// The node pings every pingEvery: a node silent for linkIdle
		// (stopped, its kernel still answering) fails the requests.
		var into *pendingCall // the call whose buffer the frame's bulk is read into
		f, err := readFrameTo(br, c, linkIdle, func(typ byte, id uint64, bulkLen int) ([]byte, func() bool) {
			d.mu.Lock()
			defer d.mu.Unlock()
			if p := d.wait[id]; p != nil && typ == frameReadResp && p.dst != nil && len(p.dst) == bulkLen && !p.abandoned {
				into, p.filling = p, true
				return p.dst, func() bool { return d.stillFilling(p) }
			}
			return nil, nil
		})
		if into != nil {
			d.mu.Lock()
			d.releaseLocked(into)
			d.mu.Unlock()
		}
		if err == nil && f.typ == framePing {
			continue
		}
		if err == nil && f.typ != frameReadResp && f.typ != frameWriteResp {
			err = fmt.Errorf("%w: type %d from a node", errFrame, f.typ)
		}
		if err != nil {
			d.fail(err)
			return
		}
		d.mu.Lock()
		p := d.wait[f.id]
		delete(d.wait, f.id)
		d.mu.Unlock()
		if p != nil {
			p.ch <- f
		}
	}
}

// fail ends the connection: every request waiting on it fails.
func (d *dataConn) fail(err error) {
	d.w.close(err)
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.err == nil {
		d.err = err
	}
	for id, p := range d.wait {
		delete(d.wait, id)
		close(p.ch)
	}
}

func (d *dataConn) broken() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.err != nil
}

// call sends one request and waits for its reply; a reply's bulk of
// len(dst) bytes is read into dst (pendingCall), which is the caller's
// again once call returned.
func (d *dataConn) call(ctx context.Context, typ byte, meta proto.Message, bulk []byte, want byte, dst []byte) (frame, error) {
	p := &pendingCall{ch: make(chan frame, 1), dst: dst, filled: make(chan struct{})}
	ch := p.ch
	d.mu.Lock()
	if d.err != nil {
		err := d.err
		d.mu.Unlock()
		return frame{}, fmt.Errorf("%w (%s): %v", ErrConnLost, d.addr, err)
	}
	d.next++
	id := d.next
	d.wait[id] = p
	d.mu.Unlock()
	buf, err := encodeFrame(typ, id, meta, len(bulk))
	var seq uint64
	if err == nil {
		seq, err = d.w.send(buf, bulk)
	}
	if err != nil {
		d.mu.Lock()
		delete(d.wait, id)
		d.mu.Unlock()
		return frame{}, err
	}
	select {
	case f, ok := <-ch:
		if !ok {
			d.abandon(p) // the connection failed while the reply was read into dst
			d.mu.Lock()
			err := d.err
			d.mu.Unlock()
			return frame{}, fmt.Errorf("%w (%s): %v", ErrConnLost, d.addr, err)
		}
		if f.typ != want {
			d.fail(fmt.Errorf("%w: type %d in answer to type %d", errFrame, f.typ, typ))
			return frame{}, fmt.Errorf("%w: type %d in answer to type %d", ErrBadMessage, f.typ, typ)
		}
		return f, nil
	case <-ctx.Done():
		d.mu.Lock()
		delete(d.wait, id)
		d.mu.Unlock()
		d.abandon(p)
		if !d.w.written(seq) {
			// The frame may still be queued, and it holds the caller's
			// buffer (a write's data), which is the caller's again once
			// this returns: the connection ends, and the frame with it
			// (sent in part at most: the node drops a frame cut short),
			// before this returns.
			d.fail(fmt.Errorf("a request given up before it was sent (%w)", ctx.Err()))
			<-d.w.exited
		} else if c, err := encodeFrame(frameCancel, id, nil, 0); err == nil {
			d.w.send(c) // the node gives it up too
		}
		return frame{}, ctx.Err()
	}
}

func (d *dataConn) Read(ctx context.Context, r *pb.RLDevServiceReadRequest, dst []byte) (*pb.RLDevServiceReadResponse, error) {
	f, err := d.call(ctx, frameRead, r, nil, frameReadResp, dst)
	if err != nil {
		return nil, err
	}
	var m pb.RLDevServiceReadResponse
	if err := proto.Unmarshal(f.meta, &m); err != nil || len(m.Data) != 0 {
		d.fail(fmt.Errorf("%w: a read response does not decode", errFrame))
		return nil, fmt.Errorf("%w: a read response does not decode", ErrBadMessage)
	}
	m.Data = f.bulk
	return &m, nil
}

func (d *dataConn) Write(ctx context.Context, r *pb.RLDevServiceWriteRequest) (*pb.RLDevServiceWriteResponse, error) {
	// The request without its data, which travels as the frame's bulk
	// (proto.Clone would copy it).
	meta := &pb.RLDevServiceWriteRequest{Rldev: r.Rldev, Offset: r.Offset, Fence: r.Fence, Replica: r.Replica, Node: r.Node, Writer: r.Writer, WriteSeq: r.WriteSeq}
	f, err := d.call(ctx, frameWrite, meta, r.Data, frameWriteResp, nil)
	if err != nil {
		return nil, err
	}
	var m pb.RLDevServiceWriteResponse
	if err := proto.Unmarshal(f.meta, &m); err != nil || len(f.bulk) != 0 {
		d.fail(fmt.Errorf("%w: a write response does not decode", errFrame))
		return nil, fmt.Errorf("%w: a write response does not decode", ErrBadMessage)
	}
	return &m, nil
}

// dataConns is a clerk's data-path connections, one per address and kind.
type dataConns struct {
	mu    sync.Mutex
	conns map[string]*dataConn
	dials map[string]*sync.Mutex // one dial at a time per address
	// clerk identifies this pool's connections to the nodes, and seq
	// numbers them in the order they are dialed: a node drops what
	// arrives on a connection of the pool's once a later one has opened
	// (Service.admitClerkConn), so that a write sent on a connection that
	// broke cannot land after its retry on the next one.
	clerk uint64
	seq   uint64
}

// get returns the connection to addr, sequenced or not: the pool keeps
// one of each kind per address (a node's record may change its mind, say
// across a rolling upgrade, and two node ids may share an address
// meanwhile), so that neither kind's requests in flight fail for the
// other's sake.
func (p *dataConns) get(ctx context.Context, addr string, sequenced bool) (*dataConn, error) {
	key := addr
	if !sequenced {
		key = "unsequenced " + addr
	}
	p.mu.Lock()
	if d := p.conns[key]; d != nil && !d.broken() {
		p.mu.Unlock()
		return d, nil
	}
	if p.dials == nil {
		p.conns, p.dials = map[string]*dataConn{}, map[string]*sync.Mutex{}
		p.clerk = rand.Uint64() | 1 // never 0
	}
	dl := p.dials[key]
	if dl == nil {
		dl = &sync.Mutex{}
		p.dials[key] = dl
	}
	p.mu.Unlock()
	dl.Lock()
	defer dl.Unlock()
	p.mu.Lock()
	if d := p.conns[key]; d != nil && !d.broken() {
		p.mu.Unlock()
		return d, nil
	}
	p.seq++
	clerk, seq := p.clerk, p.seq
	p.mu.Unlock()
	d, err := dialData(ctx, addr, clerk, seq, sequenced)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	p.conns[key] = d
	p.mu.Unlock()
	return d, nil
}

func (p *dataConns) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for a, d := range p.conns {
		d.fail(net.ErrClosed)
		delete(p.conns, a)
	}
}
