package bridge

import (
	"strconv"

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

// batchRecord is the record of one engine batch: key = pod, value = the
// payload exactly as received (not copied), headers model, seq, dp_rank.
func (b *Bridge) batchRecord(seq uint64, payload []byte) *kgo.Record {
	return &kgo.Record{
		Key:   b.key,
		Value: payload,
		Headers: []kgo.RecordHeader{
			{Key: HeaderModel, Value: b.model},
			{Key: HeaderSeq, Value: strconv.AppendUint(nil, seq, 10)},
			{Key: HeaderDPRank, Value: b.rank},
		},
	}
}

// controlRecord is a kind record: no value, headers model, dp_rank, kind.
func (b *Bridge) controlRecord(kind string) *kgo.Record {
	return &kgo.Record{
		Key: b.key,
		Headers: []kgo.RecordHeader{
			{Key: HeaderModel, Value: b.model},
			{Key: HeaderDPRank, Value: b.rank},
			{Key: HeaderKind, Value: []byte(kind)},
		},
	}
}

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
