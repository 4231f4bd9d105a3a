// Package etcdembed runs a single-member etcd server inside the process
// (go.etcd.io/etcd/server/v3/embed), for `kvindex standalone` and for
// tests. It picks loopback ports, routes etcd's logs through slog, and sets
// the limits kvindex's write path expects (DESIGN "Writes").
package etcdembed

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/fileutil"
	"go.etcd.io/etcd/server/v3/embed"

	"github.com/kvindex/kvindex/internal/logging"
)

// Config configures an embedded etcd. Zero fields take the defaults noted.
type Config struct {
	// DataDir holds etcd's WAL and snapshot; required. Reusing it keeps the
	// data across restarts.
	DataDir string
	// ClientAddr is the host:port clients connect to; port 0 picks a free
	// loopback port. Default "127.0.0.1:2379".
	ClientAddr string
	// PeerAddr is the raft peer host:port (unused by a single member but
	// required by etcd). Default "127.0.0.1:0" (a free port).
	PeerAddr string
	// MaxTxnOps is etcd's --max-txn-ops. Default 1024, so ingesters may be
	// configured anywhere up to it (their default is 128).
	MaxTxnOps uint
	// MaxRequestBytes is etcd's --max-request-bytes. Default 1.5 MiB
	// (etcd's default).
	MaxRequestBytes uint
	// QuotaBackendBytes is etcd's --quota-backend-bytes. Default 8 GiB.
	QuotaBackendBytes int64
	// AutoCompactionRetention, when non-zero, turns on periodic
	// auto-compaction keeping that much history. Default off.
	AutoCompactionRetention time.Duration
	// TLSCertFile and TLSKeyFile, when set, serve clients over TLS: the
	// client URL is https. Default empty: plaintext (http).
	TLSCertFile, TLSKeyFile string
	// TLSClientCAFile, with TLSCertFile, makes etcd require client
	// certificates signed by that CA (etcd's --client-cert-auth and
	// --trusted-ca-file). Default empty: no client certificate asked for.
	TLSClientCAFile string
	// SnapshotCount is etcd's --snapshot-count: the applied entries after
	// which etcd snapshots and cuts its in-memory raft log down to
	// SnapshotCatchUpEntries (--snapshot-catchup-entries). Between the two
	// cuts the log holds every entry applied since, so the member's heap
	// rises and falls by about SnapshotCount entries' size. Zero means
	// etcd's defaults (10,000 and 5,000).
	SnapshotCount, SnapshotCatchUpEntries uint64
	// UnsafeNoFsync skips fsync (tests and benchmarks only: a crash loses
	// data).
	UnsafeNoFsync bool
	// Logger receives etcd's logs at LogLevel and above. Default: discard.
	Logger *slog.Logger
	// LogLevel is the least severe etcd log passed on to Logger. Default
	// error: an embedded single-member etcd warns about settings that are
	// deliberate here (one port for HTTP and gRPC, simple auth tokens).
	LogLevel slog.Level
}

// Defaults for Config.
const (
	DefaultClientAddr        = "127.0.0.1:2379"
	DefaultMaxTxnOps         = 1024
	DefaultMaxRequestBytes   = 1536 * 1024
	DefaultQuotaBackendBytes = 8 << 30
)

// Server is a running embedded etcd.
type Server struct {
	e       *embed.Etcd
	url     string
	closing *atomic.Bool
	lock    *fileutil.LockedFile
}

// ErrAddrInUse reports that a configured listen address is taken.
var ErrAddrInUse = errors.New("etcdembed: address in use")

// ErrDataDirInUse reports that another Server, in this process or
// another, holds Config.DataDir. etcd itself would wait on its database
// file's lock for as long as the other holds it, deaf to the context.
var ErrDataDirInUse = errors.New("etcdembed: data dir in use")

// LockFile is the file in Config.DataDir a Server holds an exclusive lock
// on while it runs (etcd's fileutil.TryLockFile: an OFD lock on Linux,
// flock elsewhere), released by Close or by the process's exit.
const LockFile = "kvindex.lock"

// pickRetries is how many times Start tries when it picked a free port
// itself (an address with port 0) and another process took that port
// between the pick and etcd's listen.
const pickRetries = 5

