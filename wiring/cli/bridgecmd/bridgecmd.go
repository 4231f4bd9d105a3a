// Package bridgecmd wires `kvindex bridge`: the sidecar that subscribes to
// one engine endpoint's ZMQ KV-event socket and produces its batches to
// Kafka (package bridge), with the ops HTTP server (metrics, probes).
package bridgecmd

import (
	"context"
	"errors"
	"io"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/sync/errgroup"

	"github.com/kvindex/kvindex/bridge"
	"github.com/kvindex/kvindex/internal/authwatch"
	"github.com/kvindex/kvindex/internal/kafkaauth"
	"github.com/kvindex/kvindex/internal/logging"
	"github.com/kvindex/kvindex/wiring/cli/common"
)

// flags are the command's flags beyond the shared ones.
type flags struct {
	logging      common.Logging
	kafka        common.Kafka
	auth         kafkaauth.Config
	zmqTopic     string
	offsetByRank bool
	// dialFlags is set when --zmq or --replay was given; podFlag when
	// --pod was.
	dialFlags, podFlag bool
	ops                common.Ops
	// cfg holds the bridge's own settings, --zmq, --replay and
	// --zmq-bind (Endpoint, ReplayEndpoint, Listen) among them: bound to
	// its fields, so that its errors name the flags (common.FlagNames).
	cfg bridge.Config
	// cellMap is --cell-map (cells.go).
	cellMap string
}

