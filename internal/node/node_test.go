package node

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func validConfig() *Config {
	m := []MemberConfig{{ID: 1, GRPC: "127.0.0.1:1", Raft: "127.0.0.1:2", Beacon: "127.0.0.1:3"}}
	return &Config{ID: 1, DataDir: "/d", GRPCAddr: "127.0.0.1:1", RaftAddr: "127.0.0.1:2", BeaconAddr: "127.0.0.1:3",
		Roles: []string{RoleMeta, RoleObserver}, Members: m, FD: DefaultFD, ClusterKey: strings.Repeat("ab", 32)}
}

func TestConfigValidate(t *testing.T) {
	if err := validConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	cases := map[string]func(*Config){
		"zero id":      func(c *Config) { c.ID = 0 },
		"no data dir":  func(c *Config) { c.DataDir = "" },
		"bad address":  func(c *Config) { c.GRPCAddr = "nope" },
		"unknown role": func(c *Config) { c.Roles = append(c.Roles, "wizard") },
		"even members": func(c *Config) {
			c.Members = append(c.Members, MemberConfig{ID: 2, GRPC: "a:1", Raft: "a:2", Beacon: "a:3"})
		},
		"member mismatch":  func(c *Config) { c.Members[0].Raft = "127.0.0.1:9" },
		"member w/o roles": func(c *Config) { c.Roles = []string{"store"} },
		"short grace":      func(c *Config) { c.FD.GracePeriod = c.FD.Interval },
		"no cluster key":   func(c *Config) { c.ClusterKey = "" },
		"short key":        func(c *Config) { c.ClusterKey = "abcd" },
		"bad accepted key": func(c *Config) { c.AcceptClusterKeys = []string{"xyz"} },
		"tiny cache":       func(c *Config) { c.BTree.CacheNodes = 10 },
		"negative cache":   func(c *Config) { c.BTree.CacheNodes = -1 },
		"any-address beacon": func(c *Config) {
			c.BeaconAddr, c.Members[0].Beacon = "0.0.0.0:3", "0.0.0.0:3"
		},
	}
	for name, mutate := range cases {
		c := validConfig()
		mutate(c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// Config files round-trip through TOML.
func TestConfigFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "grove.toml")
	c := validConfig()
	if err := c.Write(p); err != nil {
		t.Fatal(err)
	}
	got, err := LoadConfig(p)
	if err != nil || got.FD != c.FD || got.Members[0] != c.Members[0] {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
}

// writeConfig writes validConfig's file with extra TOML appended to the
// top-level table (before [fd] and the members) or as sections.
func configText(top, sections string) string {
	return `id = 1
data_dir = "data"
grpc_addr = "127.0.0.1:1"
raft_addr = "127.0.0.1:2"
beacon_addr = "127.0.0.1:3"
roles = ["meta", "observer"]
cluster_key = "` + strings.Repeat("ab", 32) + `"
` + top + `
` + sections + `
[[members]]
id = 1
grpc = "127.0.0.1:1"
raft = "127.0.0.1:2"
beacon = "127.0.0.1:3"
`
}

// Config files are decoded strictly, errors carry line and column and the
// TOML key names, and partial sections are completed with defaults.
func TestConfigFileErrorsAndDefaults(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "grove.toml")
	load := func(text string) (*Config, error) {
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return LoadConfig(p)
	}
	for name, c := range map[string]struct{ text, want string }{
		"unknown key in [fd]":  {configText("", "[fd]\ngrace = \"2s\"\n"), `:10:1: unknown key "fd.grace" in [fd]; did you mean "grace_period"?`},
		"misspelt top key":     {configText("metrics-addr = \"127.0.0.1:4\"", ""), `:8:1: unknown key "metrics-addr"; did you mean "metrics_addr"?`},
		"bad duration":         {configText("", "[fd]\ninterval = \"soon\"\n"), `:10:`},
		"grace below 3 ΔT":     {configText("", "[fd]\ninterval = \"1s\"\n"), `[fd] grace_period = "1s": must be at least 3 × interval`},
		"lease over heartbeat": {configText("", "[raft]\nleader_lease = \"900ms\"\n"), `[raft] leader_lease = "900ms" must not exceed heartbeat`},
		"member port":          {strings.Replace(configText("", ""), `raft = "127.0.0.1:2"`, `raft = "127.0.0.1:99999"`, 1), `[[members]] id = 1: raft = "127.0.0.1:99999"`},
		"not a table":          {configText("fd = 3", ""), `:8:`},
	} {
		_, err := load(c.text)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v; want %q in it", name, err, c.want)
		}
	}
	c, err := load(configText("", "[fd]\ngrace_period = \"2s\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.FD.Interval != DefaultFD.Interval || c.FD.MaxDrift != DefaultFD.MaxDrift || time.Duration(c.FD.GracePeriod) != 2*time.Second {
		t.Fatalf("partial [fd]: %+v", c.FD)
	}
	if c.DataDir != filepath.Join(dir, "data") {
		t.Fatalf("relative data_dir resolved to %q, want %q", c.DataDir, filepath.Join(dir, "data"))
	}
	c, err = load(configText("", "[fd]\nmax_drift = 0.002\n"))
	if err != nil || c.FD.MaxDrift != 0.002 || c.FD.Interval != DefaultFD.Interval {
		t.Fatalf("max_drift = 0.002 with the rest of [fd] left out: %+v %v", c.FD, err)
	}
	// max_drift = 0 is a setting, not an omission: refused, since each
	// node's clock guard allows up to 500 ppm (fd.MinMaxDrift).
	if _, err = load(configText("", "[fd]\nmax_drift = 0.0\n")); err == nil || !strings.Contains(err.Error(), "max_drift") {
		t.Fatalf("max_drift = 0: %v, want an error naming it", err)
	}
}
