// Package stack runs the whole kvindex pipeline in one process: an embedded
// etcd, franz-go's in-process kfake Kafka broker, one ingester and one
// indexd, sharing one Prometheus registry and one ops HTTP server. It is
// what `kvindex standalone` runs, what `kvindex replay` starts per scenario
// file, and what the e2e tests and benchmarks build on.
//
// Shutdown order (Run, after its context ends): the ingester and indexd
// stop first (indexd drains in-flight calls), then the ops server, then
// the etcd client, the Kafka broker and etcd itself. The etcd data and the
// Kafka log stay in DataDir, so a restart on the same DataDir resumes
// where it left off (stored offsets stay valid). Both fsync every write
// (unless UnsafeNoFsync), so this holds after a host crash too, and etcd
// compacts its history periodically (CompactionRetention), so its
// database stays bounded under churn.
package stack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"

	"github.com/kvindex/kvindex/indexd"
	"github.com/kvindex/kvindex/ingester"
	"github.com/kvindex/kvindex/internal/contract"
	"github.com/kvindex/kvindex/internal/etcdembed"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/logging"
	"github.com/kvindex/kvindex/internal/opsserver"
)

// Config configures a Stack. Zero fields take the defaults noted.
type Config struct {
	// DataDir holds etcd's data (DataDir/etcd) and the Kafka log
	// (DataDir/kafka). Required.
	DataDir string
	// EtcdAddr is etcd's client host:port. Default "127.0.0.1:2379"; port
	// 0 picks a free port.
	EtcdAddr string
	// KafkaAddr is the broker's host:port. Default "127.0.0.1:9092"; port 0
	// picks a free port.
	KafkaAddr string
	// GRPCAddr is indexd's gRPC host:port. Default "127.0.0.1:50051"; port
	// 0 picks a free port.
	GRPCAddr string
	// MetricsAddr is the ops HTTP server's host:port (/metrics, /healthz,
	// /readyz, and indexd's /status page). Default "127.0.0.1:9090"; port 0 picks a free port.
	MetricsAddr string
	// Topic is the KV-event topic, created with Partitions partitions and
	// LogAppendTime timestamps when it does not exist. Default
	// "kvindex-events" and 4; at most MaxPartitions.
	Topic      string
	Partitions int32
	// Keyspace places kvindex's keys. The zero value means the default.
	Keyspace keyspace.Keyspace
	// UnsafeNoFsync turns fsync off, etcd's and the Kafka log's (tests and
	// benchmarks: a host crash then loses data). Default false: both sync
	// every write, so after a host crash etcd is never ahead of the Kafka
	// log (etcd's stored offsets would otherwise point past records the
	// log lost, and a producer without `seq` could leave ghost blocks).
	UnsafeNoFsync bool
	// CompactionRetention is how much revision history etcd keeps:
	// periodic auto-compaction every so often drops revisions older than
	// this, so churn does not grow etcd's database until its quota. Default
	// DefaultCompactionRetention (5 min); negative turns auto-compaction
	// off. indexd re-lists when its watch falls behind a compaction, so a
	// replica cut off for longer than this lists again on reconnecting.
	CompactionRetention time.Duration
	// KafkaRetention is how long the broker keeps records (the topic's
	// retention.ms, set when the stack creates the topic), so the log,
	// which the in-process broker also holds in memory, stays bounded.
	// Default DefaultKafkaRetention (1 h); negative keeps every record.
	// An ingester that falls further behind than this finds its stored
	// offset outside the log and restarts the partition at the log start
	// (docs/semantics.md).
	KafkaRetention time.Duration
	// EtcdSnapshotCount and EtcdSnapshotCatchUpEntries are etcd's
	// --snapshot-count and --snapshot-catchup-entries (etcdembed.Config):
	// etcd's in-memory raft log, part of the process's heap, grows by up to
	// EtcdSnapshotCount entries above EtcdSnapshotCatchUpEntries before a
	// snapshot cuts it. Zero means etcd's defaults (10,000 and 5,000).
	EtcdSnapshotCount, EtcdSnapshotCatchUpEntries uint64
	// Logger receives every component's logs. Default: discard.
	Logger *slog.Logger
	// Ingester and Indexd, when set, adjust the component configs after
	// the stack has filled in its own fields (tests shorten timeouts).
	Ingester func(*ingester.Config)
	Indexd   func(*indexd.Config)
}

