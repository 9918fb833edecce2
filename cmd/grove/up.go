package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/disk"
	"github.com/grovestore/grove/internal/fd"
	"github.com/grovestore/grove/internal/lock"
	"github.com/grovestore/grove/internal/meta"
	"github.com/grovestore/grove/internal/node"
	"github.com/grovestore/grove/internal/transport"
)

// Port layout of `grove up` from --base-port B (default 7400):
//
//	B          gateway (grove status with no --addr)
//	B+10·i     node i gRPC
//	B+10·i+1   node i raft
//	B+10·i+2   node i beacon (UDP)
type upOptions struct {
	nodes     int
	members   int
	data      string
	processes bool
	basePort  int
	host      string
	readyWait time.Duration
}

func upCmd() *cobra.Command {
	o := upOptions{}
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Run an embedded cluster on loopback (3 nodes, data under ./grove-data)",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return runUp(o) },
	}
	f := cmd.Flags()
	f.IntVar(&o.nodes, "nodes", 3, "number of nodes")
	f.IntVar(&o.members, "meta", 3, "config-service members (odd; also the failure detector's observers)")
	f.StringVar(&o.data, "data", "grove-data", "data directory; running again on it brings back the same cluster")
	f.BoolVar(&o.processes, "processes", false, "run each node as a child process (grove server --config ...)")
	f.IntVar(&o.basePort, "base-port", 7400, "gateway port; node i uses base+10i (gRPC), +1 (raft), +2 (beacon, UDP)")
	f.StringVar(&o.host, "host", "127.0.0.1", "loopback address to listen on")
	f.DurationVar(&o.readyWait, "ready-timeout", 60*time.Second, "how long to wait for the cluster to become ready")
	return cmd
}

// layout returns the node configs for the cluster under o.data, creating
// them on first run and reading them back afterwards (same ids, same
// addresses, same data directories).
func layout(o upOptions) (cfgs []*node.Config, paths []string, created bool, err error) {
	data, err := filepath.Abs(o.data)
	if err != nil {
		return nil, nil, false, err
	}
	existing, _ := filepath.Glob(filepath.Join(data, "node-*", "grove.toml"))
	if len(existing) > 0 {
		sort.Slice(existing, func(i, j int) bool { return nodeNum(existing[i]) < nodeNum(existing[j]) })
		if len(existing) != o.nodes {
			return nil, nil, false, fmt.Errorf("%s holds a %d-node cluster; run with --nodes %d (or another --data)", data, len(existing), len(existing))
		}
		key := ""
		for _, p := range existing {
			c, err := node.ReadConfig(p)
			if err != nil {
				return nil, nil, false, err
			}
			if c.ClusterKey != "" {
				key = c.ClusterKey
			}
			cfgs = append(cfgs, c)
		}
		// A directory made before failure-detector datagrams were
		// authenticated has no cluster key: give every node the same one.
		if key == "" {
			key = node.NewClusterKey()
		}
		for i, c := range cfgs {
			// Directories made before a setting existed get it now: the
			// same cluster key everywhere, metrics at the gRPC port + 3.
			changed := false
			if c.ClusterKey == "" {
				c.ClusterKey, changed = key, true
			}
			if c.MetricsAddr == "" {
				if h, p, err := net.SplitHostPort(c.GRPCAddr); err == nil {
					if port, err := strconv.Atoi(p); err == nil && port+3 <= 65535 {
						c.MetricsAddr, changed = net.JoinHostPort(h, strconv.Itoa(port+3)), true
					}
				}
			}
			if changed {
				if err := c.Write(existing[i]); err != nil {
					return nil, nil, false, err
				}
			}
			if err := c.Validate(); err != nil {
				return nil, nil, false, fmt.Errorf("config %s: %w", existing[i], err)
			}
		}
		return cfgs, existing, false, nil
	}
	if o.nodes < 1 {
		return nil, nil, false, errors.New("--nodes must be at least 1")
	}
	m := o.members
	if m > o.nodes {
		m = o.nodes
	}
	if m%2 == 0 {
		m--
	}
	if m < 1 {
		return nil, nil, false, errors.New("--meta must be an odd number >= 1")
	}
	addr := func(port int) string { return net.JoinHostPort(o.host, strconv.Itoa(port)) }
	var members []node.MemberConfig
	for i := 1; i <= m; i++ {
		b := o.basePort + 10*i
		members = append(members, node.MemberConfig{ID: uint64(i), GRPC: addr(b), Raft: addr(b + 1), Beacon: addr(b + 2)})
	}
	key := node.NewClusterKey() // every node of the cluster shares it
	for i := 1; i <= o.nodes; i++ {
		b := o.basePort + 10*i
		c := &node.Config{ID: uint64(i), DataDir: filepath.Join(data, fmt.Sprintf("node-%d", i)), GRPCAddr: addr(b), RaftAddr: addr(b + 1),
			BeaconAddr: addr(b + 2), MetricsAddr: addr(b + 3), Roles: []string{"store"}, FD: node.DefaultFD, Members: members, ClusterKey: key}
		if i <= m {
			c.Roles = []string{node.RoleMeta, node.RoleObserver, node.RoleLock, "store"}
		}
		if err := c.Validate(); err != nil {
			return nil, nil, false, err
		}
		if err := os.MkdirAll(c.DataDir, 0o755); err != nil {
			return nil, nil, false, err
		}
		p := filepath.Join(c.DataDir, "grove.toml")
		if err := c.Write(p); err != nil {
			return nil, nil, false, err
		}
		cfgs = append(cfgs, c)
		paths = append(paths, p)
	}
	return cfgs, paths, true, nil
}

