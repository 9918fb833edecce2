package node

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/grovestore/grove/internal/disk"
)

// An incarnation is persisted before it is returned; a disk that cannot
// persist it yields no incarnation at all.
func TestNextIncarnation(t *testing.T) {
	d := disk.NewMem()
	for want := uint64(1); want <= 3; want++ {
		inc, err := nextIncarnation(d, "/n")
		if err != nil || uint64(inc) != want {
			t.Fatalf("incarnation %d, %v; want %d", inc, err, want)
		}
		if b, _ := d.ReadFile("/n/incarnation"); strings.TrimSpace(string(b)) != strings.TrimSpace(string(rune('0'+want))) {
			t.Fatalf("persisted %q, want %d", b, want)
		}
	}
	d.FailWrites(disk.ErrFull)
	if _, err := nextIncarnation(d, "/n"); !errors.Is(err, disk.ErrFull) {
		t.Fatalf("full disk: %v", err)
	}
	d.FailWrites(nil)
	if inc, _ := nextIncarnation(d, "/n"); inc != 4 {
		t.Fatalf("after a failed write: %d, want 4 (3 is the last one used)", inc)
	}
	d.WriteFileSync("/n/incarnation", []byte("garbage"))
	if _, err := nextIncarnation(d, "/n"); err == nil {
		t.Fatal("corrupt incarnation file accepted")
	}
}

func validConfig() *Config {
	m := []MemberConfig{{ID: 1, GRPC: "127.0.0.1:1", Raft: "127.0.0.1:2", Beacon: "127.0.0.1:3"}}
	return &Config{ID: 1, DataDir: "/d", GRPCAddr: "127.0.0.1:1", RaftAddr: "127.0.0.1:2", BeaconAddr: "127.0.0.1:3",
		Roles: []string{RoleMeta, RoleObserver}, Members: m, FD: DefaultFD}
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
