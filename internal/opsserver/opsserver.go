// Package opsserver serves a process's operational HTTP endpoints:
// Prometheus metrics, liveness and readiness probes, and, when enabled,
// pprof. Every kvindex role runs one.
//
//	/metrics        Prometheus text format from the configured registry
//	/healthz        200 while the process runs (liveness)
//	/readyz         200 when Ready returns nil, else 503 with the reason
//	/debug/pprof/   the runtime profiles, only with Config.Pprof
//
// and the role's own pages (Config.Handlers), such as indexd's /status.
package opsserver

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/http/pprof"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Config configures a Server.
type Config struct {
	// Addr is the host:port to listen on; port 0 picks a free one.
	Addr string
	// Registry is gathered by /metrics. Required.
	Registry *prometheus.Registry
	// Ready reports readiness for /readyz; nil means always ready.
	Ready func() error
	// Pprof mounts net/http/pprof under /debug/pprof/. Default off: profiles
	// expose internals and cost CPU while taken.
	Pprof bool
	// IdleTimeout closes a keep-alive connection that has carried no
	// request for this long, so idle scrapers and probes cannot hold the
	// process's file descriptors. Default DefaultIdleTimeout (30 s); zero
	// means the default.
	IdleTimeout time.Duration
	// Handlers are extra routes, by http.ServeMux pattern (indexd's
	// "/status"). A pattern that clashes with the server's own routes
	// makes New fail. Default none.
	Handlers map[string]http.Handler
}

// DefaultIdleTimeout is Config.IdleTimeout's default: longer than the
// usual scrape (15 s) and probe (10 s) periods, so a scraper's connection
// is reused between scrapes.
const DefaultIdleTimeout = 30 * time.Second

// Server is a bound, not yet serving, ops HTTP server.
type Server struct {
	l   net.Listener
	srv *http.Server
}

// New binds cfg.Addr. A taken address fails here, before anything serves,
// with an error naming it.
func New(cfg Config) (*Server, error) {
	if cfg.Registry == nil {
		return nil, errors.New("opsserver: Registry is required")
	}
	l, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("opsserver: listening on %s: %w", cfg.Addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(cfg.Registry, promhttp.HandlerOpts{Registry: cfg.Registry}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if cfg.Ready != nil {
			if err := cfg.Ready(); err != nil {
				http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		fmt.Fprintln(w, "ok")
	})
	if cfg.Pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	for _, pattern := range slices.Sorted(maps.Keys(cfg.Handlers)) {
		if err := register(mux, pattern, cfg.Handlers[pattern]); err != nil {
			l.Close()
			return nil, err
		}
	}
	idle := cfg.IdleTimeout
	if idle <= 0 {
		idle = DefaultIdleTimeout
	}
	return &Server{l: l, srv: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: idle}}, nil
}

// register adds an extra route, turning ServeMux's panic on a clash
// into an error.
func register(mux *http.ServeMux, pattern string, h http.Handler) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("opsserver: route %q: %v", pattern, r)
		}
	}()
	mux.Handle(pattern, h)
	return nil
}

// Addr is the bound address.
func (s *Server) Addr() string { return s.l.Addr().String() }

// Close releases the listener of a server that will not Run (Run closes it
// otherwise).
func (s *Server) Close() error { return s.l.Close() }

// Run serves until ctx ends, then shuts down, giving in-flight requests up
// to 5 seconds.
func (s *Server) Run(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() { errc <- s.srv.Serve(s.l) }()
	select {
	case err := <-errc:
		return fmt.Errorf("opsserver: %w", err)
	case <-ctx.Done():
	}
	shutCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	err := s.srv.Shutdown(shutCtx)
	<-errc
	return err
}
