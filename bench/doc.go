// Package bench holds kvindex's measuring instruments: the code behind
// `kvindex-bench fleet|ingest|lookup|coldstart` and the Go benchmarks of
// the hot paths (`make bench`), so each figure is measured by one
// implementation whichever way it is run.
//
// Every figure is reported next to a reference measured in the same run
// on the same machine (the machines are shared and noisy): a bare Go map
// probe for Lookup, the same etcd transactions written straight to etcd
// for ingest, one unpaged Get for a cold start. A Figure carries the value,
// the reference, their ratio and the DESIGN goal it is held to
// ("Performance goals"); BENCHMARKS.md records them with the commands.
//
// The workload comes from a request trace (Mooncake's conversation trace,
// bundled as testdata/mooncake/conversation_trace.jsonl): internal/sim/fleetsim
// serves it on a simulated fleet of LRU GPU+CPU caches and emits the vLLM
// KV-event batches they would publish (BuildStream); Lookup and cold-start
// indexes hold (block, endpoint, tier) entries of salted copies of the
// trace (TraceEntries).
//
// The v1 keyspace layout (one key per block, v1layout.go) lives on here,
// and only here, as the reference of the v2 figures: its raw writer
// builds, from the same stream, the transactions a v1 ingester would
// commit, and the cold start loads the same fleet in both layouts.
//
// Everything runs in this process: embedded etcd (fsync on unless a
// Setup turns it off), franz-go's
// kfake broker, ingesters and indexd replicas, all sharing the machine's
// cores with the load generator, as BENCHMARKS.md states.
//
// Not production code: only the `kvindex-bench` command
// (cmd/kvindex-bench) and the routing simulator's report link it;
// cmd/kvindex's deps test keeps it out of the product binary.
package bench
