// Package cli builds kvindex's command tree. Each subcommand's wiring lives
// in a package of its own under internal/cli; this package only assembles
// them and owns the flags every command shares (logging).
package cli

import (
	"errors"

	"github.com/spf13/cobra"

	"github.com/kvindex/kvindex/internal/cli/bridgecmd"
	"github.com/kvindex/kvindex/internal/cli/ingestercmd"
)

// NewRoot returns the root command with every subcommand attached.
func NewRoot() *cobra.Command {
	root := &cobra.Command{
		Use:   "kvindex",
		Short: "A live KV-cache block index for LLM routers",
		Long: `kvindex turns the KV events model servers publish (block stored, block
removed, all cleared) into a replicated index of which endpoint holds which
prefix block on which tier, and answers routers' Lookup calls from it.

Start everything in one process with 'kvindex standalone'.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	for _, add := range subcommands {
		root.AddCommand(add())
	}
	return root
}

// subcommands lists the constructors of every subcommand, in help order.
var subcommands = []func() *cobra.Command{ingestercmd.NewCommand, bridgecmd.NewCommand}

// ExitError carries a process exit code through cobra (for example 1 when a
// replayed scenario's expectation fails, 2 for bad usage).
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string { return e.Err.Error() }
func (e *ExitError) Unwrap() error { return e.Err }

// ExitCode returns the exit code for an error returned by the command tree:
// an ExitError's code, else 1.
func ExitCode(err error) int {
	var ee *ExitError
	if errors.As(err, &ee) {
		return ee.Code
	}
	return 1
}
