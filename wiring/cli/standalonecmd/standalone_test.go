package standalonecmd

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"strings"
	"testing"
	"time"
)

// TestFlagsRefused: flags whose value would silently become the default,
// or that Kafka would refuse, are errors naming the flag, checked before
// anything starts (so no data directory is created either).
func TestFlagsRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{name: "zero_partitions", args: []string{"--partitions", "0"}, want: "--partitions must be positive, got 0"},
		{name: "negative_partitions", args: []string{"--partitions", "-5"}, want: "--partitions must be positive, got -5"},
		{name: "zero_liveness_window", args: []string{"--liveness-window", "0s"}, want: "--liveness-window must be positive, got 0s"},
		{name: "liveness_window_under_a_clock_tick", args: []string{"--liveness-window", "1ns"}, want: "--liveness-window 1ns: want at least 100ms"},
		{name: "zero_max_connections", args: []string{"--max-connections", "0"}, want: "--max-connections must be positive, got 0"},
		{name: "zero_handshake_timeout", args: []string{"--handshake-timeout", "0s"}, want: "--handshake-timeout must be positive, got 0s"},
		{name: "empty_topic", args: []string{"--topic", ""}, want: "--topic: empty topic name"},
		{name: "topic_with_space_and_slash", args: []string{"--topic", "bad topic/x"}, want: "--topic: topic name \"bad topic/x\""},
		{name: "tls_key_without_cert", args: []string{"--tls-key-file", "k.pem"}, want: "--tls-cert-file and --tls-key-file go together"},
		{name: "client_ca_without_cert", args: []string{"--tls-client-ca-file", "ca.pem"}, want: "--tls-cert-file and --tls-key-file go together"},
		// Standalone serves no health port, so it has no flag to bound one.
		{name: "health_max_connections_without_health_port", args: []string{"--health-max-connections", "8"}, want: "unknown flag: --health-max-connections"},
		{name: "too_many_partitions", args: []string{"--partitions", "2147483647"}, want: "--partitions 2147483647: at most 256"},
		{name: "empty_metrics_listen", args: []string{"--metrics-listen", ""}, want: "--metrics-listen must not be empty"},
		{name: "empty_listen", args: []string{"--listen", ""}, want: "--listen must not be empty"},
		{name: "topic_too_long", args: []string{"--topic", strings.Repeat("t", 250)}, want: "--topic: topic name is 250 characters"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir() + "/data"
			cmd := NewCommand()
			cmd.SetArgs(append(tc.args, "--data-dir", dir))
			cmd.SetOut(io.Discard)
			cmd.SetErr(io.Discard)
			// Bounded: a flag the check let through would start a stack.
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err := cmd.ExecuteContext(ctx)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error = %v, want one containing %q", err, tc.want)
			}
			if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("--data-dir after a refused flag: %v, want nothing created", err)
			}
		})
	}
}

// TestEmptyDataDirRefused: an empty --data-dir names the flag (it read
// "stack: DataDir is required", a Go field name).
func TestEmptyDataDirRefused(t *testing.T) {
	cmd := NewCommand()
	cmd.SetArgs(append([]string{"--data-dir", ""}, freePorts...))
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cmd.ExecuteContext(ctx); err == nil || !strings.Contains(err.Error(), "--data-dir must not be empty") {
		t.Fatalf("error = %v, want one naming --data-dir", err)
	}
}
