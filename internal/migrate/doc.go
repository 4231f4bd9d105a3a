// Package migrate converts a kvindex keyspace of layout v1 (one etcd key
// per block, endpoint and tier) into layout v2 (chunks of blocks per
// endpoint and tier, DESIGN "etcd keyspace (v2)"), for `kvindex migrate`.
// It runs while the ingesters are stopped: it refuses to start, and every
// transaction it writes fails, while an ingesters/ key exists under
// either prefix.
//
// What it writes, from what it reads at one revision of the v1 prefix:
//
//   - per endpoint and tier, the blocks packed into chunks of ChunkSize in
//     insertion order (the v1 keys' create revisions, ties by hash), at
//     entry width 16 when the endpoint record's hash mode is token (the v1
//     value is the engine hash in hex) and 8 otherwise;
//   - each chunk on the v1 lease of its first block, the endpoint record
//     and member keys on the record's lease: the same lease IDs, so TTLs
//     are kept exactly (see Config for why IDs are reused);
//   - the endpoint records with their tier_leases key counts recounted in
//     chunks and chunk_next per tier, every other field as it was;
//   - offsets and owners as they were, offsets last.
//
// It converges: the v2 prefix is made equal to the conversion of v1 (puts
// where a key is missing or differs, deletes of keys the conversion does
// not have), so a second run changes nothing and a run interrupted at any
// point is finished by the next. It refuses to overwrite a v2 keyspace a
// v2 ingester has written to (a v2 offset past v1's).
//
// The v1 key layout is known here and nowhere else (v1layout.go): after
// a migration nothing in kvindex reads or writes v1.
package migrate
