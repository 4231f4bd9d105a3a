package indexd

import (
	"net"

	"golang.org/x/net/netutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// connOptions are the gRPC server options that bound what a connection
// may hold on both ports (docs/limits.md, "Connections"): the handshake
// timeout, which covers the TLS handshake and the HTTP/2 preface
// (grpc-go sets the connection's deadline to it until the client's
// preface and first SETTINGS are read), the time a call may take to
// deliver its request (requestRead) and the size of its header list, the
// idle and age limits with their grace, and keepalive in both
// directions. timedOut counts the calls requestRead cancels.
func connOptions(cfg Config, timedOut func()) []grpc.ServerOption {
	rr := requestRead{timeout: cfg.RequestReadTimeout, timedOut: timedOut}
	return []grpc.ServerOption{
		grpc.ConnectionTimeout(cfg.HandshakeTimeout),
		grpc.InTapHandle(rr.tap),
		grpc.StatsHandler(rr),
		grpc.MaxHeaderListSize(uint32(cfg.MaxMetadataBytes)),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle:     cfg.MaxConnectionIdle,
			MaxConnectionAge:      cfg.MaxConnectionAge,
			MaxConnectionAgeGrace: cfg.MaxConnectionAgeGrace,
			Time:                  cfg.KeepaliveTime,
			Timeout:               cfg.KeepaliveTimeout,
		}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             cfg.KeepaliveMinTime,
			PermitWithoutStream: true,
		}),
	}
}

// limitListener bounds l to n open connections (x/net's netutil): Accept
// waits while n accepted connections are open, so the connections past
// the limit wait in the kernel's accept queue and hold none of the
// process's file descriptors. Closing l ends a waiting Accept.
func limitListener(l net.Listener, n int) net.Listener {
	return netutil.LimitListener(l, n)
}
