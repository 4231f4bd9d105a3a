// Package events decodes the KV-event batches model servers publish
// (DESIGN "Event wire format"): vLLM's msgpack KVEventBatch, and the
// engines that copy it (SGLang, TensorRT-LLM's vLLM-compatible publisher).
//
// A batch is the msgpack array [ts, events, data_parallel_rank]. Each event
// is either a tagged array ["BlockStored", block_hashes, ...] (engines that
// encode msgspec structs array_like) or a tagged map {"type":
// "BlockStored", "block_hashes": ...}. Both decode to the same Event. Fields
// the decoder does not know are ignored, and missing trailing fields are
// nil, as msgspec's omit_defaults encoding leaves them out.
//
// Errors come in two sizes (DESIGN semantics 6). A payload whose msgpack
// structure is broken (truncated, not an array, trailing bytes) fails as a
// whole with an error wrapping ErrMalformedBatch that says where. An event
// that is well-formed msgpack but not a valid event (unknown type, a field of
// the wrong type, an unknown medium, a KV-cache group other than 0) is left
// out of Batch.Events and reported in Batch.Skipped with its index and
// reason; the other events of the batch still apply.
//
// Hostile input never allocates more than the payload's own size: every
// length a header claims is checked against the bytes that remain.
//
// Encode and EncodeWith are the inverse: the project's one writer of the
// wire format, in the variants engines differ in (tagged maps or arrays;
// unsigned, signed or 32-byte digest hashes; kv_cache_spec_kind or not).
// Simulators (internal/sim/enginesim), benchmarks and tests build payloads
// with it.
package events
