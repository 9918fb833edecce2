// Command grove is Grove's single binary: the embedded cluster (grove up,
// grove down), one node of a real cluster (grove server), and the operator
// tools. Every client command follows the conventions of internal/cli:
// --endpoints/--addr/GROVE_ENDPOINTS, --dial-timeout, --command-timeout,
// -o table|json, and the exit codes of the README's table.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/grovestore/grove/internal/cli"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// signals is the process's stop signals: the first cancels the command's
// context (commands stop cleanly: up and server stop their nodes, an
// acquire that was not granted is cancelled), a second one exits at once.
type signals struct {
	mu     sync.Mutex
	got    os.Signal
	at     time.Time
	forced func() // run before a second signal exits the process
}

func (s *signals) first() os.Signal {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.got
}

// onForcedExit sets what a second signal does before exiting (grove lock
// NAME -- COMMAND kills COMMAND's group: it must not outlive the lock).
func (s *signals) onForcedExit(fn func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.forced = fn
}

func (s *signals) watch(cancel context.CancelFunc) {
	ch := make(chan os.Signal, 4)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		sig := <-ch
		s.mu.Lock()
		s.got, s.at = sig, time.Now()
		s.mu.Unlock()
		cancel()
		for sig2 := range ch {
			// The same signal again within a second is one event sent
			// twice (timeout(1) and some supervisors signal the process
			// and its group), not an operator insisting.
			if sig2 == sig && time.Since(s.at) < time.Second {
				continue
			}
			s.mu.Lock()
			forced := s.forced
			s.mu.Unlock()
			if forced != nil {
				forced()
			}
			fmt.Fprintf(os.Stderr, "grove: second signal (%s): exiting now\n", sig2)
			os.Exit(128 + int(sig2.(syscall.Signal)))
		}
	}()
}

// sigs is the process's first stop signal (grove lock NAME -- COMMAND
// passes it on to COMMAND).
var sigs = &signals{}

func run(args []string, stdout, stderr io.Writer) int {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigs.watch(cancel)

	root := rootCmd()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteContextC(ctx)
	code := cli.Code(err)
	if sig := sigs.first(); sig != nil && err != nil {
		var st cli.ExitStatus
		if !errors.As(err, &st) { // a command's own status passes through
			code = 128 + int(sig.(syscall.Signal))
			var ce *cli.Error
			if !errors.As(err, &ce) || ce.Code != cli.ExitInterrupted {
				// What it said was a symptom of the signal.
				op := ""
				if cmd != nil {
					op = strings.TrimPrefix(cmd.CommandPath(), "grove ")
				}
				err = &cli.Error{Code: code, Op: op, Msg: "interrupted (" + sig.String() + ")"}
			}
		}
	}
	if err != nil {
		var st cli.ExitStatus
		if !errors.As(err, &st) {
			fmt.Fprintln(stderr, "grove:", err)
		}
		var ce *cli.Error
		if errors.As(err, &ce) && ce.Usage && cmd != nil {
			fmt.Fprintf(stderr, "\nUsage:\n  %s\n\nRun '%s --help' for more.\n", strings.TrimSpace(cmd.UseLine()), cmd.CommandPath())
		}
	}
	return code
}

func rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "grove",
		Short: "Grove: a distributed storage substrate (Boxwood, DDS, DHTbd, Slice)",
		Long: `Grove: a distributed storage substrate (Boxwood, DDS, DHTbd, Slice).

Start an embedded 3-node cluster with 'grove up'; every client command talks to
its gateway (127.0.0.1:7400) unless told otherwise with --endpoints or
$GROVE_ENDPOINTS. Exit codes: 0 ok, 1 failed, 2 usage, 3 unavailable,
4 timeout, 5 not found, 6 degraded, 7 lease lost, 130 interrupted.`,
		Example: `  grove up                      # start a 3-node cluster under ./grove-data
  grove status                  # members, leader, every node's liveness
  grove lock db -- ./migrate.sh # run a command while holding lock "db"
  grove down                    # stop the cluster of ./grove-data`,
		Version:       versionString(),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetVersionTemplate("{{.Version}}\n")
	root.AddCommand(upCmd(), downCmd(), serverCmd(), statusCmd(), healthCmd(), lockCmd(), rldevCmd(), chunkCmd(), treeCmd(), tableCmd(), memberCmd(), benchCmd(), versionCmd(), keygenCmd())
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return cli.Usagef("%v", err) })
	root.SetHelpCommand(&cobra.Command{
		Use:     "help [COMMAND...]",
		Short:   "Help about any command",
		Example: "  grove help\n  grove help lock acquire",
		RunE: func(c *cobra.Command, args []string) error {
			cmd, rest, err := c.Root().Find(args)
			if err != nil || len(rest) > 0 {
				return cli.Usagef("unknown help topic %q (grove --help lists the commands)", strings.Join(args, " "))
			}
			return cmd.Help()
		},
	})
	// Cobra adds these on Execute; add them now so that they follow the
	// conventions below (an unknown `grove completion nosuch` fails).
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		if c.Name() == "completion" {
			c.Example = "  source <(grove completion bash)\n  grove completion bash > /etc/bash_completion.d/grove\n  grove completion zsh > \"${fpath[1]}/_grove\""
			for _, s := range c.Commands() {
				s.Example = "  grove completion " + s.Name() + " --help"
			}
		}
	}
	conventions(root)
	return root
}

// conventions applies the CLI's rules to every command: argument errors
// are usage errors (exit 2, with the usage printed); a command group run
// with an unknown subcommand fails (exit 2) instead of printing help and
// succeeding; run bare, it prints its help.
func conventions(c *cobra.Command) {
	c.SuggestionsMinimumDistance = 2
	if c.HasSubCommands() && c.RunE == nil && c.Run == nil {
		c.Args = groupArgs
		c.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
	} else if c.Args != nil {
		inner := c.Args
		c.Args = func(cmd *cobra.Command, args []string) error {
			if err := inner(cmd, args); err != nil {
				var ce *cli.Error
				if errors.As(err, &ce) {
					return err
				}
				return cli.Usagef("%v", err)
			}
			return nil
		}
	}
	for _, s := range c.Commands() {
		conventions(s)
	}
}

// groupArgs refuses an unknown subcommand, suggesting near names.
func groupArgs(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		msg += "; did you mean " + strings.Join(s, " or ") + "?"
	}
	return cli.Usagef("%s", msg)
}

// noArgs and exactArgs name what is missing or extra, in words.
func exactArgs(names ...string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		switch {
		case len(args) < len(names):
			return cli.Usagef("missing %s", strings.Join(names[len(args):], " "))
		case len(args) > len(names):
			return cli.Usagef("unexpected argument %q", args[len(names)])
		}
		return nil
	}
}
