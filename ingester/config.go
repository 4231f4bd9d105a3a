package ingester

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvindex/kvindex/internal/contract"
	"github.com/kvindex/kvindex/internal/events"
	"github.com/kvindex/kvindex/internal/keyspace"
)

// Defaults of Config (DESIGN "Writes").
const (
	DefaultTopic            = contract.DefaultTopic
	DefaultGroup            = contract.DefaultGroup
	DefaultMaxTxnOps        = 1024
	DefaultMaxTxnBytes      = 1 << 20
	DefaultWindowRecords    = 1024
	DefaultWindowOps        = 4096
	DefaultQueueBytes       = 16 << 20
	DefaultWindowLinger     = 30 * time.Millisecond
	DefaultFetchMaxWait     = 100 * time.Millisecond
	DefaultLeaseTTL         = 120 * time.Second
	DefaultLivenessWindow   = 30 * time.Second
	DefaultOutageThreshold  = 15 * time.Second
	DefaultKeysPerLease     = 10_000
	DefaultChunkSize        = keyspace.DefaultChunkSize
	DefaultSessionTimeout   = 10 * time.Second
	DefaultRebalanceTimeout = 30 * time.Second
	DefaultMaxMapEntries    = 4_000_000
	DefaultMapRebuildPage   = 4 << 20
)

// MinLivenessWindow is the shortest Config.LivenessWindow Validate
// accepts. The partition clock advances with Kafka record timestamps,
// which have millisecond resolution, and the outage threshold defaults to
// half the window: a shorter window would drop live endpoints between
// their own batches and leave no room for an outage to be told from one
// endpoint's silence. Bridges heartbeat every 5 s, so production windows
// are many seconds; tests run at a few hundred milliseconds.
const MinLivenessWindow = 100 * time.Millisecond

// CheckLivenessWindow returns an error for a liveness window d below
// MinLivenessWindow, saying why, for a caller to prefix with the name it
// knows the window by (Validate: LivenessWindow; the CLI: its flag).
func CheckLivenessWindow(d time.Duration) error {
	if d < MinLivenessWindow {
		return fmt.Errorf("%v: want at least %v (the partition clock counts Kafka's millisecond timestamps, and bridges heartbeat every 5 s)", d, MinLivenessWindow)
	}
	return nil
}

// etcdMaxRequestBytes is etcd's default --max-request-bytes (1.5 MiB); a
// transaction's encoded size must stay under it.
const etcdMaxRequestBytes = 1536 * 1024

