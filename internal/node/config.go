// Package node is a Grove server process: it reads its config file, locks
// its data directory, takes a new incarnation, starts the roles it hosts
// (config-service replica, failure-detector observer, and every later layer)
// behind one gRPC server, and stops them cleanly.
package node

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/grovestore/grove/internal/btree"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pelletier/go-toml/v2"

	"github.com/grovestore/grove/internal/disk"
	"github.com/grovestore/grove/internal/fd"
	"github.com/grovestore/grove/internal/meta"
	"github.com/grovestore/grove/internal/units"
)

// Roles a node can host. A small cluster runs every role everywhere.
const (
	RoleMeta     = "meta"     // config-service replica
	RoleObserver = "observer" // failure-detector observer
	RoleLock     = "lock"     // lock master or standby (every node has clerks)
	RoleStore    = "store"    // holds RLDev segments on its disks
)

// KnownRoles lists every role name; later layers' roles are accepted now so
// that config files stay valid as they land.
var KnownRoles = []string{RoleMeta, RoleObserver, RoleLock, "store", "chunk", "btree", "brick", "vdisk", "nfs", "proxy", "web"}

// Duration is a time.Duration written as "200ms" in TOML.
type Duration time.Duration

func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	*d = Duration(v)
	return err
}

// MemberConfig names one config-service replica; replicas are also the
// failure detector's observers.
type MemberConfig struct {
	ID     uint64 `toml:"id"`
	GRPC   string `toml:"grpc"`
	Raft   string `toml:"raft"`
	Beacon string `toml:"beacon"`
}

// RLDevConfig tunes the RLDev replicas on a store node.
type RLDevConfig struct {
	// ScrubRate is the bytes per second the scrubber reads over the
	// node's segments (default 4 MiB; "0" turns it off).
	ScrubRate *units.Size `toml:"scrub_rate"`
	// CopyRate bounds the bytes per second resyncs and segment moves copy
	// from this node (default: unbounded, the fastest rebuild; a bound
	// trades rebuild time for the latency of the writes meanwhile).
	CopyRate units.Size `toml:"copy_rate"`
	// DataPath carries the blocks of this node's links to its replicas'
	// peers: "tcp" (the default: frames on plain TCP to the peer's gRPC
	// port) or "grpc" (a gRPC stream, slower; kept to measure against).
	// A node accepts both.
	DataPath string `toml:"data_path"`
	// DirectWrites writes small blocks (up to 64 KiB) to the node's
	// disks past the page cache (O_DIRECT, where the file system supports
	// it): for disks much larger than memory, where a buffered write of a
	// block not in the page cache reads the pages it covers in part
	// first. Off by default (with the blocks cached it costs: README).
	DirectWrites bool `toml:"direct_writes"`
	// DiskTimeout is how long an operation of one of the node's disks
	// may go unanswered before the disk counts as hung and its segments
	// fail, their peers serving alone (default 20s; "-1s": never). A
	// hung disk leaves its node alive to the failure detector: without
	// the timeout every write of its RLDevs waits for it.
	DiskTimeout Duration `toml:"disk_timeout"`
}

// FDConfig holds the failure detector's tunables.
// ChunkConfig tunes the node's chunk managers.
type ChunkConfig struct {
	// ReservationLife is how long a batching clerk's reservation stays
	// open without its commit before the primary keeps all its chunks
	// (default 60 s; the clerk commits every few seconds).
	ReservationLife Duration `toml:"reservation_life"`
}

// BTreeConfig is the [btree] section.
type BTreeConfig struct {
	// EtcdTree is the tree the node's etcd-compatible endpoint (etcd v3's
	// KV service on the node's gRPC address) serves; it is made at its
	// first use (default "etcd").
	EtcdTree string `toml:"etcd_tree"`
	// EtcdLocal serves every etcd call on the node it reaches, instead of
	// forwarding it to the tree's home node (btree.EtcdKV).
	EtcdLocal bool `toml:"etcd_local"`
	// RepairEvery is how often a tree's repairer, its home node, walks
	// the whole tree to put back missing downlinks, compress under-full
	// nodes and free removed ones (default 30s; the other nodes walk the
	// trees they have open ten times less often, in case the home is
	// down; negative: never).
	RepairEvery Duration `toml:"repair_every"`
	// CacheNodes bounds the node images the node's B-tree server caches,
	// across its trees (default btree.DefaultCacheNodes; at the default
	// 8 KiB nodes, 128 MiB of images).
	CacheNodes int `toml:"cache_nodes"`
}

