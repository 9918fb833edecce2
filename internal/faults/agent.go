package faults

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/fd"
	"github.com/grovestore/grove/internal/meta"
	"github.com/grovestore/grove/internal/metrics"
	"github.com/grovestore/grove/internal/transport"
)

// The agent is the cluster's client. It runs inside the client namespace
// (the test binary re-executed there: a Go process can only open sockets in
// a namespace by running in it), takes commands as JSON lines on stdin and
// prints one JSON line (an Event) per thing it saw, stamped with the
// wall-clock times the test compares with the nodes' logs (every process
// shares the host's clock). Besides the commands it always polls status
// through every node and the observers' verdicts, so that the test can
// tell when anything changed.

// AgentConfig tells the agent where the nodes are.
type AgentConfig struct {
	Nodes         []AgentNode `json:"nodes"`
	StatusEveryMS int         `json:"status_every_ms"`  // per node
	VerdictEvery  int         `json:"verdict_every_ms"` // per observer: its dead verdicts
}

// AgentNode is one node's addresses.
type AgentNode struct {
	ID      uint64 `json:"id"`
	GRPC    string `json:"grpc"`
	Raft    string `json:"raft"`
	Beacon  string `json:"beacon"`
	Metrics string `json:"metrics"` // its Prometheus address (HTTP)
}

// Command is one request to the agent.
type Command struct {
	Op        string `json:"op"` // hold, release, list, decrees, decrees-stop, garbage, forge, metrics
	ID        string `json:"id,omitempty"`
	Addr      string `json:"addr,omitempty"`      // hold, list: the node asked
	Name      string `json:"name,omitempty"`      // hold: the lock; list: a lock to describe
	Namespace string `json:"namespace,omitempty"` // decrees
	Millis    int64  `json:"millis,omitempty"`    // decrees: period; garbage, forge: duration
}

// Event is one line from the agent. T0 and T1 (Unix nanoseconds) bracket
// what it reports: a poll's start and the arrival of its answer, or the
// instant something was seen (T0 == T1).
type Event struct {
	Ev  string `json:"ev"`           // status, verdict, granted, ended, list, decree, decree-check, garbage-done, forge-done, metrics, error
	ID  string `json:"id,omitempty"` // the command's id; the namespace for decree and decree-check
	T0  int64  `json:"t0"`
	T1  int64  `json:"t1"`
	Err string `json:"err,omitempty"`
	// status
	Via    uint64      `json:"via,omitempty"`
	Leader uint64      `json:"leader,omitempty"`
	Nodes  []NodeState `json:"nodes,omitempty"`
	// verdict: (Node, Inc) declared dead by Votes of the observers
	Node  uint64 `json:"node,omitempty"`
	Inc   uint64 `json:"inc,omitempty"`
	Votes int    `json:"votes,omitempty"`
	// granted
	Clerk string    `json:"clerk,omitempty"` // node.incarnation.seq
	Token [2]uint64 `json:"token,omitempty"` // epoch, seq
	// list
	Master  uint64 `json:"master,omitempty"`
	Serving bool   `json:"serving,omitempty"`
	Clerks  int    `json:"clerks,omitempty"` // connected and not dead
	// Nodes with a connected, live default clerk (kind ""): the one a
	// Hold through that node uses (a B-tree server's clerk, kind btree,
	// is counted in Clerks only).
	Defaults int `json:"defaults,omitempty"`
	// list with a name: that lock's holders (clerk:mode@token) and waiters
	Holders []string `json:"holders,omitempty"`
	Waiters []string `json:"waiters,omitempty"`
	// decree, decree-check
	Key     string   `json:"key,omitempty"`
	Acked   int      `json:"acked,omitempty"`
	Missing []string `json:"missing,omitempty"`
	// garbage-done, forge-done
	Sent int `json:"sent,omitempty"`
	// metrics: node Via's /metrics (metrics.Scrape's keys)
	Metrics map[string]float64 `json:"metrics,omitempty"`
}

// NodeState is one node as a status answer gave it.
type NodeState struct {
	ID    uint64 `json:"id"`
	Inc   uint64 `json:"inc"`
	Alive bool   `json:"alive"`
	Heard uint32 `json:"heard"`
}

// At and End are the event's times.
func (e Event) At() time.Time  { return time.Unix(0, e.T0) }
func (e Event) End() time.Time { return time.Unix(0, e.T1) }

type subject struct{ node, inc uint64 }

