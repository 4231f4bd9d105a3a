// Package authwatch makes authentication and TLS handshake failures to
// Kafka and etcd loud. A client that cannot authenticate retries quietly
// by itself (franz-go logs at DEBUG, etcd's gRPC connection at WARN
// among its reconnect noise), so a wrong SASL password or an untrusted
// certificate looked like "not consuming yet". A Watch, fed by a
// franz-go hook (KafkaHook) and by wrapped etcd transport credentials
// (EtcdCredentials), logs each failing peer at ERROR naming the broker or
// endpoint and the mechanism, never a secret; counts every failure in
// kvindex_auth_failures_total{peer,kind}; and makes Err, which the roles
// put first in /readyz, report it until a connection to that peer
// succeeds again.
package authwatch

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/grpc/credentials"

	"github.com/kvindex/kvindex/internal/logging"
)

// The peers and kinds of failure a Watch tells apart (the labels of
// kvindex_auth_failures_total).
const (
	PeerKafka = "kafka"
	PeerEtcd  = "etcd"
	// KindSASL is a refused SASL authentication (a wrong password or
	// user, or a mechanism the broker does not enable).
	KindSASL = "sasl"
	// KindTLS is a failed TLS handshake (an untrusted or mismatched
	// certificate, a missing client certificate, TLS against a plaintext
	// port).
	KindTLS = "tls"
)

// logEvery is how often a failure that goes on is logged again.
const logEvery = time.Minute

// Watch records the authentication failures of one process's clients.
// Its methods are safe for concurrent use.
type Watch struct {
	log      *slog.Logger
	failures *prometheus.CounterVec

	mu sync.Mutex
	// failing maps peer and address to its current failure.
	failing map[target]*failure
}

type target struct{ peer, addr string }

type failure struct {
	kind, mechanism string
	err             error
	logged          time.Time
}

// New returns a Watch logging to log (nil: discard) and registering its
// counter on reg (nil: kept but registered nowhere).
func New(reg prometheus.Registerer, log *slog.Logger) *Watch {
	if log == nil {
		log = logging.Discard()
	}
	w := &Watch{
		log: log,
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvindex_auth_failures_total",
			Help: "Connections to Kafka or etcd (peer) refused at authentication: kind sasl (SASL refused) or tls (TLS handshake failed).",
		}, []string{"peer", "kind"}),
		failing: map[target]*failure{},
	}
	for _, p := range []string{PeerKafka, PeerEtcd} {
		for _, k := range []string{KindSASL, KindTLS} {
			w.failures.WithLabelValues(p, k)
		}
	}
	if reg != nil {
		reg.MustRegister(w.failures)
	}
	return w
}

// Failed records a failure of kind to connect to addr of peer with the
// given mechanism (a SASL mechanism, or "TLS"): counted always, logged at
// ERROR when it starts and every minute while it goes on. err must carry
// no secret (franz-go's and crypto/tls's errors do not).
func (w *Watch) Failed(peer, kind, addr, mechanism string, err error) {
	w.failures.WithLabelValues(peer, kind).Inc()
	addr = logging.RedactAddress(addr)
	w.mu.Lock()
	defer w.mu.Unlock()
	t := target{peer, addr}
	f := w.failing[t]
	if f == nil {
		f = &failure{}
		w.failing[t] = f
	}
	f.kind, f.mechanism, f.err = kind, mechanism, err
	if now := time.Now(); now.Sub(f.logged) >= logEvery {
		f.logged = now
		w.log.Error(describe(peer, kind)+": fix the credentials or certificates; retrying",
			"peer", peer, "addr", addr, "mechanism", mechanism, "err", err)
	}
}

// Succeeded records a connection to addr of peer that authenticated,
// ending its failure.
func (w *Watch) Succeeded(peer, addr string) {
	addr = logging.RedactAddress(addr)
	w.mu.Lock()
	defer w.mu.Unlock()
	t := target{peer, addr}
	if _, ok := w.failing[t]; ok {
		delete(w.failing, t)
		w.log.Info(peer+" authentication succeeded again", "peer", peer, "addr", addr)
	}
}