func nodeNum(p string) int {
	n, _ := strconv.Atoi(strings.TrimPrefix(filepath.Base(filepath.Dir(p)), "node-"))
	return n
}

// checkPorts fails with a clear message if any address is taken.
func checkPorts(gateway string, cfgs []*node.Config) error {
	type want struct{ what, network, addr string }
	ws := []want{{"gateway", "tcp", gateway}}
	for _, c := range cfgs {
		ws = append(ws, want{fmt.Sprintf("node %d gRPC", c.ID), "tcp", c.GRPCAddr}, want{fmt.Sprintf("node %d beacon", c.ID), "udp", c.BeaconAddr})
		if c.Has(node.RoleMeta) {
			ws = append(ws, want{fmt.Sprintf("node %d raft", c.ID), "tcp", c.RaftAddr})
		}
		if c.MetricsAddr != "" {
			ws = append(ws, want{fmt.Sprintf("node %d metrics", c.ID), "tcp", c.MetricsAddr})
		}
	}
	for _, w := range ws {
		var err error
		if w.network == "udp" {
			var pc net.PacketConn
			if pc, err = net.ListenPacket("udp", w.addr); err == nil {
				pc.Close()
			}
		} else {
			var l net.Listener
			if l, err = net.Listen("tcp", w.addr); err == nil {
				l.Close()
			}
		}
		if err != nil {
			return fmt.Errorf("%s address %s is taken (%v): is another `grove up` running? stop it, or pass --base-port", w.what, w.addr, err)
		}
	}
	return nil
}