// Start starts etcd and waits, up to ctx, until it serves clients. When
// ClientAddr or PeerAddr has port 0, Start picks free ports itself; if
// one is taken before etcd listens on it, it picks again, up to
// pickRetries tries. A fixed port that is taken fails with ErrAddrInUse.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	picked := portZero(cfg.ClientAddr) || portZero(cfg.PeerAddr) || cfg.PeerAddr == ""
	if cfg.Logger == nil {
		cfg.Logger = logging.Discard()
	}
	for try := 1; ; try++ {
		s, err := start(ctx, cfg)
		// ErrAddrInUse is a fixed port found taken: picking again cannot help.
		if err == nil || !picked || try == pickRetries || ctx.Err() != nil || errors.Is(err, ErrAddrInUse) || !addrInUse(err) {
			return s, err
		}
		cfg.Logger.Warn("etcdembed: a picked port was taken before etcd listened on it; picking again", "err", err, "try", try)
	}
}

// portZero reports whether addr asks for a free port.
func portZero(addr string) bool {
	_, port, err := net.SplitHostPort(addr)
	return err == nil && port == "0"
}

// addrInUse reports a listen that failed because the address was taken.
func addrInUse(err error) bool {
	return errors.Is(err, syscall.EADDRINUSE) || strings.Contains(err.Error(), "address already in use")
}

func start(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.DataDir == "" {
		return nil, errors.New("etcdembed: DataDir is required")
	}
	if cfg.ClientAddr == "" {
		cfg.ClientAddr = DefaultClientAddr
	}
	if cfg.PeerAddr == "" {
		cfg.PeerAddr = "127.0.0.1:0"
	}
	if cfg.MaxTxnOps == 0 {
		cfg.MaxTxnOps = DefaultMaxTxnOps
	}
	if cfg.MaxRequestBytes == 0 {
		cfg.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if cfg.QuotaBackendBytes == 0 {
		cfg.QuotaBackendBytes = DefaultQuotaBackendBytes
	}
	if cfg.Logger == nil {
		cfg.Logger = logging.Discard()
	}
	clientAddr, err := resolve(cfg.ClientAddr)
	if err != nil {
		return nil, fmt.Errorf("etcdembed: client address: %w", err)
	}
	peerAddr, err := resolve(cfg.PeerAddr)
	if err != nil {
		return nil, fmt.Errorf("etcdembed: peer address: %w", err)
	}

	ec := embed.NewConfig()
	ec.Name = "kvindex"
	ec.Dir = cfg.DataDir
	cu := url.URL{Scheme: "http", Host: clientAddr}
	if cfg.TLSCertFile != "" {
		cu.Scheme = "https"
		ec.ClientTLSInfo.CertFile, ec.ClientTLSInfo.KeyFile = cfg.TLSCertFile, cfg.TLSKeyFile
		if cfg.TLSClientCAFile != "" {
			ec.ClientTLSInfo.TrustedCAFile, ec.ClientTLSInfo.ClientCertAuth = cfg.TLSClientCAFile, true
		}
	}
	pu := url.URL{Scheme: "http", Host: peerAddr}
	ec.ListenClientUrls, ec.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
	ec.ListenPeerUrls, ec.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	ec.InitialCluster = ec.Name + "=" + pu.String()
	ec.MaxTxnOps = cfg.MaxTxnOps
	ec.MaxRequestBytes = cfg.MaxRequestBytes
	ec.QuotaBackendBytes = cfg.QuotaBackendBytes
	ec.UnsafeNoFsync = cfg.UnsafeNoFsync
	if cfg.SnapshotCount > 0 {
		ec.SnapshotCount = cfg.SnapshotCount
	}
	if cfg.SnapshotCatchUpEntries > 0 {
		ec.SnapshotCatchUpEntries = cfg.SnapshotCatchUpEntries
	}
	if cfg.AutoCompactionRetention > 0 {
		ec.AutoCompactionMode = embed.CompactorModePeriodic
		ec.AutoCompactionRetention = cfg.AutoCompactionRetention.String()
	}
	ec.LogLevel = "warn"
	if cfg.LogLevel == 0 {
		cfg.LogLevel = slog.LevelError
	}
	closing := new(atomic.Bool)
	etcdLog := slog.New(&gateHandler{Handler: cfg.Logger.Handler(), min: cfg.LogLevel, closing: closing}).With("component", "etcd")
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(logging.Zap(etcdLog))

	lock, err := lockDataDir(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	e, err := embed.StartEtcd(ec)
	if err != nil {
		lock.Close()
		return nil, fmt.Errorf("etcdembed: start: %w", err)
	}
	stop := func() {
		closing.Store(true) // etcd reports its listeners closing as errors
		e.Close()
		lock.Close()
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		stop()
		return nil, fmt.Errorf("etcdembed: %w", err)
	case <-ctx.Done():
		stop()
		return nil, fmt.Errorf("etcdembed: waiting for etcd to serve: %w", ctx.Err())
	}
	return &Server{e: e, url: cu.String(), closing: closing, lock: lock}, nil
}

// CheckDataDir returns an error wrapping ErrDataDirInUse when a Server
// (of this process or another) holds dir's LockFile now, without creating
// anything; a dir without the file is free. It lets a caller that checks
// other resources first (ports) name the more telling cause: a second
// stack on a data dir also finds the first one's ports taken. Start still
// takes the lock itself, so a race between the two is caught there.
func CheckDataDir(dir string) error {
	path := filepath.Join(dir, LockFile)
	l, err := fileutil.TryLockFile(path, os.O_WRONLY, fileutil.PrivateFileMode)
	switch {
	case errors.Is(err, fileutil.ErrLocked):
		return fmt.Errorf("%w: %s is held by another process or by another server in this one", ErrDataDirInUse, dir)
	case err != nil:
		return nil // no lock file (or none to open): Start reports the rest
	}
	return l.Close()
}

// lockDataDir creates dir (0700, as etcd does) and takes the lock on its
// LockFile without waiting: a held lock is ErrDataDirInUse at once.
func lockDataDir(dir string) (*fileutil.LockedFile, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("etcdembed: data dir: %w", err)
	}
	path := filepath.Join(dir, LockFile)
	l, err := fileutil.TryLockFile(path, os.O_WRONLY|os.O_CREATE, fileutil.PrivateFileMode)
	if errors.Is(err, fileutil.ErrLocked) {
		return nil, fmt.Errorf("%w: %s is held by another process or by another server in this one", ErrDataDirInUse, dir)
	}
	if err != nil {
		return nil, fmt.Errorf("etcdembed: data dir lock: %w", err)
	}
	return l, nil
}

// resolve returns addr, or, when its port is 0, addr with a free port.
// A taken fixed port gives ErrAddrInUse.
func resolve(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", err
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("%w: %s: %v", ErrAddrInUse, addr, err)
	}
	defer l.Close()
	if port != "0" {
		return addr, nil
	}
	return net.JoinHostPort(host, strconv.Itoa(l.Addr().(*net.TCPAddr).Port)), nil
}

