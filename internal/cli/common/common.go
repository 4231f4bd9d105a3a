// Package common holds the flags and wiring every kvindex subcommand shares,
// so a flag has one name, one default and one meaning everywhere: logging,
// etcd, Kafka and the ops server. The default addresses `kvindex
// standalone` listens on, which the operator commands dial when given no
// address, are internal/contract's.
package common

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/pflag"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvindex/kvindex/internal/contract"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/logging"
	"github.com/kvindex/kvindex/internal/opsserver"
)

// Logging holds --log-level and --log-format.
type Logging struct {
	Level  string
	Format string
}

// Register adds the logging flags to fs.
func (l *Logging) Register(fs *pflag.FlagSet) {
	fs.StringVar(&l.Level, "log-level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&l.Format, "log-format", "text", "log format: text or json")
}

// Logger builds the logger the flags describe, writing to stderr.
func (l *Logging) Logger() (*slog.Logger, error) {
	return logging.New(os.Stderr, l.Level, logging.Format(l.Format))
}

// Etcd holds the flags that locate kvindex's data in etcd.
type Etcd struct {
	Endpoints   []string
	Prefix      string
	DialTimeout time.Duration
	// CACert, Cert and Key are PEM files for TLS to etcd, named as
	// etcdctl's --cacert, --cert and --key: CACert alone verifies the
	// server; Cert and Key add a client certificate. All empty means
	// plaintext (an https endpoint then verifies against the system roots).
	CACert, Cert, Key string
}

// Register adds --etcd-endpoints, --etcd-prefix and --etcd-dial-timeout to fs.
func (e *Etcd) Register(fs *pflag.FlagSet) {
	fs.StringSliceVar(&e.Endpoints, "etcd-endpoints", []string{contract.DefaultEtcdEndpoint}, "etcd client URLs, comma separated")
	fs.StringVar(&e.Prefix, "etcd-prefix", keyspace.DefaultPrefix, "prefix of every kvindex key in etcd (must end in '/')")
	fs.DurationVar(&e.DialTimeout, "etcd-dial-timeout", 5*time.Second, "timeout of each attempt to connect to etcd (the roles keep retrying while etcd is down)")
	fs.StringVar(&e.CACert, "etcd-cacert", "", "PEM CA bundle that verifies etcd's server certificate (TLS)")
	fs.StringVar(&e.Cert, "etcd-cert", "", "PEM client certificate for etcd (needs --etcd-key)")
	fs.StringVar(&e.Key, "etcd-key", "", "PEM client key for etcd (needs --etcd-cert)")
}

// tlsConfig builds the client TLS config the flags describe, or nil for
// plaintext.
func (e *Etcd) tlsConfig() (*tls.Config, error) {
	if e.CACert == "" && e.Cert == "" && e.Key == "" {
		return nil, nil
	}
	if (e.Cert == "") != (e.Key == "") {
		return nil, fmt.Errorf("--etcd-cert and --etcd-key go together")
	}
	info := transport.TLSInfo{TrustedCAFile: e.CACert, CertFile: e.Cert, KeyFile: e.Key}
	cfg, err := info.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("etcd TLS (--etcd-cacert, --etcd-cert, --etcd-key): %w", err)
	}
	return cfg, nil
}

// Keyspace returns the keyspace under --etcd-prefix.
func (e *Etcd) Keyspace() (keyspace.Keyspace, error) { return keyspace.New(e.Prefix) }

// Client dials etcd. The caller closes the client.
func (e *Etcd) Client(ctx context.Context, log *slog.Logger) (*clientv3.Client, error) {
	tlsCfg, err := e.tlsConfig()
	if err != nil {
		return nil, err
	}
	cli, err := clientv3.New(clientv3.Config{
		TLS:                  tlsCfg,
		Endpoints:            e.Endpoints,
		DialTimeout:          e.DialTimeout,
		DialKeepAliveTime:    10 * time.Second,
		DialKeepAliveTimeout: 5 * time.Second,
		Logger:               logging.Zap(log.With("component", "etcd-client")),
		Context:              ctx,
	})
	if err != nil {
		return nil, fmt.Errorf("connecting to etcd %v (--etcd-endpoints): %w", e.Endpoints, err)
	}
	return cli, nil
}

// Ops holds --metrics-listen and --pprof: the role's ops HTTP server.
type Ops struct {
	Listen string
	Pprof  bool
}

// Register adds --metrics-listen and --pprof to fs.
func (o *Ops) Register(fs *pflag.FlagSet) {
	fs.StringVar(&o.Listen, "metrics-listen", contract.DefaultMetricsAddr, "host:port of the ops HTTP server (/metrics, /healthz, /readyz)")
	fs.BoolVar(&o.Pprof, "pprof", false, "serve /debug/pprof/ on --metrics-listen")
}

// Server binds the ops HTTP server on --metrics-listen, serving reg and
// reporting ready.
func (o *Ops) Server(reg *prometheus.Registry, ready func() error) (*opsserver.Server, error) {
	srv, err := opsserver.New(opsserver.Config{Addr: o.Listen, Registry: reg, Ready: ready, Pprof: o.Pprof})
	if err != nil {
		return nil, fmt.Errorf("%w (--metrics-listen)", err)
	}
	return srv, nil
}

// NewRegistry returns a Prometheus registry holding the Go runtime and
// process collectors, for a role to register its own metrics on.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// Kafka holds --brokers and --topic.
type Kafka struct {
	Brokers []string
	Topic   string
}

// Register adds --brokers and --topic to fs.
func (k *Kafka) Register(fs *pflag.FlagSet) {
	fs.StringSliceVar(&k.Brokers, "brokers", []string{contract.DefaultKafkaAddr}, "Kafka seed brokers, comma separated host:port")
	fs.StringVar(&k.Topic, "topic", contract.DefaultTopic, "Kafka topic of KV event records")
}
