package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pelletier/go-toml/v2"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/chunk"
	"github.com/grovestore/grove/internal/cli"
	"github.com/grovestore/grove/internal/disk"
	"github.com/grovestore/grove/internal/fd"
	"github.com/grovestore/grove/internal/lock"
	"github.com/grovestore/grove/internal/logging"
	"github.com/grovestore/grove/internal/meta"
	"github.com/grovestore/grove/internal/node"
	"github.com/grovestore/grove/internal/rldev"
	"github.com/grovestore/grove/internal/transport"
	"github.com/grovestore/grove/internal/units"
)

// Port layout of `grove up` from --base-port B (default 7400):
//
//	B          gateway (what client commands talk to by default)
//	B+10·i     node i gRPC
//	B+10·i+1   node i raft
//	B+10·i+2   node i beacon (UDP)
//	B+10·i+3   node i metrics (HTTP)
type upOptions struct {
	nodes     int
	members   int
	data      string
	processes bool
	basePort  int
	host      string
	readyWait time.Duration
	logLevel  string
	logFormat string
	diskSize  units.Size
	disks     int
	dataPath  string
	direct    bool
	chunkSize units.Size
	resvLife  time.Duration
	changed   func(flag string) bool // set on the command line
}

// DefaultChunkSize is the data RLDev of each chunk manager pair grove up
// makes on a new cluster (at most an eighth of --disk-size).
const DefaultChunkSize = 1 << 30

// DefaultDiskSize is each node's disk file under grove up (sparse: space
// is taken as RLDevs are written).
const DefaultDiskSize = 8 << 30

// MaxUpNodes bounds --nodes: an embedded cluster is for one machine.
const MaxUpNodes = 64

// MaxUpDisks bounds --disks.
const MaxUpDisks = 16

// upDisks returns the disk files of a node given n of them.
func upDisks(n int) []string {
	var ds []string
	for i := range n {
		ds = append(ds, fmt.Sprintf("disk%d.img", i))
	}
	return ds
}

// upRecord is DIR/cluster.toml: the settings a data directory was created
// with. Node addresses are fixed in the node configs, so a later run with
// other settings is refused rather than half applied.
type upRecord struct {
	Nodes    int    `toml:"nodes"`
	Meta     int    `toml:"meta"`
	BasePort int    `toml:"base_port"`
	Host     string `toml:"host"`
	// LogFormat keeps every node's log file in one format across runs.
	LogFormat string `toml:"log_format"`
	// DiskSize is each node's disk file (created on the first run).
	DiskSize int64 `toml:"disk_size"`
}

func upCmd() *cobra.Command {
	o := upOptions{}
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Run an embedded cluster on loopback (3 nodes, data under ./grove-data)",
		Long: `Run an embedded cluster on this machine: --nodes nodes (default 3), the first
--meta of them config-service members and failure-detector observers, data under
--data. The first run creates the cluster; later runs on the same --data bring
the same cluster back (same ids and addresses, higher incarnations).

grove up manages: its nodes (in its own process, or with --processes one child
'grove server' each), the gateway at --base-port, and the lock file DIR/up.lock.
Ctrl-C, SIGTERM or SIGHUP stops all of them, including nodes of DIR you
restarted by hand; children also die if grove up itself is killed. 'grove down
--data DIR' does the same from another terminal. A child that dies is reported
and not restarted: run the printed 'grove server --config ...' to bring it
back. Logs: DIR/node-N/grove.log per node, DIR/grove.log for the gateway.`,
		Example: `  grove up
  grove up --processes --data /tmp/g --base-port 8400
  grove up --nodes 5 --meta 3 --log-level debug`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.changed = cmd.Flags().Changed
			if !o.processes {
				serverGC() // the nodes run in this process
				serverProcs(o.nodes)
			}
			return runUp(cmd.Context(), o)
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.nodes, "nodes", 3, "run `N` nodes")
	f.IntVar(&o.members, "meta", 3, "make the first `M` nodes config-service members and failure-detector observers (odd; default 3, or fewer if --nodes is)")
	f.StringVar(&o.data, "data", "grove-data", "keep the cluster in `DIR`; running again on it brings back the same cluster")
	f.BoolVar(&o.processes, "processes", false, "run each node as a child process (grove server --config ...)")
	f.IntVar(&o.basePort, "base-port", 7400, "serve the gateway at `PORT`; node i uses PORT+10i (gRPC), +1 (raft), +2 (beacon, UDP), +3 (metrics)")
	f.StringVar(&o.host, "host", "127.0.0.1", "listen on address `IP`")
	f.DurationVar(&o.readyWait, "ready-timeout", 60*time.Second, "give the cluster `DURATION` to become ready")
	o.diskSize = DefaultDiskSize
	f.Var(&o.diskSize, "disk-size", "give each node a disk file of `SIZE` (sparse; 8GiB, 512MiB...) for its RLDev segments")
	f.IntVar(&o.disks, "disks", 1, "give each node `N` disk files (disk0.img, disk1.img...); a later run with a larger N adds disks to an existing cluster (to move segments onto them: grove rldev move ID --to NODE:DISK)")
	o.chunkSize = DefaultChunkSize
	f.DurationVar(&o.resvLife, "chunk-reservation-life", 0, "on a new cluster, how long a batching clerk's reservation of chunks stays open without its commit before the primary keeps them all (`DURATION`; default 60s)")
	f.Var(&o.chunkSize, "chunk-size", "on a new cluster, give each chunk manager pair (one per adjacent node pair) a data RLDev of `SIZE` (default 1GiB, at most --disk-size/8 unless set; 0: no pairs)")
	f.StringVar(&o.dataPath, "data-path", "tcp", "carry RLDev blocks between nodes on `tcp|grpc` (the nodes' [rldev] data_path; may change between runs)")
	f.BoolVar(&o.direct, "direct-writes", false, "write small RLDev blocks past the page cache (the nodes' [rldev] direct_writes, for disks larger than memory; may change between runs)")
	addLogFlags(cmd, &o.logLevel, &o.logFormat)
	return cmd
}

