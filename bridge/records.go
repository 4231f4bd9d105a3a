package bridge

import (
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kvindex/kvindex/internal/contract"
)

// recordKind names a record for metrics: its kind, or "batch" (the
// label values newMetrics starts at 0).
func recordKind(r *kgo.Record) string {
	for _, h := range r.Headers {
		if h.Key == contract.HeaderKind {
			return string(h.Value)
		}
	}
	return "batch"
}