// Config configures an Ingester. Build one with DefaultConfig and change
// what you need; New validates it.
type Config struct {
	// Etcd is the client every write goes through. Required; the caller
	// owns it and closes it after Run returns.
	Etcd *clientv3.Client
	// Keyspace places every key. The zero value means keyspace.Default().
	Keyspace keyspace.Keyspace
	// Brokers are the Kafka seed brokers (host:port). Required.
	Brokers []string
	// Topic is the KV-event topic. Default DefaultTopic; required.
	Topic string
	// Group is the consumer group. Default DefaultGroup; required.
	Group string
	// ID names this ingester in owner records and its ingesters/ key.
	// Default: the host name and process id; empty means that default.
	ID string

	// MaxTxnOps bounds the operations of one etcd transaction. etcd has
	// its own bound (--max-txn-ops, 128 unless raised) and no API that
	// reports it, so Run asks etcd with read-only probes before claiming
	// anything and packs min(MaxTxnOps, what etcd accepts): the largest
	// transactions etcd takes, up to this (fewer, larger transactions cost
	// etcd less per block; docs/limits.md). Default DefaultMaxTxnOps
	// (1024); at least 8.
	MaxTxnOps int
	// MaxTxnBytes bounds the encoded size of one transaction; it must stay
	// under etcd's --max-request-bytes (1.5 MiB by default). Default
	// DefaultMaxTxnBytes (1 MiB); between 16 KiB and 1.5 MiB.
	MaxTxnBytes int
	// WindowRecords ends a batch window after this many records (a window
	// also ends whenever the partition has no more records queued).
	// Default DefaultWindowRecords; at least 1.
	WindowRecords int
	// WindowOps ends a batch window once it holds this many pending block
	// operations. Default DefaultWindowOps; at least 1. A single record
	// bigger than this still forms one window.
	WindowOps int
	// WindowLinger, when positive, keeps a window that is not full open
	// for more records to join it before it is written (what Kafka
	// producers call linger.ms), until its oldest record is this old by
	// its Kafka timestamp and never longer than this from when the
	// worker ran out of queued records: time a record spent in Kafka or
	// in the queue counts against its linger, so a backlog is written at
	// once. Fewer, fuller windows rewrite each (endpoint, tier)'s newest
	// chunk less often, which cuts etcd's DB growth per block op; a
	// record waits up to this much longer to be visible. Default
	// DefaultWindowLinger (30 ms: at 50k block ops/s with chunks of 24,
	// DB growth 0.24× v1 against 0.33× with no linger, freshness p99
	// still under 50 ms; BENCHMARKS.md "Keyspace v2 at a fixed 50,000
	// block ops/s"); 0 writes a window as soon as the partition has no
	// more records queued; between 0 and 1 s.
	WindowLinger time.Duration
	// FetchMaxWait is how long a Kafka fetch may wait at the broker for
	// records (the fetch's MaxWaitMillis). It bounds how long a partition
	// whose fetching resumed (its worker caught up after QueueBytes
	// paused it) waits for the fetch already in flight for the member's
	// caught-up partitions to return: the client sends one fetch per
	// broker at a time. Default DefaultFetchMaxWait (100 ms, against
	// franz-go's 5 s); between 10 ms and 5 s.
	FetchMaxWait time.Duration
	// QueueBytes bounds the fetched record bytes (keys, values, headers)
	// queued for one partition's worker. Beyond it the consume loop pauses
	// fetching that partition and holds what it already fetched for it
	// (what was in flight when it paused) until the worker catches up; the
	// member's other partitions go on. Default DefaultQueueBytes (16 MiB);
	// at least 64 KiB.
	QueueBytes int

	// LeaseTTL is the TTL of every lease the ingester grants, a whole
	// number of seconds. Keepalives renew at a third of it, so after a
	// crash two thirds may be left: Validate requires 2/3 × LeaseTTL >
	// SessionTimeout + RebalanceTimeout + LeaseTTL/10 (the margin).
	// Default DefaultLeaseTTL (120 s).
	LeaseTTL time.Duration
	// LivenessWindow drops an endpoint that sent no batch or heartbeat for
	// longer than this on its partition's clock (DESIGN semantics 8).
	// Default DefaultLivenessWindow (30 s); at least MinLivenessWindow.
	LivenessWindow time.Duration
	// OutageThreshold is how long the whole topic may go without a record
	// before it counts as an outage (DESIGN semantics 8, v1.1): no
	// partition's end offset grew and no record arrived for longer than
	// this. Outage time ages nobody, and after it every endpoint gets
	// OutageGrace. Bridges heartbeat every 5 s, so a live fleet never
	// goes this quiet. Default DefaultOutageThreshold (15 s), or half the
	// LivenessWindow when that is shorter; zero means the default; must be
	// below LivenessWindow.
	OutageThreshold time.Duration
	// OutageGrace is how long every endpoint is kept, on the partition
	// clock, after an outage ends or after a partition is claimed more
	// than OutageThreshold after its last record: time for live pods to
	// be heard again. Default (zero): LivenessWindow.
	OutageGrace time.Duration
	// KeysPerLease bounds the chunk keys attached to one lease; an
	// (endpoint, tier) gets another lease shard past it, so revoking or
	// expiring one lease deletes a bounded number of keys (10,000 chunks
	// of 64 are 640k blocks: one lease per tier is the rule). Default
	// DefaultKeysPerLease; at least 1.
	KeysPerLease int
	// ChunkSize is the most blocks of one chunk key (DESIGN "The chunk
	// rule (writer)"): new blocks of an (endpoint, tier) fill its newest
	// chunk up to it. Default DefaultChunkSize (24); between 1 and
	// keyspace.MaxChunkEntries (256). Changing it changes only where new
	// blocks go: chunks written under another size stay readable.
	ChunkSize int
	// ChunkOpenAt is rule 1's open threshold: a record's first new block
	// of an (endpoint, tier) opens a new chunk when the open chunk already
	// holds at least this many entries, so a small record does not
	// rewrite a nearly full chunk for a few blocks. A big record, one that
	// stores BigRecordStores(ChunkSize) blocks or more in the tier (3 for
	// chunks of 24), opens one as soon as the open chunk holds the merge
	// threshold: it brings about what a window carries for its endpoint,
	// and appended it would rewrite the open chunk whole for them
	// (BENCHMARKS.md "The open threshold of a record": at 50k block
	// ops/s, chunks of 64, etcd DB growth 0.33-0.34× v1 against 0.41×
	// for the threshold per store event and 0.44-0.45× without one).
	// Zero means DefaultChunkOpenAt(ChunkSize, WindowLinger), and no less
	// than the merge threshold; ChunkSize opens a chunk only when the open
	// one is full, big records included. Between the
	// merge threshold (a chunk closed below it would be sparse at once)
	// and ChunkSize. Like ChunkSize, it changes only where new blocks go;
	// a new owner repairs a layout an owner with another setting left
	// (DESIGN "The chunk rule (writer)"), but every ingester of a group
	// should run the same one.
	ChunkOpenAt int
	// ChunkMergeBelow is the merge rule's threshold: a chunk other than
	// the open one left by a removal with fewer entries than this moves
	// them, in order, to the open chunk and is deleted, so chunks that
	// tail-first eviction thinned out do not stay sparse. Zero means
	// DefaultChunkMergeBelow(ChunkSize) (3 for chunks of 24); 1 never
	// merges (an empty chunk is deleted anyway). At most ChunkSize.
	ChunkMergeBelow int

	// SessionTimeout is the consumer group's session timeout. Default
	// DefaultSessionTimeout (10 s); must be positive and allowed by the
	// brokers.
	SessionTimeout time.Duration
	// RebalanceTimeout is the consumer group's rebalance timeout; it also
	// bounds how long a revoked partition may take to write its last
	// window. Default DefaultRebalanceTimeout (30 s); must be positive.
	RebalanceTimeout time.Duration

	// HashMode is what blocks are keyed by (DESIGN "Hashing"):
	// keyspace.HashModeToken, kvindex's canonical key computed from each
	// block's token ids, or keyspace.HashModeEngine, the engine's own
	// hash. Every endpoint record carries it; an endpoint whose stored
	// record says otherwise is dropped as by resync and rewritten before
	// its next record applies. The zero value means HashModeToken, the
	// default.
	HashMode keyspace.HashMode
	// MaxMapEntries bounds, per partition, the entries of the token-mode
	// maps from engine hash to key (one per block present in any tier of
	// an endpoint; about 50 bytes each, BENCHMARKS.md). Past it the
	// endpoint with the most entries is dropped as by resync, so no entry
	// is ever forgotten while its block stays in etcd. Ignored in
	// engine-hash mode. Default DefaultMaxMapEntries; at least 1.
	MaxMapEntries int
	// MapRebuildPageBytes bounds the bytes of one page (one etcd Range of
	// an endpoint's chunks) when a new owner rebuilds the chunk state, and
	// in token mode the engine-hash maps, from the chunk values; the
	// page's key count follows from the endpoint's key length and the
	// chunk size. Default DefaultMapRebuildPage (4 MiB); at least 4 KiB.
	MapRebuildPageBytes int

	// Mediums maps engine medium strings to tiers, matched
	// case-insensitively (DESIGN v1.1). Nil means events.DefaultMediums().
	// Validate refuses a map that gives two spellings of one name
	// different tiers, or a name no real tier. Its fingerprint is stored
	// in every endpoint record; changing the map drops each endpoint
	// written under the old one before its next record applies.
	Mediums events.MediumMap
	// Registry receives the ingester's metrics (kvindex_ingester_*). Nil
	// means they are kept but registered nowhere.
	Registry prometheus.Registerer
	// Logger receives structured logs. Nil discards them.
	Logger *slog.Logger
	// Clock is the wall clock of the partition clock once a partition is
	// caught up (DESIGN semantics 8). Nil means the real clock. Lease
	// keepalives always use real time: etcd expires leases in real time.
	Clock clockwork.Clock
	// KafkaOptions are extra franz-go client options (tests, TLS, SASL),
	// applied after the ingester's own consumer-group options. Default
	// none.
	KafkaOptions []kgo.Opt

	// OnAssigned, when set, is called with the partitions this member owns
	// after every assignment change. It must return quickly.
	OnAssigned func(partitions []int32)
	// BeforeTxn is a test hook called before each write transaction. A
	// non-nil error aborts the ingester as a crash would: nothing more is
	// written and Run returns the error.
	BeforeTxn func(ctx context.Context, info TxnInfo) error
}