func addLogFlags(cmd *cobra.Command, level, format *string) {
	cmd.Flags().StringVar(level, "log-level", "info", "log lines of `debug|info|warn|error` level and above")
	cmd.Flags().StringVar(format, "log-format", "text", "write log lines as `text|json`")
}

// checkUpFlags validates the flags before anything is written.
func checkUpFlags(o upOptions) error {
	if o.nodes < 1 || o.nodes > MaxUpNodes {
		return cli.Usagef("--nodes %d: want 1..%d", o.nodes, MaxUpNodes)
	}
	if o.members < 1 || o.members%2 == 0 {
		return cli.Usagef("--meta %d: want an odd number >= 1 (a majority of 2k+1 members survives k failures)", o.members)
	}
	if o.members > o.nodes {
		return cli.Usagef("--meta %d: more members than --nodes %d", o.members, o.nodes)
	}
	last := o.basePort + 10*o.nodes + 3
	if o.basePort < 1 || last > 65535 {
		return cli.Usagef("--base-port %d: want 1..%d for %d nodes (node ports run to --base-port + %d)", o.basePort, 65535-10*o.nodes-3, o.nodes, 10*o.nodes+3)
	}
	ip := net.ParseIP(o.host)
	if ip == nil {
		return cli.Usagef("--host %q: want an IP address", o.host)
	}
	if ip.IsUnspecified() {
		return cli.Usagef("--host %s: give an address the nodes can be reached at, not an unspecified one (observers check where beacons come from)", o.host)
	}
	if o.diskSize < 64<<20 || o.diskSize%4096 != 0 {
		return cli.Usagef("--disk-size %v: want at least 64MiB, a multiple of 4KiB", int64(o.diskSize))
	}
	if o.disks < 1 || o.disks > MaxUpDisks {
		return cli.Usagef("--disks %d: want 1..%d", o.disks, MaxUpDisks)
	}
	if o.resvLife != 0 && o.resvLife < time.Second {
		return cli.Usagef("--chunk-reservation-life %v: want at least 1s", o.resvLife)
	}
	// The default shrinks to a small --disk-size (chunkPairs): only a size
	// asked for can be too large for the disks (`grove up --disk-size
	// 2GiB` was refused for the default's 1GiB).
	explicit := o.changed != nil && o.changed("chunk-size")
	if o.chunkSize < 0 || o.chunkSize%4096 != 0 || (o.chunkSize > 0 && o.chunkSize < 1<<20) || explicit && o.chunkSize > o.diskSize/4 {
		return cli.Usagef("--chunk-size %v: want 0 (no chunk managers) or 1MiB to --disk-size/4 (%v), a multiple of 4KiB", int64(o.chunkSize), int64(o.diskSize/4))
	}
	if o.readyWait <= 0 {
		return cli.Usagef("--ready-timeout %v: want a positive duration", o.readyWait)
	}
	if _, err := logging.ParseLevel(o.logLevel); err != nil {
		return cli.Usagef("--log-level: %v", err)
	}
	if err := logging.CheckFormat(o.logFormat); err != nil {
		return cli.Usagef("--log-format: %v", err)
	}
	if o.dataPath != "tcp" && o.dataPath != "grpc" {
		return cli.Usagef("--data-path %q: want tcp or grpc", o.dataPath)
	}
	return nil
}

