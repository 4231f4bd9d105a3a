package bridge_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/bridge"
)

func validConfig() bridge.Config {
	c := bridge.DefaultConfig()
	c.Endpoint, c.ReplayEndpoint = "tcp://127.0.0.1:5557", "tcp://127.0.0.1:5558"
	c.Pod, c.Model = pod, model
	c.Brokers, c.Topic = []string{"127.0.0.1:9092"}, topic
	return c
}

func TestConfigValidate(t *testing.T) {
	if err := validConfig().Validate(); err != nil {
		t.Fatalf("valid config rejected: %v", err)
	}
	for _, tc := range []struct {
		name string
		mod  func(*bridge.Config)
	}{
		{"no_endpoint", func(c *bridge.Config) { c.Endpoint = "" }},
		{"bind_address", func(c *bridge.Config) { c.Endpoint = "tcp://*:5557" }},
		{"ipc_endpoint", func(c *bridge.Config) { c.Endpoint = "ipc:///tmp/kv" }},
		{"no_port", func(c *bridge.Config) { c.Endpoint = "tcp://engine" }},
		{"port_zero", func(c *bridge.Config) { c.Endpoint = "tcp://engine:0" }},
		{"bad_replay", func(c *bridge.Config) { c.ReplayEndpoint = "engine:5558" }},
		{"no_pod", func(c *bridge.Config) { c.Pod = "" }},
		{"long_pod", func(c *bridge.Config) { c.Pod = strings.Repeat("p", 513) }},
		{"bad_utf8_model", func(c *bridge.Config) { c.Model = "\xff" }},
		{"no_brokers", func(c *bridge.Config) { c.Brokers = nil }},
		{"no_topic", func(c *bridge.Config) { c.Topic = "" }},
		{"huge_record_limit", func(c *bridge.Config) { c.MaxRecordBytes, c.MaxBufferedBytes, c.MaxMessageBytes = 1<<30, 1<<31, 1<<31 }},
		{"zero_buffered_records", func(c *bridge.Config) { c.MaxBufferedRecords = 0 }},
		{"buffered_bytes_below_record", func(c *bridge.Config) { c.MaxBufferedBytes = c.MaxRecordBytes - 1 }},
		{"message_below_record", func(c *bridge.Config) { c.MaxMessageBytes = c.MaxRecordBytes - 1 }},
		{"zero_queue", func(c *bridge.Config) { c.QueueSize = 0 }},
		{"zero_heartbeat", func(c *bridge.Config) { c.HeartbeatInterval = 0 }},
		{"negative_grace", func(c *bridge.Config) { c.GracePeriod = -time.Second }},
		{"zero_probe_interval", func(c *bridge.Config) { c.ProbeInterval = 0 }},
		{"zero_probe_failures", func(c *bridge.Config) { c.ProbeFailures = 0 }},
		{"zero_flush_timeout", func(c *bridge.Config) { c.FlushTimeout = 0 }},
		{"zero_replay_attempts", func(c *bridge.Config) { c.ReplayAttempts = 0 }},
		{"max_backoff_below_backoff", func(c *bridge.Config) { c.MaxReconnectBackoff = c.ReconnectBackoff / 2 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := validConfig()
			tc.mod(&c)
			if err := c.Validate(); !errors.Is(err, bridge.ErrInvalidConfig) {
				t.Errorf("Validate = %v, want ErrInvalidConfig", err)
			}
			if _, err := bridge.New(c); !errors.Is(err, bridge.ErrInvalidConfig) {
				t.Errorf("New = %v, want ErrInvalidConfig", err)
			}
		})
	}
	t.Run("zero_grace_period_is_valid", func(t *testing.T) {
		c := validConfig()
		c.GracePeriod = 0
		if err := c.Validate(); err != nil {
			t.Error(err)
		}
	})
	t.Run("no_replay_is_valid", func(t *testing.T) {
		c := validConfig()
		c.ReplayEndpoint = ""
		if err := c.Validate(); err != nil {
			t.Error(err)
		}
	})
}

func TestRunTwice(t *testing.T) {
	c := validConfig()
	c.GracePeriod = 0
	b, err := bridge.New(c)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	// A Run whose context is already done stops at once, without error.
	if err := b.Run(ctx); err != nil {
		t.Fatalf("first Run with a done context = %v, want nil", err)
	}
	if err := b.Run(ctx); !errors.Is(err, bridge.ErrAlreadyRun) {
		t.Errorf("second Run = %v, want ErrAlreadyRun", err)
	}
}

func TestOffsetEndpointPort(t *testing.T) {
	for _, tc := range []struct {
		name     string
		endpoint string
		rank     uint32
		want     string
		wantErr  bool
	}{
		{"rank_zero_unchanged", "tcp://engine:5557", 0, "tcp://engine:5557", false},
		{"rank_offsets_port", "tcp://engine:5557", 3, "tcp://engine:5560", false},
		{"ipv6_host", "tcp://[::1]:5558", 1, "tcp://[::1]:5559", false},
		{"empty_stays_empty", "", 2, "", false},
		{"past_last_port", "tcp://engine:65535", 1, "", true},
		{"bind_address", "tcp://*:5557", 1, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := bridge.OffsetEndpointPort(tc.endpoint, tc.rank)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("OffsetEndpointPort(%q, %d) = %q, %v; want %q, error %v", tc.endpoint, tc.rank, got, err, tc.want, tc.wantErr)
			}
		})
	}
}

// TestConfigValidateBounds: MaxMessageBytes is capped at 1 GiB and every
// broker must be named. Before, MaxMessageBytes had no upper bound, so
// with 2^63-1 the frame limiter let a header claiming 2^61 bytes through
// to zmq4's make() and the process panicked; and a broker list of empty
// entries ("--brokers ','") passed.
func TestConfigValidateBounds(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*bridge.Config)
		ok   bool
	}{
		{"max_message_bytes_at_cap", func(c *bridge.Config) { c.MaxMessageBytes = 1 << 30 }, true},
		{"max_message_bytes_over_cap", func(c *bridge.Config) { c.MaxMessageBytes = 1<<30 + 1 }, false},
		{"max_message_bytes_max_int", func(c *bridge.Config) { c.MaxMessageBytes = 1<<63 - 1 }, false},
		{"empty_broker_entries", func(c *bridge.Config) { c.Brokers = []string{"", ""} }, false},
		{"one_empty_broker_entry", func(c *bridge.Config) { c.Brokers = []string{"127.0.0.1:9092", " "} }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := validConfig()
			tc.mod(&c)
			err := c.Validate()
			if tc.ok && err != nil {
				t.Errorf("Validate = %v, want nil", err)
			}
			if !tc.ok && !errors.Is(err, bridge.ErrInvalidConfig) {
				t.Errorf("Validate = %v, want ErrInvalidConfig", err)
			}
		})
	}
}
