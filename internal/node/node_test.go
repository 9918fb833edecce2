package node

import (
	"path/filepath"
	"strings"
	"testing"
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