// readRecord reads DIR/cluster.toml; for a directory made before it
// existed, the settings are derived from the node configs (and written).
func readRecord(data string, cfgs []*node.Config) (upRecord, error) {
	var r upRecord
	b, err := os.ReadFile(filepath.Join(data, "cluster.toml"))
	if err == nil {
		if err := toml.Unmarshal(b, &r); err != nil {
			return r, fmt.Errorf("%s: %w", filepath.Join(data, "cluster.toml"), err)
		}
		if r.LogFormat == "" {
			r.LogFormat = "text"
		}
		if r.DiskSize == 0 { // made before disks existed
			r.DiskSize = DefaultDiskSize
			return r, writeRecord(data, r)
		}
		return r, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return r, err
	}
	r.Nodes, r.Meta = len(cfgs), len(cfgs[0].Members)
	h, p, err := net.SplitHostPort(cfgs[0].GRPCAddr)
	if err != nil {
		return r, err
	}
	port, _ := strconv.Atoi(p)
	r.Host, r.BasePort, r.LogFormat, r.DiskSize = h, port-10*int(cfgs[0].ID), "text", DefaultDiskSize
	return r, writeRecord(data, r)
}

func writeRecord(data string, r upRecord) error {
	b, err := toml.Marshal(r)
	if err != nil {
		return err
	}
	return disk.OS{}.WriteFileSync(filepath.Join(data, "cluster.toml"), b)
}

