// Package cli builds kvindex's command tree. Each subcommand's wiring lives
// in a package of its own under wiring/cli; this package only assembles
// them and owns the flags every command shares (logging).
package cli

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

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
		// A word that is no subcommand is a usage error (exit 2), not
		// cobra's legacy check's plain error (exit 1); no word prints the
		// help.
		Args:                       cobra.ArbitraryArgs,
		SuggestionsMinimumDistance: 2,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return cmd.Help()
			}
			msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
			if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
				msg += "; did you mean " + strings.Join(s, " or ") + "?"
			}
			return common.Usagef("%s", msg)
		},
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
	strictBuiltins(root)
	usageErrors(root)
	return root
}

// strictBuiltins makes cobra's own `help` and `completion` commands refuse
// what they do not know, as every other command does: `kvindex completion
// bogus` and `kvindex help bogus` printed a help text and exited 0, so a
// script piping `completion bahs` into its shell's setup went on with an
// empty script. Both commands are created here, not lazily at Execute,
// so that usageErrors wraps their argument checks too; bare `completion`
// still prints its help.
func strictBuiltins(root *cobra.Command) {
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		switch c.Name() {
		case "completion":
			// cobra checks Args (NoArgs) only for a runnable command.
			c.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
		case "help":
			show := c.Run
			c.Run = nil
			c.RunE = func(cmd *cobra.Command, args []string) error {
				if _, rest, err := cmd.Root().Find(args); err != nil || len(rest) > 0 {
					return common.Usagef("unknown help topic %q; see %q", strings.Join(args, " "), cmd.Root().CommandPath()+" --help")
				}
				show(cmd, args)
				return nil
			}
		}
	}
}

// usageErrors makes cobra's own refusals of the command line (a flag it
// cannot parse or does not know, arguments a command's Args refuses)
// usage errors, exit status 2 like the commands' own checks, in cmd and
// every command under it. cobra returns them as plain errors (exit 1).
func usageErrors(cmd *cobra.Command) {
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		if msg := plainParseError(err.Error()); msg != err.Error() {
			return common.Usagef("%s", msg)
		}
		return common.Usagef("%w", err)
	})
	if args := cmd.Args; args != nil {
		cmd.Args = func(c *cobra.Command, a []string) error {
			if err := args(c, a); err != nil {
				return common.Usagef("%w", err)
			}
			return nil
		}
	}
	for _, sub := range cmd.Commands() {
		usageErrors(sub)
	}
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

// strconvError matches the strconv part of pflag's message for a number
// it cannot parse: `strconv.ParseUint: parsing "-1": invalid syntax`.
var strconvError = regexp.MustCompile(`strconv\.Parse(Uint|Int|Float|Bool): parsing "(?:[^"\\]|\\.)*": (invalid syntax|value out of range)`)

// plainParseError rewrites the strconv part of a flag parse error in the
// user's terms: `invalid argument "-1" for "--rank" flag: want a whole
// number, 0 or more`.
func plainParseError(msg string) string {
	return strconvError.ReplaceAllStringFunc(msg, func(m string) string {
		sub := strconvError.FindStringSubmatch(m)
		if sub[2] == "value out of range" {
			return "out of range"
		}
		switch sub[1] {
		case "Uint":
			return "want a whole number, 0 or more"
		case "Int":
			return "want a whole number"
		case "Float":
			return "want a number"
		}
		return "want true or false"
	})
}
