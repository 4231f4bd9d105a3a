// Package ingesttest holds the helpers the ingester's tests share: produce
// reference-model records to Kafka, wait for the ingester to store offsets
// past them (a barrier, never a sleep), and read the index back from etcd.
package ingesttest

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/scenario"
	"github.com/kvindex/kvindex/internal/sim/refmodel"
)

// Offsets maps a partition to the last offset produced to it.
type Offsets map[int32]int64

// Merge raises o's offsets to those of other.
func (o Offsets) Merge(other Offsets) {
	for p, off := range other {
		if cur, ok := o[p]; !ok || off > cur {
			o[p] = off
		}
	}
}

// KafkaRecord turns a reference-model record into a Kafka record on topic.
// Header order is the map's sorted order, so produced bytes are stable.
func KafkaRecord(topic string, r refmodel.Record) *kgo.Record {
	pub := scenario.Publish{Headers: r.Headers}
	kr := &kgo.Record{Topic: topic, Key: []byte(r.Key), Value: r.Value, Timestamp: r.Time}
	for _, k := range pub.HeaderKeys() {
		kr.Headers = append(kr.Headers, kgo.RecordHeader{Key: k, Value: []byte(r.Headers[k])})
	}
	return kr
}

// Produce produces recs to topic in order, synchronously, and returns the
// last offset written to each partition.
func Produce(t testing.TB, ctx context.Context, cl *kgo.Client, topic string, recs []refmodel.Record) Offsets {
	t.Helper()
	krs := make([]*kgo.Record, len(recs))
	for i, r := range recs {
		krs[i] = KafkaRecord(topic, r)
	}
	return ProduceKafka(t, ctx, cl, krs)
}

// ProduceKafka produces krs in order, synchronously, and returns the last
// offset written to each partition.
func ProduceKafka(t testing.TB, ctx context.Context, cl *kgo.Client, krs []*kgo.Record) Offsets {
	t.Helper()
	out := Offsets{}
	const chunk = 512
	for len(krs) > 0 {
		n := min(chunk, len(krs))
		res := cl.ProduceSync(ctx, krs[:n]...)
		if err := res.FirstErr(); err != nil {
			t.Fatalf("producing: %v", err)
		}
		for _, r := range res {
			out.Merge(Offsets{r.Record.Partition: r.Record.Offset})
		}
		krs = krs[n:]
	}
	return out
}

// NewProducer returns a Kafka producer for tests that keeps record order
// per partition and the timestamps it is given.
func NewProducer(t testing.TB, brokers []string) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ProducerLinger(0), kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
		kgo.MaxBufferedRecords(1<<16), kgo.ProducerBatchMaxBytes(4<<20))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// StoredOffsets reads every partition's stored next offset of topic.
func StoredOffsets(ctx context.Context, cli *clientv3.Client, ks keyspace.Keyspace, topic string) (map[int32]int64, int64, error) {
	resp, err := cli.Get(ctx, ks.OffsetsPrefix(), clientv3.WithPrefix())
	if err != nil {
		return nil, 0, err
	}
	out := map[int32]int64{}
	for _, kv := range resp.Kvs {
		p, err := ks.ParseOffsetKey(string(kv.Key))
		if err != nil || p.Topic != topic {
			continue
		}
		if out[p.Partition], err = keyspace.ParseOffset(kv.Value); err != nil {
			return nil, 0, err
		}
	}
	return out, resp.Header.Revision, nil
}

// WaitApplied waits, by watching offsets/, until every partition in want
// has a stored next offset past want's offset, or fails the test when ctx
// ends.
func WaitApplied(t testing.TB, ctx context.Context, cli *clientv3.Client, ks keyspace.Keyspace, topic string, want Offsets) {
	t.Helper()
	for {
		got, rev, err := StoredOffsets(ctx, cli, ks, topic)
		if err != nil {
			t.Fatalf("reading offsets: %v", err)
		}
		done := true
		for p, off := range want {
			if got[p] <= off {
				done = false
			}
		}
		if done {
			return
		}
		wctx, cancel := context.WithCancel(ctx)
		wch := cli.Watch(wctx, ks.OffsetsPrefix(), clientv3.WithPrefix(), clientv3.WithRev(rev+1))
		select {
		case <-wch:
		case <-ctx.Done():
			cancel()
			t.Fatalf("waiting for offsets past %v: stored %v: %v", want, got, ctx.Err())
		}
		cancel()
	}
}

// WaitFor polls cond, waking on every change under prefix, until it
// returns true or ctx ends (then the test fails with what).
func WaitFor(t testing.TB, ctx context.Context, cli *clientv3.Client, prefix, what string, cond func() bool) {
	t.Helper()
	for {
		resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		if cond() {
			return
		}
		wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		wch := cli.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
		select {
		case <-wch:
		case <-ctx.Done():
			cancel()
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		}
		cancel()
	}
}

// Blocks reads every chunk under ks and returns the blocks they hold, one
// keyspace.Block per (endpoint, tier, key hash), sorted as refmodel sorts
// them. It fails the test on a malformed chunk key or value, and on a
// block held by two chunks of one (endpoint, tier) (DESIGN "etcd keyspace
// (v2)": a block is in at most one).
func Blocks(t testing.TB, ctx context.Context, cli *clientv3.Client, ks keyspace.Keyspace) []keyspace.Block {
	t.Helper()
	chunks := Chunks(t, ctx, cli, ks)
	out := make([]keyspace.Block, 0, len(chunks)*8)
	seen := make(map[keyspace.Block]string)
	for _, c := range chunks {
		for _, e := range c.Entries {
			b := keyspace.Block{Endpoint: c.Endpoint, Tier: c.Tier, Hash: e.Key}
			if other, dup := seen[b]; dup {
				t.Fatalf("block %016x of %s/%s is in two chunks: %s and %s", e.Key, c.Endpoint, c.Tier, other, c.Key)
			}
			seen[b] = c.Key
			out = append(out, b)
		}
	}
	refmodel.SortBlocks(out)
	return out
}

