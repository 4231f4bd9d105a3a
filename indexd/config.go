package indexd

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"math"
	"net"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvindex/kvindex/internal/contract"
	"github.com/kvindex/kvindex/internal/keyspace"
)

// Defaults of Config (DefaultConfig). The request limits are the API's
// documented ones (kvindex.v1 LookupRequest).
const (
	DefaultListenAddr = contract.DefaultGRPCAddr
	DefaultMaxHashes  = 8192
	// DefaultMaxTokens bounds a token Lookup's token ids: 8192 blocks of
	// 16 tokens, the hashes a hash Lookup may carry (docs/limits.md).
	DefaultMaxTokens = 131072
	// DefaultMaxMultiModalItems bounds a token Lookup's multimodal items.
	DefaultMaxMultiModalItems = 256
	// DefaultMaxExtraBytes bounds each extra of a token Lookup: the LoRA
	// name, the cache salt and each multimodal item's hash.
	DefaultMaxExtraBytes     = 1024
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
	// that kept the default (TestListPageSizeLimitFits checks it).
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
	// DefaultMaxStaleness is the progress age past which /readyz fails
	// and the kvindex.v1.IndexService health status turns NOT_SERVING:
	// the ingesters' default liveness window (30 s), past which an
	// answer may name endpoints that are gone (docs/DESIGN.md,
	// "Staleness").
	DefaultMaxStaleness = 30 * time.Second
)

// Defaults of the connection limits (docs/limits.md, "Connections").
const (
	// DefaultMaxConnections bounds the API port's open connections: a
	// router holds one or a few, so a fleet of hundreds of routers fits,
	// and well below the 1024 file descriptors of the smallest usual
	// limit. Past it, new connections wait in the kernel's accept queue.
	DefaultMaxConnections = 512
	// DefaultHealthMaxConnections bounds the health port's: kubelet opens
	// one per probe and closes it.
	DefaultHealthMaxConnections = 32
	// DefaultHandshakeTimeout bounds a new connection's TLS handshake and
	// HTTP/2 preface (gRPC's ConnectionTimeout, 120 s by default).
	DefaultHandshakeTimeout = 10 * time.Second
	// DefaultMaxConnectionIdle closes a connection that carried no call
	// for this long (GOAWAY; a client reconnects on its next call).
	DefaultMaxConnectionIdle = time.Minute
	// DefaultMaxConnectionAge closes every connection after this long, so
	// clients spread again over replicas that came up since (GOAWAY, then
	// MaxConnectionAgeGrace for the calls in flight).
	DefaultMaxConnectionAge = 30 * time.Minute
	// DefaultMaxConnectionAgeGrace is how long calls in flight (health
	// Watch streams included) may run on a connection closed for its age.
	DefaultMaxConnectionAgeGrace = time.Minute
	// DefaultKeepaliveMinTime is the shortest interval between a client's
	// keepalive pings that the server tolerates; a client pinging more
	// often is sent GOAWAY (too_many_pings). Pings without calls are
	// allowed.
	DefaultKeepaliveMinTime = 10 * time.Second
	// DefaultKeepaliveTime is how long a connection may be silent before
	// the server pings it; DefaultKeepaliveTimeout how long it waits for
	// the ack before closing it (a peer that vanished without a FIN).
	DefaultKeepaliveTime    = 30 * time.Second
	DefaultKeepaliveTimeout = 10 * time.Second
	// DefaultRequestReadTimeout is how long a call may take, from its
	// headers, to deliver its request message (RequestReadTimeout).
	DefaultRequestReadTimeout = 10 * time.Second
	// DefaultMaxMetadataBytes bounds a call's header list
	// (MaxMetadataBytes): routers send a few hundred bytes (a bearer
	// token of some kilobytes at most); grpc-go's own default is 16 MiB.
	DefaultMaxMetadataBytes = 64 << 10
)