// DefaultPartitions is the partition count of a topic the stack creates.
// The default addresses and topic are contract's (DefaultEtcdAddr,
// DefaultKafkaAddr, DefaultGRPCAddr, DefaultMetricsAddr, DefaultTopic),
// the ones the client commands dial by default.
const DefaultPartitions = 4

// MaxPartitions bounds Config.Partitions: the in-process broker keeps
// state per partition (the stack's resident memory 15 s after start: 43 MB
// at 4 partitions, 169 MB at 256; docs/limits.md), and one developer's
// stack has one ingester.
const MaxPartitions = 256

// Defaults of the stack's retention settings.
const (
	// DefaultCompactionRetention is Config.CompactionRetention's default.
	DefaultCompactionRetention = 5 * time.Minute
	// DefaultKafkaRetention is Config.KafkaRetention's default.
	DefaultKafkaRetention = time.Hour
)

// Stack is a started pipeline. Call Run to serve; Run closes everything.
type Stack struct {
	cfg      Config
	etcd     *etcdembed.Server
	kafka    *kfake.Cluster
	cli      *clientv3.Client
	ingester *ingester.Ingester
	indexd   *indexd.Server
	ops      *opsserver.Server
	registry *prometheus.Registry
	// hashMode is the ingester's (checkHashMode).
	hashMode keyspace.HashMode
	// grpcLis is closed by close only when Start fails (Run hands it to
	// indexd, which closes it).
	grpcLis net.Listener
}

// AddrError reports a listen address that is taken; Which names the
// component ("etcd", "kafka", "grpc", "metrics").
type AddrError struct {
	Which, Addr string
	Err         error
}

// Error says which address is taken and why.
func (e *AddrError) Error() string {
	return fmt.Sprintf("%s address %s is not available: %v", e.Which, e.Addr, e.Err)
}

// Unwrap returns the listen error.
func (e *AddrError) Unwrap() error { return e.Err }

// Start starts etcd and the Kafka broker, creates the topic, and builds the
// ingester and indexd (which start working in Run). On error everything
// started is closed again.
func Start(ctx context.Context, cfg Config) (_ *Stack, err error) {
	cfg, err = cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := checkNotNested(cfg.DataDir); err != nil {
		return nil, err
	}
	// A data dir in use says why its ports are taken too: name it first.
	if err := etcdembed.CheckDataDir(filepath.Join(cfg.DataDir, "etcd")); err != nil {
		return nil, fmt.Errorf("stack: %w", err)
	}
	// Bind-check every fixed address first, so a busy port fails before
	// anything starts and names the component.
	for _, a := range []struct{ which, addr string }{{"etcd", cfg.EtcdAddr}, {"kafka", cfg.KafkaAddr}, {"grpc", cfg.GRPCAddr}, {"metrics", cfg.MetricsAddr}} {
		if err := checkFree(a.addr); err != nil {
			return nil, &AddrError{Which: a.which, Addr: a.addr, Err: err}
		}
	}

	s := &Stack{cfg: cfg, registry: prometheus.NewRegistry()}
	defer func() {
		if err != nil {
			if s.grpcLis != nil {
				s.grpcLis.Close()
			}
			if s.ops != nil {
				s.ops.Close()
			}
			s.close()
		}
	}()
	s.registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	if err = s.startStores(ctx); err != nil {
		return nil, err
	}
	if err = s.newRoles(); err != nil {
		return nil, err
	}
	if err = checkHashMode(ctx, s.cli, cfg.Keyspace, s.hashMode); err != nil {
		return nil, err
	}
	return s, nil
}

// startStores starts what the roles run on: the embedded etcd, the
// in-process Kafka broker and the etcd client.
func (s *Stack) startStores(ctx context.Context) (err error) {
	cfg := s.cfg
	retention := cfg.CompactionRetention
	switch {
	case retention == 0:
		retention = DefaultCompactionRetention
	case retention < 0:
		retention = 0 // etcdembed: off
	}
	s.etcd, err = etcdembed.Start(ctx, etcdembed.Config{
		DataDir:                 filepath.Join(cfg.DataDir, "etcd"),
		ClientAddr:              cfg.EtcdAddr,
		UnsafeNoFsync:           cfg.UnsafeNoFsync,
		AutoCompactionRetention: retention,
		SnapshotCount:           cfg.EtcdSnapshotCount,
		SnapshotCatchUpEntries:  cfg.EtcdSnapshotCatchUpEntries,
		Logger:                  cfg.Logger,
	})
	if err != nil {
		return fmt.Errorf("stack: %w", err)
	}
	if s.kafka, err = startKafka(cfg); err != nil {
		return err
	}
	s.cli, err = clientv3.New(clientv3.Config{
		Endpoints:   s.etcd.Endpoints(),
		DialTimeout: 5 * time.Second,
		Logger:      logging.Zap(cfg.Logger.With("component", "etcd-client")),
		Context:     ctx,
	})
	if err != nil {
		return fmt.Errorf("stack: etcd client: %w", err)
	}
	return nil
}

