package deploy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/internal/tier"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
	"github.com/kvindex/kvindex/wiring/cli"
)

// TestIndexdProbesThroughEtcdOutage pins what the indexd probes rely on
// (deploy/README.md, "What the probes mean"): liveness and readiness use
// the gRPC health service, which is safe only if a replica that has
// listed once stays SERVING while etcd is unreachable and while it
// re-lists; otherwise an etcd outage would restart every replica at once,
// each to a cold start against the etcd that just came back.
//
// It runs `kvindex indexd` as the prod overlay configures it (its args,
// with etcd behind a cuttable proxy and the listen addresses on loopback),
// cuts etcd off, deletes and compacts behind the replica's back, heals
// the cut so the replica must re-list, and requires: the health service
// never leaves SERVING (a Watch stream sees every change), /healthz and
// /readyz stay 200, and Lookup answers from the old index through the
// outage and from the fresh one after.
func TestIndexdProbesThroughEtcdOutage(t *testing.T) {
	args := indexdArgs(t, "overlays/prod")
	e := testutil.StartEtcd(t)
	px := testutil.StartProxy(t, testutil.HostPort(e.Endpoints[0]))

	ks := keyspace.Default()
	ep := keyspace.Endpoint{Model: "qwen3-8b", Pod: "192.0.2.10:8000"}
	hashes := []uint64{0x1111, 0x2222, 0x3333}
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(60*time.Second))
	defer cancel()
	rec, err := (&keyspace.EndpointRecord{HashMode: keyspace.HashModeEngine, LastRecord: time.Now().UTC(), Topic: "kvindex-events"}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	var entries []keyspace.ChunkEntry
	for _, h := range hashes {
		entries = append(entries, keyspace.ChunkEntry{Key: h, Engine: h})
	}
	ops := []clientv3.Op{clientv3.OpPut(ks.EndpointKey(ep), string(rec)),
		clientv3.OpPut(ks.ChunkKey(ep, tier.GPU, 0), string(keyspace.AppendChunkValue(nil, entries, false)))}
	if _, err := e.Client.Txn(ctx).Then(ops...).Commit(); err != nil {
		t.Fatal(err)
	}

	// Port 0 everywhere: the addresses are read back from the replica's
	// "indexd starting" line, so no picked port can be taken before the
	// replica binds it.
	args = setArg(args, "--etcd-endpoints", px.Endpoint())
	args = setArg(args, "--listen", "127.0.0.1:0")
	args = setArg(args, "--health-listen", "127.0.0.1:0")
	args = setArg(args, "--metrics-listen", "127.0.0.1:0")
	args = setArg(args, "--log-level", "info")
	args = setArg(args, "--log-format", "json")
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	logs := newStartLine()
	go func() {
		root := cli.NewRoot()
		root.SetArgs(args)
		root.SetErr(logs)
		done <- root.ExecuteContext(runCtx)
	}()
	var grpcAddr, opsAddr string
	select {
	case line := <-logs.started:
		grpcAddr, opsAddr = line.GRPC, line.Metrics
	case err := <-done:
		done <- err // for the cleanup's shutdown
		t.Fatalf("kvindex indexd: %v", err)
	case <-ctx.Done():
		t.Fatal("kvindex indexd never logged its addresses")
	}
	stopped := false
	shutdown := func() error {
		if stopped {
			return nil
		}
		stopped = true
		stop()
		return <-done
	}
	t.Cleanup(func() { _ = shutdown() })

	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	health := healthpb.NewHealthClient(conn)
	statuses := watchHealth(t, ctx, health)
	statuses.waitFor(t, healthpb.HealthCheckResponse_SERVING)

	lookup := func() uint32 {
		t.Helper()
		resp, err := kvindexv1.NewIndexServiceClient(conn).Lookup(ctx, &kvindexv1.LookupRequest{Model: ep.Model, BlockHashes: hashes})
		if err != nil {
			t.Fatalf("Lookup: %v", err)
		}
		if len(resp.Matches) == 0 {
			return 0
		}
		return resp.Matches[0].MatchedBlocks
	}
	probes := func(when string) {
		t.Helper()
		if resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("%s: gRPC health = %v, %v; want SERVING", when, resp, err)
		}
		for _, path := range []string{"/healthz", "/readyz"} {
			if code := httpStatus(t, ctx, "http://"+opsAddr+path); code != http.StatusOK {
				t.Errorf("%s: %s = %d, want 200", when, path, code)
			}
		}
	}
	if got := lookup(); got != uint32(len(hashes)) {
		t.Fatalf("before the outage: %d blocks matched, want %d", got, len(hashes))
	}
	probes("before the outage")

	// The outage, as the replica sees it: its etcd connection is gone.
	px.Cut()
	probeCli, err := clientv3.New(clientv3.Config{Endpoints: []string{px.Endpoint()}, DialTimeout: time.Second, Logger: zap.NewNop()})
	if err == nil {
		getCtx, getCancel := context.WithTimeout(ctx, time.Second)
		_, err = probeCli.Get(getCtx, "x")
		getCancel()
		probeCli.Close()
	}
	if err == nil {
		t.Fatal("etcd still answers through the cut proxy")
	}
	probes("etcd unreachable")
	if got := lookup(); got != uint32(len(hashes)) {
		t.Errorf("etcd unreachable: %d blocks matched, want the old index's %d", got, len(hashes))
	}

	// Behind the replica's back: the blocks go, and the history with them.
	// A watch may start at the compaction revision itself, so compact one
	// write past the delete: the replica must re-list to see it.
	if _, err := e.Client.Delete(ctx, ks.ChunksPrefix(), clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	resp, err := e.Client.Put(ctx, ks.IngesterKey("probe-test"), "{}")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Client.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	px.Restore(testutil.HostPort(e.Endpoints[0]))
	waitMetric(t, ctx, "http://"+opsAddr+"/metrics", "kvindex_indexd_lists_total", "reason", "compacted", 1)
	probes("after the re-list")
	if got := lookup(); got != 0 {
		t.Errorf("after the re-list: %d blocks matched, want 0 (the blocks were deleted)", got)
	}
	if seen := statuses.snapshot(); !slices.Equal(afterFirst(seen, healthpb.HealthCheckResponse_SERVING), []healthpb.HealthCheckResponse_ServingStatus{healthpb.HealthCheckResponse_SERVING}) {
		t.Errorf("gRPC health went %v; after the first SERVING it must stay SERVING", seen)
	}
	if err := shutdown(); err != nil {
		t.Errorf("kvindex indexd: %v", err)
	}
}