// Config configures a Server. Build one with DefaultConfig and set Etcd
// (docs/STYLE.md "Config": numbers and durations have no implicit default,
// so a zero one is invalid; a nil or zero reference field means the
// default its doc names).
type Config struct {
	// Etcd is the client indexd lists and watches etcd through. Required.
	// The caller owns it and closes it after Run returns.
	Etcd *clientv3.Client
	// Keyspace locates kvindex's keys in etcd. Default keyspace.Default()
	// (prefix "/kvindex/v2/"); the zero value means the default.
	Keyspace keyspace.Keyspace

	// Listener, when set, is where the gRPC API is served (tests, and
	// `kvindex standalone`, pass their own); New takes ownership and Run
	// closes it. Default nil: New listens on ListenAddr.
	Listener net.Listener
	// ListenAddr is the gRPC host:port when Listener is nil; port 0 picks a
	// free port (Server.Addr says which). Default DefaultListenAddr;
	// required when Listener is nil.
	ListenAddr string

	// TLS, when set, is the gRPC API's server TLS config (for example
	// from internal/tlsfiles, which reloads rotated files; a config whose
	// ClientAuth requires a verified certificate makes it mutual TLS).
	// Default nil: plaintext. It never applies to the health port.
	TLS *tls.Config
	// Reflection serves gRPC server reflection on the API port, so
	// grpcurl needs no .proto. Default false: off, since it describes the
	// API to any client that can connect (docs/security.md); `kvindex
	// standalone`, the developer's stack, turns it on.
	Reflection bool
	// HealthListener, when set, is a second port serving only the gRPC
	// health service (grpc.health.v1), always in plaintext: kubelet's
	// gRPC probe speaks no TLS. New takes ownership and Run closes it.
	// Default nil: New listens on HealthListenAddr if that is set.
	HealthListener net.Listener
	// HealthListenAddr is the health port's host:port when HealthListener
	// is nil; port 0 picks a free port (Server.HealthAddr says which).
	// Default empty: no health port (health stays on the API port too).
	HealthListenAddr string

	// MaxHashes bounds LookupRequest.block_hashes; more is
	// INVALID_ARGUMENT. Default 8192; at least 1.
	MaxHashes int
	// MaxTokens bounds TokenPrompt.token_ids of a token Lookup; more is
	// INVALID_ARGUMENT. Keying costs about 0.1 µs per block at each of
	// the (at most 4) block sizes (BENCHMARKS.md). Default 131072; at least 1.
	MaxTokens int
	// MaxMultiModalItems bounds TokenPrompt.multimodal_items; more is
	// INVALID_ARGUMENT. Default 256; at least 1.
	MaxMultiModalItems int
	// MaxExtraBytes bounds each extra of a token Lookup in bytes: the LoRA
	// name, the cache salt and each multimodal item's hash; longer is
	// INVALID_ARGUMENT. Default 1024; at least 1.
	MaxExtraBytes int
	// MaxCandidates bounds LookupRequest.candidates. Default 4096; at least
	// 1.
	MaxCandidates int
	// MaxBarrierRecords bounds Barrier.records. Default 1024; at least 1.
	MaxBarrierRecords int
	// MaxRequestBytes bounds an encoded request; a larger one is
	// INVALID_ARGUMENT naming the limit. gRPC refuses requests over twice
	// the limit before reading them (RESOURCE_EXHAUSTED). Default 4 MiB;
	// at least 1.
	MaxRequestBytes int
	// BarrierTimeout bounds a barrier wait whose request gives no timeout;
	// the call's own deadline still applies. Default 5 s; must be
	// positive.
	BarrierTimeout time.Duration
	// MaxBarrierTimeout is the largest timeout a request may ask for; more
	// is INVALID_ARGUMENT. Default 1 min; must be at least
	// BarrierTimeout.
	MaxBarrierTimeout time.Duration
	// MaxBarrierWaiters bounds the Lookups waiting on a barrier at once,
	// across all connections; a Lookup whose barrier is not yet met when
	// the limit is reached fails at once with RESOURCE_EXHAUSTED naming
	// the limit (a barrier already met never waits and is not counted).
	// Default 256; at least 1.
	MaxBarrierWaiters int
	// MaxConcurrentStreams bounds the calls in flight on one client
	// connection (gRPC's MaxConcurrentStreams); further calls on that
	// connection wait in the client for a free stream. Default 1024; at
	// least 1.
	MaxConcurrentStreams int

	// ListPageSize is the number of endpoints a ListEndpoints page holds
	// when the request's page_size is 0. Default 500; at least 1 and
	// at most MaxListPageSize.
	ListPageSize int
	// MaxListPageSize is the largest ListEndpoints page; a larger
	// page_size is lowered to it (AIP-158). Default 2000; at least 1
	// and at most ListPageSizeLimit.
	MaxListPageSize int

	// ListConcurrency is how many endpoint block ranges a list reads from
	// etcd at once. Default 4; at least 1.
	ListConcurrency int
	// BackoffMin and BackoffMax bound the jittered exponential backoff
	// between failed lists and broken watches. Defaults 100 ms and 10 s;
	// both positive, BackoffMin at most BackoffMax.
	BackoffMin, BackoffMax time.Duration
	// ShutdownGrace is how long Run lets in-flight calls finish
	// (GracefulStop) before it stops the server hard. Default 10 s; must be
	// positive.
	ShutdownGrace time.Duration

	// ProgressInterval is how often the watch calls etcd's
	// Watcher.RequestProgress, so an idle but healthy watch still proves
	// itself current; the time of the last progress (a progress
	// notification or a watch event, or a completed list) is what every
	// Lookup answer's progress_time reports. Default 1 s; must be
	// positive.
	ProgressInterval time.Duration
	// StaleLogAfter is the age of the last progress past which the replica
	// logs a warning (once, and once more when progress resumes); the age
	// is always exported as kvindex_indexd_progress_age_seconds. Default
	// 5 s; must be positive.
	StaleLogAfter time.Duration
	// MaxStaleness, when positive, makes Ready (/readyz) fail and the
	// kvindex.v1.IndexService health status NOT_SERVING once the last
	// progress is older than it; the overall ("") health status stays
	// SERVING (liveness), and Lookups still answer from the last state,
	// with their progress_time. Default DefaultMaxStaleness (30 s); 0
	// turns it off (docs/DESIGN.md, "Staleness", says why it is on).
	MaxStaleness time.Duration

	// MaxConnections bounds the open connections of the API port; past
	// it, Accept waits for one to close (new clients wait in the kernel's
	// accept queue), so connections cannot take every file descriptor.
	// Default DefaultMaxConnections (512); at least 1.
	MaxConnections int
	// HealthMaxConnections bounds the health port's open connections the
	// same way. Default DefaultHealthMaxConnections (32); at least 1.
	HealthMaxConnections int
	// HandshakeTimeout bounds a new connection's TLS handshake and HTTP/2
	// preface on both ports (grpc.ConnectionTimeout): a connection that
	// sends nothing is closed after it. Default 10 s; must be positive.
	HandshakeTimeout time.Duration
	// MaxConnectionIdle closes a connection with no call in flight for
	// this long (keepalive.ServerParameters). Default 1 min; must be
	// positive.
	MaxConnectionIdle time.Duration
	// MaxConnectionAge closes every connection after this long (with a
	// random ±10 % jitter, grpc-go's), and MaxConnectionAgeGrace is how
	// long its calls in flight may still run. Defaults 30 min and 1 min;
	// both must be positive.
	MaxConnectionAge, MaxConnectionAgeGrace time.Duration
	// KeepaliveMinTime is the shortest ping interval a client may use
	// (keepalive.EnforcementPolicy, pings without calls permitted); a
	// client pinging more often gets GOAWAY. Default 10 s; must be
	// positive.
	KeepaliveMinTime time.Duration
	// KeepaliveTime and KeepaliveTimeout: after KeepaliveTime without
	// activity the server pings the client and closes the connection if
	// no ack comes within KeepaliveTimeout. Defaults 30 s and 10 s; both
	// must be positive.
	KeepaliveTime, KeepaliveTimeout time.Duration
	// RequestReadTimeout bounds, on both ports, how long a call may take
	// from its headers to its whole request message: a call still without
	// it then is cancelled (the client sees CANCELED), counted in
	// kvindex_indexd_request_read_timeouts_total. A call waiting for its
	// request is in flight, so the idle limit never closes its
	// connection, and what arrived of its message is buffered: without
	// this bound a few clients that open calls and send nothing (or all
	// but a byte) hold connection slots and memory until
	// MaxConnectionAge. Streams (a health Watch) are bounded only until
	// their first message. Default DefaultRequestReadTimeout (10 s); must
	// be positive.
	RequestReadTimeout time.Duration
	// MaxMetadataBytes bounds a call's header list on both ports
	// (grpc.MaxHeaderListSize): a call with more is refused before any
	// handler runs. Default DefaultMaxMetadataBytes (64 KiB); at least 1
	// and at most 2^32-1.
	MaxMetadataBytes int
	// MaxInFlightBlocks bounds the work of the Lookups being answered at
	// once, across all connections, counted in blocks: a hash Lookup costs
	// len(block_hashes) (at least 1). A Lookup that would take the total
	// past it fails at once with RESOURCE_EXHAUSTED naming the limit.
	// Default 64 × DefaultMaxHashes (524,288); must be at least
	// MaxHashes, so one largest request always fits.
	MaxInFlightBlocks int
	// Clock is the clock of progress ages and staleness. Default nil: the
	// real clock.
	Clock clockwork.Clock

	// Registry receives indexd's metrics (kvindex_indexd_*). Nil means
	// they are kept but registered nowhere.
	Registry prometheus.Registerer
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
		MaxTokens:         DefaultMaxTokens,
		MaxExtraBytes:     DefaultMaxExtraBytes,
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
		MaxStaleness:      DefaultMaxStaleness,

		MaxConnections:        DefaultMaxConnections,
		HealthMaxConnections:  DefaultHealthMaxConnections,
		HandshakeTimeout:      DefaultHandshakeTimeout,
		RequestReadTimeout:    DefaultRequestReadTimeout,
		MaxMetadataBytes:      DefaultMaxMetadataBytes,
		MaxConnectionIdle:     DefaultMaxConnectionIdle,
		MaxConnectionAge:      DefaultMaxConnectionAge,
		MaxConnectionAgeGrace: DefaultMaxConnectionAgeGrace,
		KeepaliveMinTime:      DefaultKeepaliveMinTime,
		KeepaliveTime:         DefaultKeepaliveTime,
		KeepaliveTimeout:      DefaultKeepaliveTimeout,

		MaxConcurrentStreams: DefaultMaxConcurrentStreams,
		ListPageSize:         DefaultListPageSize,
		MaxListPageSize:      DefaultMaxListPageSize,
		MaxMultiModalItems:   DefaultMaxMultiModalItems,
	}
}