// layout returns the node configs for the cluster under o.data, creating
// them on first run and reading them back afterwards (same ids, same
// addresses, same data directories). Flags that contradict an existing
// directory are refused before anything is written.
func layout(o upOptions) (cfgs []*node.Config, paths []string, rec upRecord, created bool, err error) {
	data, err := filepath.Abs(o.data)
	if err != nil {
		return nil, nil, rec, false, err
	}
	existing, _ := filepath.Glob(filepath.Join(data, "node-*", "grove.toml"))
	if len(existing) > 0 {
		sort.Slice(existing, func(i, j int) bool { return nodeNum(existing[i]) < nodeNum(existing[j]) })
		key := ""
		for _, p := range existing {
			c, err := node.ReadConfig(p)
			if err != nil {
				return nil, nil, rec, false, err
			}
			if c.ClusterKey != "" {
				key = c.ClusterKey
			}
			cfgs = append(cfgs, c)
		}
		if rec, err = readRecord(data, cfgs); err != nil {
			return nil, nil, rec, false, err
		}
		var conflicts []string
		for _, x := range []struct {
			flag      string
			want, got any
		}{{"nodes", rec.Nodes, o.nodes}, {"meta", rec.Meta, o.members}, {"base-port", rec.BasePort, o.basePort}, {"host", rec.Host, o.host},
			{"log-format", rec.LogFormat, o.logFormat}, {"disk-size", units.Size(rec.DiskSize), o.diskSize}} {
			if o.changed != nil && o.changed(x.flag) && fmt.Sprint(x.want) != fmt.Sprint(x.got) {
				conflicts = append(conflicts, fmt.Sprintf("--%s %v (it has %v)", x.flag, x.got, x.want))
			}
		}
		if len(conflicts) > 0 {
			return nil, nil, rec, false, cli.Usagef("%s holds a cluster created with --nodes %d --meta %d --base-port %d --host %s --log-format %s, and its node addresses (and log files) are fixed: "+
				"%s cannot apply; run without them, or use another --data", data, rec.Nodes, rec.Meta, rec.BasePort, rec.Host, rec.LogFormat, strings.Join(conflicts, ", "))
		}
		if len(cfgs) != rec.Nodes {
			return nil, nil, rec, false, fmt.Errorf("%s: %d node configs, but cluster.toml says %d nodes", data, len(cfgs), rec.Nodes)
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
			if c.Has(node.RoleStore) && len(c.Disks) == 0 {
				c.Disks, c.DiskSize, changed = []string{"disk0.img"}, units.Size(rec.DiskSize), true
			}
			if o.changed != nil && o.changed("disks") && c.Has(node.RoleStore) && len(c.Disks) != o.disks {
				if len(c.Disks) > o.disks {
					return nil, nil, rec, false, cli.Usagef("--disks %d: node %d has %d disks (in %s); grove up adds disks and never removes one: move the segments off it (grove rldev move), then edit the node's config",
						o.disks, c.ID, len(c.Disks), existing[i])
				}
				for _, d := range upDisks(o.disks) {
					if !slices.Contains(c.Disks, d) && len(c.Disks) < o.disks {
						c.Disks = append(c.Disks, d)
					}
				}
				if c.DiskSize == 0 {
					c.DiskSize = units.Size(rec.DiskSize)
				}
				changed = true
			}
			if o.changed != nil && o.changed("data-path") && c.Has(node.RoleStore) && c.RLDev.DataPath != o.dataPath {
				c.RLDev.DataPath, changed = o.dataPath, true
			}
			if o.changed != nil && o.changed("direct-writes") && c.Has(node.RoleStore) && c.RLDev.DirectWrites != o.direct {
				c.RLDev.DirectWrites, changed = o.direct, true
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
					return nil, nil, rec, false, err
				}
			}
			if err := c.Validate(); err != nil {
				return nil, nil, rec, false, fmt.Errorf("config %s: %w", existing[i], err)
			}
		}
		return cfgs, existing, rec, false, nil
	}
	rec = upRecord{Nodes: o.nodes, Meta: o.members, BasePort: o.basePort, Host: o.host, LogFormat: o.logFormat, DiskSize: int64(o.diskSize)}
	cfgs = newConfigs(o, data, node.NewClusterKey()) // every node of the cluster shares the key
	for _, c := range cfgs {
		if err := c.Validate(); err != nil {
			return nil, nil, rec, false, err
		}
	}
	for _, c := range cfgs {
		if err := os.MkdirAll(c.DataDir, 0o755); err != nil {
			return nil, nil, rec, false, err
		}
		p := filepath.Join(c.DataDir, "grove.toml")
		if err := c.Write(p); err != nil {
			return nil, nil, rec, false, err
		}
		paths = append(paths, p)
	}
	return cfgs, paths, rec, true, writeRecord(data, rec)
}

// newGateway is a new cluster's gateway address.
func newGateway(o upOptions) string {
	return net.JoinHostPort(o.host, strconv.Itoa(o.basePort))
}

// newConfigs lays out a new cluster's node configs from the flags.
func newConfigs(o upOptions, data, key string) []*node.Config {
	addr := func(port int) string { return net.JoinHostPort(o.host, strconv.Itoa(port)) }
	var members []node.MemberConfig
	for i := 1; i <= o.members; i++ {
		b := o.basePort + 10*i
		members = append(members, node.MemberConfig{ID: uint64(i), GRPC: addr(b), Raft: addr(b + 1), Beacon: addr(b + 2)})
	}
	var cfgs []*node.Config
	for i := 1; i <= o.nodes; i++ {
		b := o.basePort + 10*i
		c := &node.Config{ID: uint64(i), DataDir: filepath.Join(data, fmt.Sprintf("node-%d", i)), GRPCAddr: addr(b), RaftAddr: addr(b + 1),
			BeaconAddr: addr(b + 2), MetricsAddr: addr(b + 3), Roles: []string{node.RoleStore}, FD: node.DefaultFD, Members: members, ClusterKey: key,
			Disks: upDisks(o.disks), DiskSize: o.diskSize}
		if o.dataPath != "" && o.dataPath != "tcp" {
			c.RLDev.DataPath = o.dataPath
		}
		c.RLDev.DirectWrites = o.direct
		c.Chunk.ReservationLife = node.Duration(o.resvLife)
		if i <= o.members {
			c.Roles = []string{node.RoleMeta, node.RoleObserver, node.RoleLock, node.RoleStore}
		}
		cfgs = append(cfgs, c)
	}
	return cfgs
}

