package replaycmd

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/internal/scenario"
	"github.com/kvindex/kvindex/wiring/replay"
)

func TestReportCountsInWords(t *testing.T) {
	for _, tc := range []struct {
		name               string
		publishes, lookups int
		want               string
	}{
		{name: "one_each", publishes: 1, lookups: 1, want: "PASS s (1 record, 1 lookup)\n"},
		{name: "several", publishes: 3, lookups: 2, want: "PASS s (3 records, 2 lookups)\n"},
		{name: "none", publishes: 0, lookups: 0, want: "PASS s (0 records, 0 lookups)\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			report(&out, "text", &scenario.Scenario{Name: "s"}, replay.Result{Scenario: "s", Publishes: tc.publishes, Lookups: tc.lookups})
			if out.String() != tc.want {
				t.Fatalf("report = %q, want %q", out.String(), tc.want)
			}
		})
	}
}

// TestFlagsRefused: a bad --topic or a non-positive --barrier-timeout is a
// usage error (exit 2) naming the flag, before anything starts.
func TestFlagsRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{name: "topic_with_space_and_slash", args: []string{"--topic", "bad topic/x"}, want: "--topic"},
		{name: "empty_topic", args: []string{"--topic", ""}, want: "--topic"},
		{name: "zero_barrier_timeout", args: []string{"--barrier-timeout", "0s"}, want: "--barrier-timeout must be positive"},
		{name: "negative_barrier_timeout", args: []string{"--barrier-timeout", "-1s"}, want: "--barrier-timeout must be positive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := NewCommand()
			cmd.SetArgs(append(tc.args, "does-not-matter.jsonl"))
			cmd.SetOut(io.Discard)
			cmd.SetErr(io.Discard)
			err := cmd.ExecuteContext(context.Background())
			var ee *exitError
			if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error = %v, want exit 2 naming %q", err, tc.want)
			}
		})
	}
}
