package rldev_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand"
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
	"github.com/grovestore/grove/internal/sim"
)

// The clerk's promise about writes whose answer was lost, checked on the
// runtime that runs (real services, sockets and disk files, the clerk's
// connection handling), under random faults. rldev.Clerk.WriteReport
// says, on success, whether an earlier attempt of the write may still
// land later; when it says no, the writer may write the blocks again
// under the same fencing token, and no earlier attempt may come back over
// the newer write. A proxy in front of the primary, seeded, holds some
// write frames in the network while it cuts the clerk's side of their
// connection (the clerk retries on a new one; the held frame reaches the
// node later, on the old connection), drops others, and passes others on
// before it cuts (the write lands, its answer is lost). Writers act as the
// chunk store does: after an error or an "earlier attempt may land" they
// write that block next under a newer token. The oracle: a read after an
// acknowledged write returns it; once every held frame has arrived, each
// block holds its last acknowledged value or that of a write that failed
// after it. Its teeth: the same run with the proxy turning the clerk's
// sequenced connections into unsequenced ones (the node then does not
// order the clerk's connections, and the clerk's promise is false) must
// be caught. And the same run against a node of an earlier build (its
// record names no FeatureSeqConns, and it refuses sequenced connections,
// as a rolling upgrade meets it): the clerk opens unsequenced connections
// to it and reports their lost attempts, and the writers renew their
// token. And on the gRPC data path, which has no sequencing: there a
// held call fails at once and its request reaches the node later
// (rldev.DelayWriteAttempts); the clerk must report those.
func TestClerkLateAttemptsRandomized(t *testing.T) {
	seed := sim.RandomSeed(t, "the proxy's fault decisions")
	for _, mode := range []lateMode{lateSequenced, lateEarlierBuild, lateGRPC} {
		if bad, _ := runLateAttempts(t, seed, mode); len(bad) > 0 {
			for _, b := range bad {
				t.Error(b)
			}
			t.Fatalf("seed %d (%s): an earlier attempt of a write came back after a newer write the clerk said nothing could come back over", seed, mode)
		}
	}
	t.Run("teeth", func(t *testing.T) {
		for i := int64(0); i < 3; i++ {
			if bad, _ := runLateAttempts(t, seed+i, lateUnsequenced); len(bad) > 0 {
				t.Logf("caught (seed %d): %s", seed+i, bad[0])
				return
			}
		}
		t.Fatal("the oracle did not catch late attempts on connections the node does not sequence")
	})
}

// lateValue is a 4 KiB block naming its writer's write.
func lateValue(block, n uint64) []byte {
	b := make([]byte, 4096)
	for i := 0; i < len(b); i += 16 {
		binary.BigEndian.PutUint64(b[i:], block)
		binary.BigEndian.PutUint64(b[i+8:], n)
	}
	return b
}

func lateValueOf(b []byte) (block, n uint64, ok bool) {
	if len(b) != 4096 {
		return 0, 0, false
	}
	block, n = binary.BigEndian.Uint64(b), binary.BigEndian.Uint64(b[8:])
	if b2 := lateValue(block, n); string(b2) != string(b) {
		return 0, 0, false
	}
	return block, n, true
}

// lateMode is what the node behind the proxy is.
type lateMode int

const (
	lateSequenced    lateMode = iota // this build
	lateUnsequenced                  // the teeth: the proxy makes the clerk's sequenced connections unsequenced
	lateEarlierBuild                 // its record names no FeatureSeqConns, and the proxy refuses sequenced connections
	lateGRPC                         // the gRPC data path: held calls fail at once, their requests arrive later (rldev.DelayWriteAttempts)
)

func (m lateMode) String() string {
	return [...]string{"sequenced", "unsequenced (teeth)", "an earlier build", "gRPC data path"}[m]
}