// newRoles builds the ingester, indexd (on its bound gRPC listener) and
// the ops server, sharing the stack's registry; Run starts them.
func (s *Stack) newRoles() (err error) {
	cfg := s.cfg
	icfg := ingester.DefaultConfig()
	icfg.Etcd = s.cli
	icfg.Keyspace = cfg.Keyspace
	icfg.Brokers = s.kafka.ListenAddrs()
	icfg.Topic = cfg.Topic
	icfg.ID = "standalone"
	icfg.Registry = s.registry
	icfg.Logger = cfg.Logger // the ingester labels its own logs
	if cfg.Ingester != nil {
		cfg.Ingester(&icfg)
	}
	s.hashMode = icfg.HashMode
	if s.ingester, err = ingester.New(icfg); err != nil {
		return fmt.Errorf("stack: %w", err)
	}

	grpcLis, err := net.Listen("tcp", cfg.GRPCAddr)
	if err != nil {
		return &AddrError{Which: "grpc", Addr: cfg.GRPCAddr, Err: err}
	}
	s.grpcLis = grpcLis
	xcfg := indexd.DefaultConfig()
	xcfg.Etcd = s.cli
	xcfg.Keyspace = cfg.Keyspace
	xcfg.Listener = grpcLis
	xcfg.Registry = s.registry
	xcfg.Logger = cfg.Logger.With("component", "indexd")
	if cfg.Indexd != nil {
		cfg.Indexd(&xcfg)
	}
	if s.indexd, err = indexd.New(xcfg); err != nil {
		return fmt.Errorf("stack: %w", err)
	}
	s.ops, err = opsserver.New(opsserver.Config{Addr: cfg.MetricsAddr, Registry: s.registry, Ready: s.Ready,
		Handlers: map[string]http.Handler{"/status": s.indexd.StatusHandler()}})
	if err != nil {
		return &AddrError{Which: "metrics", Addr: cfg.MetricsAddr, Err: err}
	}
	return nil
}

// withDefaults returns cfg with every zero field that has a default set
// to it; DataDir has none and is required.
func (cfg Config) withDefaults() (Config, error) {
	if cfg.DataDir == "" {
		return Config{}, errors.New("stack: DataDir is required")
	}
	def := func(v *string, d string) {
		if *v == "" {
			*v = d
		}
	}
	def(&cfg.EtcdAddr, contract.DefaultEtcdAddr)
	def(&cfg.KafkaAddr, contract.DefaultKafkaAddr)
	def(&cfg.GRPCAddr, contract.DefaultGRPCAddr)
	def(&cfg.MetricsAddr, contract.DefaultMetricsAddr)
	def(&cfg.Topic, contract.DefaultTopic)
	if cfg.Partitions <= 0 {
		cfg.Partitions = DefaultPartitions
	}
	if cfg.Partitions > MaxPartitions {
		return Config{}, fmt.Errorf("stack: Partitions %d: at most %d", cfg.Partitions, MaxPartitions)
	}
	if cfg.Keyspace == (keyspace.Keyspace{}) {
		cfg.Keyspace = keyspace.Default()
	}
	if cfg.Logger == nil {
		cfg.Logger = logging.Discard()
	}
	return cfg, nil
}

// checkWritable creates dir if needed and checks a file can be created
// in it: the in-process broker writes its log there only later, and
// reports a failure only in its own log, so a stack on a read-only
// directory would serve and then lose what it was sent.
func checkWritable(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".write-check-*")
	if err != nil {
		return fmt.Errorf("%s is not writable: %w", dir, err)
	}
	name := f.Name()
	f.Close()
	return os.Remove(name)
}