func nodeNum(p string) int {
	n, _ := strconv.Atoi(strings.TrimPrefix(filepath.Base(filepath.Dir(p)), "node-"))
	return n
}

// checkPorts fails with a clear message if any address is taken.
func checkPorts(gateway string, cfgs []*node.Config, existing bool, data string) error {
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
			hint := fmt.Sprintf("is another grove up running? stop it (%s down), or pass --base-port for another range", selfName())
			if existing {
				hint = fmt.Sprintf("this directory's addresses are fixed; stop what holds the port (%s down --data %s, if it is another grove), or use another --data", selfName(), data)
			}
			return &cli.Error{Code: cli.ExitFailed, Op: "up", Msg: fmt.Sprintf("%s address %s is taken (%v)", w.what, w.addr, errors.Unwrap(err)), Hint: hint}
		}
	}
	return nil
}

// checkNotRunning refuses to start a cluster any of whose nodes is running
// already (one restarted by hand; a second grove up is refused by up.lock).
func checkNotRunning(data string, cfgs []*node.Config) error {
	for _, c := range cfgs {
		if pid, err := node.LockHolder(filepath.Join(c.DataDir, "LOCK")); err == nil && pid > 0 {
			return cli.Failf("up", "node %d of %s is already running (pid %d, started by hand?); stop it with: %s down --data %s", c.ID, data, pid, selfName(), data)
		}
	}
	return nil
}

// selfName is how messages name this binary before its stable path is
// known: as it was invoked if that was a path (bin/grove), else "grove".
func selfName() string {
	if strings.ContainsRune(os.Args[0], filepath.Separator) {
		return os.Args[0]
	}
	return "grove"
}

// restartCommand is the command that brings node config path back, with
// the cluster's log settings (its log file stays in one format).
func restartCommand(bin, path string, o upOptions) string {
	c := bin + " server --config " + path
	if o.logFormat != "text" {
		c += " --log-format " + o.logFormat
	}
	if o.logLevel != "info" {
		c += " --log-level " + o.logLevel
	}
	return c
}

