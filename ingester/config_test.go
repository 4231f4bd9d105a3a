package ingester

import (
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvindex/kvindex/internal/events"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/tier"
)

func TestConfigValidate(t *testing.T) {
	valid := func() Config {
		c := DefaultConfig()
		c.Etcd = &clientv3.Client{}
		c.Brokers = []string{"127.0.0.1:9092"}
		return c
	}
	tests := []struct {
		name   string
		change func(*Config)
		ok     bool
	}{
		{"defaults", func(*Config) {}, true},
		{"short_timeouts_within_the_two_thirds_rule", func(c *Config) {
			c.LeaseTTL, c.SessionTimeout, c.RebalanceTimeout = 3*time.Second, 500*time.Millisecond, time.Second
		}, true},
		{"no_etcd", func(c *Config) { c.Etcd = nil }, false},
		{"no_brokers", func(c *Config) { c.Brokers = nil }, false},
		{"no_topic", func(c *Config) { c.Topic = "" }, false},
		{"no_group", func(c *Config) { c.Group = "" }, false},
		{"max_txn_ops_too_small", func(c *Config) { c.MaxTxnOps = 4 }, false},
		{"max_txn_bytes_over_etcd_limit", func(c *Config) { c.MaxTxnBytes = 2 << 20 }, false},
		{"lease_ttl_not_whole_seconds", func(c *Config) { c.LeaseTTL = 90500 * time.Millisecond }, false},
		{"lease_ttl_shorter_than_a_takeover", func(c *Config) { c.LeaseTTL = 60 * time.Second }, false},
		{"lease_ttl_without_margin", func(c *Config) {
			c.LeaseTTL, c.SessionTimeout, c.RebalanceTimeout = 3*time.Second, time.Second, time.Second
		}, false},
		{"no_liveness_window", func(c *Config) { c.LivenessWindow = 0 }, false},
		{"liveness_window_under_a_clock_tick", func(c *Config) { c.LivenessWindow = time.Nanosecond }, false},
		{"liveness_window_just_short", func(c *Config) { c.LivenessWindow = MinLivenessWindow - time.Millisecond }, false},
		{"liveness_window_shortest", func(c *Config) { c.LivenessWindow = MinLivenessWindow }, true},
		{"no_keys_per_lease", func(c *Config) { c.KeysPerLease = 0 }, false},
		{"no_chunk_size", func(c *Config) { c.ChunkSize = 0 }, false},
		{"chunk_size_one", func(c *Config) { c.ChunkSize, c.ChunkMergeBelow = 1, 0 }, true},
		{"chunk_size_largest", func(c *Config) { c.ChunkSize = keyspace.MaxChunkEntries }, true},
		{"chunk_size_over_readers_limit", func(c *Config) { c.ChunkSize = keyspace.MaxChunkEntries + 1 }, false},
		{"merge_below_default", func(c *Config) { c.ChunkMergeBelow = 0 }, true},
		{"open_at_default", func(c *Config) { c.ChunkOpenAt = 0 }, true},
		{"open_at_chunk_size", func(c *Config) { c.ChunkSize, c.ChunkOpenAt = 4, 4 }, true},
		{"open_at_over_chunk_size", func(c *Config) { c.ChunkSize, c.ChunkOpenAt = 4, 5 }, false},
		{"open_at_negative", func(c *Config) { c.ChunkOpenAt = -1 }, false},
		{"open_at_below_merge_below", func(c *Config) { c.ChunkOpenAt, c.ChunkMergeBelow = 8, 16 }, false},
		{"open_at_below_default_merge_below", func(c *Config) { c.ChunkOpenAt = DefaultChunkMergeBelow(DefaultChunkSize) - 1 }, false},
		{"open_at_default_with_merge_below_chunk_size", func(c *Config) { c.ChunkSize, c.ChunkMergeBelow, c.ChunkOpenAt = 4, 4, 0 }, true},
		{"merge_below_chunk_size", func(c *Config) { c.ChunkSize, c.ChunkMergeBelow = 4, 4 }, true},
		{"merge_below_over_chunk_size", func(c *Config) { c.ChunkSize, c.ChunkMergeBelow = 4, 5 }, false},
		{"merge_below_negative", func(c *Config) { c.ChunkMergeBelow = -1 }, false},
		{"no_window_records", func(c *Config) { c.WindowRecords = 0 }, false},
		{"no_window_ops", func(c *Config) { c.WindowOps = 0 }, false},
		{"queue_bytes_too_small", func(c *Config) { c.QueueBytes = 64<<10 - 1 }, false},
		{"negative_window_linger", func(c *Config) { c.WindowLinger = -time.Millisecond }, false},
		{"window_linger_too_long", func(c *Config) { c.WindowLinger = time.Second + 1 }, false},
		{"window_linger_longest", func(c *Config) { c.WindowLinger = time.Second }, true},
		{"fetch_max_wait_default", func(c *Config) { c.FetchMaxWait = 0 }, true},
		{"fetch_max_wait_too_short", func(c *Config) { c.FetchMaxWait = 9 * time.Millisecond }, false},
		{"fetch_max_wait_too_long", func(c *Config) { c.FetchMaxWait = 5*time.Second + 1 }, false},
		{"queue_bytes_smallest", func(c *Config) { c.QueueBytes = 64 << 10 }, true},
		{"no_session_timeout", func(c *Config) { c.SessionTimeout = 0 }, false},
		{"bad_id", func(c *Config) { c.ID = "\xff" }, false},
		{"engine_hash_mode", func(c *Config) { c.HashMode = keyspace.HashModeEngine }, true},
		{"zero_hash_mode_is_token", func(c *Config) { c.HashMode = "" }, true},
		{"unknown_hash_mode", func(c *Config) { c.HashMode = "sha256" }, false},
		{"no_map_entries", func(c *Config) { c.MaxMapEntries = 0 }, false},
		{"one_map_entry", func(c *Config) { c.MaxMapEntries = 1 }, true},
		{"rebuild_page_too_small", func(c *Config) { c.MapRebuildPageBytes = 4<<10 - 1 }, false},
		{"rebuild_page_smallest", func(c *Config) { c.MapRebuildPageBytes = 4 << 10 }, true},
		{"mediums_extended", func(c *Config) { c.Mediums = events.DefaultMediums(); c.Mediums["hbm"] = tier.GPU }, true},
		{"mediums_two_spellings_two_tiers", func(c *Config) { c.Mediums = events.MediumMap{"Disk": tier.Disk, "DISK": tier.CPU} }, false},
		{"medium_on_no_tier", func(c *Config) { c.Mediums = events.MediumMap{"HBM": tier.Unknown} }, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := valid()
			tc.change(&c)
			err := c.Validate()
			if tc.ok && err != nil {
				t.Fatalf("Validate() = %v, want nil", err)
			}
			if !tc.ok && !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("Validate() = %v, want ErrInvalidConfig", err)
			}
			if _, nerr := New(c); (nerr == nil) != tc.ok {
				t.Fatalf("New() error = %v, want ok=%v", nerr, tc.ok)
			}
		})
	}
}

