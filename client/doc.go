// Package client is the Go library LLM routers use to ask kvindex which
// model-server endpoint holds which prefix blocks of a prompt: connect to
// the indexd replicas (New), ask with the prompt's token ids
// (LookupTokens: indexd keys them) or with block keys computed here
// (TokenKeys, kvindex's canonical key; or Hasher, vLLM's sha256_cbor
// hashes for engine-hash deployments) (Lookup), and turn the matches into
// scores (Score).
//
// # Token keys
//
// TokenKeys, TokenBlockKey, TokenBlockExtras and EventExtras are kvindex's
// one implementation of its canonical block key (docs/hashing.md): the
// ingester keys stored blocks with them, indexd keys token Lookups with
// them, and a router that hashes locally gets the same keys.
//
// It is a module of its own (github.com/kvindex/kvindex/client) and
// depends only on gRPC, protobuf, CBOR (for Hasher), XXH3
// (github.com/zeebo/xxh3, for the token keys) and kvindex's generated
// API: a router that requires it gets no etcd, Kafka, Kubernetes or
// Prometheus module.
//
// # Consistency contract
//
// Every LookupResult reflects exactly one etcd revision (Revision) of the
// index and the Kafka partition offsets it lists (AppliedOffsets: every
// record below a partition's listed next offset is reflected); an indexd
// replica never answers from half an ingester transaction. Different
// replicas may be at different revisions, so two calls balanced to two
// replicas can see the index move backwards by the watch lag between them
// (normally milliseconds). A router that must see the effect of records it
// produced itself passes WithBarrier with their (topic, partition, offset):
// the replica waits until it has applied them, or fails with
// ErrDeadlineExceeded naming the lagging partition.
//
// Every LookupResult also says how stale it may be: ProgressTime is when
// the answering replica last heard from etcd that its index was current
// (replicas ask every second). During an etcd outage replicas keep
// answering from their last state, and ProgressTime stops moving. When an
// answer is older than WithStaleAfter (default 3 s) the client avoids
// that replica for that long, for all of its calls, and asks another, up
// to WithMaxAttempts calls, returning the freshest answer; when every
// replica is avoided calls go to them anyway, so a full outage costs one
// extra call per replica per WithStaleAfter, not a multiple of the load.
// A replica that runs out the client's deadline (WithTimeout) is avoided
// the same way.
//
// A match means the endpoint reported holding the blocks through its KV
// events; by the time the request arrives the engine may have evicted
// them. Scores are a routing hint, never a guarantee.
//
// # Calls
//
// Calls go round-robin over the replicas a target resolves to
// ("dns:///indexd.kvindex:50051", or a comma-separated list), passing over
// the ones the client avoids (above) while another is ready, carry a
// default deadline (WithTimeout, 1 s) unless the caller's context ends
// sooner, and are retried on another replica when one answers UNAVAILABLE
// (only then: WithMaxAttempts). Idle connections are pinged (KeepaliveTime)
// so a replica gone silent loses its connection. Errors wrap the sentinels ErrUnavailable,
// ErrInvalidArgument, ErrResourceExhausted, ErrDeadlineExceeded,
// ErrCanceled and ErrInternal. A request protobuf cannot carry (a name
// that is not valid UTF-8) is refused before it is sent, with
// ErrInvalidArgument.
//
// ListEndpoints walks the server's pages (ListEndpointsPage gives one at a
// time), so it works for any number of endpoints; each page reflects its
// own revision (EndpointList says which).
//
// # Cells
//
// A fleet past one etcd cluster runs several cells (independent kvindex
// stacks) and a cell map (package cellmap) that says which cell holds
// each model. New("", WithCells(src)) builds a client over the map:
//
//   - a Lookup of a model held by one cell goes to that cell's indexd, and
//     its answer is that cell's, as a one-target client's would be
//     (LookupResult.Cells names it);
//   - a Lookup of a model spread over K cells (or read from two while it
//     moves) goes to the cells in parallel, each call with its own
//     deadline, and their matches are merged: every endpoint lives in one
//     cell, so the merge is a union (an endpoint two cells report, which
//     only a move can cause, keeps the copy of its write cell and is
//     counted in Duplicates). The answer carries each cell's revision and
//     offsets (Cells); a cell that did not answer in time is listed in
//     Failed with its error, and the other cells' matches are returned
//     (Partial). A cell whose answer is stale past WithStaleAfter (its
//     indexd keeps answering from memory while its etcd is out of reach)
//     counts as not answering: its matches are left out, since a stale
//     answer may hold ghosts. Only when no cell answers does the call
//     fail;
//   - barrier records go only to the cell whose topic they name;
//   - ListEndpoints walks every cell's pages and merges them
//     (EndpointInfo.Cell); ListEndpointsPage pages through the cells in
//     map order, its tokens naming the cell.
//
// Each call reads the map once (src.Current()), so a map that changes
// while a call runs does not split it.
//
// # TLS
//
// The client speaks plaintext unless a TLS option is given. WithTLSCAFile
// verifies indexd against a CA bundle (WithTLS alone: the system roots),
// WithTLSCertFiles presents a client certificate to an indexd that
// requires one (--tls-client-ca-file), re-reading the files when they
// change, and WithTLSServerName sets the name the server's certificate
// must carry. A refused handshake fails calls with ErrUnavailable.
package client
