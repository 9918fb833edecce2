// Command grove is Grove's single binary: the embedded cluster (grove up),
// one node of a real cluster (grove server), and the operator tools.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

func main() {
	root := &cobra.Command{
		Use:           "grove",
		Short:         "Grove: a distributed storage substrate (Boxwood, DDS, DHTbd, Slice)",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(upCmd(), serverCmd(), statusCmd(), lockCmd(), memberCmd(), benchCmd())
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "grove:", err)
		os.Exit(1)
	}
}