// Chunk is one chunk key under a keyspace, decoded: its key, its parts
// and its entries in order, and its value as stored.
type Chunk struct {
	Key string
	keyspace.Chunk
	Entries []keyspace.ChunkEntry
	Value   []byte
}

// Chunks reads every chunk key under ks, in key order, with its value
// decoded. It fails the test on a malformed chunk key or value.
func Chunks(t testing.TB, ctx context.Context, cli *clientv3.Client, ks keyspace.Keyspace) []Chunk {
	t.Helper()
	resp, err := cli.Get(ctx, ks.ChunksPrefix(), clientv3.WithPrefix())
	if err != nil {
		t.Fatalf("reading chunks: %v", err)
	}
	out := make([]Chunk, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		c, err := ks.ParseChunkKey(string(kv.Key))
		if err != nil {
			t.Fatalf("malformed chunk key in etcd: %v", err)
		}
		v, err := keyspace.ParseChunkValue(kv.Value)
		if err != nil {
			t.Fatalf("malformed chunk value of %s: %v", kv.Key, err)
		}
		out = append(out, Chunk{Key: string(kv.Key), Chunk: c, Entries: v.AppendEntries(nil), Value: kv.Value})
	}
	return out
}

// ChunkValues maps every chunk key under ks to its value: what two runs
// over the same records must agree on byte for byte (the chunk layout
// depends only on the op sequence).
func ChunkValues(t testing.TB, ctx context.Context, cli *clientv3.Client, ks keyspace.Keyspace) map[string]string {
	t.Helper()
	out := map[string]string{}
	prefix := ks.Prefix()
	for _, c := range Chunks(t, ctx, cli, ks) {
		out[strings.TrimPrefix(c.Key, prefix)] = fmt.Sprintf("%x", c.Value)
	}
	return out
}

// Endpoints reads every endpoint record under ks.
func Endpoints(t testing.TB, ctx context.Context, cli *clientv3.Client, ks keyspace.Keyspace) map[keyspace.Endpoint]keyspace.EndpointRecord {
	t.Helper()
	resp, err := cli.Get(ctx, ks.EndpointsPrefix(), clientv3.WithPrefix())
	if err != nil {
		t.Fatalf("reading endpoints: %v", err)
	}
	out := map[keyspace.Endpoint]keyspace.EndpointRecord{}
	for _, kv := range resp.Kvs {
		id, err := ks.ParseEndpointKey(string(kv.Key))
		if err != nil {
			t.Fatalf("malformed endpoint key: %v", err)
		}
		rec, err := keyspace.UnmarshalEndpointRecord(kv.Value)
		if err != nil {
			t.Fatalf("malformed endpoint record %s: %v", kv.Key, err)
		}
		out[id] = rec
	}
	return out
}

// SeqView is the part of an endpoint record two runs over the same records
// must agree on.
type SeqView struct {
	Seq         string
	BatchTS     float64
	Incarnation string
	BlockSize   uint32
}

// SeqViews projects endpoint records to what must match across runs.
func SeqViews(recs map[keyspace.Endpoint]keyspace.EndpointRecord) map[keyspace.Endpoint]SeqView {
	out := make(map[keyspace.Endpoint]SeqView, len(recs))
	for id, r := range recs {
		v := SeqView{BatchTS: r.BatchTS, Incarnation: r.Incarnation, BlockSize: r.BlockSize}
		if r.Seq != nil {
			v.Seq = strconv.FormatUint(*r.Seq, 10)
		}
		out[id] = v
	}
	return out
}

// LeaseOf returns the lease a key is attached to (0 when the key is absent).
func LeaseOf(ctx context.Context, cli *clientv3.Client, key string) (clientv3.LeaseID, error) {
	resp, err := cli.Get(ctx, key)
	if err != nil || len(resp.Kvs) == 0 {
		return 0, err
	}
	return clientv3.LeaseID(resp.Kvs[0].Lease), nil
}

// KVs returns every key under prefix with its value and lease.
func KVs(ctx context.Context, cli *clientv3.Client, prefix string) ([]*mvccpb.KeyValue, error) {
	resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	return resp.Kvs, nil
}

// Applied blocks until every partition in want has a stored next offset
// past want's offset (true), or ctx ends (false, with ctx's error).
func Applied(ctx context.Context, cli *clientv3.Client, ks keyspace.Keyspace, topic string, want Offsets) error {
	for {
		got, rev, err := StoredOffsets(ctx, cli, ks, topic)
		if err != nil {
			return err
		}
		done := true
		for p, off := range want {
			if got[p] <= off {
				done = false
			}
		}
		if done {
			return nil
		}
		wctx, cancel := context.WithCancel(ctx)
		wch := cli.Watch(wctx, ks.OffsetsPrefix(), clientv3.WithPrefix(), clientv3.WithRev(rev+1))
		select {
		case <-wch:
		case <-ctx.Done():
		}
		cancel()
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}
