package cli

import (
	"context"
	"io"
	"os"
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
		{[]string{"standalone", "--topic", "a b"}, `--topic: topic name "a b"`},
		{[]string{"standalone", "--hash-mode", "foo"}, `--hash-mode: keyspace: unknown hash mode "foo"`},
		{[]string{"ingester", "--topic", "a b", "--metrics-listen", "127.0.0.1:0"}, `--topic: topic name "a b"`},
		{[]string{"ingester", "--log-level", "loud"}, `--log-level: logging: unknown level "loud"`},
		{[]string{"indexd", "--log-format", "xml"}, `--log-format: logging: unknown format "xml"`},
		{[]string{"ingester", "--brokers", ",", "--metrics-listen", "127.0.0.1:0"}, "--brokers has an empty entry"},
		{[]string{"completion", "bahs"}, `unknown command "bahs" for "kvindex completion"`},
		{[]string{"completion", "bash", "extra"}, `unknown command "extra" for "kvindex completion bash"`},
		{[]string{"help", "bogus"}, `unknown help topic "bogus"`},
		{[]string{"help", "lookup", "bogus"}, `unknown help topic "lookup bogus"`},
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
	// What cobra's built-ins do know still works and exits 0.
	for _, args := range [][]string{{"completion"}, {"help"}, {"help", "lookup"}, {"help", "cells", "verify"}} {
		root := NewRoot()
		root.SetArgs(args)
		var out strings.Builder
		root.SetOut(&out)
		root.SetErr(io.Discard)
		if err := root.ExecuteContext(context.Background()); err != nil || out.Len() == 0 {
			t.Errorf("kvindex %v = %v, printed %d bytes; want output and no error", args, err, out.Len())
		}
	}
	// A shell's script goes to the process's standard output, which the
	// completion command takes when the root is built.
	script, err := os.CreateTemp(t.TempDir(), "completion")
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = script
	root := NewRoot()
	os.Stdout = stdout
	root.SetArgs([]string{"completion", "bash"})
	if err := root.ExecuteContext(context.Background()); err != nil {
		t.Fatalf("kvindex completion bash = %v", err)
	}
	if b, err := os.ReadFile(script.Name()); err != nil || !strings.Contains(string(b), "bash completion") {
		t.Fatalf("kvindex completion bash wrote %d bytes (%v), want a bash completion script", len(b), err)
	}
	// No word at all prints the help and succeeds.
	root = NewRoot()
	root.SetArgs(nil)
	var out strings.Builder
	root.SetOut(&out)
	if err := root.ExecuteContext(context.Background()); err != nil || !strings.Contains(out.String(), "Usage:") {
		t.Fatalf("kvindex with no arguments = %v, printed %q; want the help", err, out.String())
	}
}
