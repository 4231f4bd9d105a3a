package migrate

import "errors"

// Sentinel errors; wrapped with detail, test them with errors.Is.
var (
	// ErrInvalidConfig reports a Config that Validate refuses.
	ErrInvalidConfig = errors.New("migrate: invalid config")
	// ErrIngesterAlive reports an ingesters/ key under either prefix, at
	// the start or in a transaction's guard: an ingester is running.
	ErrIngesterAlive = errors.New("migrate: an ingester is running")
	// ErrV2Ahead reports a v2 keyspace that a v2 ingester has written to
	// since it was migrated (a v2 offset past the v1 one): migrating again
	// would roll it back.
	ErrV2Ahead = errors.New("migrate: the v2 keyspace has moved past v1")
	// ErrTxnTooBig reports a transaction etcd refused for its size.
	ErrTxnTooBig = errors.New("migrate: etcd refused a transaction as too big")
)

// errLeaseGone reports a lease that expired after the read: the run starts
// over from a fresh read, which no longer sees that lease's keys.
var errLeaseGone = errors.New("migrate: a lease expired during the migration")
