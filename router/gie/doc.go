// Package gie is kvindex's plugin for the endpoint picker (EPP) of the
// Gateway API Inference Extension (module
// sigs.k8s.io/gateway-api-inference-extension, v1.5.0, the last release
// with the EPP framework).
//
// Register adds two plugin types to the EPP's registry:
//
//   - kvindex-prefix-cache-producer (ProducerType): a PrepareData and
//     PreRequest plugin. Before scheduling it tokenizes the prompt (or
//     takes the tokens an upstream plugin left in the request), looks the
//     tokens up in kvindex with the candidate endpoints as the filter, and
//     puts on every candidate the PrefixCacheMatchInfo attribute the stock
//     prefix-cache-scorer reads, plus a TierMatch attribute. After
//     scheduling it remembers the chosen endpoint's prompt blocks for a
//     short TTL from the decision (speculative entries, never renewed, and
//     dropped once the index has caught up), so back-to-back requests with
//     a new prefix meet on one endpoint before its KV events reach the
//     index. When a Lookup matches no candidate it checks, at a bounded
//     rate, for a pod-identity mismatch or an unknown model, and counts
//     and logs what it finds.
//   - kvindex-tier-scorer (TierScorerType): an Affinity scorer of the
//     TierMatch attribute, weighing each matched block by the tier that
//     holds it.
//
// The producer lists PrefixCacheMatchInfoKey in Consumes as well as
// Produces, so the EPP's data-dependency order runs it after the
// approximate producer the config loader adds for the prefix scorer, and
// its answer overwrites the approximate one. Switching an EPP from the
// approximate guess to the live index is therefore one added plugin entry
// (docs/router.md).
//
// The core (tokens → Lookup → per-endpoint match) is free of GIE types:
// Matcher works on Prompt, Identity and EndpointMatch and reaches kvindex
// through the small Index interface, so an adapter for another router
// (llm-d's, whose DataProducer and PrefixCacheMatchInfo have the same
// shape) is one thin file. producer.go and tierscorer.go are the GIE
// adapter.
//
// Failure: when kvindex is unreachable, the tokenizer fails or a deadline
// passes, the request is still scheduled. With fallback "approximate" (the
// default) the approximate producer's attribute stays in place; with
// "none" every candidate gets zero matches. Either way the fallback is
// counted (kvindex_gie_fallbacks_total) and logged at a bounded rate. No
// attribute is written after the PrepareData context has ended.
package gie
