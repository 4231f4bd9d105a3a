// Package enginesim is a Go stand-in for a model server's KV-event
// publisher, built to behave like vLLM's ZmqEventPublisher on the wire, so
// the bridge (and later the whole pipeline) can be tested and benchmarked
// without a model server:
//
//   - a PUB socket sending three-frame messages [topic, seq, payload], seq an
//     8-byte big-endian counter starting at 0 per engine process, dropping
//     messages for a subscriber whose queue is full (libzmq's send high-water
//     mark) and sending nothing to a subscriber before its subscription
//     arrives (ZMQ's slow joiner);
//   - an optional ROUTER replay socket: a DEALER or REQ client sends
//     [empty, start_seq]; the engine answers [empty, seq, payload] for every
//     buffered batch with seq >= start_seq, then the end marker
//     [empty, 0xFFFFFFFFFFFFFFFF, empty]. The buffer keeps the newest
//     Config.BufferSize batches (vLLM's buffer_steps);
//   - fault knobs: DropNext (PUB drops), DropReplay (holes in a replay
//     answer, as a ROUTER drops past its high-water mark), DisconnectAll (a
//     network blip), Restart (a new engine process: seq back to 0, buffer
//     cleared, same addresses) and Close (the engine is gone).
//
// It also builds realistic KVEventBatch payloads (Batch, BlockStored,
// BlockRemoved, AllBlocksCleared) in vLLM's tagged-map or tagged-array
// msgpack encodings, written by the project's one encoder
// (events.EncodeWith), and generates event streams (Workload) whose
// expected final state is known, for tests and benchmarks.
//
// The sockets speak ZMTP 3.0 with the NULL mechanism through
// github.com/go-zeromq/zmq4's connection layer (zmq4.Open on a net.Conn).
// The package does not use zmq4's Socket types: their PUB writer goroutine is
// never stopped by Close and their readers block on an unguarded channel
// send, which goleak reports; every goroutine here is owned by the Engine
// and stopped by Close.
//
// Not production code (internal/sim): the bridge tests, the e2e tests
// and `kvindex bridge`'s own tests use it; nothing in the binary does.
package enginesim
