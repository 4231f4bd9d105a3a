package gie

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Error kinds (the kind label of kvindex_gie_lookup_errors_total and the
// reason label of kvindex_gie_fallbacks_total).
const (
	KindUnavailable = "unavailable" // no indexd replica answered
	KindDeadline    = "deadline"    // a timeout or the PrepareData budget passed
	KindTokenize    = "tokenize"    // the tokenizer failed
	KindNoPrompt    = "no_prompt"   // nothing to tokenize (an unsupported API)
	KindIdentity    = "identity"    // an endpoint had no kvindex identity
	KindInvalid     = "invalid"     // indexd refused the request
	KindOther       = "other"
	// KindPartial is a cell-mode answer some cell of the model did not
	// give (client.LookupResult.Partial): the other cells' matches are
	// used, the missing cell's candidates get none.
	KindPartial = "partial"
	// KindStale is an answer older than maxStaleness (ErrStale): every
	// replica the client asked was that far behind etcd, so the answer
	// is not used.
	KindStale = "stale"
)

// Metrics are the plugins' Prometheus metrics. One Metrics is shared by
// every plugin instance Register's factories build; it is a
// prometheus.Collector, registered by the caller on the EPP's registry
// (cmd/kvindex-epp passes it to the runner's WithCustomCollectors, which
// registers it on controller-runtime's metrics registry, the one the EPP
// serves).
type Metrics struct {
	lookups     prometheus.Counter
	errors      *prometheus.CounterVec
	lookupSecs  prometheus.Histogram
	tokenize    prometheus.Histogram
	prepare     prometheus.Histogram
	fallbacks   *prometheus.CounterVec
	matchRatio  prometheus.Histogram
	speculative prometheus.Counter
	mismatch    *prometheus.CounterVec
	unknown     *prometheus.CounterVec
}

// NewMetrics returns unregistered metrics.
func NewMetrics() *Metrics {
	lat := []float64{.0005, .001, .002, .005, .01, .02, .05, .1, .2, .4, 1}
	m := &Metrics{
		lookups: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvindex_gie_lookups_total",
			Help: "Token-mode Lookups the producer sent to kvindex.",
		}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvindex_gie_lookup_errors_total",
			Help: "Requests the producer could not answer from kvindex, by kind (unavailable, deadline, tokenize, no_prompt, identity, invalid, partial, stale, other).",
		}, []string{"kind"}),
		lookupSecs: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvindex_gie_lookup_seconds",
			Help:    "Latency of the producer's Lookups (failed ones included).",
			Buckets: lat,
		}),
		tokenize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvindex_gie_tokenize_seconds",
			Help:    "Latency of the producer's tokenize calls (failed ones included).",
			Buckets: lat,
		}),
		prepare: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvindex_gie_prepare_seconds",
			Help:    "Time the producer's PrepareRequestData took, tokenizing and lookup included.",
			Buckets: lat,
		}),
		fallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvindex_gie_fallbacks_total",
			Help: "Requests scheduled without kvindex's answer, by fallback mode (approximate, none) and reason (the error kinds).",
		}, []string{"mode", "reason"}),
		matchRatio: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvindex_gie_match_ratio",
			Help:    "Per answered request, the best candidate's matched blocks over the prompt's blocks.",
			Buckets: []float64{0, .1, .2, .3, .4, .5, .6, .7, .8, .9, 1},
		}),
		speculative: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvindex_gie_speculative_blocks_total",
			Help: "Blocks credited to candidates from speculative entries beyond the index's answer.",
		}),
		mismatch: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvindex_gie_identity_mismatch_total",
			Help: "Checks that found the index holding endpoints of the model while no candidate endpoint equals any of them under the configured podIdentity and ranks, by kvindex model.",
		}, []string{"model"}),
		unknown: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvindex_gie_unknown_model_total",
			Help: "Checks that found a request's kvindex model (after the models mapping) without endpoints in the index while a configured base model has some, by kvindex model (at most 32 names, the rest as \"other\").",
		}, []string{"model"}),
	}
	// Every error kind and fallback series exists from the start, so a
	// rate over one is 0, not absent (the alerting rules of
	// deploy/observability select kind="identity").
	kinds := []string{KindUnavailable, KindDeadline, KindTokenize, KindNoPrompt, KindIdentity, KindInvalid, KindPartial, KindStale, KindOther}
	for _, k := range kinds {
		m.errors.WithLabelValues(k)
		for _, mode := range []string{FallbackApproximate, FallbackNone} {
			m.fallbacks.WithLabelValues(mode, k)
		}
	}
	return m
}

func (m *Metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.lookups, m.errors, m.lookupSecs, m.tokenize, m.prepare, m.fallbacks, m.matchRatio, m.speculative, m.mismatch, m.unknown}
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.collectors() {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.collectors() {
		c.Collect(ch)
	}
}
