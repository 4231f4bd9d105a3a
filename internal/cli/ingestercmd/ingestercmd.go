// Package ingestercmd wires `kvindex ingester`: the consumer-group member
// that writes the index (package ingester, which also registers itself
// under ingesters/{id}). It dials etcd, serves /metrics, /healthz and
// /readyz (ready once consuming), and runs until its context ends
// (SIGINT/SIGTERM).
package ingestercmd

import (
	"context"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"

	"github.com/kvindex/kvindex/ingester"
	"github.com/kvindex/kvindex/internal/cli/common"
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
	ops            common.Ops
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
	f.ops.Register(fs)
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
	cli, err := f.etcd.Client(ctx, log)
	if err != nil {
		return err
	}
	defer cli.Close()

	reg := common.NewRegistry()
	cfg := ingester.DefaultConfig()
	cfg.Etcd = cli
	cfg.Keyspace = ks
	cfg.Brokers = f.kafka.Brokers
	cfg.Topic = f.kafka.Topic
	cfg.Group = f.group
	cfg.ID = f.id // empty: the host name and pid
	cfg.LeaseTTL = f.leaseTTL
	cfg.LivenessWindow = f.livenessWindow
	cfg.MaxTxnOps = f.maxTxnOps
	cfg.Registry = reg
	cfg.Logger = log
	ing, err := ingester.New(cfg)
	if err != nil {
		return err
	}
	ops, err := f.ops.Server(reg, ing.Ready)
	if err != nil {
		return err
	}
	log.Info("ingester starting", "id", f.id, "brokers", f.kafka.Brokers, "topic", f.kafka.Topic, "group", f.group,
		"etcd", f.etcd.Endpoints, "prefix", ks.Prefix(), "metrics", ops.Addr())

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return ops.Run(gctx) })
	g.Go(func() error { return ing.Run(gctx) })
	err = g.Wait()
	if ctx.Err() != nil {
		return nil // a signal: a clean stop
	}
	return err
}
