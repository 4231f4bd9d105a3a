// Package standalonecmd wires `kvindex standalone`: the whole pipeline in
// one process on embedded defaults (wiring/stack): an embedded etcd, an
// in-process Kafka broker (franz-go's kfake), one ingester and one indexd.
// It prints where each part listens, so producers, etcdctl, kcat and
// routers can be pointed at it, and keeps its data under --data-dir across
// restarts.
package standalonecmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvindex/kvindex/indexd"
	"github.com/kvindex/kvindex/ingester"
	"github.com/kvindex/kvindex/internal/contract"
	"github.com/kvindex/kvindex/internal/etcdembed"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/wiring/cli/common"
	"github.com/kvindex/kvindex/wiring/cli/indexdcmd"
	"github.com/kvindex/kvindex/wiring/stack"
)

type flags struct {
	log         common.Logging
	dataDir     string
	etcdAddr    string
	kafkaAddr   string
	grpcAddr    string
	metricsAddr string
	topic       string
	partitions  int32
	liveness    time.Duration
	hashMode    string
	tls         common.ServerTLS
	reflect     bool
	// conns holds the connection-limit flags (indexdcmd's).
	conns indexd.Config
}

// flagOf names the flag that sets each component's address, for errors.
var flagOf = map[string]string{"etcd": "--etcd-listen", "kafka": "--kafka-listen", "grpc": "--listen", "metrics": "--metrics-listen"}

