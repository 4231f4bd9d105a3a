// Package tlsfiles builds TLS configurations from PEM files and re-reads
// the files when they change, so a rotated certificate (a Kubernetes
// Secret update, cert-manager renewing) takes effect with no restart.
//
// A server config (Server) checks its files at every handshake: it stats
// them, and when any file's size or modification time differs from what
// it loaded, it loads them again. A new handshake then uses the new
// certificate and client CA; connections already open keep the session
// they negotiated. A client config (Client) does the same for its own
// certificate (tls.Config.GetClientCertificate); its CA bundle is read
// once, when the config is built.
//
// A reload that fails (a file missing, or a certificate and key that do
// not match while a rotation is half written) keeps the files loaded
// before, logs a warning once per distinct failure, and is tried again at
// the next handshake. Only the first load's failure is an error.
package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// ServerFiles names the PEM files of a TLS server.
type ServerFiles struct {
	// CertFile and KeyFile hold the server's certificate chain and key.
	// Both are required.
	CertFile, KeyFile string
	// ClientCAFile, when set, holds the CA bundle client certificates
	// must chain to: the server then requires and verifies one (mutual
	// TLS). Empty: no client certificate is asked for.
	ClientCAFile string
}

// ClientFiles names the PEM files of a TLS client. Every field is
// optional: all empty is a client that verifies the server against the
// system roots and presents no certificate.
type ClientFiles struct {
	// CAFile holds the CA bundle that verifies the server. Empty: the
	// system roots.
	CAFile string
	// CertFile and KeyFile hold the client certificate presented to a
	// server that asks for one; give both or neither.
	CertFile, KeyFile string
	// ServerName is the name the server's certificate must carry.
	// Empty: the host of the address dialled.
	ServerName string
}

// ErrFiles wraps every error of a file that cannot be read or parsed.
var ErrFiles = errors.New("tlsfiles: bad TLS file")

// Server returns a server config serving f's certificate (TLS 1.2 or
// later), re-reading the files as the package doc describes. It errors,
// wrapping ErrFiles, when the files cannot be loaded now. log receives
// reload failures and successes (nil: discard).
func Server(f ServerFiles, log *slog.Logger) (*tls.Config, error) {
	if f.CertFile == "" || f.KeyFile == "" {
		return nil, fmt.Errorf("%w: a server needs both a certificate and a key file", ErrFiles)
	}
	files := []string{f.CertFile, f.KeyFile}
	if f.ClientCAFile != "" {
		files = append(files, f.ClientCAFile)
	}
	w := &watched[*tls.Config]{files: files, log: orDiscard(log), load: func() (*tls.Config, error) {
		cert, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("%w: %s and %s: %v", ErrFiles, f.CertFile, f.KeyFile, err)
		}
		cfg := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
		if f.ClientCAFile != "" {
			pool, err := loadPool(f.ClientCAFile)
			if err != nil {
				return nil, err
			}
			cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
		}
		return cfg, nil
	}}
	if _, err := w.get(); err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return w.get()
		},
	}, nil
}

// Client returns a client config for f (TLS 1.2 or later), re-reading the
// client certificate as the package doc describes. It errors, wrapping
// ErrFiles, when a file cannot be loaded now or only one of CertFile and
// KeyFile is given.
func Client(f ClientFiles, log *slog.Logger) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: f.ServerName}
	if f.CAFile != "" {
		pool, err := loadPool(f.CAFile)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
	}
	if (f.CertFile == "") != (f.KeyFile == "") {
		return nil, fmt.Errorf("%w: a client certificate needs both its certificate and key file", ErrFiles)
	}
	if f.CertFile == "" {
		return cfg, nil
	}
	w := &watched[*tls.Certificate]{files: []string{f.CertFile, f.KeyFile}, log: orDiscard(log), load: func() (*tls.Certificate, error) {
		cert, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("%w: %s and %s: %v", ErrFiles, f.CertFile, f.KeyFile, err)
		}
		return &cert, nil
	}}
	if _, err := w.get(); err != nil {
		return nil, err
	}
	cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return w.get() }
	return cfg, nil
}

// loadPool reads a PEM CA bundle.
func loadPool(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: CA bundle: %v", ErrFiles, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%w: CA bundle %s holds no PEM certificate", ErrFiles, path)
	}
	return pool, nil
}

// stamp is what a file looked like when it was loaded.
type stamp struct {
	size int64
	mod  time.Time
}

// watched is a value loaded from files, loaded again when one of them
// changes (stat at every get).
type watched[T any] struct {
	files []string
	load  func() (T, error)
	log   *slog.Logger

	mu      sync.Mutex
	loaded  bool
	val     T
	stamps  []stamp
	lastErr string // the last reload failure logged, so a failure logs once
}

// get returns the current value, reloading it first when a file changed.
// It errors only while nothing has ever loaded.
func (w *watched[T]) get() (T, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	stamps, statErr := w.stat()
	if w.loaded && statErr == nil && equalStamps(stamps, w.stamps) {
		return w.val, nil
	}
	err := statErr
	var v T
	if err == nil {
		v, err = w.load()
	}
	if err != nil {
		if !w.loaded {
			return v, err
		}
		if msg := err.Error(); msg != w.lastErr {
			w.lastErr = msg
			w.log.Warn("TLS files changed but cannot be loaded; keeping the ones loaded before", "files", w.files, "err", err)
		}
		return w.val, nil
	}
	if w.loaded {
		w.log.Info("TLS files reloaded", "files", w.files)
	}
	w.val, w.stamps, w.loaded, w.lastErr = v, stamps, true, ""
	return v, nil
}

func (w *watched[T]) stat() ([]stamp, error) {
	out := make([]stamp, len(w.files))
	for i, f := range w.files {
		fi, err := os.Stat(f)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrFiles, err)
		}
		out[i] = stamp{size: fi.Size(), mod: fi.ModTime()}
	}
	return out, nil
}

func equalStamps(a, b []stamp) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].size != b[i].size || !a[i].mod.Equal(b[i].mod) {
			return false
		}
	}
	return true
}

func orDiscard(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}
