package ingester

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	"github.com/kvindex/kvindex/internal/events"
	"github.com/kvindex/kvindex/internal/ingesttest"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/testutil"
)

// benchRecords builds the workload: pods records each, per pod a chained
// BlockStored of storeN new blocks and, from the 9th record on, a
// BlockRemoved of the blocks it stored 8 records earlier (LRU churn, far
// enough back that a batch window rarely coalesces it away).
func benchRecords(b *testing.B, topic string, pods, perPod, storeN int) []*kgo.Record {
	b.Helper()
	var out []*kgo.Record
	now := time.Now()
	for i := 0; i < perPod; i++ {
		for p := 0; p < pods; p++ {
			base := uint64(p)<<40 | uint64(i*storeN)
			hs := make([]uint64, storeN)
			for k := range hs {
				hs[k] = (base + uint64(k)) * 0x9e3779b97f4a7c15
			}
			evs := []events.Event{{Type: events.BlockStored, BlockHashes: hs, BlockSize: 16, Medium: "GPU"}}
			if i >= 8 {
				old := uint64(p)<<40 | uint64((i-8)*storeN)
				rm := make([]uint64, storeN)
				for k := range rm {
					rm[k] = (old + uint64(k)) * 0x9e3779b97f4a7c15
				}
				evs = append(evs, events.Event{Type: events.BlockRemoved, BlockHashes: rm, Medium: "GPU"})
			}
			v, err := events.Encode(events.Batch{TS: float64(now.UnixNano())/1e9 + float64(i), Events: evs}, events.EncodingMap)
			if err != nil {
				b.Fatal(err)
			}
			out = append(out, &kgo.Record{Topic: topic, Key: []byte(fmt.Sprintf("bench/vllm-%d", p)), Value: v,
				Headers: []kgo.RecordHeader{{Key: "model", Value: []byte("bench/model")}, {Key: "seq", Value: []byte(strconv.Itoa(i))}}})
		}
	}
	return out
}

// BenchmarkIngest measures block ops/s through Kafka → ingester → etcd
// against the same transactions written straight to etcd by the same
// number of concurrent writers (one per partition), in the same run (DESIGN
// "Performance goals": goal ≥ 80%).
//
// Each iteration produces the records to a fresh topic, then: a capture run
// records the ingester's transactions; the reference replays them (leases
// granted afresh, the guard re-pointed at its own owner keys) with one
// writer per partition; a timed ingester run works through the same
// records. Each of the three runs gets a fresh embedded etcd, so both
// measured runs start from the same empty database; their order
// alternates between iterations.
func BenchmarkIngest(b *testing.B) {
	const partitions = 4
	e := newBenchEnv(b, partitions)
	ctx := context.Background()
	var ingestOps, refOps int64
	var ingestTime, refTime, wallTime time.Duration
	for it := 0; it < b.N; it++ {
		b.StopTimer()
		topic := fmt.Sprintf("bench-%d", it)
		if err := e.createTopic(ctx, topic, partitions); err != nil {
			b.Fatal(err)
		}
		end := ingesttest.ProduceKafka(b, ctx, e.prod, benchRecords(b, topic, 32, benchPerPod, 32))

		// Capture run.
		var mu sync.Mutex
		captured := map[int32][]*pb.TxnRequest{}
		capEtcd := e.freshEtcd(b)
		capCfg := e.config(b, capEtcd, topic, "/kvindex/v1/")
		capCfg.txnObserver = func(p int32, req any) {
			c := proto.Clone(req.(*pb.TxnRequest)).(*pb.TxnRequest)
			mu.Lock()
			captured[p] = append(captured[p], c)
			mu.Unlock()
		}
		e.ingest(b, ctx, capCfg, end)
		capEtcd.Stop()

		reference := func() {
			etcd := e.freshEtcd(b)
			defer etcd.Stop()
			ops, d := e.replay(b, ctx, etcd, captured, capCfg.Keyspace, topic)
			refOps += ops
			refTime += d
		}
		timed := func() {
			etcd := e.freshEtcd(b)
			defer etcd.Stop()
			cfg := e.config(b, etcd, topic, "/kvindex/v1/")
			var first time.Time
			var blockOps int64
			cfg.BeforeTxn = func(_ context.Context, info TxnInfo) error {
				mu.Lock()
				if first.IsZero() {
					first = time.Now()
				}
				blockOps += int64(info.BlockOps)
				mu.Unlock()
				return nil
			}
			b.StartTimer()
			began := time.Now()
			done := e.ingest(b, ctx, cfg, end)
			b.StopTimer()
			ingestOps += blockOps
			ingestTime += done.Sub(first)
			wallTime += done.Sub(began)
		}
		if it%2 == 0 {
			reference()
			timed()
		} else {
			timed()
			reference()
		}
	}
	ingestRate := float64(ingestOps) / wallTime.Seconds()
	refRate := float64(refOps) / refTime.Seconds()
	// Ingest is timed from Run's start (group join and first fetch
	// included) to the moment every stored offset is past the produced
	// records; "steady" from its first transaction to the same moment.
	b.ReportMetric(ingestRate, "ingest-block-ops/s")
	b.ReportMetric(float64(ingestOps)/ingestTime.Seconds(), "ingest-steady-block-ops/s")
	b.ReportMetric(refRate, "raw-etcd-block-ops/s")
	b.ReportMetric(ingestRate/refRate, "ratio")
	b.ReportMetric(0, "ns/op")
}

