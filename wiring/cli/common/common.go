// Package common holds the flags and wiring every kvindex subcommand shares,
// so a flag has one name, one default and one meaning everywhere: logging,
// etcd, Kafka and the ops server. The default addresses `kvindex
// standalone` listens on, which the operator commands dial when given no
// address, are internal/contract's.
package common

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/pflag"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	etcdcreds "go.etcd.io/etcd/client/v3/credentials"
	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"

	"github.com/kvindex/kvindex/internal/authwatch"
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
	return l.LoggerTo(os.Stderr)
}

// LoggerTo builds the logger the flags describe, writing to w (a
// command's ErrOrStderr, so an in-process caller can read the lines).
// A bad value is a usage error (exit 2) naming its flag.
func (l *Logging) LoggerTo(w io.Writer) (*slog.Logger, error) {
	log, err := logging.New(w, l.Level, logging.Format(l.Format))
	switch {
	case errors.Is(err, logging.ErrLevel):
		return nil, Usagef("--log-level: %w", err)
	case errors.Is(err, logging.ErrFormat):
		return nil, Usagef("--log-format: %w", err)
	}
	return log, err
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
	// Username and PasswordFile authenticate to etcd with its RBAC
	// (--etcd-username, --etcd-password-file). The password is read from
	// the file when the client is built, never taken on the command line
	// and never logged. Both empty: no password authentication (etcd
	// then takes the user from the client certificate's common name, if
	// it runs with --client-cert-auth).
	Username, PasswordFile string
	// Watch, when set, hears of every TLS handshake to etcd, so a failing
	// one is logged at ERROR, counted and reported by /readyz
	// (internal/authwatch). Set by the role before Client.
	Watch *authwatch.Watch
	// ReconnectMaxDelay caps the wait between attempts to reconnect to an
	// etcd member that went away (0: DefaultEtcdReconnectMaxDelay).
	ReconnectMaxDelay time.Duration
}

// DefaultEtcdReconnectMaxDelay is the longest wait between reconnection
// attempts to an etcd member. gRPC's own default grows to 120 s, so a role
// could stay disconnected for a minute or two after etcd came back (24 s
// and more in a fault attack); 5 s bounds that, at a few attempts a
// minute per member while one is down.
const DefaultEtcdReconnectMaxDelay = 5 * time.Second

// Register adds --etcd-endpoints, --etcd-prefix and --etcd-dial-timeout to fs.
func (e *Etcd) Register(fs *pflag.FlagSet) {
	fs.StringSliceVar(&e.Endpoints, "etcd-endpoints", []string{contract.DefaultEtcdEndpoint}, "etcd client URLs, comma separated")
	fs.StringVar(&e.Prefix, "etcd-prefix", keyspace.DefaultPrefix, "prefix of every kvindex key in etcd (must end in '/')")
	fs.DurationVar(&e.DialTimeout, "etcd-dial-timeout", 5*time.Second, "timeout of each attempt to connect to etcd (the roles keep retrying while etcd is down; inspect and migrate give up after one read fails to answer within it)")
	fs.StringVar(&e.CACert, "etcd-cacert", "", "PEM CA bundle that verifies etcd's server certificate (TLS)")
	fs.StringVar(&e.Cert, "etcd-cert", "", "PEM client certificate for etcd (needs --etcd-key)")
	fs.StringVar(&e.Key, "etcd-key", "", "PEM client key for etcd (needs --etcd-cert)")
	fs.StringVar(&e.Username, "etcd-username", "", "etcd user (RBAC; needs --etcd-password-file)")
	fs.StringVar(&e.PasswordFile, "etcd-password-file", "", "file holding the etcd user's password (one trailing newline ignored; never logged)")
}

// RedactedEndpoints are --etcd-endpoints with any user information in
// them replaced (logging.RedactURL), for logs and errors.
func (e *Etcd) RedactedEndpoints() []string { return logging.RedactURLs(e.Endpoints) }

