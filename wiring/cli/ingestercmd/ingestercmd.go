// Package ingestercmd wires `kvindex ingester`: the consumer-group member
// that writes the index (package ingester, which also registers itself
// under ingesters/{id}). It dials etcd, serves /metrics, /healthz and
// /readyz (ready once consuming), and runs until its context ends
// (SIGINT/SIGTERM).
package ingestercmd

import (
	"context"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/sync/errgroup"

	"github.com/kvindex/kvindex/ingester"
	"github.com/kvindex/kvindex/internal/authwatch"
	"github.com/kvindex/kvindex/internal/contract"
	"github.com/kvindex/kvindex/internal/events"
	"github.com/kvindex/kvindex/internal/kafkaauth"
	"github.com/kvindex/kvindex/internal/logging"
	"github.com/kvindex/kvindex/internal/tier"
	"github.com/kvindex/kvindex/wiring/cli/common"
)

// flags are the command's flags beyond the shared ones.
type flags struct {
	log   common.Logging
	etcd  common.Etcd
	kafka common.Kafka
	auth  kafkaauth.Config
	ops   common.Ops
	// cfg receives the ingester's own flags; run fills in the rest.
	cfg ingester.Config
	// mediums are the --medium NAME=TIER changes to the default table.
	mediums []string
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
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkFlags(cmd.Flags()); err != nil {
				return err
			}
			return run(cmd.Context(), cmd.Flags(), &f)
		},
	}
	fs := cmd.Flags()
	f.log.Register(fs)
	f.etcd.Register(fs)
	f.kafka.Register(fs)
	f.auth.Register(fs)
	c := &f.cfg
	fs.StringVar(&c.Group, "group", contract.DefaultGroup, "Kafka consumer group the ingesters share")
	fs.StringVar(&c.ID, "id", "", "ingester id in owner records and ingesters/ (default: host name and pid)")
	fs.StringVar((*string)(&c.HashMode), "hash-mode", string(c.HashMode), "block keys: token (kvindex's canonical key of each block's tokens, so routers need no engine hasher) or engine (the engine's own hash); recorded in every endpoint record")
	fs.IntVar(&c.MaxMapEntries, "max-map-entries", c.MaxMapEntries, "token mode: most engine hash -> key entries per partition (about 50 bytes each); past it the endpoint with the most is dropped as by resync")
	fs.IntVar(&c.MapRebuildPageBytes, "map-rebuild-page-bytes", c.MapRebuildPageBytes, "most bytes of one etcd page when a new owner rebuilds the chunk state (and in token mode the maps) from the chunk values")
	fs.DurationVar(&c.LeaseTTL, "lease-ttl", c.LeaseTTL, "TTL of the leases block keys hang on (whole seconds; 2/3 of it must exceed --session-timeout plus --rebalance-timeout plus a tenth of it)")
	fs.DurationVar(&c.LivenessWindow, "liveness-window", c.LivenessWindow, "drop an endpoint that sent no batch or heartbeat for this long (on the partition clock)")
	fs.DurationVar(&c.OutageThreshold, "outage-threshold", 0, "no record anywhere in the topic for longer than this is an outage, which ages nobody (0: 15s, or half --liveness-window when shorter; must be below it)")
	fs.DurationVar(&c.OutageGrace, "outage-grace", 0, "after an outage, or a claim following a silence, every endpoint is kept this long before it can expire (0: --liveness-window)")
	fs.DurationVar(&c.SessionTimeout, "session-timeout", c.SessionTimeout, "consumer group session timeout (the brokers must allow it)")
	fs.DurationVar(&c.RebalanceTimeout, "rebalance-timeout", c.RebalanceTimeout, "consumer group rebalance timeout")
	fs.IntVar(&c.MaxTxnOps, "max-txn-ops", c.MaxTxnOps, "most operations in one etcd transaction; at start the ingester lowers it to what etcd's --max-txn-ops accepts")
	fs.IntVar(&c.MaxTxnBytes, "max-txn-bytes", c.MaxTxnBytes, "most encoded bytes in one etcd transaction (under etcd's --max-request-bytes)")
	fs.IntVar(&c.WindowRecords, "window-records", c.WindowRecords, "most records coalesced into one batch window")
	fs.IntVar(&c.WindowOps, "window-ops", c.WindowOps, "most pending block operations in one batch window")
	fs.DurationVar(&c.WindowLinger, "window-linger", c.WindowLinger, "keep a window that is not full open until its oldest record is this old by its Kafka timestamp, and never longer than this, for more records to join it (fewer rewrites of each newest chunk; a backlog is not held; every record waits up to this much longer; 0: write as soon as the partition's queue is empty)")
	fs.DurationVar(&c.FetchMaxWait, "fetch-max-wait", c.FetchMaxWait, "longest a Kafka fetch waits at the broker for records; bounds how long a partition resumed after --queue-bytes paused it waits for the fetch in flight")
	fs.IntVar(&c.QueueBytes, "queue-bytes", c.QueueBytes, "most fetched record bytes queued for one partition's worker before fetching that partition pauses")
	fs.IntVar(&c.KeysPerLease, "keys-per-lease", c.KeysPerLease, "most chunk keys attached to one lease before an (endpoint, tier) gets another")
	fs.IntVar(&c.ChunkSize, "chunk-size", c.ChunkSize, "most blocks in one chunk key of an (endpoint, tier); new blocks fill the newest chunk (1 to 256)")
	fs.IntVar(&c.ChunkOpenAt, "chunk-open-at", c.ChunkOpenAt, "a record's first new block in a tier opens a new chunk when the newest already holds this many blocks, or, for a record storing --chunk-size/8 blocks or more there, the merge threshold (0: --chunk-size with a --window-linger, else 3/4 of it; --chunk-size: only when full, big records included)")
	fs.IntVar(&c.ChunkMergeBelow, "chunk-merge-below", c.ChunkMergeBelow, "a chunk other than the newest left with fewer blocks than this moves them to the newest and is deleted (0: --chunk-size/8, at least 1; 1: never)")
	fs.StringArrayVar(&f.mediums, "medium", nil, "NAME=gpu|cpu|disk|none: map the engine medium NAME (matched case-insensitively) to a tier, or with none take it out of the default table; repeatable. Changing the table drops each endpoint written under the old one at its next record")
	f.ops.Register(fs)
	return cmd
}

