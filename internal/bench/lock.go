package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/lock"
	"github.com/grovestore/grove/internal/meta"
	"github.com/grovestore/grove/internal/node"
	"github.com/grovestore/grove/internal/transport"
	"github.com/grovestore/grove/internal/units"
)

// InProcessCluster is n nodes in this process on loopback (as `grove up`).
type InProcessCluster struct {
	Nodes   []*node.Node // nil while stopped
	Configs []*node.Config
	log     *slog.Logger
}

// ClusterOptions shape an in-process cluster.
type ClusterOptions struct {
	// Store gives every node the store role and a disk file of DiskSize
	// bytes (default 256 MiB).
	Store    bool
	DiskSize int64
	// DataPath is the nodes' [rldev] data_path ("tcp" or "grpc"; default
	// tcp).
	DataPath string
	// DirectWrites is the nodes' [rldev] direct_writes.
	DirectWrites bool
	// Log receives the nodes' lines (default: none).
	Log *slog.Logger
	// ResvLife is the nodes' [chunk] reservation_life (0: the default).
	ResvLife time.Duration
	// RepairEvery is the nodes' [btree] repair_every (0: the default).
	RepairEvery time.Duration
	// SplitBytes is the nodes' [tables] split_bytes (0: the default).
	SplitBytes int64
	// GracePeriod is the nodes' [fd] grace_period (0: Boxwood's 1 s). A
	// test that measures something else under the race detector beside
	// other packages sets it longer: starved of CPU for a second, every
	// node fences itself at once, and a table whose every replica fenced
	// is lost, as DDS says (2026-12-03: TestServiceTableBatchedTermination).
	GracePeriod time.Duration
}

// StartInProcess starts n nodes (the first three are config-service
// members, observers and lock candidates) under dir.
func StartInProcess(dir string, n int) (*InProcessCluster, error) {
	return StartCluster(dir, n, ClusterOptions{})
}

// StartCluster starts n nodes under dir as o says. A start that lost a
// port to another process between its check and its bind (ports.Free:
// packages' tests run side by side) is made again on new ports, from empty
// node directories, up to three times.
func StartCluster(dir string, n int, o ClusterOptions) (*InProcessCluster, error) {
	for try := 1; ; try++ {
		c, err := startCluster(dir, n, o)
		if err == nil || try == 3 || !(errors.Is(err, syscall.EADDRINUSE) || strings.Contains(err.Error(), "address already in use")) {
			return c, err
		}
		for i := 0; i < n; i++ {
			if err := os.RemoveAll(filepath.Join(dir, fmt.Sprintf("node-%d", i+1))); err != nil {
				return nil, err
			}
		}
	}
}

