// Package ingestercmd wires `kvindex ingester`: the consumer-group member
// that writes the index (package ingester, which also registers itself
// under ingesters/{id}). It dials etcd, serves /metrics, /healthz and
// /readyz (ready once consuming), and runs until its context ends
// (SIGINT/SIGTERM).
package ingestercmd

import (
	"context"

	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"

	"github.com/kvindex/kvindex/ingester"
	"github.com/kvindex/kvindex/internal/cli/common"
)

// flags are the command's flags beyond the shared ones.
type flags struct {
	log   common.Logging
	etcd  common.Etcd
	kafka common.Kafka
	ops   common.Ops
	// cfg receives the ingester's own flags; run fills in the rest.
	cfg ingester.Config
}

// NewCommand returns `kvindex ingester`.
func NewCommand() *cobra.Command {
	f := flags{cfg: ingester.DefaultConfig()}
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
	c := &f.cfg
	fs.StringVar(&c.Group, "group", common.DefaultGroup, "Kafka consumer group the ingesters share")
	fs.StringVar(&c.ID, "id", "", "ingester id in owner records and ingesters/ (default: host name and pid)")
	fs.DurationVar(&c.LeaseTTL, "lease-ttl", c.LeaseTTL, "TTL of the leases block keys hang on (whole seconds; 2/3 of it must exceed --session-timeout plus --rebalance-timeout plus a tenth of it)")
	fs.DurationVar(&c.LivenessWindow, "liveness-window", c.LivenessWindow, "drop an endpoint that sent no batch or heartbeat for this long (on the partition clock)")
	fs.DurationVar(&c.OutageThreshold, "outage-threshold", 0, "no record anywhere in the topic for longer than this is an outage, which ages nobody (0: 15s, or half --liveness-window when shorter; must be below it)")
	fs.DurationVar(&c.OutageGrace, "outage-grace", 0, "after an outage, or a claim following a silence, every endpoint is kept this long before it can expire (0: --liveness-window)")
	fs.DurationVar(&c.SessionTimeout, "session-timeout", c.SessionTimeout, "consumer group session timeout (the brokers must allow it)")
	fs.DurationVar(&c.RebalanceTimeout, "rebalance-timeout", c.RebalanceTimeout, "consumer group rebalance timeout")
	fs.IntVar(&c.MaxTxnOps, "max-txn-ops", c.MaxTxnOps, "most operations in one etcd transaction (at most etcd's --max-txn-ops)")
	fs.IntVar(&c.MaxTxnBytes, "max-txn-bytes", c.MaxTxnBytes, "most encoded bytes in one etcd transaction (under etcd's --max-request-bytes)")
	fs.IntVar(&c.WindowRecords, "window-records", c.WindowRecords, "most records coalesced into one batch window")
	fs.IntVar(&c.WindowOps, "window-ops", c.WindowOps, "most pending block operations in one batch window")
	fs.IntVar(&c.QueueBytes, "queue-bytes", c.QueueBytes, "most fetched record bytes queued for one partition's worker before consuming waits")
	fs.IntVar(&c.MaxTxnsInFlight, "max-txns-in-flight", c.MaxTxnsInFlight, "most block transactions of one partition's window sent without waiting for each other")
	fs.IntVar(&c.KeysPerLease, "keys-per-lease", c.KeysPerLease, "most block keys attached to one lease before an (endpoint, tier) gets another")
	fs.IntVar(&c.DropPageSize, "drop-page-size", c.DropPageSize, "most keys one guarded range delete removes")
	f.ops.Register(fs)
	return cmd
}

func run(ctx context.Context, f *flags) error {
	if err := f.kafka.ValidateTopic(); err != nil {
		return err
	}
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
	cfg := f.cfg
	cfg.Etcd = cli
	cfg.Keyspace = ks
	cfg.Brokers = f.kafka.Brokers
	cfg.Topic = f.kafka.Topic
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
	log.Info("ingester starting", "id", cfg.ID, "brokers", f.kafka.Brokers, "topic", f.kafka.Topic, "group", cfg.Group,
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
