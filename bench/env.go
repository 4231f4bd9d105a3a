package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvindex/kvindex/indexd"
	"github.com/kvindex/kvindex/ingester"
	"github.com/kvindex/kvindex/internal/etcdembed"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/logging"
)

// Setup is how a benchmark runs the pipeline's stateful parts. Its zero
// value is what production runs: every etcd with fsync on and the
// ingesters in the ingester's default hash mode (token). The write-path
// benchmarks (ingest, fleet) take one; every figure they report carries
// its settings as the labels hash_mode and fsync.
type Setup struct {
	// HashMode is the ingesters' --hash-mode; empty means the ingester's
	// default (keyspace.HashModeToken). In token mode the ingesters key
	// each block from its token ids (the streams carry them) and the
	// freshness probes look up the token keys (Record.Keys).
	HashMode keyspace.HashMode
	// NoFsync runs every etcd with fsync off (embed's UnsafeNoFsync),
	// which no deployment does: for comparison with earlier figures only.
	NoFsync bool
	// ChunkSize is the ingesters' --chunk-size, the most blocks of a chunk
	// key (their merge threshold follows it: an eighth); zero means the
	// ingester's default (keyspace.DefaultChunkSize).
	ChunkSize int
	// ChunkOpenAt is the ingesters' --chunk-open-at, the chunk rule's
	// open threshold of a record; zero means the ingester's default
	// for the chunk size and linger (ingester.DefaultChunkOpenAt), the
	// chunk size itself turns it off.
	ChunkOpenAt int
	// WindowLinger is the ingesters' --window-linger; zero means the
	// ingester's default (ingester.DefaultWindowLinger), negative none.
	WindowLinger time.Duration
	// EtcdCPUs, when set, runs every etcd of the benchmark in a child
	// process pinned to these CPUs, and expects the caller to have pinned
	// this process to the others (PinOutsideEtcd): etcd has cores of its
	// own, as a deployed member has its machine. Empty: etcd runs in this
	// process, sharing every core. Figures carry it as the label
	// etcd_cpus ("shared" without a split).
	EtcdCPUs []int
}

// windowLinger is s.WindowLinger with its default filled in.
func (s Setup) windowLinger() time.Duration {
	switch {
	case s.WindowLinger == 0:
		return ingester.DefaultWindowLinger
	case s.WindowLinger < 0:
		return 0
	}
	return s.WindowLinger
}

// hashMode is s.HashMode with its default filled in.
func (s Setup) hashMode() keyspace.HashMode {
	if s.HashMode == "" {
		return ingester.DefaultConfig().HashMode
	}
	return s.HashMode
}

func (s Setup) check() error {
	if _, err := keyspace.ParseHashMode(string(s.hashMode())); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	if s.ChunkSize < 0 || s.ChunkSize > keyspace.MaxChunkEntries {
		return fmt.Errorf("bench: chunk size %d: want between 1 and %d, or 0 for the default", s.ChunkSize, keyspace.MaxChunkEntries)
	}
	if s.ChunkOpenAt < 0 || s.ChunkOpenAt > s.chunkSize() {
		return fmt.Errorf("bench: chunk open threshold %d: want between 1 and the chunk size %d, or 0 for the default", s.ChunkOpenAt, s.chunkSize())
	}
	return nil
}

// chunkOpenAt is s.ChunkOpenAt with its default filled in.
func (s Setup) chunkOpenAt() int {
	if s.ChunkOpenAt == 0 {
		return ingester.DefaultChunkOpenAt(s.chunkSize(), s.windowLinger())
	}
	return s.ChunkOpenAt
}

// chunkSize is s.ChunkSize with its default filled in.
func (s Setup) chunkSize() int {
	if s.ChunkSize == 0 {
		return ingester.DefaultConfig().ChunkSize
	}
	return s.ChunkSize
}

// etcd is the etcd options of s.
func (s Setup) etcd() etcdOptions { return etcdOptions{noFsync: s.NoFsync, cpus: s.EtcdCPUs} }

// labels adds s's labels (hash_mode, fsync on|off, chunk_size,
// chunk_open_at, window_linger) to m and returns it.
func (s Setup) labels(m map[string]string) map[string]string {
	m["hash_mode"] = string(s.hashMode())
	m["fsync"] = fsyncLabel(!s.NoFsync)
	m["chunk_size"] = fmt.Sprint(s.chunkSize())
	m["chunk_open_at"] = fmt.Sprint(s.chunkOpenAt())
	m["window_linger"] = s.windowLinger().String()
	m["etcd_cpus"] = cpuLabel(s.EtcdCPUs)
	return m
}

