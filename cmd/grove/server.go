package main

import (
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/grovestore/grove/internal/node"
)

func serverCmd() *cobra.Command {
	var path string
	var bootstrap bool
	cmd := &cobra.Command{
		Use:   "server --config FILE",
		Short: "Run one node of a Grove cluster",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := node.LoadConfig(path)
			if err != nil {
				return err
			}
			log := slog.New(slog.NewTextHandler(os.Stderr, nil))
			n, err := node.Start(cfg, node.Options{Logger: log, Bootstrap: bootstrap})
			if err != nil {
				return err
			}
			fmt.Printf("node %d pid=%d grpc=%s beacon=%s config=%s\n", cfg.ID, os.Getpid(), cfg.GRPCAddr, cfg.BeaconAddr, path)
			sig := make(chan os.Signal, 1)
			signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
			s := <-sig
			log.Info("stopping", "signal", s.String())
			n.Close()
			return nil
		},
	}
	cmd.Flags().StringVar(&path, "config", "", "node config file (TOML)")
	cmd.Flags().BoolVar(&bootstrap, "bootstrap", false, "create a brand-new config service (first start of a new cluster's members only; never for a member that lost its data)")
	cmd.MarkFlagRequired("config")
	return cmd
}
