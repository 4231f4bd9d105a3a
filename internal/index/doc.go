// Package index is indexd's in-memory index (DESIGN "Reads"): the image of
// kvindex's etcd keyspace at one revision, answering Lookup (DESIGN
// semantics 5), ListEndpoints and read-your-events barrier checks.
//
// indexd's reflector is its one writer: it lists etcd into a fresh Index
// and then applies each watched revision inside Write. The package has no
// etcd, gRPC or Kafka of its own, so the benchmarks (bench) and
// tests build and query an Index directly.
//
// Input: keyspace v2's chunk values (DESIGN "etcd keyspace (v2)"), each
// put applied as the difference from the chunk's previous value, which
// the caller passes (etcd's prev_kv); the index keeps no chunk state
// (chunks.go, and DESIGN "Reads (indexd)" for the measured reason).
//
// Layout: endpoints interned to integer IDs, per model one block hash ->
// slot value table (an ordered linear-probing table of two flat arrays,
// blockmap.go) whose value is an inline (endpoint, tier mask) or an
// endpoint set in a pointer-free arena (set.go). Lookup walks the hashes
// in order keeping the shrinking set of endpoints still matching and stops
// when it is empty. Memory and speed are measured against the goals of
// DESIGN "Performance goals" (BENCHMARKS.md).
package index
