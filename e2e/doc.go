// Package e2e holds kvindex's end-to-end tests: the real binary (replay,
// standalone, the operator commands, etcdctl against its keys) and the
// public packages wired together as a deployment would wire them (Kafka →
// ingester → etcd → indexd replicas → client), checked against the
// reference model of internal/sim/refmodel on seeded random event streams, with
// restarts, rebalances and compactions along the way.
package e2e