// TxnInfo describes a write transaction to Config.BeforeTxn.
type TxnInfo struct {
	// Partition is the partition whose worker writes it.
	Partition int32
	// Kind says what the transaction does.
	Kind TxnKind
	// Ops is its number of operations.
	Ops int
	// ChunkOps is how many of them put or delete a chunk key.
	ChunkOps int
	// Offset is the next offset it stores, or -1 when it stores none.
	Offset int64
}

// TxnKind is what a write transaction does. A window is one transaction
// (TxnCommit), split into parts (TxnPart, then TxnCommit) only past what
// etcd accepts (MaxTxnOps, MaxTxnBytes).
type TxnKind uint8

// The transaction kinds.
const (
	// TxnPart writes chunk puts and deletes (and the records they need)
	// of a window whose ops do not fit one transaction; more of the
	// window follows.
	TxnPart TxnKind = iota + 1
	// TxnCommit is a window's transaction, or its last part: it writes
	// the endpoint records and the partition's next offset.
	TxnCommit
)

// String returns the kind's metric label.
func (k TxnKind) String() string {
	switch k {
	case TxnPart:
		return "part"
	case TxnCommit:
		return "commit"
	}
	return fmt.Sprintf("TxnKind(%d)", uint8(k))
}

// DefaultChunkOpenAt is Config.ChunkOpenAt's default for a chunk size
// and window linger at the default merge threshold. With a linger it is
// the chunk size (a chunk opens only when the newest is full): lingering
// windows carry enough of each endpoint's blocks that the threshold saved
// no DB growth and cost operations (0.089-0.091 etcd ops per block op
// against 0.078-0.080 at 50k block ops/s, chunks of 24). Without one it
// is 3/4 of the chunk size, at least 1 (18 for chunks of 24), which cut
// DB growth from 0.44× to 0.33× v1 at chunks of 64.
func DefaultChunkOpenAt(chunkSize int, linger time.Duration) int {
	if linger > 0 {
		return max(1, chunkSize)
	}
	return max(1, chunkSize*3/4)
}

