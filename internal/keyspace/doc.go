// Package keyspace owns kvindex's etcd key schema (DESIGN "etcd keyspace"):
// it is the only place that builds or parses a key or a stored value, so
// the ingester (the writer), indexd (the reader) and operators' etcdctl
// commands agree byte for byte.
//
// Every key lives under a configurable prefix (default "/kvindex/v2/"):
//
//	chunks/{model}/{pod}/{rank}/{tier}/{seq:016x}    up to --chunk-size blocks (binary; default 24, readers accept 256)
//	endpoints/{model}/{pod}/{rank}                    EndpointRecord (JSON)
//	owners/{topic}/{partition}                        OwnerRecord (JSON)
//	offsets/{topic}/{partition}                       next offset (decimal)
//	ingesters/{id}                                    IngesterRecord (JSON)
//
// Model, pod, topic and ingester-id segments are escaped with
// url.PathEscape exactly, so "team-a/vllm 0@10.0.0.5:8000" becomes
// "team-a%2Fvllm%200@10.0.0.5:8000" and no segment ever contains '/'.
// Parsing is strict: a segment must be the canonical escape of its name,
// the rank and partition canonical decimals, the tier one of gpu, cpu,
// disk, and the chunk sequence exactly 16 lower-case hex digits; anything
// else is ErrMalformedKey. A chunk value is one byte of entry width (8 or
// 16) and then its entries (chunks.go); ParseChunkValue checks it.
//
// Invariant the writer keeps and the reader relies on: an endpoint's
// endpoints/ record is written at or before the revision of any of its
// chunks/ keys, and deleted together with or after the last of them, so a
// reader that lists endpoints/ and then each endpoint's chunks/ range at
// one revision sees every block.
package keyspace