// startKafka starts the broker on cfg.KafkaAddr with its log under DataDir
// and makes sure the topic exists.
func startKafka(cfg Config) (*kfake.Cluster, error) {
	host, portStr, err := net.SplitHostPort(cfg.KafkaAddr)
	if err != nil {
		return nil, &AddrError{Which: "kafka", Addr: cfg.KafkaAddr, Err: err}
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, &AddrError{Which: "kafka", Addr: cfg.KafkaAddr, Err: err}
	}
	logDir := filepath.Join(cfg.DataDir, "kafka")
	if err := checkWritable(logDir); err != nil {
		return nil, fmt.Errorf("stack: the Kafka log directory: %w", err)
	}
	opts := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.DataDir(logDir),
		kfake.WithLogger(logging.Kfake(cfg.Logger.With("component", "kafka"))),
		// kfake binds 127.0.0.1; bind the configured host instead.
		kfake.ListenFn(func(network, addr string) (net.Listener, error) {
			_, p, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			return net.Listen(network, net.JoinHostPort(host, p))
		}),
	}
	if port != 0 {
		opts = append(opts, kfake.Ports(port))
	}
	retention := cfg.KafkaRetention
	if retention == 0 {
		retention = DefaultKafkaRetention
	}
	topicCfg := map[string]string{"message.timestamp.type": "LogAppendTime"}
	if retention > 0 {
		topicCfg["retention.ms"] = strconv.FormatInt(retention.Milliseconds(), 10)
		// The broker applies retention every log.cleaner.backoff.ms
		// (default 1 h): a tenth of the retention, within [1 s, 5 min].
		every := min(max(retention/10, time.Second), 5*time.Minute)
		opts = append(opts, kfake.BrokerConfigs(map[string]string{"log.cleaner.backoff.ms": strconv.FormatInt(every.Milliseconds(), 10)}))
	}
	if !cfg.UnsafeNoFsync {
		// Every produced batch is on disk before it is acknowledged, as
		// etcd's writes are: the ingester's stored offsets never point
		// past records a host crash took from the log.
		opts = append(opts, kfake.SyncWrites())
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		return nil, &AddrError{Which: "kafka", Addr: cfg.KafkaAddr, Err: err}
	}
	err = c.CreateTopic(cfg.Topic, cfg.Partitions, topicCfg)
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		c.Close()
		return nil, fmt.Errorf("stack: creating topic %s: %w", cfg.Topic, err)
	}
	return c, nil
}

func checkFree(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if port == "0" {
		return nil
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	return l.Close()
}

// Ready reports nil once the ingester consumes and indexd serves its first
// snapshot.
func (s *Stack) Ready() error {
	if err := s.ingester.Ready(); err != nil {
		return err
	}
	return s.indexd.Ready()
}

// EtcdURL is etcd's client URL (for etcdctl --endpoints).
func (s *Stack) EtcdURL() string { return s.etcd.ClientURL() }

// KafkaAddr is the broker's host:port.
func (s *Stack) KafkaAddr() string { return s.kafka.ListenAddrs()[0] }

// GRPCAddr is indexd's gRPC host:port.
func (s *Stack) GRPCAddr() string { return s.indexd.Addr().String() }

// MetricsAddr is the ops HTTP server's host:port.
func (s *Stack) MetricsAddr() string { return s.ops.Addr() }

// Topic is the KV-event topic.
func (s *Stack) Topic() string { return s.cfg.Topic }

// Etcd is the stack's etcd client (owned by the stack).
func (s *Stack) Etcd() *clientv3.Client { return s.cli }

// Registry is the stack's Prometheus registry.
func (s *Stack) Registry() *prometheus.Registry { return s.registry }

// Run runs the ingester, indexd and the ops server until ctx ends or one of
// them fails, then closes everything (see the package doc for the order).
// It returns nil after a clean stop by ctx.
func (s *Stack) Run(ctx context.Context) error {
	defer s.close()
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return s.ingester.Run(gctx) })
	g.Go(func() error { return s.indexd.Run(gctx) })
	g.Go(func() error { return s.ops.Run(gctx) })
	g.Go(func() error {
		select {
		case err := <-s.etcd.Err():
			return fmt.Errorf("stack: etcd: %w", err)
		case <-gctx.Done():
			return nil
		}
	})
	err := g.Wait()
	if ctx.Err() != nil && errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// close releases what Start acquired, in reverse order.
func (s *Stack) close() {
	if s.cli != nil {
		s.cli.Close()
	}
	if s.kafka != nil {
		s.kafka.Close()
	}
	if s.etcd != nil {
		s.etcd.Close()
	}
}