func startCluster(dir string, n int, o ClusterOptions) (*InProcessCluster, error) {
	ports, err := freePorts(3 * n)
	if err != nil {
		return nil, err
	}
	addr := func(p int) string { return fmt.Sprintf("127.0.0.1:%d", p) }
	var members []node.MemberConfig
	nm := min(n, 3)
	if nm%2 == 0 {
		nm-- // an odd number of config-service members
	}
	for i := 0; i < nm; i++ {
		members = append(members, node.MemberConfig{ID: uint64(i + 1), GRPC: addr(ports[3*i]), Raft: addr(ports[3*i+1]), Beacon: addr(ports[3*i+2])})
	}
	c := &InProcessCluster{log: o.Log}
	if c.log == nil {
		c.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if o.DiskSize == 0 {
		o.DiskSize = 256 << 20
	}
	key := node.NewClusterKey()
	for i := 0; i < n; i++ {
		cfg := &node.Config{ID: uint64(i + 1), DataDir: filepath.Join(dir, fmt.Sprintf("node-%d", i+1)), GRPCAddr: addr(ports[3*i]),
			RaftAddr: addr(ports[3*i+1]), BeaconAddr: addr(ports[3*i+2]), Roles: []string{}, FD: node.DefaultFD, Members: members, ClusterKey: key}
		if i < nm {
			cfg.Roles = []string{node.RoleMeta, node.RoleObserver, node.RoleLock}
		}
		if o.Store {
			cfg.Roles = append(cfg.Roles, node.RoleStore)
			cfg.Disks, cfg.DiskSize = []string{"disk0.img"}, units.Size(o.DiskSize)
			cfg.RLDev.DataPath = o.DataPath
			cfg.RLDev.DirectWrites = o.DirectWrites
			cfg.Chunk.ReservationLife = node.Duration(o.ResvLife)
		}
		cfg.BTree.RepairEvery = node.Duration(o.RepairEvery)
		cfg.Tables.SplitBytes = units.Size(o.SplitBytes)
		if o.GracePeriod > 0 {
			cfg.FD.GracePeriod = node.Duration(o.GracePeriod)
		}
		c.Configs = append(c.Configs, cfg)
		c.Nodes = append(c.Nodes, nil)
		if err := c.Start(i); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

// Start starts node i (0-based) again from its config (the first start
// bootstraps the config service).
func (c *InProcessCluster) Start(i int) error {
	if c.Nodes[i] != nil {
		return nil
	}
	nd, err := node.Start(c.Configs[i], node.Options{Logger: c.log, RaftLog: io.Discard, Bootstrap: true})
	if err != nil {
		return err
	}
	c.Nodes[i] = nd
	return nil
}

// Stop stops node i (0-based), gracefully: its process would live on.
func (c *InProcessCluster) Stop(i int) {
	if c.Nodes[i] != nil {
		c.Nodes[i].Close()
		c.Nodes[i] = nil
	}
}

// Crash stops node i (0-based) as a crash would (Node.Crash).
func (c *InProcessCluster) Crash(i int) {
	if c.Nodes[i] != nil {
		c.Nodes[i].Crash()
		c.Nodes[i] = nil
	}
}

// Members are the config-service members, for a meta client.
func (c *InProcessCluster) Members() []meta.Member {
	var ms []meta.Member
	for _, m := range c.Configs[0].Members {
		ms = append(ms, meta.Member{ID: m.ID, RaftAddr: m.Raft, GRPCAddr: m.GRPC})
	}
	return ms
}

// Close stops every node.
func (c *InProcessCluster) Close() {
	for i := range c.Nodes {
		c.Stop(i)
	}
}

// WaitLockMaster waits until the lock service serves with every node's
// clerk connected and returns the master's node id.
func (c *InProcessCluster) WaitLockMaster(ctx context.Context) (uint64, error) {
	for {
		r, err := c.Nodes[0].Locks().List(ctx, &pb.ListRequest{})
		if err == nil && r.Serving {
			connected := 0
			for _, cl := range r.Clerks {
				if cl.Connected {
					connected++
				}
			}
			if connected >= len(c.Nodes) {
				return r.Master.Node, nil
			}
		}
		if !sleepCtx(ctx, 50*time.Millisecond) {
			return 0, fmt.Errorf("lock service not serving: %v", err)
		}
	}
}

// SleepCtx sleeps d, or less if ctx ends (then false).
func SleepCtx(ctx context.Context, d time.Duration) bool { return sleepCtx(ctx, d) }

func sleepCtx(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// LockResults are the figures of `grove bench lock`.
type LockResults struct {
	Uncontended Result // acquire (RPC) + release, the lease given back each time
	Cached      Result // acquire + release of a cached lease: no RPC
	Handoff     Result // an exclusive lock ping-ponged between clerks on two nodes
}

// LockBench measures a clerk on a node that is not the lock master.
func LockBench(ctx context.Context, c *InProcessCluster, ops int) (LockResults, error) {
	var res LockResults
	masterID, err := c.WaitLockMaster(ctx)
	if err != nil {
		return res, err
	}
	var remote []*node.Node
	for _, n := range c.Nodes {
		if n.ID() != masterID {
			remote = append(remote, n)
		}
	}
	a, b := remote[0].Locks().DefaultClerk(), remote[1].Locks().DefaultClerk()

	timed := func(system string, n int, op func(i int) error) (Result, error) {
		lat := make([]time.Duration, 0, n)
		start := time.Now()
		for i := 0; i < n; i++ {
			t := time.Now()
			if err := op(i); err != nil {
				return Result{}, err
			}
			lat = append(lat, time.Since(t))
		}
		el := time.Since(start)
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		return Result{System: system, Concurrency: 1, Ops: n, Elapsed: el, P50: Percentile(lat, 50), P99: Percentile(lat, 99)}, nil
	}
	res.Uncontended, err = timed("rpc", ops, func(i int) error {
		h, err := a.Acquire(ctx, "bench-uncontended", lock.Exclusive)
		if err != nil {
			return err
		}
		h.Release()
		a.Drop("bench-uncontended") // give the lease back: the next acquire is a round trip
		return nil
	})
	if err != nil {
		return res, err
	}
	res.Cached, err = timed("cached", ops*50, func(i int) error {
		h, err := a.Acquire(ctx, "bench-cached", lock.Exclusive)
		if err != nil {
			return err
		}
		h.Release()
		return nil
	})
	if err != nil {
		return res, err
	}
	// Hand-off: the lock alternates between a and b; each acquire must wait
	// for the master to revoke the other clerk's cached lease.
	clerks := [2]*lock.ClerkRT{a, b}
	res.Handoff, err = timed("handoff", ops, func(i int) error {
		h, err := clerks[i%2].Acquire(ctx, "bench-handoff", lock.Exclusive)
		if err != nil {
			return err
		}
		h.Release()
		return nil
	})
	return res, err
}

// LockKillTrial is one SIGKILL of a holder's node.
type LockKillTrial struct {
	ToGrant time.Duration // SIGKILL → the waiter on another node is granted
}

// LockFailover holds a lock from one node's clerk over the Hold RPC, has a
// waiter on another node, SIGKILLs the holder's node and times the grant.
func LockFailover(ctx context.Context, u *UpCluster, trials int, progress io.Writer) ([]LockKillTrial, error) {
	var out []LockKillTrial
	for t := 0; t < trials; t++ {
		r, err := u.lockList(ctx)
		if err != nil {
			return out, err
		}
		var ids []uint64
		for id := uint64(1); id <= uint64(len(u.Nodes)); id++ {
			if id != r.Master.GetNode() {
				ids = append(ids, id)
			}
		}
		holder, waiter := ids[t%len(ids)], ids[(t+1)%len(ids)]
		name := fmt.Sprintf("bench-kill-%d", t)
		hctx, hcancel := context.WithCancel(ctx)
		hs, err := u.hold(hctx, holder, name)
		if err != nil {
			hcancel()
			return out, err
		}
		if _, err := hs.Recv(); err != nil {
			hcancel()
			return out, fmt.Errorf("holder on node %d: %w", holder, err)
		}
		wctx, wcancel := context.WithCancel(ctx)
		ws, err := u.hold(wctx, waiter, name)
		if err != nil {
			hcancel()
			wcancel()
			return out, err
		}
		time.Sleep(200 * time.Millisecond) // the waiter's request reaches the master
		killed := time.Now()
		if err := u.Kill(holder); err != nil {
			hcancel()
			wcancel()
			return out, err
		}
		_, err = ws.Recv()
		took := time.Since(killed)
		hcancel()
		wcancel()
		if err != nil {
			return out, fmt.Errorf("waiter on node %d: %w", waiter, err)
		}
		out = append(out, LockKillTrial{ToGrant: took})
		if progress != nil {
			fmt.Fprintf(progress, "trial %d/%d: SIGKILL node %d (holder) → node %d granted in %v\n", t+1, trials, holder, waiter, took.Round(time.Millisecond))
		}
		if err := u.Restart(holder); err != nil {
			return out, err
		}
		if _, _, err := u.WaitNode(ctx, holder, 20*time.Millisecond, func(n *pb.NodeStatus) bool { return n.Alive }); err != nil {
			return out, err
		}
	}
	return out, nil
}

func (u *UpCluster) lockList(ctx context.Context) (*pb.ListResponse, error) {
	for {
		c, cancel := context.WithTimeout(ctx, 5*time.Second)
		r, err := pb.NewLockServiceClient(u.conn).List(c, &pb.ListRequest{})
		cancel()
		if err == nil && r.Serving {
			return r, nil
		}
		if !sleepCtx(ctx, 100*time.Millisecond) {
			return nil, fmt.Errorf("lock service not serving: %v", err)
		}
	}
}

func (u *UpCluster) hold(ctx context.Context, id uint64, name string) (interface {
	Recv() (*pb.HoldResponse, error)
}, error) {
	cl, err := dialLockService(u.Nodes[id].GRPC)
	if err != nil {
		return nil, err
	}
	go func() { <-ctx.Done(); cl.close() }()
	return cl.c.Hold(ctx, &pb.HoldRequest{Name: []byte(name), Mode: pb.LockMode_LOCK_MODE_EXCLUSIVE})
}

type lockConn struct {
	c     pb.LockServiceClient
	close func()
}

func dialLockService(addr string) (*lockConn, error) {
	cc, err := grpc.NewClient(addr, transport.DialOptions()...)
	if err != nil {
		return nil, err
	}
	return &lockConn{c: pb.NewLockServiceClient(cc), close: func() { cc.Close() }}, nil
}