func TestDefaultHashModeIsToken(t *testing.T) {
	if got := DefaultConfig().HashMode; got != keyspace.HashModeToken {
		t.Errorf("DefaultConfig().HashMode = %q, want token", got)
	}
	if got := (Config{}).withDefaults().HashMode; got != keyspace.HashModeToken {
		t.Errorf("the zero HashMode means %q, want token", got)
	}
}

// TestChunkOpenAtDefault: a zero ChunkOpenAt resolves to the chunk size
// when windows linger and to 3/4 of it when they do not, never below the
// merge threshold.
func TestChunkOpenAtDefault(t *testing.T) {
	for _, tc := range []struct {
		size, mergeBelow int
		linger           time.Duration
		want             int
	}{
		{64, 0, 0, 48}, {64, 1, 0, 48}, {64, 56, 0, 56}, {24, 0, 0, 18}, {4, 4, 0, 4}, {2, 0, 0, 1}, {1, 0, 0, 1},
		{24, 0, DefaultWindowLinger, 24}, {64, 0, time.Millisecond, 64}, {1, 0, time.Second, 1},
	} {
		c := DefaultConfig()
		c.ChunkSize, c.ChunkMergeBelow, c.WindowLinger = tc.size, tc.mergeBelow, tc.linger
		if got := c.withDefaults().ChunkOpenAt; got != tc.want {
			t.Errorf("chunk size %d, merge below %d, linger %v: ChunkOpenAt %d, want %d", tc.size, tc.mergeBelow, tc.linger, got, tc.want)
		}
	}
}