func runLateAttempts(t *testing.T, seed int64, mode lateMode) (bad []string, earlierReported int) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	path := rldev.DataPathTCP
	if mode == lateGRPC {
		path = rldev.DataPathGRPC
	}
	c, err := bench.StartCluster(t.TempDir(), 2, bench.ClusterOptions{Store: true, DiskSize: 64 << 20, Log: testLog(t), DataPath: path})
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

	var cl *rldev.Clerk
	var drain func()
	var counts func() (held, dropped, lost, refused int)
	if mode == lateGRPC {
		cl = rldev.NewClerkWith(mc, rldev.ClerkOptions{DataPath: rldev.DataPathGRPC})
		var mu sync.Mutex
		rnd, nHeld := rand.New(rand.NewSource(seed)), 0
		drain = rldev.DelayWriteAttempts(cl, func() time.Duration {
			mu.Lock()
			defer mu.Unlock()
			if rnd.Intn(100) < 15 {
				nHeld++
				return time.Duration(20+rnd.Intn(300)) * time.Millisecond
			}
			return 0
		})
		counts = func() (int, int, int, int) { mu.Lock(); defer mu.Unlock(); return nHeld, 0, 0, 0 }
	} else {
		cl, drain, counts = lateThroughProxy(t, ctx, c, mc, prim, seed, mode)
	}
	defer cl.Close()

	const writers, blocksEach, writesEach = 4, 2, 30
	type blockState struct {
		token  uint64
		acked  uint64   // the last acknowledged write (0: none)
		failed []uint64 // writes that failed after it
	}
	var mu sync.Mutex
	report := func(format string, args ...any) {
		mu.Lock()
		bad = append(bad, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	states := make([]*blockState, writers*blocksEach)
	var wg sync.WaitGroup
	var earlier, failures int
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < writesEach && ctx.Err() == nil; i++ {
				k := w*blocksEach + i%blocksEach
				block := uint64(k * 67) // each in its own dirty region, some sharing one
				mu.Lock()
				st := states[k]
				if st == nil {
					st = &blockState{token: 1}
					states[k] = st
				}
				tok := st.token
				mu.Unlock()
				n := uint64(i + 1)
				f := &rldev.Fence{Name: fmt.Sprintf("late/%d", block), Token: lock.Token{Epoch: 1, Seq: tok}}
				wctx, wcancel := context.WithTimeout(ctx, 3*time.Second)
				may, err := cl.WriteReport(wctx, id, block*4096, lateValue(block, n), rldev.WriteOptions{Fence: f})
				wcancel()
				mu.Lock()
				switch {
				case err != nil:
					failures++
					st.failed = append(st.failed, n)
					st.token++ // as the chunk store does: a newer token before the block is written again
				case may:
					earlier++
					st.acked, st.failed = n, nil
					st.token++
				default:
					st.acked, st.failed = n, nil
				}
				mu.Unlock()
				if err != nil {
					continue
				}
				got, err := cl.Read(ctx, id, block*4096, 4096, 0)
				if err != nil {
					report("read of block %d after write %d: %v", block, n, err)
					continue
				}
				if b, m, ok := lateValueOf(got); !ok || b != block || m != n {
					report("block %d read right after its write %d was acknowledged (earlier attempt may land: %v) holds write %d (%v)", block, n, may, m, ok)
				}
			}
		}(w)
	}
	wg.Wait()
	drain() // every held request has reached the node (or its connection's end)
	time.Sleep(300 * time.Millisecond)
	for k, st := range states {
		if st == nil || st.acked == 0 && len(st.failed) == 0 {
			continue
		}
		block := uint64(k * 67)
		got, err := cl.Read(ctx, id, block*4096, 4096, 0)
		if err != nil {
			report("final read of block %d: %v", block, err)
			continue
		}
		b, m, ok := lateValueOf(got)
		okv := ok && b == block && (m == st.acked || st.acked == 0 && m == 0)
		for _, f := range st.failed {
			okv = okv || ok && b == block && m == f
		}
		if !okv {
			report("block %d holds write %d (well-formed %v) once the network is quiet; its last acknowledged write is %d, failed after it %v", block, m, ok, st.acked, st.failed)
		}
	}
	held, dropped, lost, refused := counts()
	t.Logf("seed %d (%s): %d writers × %d writes; proxy held %d write frames, dropped %d, lost %d answers, refused %d sequenced connections; clerk: %d failures, %d successes with an earlier attempt that may land; %d violations",
		seed, mode, writers, writesEach, held, dropped, lost, refused, failures, earlier, len(bad))
	switch {
	case mode == lateEarlierBuild && refused > 0:
		bad = append(bad, fmt.Sprintf("the clerk opened %d sequenced connections to a node whose record does not say it takes them", refused))
	case (mode == lateEarlierBuild || mode == lateGRPC) && held+lost > 2 && earlier == 0:
		bad = append(bad, fmt.Sprintf("%d attempts held or answers lost on unsequenced connections, and not one success reported an earlier attempt that may land", held+lost))
	case mode == lateSequenced && earlier > 0:
		t.Logf("note: %d successes reported an earlier attempt on sequenced connections (a node's own 'may have been written')", earlier)
	}
	return bad, earlier
}

