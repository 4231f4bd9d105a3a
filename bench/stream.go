package bench

import (
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kvindex/kvindex/internal/events"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/sim/fleetsim"
)

// StreamConfig shapes the KV-event stream of a simulated fleet serving a
// trace (BuildStream).
type StreamConfig struct {
	// Endpoints is the fleet's size (pods sim-00, sim-01, ..., rank 0).
	// Default 16.
	Endpoints int
	// GPUBlocks is each endpoint's LRU GPU cache, in blocks. Default 4096.
	GPUBlocks int
	// CPUBlocks is each endpoint's LRU CPU tier behind the GPU, in blocks;
	// -1 means none. Default 16384.
	CPUBlocks int
	// Requests is how many trace requests to serve, from the start; 0 (or
	// more than the trace holds) means the whole trace.
	Requests int
}

// DefaultStreamConfig is the fleet `kvindex-bench fleet` and `ingest`
// simulate by default.
func DefaultStreamConfig() StreamConfig {
	return StreamConfig{Endpoints: 16, GPUBlocks: 4096, CPUBlocks: 16384}
}

// Record is one batch of the stream: what one endpoint's engine published
// after serving one request.
type Record struct {
	// Pod is the endpoint's pod, the Kafka record key.
	Pod string
	// Seq is the endpoint's batch sequence number (the `seq` header), 1
	// for its first batch.
	Seq uint64
	// Value is the vLLM msgpack KVEventBatch (tagged-map events).
	Value []byte
	// Events and BlockOps count the batch's events and their block hashes
	// (each a block stored in or removed from a tier).
	Events, BlockOps int
	// Hashes are the served request's block hashes (the engines'), the
	// prompt a router looks up in engine-hash mode.
	Hashes []uint64
	// Keys are the canonical token keys of the same blocks
	// (fleetsim.Fleet.Keys), the prompt a router that keys locally looks
	// up in token mode.
	Keys []uint64
}

// LookupKeys returns what a router looks up for r's request when the
// ingesters run in mode: Keys in token mode, else Hashes.
func (r *Record) LookupKeys(mode keyspace.HashMode) []uint64 {
	if mode == keyspace.HashModeToken {
		return r.Keys
	}
	return r.Hashes
}

// Stream is the ordered batches of a simulated fleet.
type Stream struct {
	Records []Record
	// Events, BlockOps and Bytes total the records'.
	Events, BlockOps, Bytes int
	// MaxBlockOps is the largest record's BlockOps.
	MaxBlockOps int
	// Stats are the fleet's cache outcomes.
	Stats fleetsim.Stats
}

// BuildStream serves cfg.Requests requests of trace round-robin on a
// simulated fleet (internal/sim/fleetsim: an LRU GPU cache per endpoint with an
// LRU CPU tier behind it) and returns the batches its caches emit, one per
// request that changed something (a request served entirely from GPU emits
// nothing), with batch timestamps one millisecond apart from now.
func BuildStream(trace []fleetsim.Request, cfg StreamConfig) (*Stream, error) {
	if len(trace) == 0 {
		return nil, fmt.Errorf("bench: empty trace")
	}
	d := DefaultStreamConfig()
	if cfg.Endpoints == 0 {
		cfg.Endpoints = d.Endpoints
	}
	if cfg.GPUBlocks == 0 {
		cfg.GPUBlocks = d.GPUBlocks
	}
	if cfg.CPUBlocks == 0 {
		cfg.CPUBlocks = d.CPUBlocks
	}
	if cfg.Requests == 0 {
		cfg.Requests = len(trace)
	}
	if cfg.Endpoints < 1 || cfg.GPUBlocks < 1 || cfg.Requests < 0 || cfg.CPUBlocks < -1 {
		return nil, fmt.Errorf("bench: stream needs endpoints (%d), GPU blocks (%d) and requests (%d)", cfg.Endpoints, cfg.GPUBlocks, cfg.Requests)
	}
	if cfg.Requests > len(trace) {
		cfg.Requests = len(trace)
	}
	f, err := fleetsim.New(fleetsim.Config{Endpoints: cfg.Endpoints, GPUBlocks: cfg.GPUBlocks, CPUBlocks: cfg.CPUBlocks})
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	seq := make([]uint64, cfg.Endpoints)
	s := &Stream{}
	now := float64(time.Now().UnixNano()) / 1e9
	for n, req := range trace[:cfg.Requests] {
		i, evs := f.Serve(req)
		if len(evs) == 0 {
			continue
		}
		payload, err := events.Encode(events.Batch{TS: now + float64(n)/1000, Events: evs}, events.EncodingMap)
		if err != nil {
			return nil, fmt.Errorf("bench: encoding a batch: %w", err)
		}
		seq[i]++
		r := Record{Pod: f.Pod(i), Seq: seq[i], Value: payload, Events: len(evs), Hashes: f.Hashes(req), Keys: f.Keys(req)}
		for _, ev := range evs {
			r.BlockOps += len(ev.BlockHashes)
		}
		s.Records = append(s.Records, r)
		s.Events += r.Events
		s.BlockOps += r.BlockOps
		s.Bytes += len(payload)
		s.MaxBlockOps = max(s.MaxBlockOps, r.BlockOps)
	}
	s.Stats = f.Stats
	return s, nil
}

// KafkaRecord returns record i as a Kafka record on topic: key the pod,
// headers `model` (Model) and `seq`, as a bridge produces it.
func (s *Stream) KafkaRecord(topic string, i int) *kgo.Record {
	r := &s.Records[i]
	return &kgo.Record{
		Topic: topic,
		Key:   []byte(r.Pod),
		Value: r.Value,
		Headers: []kgo.RecordHeader{
			{Key: "model", Value: []byte(Model)},
			{Key: "seq", Value: []byte(strconv.FormatUint(r.Seq, 10))},
		},
	}
}
