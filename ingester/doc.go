// Package ingester is kvindex's only writer: it reads raw KV-event batches
// from a Kafka topic with a franz-go consumer group and turns them into
// fenced, bounded etcd transactions (DESIGN "Writes", semantics 1-8 as
// settled in docs/semantics.md).
//
// # Shape
//
// One Ingester is one consumer-group member. Run polls Kafka with
// BlockRebalanceOnPoll, in polls of a bounded number of records, and hands
// each assigned partition's records, in order, to that partition's worker
// goroutine (ingester.go); partitions are written concurrently, each by
// exactly one worker. The poll loop never waits for a worker: when a
// worker's queue is full (QueueBytes), it holds that partition's records
// and pauses fetching it until the worker has room, so a stalled partition
// holds up neither the others nor rebalances.
//
// A worker (partition.go) runs the write path, three parts with one owner
// each:
//
//   - apply (applier, apply.go): records to the open window (window.go):
//     coalesced block ops, range drops and endpoint-record changes. No I/O;
//     one function per record kind and event type, and all of an endpoint's
//     state in one struct (endpoint.go).
//   - pack (pack.go, txn.go, pipeline.go): the window to bounded, fenced
//     transactions, sent up to MaxTxnsInFlight at once. No RPC while
//     packing: the window's drops are written first (drop.go) and its lease
//     IDs settled before packing starts (commit.go orders the steps).
//   - leases (leaseManager, leases.go and its keep-alive, keepalive.go):
//     the one owner of grant, keep-alive, recount, adopt, repair and revoke,
//     shared by every worker and the registration.
//
// On assignment the ingester claims owners/{topic}/{partition} (last
// claimer wins, claim.go) and remembers the claim's revision; every later
// write transaction of the partition compares the owner key's ModRevision
// with it, so a previous owner that still writes (a zombie) fails its
// compare and stops that partition. It then reads offsets/{topic}/{partition},
// the next offset to consume, and the partition's endpoints through their
// member keys (members/{topic}/{partition}/...: the claim costs the
// partition's endpoints, never the keyspace's or the cluster's leases), and
// starts fetching at the stored offset: the etcd offset is the truth,
// Kafka's committed offset only feeds lag monitoring. A stored offset
// outside the log (topic recreated, retention passed) is logged, counted,
// the blocks of the partition's endpoints are dropped (they may be stale)
// and consumption restarts at the log start.
//
// # Exactly right after a crash, a rebalance or a replay
//
// A worker applies records to an in-memory window: block puts and deletes
// go into an ordered op set in which the last op per key wins. A window
// ends when the worker has no more queued records or hits its bounds; it is
// then written in transactions of at most MaxTxnOps operations (lowered
// at start to what etcd accepts, found by read-only probes: txnlimit.go)
// and MaxTxnBytes bytes, up to MaxTxnsInFlight of them at once (after
// coalescing they touch distinct keys), and only the last one, sent once
// all the others have committed, writes the partition's next offset
// together with the endpoint records (sequence state, liveness, lease IDs)
// of every endpoint the window touched. Every other write is
// idempotent: a crash at any point replays the window from the stored
// offset, and the replay makes the same decisions, because every input to
// a decision (sequence state, last-record time, the endpoint's existence)
// is read from the state as of that offset. Endpoint records written before
// the last transaction (needed so that a record exists before its blocks,
// the readers' invariant) carry that committed state, or, for an endpoint
// that did not exist at the stored offset, a zero last-record time that
// makes a successor drop it before replaying.
//
// Range drops (AllBlocksCleared, goodbye, resync, engine restarts, gaps,
// liveness expiry, offset resets) void the endpoint's pending ops; when the
// window is written, each drop deletes its endpoint's blocks/ range in
// guarded pages of at most DropPageSize keys before any of the window's
// block ops (so the ops queued after the drop land after it); goodbye and
// expiry delete the endpoint record and member key in the last page. A
// TierBlocksCleared is a range drop of one tier's keys (blocks/.../{tier}/)
// that voids only that tier's pending ops; a switch from provisional group
// 0 to the endpoint's attention group (DESIGN v1.1) and a change of the
// medium map the endpoint was written under are whole drops, like a
// resync (docs/semantics.md, "Mediums and tiers" and "KV-cache groups").
//
// # Leases
//
// Block keys are attached to one lease per (endpoint, tier), sharded past
// KeysPerLease keys; the endpoint record has a lease of its own. Lease IDs
// are stored in the endpoint record, so a successor adopts them instead of
// dropping live blocks (a claim checks each recorded lease with
// TimeToLive). The owner keeps an endpoint's leases alive while the
// endpoint is live; drops are guarded range deletes, and only leases with
// no keys left are revoked. A transaction that fails because a lease
// expired makes the lease manager check the partition's leases, forget the
// expired ones and settle the window's leases again; the transaction is
// rebuilt and retried. Retries of etcd calls back off with jitter
// (internal/backoff) until their context ends.
//
// # Operating
//
// With the default prefix, etcdctl shows what the ingesters hold:
//
//	etcdctl get --prefix /kvindex/v2/owners/      # who claimed each partition
//	etcdctl get --prefix /kvindex/v2/offsets/     # each partition's next offset
//	etcdctl get --prefix /kvindex/v2/ingesters/   # live ingesters and their partitions
//	etcdctl get --prefix --keys-only /kvindex/v2/members/<topic>/<partition>/   # a partition's endpoints
//	etcdctl get /kvindex/v2/endpoints/<model>/<pod>/<rank>   # sequence state, leases
//	etcdctl lease timetolive --keys <lease id from the endpoint record>
//
// Metrics (subsystem kvindex_ingester): records_total, events_total{type},
// skipped_records_total{reason}, skipped_events_total{reason},
// drops_total{reason}, txns_total{kind}, txn_ops (histogram of ops per
// transaction), txn_seconds, txn_retries_total, guard_failures_total,
// leases (kept alive), lease_grants_total, lease_regrants_total,
// leases_expired_total, lag_records{partition}, partitions,
// offset_resets_total.
//
// # Registration
//
// While Run runs, the ingester keeps ingesters/{ID} (an IngesterRecord:
// host, start time, owned partitions) on a lease of its own
// (registration.go), so operators can see the live members and what each
// owns. A clean stop revokes that lease, so the key goes at once; after a
// crash it goes when the lease expires.
//
// # Shutdown
//
// Run returns when its context ends: the poll loop stops, workers abandon
// their open window (a successor replays it), the Kafka client leaves the
// group, the lease manager stops renewing (the endpoints' leases are never
// revoked on shutdown, so a successor can adopt them) and the registration
// lease is revoked.
package ingester
