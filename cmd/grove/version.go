package main

import (
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"

	"github.com/grovestore/grove/internal/cli"
	"github.com/grovestore/grove/internal/node"
)

// Set at link time by release builds (-ldflags "-X main.version=v0.3.0");
// otherwise taken from the module's build information.
var version = ""

// BuildInfo is what `grove version` reports.
type BuildInfo struct {
	Version   string // module version ("(devel)" for a build from a checkout)
	Commit    string // VCS revision, with "-dirty" if the tree had changes
	BuildTime string // commit time (Go records the commit's, not the build's)
	Go        string
	Platform  string
}

func buildInfo() BuildInfo {
	b := BuildInfo{Version: version, Go: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if b.Version == "" {
			b.Version = bi.Main.Version
		}
		dirty := false
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				b.Commit = s.Value
			case "vcs.time":
				b.BuildTime = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if dirty && b.Commit != "" {
			b.Commit += "-dirty"
		}
	}
	if b.Version == "" {
		b.Version = "(devel)"
	}
	return b
}

func versionString() string {
	b := buildInfo()
	s := "grove " + b.Version
	if b.Commit != "" {
		c, suffix, _ := strings.Cut(b.Commit, "-") // keep a "-dirty" suffix
		if len(c) > 12 {
			c = c[:12]
		}
		if suffix != "" {
			c += "-" + suffix
		}
		s += " commit " + c
	}
	if b.BuildTime != "" {
		s += " (" + b.BuildTime + ")"
	}
	return s + " " + b.Go + " " + b.Platform
}

func versionCmd() *cobra.Command {
	var out cli.Output
	cmd := &cobra.Command{
		Use:     "version",
		Short:   "Print grove's version, commit, Go version and build time",
		Example: "  grove version\n  grove version -o json\n  grove --version",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.Resolve(); err != nil {
				return err
			}
			b := buildInfo()
			if !out.JSON() {
				_, err := fmt.Fprintln(cmd.OutOrStdout(), versionString())
				return err
			}
			d := &cli.Doc{}
			d.Field("version", b.Version)
			d.Field("commit", b.Commit)
			d.Field("build_time", b.BuildTime)
			d.Field("go", b.Go)
			d.Field("platform", b.Platform)
			return out.Print(os.Stdout, d)
		},
	}
	out.Register(cmd)
	return cmd
}

func keygenCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "keygen",
		Short: "Print a fresh random cluster key (64 hex digits) for cluster_key or cluster_key_file",
		Long: `Print a fresh random cluster key: 32 random bytes in hex, what cluster_key (or
the file named by cluster_key_file) holds on every node of a cluster. It
authenticates failure-detector datagrams (README: "The cluster key").`,
		Example: "  grove keygen > deploy/cluster.key\n  chmod 600 deploy/cluster.key",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintln(cmd.OutOrStdout(), node.NewClusterKey())
			return err
		},
	}
}