func fsyncLabel(on bool) string {
	if on {
		return "on"
	}
	return "off"
}

// etcdNode is an embedded etcd in a temporary directory, in this process
// (srv) or in a child process of its own (child), and a client to it.
type etcdNode struct {
	srv       *etcdembed.Server
	child     *etcdChild
	endpoints []string
	cli       *clientv3.Client
	dir       string
	log       *slog.Logger
}

// etcdOptions adjust an embedded etcd.
type etcdOptions struct {
	// quota is --quota-backend-bytes; 0 means etcdembed's default (8 GiB).
	quota int64
	// noFsync turns fsync off (Setup.NoFsync). The zero value keeps it
	// on, as the read-path benchmarks (lookup, coldstart) run it too.
	noFsync bool
	// cpus, when set, runs etcd in a child process pinned to them
	// (Setup.EtcdCPUs).
	cpus []int
}

// startEtcd starts an embedded etcd on a free loopback port: in this
// process, or, with opts.cpus, in a child process pinned to those CPUs
// (startEtcdChild).
func startEtcd(ctx context.Context, log *slog.Logger, opts etcdOptions) (*etcdNode, error) {
	dir, err := os.MkdirTemp("", "kvindex-bench-etcd-")
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	n := &etcdNode{dir: dir, log: log}
	if len(opts.cpus) > 0 {
		if n.child, n.endpoints, err = startEtcdChild(ctx, log, dir, opts); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	} else {
		// etcdembed.Start picks again when a free port it picked is taken
		// before etcd listens on it.
		if n.srv, err = etcdembed.Start(ctx, embedConfig(dir, opts.noFsync, opts.quota, log)); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("bench: starting etcd: %w", err)
		}
		n.endpoints = n.srv.Endpoints()
	}
	if n.cli, err = n.client(); err != nil {
		n.close()
		return nil, err
	}
	return n, nil
}

// embedConfig is the embedded etcd of a benchmark, in this process or a
// child: its data under dir, a free loopback client port, fsync and the
// backend quota as given (quota 0: etcdembed's default).
func embedConfig(dir string, noFsync bool, quota int64, log *slog.Logger) etcdembed.Config {
	return etcdembed.Config{
		DataDir:           filepath.Join(dir, "etcd"),
		ClientAddr:        "127.0.0.1:0",
		UnsafeNoFsync:     noFsync,
		QuotaBackendBytes: quota,
		Logger:            log,
	}
}

// client dials a new client (each component gets its own, as separate
// processes would), with extra gRPC dial options.
func (n *etcdNode) client(opts ...grpc.DialOption) (*clientv3.Client, error) {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   n.endpoints,
		DialTimeout: 5 * time.Second,
		DialOptions: append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...),
		Logger:      logging.Zap(n.log.With("component", "etcd-client")),
	})
	if err != nil {
		return nil, fmt.Errorf("bench: etcd client: %w", err)
	}
	return cli, nil
}

// close stops etcd and deletes its data.
func (n *etcdNode) close() {
	if n.cli != nil {
		n.cli.Close()
	}
	if n.srv != nil {
		n.srv.Close()
	}
	if n.child != nil {
		n.child.stop()
	}
	os.RemoveAll(n.dir)
}

// startKafka starts an in-process kfake broker with topic created with
// partitions partitions and LogAppendTime timestamps (as DESIGN asks of a
// real topic).
func startKafka(log *slog.Logger, topic string, partitions int32) (*kfake.Cluster, error) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(100*time.Millisecond),
		kfake.WithLogger(logging.Kfake(log.With("component", "kafka"))))
	if err != nil {
		return nil, fmt.Errorf("bench: starting kfake: %w", err)
	}
	if err := createTopic(c, topic, partitions); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func createTopic(c *kfake.Cluster, topic string, partitions int32) error {
	err := c.CreateTopic(topic, partitions, map[string]string{"message.timestamp.type": "LogAppendTime"})
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		return fmt.Errorf("bench: creating topic %s: %w", topic, err)
	}
	return nil
}