// lateThroughProxy puts a lateProxy in front of node prim (its registered
// address is the proxy's from now on) and returns a new clerk, which dials
// the proxy.
func lateThroughProxy(t *testing.T, ctx context.Context, c *bench.InProcessCluster, mc *meta.Client, prim uint64, seed int64, mode lateMode) (*rldev.Clerk, func(), func() (int, int, int, int)) {
	px := newLateProxy(t, c.Configs[prim-1].GRPCAddr, seed, mode)
	t.Cleanup(px.close)
	if _, err := mc.Update(ctx, meta.NodesNamespace, "late attempts: node behind a proxy", func(ns *pb.Namespace) ([]*pb.Op, error) {
		n, err := meta.Registered(ns, prim)
		if err != nil || n == nil {
			return nil, err
		}
		n.GrpcAddr = px.ln.Addr().String()
		if mode == lateEarlierBuild {
			n.Features = nil
		}
		val, err := proto.Marshal(n)
		if err != nil {
			return nil, err
		}
		return []*pb.Op{{Kind: pb.Op_KIND_PUT, Key: meta.NodeKey(prim), Value: val}}, nil
	}); err != nil {
		t.Fatal(err)
	}
	cl := rldev.NewClerk(mc) // a new clerk: it dials the registered (proxy's) address
	return cl, px.drain, px.counts
}

// lateProxy passes TCP connections on to a node, faulting a clerk's write
// frames at random (seeded): held (the clerk's side cut, the frame passed
// on after a delay on the old connection), dropped (both sides cut), or
// passed on with the clerk's side cut right after (the answer lost).
type lateProxy struct {
	ln         net.Listener
	to         string
	mode       lateMode
	refusedSeq int // sequenced connections refused (lateEarlierBuild)
	mu         sync.Mutex
	rnd        *rand.Rand
	held       sync.WaitGroup // holds in flight; Add only under mu, never once draining
	draining   bool           // drain has begun: no new holds (WaitGroup's rule: no Add racing Wait)
	nHeld      int
	nDropped   int
	nLost      int
	conns      []net.Conn
}

func newLateProxy(t *testing.T, to string, seed int64, mode lateMode) *lateProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &lateProxy{ln: ln, to: to, mode: mode, rnd: rand.New(rand.NewSource(seed))}
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

func (p *lateProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
}

// drain waits for every held frame to have been passed on. A frame the
// proxy reads after drain began passes unfaulted: a hold begun then would
// be an Add racing the Wait (the race detector caught one in CI).
func (p *lateProxy) drain() {
	p.mu.Lock()
	p.draining = true
	p.mu.Unlock()
	p.held.Wait()
}

func (p *lateProxy) counts() (held, dropped, lost, refused int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.nHeld, p.nDropped, p.nLost, p.refusedSeq
}

// decide draws a write frame's fate: 0 pass, 1 hold, 2 drop, 3 lose the
// answer; and a hold's delay. A hold is counted in p.held here, under
// p.mu, so that drain's Wait never races its Add.
func (p *lateProxy) decide() (int, time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.draining {
		return 0, 0
	}
	r := p.rnd.Intn(100)
	d := time.Duration(20+p.rnd.Intn(300)) * time.Millisecond
	switch {
	case r < 12:
		p.nHeld++
		p.held.Add(1)
		return 1, d
	case r < 16:
		p.nDropped++
		return 2, 0
	case r < 20:
		p.nLost++
		return 3, 0
	}
	return 0, 0
}

type lateLenient struct{ c net.Conn }

func (l lateLenient) Write(b []byte) (int, error) { l.c.Write(b); return len(b), nil }

