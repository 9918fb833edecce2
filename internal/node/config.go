// Package node is a Grove server process: it reads its config file, locks
// its data directory, takes a new incarnation, starts the roles it hosts
// (config-service replica, failure-detector observer, and every later layer)
// behind one gRPC server, and stops them cleanly.
package node

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"time"

	"github.com/pelletier/go-toml/v2"

	"github.com/grovestore/grove/internal/disk"
	"github.com/grovestore/grove/internal/fd"
	"github.com/grovestore/grove/internal/meta"
)

// Roles a node can host. A small cluster runs every role everywhere.
const (
	RoleMeta     = "meta"     // config-service replica
	RoleObserver = "observer" // failure-detector observer
	RoleLock     = "lock"     // lock master or standby (every node has clerks)
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

// FDConfig holds the failure detector's tunables.
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
	MetricsAddr string     `toml:"metrics_addr"`
	Roles       []string   `toml:"roles"`
	Disks       []string   `toml:"disks"`
	FD          FDConfig   `toml:"fd"`
	Raft        RaftConfig `toml:"raft"`
	// ClusterKey authenticates failure-detector datagrams (hex, at least
	// 16 bytes; `grove up` generates 32). Every node of a cluster has the
	// same one. AcceptClusterKeys are also accepted on incoming datagrams,
	// for a rotation (README: "Cluster key").
	ClusterKey        string         `toml:"cluster_key"`
	AcceptClusterKeys []string       `toml:"accept_cluster_keys"`
	Members           []MemberConfig `toml:"members"`
}

// DefaultFD is Boxwood's setting: ΔT 200 ms, GracePeriod 1 s.
var DefaultFD = FDConfig{Interval: Duration(fd.DefaultInterval), GracePeriod: Duration(fd.DefaultGracePeriod), MaxDrift: fd.DefaultMaxDrift}

// LoadConfig reads and validates a config file.
func LoadConfig(path string) (*Config, error) {
	c, err := ReadConfig(path)
	if err != nil {
		return nil, err
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return c, nil
}

// ReadConfig parses a config file without validating it (for tools that
// repair or upgrade configs they own, such as `grove up`).
func ReadConfig(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	c := &Config{}
	if err := toml.Unmarshal(b, c); err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return c, nil
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
	if c.ClusterKey == "" {
		return fd.Keyring{}, errors.New("cluster_key is required: every node of a cluster shares one secret key (hex, 32 bytes recommended; `grove up` writes one, or generate one with `openssl rand -hex 32`)")
	}
	k, err := fd.ParseKey(c.ClusterKey)
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

// Validate rejects a config that cannot work, saying why.
func (c *Config) Validate() error {
	if c.ID == 0 {
		return errors.New("id must be a positive integer")
	}
	if c.DataDir == "" {
		return errors.New("data_dir is required")
	}
	for name, a := range map[string]string{"grpc_addr": c.GRPCAddr, "beacon_addr": c.BeaconAddr, "metrics_addr": c.MetricsAddr} {
		if a == "" && name == "metrics_addr" {
			continue
		}
		_, port, err := net.SplitHostPort(a)
		if err == nil {
			if p, perr := strconv.Atoi(port); perr != nil || p < 0 || p > 65535 {
				err = fmt.Errorf("port %q is not a number in 0..65535", port)
			}
		}
		if err != nil {
			return fmt.Errorf("%s %q: %v", name, a, err)
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
	for _, r := range c.Roles {
		if !slices.Contains(KnownRoles, r) {
			return fmt.Errorf("unknown role %q (known: %v)", r, KnownRoles)
		}
	}
	if len(c.Members) == 0 || len(c.Members)%2 == 0 {
		return fmt.Errorf("members: %d config-service members; need an odd number (2k+1)", len(c.Members))
	}
	self := false
	for _, m := range c.Members {
		if m.ID == 0 || m.GRPC == "" || m.Raft == "" || m.Beacon == "" {
			return fmt.Errorf("member %d: id, grpc, raft and beacon are all required", m.ID)
		}
		if m.ID == c.ID {
			self = true
			if m.GRPC != c.GRPCAddr || m.Raft != c.RaftAddr || m.Beacon != c.BeaconAddr {
				return fmt.Errorf("member %d: addresses differ from this node's own", m.ID)
			}
		}
	}
	if c.Has(RoleMeta) && !self {
		return fmt.Errorf("role %q but node %d is not in members", RoleMeta, c.ID)
	}
	if self && (!c.Has(RoleMeta) || !c.Has(RoleObserver)) {
		return fmt.Errorf("node %d is a member: it must have roles %q and %q", c.ID, RoleMeta, RoleObserver)
	}
	if err := c.Raft.Timing().Validate(); err != nil {
		return fmt.Errorf("[raft]: %w", err)
	}
	if c.FD == (FDConfig{}) {
		c.FD = DefaultFD
	}
	return c.FDConfig().Validate()
}