// newProducer returns a producer that partitions by record key as
// Kafka's default partitioner does (so one pod stays in one partition) and
// sends each record as soon as it can, in batches of at most the
// broker's default max message size (1 MiB).
func newProducer(brokers []string, log *slog.Logger) (*kgo.Client, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ProducerLinger(0),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)), kgo.MaxBufferedRecords(1<<16),
		kgo.WithLogger(logging.Kgo(log.With("component", "producer"))))
	if err != nil {
		return nil, fmt.Errorf("bench: producer: %w", err)
	}
	return cl, nil
}

// produceAll produces the stream's records to topic in order and returns
// the last offset produced to each partition and where each record went.
func produceAll(ctx context.Context, cl *kgo.Client, s *Stream, topic string) (map[int32]int64, []placement, error) {
	last := map[int32]int64{}
	at := make([]placement, len(s.Records))
	const chunk = 512
	for i := 0; i < len(s.Records); i += chunk {
		n := min(chunk, len(s.Records)-i)
		recs := make([]*kgo.Record, n)
		index := make(map[*kgo.Record]int, n)
		for k := range recs {
			recs[k] = s.KafkaRecord(topic, i+k)
			index[recs[k]] = i + k
		}
		res := cl.ProduceSync(ctx, recs...)
		if err := res.FirstErr(); err != nil {
			return nil, nil, fmt.Errorf("bench: producing: %w", err)
		}
		for _, r := range res {
			last[r.Record.Partition] = max(last[r.Record.Partition], r.Record.Offset)
			at[index[r.Record]] = placement{partition: r.Record.Partition, offset: r.Record.Offset}
		}
	}
	return last, at, nil
}

// runner runs one component's Run(ctx) on a goroutine it owns.
type runner struct {
	cancel context.CancelFunc
	done   chan error
}

func start(ctx context.Context, run func(context.Context) error) *runner {
	rctx, cancel := context.WithCancel(ctx)
	r := &runner{cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- run(rctx) }()
	return r
}