// BigRecordStores is the number of stores in one tier that makes a record
// big for rule 1 (see Config.ChunkOpenAt): an eighth of the chunk size,
// 0 (no record is big) below a chunk size of 8.
func BigRecordStores(chunkSize int) int { return chunkSize / 8 }

// chunkRule is the chunk rule a validated config sets.
func (c *Config) chunkRule() chunkRule {
	r := chunkRule{size: c.ChunkSize, openAt: c.ChunkOpenAt, mergeBelow: c.ChunkMergeBelow}
	if c.ChunkOpenAt < c.ChunkSize {
		r.bigRecord = BigRecordStores(c.ChunkSize)
	}
	return r
}

// DefaultChunkMergeBelow is Config.ChunkMergeBelow's default for a chunk
// size: an eighth of it, at least 1 (3 for chunks of 24, 8 for 64). On
// the Mooncake fleet stream at chunks of 24 (TestChunkRuleCost), merging
// below 3 left chunks fuller than never merging under both eviction
// orders (mean occupancy 0.976-0.977 against 0.972 tail first, 0.983-0.984
// against 0.974 in LRU order), for 13.4-13.5 entries rewritten per removal
// against 11.5; merging below a quarter (6) left them emptier under tail
// first (0.962-0.963), the merged entries filling the open chunk early.
func DefaultChunkMergeBelow(chunkSize int) int { return max(1, chunkSize/8) }

// chunkMergeBelow is ChunkMergeBelow with its default filled in
// (DefaultChunkMergeBelow).
func (c *Config) chunkMergeBelow() int {
	if c.ChunkMergeBelow == 0 {
		return DefaultChunkMergeBelow(c.ChunkSize)
	}
	return c.ChunkMergeBelow
}