func runUp(o upOptions) error {
	cfgs, paths, created, err := layout(o)
	if err != nil {
		return err
	}
	gateway := net.JoinHostPort(o.host, strconv.Itoa(o.basePort))
	if err := checkPorts(gateway, cfgs); err != nil {
		return err
	}
	data, _ := filepath.Abs(o.data)
	logf, err := os.OpenFile(filepath.Join(data, "grove.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	log := slog.New(slog.NewTextHandler(logf, nil))

	// The incarnations of the last run: ready means every node registered a
	// newer one and a majority of observers hear it.
	before := map[uint64]uint64{}
	for _, c := range cfgs {
		inc, err := fd.LoadIncarnation(disk.OS{}, filepath.Join(c.DataDir, "incarnation"))
		if err != nil {
			return err
		}
		before[c.ID] = uint64(inc)
	}
	var stop func()
	if o.processes {
		stop, err = startProcesses(cfgs, paths, log, created)
	} else {
		stop, err = startInProcess(cfgs, paths, log, logf, created)
	}
	if err != nil {
		return err
	}
	defer stop()

	// The gateway: status for the whole cluster at a fixed address.
	members := cfgs[0].Members
	var mm []meta.Member
	for _, m := range members {
		mm = append(mm, meta.Member{ID: m.ID, RaftAddr: m.Raft, GRPCAddr: m.GRPC})
	}
	client := meta.NewClient(mm)
	defer client.Close()
	status := node.NewStatusService(client, members)
	defer status.Close()
	gs := grpc.NewServer(transport.ServerOptions()...)
	pb.RegisterClusterServiceServer(gs, status)
	var nodeAddrs []string
	for _, c := range cfgs {
		nodeAddrs = append(nodeAddrs, c.GRPCAddr)
	}
	locks := &lock.Gateway{Meta: client, Nodes: nodeAddrs}
	defer locks.Close()
	pb.RegisterLockServiceServer(gs, locks)
	lis, err := transport.Listen(gateway)
	if err != nil {
		return fmt.Errorf("gateway %s: %w", gateway, err)
	}
	go gs.Serve(lis)
	defer gs.Stop()

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	if err := waitReady(status, before, o.readyWait, sig); err != nil {
		return err
	}
	s := <-sig
	fmt.Printf("stopping (%s)\n", s)
	return nil
}

// waitReady polls until the config service has a leader and every node has
// registered an incarnation newer than before[id] that a majority of
// observers hear, then prints the ready line.
func waitReady(s *node.StatusService, before map[uint64]uint64, limit time.Duration, sig chan os.Signal) error {
	n := len(before)
	deadline := time.Now().Add(limit)
	var last string
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		r, err := s.Status(ctx, &pb.StatusRequest{})
		cancel()
		if err == nil {
			alive := 0
			for _, nd := range r.Nodes {
				if nd.Alive && nd.Incarnation > before[nd.Id] && int(nd.ObserversHeard) > len(r.Members)/2 {
					alive++
				}
			}
			if r.Leader != 0 && len(r.Nodes) == n && alive == n {
				fmt.Printf("ready: %d nodes alive, config-service leader %d; `grove status` for details\n", n, r.Leader)
				return nil
			}
			last = fmt.Sprintf("leader %d, %d/%d nodes registered, %d alive", r.Leader, len(r.Nodes), n, alive)
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cluster not ready after %v: %s (see grove.log in the data directory)", limit, last)
		}
		select {
		case s := <-sig:
			return fmt.Errorf("interrupted (%s) before the cluster was ready", s)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func printNode(c *node.Config, pid int, path string) {
	fmt.Printf("node %d pid=%d grpc=%s beacon=%s config=%s\n", c.ID, pid, c.GRPCAddr, c.BeaconAddr, path)
}

func startInProcess(cfgs []*node.Config, paths []string, log *slog.Logger, raftLog *os.File, bootstrap bool) (func(), error) {
	var nodes []*node.Node
	stop := func() {
		var wg sync.WaitGroup
		for _, n := range nodes {
			wg.Add(1)
			go func() { defer wg.Done(); n.Close() }()
		}
		wg.Wait()
	}
	for i, c := range cfgs {
		n, err := node.Start(c, node.Options{Logger: log, RaftLog: raftLog, Bootstrap: bootstrap})
		if err != nil {
			stop()
			return nil, err
		}
		nodes = append(nodes, n)
		printNode(c, os.Getpid(), paths[i])
	}
	return stop, nil
}

// startProcesses runs each node as `grove server --config PATH`. A child that
// dies is reported, not restarted: its printed command brings it back.
func startProcesses(cfgs []*node.Config, paths []string, log *slog.Logger, bootstrap bool) (func(), error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	var mu sync.Mutex
	var cmds []*exec.Cmd
	var wg sync.WaitGroup
	stopping := false
	stop := func() {
		mu.Lock()
		stopping = true
		for _, c := range cmds {
			c.Process.Signal(syscall.SIGTERM)
		}
		mu.Unlock()
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			mu.Lock()
			for _, c := range cmds {
				c.Process.Kill()
			}
			mu.Unlock()
			<-done
		}
	}
	for i, c := range cfgs {
		lf, err := os.OpenFile(filepath.Join(c.DataDir, "grove.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			stop()
			return nil, err
		}
		args := []string{"server", "--config", paths[i]}
		if bootstrap && c.Has(node.RoleMeta) {
			args = append(args, "--bootstrap") // a new cluster; the printed restart command has no --bootstrap
		}
		cmd := exec.Command(self, args...)
		cmd.Stdout, cmd.Stderr = lf, lf
		// Own process group: a Ctrl-C at the terminal reaches only grove up,
		// which then stops the children in order.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			lf.Close()
			stop()
			return nil, err
		}
		mu.Lock()
		cmds = append(cmds, cmd)
		mu.Unlock()
		printNode(c, cmd.Process.Pid, paths[i])
		wg.Add(1)
		go func(c *node.Config, path string) {
			defer wg.Done()
			err := cmd.Wait()
			lf.Close()
			log.Warn("node process exited", "node", c.ID, "pid", cmd.Process.Pid, "err", err)
			mu.Lock()
			quiet := stopping
			mu.Unlock()
			if quiet {
				return
			}
			fmt.Fprintf(os.Stderr, "node %d (pid %d) exited: %v; restart it with: %s server --config %s\n", c.ID, cmd.Process.Pid, err, self, path)
		}(c, paths[i])
	}
	return stop, nil
}
