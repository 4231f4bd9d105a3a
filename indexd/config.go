package indexd

import (
	"fmt"
	"log/slog"
	"math"
	"net"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvindex/kvindex/internal/keyspace"
)

// Defaults of Config (DefaultConfig). The request limits are the API's
// documented ones (kvindex.v1 LookupRequest).
const (
	DefaultListenAddr        = "127.0.0.1:50051"
	DefaultMaxHashes         = 8192
	DefaultMaxCandidates     = 4096
	DefaultMaxBarrierRecords = 1024
	DefaultMaxRequestBytes   = 4 << 20
	DefaultBarrierTimeout    = 5 * time.Second
	DefaultMaxBarrierTimeout = time.Minute
	DefaultListConcurrency   = 4
	DefaultBackoffMin        = 100 * time.Millisecond
	DefaultBackoffMax        = 10 * time.Second
	DefaultShutdownGrace     = 10 * time.Second
	// DefaultMaxBarrierWaiters bounds the Lookups parked on a barrier at
	// once. A parked Lookup holds its decoded request (up to 8192 hashes,
	// 64 KiB) and its stream's buffers; 256 of them stay within tens of
	// MiB (docs/limits.md).
	DefaultMaxBarrierWaiters = 256
	// DefaultMaxConcurrentStreams bounds the calls one client connection
	// may have in flight (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS); a
	// client past it waits for a stream to free up.
	DefaultMaxConcurrentStreams = 1024
	// DefaultListPageSize is the ListEndpoints page size when a request
	// gives none.
	DefaultListPageSize = 500
	// DefaultMaxListPageSize is the largest ListEndpoints page; a request
	// asking for more gets this many (AIP-158).
	DefaultMaxListPageSize = 2000
	// ListPageSizeLimit is the largest MaxListPageSize Validate accepts:
	// that many endpoints with the longest names keyspace allows (a
	// 512-byte model and pod) and the largest counts encode to under
	// 4 MiB, gRPC's default receive limit, so every page reaches a client
	// that kept the default (maxEndpointInfoBytes, checked by a test).
	ListPageSizeLimit = 3500
	// DefaultProgressInterval is how often the watch asks etcd for a
	// progress notification (etcd's own come every 10 minutes).
	DefaultProgressInterval = time.Second
	// DefaultStaleLogAfter is the age of the last progress past which the
	// replica logs that it is stale: a few missed progress intervals.
	DefaultStaleLogAfter = 5 * time.Second
	// DefaultMaxInFlightBlocks bounds the blocks of the Lookups being
	// answered at once, server-wide: 64 Lookups of DefaultMaxHashes.
	DefaultMaxInFlightBlocks = 64 * DefaultMaxHashes
)

