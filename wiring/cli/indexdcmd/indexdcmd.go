// Package indexdcmd wires the `kvindex indexd` subcommand: flags to
// indexd.Config, the etcd client, the ops HTTP server (/metrics, /healthz,
// /readyz, optional pprof) and the indexd replica, run until a signal.
package indexdcmd

import (
	"errors"
	"fmt"
	"net"
	"net/http"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/sync/errgroup"

	"github.com/kvindex/kvindex/indexd"
	"github.com/kvindex/kvindex/internal/authwatch"
	"github.com/kvindex/kvindex/internal/contract"
	"github.com/kvindex/kvindex/wiring/cli/common"
)

// NewCommand returns `kvindex indexd`.
func NewCommand() *cobra.Command {
	f := indexdFlags{cfg: indexd.DefaultConfig()}
	cmd := &cobra.Command{
		Use:   "indexd",
		Short: "Serve Lookup from an in-memory index that lists and watches etcd",
		Long: `indexd lists kvindex's etcd keyspace at one revision into an in-memory
index, watches it from there, and answers kvindex.v1.IndexService (Lookup,
ListEndpoints) over gRPC, with the gRPC health service on the same port
(reflection too with --grpc-reflection, off by default). It reports
NOT_SERVING until its first list is applied; kvindex.v1.IndexService also
goes NOT_SERVING (and /readyz fails) while the last progress from etcd is
older than --max-staleness, while the overall "" status stays SERVING
(liveness). Run any number of replicas; they share nothing but etcd.

--tls-cert-file and --tls-key-file serve the API over TLS, and
--tls-client-ca-file requires client certificates (mutual TLS); the files
are re-read when they change. --health-listen adds a plaintext port that
serves only grpc.health.v1, for kubelet's gRPC probe (docs/security.md).`,
		Args: cobra.NoArgs,
		RunE: f.run,
	}
	f.register(cmd.Flags())
	return cmd
}

// indexdFlags holds the flags of `kvindex indexd`; cfg collects the
// indexd.Config fields that flags set directly.
type indexdFlags struct {
	logFlags   common.Logging
	etcdFlags  common.Etcd
	ops        common.Ops
	tlsFlags   common.ServerTLS
	reflect    bool
	healthAddr string
	cfg        indexd.Config
}