// indexdArgs returns the args of the indexd container of a build, $(VAR)s
// expanded.
func indexdArgs(t *testing.T, dir string) []string {
	t.Helper()
	for _, b := range okBuilds(t) {
		if b.Dir != dir {
			continue
		}
		for _, w := range byComponent(b, "indexd") {
			c := containerNamed(w, "indexd")
			env, _ := envResolver{b: b, w: w, podName: w.PodNames()[0]}.resolve(c)
			args, unresolved := expandAll(c.Args, env)
			if len(unresolved) > 0 {
				t.Fatalf("%s: unresolved %v", w, unresolved)
			}
			return args
		}
	}
	t.Fatalf("no indexd in deploy/%s", dir)
	return nil
}

// setArg sets --name=value in args, replacing the arg of that name.
func setArg(args []string, name, value string) []string {
	out := slices.DeleteFunc(slices.Clone(args), func(a string) bool { return strings.HasPrefix(a, name+"=") })
	return append(out, name+"="+value)
}

// healthLog records every status a health Watch stream delivers.
type healthLog struct {
	mu      sync.Mutex
	seen    []healthpb.HealthCheckResponse_ServingStatus
	changed chan struct{}
}

func watchHealth(t *testing.T, ctx context.Context, h healthpb.HealthClient) *healthLog {
	t.Helper()
	// WaitForReady: the replica may not listen yet.
	stream, err := h.Watch(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	l := &healthLog{changed: make(chan struct{}, 1)}
	done := make(chan struct{})
	t.Cleanup(func() { <-done })
	go func() {
		defer close(done)
		for {
			resp, err := stream.Recv()
			if err != nil {
				return // the replica stopped, or the test's context ended
			}
			l.mu.Lock()
			l.seen = append(l.seen, resp.Status)
			l.mu.Unlock()
			select {
			case l.changed <- struct{}{}:
			default:
			}
		}
	}()
	return l
}

func (l *healthLog) snapshot() []healthpb.HealthCheckResponse_ServingStatus {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.seen)
}

// waitFor waits until the stream has delivered status.
func (l *healthLog) waitFor(t *testing.T, status healthpb.HealthCheckResponse_ServingStatus) {
	t.Helper()
	deadline := time.After(testutil.Timeout(30 * time.Second))
	for !slices.Contains(l.snapshot(), status) {
		select {
		case <-l.changed:
		case <-deadline:
			t.Fatalf("health never reported %v (saw %v)", status, l.snapshot())
		}
	}
}

// afterFirst returns s from the first occurrence of v on.
func afterFirst[T comparable](s []T, v T) []T {
	if i := slices.Index(s, v); i >= 0 {
		return s[i:]
	}
	return nil
}

func httpStatus(t *testing.T, ctx context.Context, url string) int {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// waitMetric polls a Prometheus endpoint until the counter name with
// label=value reaches want.
func waitMetric(t *testing.T, ctx context.Context, url, name, label, value string, want float64) {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var last float64
	for {
		v, err := scrapeCounter(ctx, url, name, label, value)
		if err != nil {
			t.Fatal(err)
		}
		if last = v; v >= want {
			return
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("%s{%s=%q} = %v, waited for %v", name, label, value, last, want)
		}
	}
}

// scrapeCounter reads the sample name{label="value"} of a Prometheus text
// exposition (the only label of the counters it is used for); 0 when the
// sample is absent.
func scrapeCounter(ctx context.Context, url, name, label, value string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	sample := fmt.Sprintf("%s{%s=%q} ", name, label, value)
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, sample); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return 0, nil
}

// startLine is a log sink that hands over the addresses of the first
// "indexd starting" line (JSON lines).
type startLine struct {
	mu      sync.Mutex
	buf     []byte
	started chan startAddrs
	sent    bool
}

type startAddrs struct {
	Msg     string `json:"msg"`
	GRPC    string `json:"grpc"`
	Metrics string `json:"metrics"`
}

func newStartLine() *startLine { return &startLine{started: make(chan startAddrs, 1)} }

func (s *startLine) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.buf = append(s.buf, p...)
	for {
		i := bytes.IndexByte(s.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		var a startAddrs
		if !s.sent && json.Unmarshal(s.buf[:i], &a) == nil && a.Msg == "indexd starting" {
			s.sent = true
			s.started <- a
		}
		s.buf = s.buf[i+1:]
	}
}