type agent struct {
	cfg   AgentConfig
	conns transport.Pool
	meta  *meta.Client
	out   struct {
		sync.Mutex
		enc *json.Encoder
	}
	mu struct {
		sync.Mutex
		holds   map[string]context.CancelFunc
		writers map[string]*writer
		incs    map[uint64]uint64           // newest registered incarnation seen per node
		watch   map[subject]bool            // incarnations whose verdict is awaited
		dead    map[subject]map[uint64]bool // observers that said dead, per awaited incarnation
	}
}

// writer proposes decrees into one namespace until stopped.
type writer struct {
	stop  chan struct{}
	done  chan struct{}
	acked []string
}

// RunAgent serves commands from in until it ends, printing events to out.
func RunAgent(cfg AgentConfig, in io.Reader, out io.Writer) error {
	a := &agent{cfg: cfg}
	a.out.enc = json.NewEncoder(out)
	a.mu.holds = map[string]context.CancelFunc{}
	a.mu.writers = map[string]*writer{}
	a.mu.incs = map[uint64]uint64{}
	a.mu.watch = map[subject]bool{}
	a.mu.dead = map[subject]map[uint64]bool{}
	var members []meta.Member
	for _, n := range cfg.Nodes {
		members = append(members, meta.Member{ID: n.ID, RaftAddr: n.Raft, GRPCAddr: n.GRPC})
	}
	a.meta = meta.NewClient(members)
	defer a.meta.Close()
	defer a.conns.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, n := range cfg.Nodes {
		go a.pollStatus(ctx, n)
	}
	for _, o := range cfg.Nodes {
		go a.pollVerdicts(ctx, o)
	}
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		var c Command
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			a.emit(Event{Ev: "error", Err: fmt.Sprintf("bad command %q: %v", sc.Text(), err)})
			continue
		}
		a.do(ctx, c)
	}
	return sc.Err()
}

func (a *agent) emit(e Event) {
	if e.T1 == 0 {
		e.T1 = e.T0
	}
	a.out.Lock()
	defer a.out.Unlock()
	a.out.enc.Encode(e)
}

func now() int64 { return time.Now().UnixNano() }

func (a *agent) do(ctx context.Context, c Command) {
	switch c.Op {
	case "hold":
		hctx, cancel := context.WithCancel(ctx)
		a.mu.Lock()
		a.mu.holds[c.ID] = cancel
		a.mu.Unlock()
		go a.hold(hctx, c)
	case "release":
		a.mu.Lock()
		cancel := a.mu.holds[c.ID]
		a.mu.Unlock()
		if cancel != nil {
			cancel()
		}
	case "list":
		go a.list(ctx, c)
	case "decrees":
		w := &writer{stop: make(chan struct{}), done: make(chan struct{})}
		a.mu.Lock()
		a.mu.writers[c.Namespace] = w
		a.mu.Unlock()
		go a.write(c.Namespace, time.Duration(c.Millis)*time.Millisecond, w)
	case "decrees-stop":
		a.mu.Lock()
		w := a.mu.writers[c.Namespace]
		delete(a.mu.writers, c.Namespace)
		a.mu.Unlock()
		if w != nil {
			go a.check(ctx, c.Namespace, w)
		}
	case "garbage":
		go a.garbage(time.Duration(c.Millis) * time.Millisecond)
	case "forge":
		go a.forge(time.Duration(c.Millis) * time.Millisecond)
	case "metrics":
		for _, n := range a.cfg.Nodes {
			go a.scrape(ctx, c.ID, n)
		}
	default:
		a.emit(Event{Ev: "error", T0: now(), Err: "unknown op " + c.Op})
	}
}

// pollStatus asks node n for `grove status` every StatusEveryMS, as the CLI
// does, and reports every answer or error. The answers also tell the
// verdict poller which incarnations exist.
func (a *agent) pollStatus(ctx context.Context, n AgentNode) {
	every := time.Duration(a.cfg.StatusEveryMS) * time.Millisecond
	for ctx.Err() == nil {
		t0 := time.Now()
		e := Event{Ev: "status", Via: n.ID, T0: t0.UnixNano()}
		cc, err := a.conns.Get(n.GRPC)
		if err == nil {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			var r *pb.StatusResponse
			r, err = pb.NewClusterServiceClient(cc).Status(cctx, &pb.StatusRequest{})
			cancel()
			if err == nil {
				e.Leader = r.Leader
				a.mu.Lock()
				for _, x := range r.Nodes {
					e.Nodes = append(e.Nodes, NodeState{ID: x.Id, Inc: x.Incarnation, Alive: x.Alive, Heard: x.ObserversHeard})
					if x.Incarnation > a.mu.incs[x.Id] {
						a.mu.incs[x.Id] = x.Incarnation
						a.mu.watch[subject{x.Id, x.Incarnation}] = true
					}
				}
				a.mu.Unlock()
			}
		}
		if err != nil {
			e.Err = err.Error()
		}
		e.T1 = now()
		a.emit(e)
		sleepUntil(ctx, t0.Add(every))
	}
}