func (f *indexdFlags) register(fs *pflag.FlagSet) {
	f.logFlags.Register(fs)
	f.etcdFlags.Register(fs)
	f.ops.Register(fs, statusPath)
	fs.StringVar(&f.cfg.ListenAddr, "listen", contract.DefaultGRPCAddr, "gRPC listen address (Lookup, ListEndpoints, health; reflection with --grpc-reflection)")
	f.tlsFlags.Register(fs)
	fs.BoolVar(&f.reflect, "grpc-reflection", false, "serve gRPC server reflection on --listen (grpcurl without a .proto); off by default: it describes the API to any client")
	RegisterConnectionFlags(fs, &f.cfg)
	// Not a connection flag: `kvindex standalone` has no --health-listen.
	fs.IntVar(&f.cfg.HealthMaxConnections, "health-max-connections", indexd.DefaultHealthMaxConnections, "most open connections on --health-listen; past it new connections wait to be accepted")
	fs.StringVar(&f.healthAddr, "health-listen", "", "host:port of a plaintext port serving only grpc.health.v1, for kubelet probes (default: none)")
	fs.IntVar(&f.cfg.MaxHashes, "max-hashes", indexd.DefaultMaxHashes, "most block hashes one Lookup may carry")
	fs.IntVar(&f.cfg.MaxTokens, "max-tokens", indexd.DefaultMaxTokens, "most token ids one token Lookup may carry")
	fs.IntVar(&f.cfg.MaxMultiModalItems, "max-multimodal-items", indexd.DefaultMaxMultiModalItems, "most multimodal items one token Lookup may carry")
	fs.IntVar(&f.cfg.MaxExtraBytes, "max-extra-bytes", indexd.DefaultMaxExtraBytes, "longest LoRA name, cache salt or multimodal item hash of a token Lookup, in bytes")
	fs.IntVar(&f.cfg.MaxCandidates, "max-candidates", indexd.DefaultMaxCandidates, "most candidate endpoints one Lookup may carry")
	fs.IntVar(&f.cfg.MaxBarrierRecords, "max-barrier-records", indexd.DefaultMaxBarrierRecords, "most (topic, partition, offset) records one Lookup barrier may name")
	fs.IntVar(&f.cfg.MaxRequestBytes, "max-request-bytes", indexd.DefaultMaxRequestBytes, "largest encoded request accepted")
	fs.DurationVar(&f.cfg.BarrierTimeout, "barrier-timeout", indexd.DefaultBarrierTimeout, "how long a Lookup barrier waits when the request names no timeout")
	fs.DurationVar(&f.cfg.MaxBarrierTimeout, "max-barrier-timeout", indexd.DefaultMaxBarrierTimeout, "longest barrier timeout a request may ask for")
	fs.IntVar(&f.cfg.ListConcurrency, "list-concurrency", indexd.DefaultListConcurrency, "endpoint block ranges read from etcd at once while listing")
	fs.DurationVar(&f.cfg.ShutdownGrace, "shutdown-grace", indexd.DefaultShutdownGrace, "how long in-flight calls may finish on shutdown")
	fs.IntVar(&f.cfg.MaxBarrierWaiters, "max-barrier-waiters", indexd.DefaultMaxBarrierWaiters, "most Lookups waiting on a barrier at once; past it a Lookup whose barrier is not met fails RESOURCE_EXHAUSTED")
	fs.IntVar(&f.cfg.MaxConcurrentStreams, "max-concurrent-streams", indexd.DefaultMaxConcurrentStreams, "most calls in flight on one client connection; more wait in the client")
	fs.IntVar(&f.cfg.ListPageSize, "list-page-size", indexd.DefaultListPageSize, "endpoints per ListEndpoints page when the request names no page size")
	fs.IntVar(&f.cfg.MaxListPageSize, "max-list-page-size", indexd.DefaultMaxListPageSize,
		fmt.Sprintf("most endpoints per ListEndpoints page (at most %d, so a page fits gRPC's default 4 MiB)", indexd.ListPageSizeLimit))
	fs.DurationVar(&f.cfg.ProgressInterval, "progress-interval", indexd.DefaultProgressInterval, "how often the watch asks etcd for a progress notification (the age of the last one is every answer's staleness)")
	fs.DurationVar(&f.cfg.StaleLogAfter, "stale-log-after", indexd.DefaultStaleLogAfter, "age of the last progress from etcd past which the replica logs that it is stale")
	fs.DurationVar(&f.cfg.MaxStaleness, "max-staleness", indexd.DefaultMaxStaleness, "when positive, /readyz fails and health of kvindex.v1.IndexService is NOT_SERVING while the last progress from etcd is older than this (the \"\" health status stays SERVING); 0: off")
	fs.IntVar(&f.cfg.MaxInFlightBlocks, "max-inflight-blocks", indexd.DefaultMaxInFlightBlocks, "most blocks of Lookups answered at once, server-wide (a token Lookup counts its tokens / 16); past it Lookups fail RESOURCE_EXHAUSTED")
}

// run is the command's RunE: indexd and its ops server until the
// command's context ends.
func (f *indexdFlags) run(cmd *cobra.Command, _ []string) error {
	if err := common.CheckPositive(cmd.Flags(), append(positiveFlags, ConnectionFlags...)...); err != nil {
		return err
	}
	log, err := f.logFlags.LoggerTo(cmd.ErrOrStderr())
	if err != nil {
		return err
	}
	ks, err := f.etcdFlags.Keyspace()
	if err != nil {
		return err
	}
	ctx := cmd.Context()
	reg := common.NewRegistry()
	watch := authwatch.New(reg, log.With("component", "auth"))
	f.etcdFlags.Watch = watch
	cli, err := f.etcdFlags.Client(ctx, log)
	if err != nil {
		return err
	}
	defer cli.Close()
	f.cfg.Etcd, f.cfg.Keyspace, f.cfg.Registry, f.cfg.Logger = cli, ks, reg, log.With("component", "indexd")
	if f.cfg.TLS, err = f.tlsFlags.Config(log.With("component", "indexd-tls")); err != nil {
		return err
	}
	f.cfg.Reflection = f.reflect
	if f.healthAddr != "" {
		if _, port, err := net.SplitHostPort(f.healthAddr); err == nil && port != "0" && f.healthAddr == f.cfg.ListenAddr {
			return common.Usagef("--health-listen %s is --listen's address too: give the health port one of its own", f.healthAddr)
		}
		// Bound here so a busy port names its own flag.
		if f.cfg.HealthListener, err = net.Listen("tcp", f.healthAddr); err != nil {
			return fmt.Errorf("%w (--health-listen)", err)
		}
	}
	srv, err := indexd.New(f.cfg)
	if errors.Is(err, indexd.ErrInvalidConfig) {
		return common.FlagNames(err, cmd.Flags(), &f.cfg)
	}
	if err != nil {
		return fmt.Errorf("%w (--listen)", err) // the only other failure: binding the gRPC address
	}
	opsSrv, err := f.ops.Server(reg, func() error {
		if err := watch.Err(); err != nil {
			return err
		}
		return srv.Ready()
	}, map[string]http.Handler{statusPath: srv.StatusHandler()})
	if err != nil {
		return err
	}
	health := ""
	if a := srv.HealthAddr(); a != nil {
		health = a.String()
	}
	log.Info("indexd starting", "grpc", srv.Addr().String(), "tls", f.tlsFlags.Enabled(), "mtls", f.tlsFlags.ClientCAFile != "",
		"health", health, "metrics", opsSrv.Addr(), "etcd", f.etcdFlags.RedactedEndpoints())
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return srv.Run(gctx) })
	g.Go(func() error { return opsSrv.Run(gctx) })
	return g.Wait()
}

