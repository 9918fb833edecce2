package chunk_test

// An outside review (36) of resent writes of unknown outcome.
//
// rldev.Clerk.WriteReport says, on success, whether an earlier attempt of
// the write (sent, its answer lost, then retried) may still land later
// under the same fence. The B-tree acts on it (it renews its fence and
// writes again); the chunk service drops it for its own writes: zeroing a
// new chunk (Service.zero, rldev.Clerk.Write) and the map's writes
// (Service.writeBlocks). The map lock's token stays the same, so the
// RLDev admits the stray attempt whenever it lands.
//
// Here the stray is a new chunk's zeroing. Its first attempt's frame is
// held in the network (a TCP proxy in front of the data RLDev's primary
// stands for a path, or a node's reader of that connection, that delays
// it) while the connection breaks on the clerk's side; the chunk service's
// RLDev clerk retries on a new connection, succeeds, and the allocation is
// answered. The chunk's owner writes its data (fenced, under its own lock)
// and is told it is durable. Then the held attempt arrives: the RLDev
// admits it (the map lock's token is still current) and the acknowledged
// data is zeros.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/bench"
	"github.com/grovestore/grove/internal/chunk"
	"github.com/grovestore/grove/internal/lock"
	"github.com/grovestore/grove/internal/meta"
	"github.com/grovestore/grove/internal/rldev"
)

// r36Proxy passes TCP connections on to a node. On a clerk's data-path
// connection it passes frames one at a time; armed (hold), it keeps the
// first write frame hold accepts, cuts the clerk's side of that
// connection (its requests fail: ErrConnLost) and passes the frame on
// only at release.
type r36Proxy struct {
	ln      net.Listener
	to      string
	mu      sync.Mutex
	hold    func(*pb.RLDevServiceWriteRequest, []byte) bool
	seen    map[uint64]int // write frames passed on, by RLDev
	held    chan struct{}
	release chan struct{}
	passed  chan struct{}
}

func newR36Proxy(t *testing.T, to string) *r36Proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &r36Proxy{ln: ln, to: to, seen: map[uint64]int{}, held: make(chan struct{}), release: make(chan struct{}), passed: make(chan struct{})}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.pipe(c)
		}
	}()
	return p
}

type r36Lenient struct{ c net.Conn }

func (l r36Lenient) Write(b []byte) (int, error) { l.c.Write(b); return len(b), nil }

func (p *r36Proxy) pipe(down net.Conn) {
	up, err := net.Dial("tcp", p.to)
	if err != nil {
		down.Close()
		return
	}
	go func() {
		io.Copy(r36Lenient{down}, up) // drained even once the clerk's side is cut
		down.Close()
	}()
	defer up.(*net.TCPConn).CloseWrite()
	br := bufio.NewReaderSize(down, 1<<20)
	pre, err := br.Peek(6)
	n := int64(6) // a clerk's connection: magic, version, kind
	switch {
	case err == nil && string(pre) == rldev.WireMagic+"\x01\x01":
	case err == nil && string(pre) == rldev.WireMagic+"\x01\x03":
		n += 16 // and the clerk's identity and the connection's sequence number
	default:
		io.Copy(up, br) // gRPC, a peer link
		return
	}
	if _, err := io.CopyN(up, br, n); err != nil {
		return
	}
	for {
		hdr := make([]byte, 4)
		if _, err := io.ReadFull(br, hdr); err != nil {
			return
		}
		body := make([]byte, binary.BigEndian.Uint32(hdr))
		if _, err := io.ReadFull(br, body); err != nil {
			return
		}
		frame := append(hdr, body...)
		if len(body) >= 13 && body[0] == 4 { // a write: type, id, meta length, meta, data
			ml := int(binary.BigEndian.Uint32(body[9:13]))
			var m pb.RLDevServiceWriteRequest
			if 13+ml <= len(body) && proto.Unmarshal(body[13:13+ml], &m) == nil {
				p.mu.Lock()
				keep := p.hold != nil && p.hold(&m, body[13+ml:])
				if keep {
					p.hold = nil
				} else {
					p.seen[m.Rldev]++
				}
				p.mu.Unlock()
				if keep {
					close(p.held) // before the break: the clerk's retry may be quick
					down.Close()  // the clerk's side breaks; the frame is still on its way
					<-p.release
					up.Write(frame)
					close(p.passed)
					return
				}
			}
		}
		if _, err := up.Write(frame); err != nil {
			return
		}
	}
}

