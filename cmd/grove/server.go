package main

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	_ "net/http/pprof" // GROVE_PPROF_BASE: profiles for whoever debugs a node
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/grovestore/grove/internal/cli"
	"github.com/grovestore/grove/internal/fd"
	"github.com/grovestore/grove/internal/logging"
	"github.com/grovestore/grove/internal/node"
)

func serverCmd() *cobra.Command {
	var path, logFile, logLevel, logFormat string
	var bootstrap, bootstrapIfNew bool
	cmd := &cobra.Command{
		Use:   "server --config FILE",
		Short: "Run one node of a Grove cluster",
		Long: `Run one node of a Grove cluster from its TOML config file (README: "grove
server"). The node logs to DATA_DIR/grove.log unless --log-file says otherwise
("-" for standard error); standard output gets its start line and rare events
(a self-fence). SIGINT, SIGTERM or SIGHUP stops it cleanly (exit 0).

--bootstrap creates a brand-new config service: give it only on the very first
start of a new cluster's members, never to a member that lost its data.
--bootstrap-if-new does so only once every member has answered and none has a
cluster that has run (for deployments whose members always start with the
same command line; it waits for silent members, saying so every 10 s; use it
only where data is lost all together).`,
		Example: `  grove server --config /etc/grove/grove.toml
  grove server --config node-1/grove.toml --log-file - --log-format json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if path == "" {
				return cli.Usagef("--config FILE is required")
			}
			serverGC()
			if _, err := logging.ParseLevel(logLevel); err != nil {
				return cli.Usagef("--log-level: %v", err)
			}
			if err := logging.CheckFormat(logFormat); err != nil {
				return cli.Usagef("--log-format: %v", err)
			}
			cfg, err := node.LoadConfig(path)
			if err != nil {
				return cli.WithCode(cli.ExitUsage, "", err)
			}
			if logFile == "" {
				logFile = filepath.Join(cfg.DataDir, "grove.log")
			}
			lf, err := logging.OpenFile(logFile)
			if err != nil {
				return cli.Failf("server", "log file: %v", err)
			}
			defer lf.Close()
			log, _ := logging.New(lf, logFormat, logLevel)
			// Standard output may be a pipe to grove up, which can go away
			// first: a write then fails (EPIPE) instead of killing the node.
			signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
			n, err := node.Start(cfg, node.Options{Logger: log, Bootstrap: bootstrap, BootstrapIfNew: bootstrapIfNew, Context: cmd.Context()})
			if errors.Is(err, node.ErrStopped) {
				// A signal while it waited for the other members: a clean stop.
				log.Info("stopped", "why", err)
				return nil
			}
			if err != nil {
				log.Error("start failed", "err", err)
				return cli.Failf("", "%v", err)
			}
			n.Fence().OnFence(func(inc fd.Incarnation) {
				fmt.Printf("node %d fenced itself (incarnation %d lost contact with a majority of observers); it comes back as a new incarnation\n", cfg.ID, inc)
			})
			fmt.Printf("node %d pid=%d grpc=%s beacon=%s config=%s logs=%s\n", cfg.ID, os.Getpid(), cfg.GRPCAddr, cfg.BeaconAddr, path, logFile)
			if addr := pprofAddr(int(cfg.ID)); addr != "" {
				log.Info("serving Go profiles (GROVE_PPROF_BASE)", "addr", "http://"+addr+"/debug/pprof/")
			}
			<-cmd.Context().Done()
			log.Info("stopping")
			n.Close()
			log.Info("stopped")
			return nil
		},
	}
	cmd.Flags().StringVar(&path, "config", "", "read the node's config from `FILE` (TOML)")
	cmd.Flags().BoolVar(&bootstrap, "bootstrap", false, "create a brand-new config service (first start of a new cluster's members only; never for a member that lost its data)")
	cmd.Flags().BoolVar(&bootstrapIfNew, "bootstrap-if-new", false, "bootstrap only once every member has answered and none reports a cluster that has run (one command line for every start, as in deploy/compose.yaml; see README)")
	cmd.Flags().StringVar(&logFile, "log-file", "", "log to `FILE` (default DATA_DIR/grove.log; - for standard error)")
	addLogFlags(cmd, &logLevel, &logFormat)
	return cmd
}

// serverGC sets the garbage collector of a process that runs nodes: GOGC
// 400 unless the environment sets GOGC. An RLDev request allocates its
// blocks afresh (up to 8 MiB) on a small live heap, so at Go's default of
// 100 the collector ran every few requests: measured in-process
// (BenchmarkService*), 400 cut the time of a 1 MiB read by a quarter and
// of a 1 MiB write by a sixth, for a heap at most five times the live
// data instead of twice.
func serverGC() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400)
	}
}

// serverProcs gives a process that runs nodes nodes (more than one: grove
// up without --processes) as many Ps (GOMAXPROCS) as that many processes
// of one node each would have, unless the environment sets GOMAXPROCS.
// Why: a node's disk workers spend their time in pwrite and fdatasync,
// and Go takes a P back from a thread blocked in a system call only when
// its monitor notices, 20 µs or more later; with several nodes on the Ps
// of one, every node's network and engine goroutines wait behind the
// others' system calls. Measured (BenchmarkServiceWrite4KQD32: two store
// nodes and a clerk in one process, 2 cores, 2026-11-30): 125-175 µs a
// replicated 4 KiB write at GOMAXPROCS 2 (65-70 in a third of the runs),
// 58-63 µs at 4, 8 or 16; writes and reads at queue depth 1 unchanged. A
// process of one node gains nothing on 2 cores (grove bench rldev, two
// rounds at 2 and 8 Ps), so grove server keeps Go's default.
func serverProcs(nodes int) {
	if os.Getenv("GOMAXPROCS") == "" && nodes > 1 {
		runtime.GOMAXPROCS(nodes * runtime.GOMAXPROCS(0))
	}
}

// pprofAddr serves Go's profiler on 127.0.0.1:GROVE_PPROF_BASE+offset (a
// debugging aid, off unless the variable is set; grove server uses its
// node ID, grove bench 0) and returns the address ("" when off).
func pprofAddr(offset int) string {
	base, err := strconv.Atoi(os.Getenv("GROVE_PPROF_BASE"))
	if err != nil || base <= 0 {
		return ""
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(base+offset))
	go func() { _ = http.ListenAndServe(addr, nil) }()
	return addr
}
