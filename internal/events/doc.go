// Package events decodes the KV-event batches model servers publish
// (DESIGN "Event wire format"): vLLM's msgpack KVEventBatch, and the
// engines that copy it (SGLang, LMCache). TensorRT-LLM publishes a schema
// of its own, not through this format: it is not supported (README).
//
// A batch is the msgpack array [ts, events, data_parallel_rank] (the rank
// may be missing), or a map {"ts", "events", "data_parallel_rank"} with
// its keys in any order and the rank omitted when nil (DESIGN v1.1: vLLM's
// newest EventBatch is not array_like). Each event is either a tagged
// array ["BlockStored", block_hashes, ...] (engines that encode msgspec
// structs array_like) or a tagged map {"type": "BlockStored",
// "block_hashes": ...}. Both decode to the same Event. Fields and batch
// keys the decoder does not know are ignored, and missing trailing fields
// are nil, as msgspec's omit_defaults encoding leaves them out.
//
// The event types are BlockStored, BlockRemoved, AllBlocksCleared and
// TierBlocksCleared (one tier of the endpoint reset). Mediums map to tiers
// through a MediumMap, matched case-insensitively (DefaultMediums is the
// DESIGN table). The decoder keeps every KV-cache group and reports each
// store's kv_cache_spec_kind: choosing the group an endpoint indexes needs
// the endpoint's history, so it is the ingester's rule, not the decoder's.
//
// Errors come in two sizes (DESIGN semantics 6). A payload whose msgpack
// structure is broken (truncated, neither an array nor a map, trailing
// bytes, a batch map without ts or events) fails as a whole with an error
// wrapping ErrMalformedBatch that says where. An event that is well-formed
// msgpack but not a valid event (unknown type, a field of the wrong type
// or range, an unknown medium) is left out of Batch.Events and reported in
// Batch.Skipped with its index and reason; the other events of the batch
// still apply.
//
// Hostile input never allocates more than the payload's own size: every
// length a header claims is checked against the bytes that remain.
//
// Encode and EncodeWith are the inverse: the project's one writer of the
// wire format, in the variants engines differ in (array or map batches;
// tagged maps or arrays; unsigned, signed or 32-byte digest hashes;
// kv_cache_spec_kind or not).
// Simulators (internal/sim/enginesim), benchmarks and tests build payloads
// with it.
package events
