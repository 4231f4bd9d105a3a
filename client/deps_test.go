package client

import (
	"os/exec"
	"strings"
	"testing"
)

// forbiddenModules are the module path prefixes a router importing the
// client must never get in its module graph (DESIGN "Components": the
// client is gRPC, protobuf, CBOR and the generated API; no etcd,
// Kafka, Kubernetes, kustomize or Prometheus). The main module itself is
// forbidden too: only its proto module may be required.
var forbiddenModules = []string{
	"go.etcd.io/",
	"github.com/twmb/franz-go",
	"github.com/prometheus/",
	"k8s.io/",
	"sigs.k8s.io/",
	"go.uber.org/zap",
	"github.com/spf13/",
}

// goList runs go list with args in the client module's directory (a
// test's working directory is its package's, here the module root) and
// returns the fields of its output.
func goList(t *testing.T, args ...string) []string {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list"}, args...)...)
	out, err := cmd.Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("go list %s: %v\n%s", strings.Join(args, " "), err, ee.Stderr)
		}
		t.Fatalf("go list %s: %v", strings.Join(args, " "), err)
	}
	return strings.Fields(string(out))
}

// TestModuleGraphStaysLight checks `go list -m all` of the client module:
// every module a router that requires the client may download. It also
// fails when the main module (github.com/kvindex/kvindex) is required.
func TestModuleGraphStaysLight(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	mods := goList(t, "-m", "-f", "{{.Path}}", "all")
	sawGRPC, sawProto := false, false
	for _, m := range mods {
		sawGRPC = sawGRPC || m == "google.golang.org/grpc"
		sawProto = sawProto || m == "github.com/kvindex/kvindex/proto"
		if m == "github.com/kvindex/kvindex" {
			t.Errorf("the client module requires the main module")
		}
		for _, f := range forbiddenModules {
			if strings.HasPrefix(m, f) {
				t.Errorf("the client module graph holds %s", m)
			}
		}
	}
	if !sawGRPC || !sawProto {
		t.Fatalf("go list -m all lacks grpc (%v) or the proto module (%v); is the check reading the client module? %d modules", sawGRPC, sawProto, len(mods))
	}
}

// TestDependenciesStayLight checks that a router importing the client
// builds only the client, the generated API and the libraries it names
// (gRPC, protobuf, CBOR and their own dependencies): no package of the
// forbidden modules and no kvindex package but these (and the client's
// own cellmap and internal/target, standard library only).
func TestDependenciesStayLight(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	deps := goList(t, "-deps", ".")
	sawGRPC := false
	for _, d := range deps {
		sawGRPC = sawGRPC || d == "google.golang.org/grpc"
		if strings.HasPrefix(d, "github.com/kvindex/kvindex/") && d != "github.com/kvindex/kvindex/client" && d != "github.com/kvindex/kvindex/client/cellmap" && d != "github.com/kvindex/kvindex/client/internal/target" && !strings.HasPrefix(d, "github.com/kvindex/kvindex/proto/") {
			t.Errorf("client depends on %s", d)
		}
		for _, f := range forbiddenModules {
			if strings.HasPrefix(d, f) {
				t.Errorf("client depends on %s", d)
			}
		}
	}
	if !sawGRPC {
		t.Fatalf("go list -deps output lacks google.golang.org/grpc; is the check reading the right package? %d deps", len(deps))
	}
}
