package rldev_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/bench"
	"github.com/grovestore/grove/internal/lock"
	"github.com/grovestore/grove/internal/meta"
	"github.com/grovestore/grove/internal/rldev"
)

// Outside review 41 (commit d194923: sequenced data-path connections
// across a rolling upgrade).

// TestReview41LostAttemptAtAliasedNode: WriteReport keeps its lost
// attempts by node id (lost[node]) and trusts that an attempt sent to
// node O can land only at O. When O's membership record names an address
// that reaches another node's process — a dead node of the earlier build
// (no FeatureSeqConns) whose host:port was taken by the primary, a
// record that lags — the attempt "to O" is a kind-1 (unsequenced)
// connection to the primary's process. The primary then answers the
// retry (on a sequenced connection, a success at another node id), and
// WriteReport says no earlier attempt may land; the held attempt lands
// later over the writer's next write under the same token.
//
// Interleaving: the clerk's table lags a failover O -> P (P primary now),
// O's record: address A_O (here a proxy that hands data-path client
// connections to P's process, everything else to O), no features.
//  1. attempt 1 goes to O: Has(O) false -> kind 1 to A_O -> P's process;
//     the frame is held in the network, the clerk's side cut: lost[O].
//  2. retry, fresh table: primary P, Has(P) -> kind 3 to P, answered:
//     ok = P, lost[P] false -> earlierMayLand false.
//  3. the writer writes the block again under the same token: acked.
//  4. the held frame reaches P's process, on a connection P does not
//     sequence: the first write lands over the second.
//
// Now a lost attempt on an unsequenced connection counts whatever node
// the success comes from (WriteReport), and a write request names the node
// it is meant for, which a node of this build checks: P refuses the held
// frame (the writer here keeps its token whatever the report says, so
// that the refusal alone is what keeps write 2). Removing either fails
// the test.
func TestReview41LostAttemptAtAliasedNode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := bench.StartCluster(t.TempDir(), 2, bench.ClusterOptions{Store: true, DiskSize: 64 << 20, Log: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	mc := meta.NewClient(c.Members())
	defer mc.Close()
	setup := rldev.NewClerk(mc)
	defer setup.Close()
	id := createServed(t, ctx, setup, 16<<20)
	tb := waitNormal(t, ctx, setup, 1)
	rec := tb.RLDevs[id]
	prim := uint64(rec.Segs[rec.Primary].Node)
	other := uint64(rec.Segs[1-rec.Primary].Node)

	px := newAliasProxy(t, c.Configs[prim-1].GRPCAddr, c.Configs[other-1].GRPCAddr)
	defer px.close()
	if _, err := mc.Update(ctx, meta.NodesNamespace, "review 41: a record naming an address that reaches another node", func(ns *pb.Namespace) ([]*pb.Op, error) {
		n, err := meta.Registered(ns, other)
		if err != nil || n == nil {
			return nil, fmt.Errorf("node %d: %v", other, err)
		}
		n.GrpcAddr, n.Features = px.ln.Addr().String(), nil
		val, err := proto.Marshal(n)
		if err != nil {
			return nil, err
		}
		return []*pb.Op{{Kind: pb.Op_KIND_PUT, Key: meta.NodeKey(other), Value: val}}, nil
	}); err != nil {
		t.Fatal(err)
	}

	cl := rldev.NewClerk(mc)
	defer cl.Close()
	for !rldev.ClerkHasTable(cl) || rldev.ClerkLookup(cl, other) != px.ln.Addr().String() || rldev.ClerkLookup(cl, prim) == "" {
		if ctx.Err() != nil {
			t.Fatal("the clerk's watches did not deliver")
		}
		time.Sleep(20 * time.Millisecond)
	}
	tb, err = cl.Table(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	rldev.LagClerkTable(cl, tb, id) // the clerk's view lags a failover other -> prim

	const block = 5
	f := &rldev.Fence{Name: "review41/alias", Token: lock.Token{Epoch: 1, Seq: 1}}
	v1, v2 := bytes.Repeat([]byte{1}, 4096), bytes.Repeat([]byte{2}, 4096)
	may, err := cl.WriteReport(ctx, id, block*4096, v1, rldev.WriteOptions{Fence: f})
	if err != nil {
		t.Fatal(err)
	}
	if px.heldCount() != 1 {
		t.Fatalf("setup: %d write frames held on the aliased address (want 1)", px.heldCount())
	}
	if !may {
		t.Errorf("WriteReport: no earlier attempt may land, but attempt 1 (sent to node %d's address, which reaches node %d's process, on an unsequenced connection) is held in the network", other, prim)
	}
	if err := cl.Write(ctx, id, block*4096, v2, rldev.WriteOptions{Fence: f}); err != nil {
		t.Fatal(err)
	}
	px.release()
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		got, err := cl.Read(ctx, id, block*4096, 4096, 0)
		if err != nil {
			t.Fatal(err)
		}
		if got[0] != 2 {
			t.Errorf("block %d holds %d after write 2 was acknowledged (the report said nothing earlier could land; the writer kept its token)", block, got[0])
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// aliasProxy: the address a stale record names. Data-path client
// connections (kinds 1 and 3) reach node prim's process, the first write
// frame on a kind-1 connection held in the network (the clerk's side cut
// at once, the frame passed on when released); everything else (gRPC,
// peer links) reaches node other, so the cluster works on.
type aliasProxy struct {
	ln          net.Listener
	prim, other string
	mu          sync.Mutex
	held        int
	rel         chan struct{}
	delivered   chan struct{}
	conns       []net.Conn
	holdKind    byte   // the connection kind whose first write frame is held (default 1)
	onHold      func() // called with the frame held, before the clerk's side is cut
}

func newAliasProxy(t *testing.T, prim, other string) *aliasProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &aliasProxy{ln: ln, prim: prim, other: other, rel: make(chan struct{}), delivered: make(chan struct{})}
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

func (p *aliasProxy) heldCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.held
}

func (p *aliasProxy) release() {
	close(p.rel)
	select {
	case <-p.delivered:
	case <-time.After(5 * time.Second):
	}
}

func (p *aliasProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
}

func (p *aliasProxy) pipe(down net.Conn) {
	br := bufio.NewReaderSize(down, 1<<20)
	pre, err := br.Peek(6)
	if err != nil {
		down.Close()
		return
	}
	kind1 := string(pre) == rldev.WireMagic+"\x01\x01"
	kind3 := string(pre) == rldev.WireMagic+"\x01\x03"
	to := p.other
	if kind1 || kind3 {
		to = p.prim
	}
	holdKind := p.holdKind
	if holdKind == 0 {
		holdKind = 1
	}
	faulted := kind1 && holdKind == 1 || kind3 && holdKind == 3
	up, err := net.Dial("tcp", to)
	if err != nil {
		down.Close()
		return
	}
	p.mu.Lock()
	p.conns = append(p.conns, down, up)
	p.mu.Unlock()
	go func() {
		io.Copy(lateLenient{down}, up)
		down.Close()
	}()
	if !faulted {
		io.Copy(up, br)
		up.(*net.TCPConn).CloseWrite()
		return
	}
	n := int64(6)
	if kind3 {
		n += 16
	}
	if _, err := io.CopyN(up, br, n); err != nil {
		up.Close()
		return
	}
	forwardFrames(br, up, false, func(frame []byte) bool {
		p.mu.Lock()
		hold := p.held == 0
		if hold {
			p.held++
		}
		p.mu.Unlock()
		if !hold {
			return true
		}
		if p.onHold != nil {
			p.onHold()
		}
		down.Close() // the clerk's side is cut; the frame is in the network
		<-p.rel
		up.Write(frame)
		close(p.delivered)
		return false // up stays open (closed with the proxy): the node serves the request
	})
}

// TestReview41PoolKindRaceOrphansConn: dataConns.get, asked at once for a
// sequenced and an unsequenced connection to one address (two node ids
// at one address whose records differ, or two callers on either side of
// a membership update), lets the second dial replace the first's
// connection in the pool without failing it. That connection is then
// no one's: Clerk.Close (dataConns.close) does not end it, its reader
// lives on (a node pings it every second, so it never goes idle), and a
// node holds one of its maxDataConns for it; a kind-1 one is never
// superseded there either.
//
// Interleaving: G1 get(A, seq) and G2 get(A, unseq) both find no live
// connection and wait on A's dial lock; G1 dials D3 and stores it; G2
// finds D3 of the other kind under the dial lock (the second check only
// compares, it does not fail), dials D1 and stores it over D3.
func TestReview41PoolKindRaceOrphansConn(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var accepted []net.Conn
	var amu sync.Mutex
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			amu.Lock()
			accepted = append(accepted, c)
			amu.Unlock()
			go io.Copy(io.Discard, c)
		}
	}()
	defer func() {
		amu.Lock()
		defer amu.Unlock()
		for _, c := range accepted {
			c.Close()
		}
	}()
	addr := ln.Addr().String()

	var tp rldev.TestPool
	release := tp.HoldDials(addr) // a dial in progress
	got := make(chan rldev.TestConn, 2)
	for _, seq := range []bool{true, false} {
		go func(seq bool) {
			d, err := tp.Get(ctx, addr, seq)
			if err != nil {
				t.Error(err)
			}
			got <- d
		}(seq)
	}
	time.Sleep(200 * time.Millisecond) // both wait on the dial lock
	release()
	a, b := <-got, <-got
	if t.Failed() {
		return
	}
	cur, _ := tp.Current(addr)
	tp.Close() // Clerk.Close
	for _, d := range []rldev.TestConn{a, b} {
		if !d.Broken() {
			t.Errorf("a connection (sequenced %v, in the pool %v) outlives the pool's close: replaced by a connection of the other kind without being failed", d.Sequenced(), d.Same(cur))
		}
	}
}

// TestReview41FeatureDroppedMidWrite (passes: what the commit's sent map
// is for, which TestClerkLateAttemptsRandomized never exercises — its
// records do not change during a run): attempt 1 on a sequenced
// connection is held in the network; the node's record then stops naming
// FeatureSeqConns (the clerk sees it before its retry); the retry goes
// on an unsequenced connection (get fails the kind-3 one at the clerk
// only: the node does not supersede it) and is answered; the held frame
// then lands. WriteReport must say an earlier attempt may land.
func TestReview41FeatureDroppedMidWrite(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := bench.StartCluster(t.TempDir(), 2, bench.ClusterOptions{Store: true, DiskSize: 64 << 20, Log: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	mc := meta.NewClient(c.Members())
	defer mc.Close()
	setup := rldev.NewClerk(mc)
	defer setup.Close()
	id := createServed(t, ctx, setup, 16<<20)
	tb := waitNormal(t, ctx, setup, 1)
	rec := tb.RLDevs[id]
	prim := uint64(rec.Segs[rec.Primary].Node)

	// Everything through the proxy reaches prim (other = prim: gRPC too).
	px := newAliasProxy(t, c.Configs[prim-1].GRPCAddr, c.Configs[prim-1].GRPCAddr)
	px.holdKind = 3
	defer px.close()
	setRecord := func(features []string) {
		if _, err := mc.Update(ctx, meta.NodesNamespace, "review 41: record", func(ns *pb.Namespace) ([]*pb.Op, error) {
			n, err := meta.Registered(ns, prim)
			if err != nil || n == nil {
				return nil, fmt.Errorf("node %d: %v", prim, err)
			}
			n.GrpcAddr, n.Features = px.ln.Addr().String(), features
			val, err := proto.Marshal(n)
			if err != nil {
				return nil, err
			}
			return []*pb.Op{{Kind: pb.Op_KIND_PUT, Key: meta.NodeKey(prim), Value: val}}, nil
		}); err != nil {
			t.Error(err)
		}
	}
	setRecord([]string{rldev.FeatureSeqConns})
	cl := rldev.NewClerk(mc)
	defer cl.Close()
	for rldev.ClerkLookup(cl, prim) != px.ln.Addr().String() || !rldev.ClerkHas(cl, prim) {
		if ctx.Err() != nil {
			t.Fatal("the clerk's address book did not deliver")
		}
		time.Sleep(20 * time.Millisecond)
	}
	px.onHold = func() {
		setRecord(nil)
		for rldev.ClerkHas(cl, prim) && ctx.Err() == nil {
			time.Sleep(10 * time.Millisecond)
		}
	}
	const block = 9
	f := &rldev.Fence{Name: "review41/flip", Token: lock.Token{Epoch: 1, Seq: 1}}
	v1, v2 := bytes.Repeat([]byte{1}, 4096), bytes.Repeat([]byte{2}, 4096)
	may, err := cl.WriteReport(ctx, id, block*4096, v1, rldev.WriteOptions{Fence: f})
	if err != nil {
		t.Fatal(err)
	}
	if px.heldCount() != 1 {
		t.Fatalf("setup: %d write frames held (want 1)", px.heldCount())
	}
	if !may {
		t.Errorf("WriteReport: no earlier attempt may land, with attempt 1 held on a sequenced connection the node never saw superseded")
	}
	if may {
		f = &rldev.Fence{Name: f.Name, Token: lock.Token{Epoch: 1, Seq: 2}} // as the chunk store does
	}
	if err := cl.Write(ctx, id, block*4096, v2, rldev.WriteOptions{Fence: f}); err != nil {
		t.Fatal(err)
	}
	px.release()
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		got, err := cl.Read(ctx, id, block*4096, 4096, 0)
		if err != nil {
			t.Fatal(err)
		}
		if got[0] != 2 {
			t.Errorf("block %d holds %d after write 2 was acknowledged", block, got[0])
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}
