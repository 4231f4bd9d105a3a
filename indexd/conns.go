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
// preface and first SETTINGS are read), the idle and age limits with
// their grace, and keepalive in both directions.
func connOptions(cfg Config) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ConnectionTimeout(cfg.HandshakeTimeout),
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