// positiveFlags are the ingester's flags whose zero or negative value
// ingester.Config.Validate refuses; nonNegativeFlags are those whose zero
// is documented (a default, or off). checkFlags refuses them first, so
// the error names the flag, not the Config field.
var (
	positiveFlags = []string{
		"lease-ttl", "liveness-window", "session-timeout", "rebalance-timeout", "max-txn-ops", "max-txn-bytes",
		"window-records", "window-ops", "queue-bytes", "keys-per-lease", "chunk-size", "max-map-entries",
		"map-rebuild-page-bytes", "etcd-dial-timeout",
	}
	nonNegativeFlags = []string{"outage-threshold", "outage-grace", "window-linger", "fetch-max-wait", "chunk-open-at", "chunk-merge-below"}
)

// checkFlags refuses the numeric flags' values the Config would refuse
// for their sign, naming the flag; what Validate refuses beyond that
// (ranges, rules between settings) comes back through common.FlagNames,
// which names the flags too.
func checkFlags(fs *pflag.FlagSet) error {
	if err := common.CheckPositive(fs, positiveFlags...); err != nil {
		return err
	}
	if err := common.CheckNonNegative(fs, nonNegativeFlags...); err != nil {
		return err
	}
	return nil
}

func run(ctx context.Context, fs *pflag.FlagSet, f *flags) error {
	if err := f.kafka.ValidateTopic(); err != nil {
		return err
	}
	if err := f.kafka.ValidateBrokers(); err != nil {
		return err
	}
	log, err := f.log.Logger()
	if err != nil {
		return err
	}
	kopts, err := f.auth.Opts(log)
	if err != nil {
		return err
	}
	reg := common.NewRegistry()
	watch := authwatch.New(reg, log.With("component", "auth"))
	kopts = append(kopts, kgo.WithHooks(watch.KafkaHook(f.auth.SASLMechanism)))
	f.etcd.Watch = watch
	ks, err := f.etcd.Keyspace()
	if err != nil {
		return err
	}
	cli, err := f.etcd.Client(ctx, log)
	if err != nil {
		return err
	}
	defer cli.Close()

	mediums, err := mediumTable(f.mediums)
	if err != nil {
		return err
	}
	cfg := f.cfg
	cfg.Mediums = mediums
	cfg.Etcd = cli
	cfg.Keyspace = ks
	cfg.Brokers = f.kafka.Brokers
	cfg.Topic = f.kafka.Topic
	cfg.KafkaOptions = append(cfg.KafkaOptions, kopts...)
	cfg.Registry = reg
	cfg.Logger = log
	ing, err := ingester.New(cfg)
	if err != nil {
		return common.FlagNames(err, fs, &f.cfg)
	}
	// An authentication failure is the reason first: the ingester alone
	// would say only that it is not consuming yet.
	ops, err := f.ops.Server(reg, func() error {
		if err := watch.Err(); err != nil {
			return err
		}
		return ing.Ready()
	}, nil)
	if err != nil {
		return err
	}
	log.Info("ingester starting", "id", cfg.ID, "brokers", logging.RedactURLs(f.kafka.Brokers), "topic", f.kafka.Topic, "group", cfg.Group,
		"kafka_tls", f.auth.TLS(), "kafka_sasl", f.auth.SASLMechanism, "kafka_user", f.auth.SASLUsername,
		"etcd", f.etcd.RedactedEndpoints(), "etcd_user", f.etcd.Username, "prefix", ks.Prefix(), "metrics", ops.Addr())

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return ops.Run(gctx) })
	g.Go(func() error { return ing.Run(gctx) })
	err = g.Wait()
	if ctx.Err() != nil {
		return nil // a signal: a clean stop
	}
	return err
}

// mediumTable applies --medium NAME=TIER changes, in order, to the default
// medium table (DESIGN v1.1). A name is replaced whatever its case: the
// table matches case-insensitively, so "cpu_tier2=cpu" replaces
// CPU_TIER2. The error names the flag and the entry.
func mediumTable(changes []string) (events.MediumMap, error) {
	m := events.DefaultMediums()
	for _, c := range changes {
		name, value, ok := strings.Cut(c, "=")
		if !ok || strings.TrimSpace(name) == "" {
			return nil, common.Usagef("--medium %q: want NAME=gpu|cpu|disk|none, NAME not empty", c)
		}
		for existing := range m {
			if strings.EqualFold(existing, name) {
				delete(m, existing)
			}
		}
		if value == "none" {
			continue
		}
		t, ok := tier.Parse(value)
		if !ok {
			return nil, common.Usagef("--medium %q: tier %q is not gpu, cpu, disk or none", c, value)
		}
		m[name] = t
	}
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("--medium: %w", err)
	}
	return m, nil
}