// NewCommand returns `kvindex bridge`.
func NewCommand() *cobra.Command {
	f := &flags{cfg: bridge.DefaultConfig()}
	cmd := &cobra.Command{
		Use:   "bridge (--pod POD --model MODEL [--zmq tcp://HOST:5557] [--replay tcp://HOST:5558] | --zmq-bind tcp://*:5557 [--replay-pattern tcp://{host}:5558])",
		Short: "Forward engines' ZMQ KV events to Kafka (a sidecar per endpoint, or one bridge pods connect to)",
		Long: `bridge subscribes to a model server's ZMQ KV-event PUB socket (vLLM's
--kv-events-config publisher "zmq"), heals sequence gaps from its replay
socket, and produces one Kafka record per batch: key = --pod, value = the
batch exactly as published, headers model, seq and dp_rank. It sends
kind=heartbeat records while the engine is connected, kind=resync when
batches were lost for good, and kind=goodbye on shutdown if the engine went
away within --grace-period (none if it is still there: a sidecar-only
restart keeps the endpoint's blocks).

The engine of data-parallel rank N binds its configured ports + N (vLLM's
rule); give the configured endpoints and --dp-rank N, or set
--offset-by-rank=false and give the exact ports.

Bind mode (--zmq-bind, alias --listen): the bridge binds the endpoint and
any number of engines connect their PUB sockets to it, as an llm-d fleet's
pods connect to llm-d's subscriber. Each message's topic names its pod and
model (--topic-pattern, llm-d's kv@{pod}@{model} by default); each pod has
its own sequence tracking, and its gaps are replayed from
--replay-pattern (e.g. tcp://{host}:5558) or, without one, resync that pod.
--pod, --model (unless the pattern names no model), --dp-rank, --zmq and
--replay are the dial mode's.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := common.CheckPositive(cmd.Flags(), positiveFlags...); err != nil {
				return err
			}
			if err := common.CheckNonNegative(cmd.Flags(), "grace-period"); err != nil {
				return err
			}
			f.dialFlags = cmd.Flags().Changed("zmq") || cmd.Flags().Changed("replay")
			f.podFlag = cmd.Flags().Changed("pod")
			return f.run(cmd.Context(), cmd.Flags(), cmd.ErrOrStderr())
		},
	}
	fs := cmd.Flags()
	f.logging.Register(fs)
	f.kafka.Register(fs)
	f.auth.Register(fs)
	// --listen is --zmq-bind under another name (pflag's normalization:
	// one flag, so errors and help name --zmq-bind).
	fs.SetNormalizeFunc(func(_ *pflag.FlagSet, name string) pflag.NormalizedName {
		if name == "listen" {
			name = "zmq-bind"
		}
		return pflag.NormalizedName(name)
	})
	fs.StringVar(&f.cfg.Endpoint, "zmq", "tcp://127.0.0.1:5557", "the engine's ZMQ PUB endpoint, tcp://HOST:PORT")
	fs.StringVar(&f.cfg.Listen, "zmq-bind", "", "bind mode: the endpoint to bind, tcp://HOST:PORT (HOST * for every interface), that engines' PUB sockets connect to (alias --listen)")
	fs.StringVar(&f.cfg.TopicPattern, "topic-pattern", f.cfg.TopicPattern, "bind mode: how a ZMQ topic names its endpoint, with {pod} and {model} (llm-d's convention by default)")
	fs.StringVar(&f.cfg.ReplayPattern, "replay-pattern", "", "bind mode: each pod's replay endpoint from its topic, with {pod}, {host} (the pod without :port) and {model}, e.g. tcp://{host}:5558; without it gaps resync the pod")
	fs.IntVar(&f.cfg.MaxPods, "max-pods", f.cfg.MaxPods, "bind mode: most pods (topics) kept; messages of further ones are skipped and counted")
	fs.IntVar(&f.cfg.MaxConnections, "max-connections", f.cfg.MaxConnections, "bind mode: most publisher connections open at once; further ones are closed and counted")
	fs.IntVar(&f.cfg.PodQueueSize, "pod-queue-size", f.cfg.PodQueueSize, "bind mode: messages queued per pod between its connection and its sequencer")
	fs.DurationVar(&f.cfg.PodIdleTimeout, "pod-idle-timeout", f.cfg.PodIdleTimeout, "bind mode: how long a pod without a connection is kept before it is forgotten")
	fs.StringVar(&f.cfg.ReplayEndpoint, "replay", "", "the engine's ZMQ ROUTER replay endpoint, tcp://HOST:PORT (vLLM's replay_endpoint); without it gaps produce resyncs")
	fs.StringVar(&f.cellMap, "cell-map", "", "cell map file (docs/DESIGN.md \"Cells\"): the topic (and brokers) come from the cell of the model and pod, --topic is unused; re-read every second, and an endpoint whose cell changes moves (goodbye in the old cell, resync in the new)")
	fs.StringVar(&f.zmqTopic, "zmq-topic", "", "ZMQ subscription prefix (vLLM's topic, default empty)")
	fs.StringVar(&f.cfg.Pod, "pod", "", "the endpoint's pod identity as routers know it (record key); required")
	fs.StringVar(&f.cfg.Model, "model", "", "the served model name; required")
	fs.Uint32Var(&f.cfg.DPRank, "dp-rank", 0, "the engine's data-parallel rank (dp_rank header, and the port offset)")
	fs.BoolVar(&f.offsetByRank, "offset-by-rank", true, "add --dp-rank to the ports of --zmq and --replay, as vLLM does when it binds them")
	f.ops.Register(fs)
	fs.DurationVar(&f.cfg.HeartbeatInterval, "heartbeat-interval", f.cfg.HeartbeatInterval, "period of kind=heartbeat records while the engine is connected (keep well below the ingester's --liveness-window)")
	fs.DurationVar(&f.cfg.GracePeriod, "grace-period", f.cfg.GracePeriod, "after SIGTERM, how long to watch the engine: goodbye if it goes away, none if it stays (0: never goodbye)")
	fs.DurationVar(&f.cfg.FlushTimeout, "flush-timeout", f.cfg.FlushTimeout, "bound on each Kafka flush at shutdown")
	fs.IntVar(&f.cfg.MaxBufferedRecords, "max-buffered-records", f.cfg.MaxBufferedRecords, "records the Kafka client may hold unacknowledged before the bridge blocks")
	fs.IntVar(&f.cfg.MaxBufferedBytes, "max-buffered-bytes", f.cfg.MaxBufferedBytes, "bytes the Kafka client may hold unacknowledged before the bridge blocks")
	fs.IntVar(&f.cfg.MaxRecordBytes, "max-record-bytes", f.cfg.MaxRecordBytes, "largest batch produced; larger ones are skipped and replaced by a resync (keep below the topic's max.message.bytes)")
	fs.IntVar(&f.cfg.MaxMessageBytes, "max-message-bytes", f.cfg.MaxMessageBytes, "largest ZMQ message read from the engine")
	return cmd
}

// positiveFlags are the bridge's numeric flags whose zero or negative
// value bridge.Config.Validate refuses, refused first so that the error
// names the flag (the bind mode's among them, whichever mode runs).
var positiveFlags = []string{
	"max-pods", "max-connections", "pod-queue-size", "pod-idle-timeout", "heartbeat-interval", "flush-timeout",
	"max-buffered-records", "max-buffered-bytes", "max-record-bytes", "max-message-bytes",
}

// checkKafka refuses --topic and --brokers values the bridge cannot
// use, as usage errors (exit status 2, like every other bad flag): a
// topic Kafka would refuse (empty among them), no broker, an empty entry
// ("--brokers ','" splits into two), an entry with credentials.
func (f *flags) checkKafka() error {
	if err := f.kafka.ValidateTopic(); err != nil {
		return err
	}
	if len(f.kafka.Brokers) == 0 {
		return common.Usagef("--brokers must name at least one Kafka broker (host:port)")
	}
	return f.kafka.ValidateBrokers()
}

// run runs the bridge, logging to stderr (the command's ErrOrStderr, so an
// in-process caller reads the lines, the bound address among them).
func (f *flags) run(ctx context.Context, fs *pflag.FlagSet, stderr io.Writer) error {
	if err := f.checkKafka(); err != nil {
		return err
	}
	log, err := f.logging.LoggerTo(stderr)
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
	cfg := f.cfg
	cfg.KafkaOptions = append(cfg.KafkaOptions, kopts...)
	cfg.ZMQTopic = f.zmqTopic
	cfg.Brokers, cfg.Topic = f.kafka.Brokers, f.kafka.Topic
	if cfg.Listen != "" {
		if f.dialFlags {
			return common.Usagef("--zmq and --replay are the dial mode's; with --zmq-bind, pods connect and --replay-pattern names their replay sockets")
		}
		if f.podFlag {
			// Ignored before: a bind-mode bridge given --pod looked as if
			// it keyed its records by it.
			return common.Usagef("--pod is the dial mode's; with --zmq-bind each message's ZMQ topic names its pod (--topic-pattern)")
		}
		cfg.Endpoint = ""
	} else if f.offsetByRank {
		// The engine of rank r binds each port + r: a rank past the port
		// range is as much --dp-rank's as the endpoint's.
		if cfg.Endpoint, err = bridge.OffsetEndpointPort(cfg.Endpoint, cfg.DPRank); err != nil {
			return common.Usagef("--zmq with --dp-rank %d: %w", cfg.DPRank, err)
		}
		if cfg.ReplayEndpoint, err = bridge.OffsetEndpointPort(cfg.ReplayEndpoint, cfg.DPRank); err != nil {
			return common.Usagef("--replay with --dp-rank %d: %w", cfg.DPRank, err)
		}
	}
	cfg.Registry = reg
	cfg.Logger = log.With("component", "bridge")
	cells, err := f.cells(&cfg, log)
	if err != nil {
		return err
	}
	b, err := bridge.New(cfg)
	if err != nil {
		return common.FlagNames(err, fs, &f.cfg)
	}
	ops, err := f.ops.Server(reg, func() error {
		if err := watch.Err(); err != nil {
			return err
		}
		return b.Ready()
	}, nil)
	if err != nil {
		return err
	}
	log.Info("bridge starting", "listen", cfg.Listen, "pod", cfg.Pod, "model", cfg.Model, "brokers", logging.RedactURLs(cfg.Brokers), "topic", cfg.Topic,
		"kafka_tls", f.auth.TLS(), "kafka_sasl", f.auth.SASLMechanism, "kafka_user", f.auth.SASLUsername, "metrics", ops.Addr())
	g, gctx := errgroup.WithContext(ctx)
	// The ops server stops when the bridge has finished its shutdown (or
	// failed), so probes and metrics stay up through the grace period.
	opsCtx, stopOps := context.WithCancel(context.WithoutCancel(ctx))
	defer stopOps()
	g.Go(func() error {
		err := ops.Run(opsCtx)
		if errors.Is(err, context.Canceled) {
			return nil
		}
		return err
	})
	if cells != nil {
		g.Go(func() error { return cells.Run(opsCtx) })
	}
	g.Go(func() error {
		defer stopOps()
		return b.Run(gctx)
	})
	return g.Wait()
}
