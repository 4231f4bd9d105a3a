package ingester

import "errors"

// Sentinel errors; wrapped with detail, test them with errors.Is.
var (
	// ErrInvalidConfig reports a Config that Validate rejects.
	ErrInvalidConfig = errors.New("ingester: invalid config")
	// ErrFenced reports that a write transaction's guard failed: another
	// ingester claimed the partition after this one (DESIGN "Writes:
	// fencing"). The partition's worker stops; the ingester goes on with
	// its other partitions.
	ErrFenced = errors.New("ingester: partition claimed by another ingester")
	// ErrClaim reports that a partition could not be claimed or loaded
	// from etcd within the rebalance timeout.
	ErrClaim = errors.New("ingester: claiming partition")
)