// positiveFlags are the flags whose zero or negative value is refused
// before indexd.Config.Validate would refuse it, so the error names the
// flag.
var positiveFlags = []string{
	"max-hashes", "max-tokens", "max-multimodal-items", "max-extra-bytes", "max-candidates", "max-barrier-records", "max-request-bytes",
	"barrier-timeout", "max-barrier-timeout", "list-concurrency", "shutdown-grace",
	"max-barrier-waiters", "max-concurrent-streams", "list-page-size", "max-list-page-size",
	"progress-interval", "stale-log-after", "max-inflight-blocks", "health-max-connections",
}

// statusPath is where the ops server serves indexd's status page.
const statusPath = "/status"

// ConnectionFlags are the flags RegisterConnectionFlags adds, all of
// which must be positive (common.CheckPositive).
var ConnectionFlags = []string{
	"max-connections", "handshake-timeout", "max-connection-idle",
	"max-connection-age", "max-connection-age-grace", "keepalive-min-time", "keepalive-time", "keepalive-timeout",
	"request-read-timeout", "max-metadata-bytes",
}

// RegisterConnectionFlags adds the flags of indexd's connection limits
// (docs/limits.md, "Connections") to fs, writing into cfg; `kvindex
// standalone` registers them too. Each defaults to indexd's default.
func RegisterConnectionFlags(fs *pflag.FlagSet, cfg *indexd.Config) {
	fs.IntVar(&cfg.MaxConnections, "max-connections", indexd.DefaultMaxConnections, "most open connections on --listen; past it new connections wait to be accepted")
	fs.DurationVar(&cfg.HandshakeTimeout, "handshake-timeout", indexd.DefaultHandshakeTimeout, "how long a new gRPC connection may take for its TLS handshake and HTTP/2 preface")
	fs.DurationVar(&cfg.MaxConnectionIdle, "max-connection-idle", indexd.DefaultMaxConnectionIdle, "close a gRPC connection with no call in flight for this long")
	fs.DurationVar(&cfg.MaxConnectionAge, "max-connection-age", indexd.DefaultMaxConnectionAge, "close every gRPC connection after this long (±10% jitter), so clients spread over new replicas")
	fs.DurationVar(&cfg.MaxConnectionAgeGrace, "max-connection-age-grace", indexd.DefaultMaxConnectionAgeGrace, "how long calls in flight may run on a connection closed for its age")
	fs.DurationVar(&cfg.KeepaliveMinTime, "keepalive-min-time", indexd.DefaultKeepaliveMinTime, "shortest keepalive ping interval a client may use; more often is GOAWAY too_many_pings")
	fs.DurationVar(&cfg.KeepaliveTime, "keepalive-time", indexd.DefaultKeepaliveTime, "ping a client connection after this long without activity")
	fs.DurationVar(&cfg.KeepaliveTimeout, "keepalive-timeout", indexd.DefaultKeepaliveTimeout, "close a connection whose ping is not acknowledged within this")
	fs.DurationVar(&cfg.RequestReadTimeout, "request-read-timeout", indexd.DefaultRequestReadTimeout, "cancel a call whose request message has not arrived this long after its headers")
	fs.IntVar(&cfg.MaxMetadataBytes, "max-metadata-bytes", indexd.DefaultMaxMetadataBytes, "largest header list (metadata) of a call, in bytes; more is refused")
}
