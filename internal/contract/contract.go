// Package contract defines, once, the names and defaults the parts of
// kvindex agree on without importing each other: the header names, kind
// values and payload format of the Kafka record contract (DESIGN "Kafka
// record contract"), which the bridge produces and the ingester, the
// replay command and the reference model read; the default topic and
// consumer group; and the default addresses `kvindex standalone` listens on
// and the other commands dial when given none.
//
// The etcd keyspace, the other contract, lives in internal/keyspace.
package contract

// Record header names (DESIGN "Kafka record contract").
const (
	// HeaderModel carries the served model name; required on every record.
	HeaderModel = "model"
	// HeaderSeq carries the engine's ZMQ sequence number in decimal, on
	// batch records.
	HeaderSeq = "seq"
	// HeaderDPRank carries the endpoint's data-parallel rank in decimal;
	// needed on records without a value.
	HeaderDPRank = "dp_rank"
	// HeaderKind marks a control record (no value): KindHeartbeat,
	// KindGoodbye or KindResync.
	HeaderKind = "kind"
	// HeaderIncarnation carries an engine process identity when the
	// producer knows one (the bridge never does: see docs/bridge.md).
	HeaderIncarnation = "incarnation"
	// HeaderFormat names the value's encoding; absent means FormatVLLM.
	HeaderFormat = "format"
)

// Values of HeaderKind: the control records of DESIGN semantics 8.
const (
	// KindHeartbeat only refreshes the endpoint's liveness.
	KindHeartbeat = "heartbeat"
	// KindGoodbye drops the endpoint: its engine is gone.
	KindGoodbye = "goodbye"
	// KindResync drops the endpoint's blocks and keeps the endpoint: the
	// producer lost batches it could not recover.
	KindResync = "resync"
)

// FormatVLLM is the one value of HeaderFormat kvindex decodes: vLLM's
// msgpack KVEventBatch, as published on ZMQ.
const FormatVLLM = "vllm-msgpack"

// Defaults shared by the components and the commands.
const (
	// DefaultTopic is the KV-event topic.
	DefaultTopic = "kvindex-events"
	// DefaultGroup is the ingesters' consumer group.
	DefaultGroup = "kvindex-ingester"
	// DefaultEtcdAddr is etcd's client host:port.
	DefaultEtcdAddr = "127.0.0.1:2379"
	// DefaultEtcdEndpoint is DefaultEtcdAddr as an etcd client URL.
	DefaultEtcdEndpoint = "http://" + DefaultEtcdAddr
	// DefaultKafkaAddr is the Kafka broker's host:port.
	DefaultKafkaAddr = "127.0.0.1:9092"
	// DefaultGRPCAddr is indexd's gRPC host:port.
	DefaultGRPCAddr = "127.0.0.1:50051"
	// DefaultMetricsAddr is the ops HTTP server's host:port (/metrics,
	// /healthz, /readyz).
	DefaultMetricsAddr = "127.0.0.1:9090"
)