// ClientURL is the URL clients connect to, e.g. "http://127.0.0.1:2379"
// ("https://..." with Config.TLSCertFile).
func (s *Server) ClientURL() string { return s.url }

// Endpoints is ClientURL as a clientv3 endpoint list.
func (s *Server) Endpoints() []string { return []string{s.url} }

// Err reports a fatal server error after Start (nil channel values are
// never sent).
func (s *Server) Err() <-chan error { return s.e.Err() }

// Close stops the server and waits for it, then releases the data
// directory's lock; the data directory stays.
//
// etcd's own logs are silenced from here on: while it stops it reports its
// closed listeners as errors.
func (s *Server) Close() {
	s.closing.Store(true)
	s.e.Close()
	s.lock.Close()
}

// gateHandler passes etcd's records at min and above until the server
// starts closing.
type gateHandler struct {
	slog.Handler
	min     slog.Level
	closing *atomic.Bool
}

func (h *gateHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min && !h.closing.Load() && h.Handler.Enabled(ctx, l)
}

func (h *gateHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &gateHandler{Handler: h.Handler.WithAttrs(as), min: h.min, closing: h.closing}
}

func (h *gateHandler) WithGroup(name string) slog.Handler {
	return &gateHandler{Handler: h.Handler.WithGroup(name), min: h.min, closing: h.closing}
}