func sleepUntil(ctx context.Context, t time.Time) {
	select {
	case <-ctx.Done():
	case <-time.After(time.Until(t)):
	}
}

// pollVerdicts asks observer o directly (the failure-detector service's
// query, as the lock master and `grove status` do) about every incarnation
// seen registered and not yet declared dead. Each observer has its own
// poller, so that one that does not answer (cut off, stopped) delays no
// other; a "dead" answer is permanent, so an incarnation is declared dead
// when the answer of the majority's last observer arrives, and reported
// once. Asking often and directly dates a verdict more closely than status
// polls can.
func (a *agent) pollVerdicts(ctx context.Context, o AgentNode) {
	every := time.Duration(a.cfg.VerdictEvery) * time.Millisecond
	for ctx.Err() == nil {
		t0 := time.Now()
		a.mu.Lock()
		var subs []subject
		for s := range a.mu.watch {
			subs = append(subs, s)
		}
		a.mu.Unlock()
		if len(subs) > 0 {
			req := &pb.QueryRequest{}
			for _, s := range subs {
				req.Subjects = append(req.Subjects, &pb.Subject{Node: s.node, Incarnation: s.inc})
			}
			if cc, err := a.conns.Get(o.GRPC); err == nil {
				qctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
				r, err := pb.NewObserverServiceClient(cc).Query(qctx, req)
				cancel()
				if err == nil && len(r.Dead) == len(subs) {
					t1 := now()
					for i, d := range r.Dead {
						if d {
							a.deadAnswer(o.ID, subs[i], t0.UnixNano(), t1)
						}
					}
				}
			}
		}
		sleepUntil(ctx, t0.Add(every))
	}
}

// deadAnswer records that observer said s is dead (in a poll from t0 to
// t1), and reports the verdict when a majority of observers have.
func (a *agent) deadAnswer(observer uint64, s subject, t0, t1 int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.mu.watch[s] {
		return // reported already
	}
	if a.mu.dead[s] == nil {
		a.mu.dead[s] = map[uint64]bool{}
	}
	a.mu.dead[s][observer] = true
	if n := len(a.mu.dead[s]); fd.CombineVerdicts(n, len(a.cfg.Nodes)) {
		delete(a.mu.watch, s)
		delete(a.mu.dead, s)
		a.emit(Event{Ev: "verdict", T0: t0, T1: t1, Node: s.node, Inc: s.inc, Votes: n})
	}
}

// hold acquires an exclusive lock through the clerk of the node at c.Addr
// and holds it until released (as `grove lock acquire NAME --mode
// exclusive --addr ADDR` does), reporting the grant and the end.
func (a *agent) hold(ctx context.Context, c Command) {
	end := func(err error) {
		a.mu.Lock()
		delete(a.mu.holds, c.ID)
		a.mu.Unlock()
		msg := "released"
		if ctx.Err() == nil && err != nil {
			msg = err.Error()
			if st, ok := status.FromError(err); ok {
				msg = st.Code().String() + ": " + st.Message()
			}
		}
		a.emit(Event{Ev: "ended", ID: c.ID, T0: now(), Err: msg})
	}
	cc, err := a.conns.Get(c.Addr)
	if err != nil {
		end(err)
		return
	}
	// WaitForReady: a connection still reconnecting after an earlier
	// fault (gRPC backs off up to 1 s) must delay the hold, not fail it.
	stream, err := pb.NewLockServiceClient(cc).Hold(ctx, &pb.HoldRequest{Name: []byte(c.Name), Mode: pb.LockMode_LOCK_MODE_EXCLUSIVE}, grpc.WaitForReady(true))
	if err != nil {
		end(err)
		return
	}
	for {
		ev, err := stream.Recv()
		if err != nil {
			end(err)
			return
		}
		if ev.Kind == pb.HoldResponse_KIND_GRANTED {
			a.emit(Event{Ev: "granted", ID: c.ID, T0: now(), Clerk: clerkID(ev.Clerk), Token: [2]uint64{ev.Token.GetEpoch(), ev.Token.GetSeq()}})
		}
	}
}

func clerkID(k *pb.ClerkId) string {
	return fmt.Sprintf("%d.%d.%d", k.GetNode(), k.GetIncarnation(), k.GetSeq())
}