func (p *r36Proxy) seenWrites(rl uint64) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seen[rl]
}

func TestReview36StrayZeroingWipesAcknowledgedWrite(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := bench.StartCluster(t.TempDir(), 2, bench.ClusterOptions{Store: true, DiskSize: 64 << 20, Log: testLog()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	mc := meta.NewClient(c.Members())
	defer mc.Close()
	p := createPair(t, ctx, mc)
	cl := chunk.NewClerk(mc)
	defer cl.Close()
	if _, err := cl.Allocate(ctx, 4096, 0); err != nil {
		t.Fatal(err)
	}

	// The data RLDev's primary is reached through the proxy (its
	// registered address is the proxy's, incarnation unchanged).
	rc := rldev.NewClerk(mc)
	defer rc.Close()
	tb, err := rc.Table(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	dataID := p.Data[0].ID
	rec := tb.RLDevs[dataID]
	prim := uint64(rec.Segs[rec.Primary].Node)
	px := newR36Proxy(t, c.Configs[prim-1].GRPCAddr)
	defer px.ln.Close()
	if _, err := mc.Update(ctx, meta.NodesNamespace, "review36: node behind a proxy", func(ns *pb.Namespace) ([]*pb.Op, error) {
		n, err := meta.Registered(ns, prim)
		if err != nil || n == nil {
			return nil, err
		}
		n.GrpcAddr = px.ln.Addr().String()
		val, err := proto.Marshal(n)
		if err != nil {
			return nil, err
		}
		return []*pb.Op{{Kind: pb.Op_KIND_PUT, Key: meta.NodeKey(prim), Value: val}}, nil
	}); err != nil {
		t.Fatal(err)
	}
	// Until the chunk service's RLDev clerk zeroes through the proxy.
	for px.seenWrites(dataID) == 0 {
		if ctx.Err() != nil {
			t.Fatal("no write of the data RLDev went through the proxy")
		}
		if _, err := cl.Allocate(ctx, 4096, 0); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// The next zeroing's first attempt is held on its way; the connection
	// breaks on the clerk's side.
	px.mu.Lock()
	px.hold = func(m *pb.RLDevServiceWriteRequest, data []byte) bool {
		return m.Rldev == dataID && m.Fence != nil && m.Fence.Name == chunk.MapLock(p.ID) && len(data) > 0 && bytes.Count(data, []byte{0}) == len(data)
	}
	px.mu.Unlock()
	h, err := cl.Allocate(ctx, 4096, 0)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-px.held:
	default:
		t.Fatal("the allocation's zeroing did not go through the proxy")
	}
	data := bytes.Repeat([]byte{0x36}, 4096)
	owner := &rldev.Fence{Name: "btree/fence/36", Token: lock.Token{Epoch: 1, Seq: 1}}
	if err := cl.WriteFenced(ctx, h, 0, data, owner); err != nil {
		t.Fatal(err)
	}
	if got, err := cl.Read(ctx, h, 0, 4096); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("chunk %s read back before the stray: %v", h, err)
	}

	// The first attempt of the zeroing arrives.
	close(px.release)
	<-px.passed
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		got, err := cl.Read(ctx, h, 0, 4096)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, data) {
			t.Fatalf("chunk %s: the data written (fenced under %s, acknowledged as durable) after the chunk's allocation was answered "+
				"is now %d zero bytes of %d: the allocation's zeroing, whose first attempt lost its connection and was retried "+
				"successfully, landed late; chunk.Service.zero drops rldev.Clerk.WriteReport's earlierMayLand and the map lock's "+
				"token is never renewed, so the RLDev admitted the stray", h, owner.Name, bytes.Count(got, []byte{0}), len(got))
		}
	}
}
