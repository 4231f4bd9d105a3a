package cli

import (
	"context"
	"io"
	"strings"
	"testing"
)

// TestCommandLineRefusalsExitTwo: every refusal of the command line itself
// (an unknown command or flag, a flag value cobra cannot parse, arguments
// a command does not take, a value a command's own check refuses) exits
// with status 2, whichever command it is; before, cobra's own refusals
// and the roles' checks exited 1 while the tools' checks exited 2.
func TestCommandLineRefusalsExitTwo(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"bogus"}, `unknown command "bogus" for "kvindex"`},
		{[]string{"lookp"}, "did you mean lookup?"},
		{[]string{"--bogus"}, "unknown flag: --bogus"},
		{[]string{"lookup", "--timeout", "5"}, `invalid argument "5" for "--timeout"`},
		{[]string{"endpoints", "foo"}, `unknown command "foo" for "kvindex endpoints"`},
		{[]string{"replay"}, "requires at least 1 arg"},
		{[]string{"standalone", "--partitions", "0"}, "--partitions must be positive"},
		{[]string{"indexd", "--max-hashes", "-1"}, "--max-hashes must be positive"},
		{[]string{"bridge", "--pod", "p", "--model", "m", "--brokers", "127.0.0.1:1", "--dp-rank", "70000"}, "--zmq with --dp-rank 70000"},
		{[]string{"replay", "--log-level", "loud", "no-such-file.jsonl"}, `--log-level: logging: unknown level "loud"`},
		{[]string{"cells", "verify", "cells.json", "--model", "m", "--timeout", "0s"}, "--timeout must be positive"},
		{[]string{"inspect", "blocks", "--model", "m", "--pod", "p", "--rank", "-1"}, `invalid argument "-1" for "--rank" flag: want a whole number, 0 or more`},
		{[]string{"standalone", "--partitions", "abc"}, `invalid argument "abc" for "--partitions" flag: want a whole number`},
		{[]string{"bridge", "--dp-rank", "99999999999999999999"}, `for "--dp-rank" flag: out of range`},
	} {
		t.Run(strings.Join(tc.args, "_"), func(t *testing.T) {
			root := NewRoot()
			root.SetArgs(tc.args)
			root.SetOut(io.Discard)
			root.SetErr(io.Discard)
			err := root.ExecuteContext(context.Background())
			if err == nil || !strings.Contains(err.Error(), tc.want) || ExitCode(err) != 2 || strings.Contains(err.Error(), "strconv.") {
				t.Fatalf("kvindex %v = %v (exit %d), want an error containing %q, exit 2", tc.args, err, ExitCode(err), tc.want)
			}
		})
	}
	// No word at all prints the help and succeeds.
	root := NewRoot()
	root.SetArgs(nil)
	var out strings.Builder
	root.SetOut(&out)
	if err := root.ExecuteContext(context.Background()); err != nil || !strings.Contains(out.String(), "Usage:") {
		t.Fatalf("kvindex with no arguments = %v, printed %q; want the help", err, out.String())
	}
}
