package e2e

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvindex/kvindex/internal/testutil"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// fdLimit is the open-file limit of the indexd under attack: well below
// the connections the test opens.
const (
	fdLimit   = 128
	floodSize = fdLimit + 32
)

// TestIdleConnectionFlood opens more idle HTTP/2 connections (a full
// client preface and SETTINGS, then nothing) to indexd's API port than
// its file-descriptor limit (`ulimit -n`, set in the subprocess) allows.
// With --max-connections below the limit, indexd never runs out of
// descriptors: a Lookup on an existing connection, the health port and
// /readyz keep answering throughout, --max-connection-idle closes every
// idle connection (those waiting to be accepted get their turn), and a
// new connection works afterwards. Without the limits, the flood takes
// every descriptor and accept fails with "too many open files".
func TestIdleConnectionFlood(t *testing.T) {
	t.Parallel()
	e := testutil.StartEtcd(t)
	ctx := testutil.Context(t, 3*time.Minute)
	cmd := exec.CommandContext(ctx, "sh", "-c", `ulimit -n `+strconv.Itoa(fdLimit)+` && exec "$0" "$@"`, kvindexBin(t), "indexd",
		"--etcd-endpoints", e.Endpoints[0],
		"--listen", "127.0.0.1:0", "--health-listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
		"--max-connections", "64", "--health-max-connections", "8",
		"--max-connection-idle", "1s", "--handshake-timeout", "2s",
		"--log-format", "json")
	line, logs := startLogged(t, ctx, cmd, "indexd starting")
	grpcAddr, healthAddr, opsAddr := line["grpc"].(string), line["health"].(string), line["metrics"].(string)

	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	api := kvindexv1.NewIndexServiceClient(conn)
	lookupOK := func(when string) {
		t.Helper()
		cctx, cancel := context.WithTimeout(ctx, testutil.Timeout(10*time.Second))
		defer cancel()
		if _, err := api.Lookup(cctx, &kvindexv1.LookupRequest{Model: "m", BlockHashes: []uint64{1}}, grpc.WaitForReady(true)); err != nil {
			t.Fatalf("%s: Lookup: %v", when, err)
		}
	}
	healthOK := func(when string) {
		t.Helper()
		hc, err := grpc.NewClient(healthAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer hc.Close()
		cctx, cancel := context.WithTimeout(ctx, testutil.Timeout(10*time.Second))
		defer cancel()
		resp, err := healthpb.NewHealthClient(hc).Check(cctx, &healthpb.HealthCheckRequest{})
		if err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("%s: health port: %v, %v; want SERVING", when, resp, err)
		}
	}
	readyOK := func(when string) {
		t.Helper()
		cctx, cancel := context.WithTimeout(ctx, testutil.Timeout(10*time.Second))
		defer cancel()
		req, _ := http.NewRequestWithContext(cctx, http.MethodGet, "http://"+opsAddr+"/readyz", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s: /readyz: %v", when, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: /readyz = %d", when, resp.StatusCode)
		}
	}
	for ready := false; !ready; {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+opsAddr+"/readyz", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("waiting for /readyz: %v", err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if ready = resp.StatusCode == http.StatusOK; !ready {
			time.Sleep(20 * time.Millisecond)
		}
	}
	lookupOK("before the flood")
	healthOK("before the flood")

	flood := make([]net.Conn, 0, floodSize)
	defer func() {
		for _, c := range flood {
			c.Close()
		}
	}()
	for range floodSize {
		c, err := net.DialTimeout("tcp", grpcAddr, testutil.Timeout(10*time.Second))
		if err != nil {
			t.Fatalf("dialing idle connection %d: %v", len(flood), err)
		}
		// The HTTP/2 client preface and an empty SETTINGS frame: a
		// connection gRPC counts as set up, which then carries nothing.
		if _, err := c.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")); err != nil {
			t.Fatalf("writing the preface on connection %d: %v", len(flood), err)
		}
		flood = append(flood, c)
	}
	lookupOK("during the flood")
	healthOK("during the flood")
	readyOK("during the flood")

	// Every idle connection is closed: read to EOF (or a reset).
	deadline := time.Now().Add(testutil.Timeout(90 * time.Second))
	for i, c := range flood {
		_ = c.SetReadDeadline(deadline)
		_, err := io.Copy(io.Discard, c)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("idle connection %d of %d still open after the idle limit", i, len(flood))
		}
	}
	lookupOK("after the flood")
	healthOK("after the flood")
	readyOK("after the flood")
	fresh, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	cctx, cancel := context.WithTimeout(ctx, testutil.Timeout(10*time.Second))
	defer cancel()
	if _, err := kvindexv1.NewIndexServiceClient(fresh).Lookup(cctx, &kvindexv1.LookupRequest{Model: "m", BlockHashes: []uint64{1}}); err != nil {
		t.Fatalf("a new connection after the flood: %v", err)
	}
	if s := logs.String(); strings.Contains(s, "too many open files") {
		t.Fatalf("indexd ran out of file descriptors:\n%s", s)
	}
}
