package indexd

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// healthService is grpc-go's health server whose Watch streams end when
// the replica shuts down. Without that, a client that watches health (as
// gRPC client-side health checking does) holds a stream open forever and
// every graceful stop runs into its grace timeout.
type healthService struct {
	*health.Server
	// stopping ends when shutdown begins (after NOT_SERVING is set).
	stopping context.Context
}

// Watch streams status changes until the client goes or shutdown begins.
func (h *healthService) Watch(req *healthpb.HealthCheckRequest, stream healthpb.Health_WatchServer) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	defer context.AfterFunc(h.stopping, cancel)()
	return h.Server.Watch(req, &watchStream{Health_WatchServer: stream, ctx: ctx})
}

// checkOnly is the health service of the health port: Check only. A
// probe (kubelet's gRPC probe, grpc_health_probe) calls Check; a Watch
// stream is open for as long as its client likes, and the port has a few
// connection slots (HealthMaxConnections) that a handful of watchers
// would hold from the probes. Watch is served on the API port, where
// gRPC clients' health checking uses it.
type checkOnly struct{ *healthService }

// Watch answers UNIMPLEMENTED, naming Check and the API port.
func (checkOnly) Watch(*healthpb.HealthCheckRequest, healthpb.Health_WatchServer) error {
	return status.Error(codes.Unimplemented, "the health port serves Check only; Watch health on the API port (--listen)")
}

// watchStream is a Watch stream with a context that also ends at shutdown.
type watchStream struct {
	healthpb.Health_WatchServer
	ctx context.Context
}

func (w *watchStream) Context() context.Context { return w.ctx }

// watchStaleness keeps the kvindex.v1.IndexService health status in step
// with the replica's staleness until ctx ends: NOT_SERVING while the last
// progress from etcd is older than MaxStaleness, SERVING again once it is
// not (checked every ProgressInterval). The overall "" status is left
// alone: it is liveness, SERVING from the first list on, so a probe of it
// never restarts a replica for an etcd outage. With MaxStaleness 0 it
// returns at once.
func (s *Server) watchStaleness(ctx context.Context) {
	if s.cfg.MaxStaleness <= 0 {
		return
	}
	t := s.cfg.Clock.NewTicker(s.cfg.ProgressInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.Chan():
		}
		s.updateServing()
	}
}

// updateServing sets the kvindex.v1.IndexService health status from
// readiness and staleness, logging a change.
func (s *Server) updateServing() {
	s.healthMu.Lock()
	defer s.healthMu.Unlock()
	if !s.ready.Load() {
		return
	}
	age := s.refl.progressAge()
	stale := s.cfg.MaxStaleness > 0 && age > s.cfg.MaxStaleness
	if stale == s.staleHealth {
		return
	}
	s.staleHealth = stale
	if stale {
		s.health.SetServingStatus(serviceName, healthpb.HealthCheckResponse_NOT_SERVING)
		s.cfg.Logger.Warn("health: "+serviceName+" NOT_SERVING: no progress from etcd for longer than --max-staleness (Lookups still answer from the last state)",
			"age", age.Round(time.Millisecond), "max_staleness", s.cfg.MaxStaleness)
		return
	}
	s.health.SetServingStatus(serviceName, healthpb.HealthCheckResponse_SERVING)
	s.cfg.Logger.Info("health: " + serviceName + " SERVING again: progress from etcd resumed")
}