// withDefaults returns c with the zero reference fields that mean a
// default filled.
func (c Config) withDefaults() Config {
	if c.Keyspace == (keyspace.Keyspace{}) {
		c.Keyspace = keyspace.Default()
	}
	if c.Clock == nil {
		c.Clock = clockwork.NewRealClock()
	}
	return c
}

// Validate reports the first invalid field, wrapped in ErrInvalidConfig:
// a missing Etcd client, a missing ListenAddr without a Listener, a limit
// or duration that is not positive, bounds out of order, or a
// MaxListPageSize over ListPageSizeLimit.
func (c Config) Validate() error {
	if c.Etcd == nil {
		return fmt.Errorf("%w: Etcd client is required", ErrInvalidConfig)
	}
	if c.Listener == nil && c.ListenAddr == "" {
		return fmt.Errorf("%w: ListenAddr is required without a Listener", ErrInvalidConfig)
	}
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"MaxHashes", int64(c.MaxHashes)},
		{"MaxTokens", int64(c.MaxTokens)},
		{"MaxMultiModalItems", int64(c.MaxMultiModalItems)},
		{"MaxExtraBytes", int64(c.MaxExtraBytes)},
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
		{"MaxInFlightBlocks", int64(c.MaxInFlightBlocks)},
		{"MaxConnections", int64(c.MaxConnections)},
		{"HealthMaxConnections", int64(c.HealthMaxConnections)},
		{"HandshakeTimeout", int64(c.HandshakeTimeout)},
		{"MaxConnectionIdle", int64(c.MaxConnectionIdle)},
		{"MaxConnectionAge", int64(c.MaxConnectionAge)},
		{"MaxConnectionAgeGrace", int64(c.MaxConnectionAgeGrace)},
		{"KeepaliveMinTime", int64(c.KeepaliveMinTime)},
		{"KeepaliveTime", int64(c.KeepaliveTime)},
		{"KeepaliveTimeout", int64(c.KeepaliveTimeout)},
		{"RequestReadTimeout", int64(c.RequestReadTimeout)},
		{"MaxMetadataBytes", int64(c.MaxMetadataBytes)},
	} {
		if f.v <= 0 {
			return fmt.Errorf("%w: %s is %d: want a positive value", ErrInvalidConfig, f.name, f.v)
		}
	}
	if c.BackoffMin > c.BackoffMax {
		return fmt.Errorf("%w: BackoffMin %s exceeds BackoffMax %s", ErrInvalidConfig, c.BackoffMin, c.BackoffMax)
	}
	if c.BarrierTimeout > c.MaxBarrierTimeout {
		return fmt.Errorf("%w: BarrierTimeout %s exceeds MaxBarrierTimeout %s", ErrInvalidConfig, c.BarrierTimeout, c.MaxBarrierTimeout)
	}
	if c.MaxMetadataBytes > math.MaxUint32 {
		return fmt.Errorf("%w: MaxMetadataBytes %d exceeds %d", ErrInvalidConfig, c.MaxMetadataBytes, uint32(math.MaxUint32))
	}
	if c.MaxConcurrentStreams > math.MaxUint32 {
		return fmt.Errorf("%w: MaxConcurrentStreams %d exceeds %d", ErrInvalidConfig, c.MaxConcurrentStreams, uint32(math.MaxUint32))
	}
	if c.MaxListPageSize > ListPageSizeLimit {
		return fmt.Errorf("%w: MaxListPageSize %d exceeds %d (a page of the longest endpoints must fit gRPC's default 4 MiB receive limit)",
			ErrInvalidConfig, c.MaxListPageSize, ListPageSizeLimit)
	}
	if c.MaxStaleness < 0 {
		return fmt.Errorf("%w: MaxStaleness is %s: want zero (off) or a positive duration", ErrInvalidConfig, c.MaxStaleness)
	}
	if c.MaxInFlightBlocks < c.MaxHashes {
		return fmt.Errorf("%w: MaxInFlightBlocks %d is below MaxHashes %d (one largest Lookup must fit)",
			ErrInvalidConfig, c.MaxInFlightBlocks, c.MaxHashes)
	}
	if c.ListPageSize > c.MaxListPageSize {
		return fmt.Errorf("%w: ListPageSize %d exceeds MaxListPageSize %d", ErrInvalidConfig, c.ListPageSize, c.MaxListPageSize)
	}
	return nil
}
