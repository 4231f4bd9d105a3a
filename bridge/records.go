package bridge

import (
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kvindex/kvindex/internal/contract"
)

// Record header names and kind values the bridge produces: those of the
// DESIGN "Kafka record contract", defined in internal/contract.
const (
	// HeaderModel carries the served model name (required on every record).
	HeaderModel = contract.HeaderModel
	// HeaderSeq carries the engine's ZMQ sequence number in decimal, on
	// batch records only.
	HeaderSeq = contract.HeaderSeq
	// HeaderDPRank carries the endpoint's data-parallel rank in decimal, on
	// every record the bridge produces.
	HeaderDPRank = contract.HeaderDPRank
	// HeaderKind marks a control record (no value): KindHeartbeat,
	// KindGoodbye or KindResync.
	HeaderKind = contract.HeaderKind
	// HeaderIncarnation would carry an engine process identity. The bridge
	// never sets it: it cannot see one that survives its own restart (see
	// docs/bridge.md).
	HeaderIncarnation = contract.HeaderIncarnation
)

// Kinds of control record (semantics 8).
const (
	// KindHeartbeat only refreshes the endpoint's liveness.
	KindHeartbeat = contract.KindHeartbeat
	// KindGoodbye drops the endpoint: its engine is gone.
	KindGoodbye = contract.KindGoodbye
	// KindResync drops the endpoint's blocks and keeps the endpoint: the
	// bridge lost batches it could not recover.
	KindResync = contract.KindResync
)

// recordKind names a record for metrics: its kind, or "batch" (the
// label values newMetrics starts at 0).
func recordKind(r *kgo.Record) string {
	for _, h := range r.Headers {
		if h.Key == HeaderKind {
			return string(h.Value)
		}
	}
	return "batch"
}
