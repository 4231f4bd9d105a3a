package testutil

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// WaitServing asks the gRPC health service on conn (Check, of the overall
// "" status) until it says SERVING, failing t when ctx ends first. It
// works on indexd's health port, which serves Check only, and on its API
// port.
func WaitServing(t testing.TB, ctx context.Context, conn *grpc.ClientConn) {
	t.Helper()
	h := healthpb.NewHealthClient(conn)
	for {
		resp, err := h.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
		if err == nil && resp.Status == healthpb.HealthCheckResponse_SERVING {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for health SERVING: %v (last: %v)", ctx.Err(), err)
		case <-time.After(10 * time.Millisecond):
		}
	}
}
