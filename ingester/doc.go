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
// A worker (worker.go) runs the write path, three parts with one owner
// each:
//
//   - apply (applier, apply.go): records to the endpoints' chunk state and
//     the open window (window.go), by the chunk rule (chunks.go): every
//     block op applied at once, op by op; drops and endpoint-record
//     changes. No I/O; one function per record kind and event type, and
//     all of an endpoint's state in one struct (endpoint.go). The
//     partition clock and the liveness rule are in liveness.go.
//   - pack (packer, pack.go and txn.go): the window to one fenced
//     transaction, split only past etcd's bounds, with the one loop that
//     sends and repairs (an expired lease: repair, settle, rebuild the
//     part). No RPC while packing: commit.go has the lease manager settle
//     every lease first.
//   - leases (leaseManager, leases.go and its keep-alive, keepalive.go):
//     the one owner of grant, keep-alive, recount, adopt, retire, repair
//     and revoke, shared by every worker and the registration.
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
// Keyspace v2 (DESIGN "etcd keyspace (v2)") keeps an (endpoint, tier)'s
// blocks in chunks of up to ChunkSize in insertion order. A worker holds
// the chunks of its endpoints and applies every block op to them as the
// record arrives (DESIGN "The chunk rule (writer)"): a store appends to
// the open chunk, a removal rewrites its chunk (an emptied chunk is
// deleted, a sparse one merged into the open one), a drop deletes every
// chunk it covers. The layout depends only on the op sequence and the
// state at the stored offset, never on where a window ends.
//
// A window ends when the worker has no more queued records or hits its
// bounds; it is then written in one fenced transaction: every chunk it
// changed, once, at its final state (a put of the whole value, or a
// delete), the deletes of records of endpoints dropped with them, the
// endpoint records (sequence state, liveness, lease IDs, chunk_next) of
// every endpoint it touched, and the partition's next offset. Only past
// MaxTxnOps (lowered at start to what etcd accepts, found by read-only
// probes: txnlimit.go) or MaxTxnBytes is it split, into parts sent one
// after another, the offset and the records in the last. Every write
// before the last is idempotent: a crash at any point replays the window
// from the stored offset, and the replay makes the same decisions and
// writes the same chunks byte for byte, because every input to a decision
// (sequence state, last-record time, the endpoint's existence, its
// chunks) is read from the state as of that offset: a new owner rebuilds
// the chunk state, and in token mode the engine-hash maps, from the chunk
// values at the stored offset's revision (rebuild.go). Endpoint records
// written before the last part (needed so that a record exists before its
// chunks, the readers' invariant) carry that committed state, or, for an
// endpoint that did not exist at the stored offset, a zero last-record
// time that makes a successor drop it before replaying.
//
// Drops (AllBlocksCleared, goodbye, resync, engine restarts, gaps,
// liveness expiry, offset resets) delete the endpoint's chunks key by key
// in the window's transaction, never by range: etcd refuses a put and an
// overlapping range delete in one transaction, and the writer knows every
// chunk. Goodbye and expiry delete the endpoint record and member key
// too, and forget the endpoint (a later record of it starts at chunk 0);
// the other drops keep chunk_next. A TierBlocksCleared is a drop of one
// tier's chunks; a switch from provisional group 0 to the endpoint's
// attention group (DESIGN v1.1) and a change of the medium map the
// endpoint was written under are whole drops, like a resync
// (docs/semantics.md, "Mediums and tiers" and "KV-cache groups").
//
// # Leases
//
// Chunk keys are attached to one lease per (endpoint, tier), sharded past
// KeysPerLease chunk keys; the endpoint record has a lease of its own.
// Lease IDs are stored in the endpoint record, so a successor adopts them
// instead of dropping live blocks (a claim checks each recorded lease with
// TimeToLive). The owner keeps an endpoint's leases alive while the
// endpoint is live; drops are guarded deletes, and the leases they emptied
// are revoked only once the window is in etcd. A transaction that fails
// because a lease expired makes the lease manager check the partition's
// leases, forget the expired ones and settle the window's leases again;
// the transaction is rebuilt and retried. Retries of etcd calls back off
// with jitter (internal/backoff) until their context ends.
//
// # Operating
//
// With the default prefix, etcdctl shows what the ingesters hold:
//
//	etcdctl get --prefix /kvindex/v2/owners/      # who claimed each partition
//	etcdctl get --prefix /kvindex/v2/offsets/     # each partition's next offset
//	etcdctl get --prefix /kvindex/v2/ingesters/   # live ingesters and their partitions
//	etcdctl get --prefix --keys-only /kvindex/v2/members/<topic>/<partition>/   # a partition's endpoints
//	etcdctl get /kvindex/v2/endpoints/<model>/<pod>/<rank>   # sequence state, leases, chunk_next
//	etcdctl get --prefix --keys-only /kvindex/v2/chunks/<model>/<pod>/   # a pod's chunks
//	etcdctl lease timetolive --keys <lease id from the endpoint record>
//
// Metrics (subsystem kvindex_ingester, all defined in metrics.go):
// records_total, events_total{type}, skipped_records_total{reason},
// skipped_events_total{reason}, drops_total{reason},
// txns_total{kind: part, commit}, txn_ops (histogram of ops per
// transaction), txn_seconds, txn_ops_limit, txn_ops_configured,
// txn_retries_total, guard_failures_total, etcd_failures_total{op},
// fetch_errors_total,
// leases (kept alive), lease_grants_total, lease_regrants_total,
// lease_recounts_total, leases_expired_total, lag_records{partition},
// partitions, offset_resets_total, unkeyed_blocks_total{reason},
// map_entries{partition}, map_rebuilt_entries_total, outages_total{kind},
// outage_seconds_total, repeated_headers_total{header}.
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
