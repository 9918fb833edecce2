// Package bench holds the workload generators behind `grove bench`. Each
// benchmark re-runs a paper's experiment, or measures a Grove service next to
// a peer (etcd, for the config service) on the same machine in the same run.
package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/grovestore/grove/internal/ports"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/grovestore/grove/api/etcdpb"
	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/meta"
)

// Result summarises one load run.
type Result struct {
	System      string
	Concurrency int
	Ops         int
	Elapsed     time.Duration
	P50, P99    time.Duration
}

// PerSec is operations per second.
func (r Result) PerSec() float64 { return float64(r.Ops) / r.Elapsed.Seconds() }

func (r Result) String() string {
	return fmt.Sprintf("%-6s conc=%-3d ops=%-6d %8.0f ops/s  p50=%-9v p99=%v", r.System, r.Concurrency, r.Ops, r.PerSec(), r.P50.Round(time.Microsecond), r.P99.Round(time.Microsecond))
}

// Percentile returns the p-th percentile (0..100) of sorted latencies.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted)-1) * p / 100)
	return sorted[i]
}

// runLoad runs op from conc workers until ops operations are done.
func runLoad(system string, conc, ops int, op func(worker, i int) error) (Result, error) {
	lat := make([][]time.Duration, conc)
	var wg sync.WaitGroup
	errs := make(chan error, conc)
	per := ops / conc
	start := time.Now()
	for w := 0; w < conc; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < per; i++ {
				t := time.Now()
				if err := op(w, i); err != nil {
					errs <- err
					return
				}
				lat[w] = append(lat[w], time.Since(t))
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	if err := <-errs; err != nil {
		return Result{}, err
	}
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	return Result{System: system, Concurrency: conc, Ops: len(all), Elapsed: elapsed, P50: Percentile(all, 50), P99: Percentile(all, 99)}, nil
}

// freePorts returns n loopback ports free when checked (ports.Free:
// below the kernel's ephemeral range).
func freePorts(n int) ([]int, error) { return ports.Free(n) }

// GroveConfigService is a 3-replica config service on loopback TCP (raft
// with its durable bolt log, fsync on every commit) with gRPC in front.
type GroveConfigService struct {
	Members []meta.Member
	servers []*meta.Server
	grpcs   []*grpc.Server
}

// StartGroveConfigService starts n replicas under dir.
func StartGroveConfigService(dir string, n int) (*GroveConfigService, error) {
	ports, err := freePorts(2 * n)
	if err != nil {
		return nil, err
	}
	g := &GroveConfigService{}
	for i := 0; i < n; i++ {
		g.Members = append(g.Members, meta.Member{ID: uint64(i + 1), GRPCAddr: fmt.Sprintf("127.0.0.1:%d", ports[2*i]), RaftAddr: fmt.Sprintf("127.0.0.1:%d", ports[2*i+1])})
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, m := range g.Members {
		s, err := meta.Open(meta.Config{Bootstrap: true, ID: m.ID, Dir: filepath.Join(dir, fmt.Sprint(m.ID)), Members: g.Members, Logger: quiet, RaftLog: io.Discard})
		if err != nil {
			g.Close()
			return nil, err
		}
		lis, err := net.Listen("tcp", m.GRPCAddr)
		if err != nil {
			s.Close()
			g.Close()
			return nil, err
		}
		gs := grpc.NewServer()
		s.RegisterGRPC(gs)
		go gs.Serve(lis)
		g.servers, g.grpcs = append(g.servers, s), append(g.grpcs, gs)
	}
	return g, nil
}

// Close stops every replica.
func (g *GroveConfigService) Close() {
	for _, gs := range g.grpcs {
		gs.Stop()
	}
	for _, s := range g.servers {
		s.Close()
	}
}

// DecreeLoad measures decree commit latency and throughput: each worker owns
// one namespace and passes conditional decrees on it (one 64-byte put each),
// so every decree commits (no stale-version retries inflate the figures).
func DecreeLoad(ctx context.Context, g *GroveConfigService, conc, ops int) (Result, error) {
	c := meta.NewClient(g.Members)
	defer c.Close()
	versions := make([]uint64, conc)
	names := make([]string, conc)
	run := time.Now().UnixNano()
	for w := range names { // warm up: find the leader, create the namespaces
		names[w] = fmt.Sprintf("bench-%d-%d", run, w)
		v, err := c.Propose(ctx, &pb.Decree{Namespace: names[w], Ops: []*pb.Op{{Kind: pb.Op_KIND_PUT, Key: "k", Value: make([]byte, 64)}}})
		if err != nil {
			return Result{}, err
		}
		versions[w] = v
	}
	val := make([]byte, 64)
	return runLoad("grove", conc, ops, func(w, i int) error {
		v, err := c.Propose(ctx, &pb.Decree{Namespace: names[w], ExpectedVersion: versions[w], Ops: []*pb.Op{{Kind: pb.Op_KIND_PUT, Key: "k" + strconv.Itoa(i%64), Value: val}}})
		versions[w] = v
		return err
	})
}

// EtcdCluster is a 3-member etcd cluster on loopback, for comparison.
type EtcdCluster struct {
	Clients []string
	procs   []*exec.Cmd
	dir     string
}

// StartEtcd starts n etcd members under dir using the etcd binary on PATH.
func StartEtcd(dir string, n int) (*EtcdCluster, error) {
	bin, err := exec.LookPath("etcd")
	if err != nil {
		return nil, fmt.Errorf("etcd not installed (apt-get install etcd-server): %w", err)
	}
	ports, err := freePorts(2 * n)
	if err != nil {
		return nil, err
	}
	var initial []string
	for i := 0; i < n; i++ {
		initial = append(initial, fmt.Sprintf("e%d=http://127.0.0.1:%d", i+1, ports[2*i+1]))
	}
	e := &EtcdCluster{dir: dir}
	for i := 0; i < n; i++ {
		client := fmt.Sprintf("http://127.0.0.1:%d", ports[2*i])
		peer := fmt.Sprintf("http://127.0.0.1:%d", ports[2*i+1])
		cmd := exec.Command(bin, "--name", fmt.Sprintf("e%d", i+1), "--data-dir", filepath.Join(dir, fmt.Sprintf("e%d", i+1)),
			"--listen-client-urls", client, "--advertise-client-urls", client,
			"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new",
			"--initial-cluster-token", "grove-bench", "--log-level", "error")
		lf, err := os.Create(filepath.Join(dir, fmt.Sprintf("e%d.log", i+1)))
		if err != nil {
			e.Close()
			return nil, err
		}
		cmd.Stdout, cmd.Stderr = lf, lf
		if err := cmd.Start(); err != nil {
			e.Close()
			return nil, err
		}
		e.procs = append(e.procs, cmd)
		e.Clients = append(e.Clients, strings.TrimPrefix(client, "http://"))
	}
	return e, nil
}

// Close kills the members.
func (e *EtcdCluster) Close() {
	for _, p := range e.procs {
		p.Process.Kill()
		p.Wait()
	}
}

// leader finds the client address of the current etcd leader.
func (e *EtcdCluster) leader(ctx context.Context, conns []*grpc.ClientConn) (int, error) {
	for ctx.Err() == nil {
		for i, cc := range conns {
			c, cancel := context.WithTimeout(ctx, time.Second)
			r, err := etcdpb.NewMaintenanceClient(cc).Status(c, &etcdpb.StatusRequest{})
			cancel()
			if err == nil && r.Leader != 0 && r.Header.GetMemberId() == r.Leader {
				return i, nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return 0, fmt.Errorf("etcd has no leader: %w", ctx.Err())
}

// EtcdPutLoad measures etcd puts of the same size at the same concurrency,
// sent to the leader over gRPC, like Grove's decrees.
func EtcdPutLoad(ctx context.Context, e *EtcdCluster, conc, ops int) (Result, error) {
	var conns []*grpc.ClientConn
	for _, a := range e.Clients {
		cc, err := grpc.NewClient(a, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return Result{}, err
		}
		defer cc.Close()
		conns = append(conns, cc)
	}
	li, err := e.leader(ctx, conns)
	if err != nil {
		return Result{}, err
	}
	kv := etcdpb.NewKVClient(conns[li])
	val := make([]byte, 64)
	return runLoad("etcd", conc, ops, func(w, i int) error {
		_, err := kv.Put(ctx, &etcdpb.PutRequest{Key: []byte(fmt.Sprintf("bench/%d/k%d", w, i%64)), Value: val})
		return err
	})
}