// NewCommand returns `kvindex standalone`.
func NewCommand() *cobra.Command {
	var f flags
	cmd := &cobra.Command{
		Use:   "standalone",
		Short: "Run the whole pipeline in one process (embedded etcd and Kafka, ingester, indexd)",
		Long: `standalone starts an embedded etcd, an in-process Kafka broker, one ingester
and one indexd, and prints their addresses. Produce KV-event records to the
Kafka address (topic kvindex-events), look blocks up with 'kvindex lookup',
and inspect keys with etcdctl. Data (etcd's and the Kafka log) is kept in
--data-dir, so a restart resumes where it stopped. Ctrl-C stops it cleanly.
--tls-cert-file, --tls-key-file and --tls-client-ca-file serve the gRPC
listener over TLS or mutual TLS, as indexd does.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := common.CheckPositive(cmd.Flags(), append([]string{"partitions", "liveness-window"}, indexdcmd.ConnectionFlags...)...); err != nil {
				return err
			}
			if err := common.ValidateTopic(f.topic); err != nil {
				return common.Usagef("--topic: %w", err)
			}
			if _, err := keyspace.ParseHashMode(f.hashMode); err != nil {
				return common.Usagef("--hash-mode: %w", err)
			}
			if err := ingester.CheckLivenessWindow(f.liveness); err != nil {
				return common.Usagef("--liveness-window %w", err)
			}
			if f.partitions > stack.MaxPartitions {
				return common.Usagef("--partitions %d: at most %d (the in-process broker keeps state per partition)", f.partitions, stack.MaxPartitions)
			}
			for _, fl := range []struct{ name, v string }{{"data-dir", f.dataDir}, {"etcd-listen", f.etcdAddr}, {"kafka-listen", f.kafkaAddr}, {"listen", f.grpcAddr}, {"metrics-listen", f.metricsAddr}} {
				if fl.v == "" {
					return common.Usagef("--%s must not be empty", fl.name)
				}
			}
			return run(cmd.Context(), cmd.OutOrStdout(), &f)
		},
	}
	fs := cmd.Flags()
	f.log.Register(fs)
	// The addresses go to stdout; the components' own logs are for
	// trouble, so the default shows warnings and errors only.
	fs.Lookup("log-level").DefValue = "warn"
	f.log.Level = "warn"
	fs.StringVar(&f.dataDir, "data-dir", "./kvindex-data", "directory for etcd's data and the Kafka log (kept across restarts)")
	fs.StringVar(&f.etcdAddr, "etcd-listen", contract.DefaultEtcdAddr, "etcd client host:port")
	fs.StringVar(&f.kafkaAddr, "kafka-listen", contract.DefaultKafkaAddr, "Kafka broker host:port")
	fs.StringVar(&f.grpcAddr, "listen", contract.DefaultGRPCAddr, "indexd gRPC host:port")
	f.tls.Register(fs)
	fs.BoolVar(&f.reflect, "grpc-reflection", true, "serve gRPC server reflection on --listen (on by default here, the developer's stack; off by default in indexd)")
	indexdcmd.RegisterConnectionFlags(fs, &f.conns)
	fs.StringVar(&f.metricsAddr, "metrics-listen", contract.DefaultMetricsAddr, "host:port of /metrics, /healthz, /readyz and the status page /status")
	fs.StringVar(&f.topic, "topic", contract.DefaultTopic, "Kafka topic of KV-event records (created if missing)")
	fs.Int32Var(&f.partitions, "partitions", stack.DefaultPartitions, "partitions of the topic when it is created")
	fs.DurationVar(&f.liveness, "liveness-window", ingester.DefaultLivenessWindow, "drop an endpoint that sent no batch or heartbeat for this long (the bridge heartbeats every 5 s)")
	fs.StringVar(&f.hashMode, "hash-mode", string(keyspace.HashModeToken), "block keys: token (kvindex's canonical key of each block's tokens) or engine (the engine's own hash)")
	return cmd
}

func run(ctx context.Context, out io.Writer, f *flags) error {
	log, err := f.log.Logger()
	if err != nil {
		return err
	}
	mode, err := keyspace.ParseHashMode(f.hashMode)
	if err != nil {
		return fmt.Errorf("--hash-mode: %w", err)
	}
	tlsCfg, err := f.tls.Config(log.With("component", "indexd-tls"))
	if err != nil {
		return err
	}
	s, err := stack.Start(ctx, stack.Config{
		DataDir: f.dataDir, EtcdAddr: f.etcdAddr, KafkaAddr: f.kafkaAddr, GRPCAddr: f.grpcAddr, MetricsAddr: f.metricsAddr,
		Topic: f.topic, Partitions: f.partitions, Logger: log,
		Ingester: func(c *ingester.Config) { c.LivenessWindow, c.HashMode = f.liveness, mode },
		Indexd: func(c *indexd.Config) {
			c.TLS, c.Reflection = tlsCfg, f.reflect
			c.MaxConnections, c.HandshakeTimeout = f.conns.MaxConnections, f.conns.HandshakeTimeout
			c.MaxConnectionIdle, c.MaxConnectionAge, c.MaxConnectionAgeGrace = f.conns.MaxConnectionIdle, f.conns.MaxConnectionAge, f.conns.MaxConnectionAgeGrace
			c.KeepaliveMinTime, c.KeepaliveTime, c.KeepaliveTimeout = f.conns.KeepaliveMinTime, f.conns.KeepaliveTime, f.conns.KeepaliveTimeout
			c.RequestReadTimeout, c.MaxMetadataBytes = f.conns.RequestReadTimeout, f.conns.MaxMetadataBytes
		},
	})
	var ae *stack.AddrError
	switch {
	case errors.As(err, &ae):
		return fmt.Errorf("%w (choose another with %s)", err, flagOf[ae.Which])
	case errors.Is(err, stack.ErrHashModeChange):
		return fmt.Errorf("%w: run that mode on another --data-dir, or remove %s to start afresh", err, f.dataDir)
	case errors.Is(err, stack.ErrNestedDataDir):
		return fmt.Errorf("%w (choose a --data-dir outside it)", err)
	case errors.Is(err, etcdembed.ErrDataDirInUse):
		return fmt.Errorf("%w (another kvindex standalone? stop it, or choose another --data-dir)", err)
	case err != nil && errors.Is(err, context.Canceled) && ctx.Err() != nil:
		// Ctrl-C while starting: what started is stopped again, as after
		// "ready", and that is no failure.
		fmt.Fprintln(out, "stopped")
		return nil
	case err != nil:
		return err
	}
	fmt.Fprintf(out, "kafka: %s (topic %s)\n", s.KafkaAddr(), s.Topic())
	switch {
	case f.tls.ClientCAFile != "":
		fmt.Fprintf(out, "grpc: %s (mutual TLS)\n", s.GRPCAddr())
	case tlsCfg != nil:
		fmt.Fprintf(out, "grpc: %s (TLS)\n", s.GRPCAddr())
	default:
		fmt.Fprintf(out, "grpc: %s\n", s.GRPCAddr())
	}
	fmt.Fprintf(out, "etcd: %s\n", s.EtcdURL())
	fmt.Fprintf(out, "metrics: http://%s/metrics\n", s.MetricsAddr())
	fmt.Fprintf(out, "status: http://%s/status\n", s.MetricsAddr())
	fmt.Fprintf(out, "data: %s\n", f.dataDir)

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.Run(runCtx) }()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for ready := false; ; {
		select {
		case err := <-done:
			if err == nil {
				fmt.Fprintln(out, "stopped")
			}
			return err
		case <-tick.C:
			if !ready && s.Ready() == nil {
				ready = true
				fmt.Fprintln(out, "ready (Ctrl-C stops)")
			}
		}
	}
}