type benchEnv struct {
	kafka *testutil.Kafka
	prod  *kgo.Client
}

func newBenchEnv(b *testing.B, partitions int32) *benchEnv {
	k := testutil.StartKafka(b, "bench-seed", partitions, kfake.GroupMinSessionTimeout(100*time.Millisecond))
	return &benchEnv{kafka: k, prod: ingesttest.NewProducer(b, k.Brokers)}
}

// freshEtcd starts an empty embedded etcd (stopped by the caller or at the
// end of the benchmark).
func (e *benchEnv) freshEtcd(b *testing.B) *testutil.Etcd { return testutil.StartEtcd(b) }

func (e *benchEnv) createTopic(ctx context.Context, topic string, partitions int32) error {
	resp, err := kadm.NewClient(e.prod).CreateTopic(ctx, partitions, 1, nil, topic)
	if err == nil {
		err = resp.Err
	}
	return err
}

func (e *benchEnv) config(b *testing.B, etcd *testutil.Etcd, topic, prefix string) Config {
	ks, err := keyspace.New(prefix)
	if err != nil {
		b.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Etcd = etcd.Client
	cfg.Brokers = e.kafka.Brokers
	cfg.Topic = topic
	cfg.Group = fmt.Sprintf("g-%s-%p", topic, etcd)
	cfg.Keyspace = ks
	cfg.SessionTimeout = time.Second
	cfg.RebalanceTimeout = 1500 * time.Millisecond
	cfg.Logger = testLogger()
	return cfg
}

// ingest runs an ingester until it has stored offsets past end, and
// returns when that was seen.
func (e *benchEnv) ingest(b *testing.B, ctx context.Context, cfg Config, end ingesttest.Offsets) time.Time {
	in, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- in.Run(rctx) }()
	ingesttest.WaitApplied(b, ctx, cfg.Etcd, cfg.Keyspace, cfg.Topic, end)
	done := time.Now()
	cancel()
	if err := <-errc; err != nil {
		b.Fatal(err)
	}
	return done
}

// replay writes the captured transactions to etcd, one writer per
// partition, and returns the block ops written and the time taken. The
// captured leases are replaced by leases granted in etcd, and the guards
// by the revisions of owner keys written here.
func (e *benchEnv) replay(b *testing.B, ctx context.Context, etcd *testutil.Etcd, captured map[int32][]*pb.TxnRequest, ks keyspace.Keyspace, topic string) (int64, time.Duration) {
	cli := etcd.Client
	leases := map[int64]int64{}
	blockPrefix := []byte(ks.BlocksPrefix())
	var ops int64
	for p, txns := range captured {
		resp, err := cli.Put(ctx, ks.OwnerKey(keyspace.Partition{Topic: topic, Partition: p}), "reference")
		if err != nil {
			b.Fatal(err)
		}
		for _, t := range txns {
			for _, c := range t.Compare {
				c.TargetUnion = &pb.Compare_ModRevision{ModRevision: resp.Header.Revision}
			}
			for _, op := range t.Success {
				var k []byte
				switch r := op.Request.(type) {
				case *pb.RequestOp_RequestPut:
					k = r.RequestPut.Key
					if id := r.RequestPut.Lease; id != 0 {
						if _, ok := leases[id]; !ok {
							g, err := cli.Grant(ctx, int64(DefaultLeaseTTL/time.Second))
							if err != nil {
								b.Fatal(err)
							}
							leases[id] = int64(g.ID)
						}
						r.RequestPut.Lease = leases[id]
					}
				case *pb.RequestOp_RequestDeleteRange:
					k = r.RequestDeleteRange.Key
				}
				if bytes.HasPrefix(k, blockPrefix) {
					ops++
				}
			}
		}
	}
	kv := clientv3.RetryKVClient(cli)
	var wg sync.WaitGroup
	errs := make(chan error, len(captured))
	start := time.Now()
	for _, txns := range captured {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, t := range txns {
				resp, err := kv.Txn(ctx, t)
				if err == nil && !resp.Succeeded {
					err = fmt.Errorf("reference transaction guard failed")
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	d := time.Since(start)
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	return ops, d
}

// benchPerPod is how many records each pod sends per iteration.
var benchPerPod = 120
