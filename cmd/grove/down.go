package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/grovestore/grove/internal/cli"
	"github.com/grovestore/grove/internal/node"
)

func downCmd() *cobra.Command {
	var data string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "down",
		Short: "Stop every node of a grove up data directory (and grove up itself)",
		Long: `Stop the cluster of a grove up data directory: grove up (which stops its nodes),
then any node of the directory still running (one restarted by hand). Each
process is found by the pid recorded in its lock file (DIR/up.lock,
DIR/node-N/LOCK) and is signalled only while it holds that lock, so a stale pid
is never signalled. SIGTERM first; SIGKILL after --timeout. A node process
started while grove down runs, and not yet holding its lock, is not seen:
run grove down again once it is up.`,
		Example: `  grove down
  grove down --data /tmp/g --timeout 30s`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if timeout <= 0 {
				return cli.Usagef("--timeout %v: want a positive duration", timeout)
			}
			dir, err := filepath.Abs(data)
			if err != nil {
				return err
			}
			locks, _ := filepath.Glob(filepath.Join(dir, "node-*", "LOCK"))
			if _, err := os.Stat(filepath.Join(dir, "up.lock")); err != nil && len(locks) == 0 {
				return &cli.Error{Code: cli.ExitNotFound, Op: "down", Msg: fmt.Sprintf("%s is not a grove up data directory (no up.lock, no node-*/LOCK)", dir)}
			}
			sort.Slice(locks, func(i, j int) bool { return nodeNum(locks[i]) < nodeNum(locks[j]) })
			stopped := 0
			upLock := filepath.Join(dir, "up.lock")
			if pid, err := node.LockHolder(upLock); err != nil {
				return cli.Failf("down", "%v", err)
			} else if pid > 0 {
				fmt.Printf("stopping grove up (pid %d) and its nodes...\n", pid)
				if err := stopPID(pid, upLock, timeout); err != nil {
					return cli.Failf("down", "grove up (pid %d): %v", pid, err)
				}
				fmt.Printf("stopped grove up (pid %d)\n", pid)
				stopped++
			}
			var failed []string
			for _, l := range locks {
				pid, err := node.LockHolder(l)
				if err != nil {
					failed = append(failed, err.Error())
					continue
				}
				if pid <= 0 {
					continue
				}
				id := nodeNum(l)
				if err := stopPID(pid, l, timeout); err != nil {
					failed = append(failed, fmt.Sprintf("node %d (pid %d): %v", id, pid, err))
					continue
				}
				fmt.Printf("stopped node %d (pid %d)\n", id, pid)
				stopped++
			}
			if len(failed) > 0 {
				return cli.Failf("down", "%s", strings.Join(failed, "; "))
			}
			if stopped == 0 {
				fmt.Printf("nothing running in %s\n", dir)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&data, "data", "grove-data", "stop the cluster whose grove up data directory is `DIR`")
	cmd.Flags().DurationVar(&timeout, "timeout", 15*time.Second, "give each process `DURATION` to stop after SIGTERM, then SIGKILL it")
	return cmd
}
