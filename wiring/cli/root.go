// Package cli builds kvindex's command tree. Each subcommand's wiring lives
// in a package of its own under wiring/cli; this package only assembles
// them and owns the flags every command shares (logging).
package cli

import (
	"errors"

	"github.com/spf13/cobra"

	"github.com/kvindex/kvindex/wiring/cli/bridgecmd"
	"github.com/kvindex/kvindex/wiring/cli/cellscmd"
	"github.com/kvindex/kvindex/wiring/cli/common"
	"github.com/kvindex/kvindex/wiring/cli/indexdcmd"
	"github.com/kvindex/kvindex/wiring/cli/ingestercmd"
	"github.com/kvindex/kvindex/wiring/cli/inspectcmd"
	"github.com/kvindex/kvindex/wiring/cli/lookupcmd"
	"github.com/kvindex/kvindex/wiring/cli/migratecmd"
	"github.com/kvindex/kvindex/wiring/cli/replaycmd"
	"github.com/kvindex/kvindex/wiring/cli/standalonecmd"
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
		Version:       version(),
		// Before any subcommand runs: no address flag may carry
		// credentials (common.AddressFlags), so none reaches an error or
		// a log line unredacted.
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return common.CheckAddressFlags(cmd.Flags())
		},
	}
	for _, add := range subcommands {
		sub := add()
		common.RedactFlagDefaults(sub.Flags())
		root.AddCommand(sub)
	}
	return root
}

// subcommands lists the constructors of every subcommand, in help order.
var subcommands = []func() *cobra.Command{
	ingestercmd.NewCommand,
	indexdcmd.NewCommand,
	bridgecmd.NewCommand,
	lookupcmd.NewCommand,
	lookupcmd.NewEndpointsCommand,
	inspectcmd.NewCommand,
	migratecmd.NewCommand,
	cellscmd.NewCommand,
	standalonecmd.NewCommand,
	replaycmd.NewCommand,
}

// ExitCode returns the process exit status for an error from the command
// tree: the code of an error that has an ExitCode() int method (replay
// uses 1 for a failed expectation, 2 for bad usage), else 1.
func ExitCode(err error) int {
	var coded interface{ ExitCode() int }
	if errors.As(err, &coded) {
		return coded.ExitCode()
	}
	return 1
}
