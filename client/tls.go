package client

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// tlsOptions are what the WithTLS options collected.
type tlsOptions struct {
	on                bool
	caFile            string
	caFileGiven       bool // WithTLSCAFile was given, even with ""
	certFile, keyFile string
	serverName        string
}

// WithTLS makes the client speak TLS to indexd, verifying its certificate
// against the system roots unless WithTLSCAFile names a CA bundle. The
// other WithTLS options imply it. Default: plaintext, as indexd serves
// without --tls-cert-file.
func WithTLS() Option {
	return func(o *options) { o.tls.on = true }
}

// WithTLSCAFile turns TLS on and verifies indexd's certificate against the
// PEM CA bundle in path (the CLI's --tls-ca-file). New reads the file; it
// fails with ErrInvalidArgument if path is empty (WithTLS verifies against
// the system roots), or the file cannot be read or holds no certificate.
func WithTLSCAFile(path string) Option {
	return func(o *options) { o.tls.on, o.tls.caFile, o.tls.caFileGiven = true, path, true }
}

// WithTLSCertFiles turns TLS on and presents the PEM certificate chain and
// key in certFile and keyFile to a server that asks for one (indexd with
// --tls-client-ca-file: mutual TLS; the CLI's --tls-cert-file and
// --tls-key-file). New loads them and fails with ErrInvalidArgument if it
// cannot; afterwards every new connection re-reads them if their size or
// modification time changed (a rotated Secret is used with no restart),
// keeping the pair it had when the new one does not load.
func WithTLSCertFiles(certFile, keyFile string) Option {
	return func(o *options) { o.tls.on, o.tls.certFile, o.tls.keyFile = true, certFile, keyFile }
}

// WithTLSServerName turns TLS on and sets the name indexd's certificate
// must carry (the CLI's --tls-server-name), for a target whose host is
// not that name (an IP list, a per-pod address). Default: the host of the
// target; for a comma-separated list, its one host (New refuses a list of
// different hosts with TLS and no server name).
func WithTLSServerName(name string) Option {
	return func(o *options) { o.tls.on, o.tls.serverName = true, name }
}

// dialOption returns the transport credentials the options describe, or
// nil when TLS is off.
func (t tlsOptions) dialOption() (grpc.DialOption, error) {
	if !t.on {
		return nil, nil
	}
	if t.caFileGiven && t.caFile == "" {
		return nil, fmt.Errorf("%w: WithTLSCAFile with an empty path (use WithTLS for the system roots)", ErrInvalidArgument)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.serverName}
	if t.caFile != "" {
		pem, err := os.ReadFile(t.caFile)
		if err != nil {
			return nil, fmt.Errorf("%w: TLS CA file: %v", ErrInvalidArgument, err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%w: TLS CA file %s holds no PEM certificate", ErrInvalidArgument, t.caFile)
		}
	}
	if (t.certFile == "") != (t.keyFile == "") {
		return nil, fmt.Errorf("%w: a TLS client certificate needs both its certificate and key file", ErrInvalidArgument)
	}
	if t.certFile != "" {
		kp := &keyPair{certFile: t.certFile, keyFile: t.keyFile}
		if _, err := kp.get(); err != nil {
			return nil, err
		}
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return kp.get() }
	}
	return grpc.WithTransportCredentials(credentials.NewTLS(cfg)), nil
}

// keyPair is a client certificate loaded from files, loaded again when
// either file's size or modification time changes.
type keyPair struct {
	certFile, keyFile string

	mu     sync.Mutex
	cert   *tls.Certificate
	stamps [2]fileStamp
}

type fileStamp struct {
	size int64
	mod  time.Time
}

// get returns the pair, reloading it when a file changed. Once a pair has
// loaded, a failed reload keeps it (a rotation half written, a file
// briefly missing) and is tried again next time.
func (k *keyPair) get() (*tls.Certificate, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	var stamps [2]fileStamp
	var statErr error
	for i, f := range []string{k.certFile, k.keyFile} {
		fi, err := os.Stat(f)
		if err != nil {
			statErr = err
			break
		}
		stamps[i] = fileStamp{size: fi.Size(), mod: fi.ModTime()}
	}
	if k.cert != nil && (statErr != nil || stamps == k.stamps) {
		return k.cert, nil
	}
	if statErr != nil {
		return nil, fmt.Errorf("%w: TLS client certificate: %v", ErrInvalidArgument, statErr)
	}
	cert, err := tls.LoadX509KeyPair(k.certFile, k.keyFile)
	if err != nil {
		if k.cert != nil {
			return k.cert, nil
		}
		return nil, fmt.Errorf("%w: TLS client certificate %s and %s: %v", ErrInvalidArgument, k.certFile, k.keyFile, err)
	}
	k.cert, k.stamps = &cert, stamps
	return k.cert, nil
}