// TableConfig is the [tables] section: the node's DDS brick.
type TableConfig struct {
	// SplitBytes: a partition whose replica here holds more than this
	// many bytes of values is split by the node, if it heads the
	// partition's group (default 64 MiB).
	SplitBytes units.Size `toml:"split_bytes"`
	// NoAutoSplit: partitions split only when an operator asks (`grove
	// table split`).
	NoAutoSplit bool `toml:"no_auto_split"`
	// NoAutoRebalance: no brick moves replicas onto itself on its own
	// (DDS §3.1's spreading onto added nodes; ddstable/rebalance.go).
	NoAutoRebalance bool `toml:"no_auto_rebalance"`
}

type FDConfig struct {
	Interval    Duration `toml:"interval"`
	GracePeriod Duration `toml:"grace_period"`
	MaxDrift    float64  `toml:"max_drift"`
}

// RaftConfig holds the config service's raft timing (members only; empty
// fields take meta.DefaultTiming's values).
type RaftConfig struct {
	Heartbeat   Duration `toml:"heartbeat"`    // a follower without contact this long (to 2x) starts an election
	Election    Duration `toml:"election"`     // a candidate's election timeout
	LeaderLease Duration `toml:"leader_lease"` // a leader without a majority's contact this long steps down
}

// Timing returns the raft timing with defaults filled in.
func (r RaftConfig) Timing() meta.Timing {
	t := meta.DefaultTiming
	if r.Heartbeat != 0 {
		t.Heartbeat = time.Duration(r.Heartbeat)
	}
	if r.Election != 0 {
		t.Election = time.Duration(r.Election)
	}
	if r.LeaderLease != 0 {
		t.LeaderLease = time.Duration(r.LeaderLease)
	}
	return t
}

// Config is one node's config file (grove server --config FILE).
type Config struct {
	ID         uint64 `toml:"id"`
	DataDir    string `toml:"data_dir"`
	GRPCAddr   string `toml:"grpc_addr"`
	RaftAddr   string `toml:"raft_addr"`
	BeaconAddr string `toml:"beacon_addr"`
	// MetricsAddr serves Prometheus metrics over HTTP at /metrics (empty:
	// off). `grove up` uses the node's gRPC port + 3.
	MetricsAddr string   `toml:"metrics_addr"`
	Roles       []string `toml:"roles"`
	// Disks are the files or block devices that hold RLDev segments
	// (role "store"), relative to data_dir unless absolute.
	Disks []string `toml:"disks"`
	// DiskSize is the size of a disk file that does not exist yet: the
	// node creates it, sparse. Zero: a missing disk is an error.
	DiskSize units.Size  `toml:"disk_size"`
	RLDev    RLDevConfig `toml:"rldev"`
	Chunk    ChunkConfig `toml:"chunk"`
	BTree    BTreeConfig `toml:"btree"`
	Tables   TableConfig `toml:"tables"`
	FD       FDConfig    `toml:"fd"`
	Raft     RaftConfig  `toml:"raft"`
	// ClusterKey authenticates failure-detector datagrams (hex, at least
	// 16 bytes; `grove up` generates 32). Every node of a cluster has the
	// same one. AcceptClusterKeys are also accepted on incoming datagrams,
	// for a rotation (README: "Cluster key").
	ClusterKey string `toml:"cluster_key"`
	// ClusterKeyFile names a file holding the cluster key instead (a
	// container secret, kept out of the config file); relative to the
	// config file's directory.
	ClusterKeyFile    string         `toml:"cluster_key_file,omitempty"`
	AcceptClusterKeys []string       `toml:"accept_cluster_keys"`
	Members           []MemberConfig `toml:"members"`

	fdGiven map[string]bool // [fd] keys present in the file (nil: not read from a file)
}

// DefaultFD is Boxwood's setting: ΔT 200 ms, GracePeriod 1 s.
var DefaultFD = FDConfig{Interval: Duration(fd.DefaultInterval), GracePeriod: Duration(fd.DefaultGracePeriod), MaxDrift: fd.DefaultMaxDrift}

