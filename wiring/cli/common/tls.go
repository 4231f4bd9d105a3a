package common

import (
	"crypto/tls"
	"fmt"
	"log/slog"

	"github.com/spf13/pflag"

	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/internal/tlsfiles"
)

// ServerTLS holds the TLS flags of a gRPC listener (indexd, standalone),
// named as Kubernetes components name theirs: --tls-cert-file and
// --tls-key-file turn TLS on, --tls-client-ca-file requires client
// certificates signed by that CA (mutual TLS). The files are re-read when
// they change (internal/tlsfiles).
type ServerTLS struct {
	CertFile, KeyFile, ClientCAFile string
}

// Register adds --tls-cert-file, --tls-key-file and --tls-client-ca-file
// to fs.
func (s *ServerTLS) Register(fs *pflag.FlagSet) {
	fs.StringVar(&s.CertFile, "tls-cert-file", "", "PEM certificate chain of the gRPC listener; with --tls-key-file turns TLS on (re-read when it changes)")
	fs.StringVar(&s.KeyFile, "tls-key-file", "", "PEM private key of --tls-cert-file")
	fs.StringVar(&s.ClientCAFile, "tls-client-ca-file", "", "PEM CA bundle: require client certificates signed by it (mutual TLS; needs --tls-cert-file)")
}

// Enabled reports whether TLS is on.
func (s *ServerTLS) Enabled() bool {
	return s.CertFile != "" || s.KeyFile != "" || s.ClientCAFile != ""
}

// Config returns the listener's TLS config, or nil for plaintext. It
// errors for a certificate without its key (or the reverse), a client CA
// without a certificate, or files that cannot be loaded. log receives
// reload events.
func (s *ServerTLS) Config(log *slog.Logger) (*tls.Config, error) {
	if !s.Enabled() {
		return nil, nil
	}
	if s.CertFile == "" || s.KeyFile == "" {
		return nil, fmt.Errorf("--tls-cert-file and --tls-key-file go together (and --tls-client-ca-file needs them)")
	}
	cfg, err := tlsfiles.Server(tlsfiles.ServerFiles{CertFile: s.CertFile, KeyFile: s.KeyFile, ClientCAFile: s.ClientCAFile}, log)
	if err != nil {
		return nil, fmt.Errorf("%w (--tls-cert-file, --tls-key-file, --tls-client-ca-file)", err)
	}
	return cfg, nil
}

// ClientTLS holds the TLS flags of a command that dials indexd (lookup,
// endpoints, replay --index): --tls-ca-file, --tls-cert-file,
// --tls-key-file and --tls-server-name, passed to the client library's
// options of the same meaning.
type ClientTLS struct {
	CAFile, CertFile, KeyFile, ServerName string
}

// Register adds the client TLS flags to fs.
func (c *ClientTLS) Register(fs *pflag.FlagSet) {
	fs.StringVar(&c.CAFile, "tls-ca-file", "", "PEM CA bundle that verifies indexd's certificate; any --tls-* flag turns TLS on (default roots: the system's)")
	fs.StringVar(&c.CertFile, "tls-cert-file", "", "PEM client certificate for indexd's mutual TLS (with --tls-key-file)")
	fs.StringVar(&c.KeyFile, "tls-key-file", "", "PEM private key of --tls-cert-file")
	fs.StringVar(&c.ServerName, "tls-server-name", "", "name indexd's certificate must carry (default: the host dialled)")
}

// Options returns the client options the flags describe: none for
// plaintext. It errors for a certificate without its key or the reverse.
func (c *ClientTLS) Options() ([]client.Option, error) {
	if (c.CertFile == "") != (c.KeyFile == "") {
		return nil, fmt.Errorf("--tls-cert-file and --tls-key-file go together")
	}
	var opts []client.Option
	if c.CAFile != "" {
		opts = append(opts, client.WithTLSCAFile(c.CAFile))
	}
	if c.CertFile != "" {
		opts = append(opts, client.WithTLSCertFiles(c.CertFile, c.KeyFile))
	}
	if c.ServerName != "" {
		opts = append(opts, client.WithTLSServerName(c.ServerName))
	}
	return opts, nil
}