// DefaultConfig returns a Config with every default filled in; the caller
// still sets Etcd and Brokers.
func DefaultConfig() Config {
	return Config{
		Keyspace:            keyspace.Default(),
		Topic:               DefaultTopic,
		Group:               DefaultGroup,
		MaxTxnOps:           DefaultMaxTxnOps,
		MaxTxnBytes:         DefaultMaxTxnBytes,
		WindowRecords:       DefaultWindowRecords,
		WindowOps:           DefaultWindowOps,
		QueueBytes:          DefaultQueueBytes,
		WindowLinger:        DefaultWindowLinger,
		FetchMaxWait:        DefaultFetchMaxWait,
		LeaseTTL:            DefaultLeaseTTL,
		LivenessWindow:      DefaultLivenessWindow,
		KeysPerLease:        DefaultKeysPerLease,
		ChunkSize:           DefaultChunkSize,
		SessionTimeout:      DefaultSessionTimeout,
		RebalanceTimeout:    DefaultRebalanceTimeout,
		HashMode:            keyspace.HashModeToken,
		MaxMapEntries:       DefaultMaxMapEntries,
		MapRebuildPageBytes: DefaultMapRebuildPage,
	}
}

// Validate reports the first invalid field as an error wrapping
// ErrInvalidConfig. It does not change c; zero values that mean a default
// are accepted.
func (c *Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	switch {
	case c.Etcd == nil:
		return bad("Etcd client is required")
	case len(c.Brokers) == 0:
		return bad("Brokers are required")
	case c.MaxTxnOps < minTxnOps:
		return bad("MaxTxnOps %d: want at least %d", c.MaxTxnOps, minTxnOps)
	case c.MaxTxnBytes < 16<<10 || c.MaxTxnBytes > etcdMaxRequestBytes:
		return bad("MaxTxnBytes %d: want between 16 KiB and 1.5 MiB", c.MaxTxnBytes)
	case c.WindowRecords < 1:
		return bad("WindowRecords %d: want at least 1", c.WindowRecords)
	case c.WindowOps < 1:
		return bad("WindowOps %d: want at least 1", c.WindowOps)
	case c.WindowLinger < 0 || c.WindowLinger > time.Second:
		return bad("WindowLinger %v: want between 0 and 1s", c.WindowLinger)
	case c.FetchMaxWait != 0 && (c.FetchMaxWait < 10*time.Millisecond || c.FetchMaxWait > 5*time.Second):
		return bad("FetchMaxWait %v: want between 10ms and 5s (zero: the default)", c.FetchMaxWait)
	case c.QueueBytes < 64<<10:
		return bad("QueueBytes %d: want at least 64 KiB", c.QueueBytes)
	case c.LeaseTTL < time.Second || c.LeaseTTL%time.Second != 0:
		return bad("LeaseTTL %v: want a whole number of seconds, at least 1s", c.LeaseTTL)
	case c.LivenessWindow <= 0:
		return bad("LivenessWindow %v: want a positive duration", c.LivenessWindow)
	case CheckLivenessWindow(c.LivenessWindow) != nil:
		return bad("LivenessWindow %v", CheckLivenessWindow(c.LivenessWindow))
	case c.OutageThreshold < 0:
		return bad("OutageThreshold %v: want a positive duration (zero: the default)", c.OutageThreshold)
	case c.OutageThreshold > 0 && c.OutageThreshold >= c.LivenessWindow:
		return bad("OutageThreshold %v: want less than LivenessWindow %v (a live endpoint must not expire before a silent topic counts as an outage)", c.OutageThreshold, c.LivenessWindow)
	case c.OutageGrace < 0:
		return bad("OutageGrace %v: want a positive duration (zero: the liveness window)", c.OutageGrace)
	case c.KeysPerLease < 1:
		return bad("KeysPerLease %d: want at least 1", c.KeysPerLease)
	case c.ChunkSize < 1 || c.ChunkSize > keyspace.MaxChunkEntries:
		return bad("ChunkSize %d: want between 1 and %d", c.ChunkSize, keyspace.MaxChunkEntries)
	case c.ChunkMergeBelow < 0 || c.ChunkMergeBelow > c.ChunkSize:
		return bad("ChunkMergeBelow %d: want between 0 (the default: an eighth of ChunkSize) and ChunkSize %d (1: never merge)", c.ChunkMergeBelow, c.ChunkSize)
	case c.ChunkOpenAt < 0 || c.ChunkOpenAt > c.ChunkSize:
		return bad("ChunkOpenAt %d: want between 0 (the default: ChunkSize with a window linger, else three quarters of it) and ChunkSize %d (only when full)", c.ChunkOpenAt, c.ChunkSize)
	case c.ChunkOpenAt > 0 && c.ChunkOpenAt < c.chunkMergeBelow():
		return bad("ChunkOpenAt %d: below the merge threshold %d, a chunk would close sparse", c.ChunkOpenAt, c.chunkMergeBelow())
	case c.SessionTimeout <= 0:
		return bad("SessionTimeout %v: want a positive duration", c.SessionTimeout)
	case c.RebalanceTimeout <= 0:
		return bad("RebalanceTimeout %v: want a positive duration", c.RebalanceTimeout)
	case c.HashMode != "" && c.HashMode != keyspace.HashModeToken && c.HashMode != keyspace.HashModeEngine:
		return bad("HashMode %q: want %q or %q", c.HashMode, keyspace.HashModeToken, keyspace.HashModeEngine)
	case c.MaxMapEntries < 1:
		return bad("MaxMapEntries %d: want at least 1", c.MaxMapEntries)
	case c.MapRebuildPageBytes < 4<<10:
		return bad("MapRebuildPageBytes %d: want at least 4 KiB", c.MapRebuildPageBytes)
	}
	if err := keyspace.ValidateName("topic", c.Topic); err != nil {
		return bad("Topic: %v", err)
	}
	if c.Mediums != nil {
		if err := c.Mediums.Validate(); err != nil {
			return bad("Mediums: %v", err)
		}
	}
	if err := keyspace.ValidateName("group", c.Group); err != nil {
		return bad("Group: %v", err)
	}
	if c.ID != "" {
		if err := keyspace.ValidateName("ingester id", c.ID); err != nil {
			return bad("ID: %v", err)
		}
	}
	if c.Keyspace != (keyspace.Keyspace{}) {
		if _, err := keyspace.New(c.Keyspace.Prefix()); err != nil {
			return bad("Keyspace: %v", err)
		}
	}
	// Keepalives renew at TTL/3, so a crashed owner's leases may have only
	// 2/3 of the TTL left; its successor needs at most a session timeout
	// to notice and a rebalance timeout to take over, plus a margin.
	if need := c.SessionTimeout + c.RebalanceTimeout + c.LeaseTTL/10; 2*c.LeaseTTL/3 <= need {
		return bad("LeaseTTL %v: 2/3 of it must exceed SessionTimeout %v + RebalanceTimeout %v + a margin of TTL/10 (%v)",
			c.LeaseTTL, c.SessionTimeout, c.RebalanceTimeout, c.LeaseTTL/10)
	}
	return nil
}

