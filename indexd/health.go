package indexd

import (
	"context"

	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
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

// watchStream is a Watch stream with a context that also ends at shutdown.
type watchStream struct {
	healthpb.Health_WatchServer
	ctx context.Context
}

func (w *watchStream) Context() context.Context { return w.ctx }
