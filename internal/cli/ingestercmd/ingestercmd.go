// Package ingestercmd wires `kvindex ingester`: the consumer-group member
// that writes the index (package ingester). It dials etcd, registers the
// ingester under ingesters/{id} on a session lease, serves /metrics,
// /healthz and /readyz (ready once consuming), and runs until its context
// ends (SIGINT/SIGTERM).
package ingestercmd

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"golang.org/x/sync/errgroup"

	"github.com/kvindex/kvindex/ingester"
	"github.com/kvindex/kvindex/internal/cli/common"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/opsserver"
)

// flags are the command's flags beyond the shared ones.
type flags struct {
	log            common.Logging
	etcd           common.Etcd
	kafka          common.Kafka
	group          string
	id             string
	leaseTTL       time.Duration
	livenessWindow time.Duration
	maxTxnOps      int
	metricsListen  string
	pprof          bool
}

// NewCommand returns `kvindex ingester`.
func NewCommand() *cobra.Command {
	var f flags
	def := ingester.DefaultConfig()
	cmd := &cobra.Command{
		Use:   "ingester",
		Short: "Consume KV events from Kafka and write the index to etcd",
		Long: `ingester is a Kafka consumer-group member: it owns some partitions of the
KV-event topic, claims each in etcd (owners/), and writes every record's
effect in fenced, bounded transactions that carry the partition's offset
(offsets/). Run as many as the topic has partitions; they share the work.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return run(cmd.Context(), &f) },
	}
	fs := cmd.Flags()
	f.log.Register(fs)
	f.etcd.Register(fs)
	f.kafka.Register(fs)
	fs.StringVar(&f.group, "group", common.DefaultGroup, "Kafka consumer group the ingesters share")
	fs.StringVar(&f.id, "id", "", "ingester id in owner records and ingesters/ (default: host name and pid)")
	fs.DurationVar(&f.leaseTTL, "lease-ttl", def.LeaseTTL, "TTL of the leases block keys hang on (whole seconds; 2/3 of it must exceed the group's session and rebalance timeouts plus a margin)")
	fs.DurationVar(&f.livenessWindow, "liveness-window", def.LivenessWindow, "drop an endpoint that sent no batch or heartbeat for this long")
	fs.IntVar(&f.maxTxnOps, "max-txn-ops", def.MaxTxnOps, "operations per etcd transaction (etcd's --max-txn-ops)")
	fs.StringVar(&f.metricsListen, "metrics-listen", common.DefaultMetricsAddr, "host:port of /metrics, /healthz and /readyz")
	fs.BoolVar(&f.pprof, "pprof", false, "serve /debug/pprof/ on --metrics-listen")
	return cmd
}

func run(ctx context.Context, f *flags) error {
	log, err := f.log.Logger()
	if err != nil {
		return err
	}
	ks, err := f.etcd.Keyspace()
	if err != nil {
		return err
	}
	id := f.id
	if id == "" {
		host, _ := os.Hostname()
		id = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	cli, err := f.etcd.Client(ctx, log)
	if err != nil {
		return err
	}
	defer cli.Close()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	cfg := ingester.DefaultConfig()
	cfg.Etcd = cli
	cfg.Keyspace = ks
	cfg.Brokers = f.kafka.Brokers
	cfg.Topic = f.kafka.Topic
	cfg.Group = f.group
	cfg.ID = id
	cfg.LeaseTTL = f.leaseTTL
	cfg.LivenessWindow = f.livenessWindow
	cfg.MaxTxnOps = f.maxTxnOps
	cfg.Registry = reg
	cfg.Logger = log
	partitions := make(chan []int32, 1) // latest assignment; read by the registration loop
	cfg.OnAssigned = func(ps []int32) {
		select {
		case <-partitions:
		default:
		}
		partitions <- ps
	}
	ing, err := ingester.New(cfg)
	if err != nil {
		return err
	}
	ops, err := opsserver.New(opsserver.Config{Addr: f.metricsListen, Registry: reg, Ready: ing.Ready, Pprof: f.pprof})
	if err != nil {
		return err
	}
	log.Info("ingester starting", "id", id, "brokers", f.kafka.Brokers, "topic", f.kafka.Topic, "group", f.group,
		"etcd", f.etcd.Endpoints, "prefix", ks.Prefix(), "metrics", ops.Addr())

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return ops.Run(gctx) })
	g.Go(func() error { return ing.Run(gctx) })
	g.Go(func() error { return register(gctx, cli, ks, id, cfg.Topic, cfg.LeaseTTL, partitions) })
	err = g.Wait()
	if ctx.Err() != nil {
		return nil // a signal: a clean stop
	}
	return err
}

// register keeps ingesters/{id} on a session lease, rewriting it with the
// owned partitions whenever the assignment changes, until ctx ends.
func register(ctx context.Context, cli *clientv3.Client, ks keyspace.Keyspace, id, topic string, ttl time.Duration, partitions <-chan []int32) error {
	sess, err := concurrency.NewSession(cli, concurrency.WithTTL(int(ttl/time.Second)), concurrency.WithContext(ctx))
	if err != nil {
		return fmt.Errorf("ingester: session lease: %w", err)
	}
	defer sess.Close()
	host, _ := os.Hostname()
	rec := keyspace.IngesterRecord{Host: host, Started: time.Now().UTC(), Partitions: []string{}}
	put := func() error {
		v, err := rec.Marshal()
		if err != nil {
			return err
		}
		_, err = cli.Put(ctx, ks.IngesterKey(id), string(v), clientv3.WithLease(sess.Lease()))
		return err
	}
	if err := put(); err != nil && ctx.Err() == nil {
		return fmt.Errorf("ingester: registering %s: %w", ks.IngesterKey(id), err)
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-sess.Done():
			return fmt.Errorf("ingester: session lease of %s expired", ks.IngesterKey(id))
		case ps := <-partitions:
			rec.Partitions = rec.Partitions[:0]
			for _, p := range ps {
				rec.Partitions = append(rec.Partitions, keyspace.Partition{Topic: topic, Partition: p}.String())
			}
			if err := put(); err != nil && ctx.Err() == nil {
				return fmt.Errorf("ingester: updating %s: %w", ks.IngesterKey(id), err)
			}
		}
	}
}