func (p *lateProxy) pipe(down net.Conn) {
	up, err := net.Dial("tcp", p.to)
	if err != nil {
		down.Close()
		return
	}
	p.mu.Lock()
	p.conns = append(p.conns, down, up)
	p.mu.Unlock()
	go func() {
		io.Copy(lateLenient{down}, up) // drained even once the clerk's side is cut
		down.Close()
	}()
	br := bufio.NewReaderSize(down, 1<<20)
	pre, err := br.Peek(6)
	switch {
	case err == nil && string(pre) == rldev.WireMagic+"\x01\x01":
		if _, err := io.CopyN(up, br, 6); err != nil {
			up.Close()
			return
		}
	case err == nil && string(pre) == rldev.WireMagic+"\x01\x03" && p.mode == lateEarlierBuild:
		p.mu.Lock()
		p.refusedSeq++ // an earlier build closes a connection of a kind it does not know
		p.mu.Unlock()
		down.Close()
		up.Close()
		return
	case err == nil && string(pre) == rldev.WireMagic+"\x01\x03":
		var b [6 + 16]byte
		if _, err := io.ReadFull(br, b[:]); err != nil {
			up.Close()
			return
		}
		out := b[:]
		if p.mode == lateUnsequenced { // the teeth: the node sees an unsequenced connection
			out = append([]byte(rldev.WireMagic+"\x01\x01"), nil...)
		}
		if _, err := up.Write(out); err != nil {
			up.Close()
			return
		}
	default:
		io.Copy(up, br) // gRPC, a peer link
		up.(*net.TCPConn).CloseWrite()
		return
	}
	// The teeth are of a clerk without write ids too: a copy that
	// remembers a write does not apply a late attempt of it again
	// (landed.go), which also keeps it from landing over a newer write.
	forwardFrames(br, up, p.mode == lateUnsequenced, func(frame []byte) bool {
		switch fate, delay := p.decide(); fate {
		case 1:
			down.Close()
			go func() {
				defer p.held.Done()
				time.Sleep(delay)
				up.Write(frame)
				time.Sleep(100 * time.Millisecond) // its answer, if any, comes back to nobody
				up.Close()
			}()
			return false
		case 2:
			down.Close()
			up.Close()
			return false
		case 3:
			up.Write(frame)
			down.Close()
			time.Sleep(50 * time.Millisecond)
			up.Close()
			return false
		}
		return true
	})
}

// stripWriteID returns a write frame without its request's write id.
func stripWriteID(frame []byte) []byte {
	const hdr = 17 // length, type, request id, meta length
	m := binary.BigEndian.Uint32(frame[13:])
	var req pb.RLDevServiceWriteRequest
	if err := proto.Unmarshal(frame[hdr:hdr+m], &req); err != nil {
		panic(err)
	}
	req.Writer, req.WriteSeq = 0, 0
	meta, err := proto.Marshal(&req)
	if err != nil {
		panic(err)
	}
	out := append(append(append([]byte(nil), frame[:hdr]...), meta...), frame[hdr+m:]...)
	binary.BigEndian.PutUint32(out, uint32(len(out)-4))
	binary.BigEndian.PutUint32(out[13:], uint32(len(meta)))
	return out
}

// forwardFrames passes a clerk's data-path frames from br on to up, one
// at a time, until the clerk's side ends (then up's write side closes).
// A write frame goes on only if write, given it, says so; if write says
// not, write took the frame (held it, dropped it, sent it itself) and
// forwarding ends.
//
// With strip, write frames go on without their write id (stripWriteID).
func forwardFrames(br *bufio.Reader, up net.Conn, strip bool, write func(frame []byte) bool) {
	for {
		hdr := make([]byte, 4)
		if _, err := io.ReadFull(br, hdr); err != nil {
			up.(*net.TCPConn).CloseWrite()
			return
		}
		body := make([]byte, binary.BigEndian.Uint32(hdr))
		if _, err := io.ReadFull(br, body); err != nil {
			up.(*net.TCPConn).CloseWrite()
			return
		}
		frame := append(hdr, body...)
		if strip && len(body) >= 1 && body[0] == 4 {
			frame = stripWriteID(frame)
		}
		if len(body) >= 1 && body[0] == 4 && !write(frame) { // type 4: a write
			return
		}
		if _, err := up.Write(frame); err != nil {
			return
		}
	}
}