// Config configures a Server. Build one with DefaultConfig and set Etcd.
// Numeric fields whose doc says "zero means the default" may be left zero.
type Config struct {
	// Etcd is the client indexd lists and watches etcd through. Required.
	// The caller owns it and closes it after Run returns.
	Etcd *clientv3.Client
	// Keyspace locates kvindex's keys in etcd. Default keyspace.Default()
	// (prefix "/kvindex/v1/"); the zero value means the default.
	Keyspace keyspace.Keyspace

	// Listener, when set, is where the gRPC API is served (tests, and
	// `kvindex standalone`, pass their own); New takes ownership and Run
	// closes it. Default nil: New listens on ListenAddr.
	Listener net.Listener
	// ListenAddr is the gRPC host:port when Listener is nil; port 0 picks a
	// free port (Server.Addr says which). Default DefaultListenAddr; empty
	// means the default.
	ListenAddr string

	// MaxHashes bounds LookupRequest.block_hashes; more is
	// INVALID_ARGUMENT. Default 8192; zero means the default.
	MaxHashes int
	// MaxCandidates bounds LookupRequest.candidates. Default 4096; zero
	// means the default.
	MaxCandidates int
	// MaxBarrierRecords bounds Barrier.records. Default 1024; zero means
	// the default.
	MaxBarrierRecords int
	// MaxRequestBytes bounds an encoded request; a larger one is
	// INVALID_ARGUMENT naming the limit. gRPC refuses requests over twice
	// the limit before reading them (RESOURCE_EXHAUSTED). Default 4 MiB;
	// zero means the default.
	MaxRequestBytes int
	// BarrierTimeout bounds a barrier wait whose request gives no timeout;
	// the call's own deadline still applies. Default 5 s; zero means the
	// default.
	BarrierTimeout time.Duration
	// MaxBarrierTimeout is the largest timeout a request may ask for; more
	// is INVALID_ARGUMENT. Default 1 min; zero means the default. Must be
	// at least BarrierTimeout.
	MaxBarrierTimeout time.Duration
	// MaxBarrierWaiters bounds the Lookups waiting on a barrier at once,
	// across all connections; a Lookup whose barrier is not yet met when
	// the limit is reached fails at once with RESOURCE_EXHAUSTED naming
	// the limit (a barrier already met never waits and is not counted).
	// Default 256; zero means the default.
	MaxBarrierWaiters int
	// MaxConcurrentStreams bounds the calls in flight on one client
	// connection (gRPC's MaxConcurrentStreams); further calls on that
	// connection wait in the client for a free stream. Default 1024; zero
	// means the default.
	MaxConcurrentStreams int

	// ListPageSize is the number of endpoints a ListEndpoints page holds
	// when the request's page_size is 0. Default 500; zero means the
	// default. Must not exceed MaxListPageSize.
	ListPageSize int
	// MaxListPageSize is the largest ListEndpoints page; a larger
	// page_size is lowered to it (AIP-158). Default 2000; zero means the
	// default; at most ListPageSizeLimit.
	MaxListPageSize int

	// ListConcurrency is how many endpoint block ranges a list reads from
	// etcd at once. Default 4; zero means the default.
	ListConcurrency int
	// BackoffMin and BackoffMax bound the jittered exponential backoff
	// between failed lists and broken watches. Defaults 100 ms and 10 s;
	// zero means the default; BackoffMin must not exceed BackoffMax.
	BackoffMin, BackoffMax time.Duration
	// ShutdownGrace is how long Run lets in-flight calls finish
	// (GracefulStop) before it stops the server hard. Default 10 s; zero
	// means the default.
	ShutdownGrace time.Duration

	// ProgressInterval is how often the watch calls etcd's
	// Watcher.RequestProgress, so an idle but healthy watch still proves
	// itself current; the time of the last progress (a progress
	// notification or a watch event, or a completed list) is what every
	// Lookup answer's progress_time reports. Default 1 s; zero means the
	// default.
	ProgressInterval time.Duration
	// StaleLogAfter is the age of the last progress past which the replica
	// logs a warning (once, and once more when progress resumes); the age
	// is always exported as kvindex_indexd_progress_age_seconds. Default
	// 5 s; zero means the default.
	StaleLogAfter time.Duration
	// MaxStaleness, when positive, makes Ready (/readyz) fail once the last
	// progress is older than it; gRPC health stays SERVING and Lookups
	// still answer from the last state, with their progress_time. Default
	// 0: off. During an etcd outage every replica goes stale at once, and
	// a Service with no ready replica answers nobody; turn it on only when
	// a stale answer is worse than none.
	MaxStaleness time.Duration
	// MaxInFlightBlocks bounds the work of the Lookups being answered at
	// once, across all connections, counted in blocks: a hash Lookup costs
	// len(block_hashes) (at least 1). A Lookup that would take the total
	// past it fails at once with RESOURCE_EXHAUSTED naming the limit.
	// Default 64 × MaxHashes (524,288); zero means the default; must be at
	// least MaxHashes, so one largest request always fits.
	MaxInFlightBlocks int
	// Clock is the clock of progress ages and staleness. Default nil: the
	// real clock.
	Clock clockwork.Clock

	// Registry, when set, receives indexd's Prometheus metrics
	// (kvindex_indexd_*). Default nil: metrics are kept but not exported.
	Registry *prometheus.Registry
	// Logger receives indexd's logs. Default nil: discard.
	Logger *slog.Logger
}

// DefaultConfig returns a Config with every default filled in and no etcd
// client.
func DefaultConfig() Config {
	return Config{
		Keyspace:          keyspace.Default(),
		ListenAddr:        DefaultListenAddr,
		MaxHashes:         DefaultMaxHashes,
		MaxCandidates:     DefaultMaxCandidates,
		MaxBarrierRecords: DefaultMaxBarrierRecords,
		MaxRequestBytes:   DefaultMaxRequestBytes,
		BarrierTimeout:    DefaultBarrierTimeout,
		MaxBarrierTimeout: DefaultMaxBarrierTimeout,
		MaxBarrierWaiters: DefaultMaxBarrierWaiters,
		ListConcurrency:   DefaultListConcurrency,
		BackoffMin:        DefaultBackoffMin,
		BackoffMax:        DefaultBackoffMax,
		ShutdownGrace:     DefaultShutdownGrace,
		ProgressInterval:  DefaultProgressInterval,
		StaleLogAfter:     DefaultStaleLogAfter,
		MaxInFlightBlocks: DefaultMaxInFlightBlocks,

		MaxConcurrentStreams: DefaultMaxConcurrentStreams,
		ListPageSize:         DefaultListPageSize,
		MaxListPageSize:      DefaultMaxListPageSize,
	}
}