// Err returns the current failure with the smallest peer and address, or
// nil when no peer is failing: "kafka authentication failed: broker
// host:port (SASL SCRAM-SHA-512): <error>", "kafka TLS handshake
// failed: ...", "etcd TLS handshake failed: ...".
func (w *Watch) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.failing) == 0 {
		return nil
	}
	keys := make([]target, 0, len(w.failing))
	for t := range w.failing {
		keys = append(keys, t)
	}
	slices.SortFunc(keys, func(a, b target) int {
		if a.peer != b.peer {
			return compare(a.peer, b.peer)
		}
		return compare(a.addr, b.addr)
	})
	t := keys[0]
	f := w.failing[t]
	what := "broker"
	if t.peer == PeerEtcd {
		what = "endpoint"
	}
	return fmt.Errorf("%s: %s %s (%s): %w", describe(t.peer, f.kind), what, t.addr, f.mechanism, f.err)
}

func compare(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func describe(peer, kind string) string {
	if kind == KindTLS {
		return peer + " TLS handshake failed"
	}
	return peer + " authentication failed"
}

// KafkaHook returns a franz-go hook (kgo.WithHooks) feeding w from every
// broker connection attempt of a client using the SASL mechanism
// (empty: none): a refused SASL exchange or a failed TLS handshake is a
// failure, a connection that initialized is a success; other errors
// (refused, timed out) are neither.
func (w *Watch) KafkaHook(mechanism string) kgo.Hook { return kafkaHook{w: w, mech: mechanism} }

type kafkaHook struct {
	w    *Watch
	mech string
}

var _ kgo.HookBrokerConnect = kafkaHook{}

// OnBrokerConnect implements kgo.HookBrokerConnect.
func (h kafkaHook) OnBrokerConnect(meta kgo.BrokerMetadata, _ time.Duration, _ net.Conn, err error) {
	addr := net.JoinHostPort(meta.Host, fmt.Sprint(meta.Port))
	switch {
	case err == nil:
		h.w.Succeeded(PeerKafka, addr)
	case IsSASLError(err), h.mech != "" && closedDuringInit(err):
		h.w.Failed(PeerKafka, KindSASL, addr, "SASL "+h.mech, err)
	case IsTLSError(err):
		h.w.Failed(PeerKafka, KindTLS, addr, "TLS", err)
	}
}

// IsSASLError reports whether err is Kafka refusing a SASL exchange.
func IsSASLError(err error) bool {
	return errors.Is(err, kerr.SaslAuthenticationFailed) || errors.Is(err, kerr.UnsupportedSaslMechanism) || errors.Is(err, kerr.IllegalSaslState)
}

// closedDuringInit reports a broker that closed a connection it had
// accepted while the client initialized it (ApiVersions, then SASL).
// With SASL on, that is how brokers that do not answer
// SASL_AUTHENTICATION_FAILED (SaslAuthenticate v0, franz-go's kfake)
// refuse credentials. A dial error (franz-go's "unable to dial") is not
// one.
func closedDuringInit(err error) bool {
	return errors.Is(err, io.EOF) && !strings.HasPrefix(err.Error(), "unable to dial")
}

// IsTLSError reports whether err is a failed TLS handshake: a
// certificate that does not verify, an alert from the peer (it refused
// ours, or wanted one), or a peer that does not speak TLS.
func IsTLSError(err error) bool {
	var (
		verify   *tls.CertificateVerificationError
		alert    tls.AlertError
		record   tls.RecordHeaderError
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
	)
	return errors.As(err, &verify) || errors.As(err, &alert) || errors.As(err, &record) ||
		errors.As(err, &unknown) || errors.As(err, &hostname) || errors.As(err, &invalid)
}

// EtcdCredentials wraps the transport credentials of an etcd client so
// that every failed TLS handshake to an endpoint is a failure of w, and a
// completed one a success.
func (w *Watch) EtcdCredentials(c credentials.TransportCredentials) credentials.TransportCredentials {
	return &etcdCreds{TransportCredentials: c, w: w}
}

type etcdCreds struct {
	credentials.TransportCredentials
	w *Watch
}

// ClientHandshake implements credentials.TransportCredentials.
func (c *etcdCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ClientHandshake(ctx, authority, raw)
	addr := raw.RemoteAddr().String()
	switch {
	case err == nil:
		c.w.Succeeded(PeerEtcd, addr)
	case IsTLSError(err):
		c.w.Failed(PeerEtcd, KindTLS, addr, "TLS", err)
	}
	return conn, info, err
}

// Clone implements credentials.TransportCredentials.
func (c *etcdCreds) Clone() credentials.TransportCredentials {
	return &etcdCreds{TransportCredentials: c.TransportCredentials.Clone(), w: c.w}
}