// LoadConfig reads and validates a config file.
func LoadConfig(path string) (*Config, error) {
	c, err := ReadConfig(path)
	if err != nil {
		return nil, err
	}
	return validated(path, c)
}

// validated is c, validated, or the error naming file path.
func validated(path string, c *Config) (*Config, error) {
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return c, nil
}

// ReadConfig parses a config file without validating it (for tools that
// repair or upgrade configs they own, such as `grove up`). Decoding is
// strict: an unknown key is an error naming it, its line and column, and
// the known key it most resembles. A relative data_dir is taken relative to
// the file's directory; fields left out of [fd] and [raft] take their
// defaults (Validate fills them).
func ReadConfig(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err // "no such file or directory", without the path twice
		}
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return parseConfig(path, b)
}

// parseConfig is ReadConfig of the file's bytes b (path names the file in
// errors and anchors relative paths).
func parseConfig(path string, b []byte) (*Config, error) {
	c := &Config{}
	dec := toml.NewDecoder(bytes.NewReader(b)).DisallowUnknownFields()
	if err := dec.Decode(c); err != nil {
		return nil, configError(path, err)
	}
	// Which [fd] fields were given: max_drift = 0 is a setting, not an
	// omission.
	var raw struct {
		FD   map[string]any `toml:"fd"`
		Raft map[string]any `toml:"raft"`
	}
	if err := toml.Unmarshal(b, &raw); err == nil {
		c.fdGiven = map[string]bool{}
		for k := range raw.FD {
			c.fdGiven[k] = true
		}
		// A bare number would decode as nanoseconds: `interval = 200`
		// meant as milliseconds must be an error, not a 200 ns beacon.
		for _, x := range []struct {
			table string
			keys  []string
			m     map[string]any
		}{{"fd", []string{"interval", "grace_period"}, raw.FD}, {"raft", []string{"heartbeat", "election", "leader_lease"}, raw.Raft}} {
			for _, k := range x.keys {
				if v, ok := x.m[k]; ok {
					if _, isString := v.(string); !isString {
						return nil, fmt.Errorf("config %s: [%s] %s = %v: want a duration string such as \"200ms\" (a bare number has no unit)", path, x.table, k, v)
					}
				}
			}
		}
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	if c.DataDir != "" && !filepath.IsAbs(c.DataDir) {
		c.DataDir = filepath.Join(filepath.Dir(abs), c.DataDir)
	}
	if c.ClusterKeyFile != "" && !filepath.IsAbs(c.ClusterKeyFile) {
		c.ClusterKeyFile = filepath.Join(filepath.Dir(abs), c.ClusterKeyFile)
	}
	return c, nil
}

// configError turns go-toml's errors into messages that name the file,
// line and column, and the key as it is written in TOML.
func configError(path string, err error) error {
	var sm *toml.StrictMissingError
	if errors.As(err, &sm) {
		var msgs []string
		for _, e := range sm.Errors {
			row, col := e.Position()
			key := []string(e.Key())
			msg := fmt.Sprintf("config %s:%d:%d: unknown key %q", path, row, col, strings.Join(key, "."))
			if len(key) > 1 {
				msg += fmt.Sprintf(" in [%s]", strings.Join(key[:len(key)-1], "."))
			}
			if s := suggestKey(key); s != "" {
				msg += fmt.Sprintf("; did you mean %q?", s)
			} else if known := knownKeys(key[:len(key)-1]); len(known) > 0 {
				msg += fmt.Sprintf(" (known: %s)", strings.Join(known, ", "))
			}
			msgs = append(msgs, msg)
		}
		return errors.New(strings.Join(msgs, "\n"))
	}
	var de *toml.DecodeError
	if errors.As(err, &de) {
		row, col := de.Position()
		msg := strings.TrimPrefix(de.Error(), "toml: ")
		k := []string(de.Key())
		if i := strings.Index(msg, " into struct field"); i >= 0 {
			// go-toml names the Go field and type; say what the file
			// should hold instead.
			msg = msg[:i] + "; want " + wantOf(k)
		}
		if len(k) > 0 {
			msg = fmt.Sprintf("%s: %s", strings.Join(k, "."), msg)
		}
		return fmt.Errorf("config %s:%d:%d: %s", path, row, col, msg)
	}
	return fmt.Errorf("config %s: %w", path, err)
}

// wantOf describes the value the setting at key path takes.
func wantOf(path []string) string {
	t := reflect.TypeOf(Config{})
	for _, p := range path {
		for t.Kind() == reflect.Slice || t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct {
			break
		}
		f, ok := fieldByKey(t, p)
		if !ok {
			return "a value of another type"
		}
		t = f.Type
	}
	switch {
	case t == reflect.TypeOf(Duration(0)):
		return `a duration string such as "200ms"`
	case t.Kind() == reflect.String:
		return "a string"
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Uint64:
		return "an integer"
	case t.Kind() == reflect.Float64:
		return "a number"
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.String:
		return "a list of strings"
	case t.Kind() == reflect.Slice:
		return "an array of tables"
	case t.Kind() == reflect.Struct:
		return "a table"
	}
	return "a value of another type"
}

// knownKeys lists the TOML keys of the table at path in Config.
func knownKeys(path []string) []string {
	t := reflect.TypeOf(Config{})
	for _, p := range path {
		f, ok := fieldByKey(t, p)
		if !ok {
			return nil
		}
		t = f.Type
		for t.Kind() == reflect.Slice || t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct {
			return nil
		}
	}
	var out []string
	for i := 0; i < t.NumField(); i++ {
		if k := tomlKey(t.Field(i)); k != "" {
			out = append(out, k)
		}
	}
	return out
}

func tomlKey(f reflect.StructField) string {
	if !f.IsExported() {
		return ""
	}
	k, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
	if k == "-" {
		return ""
	}
	return k
}

func fieldByKey(t reflect.Type, key string) (reflect.StructField, bool) {
	for i := 0; i < t.NumField(); i++ {
		if tomlKey(t.Field(i)) == key {
			return t.Field(i), true
		}
	}
	return reflect.StructField{}, false
}

// suggestKey returns the known key nearest to an unknown one (edit
// distance at most 3, or one containing the other), or "".
func suggestKey(key []string) string {
	bad := key[len(key)-1]
	best, bestD := "", 4
	for _, k := range knownKeys(key[:len(key)-1]) {
		d := editDistance(bad, k)
		if strings.Contains(k, bad) || strings.Contains(bad, k) {
			d = min(d, 2)
		}
		if d < bestD {
			best, bestD = k, d
		}
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// NewClusterKey returns a fresh random cluster key, in hex.
func NewClusterKey() string {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return hex.EncodeToString(b[:])
}

// Write stores the config file durably.
func (c *Config) Write(path string) error {
	b, err := toml.Marshal(c)
	if err != nil {
		return err
	}
	return disk.OS{}.WriteFileSync(path, b)
}

// Has reports whether the node hosts a role.
func (c *Config) Has(role string) bool { return slices.Contains(c.Roles, role) }

// FDConfig returns the failure detector's configuration.
func (c *Config) FDConfig() fd.Config {
	obs := make([]fd.NodeID, 0, len(c.Members))
	for _, m := range c.Members {
		obs = append(obs, fd.NodeID(m.ID))
	}
	return fd.Config{Interval: time.Duration(c.FD.Interval), GracePeriod: time.Duration(c.FD.GracePeriod), MaxDrift: c.FD.MaxDrift, Observers: obs}
}

// Keyring returns the failure detector's keys.
func (c *Config) Keyring() (fd.Keyring, error) {
	key := c.ClusterKey
	if key == "" && c.ClusterKeyFile != "" {
		b, err := os.ReadFile(c.ClusterKeyFile)
		if err != nil {
			return fd.Keyring{}, fmt.Errorf("cluster_key_file: %v", err)
		}
		key = strings.TrimSpace(string(b))
	}
	if c.ClusterKey != "" && c.ClusterKeyFile != "" {
		return fd.Keyring{}, errors.New("give cluster_key or cluster_key_file, not both")
	}
	if key == "" {
		return fd.Keyring{}, errors.New("cluster_key is required: every node of a cluster shares one secret key (hex, 32 bytes recommended; `grove up` writes one, or generate one with `grove keygen`)")
	}
	k, err := fd.ParseKey(key)
	if err != nil {
		return fd.Keyring{}, fmt.Errorf("cluster_key: %v", err)
	}
	r := fd.Keyring{Sign: k}
	for i, s := range c.AcceptClusterKeys {
		a, err := fd.ParseKey(s)
		if err != nil {
			return fd.Keyring{}, fmt.Errorf("accept_cluster_keys[%d]: %v", i, err)
		}
		r.Accept = append(r.Accept, a)
	}
	return r, nil
}

// checkAddr checks a HOST:PORT setting.
func checkAddr(a string) error {
	_, port, err := net.SplitHostPort(a)
	if err != nil {
		return errors.New("want HOST:PORT")
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("port %q is not a number in 1..65535", port)
	}
	return nil
}

// Validate rejects a config that cannot work, saying why.
func (c *Config) Validate() error {
	if c.ID == 0 {
		return errors.New("id: want a positive integer")
	}
	if c.DataDir == "" {
		return errors.New("data_dir: required")
	}
	if c.BTree.CacheNodes < 0 || c.BTree.CacheNodes > 1<<24 {
		return fmt.Errorf("[btree] cache_nodes %d: want 0 (the default, %d) to %d", c.BTree.CacheNodes, btree.DefaultCacheNodes, 1<<24)
	}
	if c.BTree.CacheNodes > 0 && c.BTree.CacheNodes < 64 {
		return fmt.Errorf("[btree] cache_nodes %d: want at least 64 (an operation pins a few nodes per level, and every server's checkpoint a batch)", c.BTree.CacheNodes)
	}
	if c.BTree.EtcdTree != "" {
		if err := btree.CheckTreeName(c.BTree.EtcdTree); err != nil {
			return fmt.Errorf("[btree] etcd_tree: %v", err)
		}
	}
	for _, x := range []struct{ name, addr string }{{"grpc_addr", c.GRPCAddr}, {"raft_addr", c.RaftAddr}, {"beacon_addr", c.BeaconAddr}, {"metrics_addr", c.MetricsAddr}} {
		if x.addr == "" && (x.name == "metrics_addr" || (x.name == "raft_addr" && !c.Has(RoleMeta))) {
			continue // optional
		}
		if err := checkAddr(x.addr); err != nil {
			return fmt.Errorf("%s = %q: %v", x.name, x.addr, err)
		}
	}
	// Observers accept a node's beacons only from its registered address
	// and echo to it: it must be the address the node sends from.
	if h, _, _ := net.SplitHostPort(c.BeaconAddr); h == "" || net.ParseIP(h).IsUnspecified() {
		return fmt.Errorf("beacon_addr %q: give the node's own address, not an unspecified one: observers check that beacons come from it", c.BeaconAddr)
	}
	if _, err := c.Keyring(); err != nil {
		return err
	}
	if d := time.Duration(c.RLDev.DiskTimeout); d > 0 && d < time.Second {
		// A loaded disk's sync takes that long now and then: every
		// segment of the disk would fail, and be copied whole again.
		return fmt.Errorf("[rldev] disk_timeout = %q: want at least 1s (or negative: never)", d)
	}
	if p := c.RLDev.DataPath; p != "" && p != "tcp" && p != "grpc" {
		return fmt.Errorf("[rldev] data_path = %q: want \"tcp\" or \"grpc\"", p)
	}
	for _, r := range c.Roles {
		if !slices.Contains(KnownRoles, r) {
			return fmt.Errorf("roles: unknown role %q (known: %s)", r, strings.Join(KnownRoles, ", "))
		}
	}
	switch {
	case c.Has(RoleStore) && len(c.Disks) == 0:
		return fmt.Errorf("roles: %q needs at least one disk in disks", RoleStore)
	case len(c.Disks) > 0 && !c.Has(RoleStore):
		return fmt.Errorf("disks: given, but roles lacks %q (only a store node uses disks)", RoleStore)
	}
	for i, d := range c.Disks {
		if d == "" || slices.Contains(c.Disks[:i], d) {
			return fmt.Errorf("disks: %q: every disk needs a path of its own", d)
		}
	}
	if c.DiskSize < 0 || c.DiskSize%512 != 0 {
		return fmt.Errorf("disk_size = %d: want a multiple of 512 bytes", c.DiskSize)
	}
	if len(c.Members) == 0 || len(c.Members)%2 == 0 {
		return fmt.Errorf("[[members]]: %d config-service members; need an odd number (2k+1)", len(c.Members))
	}
	self := false
	for _, m := range c.Members {
		if m.ID == 0 || m.GRPC == "" || m.Raft == "" || m.Beacon == "" {
			return fmt.Errorf("[[members]] id = %d: id, grpc, raft and beacon are all required", m.ID)
		}
		for _, x := range []struct{ name, addr string }{{"grpc", m.GRPC}, {"raft", m.Raft}, {"beacon", m.Beacon}} {
			if err := checkAddr(x.addr); err != nil {
				return fmt.Errorf("[[members]] id = %d: %s = %q: %v", m.ID, x.name, x.addr, err)
			}
		}
		if m.ID == c.ID {
			self = true
			if m.GRPC != c.GRPCAddr || m.Raft != c.RaftAddr || m.Beacon != c.BeaconAddr {
				return fmt.Errorf("[[members]] id = %d: its grpc, raft and beacon must be this node's grpc_addr, raft_addr and beacon_addr", m.ID)
			}
		}
	}
	if c.Has(RoleMeta) && !self {
		return fmt.Errorf("roles: %q, but id = %d is not in [[members]]", RoleMeta, c.ID)
	}
	if self && (!c.Has(RoleMeta) || !c.Has(RoleObserver)) {
		return fmt.Errorf("roles: id = %d is in [[members]]: it must have roles %q and %q", c.ID, RoleMeta, RoleObserver)
	}
	c.fillFD()
	if err := c.checkTiming(); err != nil {
		return err
	}
	if err := c.FDConfig().Validate(); err != nil {
		return fmt.Errorf("[fd]: %w", err) // not reached: checkTiming covers it
	}
	return nil
}

// fillFD gives every [fd] setting the file left out its default (a
// partial [fd] section is completed, not rejected).
func (c *Config) fillFD() {
	if c.fdGiven == nil { // built in code, not read from a file
		if c.FD == (FDConfig{}) {
			c.FD = DefaultFD
		}
		c.fdGiven = map[string]bool{"max_drift": true} // a zero drift set in code stays zero
	}
	if !c.fdGiven["interval"] && c.FD.Interval == 0 {
		c.FD.Interval = DefaultFD.Interval
	}
	if !c.fdGiven["grace_period"] && c.FD.GracePeriod == 0 {
		c.FD.GracePeriod = DefaultFD.GracePeriod
	}
	if !c.fdGiven["max_drift"] && c.FD.MaxDrift == 0 {
		c.FD.MaxDrift = DefaultFD.MaxDrift
	}
}

// checkTiming checks [fd] and [raft], naming settings as the file does.
func (c *Config) checkTiming() error {
	iv, gp, drift := time.Duration(c.FD.Interval), time.Duration(c.FD.GracePeriod), c.FD.MaxDrift
	switch {
	case iv <= 0:
		return fmt.Errorf("[fd] interval = %q: want a positive duration", iv)
	case gp < fd.MinGraceIntervals*iv:
		return fmt.Errorf("[fd] grace_period = %q: must be at least %d × interval (%v)", gp, fd.MinGraceIntervals, fd.MinGraceIntervals*iv)
	case drift < fd.MinMaxDrift || drift > 0.1:
		return fmt.Errorf("[fd] max_drift = %v: want %v to 0.1 (each node checks its clock's rate against the oscillator and allows time daemons' corrections up to max_drift/2, never under ntpd's 500 ppm)", drift, fd.MinMaxDrift)
	}
	if fc := c.FDConfig(); fc.SelfGrace() < 2*iv {
		return fmt.Errorf("[fd] grace_period = %q is too short for max_drift = %v (a node's own grace would be under 2 × interval)", gp, drift)
	}
	t := c.Raft.Timing()
	switch {
	case t.Heartbeat < 5*time.Millisecond:
		return fmt.Errorf("[raft] heartbeat = %q: want at least 5ms", t.Heartbeat)
	case t.Election < 5*time.Millisecond:
		return fmt.Errorf("[raft] election = %q: want at least 5ms", t.Election)
	case t.LeaderLease < 5*time.Millisecond:
		return fmt.Errorf("[raft] leader_lease = %q: want at least 5ms", t.LeaderLease)
	case t.LeaderLease > t.Heartbeat:
		return fmt.Errorf("[raft] leader_lease = %q must not exceed heartbeat = %q", t.LeaderLease, t.Heartbeat)
	case t.Heartbeat > time.Minute || t.Election > time.Minute:
		return fmt.Errorf("[raft] heartbeat and election must be at most 1m")
	}
	return t.Validate()
}