func runUp(ctx context.Context, o upOptions) error {
	if o.changed != nil && !o.changed("meta") {
		// Up to 3 members, odd, at most --nodes: `--nodes 1` just works.
		o.members = min(3, o.nodes)
		if o.members%2 == 0 {
			o.members--
		}
	}
	if err := checkUpFlags(o); err != nil {
		return err
	}
	data, err := filepath.Abs(o.data)
	if err != nil {
		return err
	}
	if existing, _ := filepath.Glob(filepath.Join(data, "node-*", "grove.toml")); len(existing) == 0 {
		// A new cluster: its ports are checked before anything is written.
		if err := checkPorts(newGateway(o), newConfigs(o, data, ""), false, data); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(data, 0o755); err != nil {
		return err
	}
	upLock, err := node.LockFile(filepath.Join(data, "up.lock"))
	if err != nil {
		return cli.Failf("up", "grove up is already running on %s (%v); stop it with: %s down --data %s", data, err, selfName(), data)
	}
	defer upLock.Close()
	cfgs, paths, rec, created, err := layout(o)
	if err != nil {
		return err
	}
	o.logFormat = rec.LogFormat // the directory's, whatever the flag's default
	if err := checkNotRunning(data, cfgs); err != nil {
		return err
	}
	gateway := net.JoinHostPort(rec.Host, strconv.Itoa(rec.BasePort))
	if err := checkPorts(gateway, cfgs, !created, data); err != nil {
		return err
	}
	logf, err := logging.OpenFile(filepath.Join(data, "grove.log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	log, _ := logging.New(logf, o.logFormat, o.logLevel)
	log = log.With("process", "up")

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
	bin, err := stableBinary(data)
	if err != nil {
		return err
	}
	var stop func()
	if o.processes {
		stop, err = startProcesses(bin, cfgs, paths, log, created, o)
	} else {
		stop, err = startInProcess(cfgs, paths, log, created, o)
	}
	if err != nil {
		return err
	}
	defer func() {
		stop()
		stopStrays(data, cfgs)
	}()

	// The gateway: status and locks for the whole cluster at one address.
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

	if o.processes {
		fmt.Printf("restart a node that exits with: %s\n", restartCommand(bin, filepath.Join(data, "node-N", "grove.toml"), o))
	}
	disks := map[uint64]int{}
	for _, c := range cfgs {
		if c.Has(node.RoleStore) {
			disks[c.ID] = len(c.Disks)
		}
	}
	if err := waitReady(ctx, status, client, before, disks, o.readyWait); err != nil {
		return err
	}
	if err := chunkPairs(ctx, client, cfgs, o, log); err != nil {
		return err
	}
	fmt.Printf("ready: %d nodes alive, config-service leader %s; gateway %s; logs in %s; stop with Ctrl-C or: %s down --data %s\n",
		len(cfgs), leaderOf(ctx, status), gateway, filepath.Join(data, "node-*", "grove.log"), bin, data)
	<-ctx.Done()
	fmt.Println("stopping")
	log.Info("stopping")
	return nil
}

// chunkPairs makes, on a cluster without any, one chunk manager pair per
// adjacent pair of store nodes ((1,2), (2,3), ..., (n,1)), and waits until
// each has a primary.
func chunkPairs(ctx context.Context, mc *meta.Client, cfgs []*node.Config, o upOptions, log *slog.Logger) error {
	size := uint64(o.chunkSize)
	if o.changed == nil || !o.changed("chunk-size") {
		size = min(size, uint64(o.diskSize)/8/4096*4096)
	}
	var stores []uint64
	for _, c := range cfgs {
		if c.Has(node.RoleStore) {
			stores = append(stores, c.ID)
		}
	}
	if size == 0 || len(stores) < 2 {
		return nil
	}
	c, cancel := context.WithTimeout(ctx, o.readyWait)
	defer cancel()
	ns, err := mc.Read(c, chunk.Namespace)
	if err != nil {
		return cli.Failf("up", "reading the chunk manager table: %v", err)
	}
	if len(ns.Entries) > 0 {
		return nil // made on an earlier run
	}
	mapSize := max(1<<20, size/64/4096*4096)
	n := len(stores)
	if n == 2 {
		n = 1 // one pair of two nodes
	}
	for i := 0; i < n; i++ {
		nodes := [2]uint64{stores[i], stores[(i+1)%len(stores)]}
		p, err := chunk.CreatePair(c, mc, nodes, mapSize, size)
		if err != nil {
			return cli.Failf("up", "creating a chunk manager pair on nodes %d and %d: %v", nodes[0], nodes[1], err)
		}
		log.Info("chunk manager pair created", "cm", p.ID, "nodes", fmt.Sprint(p.Nodes), "map_rldev", p.MapRLDev, "data_rldev", p.Data[0].ID, "size", size)
	}
	for {
		ns, err := mc.Read(c, chunk.Namespace)
		if err == nil {
			t, err := chunk.DecodeTable(ns)
			if err != nil {
				return cli.Failf("up", "%v", err)
			}
			ready := 0
			for _, p := range t.Pairs {
				if p.PrimaryInc != 0 {
					ready++
				}
			}
			if ready == len(t.Pairs) {
				fmt.Printf("chunk store: %d manager pairs of %s each\n", len(t.Pairs), units.FormatSize(int64(size)))
				return nil
			}
		}
		select {
		case <-c.Done():
			return cli.Failf("up", "the chunk manager pairs have no primary after %v (see the logs: DIR/node-*/grove.log)", o.readyWait)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// disksRegistered reports whether the RLDev table has every store node's
// disks.
func disksRegistered(ctx context.Context, mc *meta.Client, disks map[uint64]int) bool {
	c, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	ns, err := mc.Read(c, rldev.Namespace)
	if err != nil {
		return false
	}
	t, err := rldev.DecodeTable(ns)
	if err != nil {
		return false
	}
	for id, n := range disks {
		for i := 0; i < n; i++ {
			if t.Disks[rldev.DiskKey{Node: id, Index: uint32(i)}] == nil {
				return false
			}
		}
	}
	return true
}

func leaderOf(ctx context.Context, s *node.StatusService) string {
	c, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	r, err := s.Status(c, &pb.StatusRequest{})
	if err != nil || r.Leader == 0 {
		return "unknown"
	}
	return strconv.FormatUint(r.Leader, 10)
}

// waitReady polls until the config service has a leader, every node has
// registered an incarnation newer than before[id] that a majority of
// observers hear, and every store node has registered its disks (RLDevs
// can be created then).
func waitReady(ctx context.Context, s *node.StatusService, mc *meta.Client, before map[uint64]uint64, disks map[uint64]int, limit time.Duration) error {
	n := len(before)
	deadline := time.Now().Add(limit)
	var last string
	for {
		c, cancel := context.WithTimeout(ctx, 3*time.Second)
		r, err := s.Status(c, &pb.StatusRequest{})
		cancel()
		if err == nil {
			alive := 0
			for _, nd := range r.Nodes {
				if nd.Alive && nd.Incarnation > before[nd.Id] && int(nd.ObserversHeard) > len(r.Members)/2 {
					alive++
				}
			}
			registered := disksRegistered(ctx, mc, disks)
			if r.Leader != 0 && !r.Stale && len(r.Nodes) == n && alive == n && registered {
				return nil
			}
			last = fmt.Sprintf("leader %d, %d/%d nodes registered, %d alive, disks registered: %v", r.Leader, len(r.Nodes), n, alive, registered)
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			return cli.Failf("up", "cluster not ready after %v: %s (see the logs: DIR/node-*/grove.log)", limit, last)
		}
		select {
		case <-ctx.Done():
			return cli.Interrupted{Signal: "interrupt"}
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func printNode(c *node.Config, pid int, path string) {
	fmt.Printf("node %d pid=%d grpc=%s beacon=%s config=%s\n", c.ID, pid, c.GRPCAddr, c.BeaconAddr, path)
}

// stableBinary is the grove binary that printed commands and child
// processes use. A binary run by `go run` lives in Go's build cache and
// disappears: it is copied to DIR/bin/grove so that the restart commands
// grove up prints keep working.
func stableBinary(data string) (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", err
	}
	if r, err := filepath.EvalSymlinks(exe); err == nil {
		exe = r
	}
	if !strings.Contains(exe, string(filepath.Separator)+"go-build") {
		return exe, nil
	}
	dst := filepath.Join(data, "bin", "grove")
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return "", err
	}
	b, err := os.ReadFile(exe)
	if err != nil {
		return "", err
	}
	tmp := dst + ".tmp"
	if err := os.WriteFile(tmp, b, 0o755); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, dst); err != nil {
		return "", err
	}
	fmt.Fprintf(os.Stderr, "note: grove runs from go run's build cache; copied it to %s for the commands printed below (install grove: go install ./cmd/grove)\n", dst)
	return dst, nil
}

// nodeLogger opens node c's log file, DATA_DIR/grove.log.
func nodeLogger(c *node.Config, o upOptions) (*slog.Logger, io.Closer, error) {
	f, err := logging.OpenFile(filepath.Join(c.DataDir, "grove.log"))
	if err != nil {
		return nil, nil, err
	}
	l, err := logging.New(f, o.logFormat, o.logLevel)
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return l, f, nil
}

func startInProcess(cfgs []*node.Config, paths []string, log *slog.Logger, bootstrap bool, o upOptions) (func(), error) {
	var nodes []*node.Node
	var files []io.Closer
	stop := func() {
		var wg sync.WaitGroup
		for _, n := range nodes {
			wg.Add(1)
			go func() { defer wg.Done(); n.Close() }()
		}
		wg.Wait()
		for _, f := range files {
			f.Close()
		}
	}
	for i, c := range cfgs {
		l, f, err := nodeLogger(c, o)
		if err != nil {
			stop()
			return nil, err
		}
		files = append(files, f)
		n, err := node.Start(c, node.Options{Logger: l, Bootstrap: bootstrap})
		if err != nil {
			stop()
			return nil, err
		}
		id := c.ID
		n.Fence().OnFence(func(inc fd.Incarnation) {
			// Rare and important: worth a line on the terminal.
			fmt.Printf("node %d fenced itself (incarnation %d lost contact with a majority of observers); it comes back as a new incarnation\n", id, inc)
		})
		nodes = append(nodes, n)
		printNode(c, os.Getpid(), paths[i])
	}
	return stop, nil
}

// spawner starts child processes from one OS thread that lives as long as
// the process: a child's parent-death signal (Pdeathsig) fires when the
// thread that forked it exits, not the process, and Go may end threads.
type spawner struct{ reqs chan spawnReq }

type spawnReq struct {
	cmd  *exec.Cmd
	done chan error
}

var spawnerOnce = sync.OnceValue(func() *spawner {
	s := &spawner{reqs: make(chan spawnReq)}
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the process
		for r := range s.reqs {
			r.done <- r.cmd.Start()
		}
	}()
	return s
})

func (s *spawner) start(cmd *exec.Cmd) error {
	done := make(chan error, 1)
	s.reqs <- spawnReq{cmd: cmd, done: done}
	return <-done
}

// startProcesses runs each node as `grove server --config PATH`. A child that
// dies is reported, not restarted: its printed command brings it back.
// Children are in their own process group (a Ctrl-C at the terminal reaches
// only grove up, which stops them in order) and get SIGTERM if grove up
// dies (Pdeathsig), so they never outlive it holding ports and locks.
func startProcesses(bin string, cfgs []*node.Config, paths []string, log *slog.Logger, bootstrap bool, o upOptions) (func(), error) {
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
				fmt.Fprintf(os.Stderr, "node process %d did not stop within 10 s of SIGTERM: killing it\n", c.Process.Pid)
				c.Process.Kill()
			}
			mu.Unlock()
			<-done
		}
	}
	for i, c := range cfgs {
		lf, err := logging.OpenFile(filepath.Join(c.DataDir, "grove.log"))
		if err != nil {
			stop()
			return nil, err
		}
		args := []string{"server", "--config", paths[i], "--log-level", o.logLevel, "--log-format", o.logFormat}
		if bootstrap && c.Has(node.RoleMeta) {
			args = append(args, "--bootstrap") // a new cluster; the printed restart command has no --bootstrap
		}
		cmd := exec.Command(bin, args...)
		cmd.Stderr = lf // a crash's stack trace lands in the node's log
		out, err := cmd.StdoutPipe()
		if err != nil {
			lf.Close()
			stop()
			return nil, err
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
		if err := spawnerOnce().start(cmd); err != nil {
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
			// The child's standard output carries its events (a
			// self-fence): relay them, after its start line.
			sc := bufio.NewScanner(out)
			first := true
			for sc.Scan() {
				if !first {
					fmt.Println(sc.Text())
				}
				first = false
			}
			err := cmd.Wait()
			lf.Close()
			log.Warn("node process exited", "node", c.ID, "pid", cmd.Process.Pid, "err", err)
			mu.Lock()
			quiet := stopping
			mu.Unlock()
			if quiet {
				return
			}
			how := "with status 0"
			if err != nil {
				how = err.Error()
			}
			fmt.Fprintf(os.Stderr, "node %d (pid %d) exited (%s); restart it with: %s\n", c.ID, cmd.Process.Pid, how, restartCommand(bin, path, o))
		}(c, paths[i])
	}
	return stop, nil
}

// stopStrays stops nodes of the directory that grove up did not start (a
// node restarted by hand after its child died): grove up stops the whole
// cluster of its directory.
func stopStrays(data string, cfgs []*node.Config) {
	for _, c := range cfgs {
		pid, err := node.LockHolder(filepath.Join(c.DataDir, "LOCK"))
		if err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		if err := stopPID(pid, filepath.Join(c.DataDir, "LOCK"), 15*time.Second); err != nil {
			fmt.Fprintf(os.Stderr, "node %d (pid %d): %v\n", c.ID, pid, err)
			continue
		}
		fmt.Printf("stopped node %d (pid %d, started by hand)\n", c.ID, pid)
	}
}

// stopPID sends SIGTERM to pid, which holds the lock file lockPath, and
// waits until the lock is free (the process has exited); after timeout it
// sends SIGKILL and waits again.
func stopPID(pid int, lockPath string, timeout time.Duration) error {
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		if errors.Is(err, syscall.ESRCH) {
			return nil
		}
		return err
	}
	if waitUnlocked(lockPath, timeout) {
		return nil
	}
	fmt.Fprintf(os.Stderr, "pid %d did not stop within %v of SIGTERM: killing it\n", pid, timeout)
	syscall.Kill(pid, syscall.SIGKILL)
	if waitUnlocked(lockPath, 10*time.Second) {
		return nil
	}
	return fmt.Errorf("still running after SIGKILL")
}

func waitUnlocked(lockPath string, timeout time.Duration) bool {
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if pid, err := node.LockHolder(lockPath); err == nil && pid == 0 {
			return true
		}
	}
	return false
}