// list asks a node for the lock service's state (`grove lock list`).
func (a *agent) list(ctx context.Context, c Command) {
	e := Event{Ev: "list", ID: c.ID, T0: now()}
	cc, err := a.conns.Get(c.Addr)
	if err == nil {
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		var r *pb.ListResponse
		r, err = pb.NewLockServiceClient(cc).List(lctx, &pb.ListRequest{})
		cancel()
		if err == nil {
			e.Master, e.Serving = r.Master.GetNode(), r.Serving
			defaults := map[uint64]bool{}
			for _, k := range r.Clerks {
				if k.Connected && !k.Dead {
					e.Clerks++
					if k.Kind == "" {
						defaults[k.Id.GetNode()] = true
					}
				}
			}
			e.Defaults = len(defaults)
			for _, l := range r.Locks {
				if string(l.Name) != c.Name {
					continue
				}
				for _, h := range l.Holders {
					e.Holders = append(e.Holders, fmt.Sprintf("%s:%v@%d.%d", clerkID(h.Clerk), h.Mode, h.Token.GetEpoch(), h.Token.GetSeq()))
				}
				for _, w := range l.Waiters {
					e.Waiters = append(e.Waiters, clerkID(w))
				}
			}
		}
	}
	if err != nil {
		e.Err = err.Error()
	}
	e.T1 = now()
	a.emit(e)
}

// scrape reads node n's /metrics and reports it (one event per node, with
// the command's id).
func (a *agent) scrape(ctx context.Context, id string, n AgentNode) {
	e := Event{Ev: "metrics", ID: id, Via: n.ID, T0: now()}
	err := func() error {
		sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(sctx, http.MethodGet, "http://"+n.Metrics+"/metrics", nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: %s", n.Metrics, resp.Status)
		}
		e.Metrics, err = metrics.Scrape(resp.Body)
		return err
	}()
	if err != nil {
		e.Err = err.Error()
	}
	e.T1 = now()
	a.emit(e)
}

// write proposes one decree every period into namespace ns, each putting a
// fresh key, conditional on the version the previous one produced (a stale
// answer gives the current version). It reports each decree's outcome; only
// acknowledged ones must survive. A decree whose outcome is unknown (a
// timeout) may or may not be applied: the next one's version settles it.
func (a *agent) write(ns string, every time.Duration, w *writer) {
	defer close(w.done)
	var version uint64
	for seq := 1; ; seq++ {
		select {
		case <-w.stop:
			return
		default:
		}
		t0 := time.Now()
		key := fmt.Sprintf("k%06d", seq)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		v, err := a.meta.Propose(ctx, &pb.Decree{Namespace: ns, ExpectedVersion: version, Origin: "faults agent",
			Ops: []*pb.Op{{Kind: pb.Op_KIND_PUT, Key: key, Value: []byte(t0.Format(time.RFC3339Nano))}}})
		cancel()
		e := Event{Ev: "decree", ID: ns, T0: t0.UnixNano(), T1: now(), Key: key}
		switch {
		case err == nil:
			version = v
			w.acked = append(w.acked, key)
		case errors.Is(err, meta.ErrStaleVersion):
			version = v
			e.Err = "stale"
		default:
			e.Err = err.Error()
		}
		a.emit(e)
		select {
		case <-w.stop:
			return
		case <-time.After(time.Until(t0.Add(every))):
		}
	}
}

// check stops a writer and reads its namespace linearizably: every
// acknowledged decree's key must be there.
func (a *agent) check(ctx context.Context, ns string, w *writer) {
	close(w.stop)
	<-w.done
	e := Event{Ev: "decree-check", ID: ns, T0: now(), Acked: len(w.acked)}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	r, err := a.meta.Read(rctx, ns)
	if err != nil {
		e.Err = err.Error()
	} else {
		have := map[string]bool{}
		for _, x := range r.Entries {
			have[x.Key] = true
		}
		for _, k := range w.acked {
			if !have[k] {
				e.Missing = append(e.Missing, k)
			}
		}
	}
	e.T1 = now()
	a.emit(e)
}

// garbage sends random bytes for d to every node's gRPC and raft ports
// (a connection each, written to and closed) and to every beacon port
// (random datagrams, some shaped like a failure-detector datagram).
func (a *agent) garbage(d time.Duration) {
	sent := 0
	udp, err := net.ListenPacket("udp4", ":0")
	if err != nil {
		a.emit(Event{Ev: "error", T0: now(), Err: err.Error()})
		return
	}
	defer udp.Close()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		for _, n := range a.cfg.Nodes {
			for _, addr := range []string{n.GRPC, n.Raft} {
				if c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
					c.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
					c.Write(randomBytes(256 + mrand.IntN(4096)))
					c.Close()
					sent++
				}
			}
			ba, err := net.ResolveUDPAddr("udp4", n.Beacon)
			if err != nil {
				continue
			}
			udp.WriteTo(randomBytes(1+mrand.IntN(128)), ba)
			shaped := randomBytes(fd.PacketSize)
			copy(shaped, "GFD2")
			shaped[4] = byte(1 + mrand.IntN(2))
			udp.WriteTo(shaped, ba)
			sent += 2
		}
	}
	a.emit(Event{Ev: "garbage-done", T0: now(), Sent: sent})
}

