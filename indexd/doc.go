// Package indexd is kvindex's read side (DESIGN "Reads"): a replica that
// lists and watches the etcd keyspace into an in-memory index and answers
// kvindex.v1.IndexService (Lookup, ListEndpoints) over gRPC. Any number of
// replicas run side by side; they share nothing but etcd.
//
// # Consistency contract
//
// Every answer reflects exactly the etcd revision it names (the response's
// revision field) and the partition offsets it lists: the index applies
// each etcd revision's events as a whole under its write lock, so no answer
// ever sees half a revision (half an ingester transaction). The offsets are
// the offsets/ keys at that revision: every Kafka record below a listed next
// offset has been applied. Two replicas at the same revision give the same
// answer. Answers are as fresh as the watch: events reach a replica one
// etcd watch round trip after they commit. A caller that must see its own
// records passes a barrier (topic, partition, record offset): the call
// waits, without polling, until each named partition's applied next offset
// is past the record's offset, and fails with DEADLINE_EXCEEDED naming the
// lagging partition when the barrier's timeout (default 5 s) or the call's
// deadline comes first.
//
// A replica answers UNAVAILABLE (and gRPC health says NOT_SERVING) until its
// first list is applied. A broken watch (leader change, network, etcd
// restart) resumes from the last applied revision + 1 with the index
// serving throughout; only a compaction past that revision makes the
// replica re-list, into a fresh index that is swapped in atomically when
// complete while the old one keeps answering.
//
// # Lookup
//
// Lookup(model, hashes) follows DESIGN semantics 5: per endpoint (pod,
// data-parallel rank) the length of the longest run of leading hashes
// present in some tier, and per matched block the best tier (gpu > cpu >
// disk); endpoints matching nothing are left out, and models never share
// entries. Candidates restrict the answer to the named endpoints.
//
// # Transport security
//
// With Config.TLS the API is served over TLS, and over mutual TLS when that
// config requires client certificates (internal/tlsfiles builds one that
// re-reads rotated files). A health port (Config.HealthListenAddr) answers
// grpc.health.v1 only, always in plaintext, for kubelet's probes.
// Reflection is on unless Config.DisableReflection. docs/security.md.
//
// # Limits
//
// Every request is bounded (Config, docs/limits.md): hashes, candidates,
// barrier records and bytes per request; Lookups waiting on a barrier at
// once (MaxBarrierWaiters: past it a Lookup whose barrier is not met
// fails at once with RESOURCE_EXHAUSTED); calls in flight per connection
// (MaxConcurrentStreams); and endpoints per ListEndpoints page (paged as
// AIP-158 describes, with a token naming the last endpoint returned, so a
// list continues on any replica; each page reflects its own revision).
//
// # The index
//
// The in-memory index is internal/index: endpoints interned to integer
// IDs, per model one map[uint64]uint32 from block hash to an inline
// (endpoint, tier mask) or an endpoint set in a pointer-free arena. Lookup
// walks the hashes in order keeping the shrinking set of endpoints still
// matching and stops when it is empty. Memory and speed are measured
// against the goals of DESIGN "Performance goals" (bench,
// BENCHMARKS.md).
package indexd
