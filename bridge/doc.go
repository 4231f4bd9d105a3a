// Package bridge feeds model-server endpoints into kvindex. In the dial
// mode it is the sidecar of one endpoint; in the bind mode (Config.Listen)
// one bridge takes every engine that connects to it, as llm-d fleets
// publish, each pod named by its topic and sequenced on its own (bind.go).
// What follows describes one endpoint's stream, which both modes share.
//
// In the dial mode it subscribes to the engine's ZMQ PUB socket (vLLM's
// ZmqEventPublisher and engines that copy it), heals sequence gaps from the
// engine's ROUTER replay socket, and produces one Kafka record per batch
// following the DESIGN record contract: key = pod, value = the batch bytes
// exactly as published, headers model, seq and dp_rank. It adds control
// records: kind=heartbeat while the engine is connected, kind=resync when
// batches were lost for good, kind=goodbye when the engine goes away at
// shutdown.
//
// Delivery contract. Within one Run, batch records are produced in the
// engine's sequence order with no gap the bridge knows of and does not
// mark: every batch it could not obtain is replaced by a resync record
// before the next batch. Batches may be produced twice (replayed after a
// reconnect or a bridge restart, always in sequence order); the ingester
// skips them by seq and ts (semantics 7). The bridge keeps no state that
// must survive a restart: a fresh bridge replays the engine's whole buffer
// from seq 0, and never produces a resync or a goodbye just because it
// restarted, so a sidecar-only restart keeps the endpoint's blocks. It
// sets no incarnation header (see docs/bridge.md).
//
// The Kafka side is franz-go's idempotent producer with acks=all and a
// bounded buffer: a slow or unavailable Kafka blocks the bridge
// (backpressure, bounded memory) and is retried for as long as the bridge
// runs; ZMQ then drops what the engine publishes meanwhile, which the
// bridge heals from the replay socket or marks with a resync.
package bridge