// checkEndpoints refuses no endpoint or an empty one (usage errors),
// endpoints carrying user information (etcd's
// client ignores it; --etcd-username and --etcd-password-file are the way)
// and TLS settings that disagree with the endpoints' schemes: TLS flags
// with an http:// endpoint (which would connect in plaintext regardless),
// and endpoints mixing http:// and https://. Endpoints with no scheme
// follow the TLS flags. Its errors show endpoints redacted.
func (e *Etcd) checkEndpoints() error {
	tlsFlags := e.CACert != "" || e.Cert != "" || e.Key != ""
	var plain, secure string
	if len(e.Endpoints) == 0 {
		return Usagef("--etcd-endpoints must name at least one etcd endpoint (http://host:port, https://host:port or host:port)")
	}
	for _, ep := range e.Endpoints {
		if strings.TrimSpace(ep) == "" {
			return Usagef("--etcd-endpoints has an empty endpoint")
		}
		if logging.RedactURL(ep) != ep {
			return fmt.Errorf("--etcd-endpoints: %s carries credentials, which etcd's client ignores: use --etcd-username and --etcd-password-file", logging.RedactURL(ep))
		}
		switch {
		case strings.HasPrefix(ep, "http://"), strings.HasPrefix(ep, "unix://"):
			plain = logging.RedactURL(ep)
		case strings.HasPrefix(ep, "https://"), strings.HasPrefix(ep, "unixs://"):
			secure = logging.RedactURL(ep)
		}
	}
	switch {
	case plain != "" && secure != "":
		return fmt.Errorf("--etcd-endpoints mixes plaintext %s and TLS %s: use one scheme", plain, secure)
	case plain != "" && tlsFlags:
		return fmt.Errorf("--etcd-cacert, --etcd-cert or --etcd-key given, but endpoint %s is plaintext: use https:// endpoints for TLS", plain)
	}
	return nil
}

// password reads --etcd-password-file. Its errors name the file, never
// its content.
func (e *Etcd) password() (string, error) {
	if (e.Username == "") != (e.PasswordFile == "") {
		return "", fmt.Errorf("--etcd-username and --etcd-password-file go together")
	}
	if e.PasswordFile == "" {
		return "", nil
	}
	return ReadSecretFile(e.PasswordFile, "--etcd-password-file")
}

// ReadSecretFile reads a password from path, dropping one trailing "\n"
// or "\r\n" (what `echo` and most editors add). It errors, naming flag
// and path but never the content, when the file cannot be read or the
// password is empty.
func ReadSecretFile(path, flag string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("%s: %w", flag, err)
	}
	s := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	if s == "" {
		return "", fmt.Errorf("%s: %s holds an empty password", flag, path)
	}
	return s, nil
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
	if e.CACert != "" {
		// etcd's TLSInfo takes a file with no certificate in it and
		// then fails every handshake; refuse it here, naming the flag.
		pem, err := os.ReadFile(e.CACert)
		if err != nil {
			return nil, fmt.Errorf("--etcd-cacert: %w", err)
		}
		if !x509.NewCertPool().AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--etcd-cacert: %s holds no PEM certificate", e.CACert)
		}
	}
	info := transport.TLSInfo{TrustedCAFile: e.CACert, CertFile: e.Cert, KeyFile: e.Key}
	cfg, err := info.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("etcd TLS (--etcd-cacert, --etcd-cert, --etcd-key): %w", err)
	}
	return cfg, nil
}

// Keyspace returns the keyspace under --etcd-prefix; its error names the
// flag.
func (e *Etcd) Keyspace() (keyspace.Keyspace, error) {
	ks, err := keyspace.New(e.Prefix)
	if err != nil {
		return ks, fmt.Errorf("--etcd-prefix: %w", err)
	}
	return ks, nil
}

