// The router's library as a module of its own, so a router's module graph
// holds gRPC, protobuf, CBOR and XXH3 (github.com/zeebo/xxh3, the token
// key's hash, with its CPU-feature probe), not the main module's etcd, Kafka,
// Kubernetes or Prometheus (deps_test.go checks it).
module github.com/kvindex/kvindex/client

go 1.26.0

require (
	github.com/fxamacker/cbor/v2 v2.10.0
	github.com/google/go-cmp v0.7.0
	github.com/kvindex/kvindex/proto v0.0.0-00010101000000-000000000000
	github.com/zeebo/xxh3 v1.1.0
	go.uber.org/goleak v1.3.0
	google.golang.org/grpc v1.85.0
	google.golang.org/protobuf v1.36.12
)

require (
	github.com/klauspost/cpuid/v2 v2.2.10 // indirect
	github.com/x448/float16 v0.8.4 // indirect
	golang.org/x/net v0.60.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	golang.org/x/text v0.42.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260817212433-ac3dfec99bb1 // indirect
)

replace github.com/kvindex/kvindex/proto => ../proto
