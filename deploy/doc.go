// Package deploy holds kvindex's Kubernetes manifests and the tests that
// prove them valid without a cluster.
//
// Layout (kustomize; see README.md in this directory):
//
//	base/                      etcd (StatefulSet), indexd, ingester, kvindex-config
//	components/etcd-client-tls mutual TLS on etcd's client port
//	overlays/dev               one replica of everything, small resources
//	overlays/prod              3 etcd members, 3 indexd, 3 ingesters
//	overlays/prod-tls          prod + components/etcd-client-tls
//	overlays/strimzi           prod + a Strimzi Kafka cluster and topic
//	examples/vllm-sidecar      vLLM with KV events and the kvindex bridge sidecar
//	examples/vllm-sidecar-dp   the same with 2 data-parallel ranks, a bridge per rank
//	Dockerfile                 the one image of every role (reviewed, not built, in CI)
//
// The package has no Go API. Its tests build every kustomization with the
// kustomize Go API (no network, no remote bases), decode every object
// strictly into its typed Kubernetes struct (unknown fields are errors),
// check Strimzi resources against the fields of their v1 API, and check
// that the objects agree with each other and with kvindex's contracts:
// ports, probes and Services; labels and selectors; images; each kvindex
// container's args, parsed by the real command tree (cli.NewRoot) and
// validated by the role's Config; etcd's configuration (parsed and
// validated by the same etcd version kvindex is built against); etcd
// client TLS, run for real with certificates issued as README.md
// documents; indexd's probes through an etcd outage, against a real
// `kvindex indexd`; the sizing formulas and figures of README.md; the vLLM
// sidecar wiring, data-parallel ranks included; and the Dockerfile's
// shape.
package deploy