// withDefaults returns c with zero fields replaced by their defaults.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Keyspace.Prefix() == "" {
		c.Keyspace = d.Keyspace
	}
	if c.ListenAddr == "" {
		c.ListenAddr = d.ListenAddr
	}
	setDefault(&c.MaxHashes, d.MaxHashes)
	setDefault(&c.MaxCandidates, d.MaxCandidates)
	setDefault(&c.MaxBarrierRecords, d.MaxBarrierRecords)
	setDefault(&c.MaxRequestBytes, d.MaxRequestBytes)
	setDefault(&c.BarrierTimeout, d.BarrierTimeout)
	setDefault(&c.MaxBarrierTimeout, d.MaxBarrierTimeout)
	setDefault(&c.MaxBarrierWaiters, d.MaxBarrierWaiters)
	setDefault(&c.MaxConcurrentStreams, d.MaxConcurrentStreams)
	setDefault(&c.ListPageSize, d.ListPageSize)
	setDefault(&c.MaxListPageSize, d.MaxListPageSize)
	setDefault(&c.ListConcurrency, d.ListConcurrency)
	setDefault(&c.BackoffMin, d.BackoffMin)
	setDefault(&c.BackoffMax, d.BackoffMax)
	setDefault(&c.ShutdownGrace, d.ShutdownGrace)
	setDefault(&c.ProgressInterval, d.ProgressInterval)
	setDefault(&c.StaleLogAfter, d.StaleLogAfter)
	if c.MaxInFlightBlocks == 0 {
		c.MaxInFlightBlocks = 64 * c.MaxHashes
	}
	if c.Clock == nil {
		c.Clock = clockwork.NewRealClock()
	}
	return c
}

func setDefault[T int | time.Duration](v *T, d T) {
	if *v == 0 {
		*v = d
	}
}

// Validate reports the first invalid field, wrapped in ErrInvalidConfig:
// a missing Etcd client, a negative limit or duration, bounds out of
// order, or a MaxListPageSize over ListPageSizeLimit. Zero fields are valid (they take the defaults).
func (c Config) Validate() error {
	if c.Etcd == nil {
		return fmt.Errorf("%w: Etcd client is required", ErrInvalidConfig)
	}
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"MaxHashes", int64(c.MaxHashes)},
		{"MaxCandidates", int64(c.MaxCandidates)},
		{"MaxBarrierRecords", int64(c.MaxBarrierRecords)},
		{"MaxRequestBytes", int64(c.MaxRequestBytes)},
		{"BarrierTimeout", int64(c.BarrierTimeout)},
		{"MaxBarrierTimeout", int64(c.MaxBarrierTimeout)},
		{"MaxBarrierWaiters", int64(c.MaxBarrierWaiters)},
		{"MaxConcurrentStreams", int64(c.MaxConcurrentStreams)},
		{"ListPageSize", int64(c.ListPageSize)},
		{"MaxListPageSize", int64(c.MaxListPageSize)},
		{"ListConcurrency", int64(c.ListConcurrency)},
		{"BackoffMin", int64(c.BackoffMin)},
		{"BackoffMax", int64(c.BackoffMax)},
		{"ShutdownGrace", int64(c.ShutdownGrace)},
		{"ProgressInterval", int64(c.ProgressInterval)},
		{"StaleLogAfter", int64(c.StaleLogAfter)},
		{"MaxStaleness", int64(c.MaxStaleness)},
		{"MaxInFlightBlocks", int64(c.MaxInFlightBlocks)},
	} {
		if f.v < 0 {
			return fmt.Errorf("%w: %s is negative (%d)", ErrInvalidConfig, f.name, f.v)
		}
	}
	d := c.withDefaults()
	if d.BackoffMin > d.BackoffMax {
		return fmt.Errorf("%w: BackoffMin %s exceeds BackoffMax %s", ErrInvalidConfig, d.BackoffMin, d.BackoffMax)
	}
	if d.BarrierTimeout > d.MaxBarrierTimeout {
		return fmt.Errorf("%w: BarrierTimeout %s exceeds MaxBarrierTimeout %s", ErrInvalidConfig, d.BarrierTimeout, d.MaxBarrierTimeout)
	}
	if d.MaxConcurrentStreams > math.MaxUint32 {
		return fmt.Errorf("%w: MaxConcurrentStreams %d exceeds %d", ErrInvalidConfig, d.MaxConcurrentStreams, uint32(math.MaxUint32))
	}
	if d.MaxListPageSize > ListPageSizeLimit {
		return fmt.Errorf("%w: MaxListPageSize %d exceeds %d (a page of the longest endpoints must fit gRPC's default 4 MiB receive limit)",
			ErrInvalidConfig, d.MaxListPageSize, ListPageSizeLimit)
	}
	if d.MaxInFlightBlocks < d.MaxHashes {
		return fmt.Errorf("%w: MaxInFlightBlocks %d is below MaxHashes %d (one largest Lookup must fit)",
			ErrInvalidConfig, d.MaxInFlightBlocks, d.MaxHashes)
	}
	if d.ListPageSize > d.MaxListPageSize {
		return fmt.Errorf("%w: ListPageSize %d exceeds MaxListPageSize %d", ErrInvalidConfig, d.ListPageSize, d.MaxListPageSize)
	}
	return nil
}
