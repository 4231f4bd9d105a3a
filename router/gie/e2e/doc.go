// Package e2e tests kvindex's EPP plugin (router/gie) against the real
// kvindex pipeline in process: embedded etcd, the kfake Kafka broker, an
// ingester in token mode and indexd (wiring/stack), fed vLLM-format KV
// event batches as the bridge produces them, with requests going through
// GIE's director (router/gie/internal/epptest). It is a module of its own
// (github.com/kvindex/kvindex/router/gie/e2e) so that the main module's
// dependencies never enter what kvindex-epp is built from. The
// routing-quality simulator (cmd/kvindex-sim, internal/sim) lives here for
// the same reason: it runs the plugin and the pipeline together.
package e2e
