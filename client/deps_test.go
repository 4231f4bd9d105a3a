package client

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/internal/testutil"
)

// TestDependenciesStayLight checks that a router importing the client
// builds no etcd, Kafka, Prometheus or kvindex-internal code (DESIGN
// "Components": the client is gRPC, protobuf and the generated API).
func TestDependenciesStayLight(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	cmd := exec.Command("go", "list", "-deps", "github.com/kvindex/kvindex/client")
	cmd.Dir = testutil.RepoRoot(t)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	deps := strings.Fields(string(out))
	forbidden := []string{
		"go.etcd.io/",
		"github.com/twmb/franz-go",
		"github.com/prometheus/",
		"go.uber.org/zap",
		"github.com/kvindex/kvindex/internal/",
		"github.com/kvindex/kvindex/indexd",
	}
	sawGRPC := false
	for _, d := range deps {
		sawGRPC = sawGRPC || d == "google.golang.org/grpc"
		for _, f := range forbidden {
			if strings.HasPrefix(d, f) {
				t.Errorf("client depends on %s", d)
			}
		}
	}
	if !sawGRPC {
		t.Fatalf("go list -deps output lacks google.golang.org/grpc; is the check reading the right package? %d deps", len(deps))
	}
}
