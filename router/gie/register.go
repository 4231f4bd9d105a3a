package gie

import (
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
)

// Register adds kvindex's plugin types to the EPP's plugin registry
// (plugin.Register, a process-wide map the config loader reads):
// ProducerType ("kvindex-prefix-cache-producer") and TierScorerType
// ("kvindex-tier-scorer"). Call it before the runner loads its config.
//
// It returns the Metrics every producer built from the registry counts
// into; register them on the EPP's metrics registry (the runner's
// WithCustomCollectors does). A second call replaces the factories, and
// producers built afterwards count into the new Metrics.
func Register() *Metrics {
	m := NewMetrics()
	plugin.Register(ProducerType, ProducerFactory(m))
	plugin.Register(TierScorerType, TierScorerFactory)
	return m
}