// Client dials etcd, refusing TLS flags that disagree with the endpoints'
// schemes and reading --etcd-password-file. The caller closes the client.
func (e *Etcd) Client(ctx context.Context, log *slog.Logger) (*clientv3.Client, error) {
	if err := e.checkEndpoints(); err != nil {
		return nil, err
	}
	tlsCfg, err := e.tlsConfig()
	if err != nil {
		return nil, err
	}
	password, err := e.password()
	if err != nil {
		return nil, err
	}
	maxDelay := e.ReconnectMaxDelay
	if maxDelay <= 0 {
		maxDelay = DefaultEtcdReconnectMaxDelay
	}
	bo := grpcbackoff.DefaultConfig
	bo.MaxDelay = maxDelay
	bo.BaseDelay = min(bo.BaseDelay, maxDelay)
	dialOpts := []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{Backoff: bo, MinConnectTimeout: 20 * time.Second})} // gRPC's own minimum
	if tlsCfg != nil && e.Watch != nil {
		// Given after clientv3's own credentials, these replace them: the
		// same TLS credentials, wrapped to report handshake failures.
		dialOpts = append(dialOpts, grpc.WithTransportCredentials(e.Watch.EtcdCredentials(etcdcreds.NewTransportCredential(tlsCfg))))
	}
	cli, err := clientv3.New(clientv3.Config{
		DialOptions:          dialOpts,
		TLS:                  tlsCfg,
		Endpoints:            e.Endpoints,
		Username:             e.Username,
		Password:             password,
		DialTimeout:          e.DialTimeout,
		DialKeepAliveTime:    10 * time.Second,
		DialKeepAliveTimeout: 5 * time.Second,
		Logger:               logging.Zap(log.With("component", "etcd-client")),
		Context:              ctx,
	})
	if err != nil {
		return nil, fmt.Errorf("connecting to etcd %v (--etcd-endpoints): %w", e.RedactedEndpoints(), err)
	}
	return cli, nil
}

// Reach reads key of cli (count only, serializable) within
// --etcd-dial-timeout, so that a one-shot command (inspect, migrate)
// fails within seconds, naming the endpoints, when etcd cannot be
// reached or refuses the read (credentials, RBAC), instead of retrying
// until its own deadline. The roles do not call it: they keep retrying
// while etcd is down. It returns ctx's error when ctx ends first.
func (e *Etcd) Reach(ctx context.Context, cli *clientv3.Client, key string) error {
	rctx, cancel := context.WithTimeout(ctx, e.DialTimeout)
	defer cancel()
	_, err := cli.Get(rctx, key, clientv3.WithCountOnly(), clientv3.WithSerializable())
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return ctx.Err()
	case rctx.Err() != nil:
		return fmt.Errorf("etcd %v did not answer a read within %v (--etcd-dial-timeout): %w", e.RedactedEndpoints(), e.DialTimeout, err)
	}
	return fmt.Errorf("etcd %v refused a read of %q: %w", e.RedactedEndpoints(), key, err)
}

// Ops holds --metrics-listen and --pprof: the role's ops HTTP server.
type Ops struct {
	Listen string
	Pprof  bool
}

// Register adds --metrics-listen and --pprof to fs. pages names the
// role's extra pages (indexd's "/status"), so --metrics-listen's help
// lists everything the server serves; the same paths go to Server.
func (o *Ops) Register(fs *pflag.FlagSet, pages ...string) {
	served := append([]string{"/metrics", "/healthz", "/readyz"}, pages...)
	fs.StringVar(&o.Listen, "metrics-listen", contract.DefaultMetricsAddr, "host:port of the ops HTTP server ("+strings.Join(served, ", ")+")")
	fs.BoolVar(&o.Pprof, "pprof", false, "serve /debug/pprof/ on --metrics-listen")
}

// Server binds the ops HTTP server on --metrics-listen, serving reg,
// reporting ready, and serving the role's extra pages (opsserver's
// Config.Handlers; nil for none).
func (o *Ops) Server(reg *prometheus.Registry, ready func() error, pages map[string]http.Handler) (*opsserver.Server, error) {
	srv, err := opsserver.New(opsserver.Config{Addr: o.Listen, Registry: reg, Ready: ready, Pprof: o.Pprof, Handlers: pages})
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