// forge sends, for d, well-formed failure-detector datagrams sealed with
// random keys (so with a wrong MAC) that would matter if they were
// accepted: beacons of each node's current incarnation (keeping it alive)
// and of the next one (which would end the current one), and echoes from
// every observer to every node (acknowledging it). Most are sent from the
// very address the real sender uses (a raw socket forges the source), so
// that only the MAC stands between them and the detector; the rest come
// from the client's own address.
func (a *agent) forge(d time.Duration) {
	raw, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_RAW, syscall.IPPROTO_RAW)
	if err != nil {
		a.emit(Event{Ev: "error", T0: now(), Err: fmt.Sprintf("raw socket: %v", err)})
		return
	}
	defer syscall.Close(raw)
	udp, err := net.ListenPacket("udp4", ":0")
	if err != nil {
		a.emit(Event{Ev: "error", T0: now(), Err: err.Error()})
		return
	}
	defer udp.Close()
	addrs := map[uint64]*net.UDPAddr{}
	for _, n := range a.cfg.Nodes {
		if addrs[n.ID], err = net.ResolveUDPAddr("udp4", n.Beacon); err != nil {
			a.emit(Event{Ev: "error", T0: now(), Err: err.Error()})
			return
		}
	}
	seal := func(p fd.Packet) []byte { return p.Seal(nil, randomBytes(32)) }
	sent := 0
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		a.mu.Lock()
		incs := map[uint64]uint64{}
		for k, v := range a.mu.incs {
			incs[k] = v
		}
		a.mu.Unlock()
		for _, s := range a.cfg.Nodes {
			inc := fd.Incarnation(incs[s.ID])
			if inc == 0 {
				continue
			}
			for _, o := range a.cfg.Nodes {
				if o.ID == s.ID {
					continue
				}
				subj := fd.NodeID(s.ID)
				for _, f := range []struct {
					p        fd.Packet
					from, to *net.UDPAddr
				}{
					{fd.Packet{Kind: fd.KindBeacon, Subject: subj, Incarnation: inc, Seq: 1 << 40}, addrs[s.ID], addrs[o.ID]},
					{fd.Packet{Kind: fd.KindBeacon, Subject: subj, Incarnation: inc + 1, Seq: 1}, addrs[s.ID], addrs[o.ID]},
					{fd.Packet{Kind: fd.KindEcho, Subject: subj, Incarnation: inc, Seq: 1 + mrand.Uint64N(1<<20), Observer: fd.NodeID(o.ID)}, addrs[o.ID], addrs[s.ID]},
				} {
					b := seal(f.p)
					if sendSpoofed(raw, f.from, f.to, b) == nil {
						sent++
					}
					if _, err := udp.WriteTo(b, f.to); err == nil {
						sent++
					}
				}
			}
		}
	}
	a.emit(Event{Ev: "forge-done", T0: now(), Sent: sent})
}

// sendSpoofed sends payload as a UDP datagram from src to dst through a raw
// socket (IPPROTO_RAW: the IP header is ours; the kernel fills in the
// checksum; a zero UDP checksum means none, which IPv4 allows).
func sendSpoofed(raw int, src, dst *net.UDPAddr, payload []byte) error {
	b := make([]byte, 28+len(payload))
	b[0] = 0x45 // IPv4, 20-byte header
	binary.BigEndian.PutUint16(b[2:], uint16(len(b)))
	b[8] = 64 // TTL
	b[9] = syscall.IPPROTO_UDP
	copy(b[12:16], src.IP.To4())
	copy(b[16:20], dst.IP.To4())
	binary.BigEndian.PutUint16(b[20:], uint16(src.Port))
	binary.BigEndian.PutUint16(b[22:], uint16(dst.Port))
	binary.BigEndian.PutUint16(b[24:], uint16(8+len(payload)))
	copy(b[28:], payload)
	sa := &syscall.SockaddrInet4{}
	copy(sa.Addr[:], dst.IP.To4())
	return syscall.Sendto(raw, b, 0, sa)
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}