// withDefaults returns c with the zero values that mean a default filled.
func (c Config) withDefaults() Config {
	if c.Keyspace == (keyspace.Keyspace{}) {
		c.Keyspace = keyspace.Default()
	}
	if c.ID == "" {
		host, err := os.Hostname()
		if err != nil || host == "" {
			host = "ingester"
		}
		c.ID = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	if c.HashMode == "" {
		c.HashMode = keyspace.HashModeToken
	}
	if c.Mediums == nil {
		c.Mediums = events.DefaultMediums()
	}
	if c.Registry == nil {
		c.Registry = prometheus.NewRegistry()
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Clock == nil {
		c.Clock = clockwork.NewRealClock()
	}
	if c.OutageThreshold == 0 {
		c.OutageThreshold = min(DefaultOutageThreshold, c.LivenessWindow/2)
	}
	if c.OutageGrace == 0 {
		c.OutageGrace = c.LivenessWindow
	}
	c.ChunkMergeBelow = c.chunkMergeBelow()
	if c.ChunkOpenAt == 0 {
		c.ChunkOpenAt = max(DefaultChunkOpenAt(c.ChunkSize, c.WindowLinger), c.ChunkMergeBelow)
	}
	if c.FetchMaxWait == 0 {
		c.FetchMaxWait = DefaultFetchMaxWait
	}
	return c
}
