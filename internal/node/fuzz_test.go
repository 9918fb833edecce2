package node

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pelletier/go-toml/v2"
)

// FuzzConfig: a node's config file is an operator's input. Whatever the
// bytes, parsing and validating it never panics, every error names the
// file, and a config that validates is written back (Config.Write, as
// `grove up` does) as a file that reads and validates to the same config.
func FuzzConfig(f *testing.F) {
	f.Add([]byte(configText("", "")))
	f.Add([]byte(configText(`disks = ["disk0.img"]
disk_size = "1GiB"
metrics_addr = "127.0.0.1:4"`, `[fd]
interval = "100ms"
grace_period = "2s"
[raft]
heartbeat = "500ms"
[rldev]
disk_timeout = "20s"`)))
	f.Add([]byte(configText("", "[fd]\ninterval = 200\n")))
	f.Add([]byte(configText("bogus = 1", "")))
	if b, err := os.ReadFile("../../deploy/node-1.toml"); err == nil {
		f.Add(b)
	}
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, b []byte) {
		const path = "/etc/grove/fuzz.toml"
		c, err := parseConfig(path, b)
		if err == nil {
			c, err = validated(path, c)
		}
		if err != nil {
			if !strings.HasPrefix(err.Error(), "config "+path) {
				t.Fatalf("an error that does not name the file: %v", err)
			}
			return
		}
		p := filepath.Join(dir, "again.toml")
		if err := c.Write(p); err != nil {
			t.Fatalf("a valid config does not write: %v", err)
		}
		again, err := LoadConfig(p)
		if err != nil {
			t.Fatalf("a valid config, written back, does not load: %v\n%s", err, b)
		}
		// Relative paths were anchored at /etc/grove; written absolute, so
		// they stay as they are.
		x, err1 := toml.Marshal(c)
		y, err2 := toml.Marshal(again)
		if err1 != nil || err2 != nil || !bytes.Equal(x, y) {
			t.Fatalf("written back and read, the config differs:\n%s\n%s", x, y)
		}
	})
}
