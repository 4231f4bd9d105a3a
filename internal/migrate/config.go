package migrate

import (
	"fmt"
	"log/slog"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvindex/kvindex/internal/keyspace"
)

// V1Prefix is the prefix of the v1 keyspace unless configured otherwise
// (the default prefix of kvindex before keyspace v2).
const V1Prefix = "/kvindex/v1/"

// Defaults of Config (docs/limits.md, "Tools").
const (
	// DefaultMaxTxnOps is etcd's own default --max-txn-ops, which every
	// etcd accepts.
	DefaultMaxTxnOps = 128
	// DefaultMaxTxnBytes keeps a transaction under etcd's default
	// --max-request-bytes (1.5 MiB).
	DefaultMaxTxnBytes = 1 << 20
	// DefaultPageSize is the most keys one range read returns. Ranges
	// are read per endpoint, so a page costs etcd the endpoint's own key
	// count, not the keyspace's (DESIGN "Reads": small pages over a big
	// prefix are quadratic).
	DefaultPageSize = 10000
	// DefaultCallTimeout bounds one etcd call: a page of DefaultPageSize
	// keys or a transaction of DefaultMaxTxnBytes answers in well under a
	// second on a healthy etcd.
	DefaultCallTimeout = 30 * time.Second
)

// guardOps is the number of compares every transaction carries (no
// ingesters/ key under either prefix).
const guardOps = 2

// Config is one migration.
//
// Leases: the v2 keys are attached to the v1 keys' own lease IDs, not to
// new leases. An etcd lease's TTL is fixed when it is granted and every
// keepalive renews it to that TTL, so a new lease granted with a v1
// lease's remaining TTL would shrink the endpoint's TTL for good (under
// what the ingester's --lease-ttl check requires), and one granted with
// the full TTL would keep dead endpoints longer than v1 would have. The
// same IDs keep each remaining TTL exactly, let the v2 ingester adopt them
// from the records as it adopts a crashed predecessor's, make a second run
// write the same keys (no leases to map or leak), and keep v1 and v2 keys
// of an endpoint expiring together, so a rollback to v1 stays consistent.
// The cost: until the v1 prefix is deleted each lease holds its v1 keys
// and its v2 chunks, so a revoke deletes both (about 1 + 1/ChunkSize
// times the v1 count, which v1 was sized for), and the ingester's lease
// recount counts the v1 keys too.
type Config struct {
	// Etcd is the client; required.
	Etcd *clientv3.Client
	// From is the v1 keyspace (zero: under V1Prefix).
	From keyspace.Keyspace
	// To is the v2 keyspace (zero: keyspace.Default()). Neither prefix
	// may start with the other.
	To keyspace.Keyspace
	// ChunkSize is the most blocks per chunk, 1 to
	// keyspace.MaxChunkEntries (default keyspace.DefaultChunkSize, the
	// ingester's --chunk-size default).
	ChunkSize int
	// MaxTxnOps is the most operations per transaction, guards included;
	// at least guardOps+1 (default DefaultMaxTxnOps).
	MaxTxnOps int
	// MaxTxnBytes bounds the keys and values of one transaction (default
	// DefaultMaxTxnBytes); a single operation bigger than it still goes
	// alone.
	MaxTxnBytes int
	// PageSize is the most keys per range read (default DefaultPageSize).
	PageSize int
	// CallTimeout bounds each etcd call (a read, a transaction, a lease
	// lookup), so a run whose etcd stops answering fails instead of
	// waiting on it (default DefaultCallTimeout; kvindex migrate sets
	// --etcd-dial-timeout).
	CallTimeout time.Duration
	// DryRun computes and reports every write without sending any.
	DryRun bool
	// Logger receives one line per skipped key and per transaction
	// (nil: discard).
	Logger *slog.Logger
}

// DefaultConfig returns a Config with every default set; the caller sets
// Etcd.
func DefaultConfig() Config {
	return Config{
		From:        (&Config{}).from(),
		To:          keyspace.Default(),
		ChunkSize:   keyspace.DefaultChunkSize,
		MaxTxnOps:   DefaultMaxTxnOps,
		MaxTxnBytes: DefaultMaxTxnBytes,
		PageSize:    DefaultPageSize,
		CallTimeout: DefaultCallTimeout,
	}
}

// Validate reports the first invalid field, wrapping ErrInvalidConfig.
func (c *Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	from, to := c.from().Prefix(), c.to().Prefix()
	switch {
	case c.Etcd == nil:
		return bad("no etcd client")
	case strings.HasPrefix(from, to) || strings.HasPrefix(to, from):
		return bad("prefixes %q and %q overlap", from, to)
	case c.ChunkSize < 1 || c.ChunkSize > keyspace.MaxChunkEntries:
		return bad("ChunkSize %d: want 1 to %d", c.ChunkSize, keyspace.MaxChunkEntries)
	case c.MaxTxnOps <= guardOps:
		return bad("MaxTxnOps %d: want more than %d (the guards)", c.MaxTxnOps, guardOps)
	case c.MaxTxnBytes <= 0:
		return bad("MaxTxnBytes %d: want a positive number", c.MaxTxnBytes)
	case c.CallTimeout < 0:
		return bad("CallTimeout %v: want zero (the default) or positive", c.CallTimeout)
	case c.PageSize <= 0:
		return bad("PageSize %d: want a positive number", c.PageSize)
	}
	return nil
}

// from is From, or the keyspace under V1Prefix when From is zero.
func (c *Config) from() keyspace.Keyspace {
	if c.From.Prefix() == "" {
		ks, _ := keyspace.New(V1Prefix)
		return ks
	}
	return c.From
}

// to is To, or keyspace.Default() when To is zero.
func (c *Config) to() keyspace.Keyspace {
	if c.To.Prefix() == "" {
		return keyspace.Default()
	}
	return c.To
}
