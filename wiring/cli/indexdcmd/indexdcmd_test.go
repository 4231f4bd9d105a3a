package indexdcmd

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/indexd"
	"github.com/kvindex/kvindex/internal/testutil"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testutil.LeakOptions()...)
}

func TestIndexdCommandServes(t *testing.T) {
	e := testutil.StartEtcd(t)
	// Port 0: the addresses are read back from the start line.
	cmd := NewCommand()
	cmd.SetArgs([]string{"--etcd-endpoints", e.Endpoints[0], "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
		"--max-hashes", "16", "--log-format", "json"})
	pr, pw := io.Pipe()
	cmd.SetErr(pw)
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(30*time.Second))
	defer cancel()
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		err := cmd.ExecuteContext(runCtx)
		pw.Close()
		done <- err
	}()
	addrs := make(chan map[string]any, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			var line map[string]any
			if json.Unmarshal(sc.Bytes(), &line) == nil && line["msg"] == "indexd starting" {
				addrs <- line
			}
		}
	}()
	var grpcAddr, opsAddr string
	select {
	case line := <-addrs:
		grpcAddr, opsAddr = line["grpc"].(string), line["metrics"].(string)
	case <-ctx.Done():
		t.Fatal("indexd never logged its addresses")
	}

	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// WaitForReady rides out the moment before the port is bound.
	stream, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{Service: "kvindex.v1.IndexService"}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("health watch: %v", err)
		}
		if resp.Status == healthpb.HealthCheckResponse_SERVING {
			break
		}
	}
	// Reflection is off with the default flags: a client learns nothing
	// of the API it did not bring.
	refl, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err == nil {
		// Send says io.EOF once the server has ended the stream (as it
		// does at once for a service it does not serve); Recv then
		// returns the status it ended it with.
		err = refl.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}})
		if err == nil || errors.Is(err, io.EOF) {
			_, err = refl.Recv()
		}
	}
	if status.Code(err) != codes.Unimplemented {
		t.Fatalf("reflection with the default flags: %v, want Unimplemented", err)
	}
	for path, want := range map[string]string{"/readyz": "ok", "/metrics": "kvindex_indexd_ready 1"} {
		resp, err := http.Get("http://" + opsAddr + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), want) {
			t.Fatalf("GET %s = %d, body lacks %q", path, resp.StatusCode, want)
		}
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("indexd returned %v on shutdown", err)
	}
}

// TestIndexdCommandDefaults: out of the box, indexd serves no reflection
// and staleness shows (a positive --max-staleness).
func TestIndexdCommandDefaults(t *testing.T) {
	fs := NewCommand().Flags()
	def := func(name string) string {
		t.Helper()
		f := fs.Lookup(name)
		if f == nil {
			t.Fatalf("no flag --%s", name)
		}
		return f.DefValue
	}
	if v := def("grpc-reflection"); v != "false" {
		t.Errorf("--grpc-reflection default %q, want false", v)
	}
	v := def("max-staleness")
	if d, err := time.ParseDuration(v); err != nil || d <= 0 {
		t.Errorf("--max-staleness default %q, want a positive duration", v)
	}
	// The help of --metrics-listen lists every page the ops server serves,
	// the status page too.
	if u := fs.Lookup("metrics-listen").Usage; !strings.Contains(u, statusPath) || !strings.Contains(u, "/metrics") {
		t.Errorf("--metrics-listen help %q, want it to name /metrics and %s", u, statusPath)
	}
}

// TestIndexdCommandRefusesNonPositiveFlags: a zero or negative limit is an
// error naming the flag, never silently the default.
func TestIndexdCommandRefusesNonPositiveFlags(t *testing.T) {
	for _, name := range positiveFlags {
		for _, v := range []string{"0", "-1"} {
			t.Run(strings.ReplaceAll(name, "-", "_")+"_"+strings.ReplaceAll(v, "-", "minus"), func(t *testing.T) {
				f := NewCommand().Flags().Lookup(name)
				if f == nil {
					t.Fatalf("no flag --%s", name)
				}
				if f.Value.Type() == "duration" {
					v += "s"
				}
				cmd := NewCommand()
				cmd.SetArgs([]string{"--" + name, v})
				cmd.SetOut(io.Discard)
				cmd.SetErr(io.Discard)
				err := cmd.Execute()
				if err == nil || !strings.Contains(err.Error(), "--"+name+" must be positive") {
					t.Fatalf("--%s %s: error %v, want one naming the flag", name, v, err)
				}
			})
		}
	}
}

// TestIndexdCommandNamesListenOnBusyPort: a gRPC address already in use is
// an error that names --listen.
func TestIndexdCommandNamesListenOnBusyPort(t *testing.T) {
	e := testutil.StartEtcd(t)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	cmd := NewCommand()
	cmd.SetArgs([]string{"--etcd-endpoints", e.Endpoints[0], "--listen", busy.Addr().String(),
		"--metrics-listen", "127.0.0.1:0", "--log-level", "warn"})
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(30*time.Second))
	defer cancel()
	err = cmd.ExecuteContext(ctx)
	if err == nil || !strings.Contains(err.Error(), "(--listen)") || !strings.Contains(err.Error(), busy.Addr().String()) {
		t.Fatalf("error = %v, want one naming --listen and the address", err)
	}
}

// TestIndexdCommandHealthPortOfItsOwn: --health-listen on --listen's
// address is refused naming both flags (the health port bound first, and
// the error blamed --listen). Nothing listens at the etcd endpoint: the
// check comes before any use of it.
func TestIndexdCommandHealthPortOfItsOwn(t *testing.T) {
	cmd := NewCommand()
	cmd.SetArgs([]string{"--etcd-endpoints", "http://127.0.0.1:1", "--listen", "127.0.0.1:50551", "--health-listen", "127.0.0.1:50551",
		"--metrics-listen", "127.0.0.1:0", "--log-level", "error"})
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(30*time.Second))
	defer cancel()
	err := cmd.ExecuteContext(ctx)
	if err == nil || !strings.Contains(err.Error(), "--health-listen 127.0.0.1:50551 is --listen's address too") {
		t.Fatalf("error = %v, want one naming --health-listen and --listen", err)
	}
}

// TestIndexdCommandNamesFlagsInConfigErrors: a rule indexd.Config's
// Validate checks between two settings reads in the flags that set them.
// Nothing listens at the etcd endpoint: Validate runs before indexd uses
// its client.
func TestIndexdCommandNamesFlagsInConfigErrors(t *testing.T) {
	cmd := NewCommand()
	cmd.SetArgs([]string{"--barrier-timeout", "10s", "--max-barrier-timeout", "5s", "--listen", "127.0.0.1:0",
		"--metrics-listen", "127.0.0.1:0", "--etcd-endpoints", "127.0.0.1:1"})
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	err := cmd.Execute()
	const want = "--barrier-timeout 10s exceeds --max-barrier-timeout 5s"
	if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "BarrierTimeout") {
		t.Fatalf("error = %v, want one containing %q", err, want)
	}
	if !errors.Is(err, indexd.ErrInvalidConfig) {
		t.Errorf("error %v does not wrap indexd.ErrInvalidConfig", err)
	}
}
