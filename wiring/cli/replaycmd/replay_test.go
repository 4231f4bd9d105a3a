package replaycmd

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/internal/scenario"
	"github.com/kvindex/kvindex/internal/testutil"
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

// TestUnreachableBrokersNamed: --brokers nobody answers fails within
// brokerPingTimeout, naming the flag, before anything is produced or
// looked up. Before, the producer's retries took about 50 s to fail.
func TestUnreachableBrokersNamed(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close() // nothing listens there now
	file := filepath.Join(testutil.RepoRoot(t), "testdata", "fixtures", "scenarios", "t01_same_prompt_across_pods.jsonl")
	cmd := NewCommand()
	cmd.SetArgs([]string{"--brokers", dead, "--index", dead, file})
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	ctx, cancel := context.WithTimeout(context.Background(), 2*brokerPingTimeout)
	defer cancel()
	err = cmd.ExecuteContext(ctx)
	if err == nil || !strings.Contains(err.Error(), "did not answer") || !strings.Contains(err.Error(), "(--brokers; tried for up to") {
		t.Fatalf("replay against dead brokers = %v, want an error naming --brokers", err)
	}
}