// stop cancels the component and waits for Run to return; it returns Run's
// error (nil after a clean stop).
func (r *runner) stop() error {
	r.cancel()
	err := <-r.done
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// ingesterRun is a running ingester.
type ingesterRun struct {
	*runner
	in *ingester.Ingester
	// assigned is closed once the ingester owns every partition.
	assigned chan struct{}
}

// ingesterOptions shape a benchmark ingester.
type ingesterOptions struct {
	cli        *clientv3.Client
	brokers    []string
	topic      string
	partitions int32
	maxTxnOps  int
	windowOps  int
	// linger is the ingester's WindowLinger.
	linger   time.Duration
	inFlight int
	hashMode keyspace.HashMode
	// chunkSize is the ingester's ChunkSize (0: its default); the merge
	// threshold follows it, and so does the open threshold unless
	// chunkOpenAt is set.
	chunkSize, chunkOpenAt int
	beforeTxn              func(context.Context, ingester.TxnInfo) error
	log                    *slog.Logger
}

// startIngester starts an ingester in a consumer group of its own (every
// run a fresh group, so no earlier member's departure rebalances it).
func startIngester(ctx context.Context, o ingesterOptions) (*ingesterRun, error) {
	group := fmt.Sprintf("bench-%d-%x", os.Getpid(), rand.Uint64())
	cfg := ingester.DefaultConfig()
	if o.hashMode != "" {
		cfg.HashMode = o.hashMode
	}
	cfg.Etcd = o.cli
	cfg.Brokers = o.brokers
	cfg.Topic = o.topic
	cfg.Group = group
	cfg.ID = group
	cfg.SessionTimeout = time.Second
	cfg.RebalanceTimeout = 1500 * time.Millisecond
	if o.maxTxnOps > 0 {
		cfg.MaxTxnOps = o.maxTxnOps
	}
	cfg.WindowLinger = o.linger
	if o.chunkSize > 0 {
		cfg.ChunkSize = o.chunkSize
		cfg.ChunkOpenAt = 0     // 3/4 of it
		cfg.ChunkMergeBelow = 0 // an eighth of it
	}
	if o.chunkOpenAt > 0 {
		cfg.ChunkOpenAt = o.chunkOpenAt
	}
	if o.windowOps > 0 {
		cfg.WindowOps = o.windowOps
	}
	cfg.BeforeTxn = o.beforeTxn
	cfg.Logger = o.log.With("component", "ingester")
	ir := &ingesterRun{assigned: make(chan struct{})}
	var once sync.Once
	cfg.OnAssigned = func(ps []int32) {
		if len(ps) == int(o.partitions) {
			once.Do(func() { close(ir.assigned) })
		}
	}
	in, err := ingester.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	ir.in = in
	ir.runner = start(ctx, in.Run)
	return ir, nil
}

// waitAssigned waits until the ingester owns every partition, or fails
// when it stops or ctx ends.
func (ir *ingesterRun) waitAssigned(ctx context.Context) error {
	select {
	case <-ir.assigned:
		return nil
	case err := <-ir.done:
		ir.done <- err
		return fmt.Errorf("bench: ingester stopped before owning its partitions: %v", err)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// indexdRun is a running indexd replica.
type indexdRun struct {
	*runner
	srv *indexd.Server
	cli *clientv3.Client
}

// startIndexd starts a replica on a free loopback port with an etcd client
// of its own, and waits until it serves (gRPC health SERVING).
func startIndexd(ctx context.Context, n *etcdNode, log *slog.Logger) (*indexdRun, error) {
	cli, err := n.client()
	if err != nil {
		return nil, err
	}
	r, err := startIndexdOn(ctx, cli, log)
	if err != nil {
		cli.Close()
		return nil, err
	}
	return r, nil
}

// startIndexdOn starts a replica on cli (which stop closes) and waits
// until it serves.
func startIndexdOn(ctx context.Context, cli *clientv3.Client, log *slog.Logger) (*indexdRun, error) {
	cfg := indexd.DefaultConfig()
	cfg.Etcd = cli
	cfg.ListenAddr = "127.0.0.1:0"
	cfg.Logger = log.With("component", "indexd")
	cfg.ShutdownGrace = time.Second
	srv, err := indexd.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	r := &indexdRun{srv: srv, cli: cli, runner: start(ctx, srv.Run)}
	if err := waitServing(ctx, srv.Addr().String()); err != nil {
		r.stop()
		return nil, err
	}
	return r, nil
}

// stop stops the replica and closes its etcd client.
func (r *indexdRun) stop() error {
	err := r.runner.stop()
	r.cli.Close()
	return err
}

// waitServing watches addr's gRPC health until it says SERVING.
func waitServing(ctx context.Context, addr string) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	defer conn.Close()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := healthpb.NewHealthClient(conn).Watch(wctx, &healthpb.HealthCheckRequest{Service: "kvindex.v1.IndexService"})
	if err != nil {
		return fmt.Errorf("bench: watching indexd health: %w", err)
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			return fmt.Errorf("bench: waiting for indexd to serve: %w", err)
		}
		if resp.Status == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
	}
}

// waitApplied waits, watching offsets/, until every partition of want has
// a stored next offset past want's offset (the ingester has written every
// record up to it), and returns when it saw that. One Get and one watch:
// it costs the measured run next to nothing.
func waitApplied(ctx context.Context, cli *clientv3.Client, ks keyspace.Keyspace, topic string, want map[int32]int64) (time.Time, error) {
	prefix := ks.OffsetsPrefix()
	got := map[int32]int64{}
	note := func(key, value []byte) error {
		p, err := ks.ParseOffsetKey(string(key))
		if err != nil || p.Topic != topic {
			return nil
		}
		next, err := keyspace.ParseOffset(value)
		if err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		got[p.Partition] = next
		return nil
	}
	resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return time.Time{}, fmt.Errorf("bench: reading offsets: %w", err)
	}
	for _, kv := range resp.Kvs {
		if err := note(kv.Key, kv.Value); err != nil {
			return time.Time{}, err
		}
	}
	if applied(got, want) {
		return time.Now(), nil
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for wr := range cli.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1)) {
		if err := wr.Err(); err != nil {
			return time.Time{}, fmt.Errorf("bench: watching offsets: %w", err)
		}
		for _, ev := range wr.Events {
			if ev.Type == clientv3.EventTypePut {
				if err := note(ev.Kv.Key, ev.Kv.Value); err != nil {
					return time.Time{}, err
				}
			}
		}
		if applied(got, want) {
			return time.Now(), nil
		}
	}
	if err := ctx.Err(); err != nil {
		return time.Time{}, err
	}
	return time.Time{}, errors.New("bench: offsets watch closed")
}

func applied(got, want map[int32]int64) bool {
	for p, off := range want {
		if got[p] <= off {
			return false
		}
	}
	return true
}
