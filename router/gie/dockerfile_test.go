package gie_test

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestDockerfile checks router/gie/Dockerfile's shape, since no container
// engine runs in CI: a build stage on go.mod's Go version, the module
// files of every replaced module copied before the download, a static
// build of cmd/kvindex-epp, and a distroless non-root runtime stage named
// kvindex-epp (the target).
func TestDockerfile(t *testing.T) {
	df, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	mod, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	s := string(df)
	goVer := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindStringSubmatch(string(mod))
	if goVer == nil || !strings.Contains(s, "ARG GO_VERSION="+goVer[1]) {
		t.Errorf("GO_VERSION is not go.mod's %v", goVer)
	}
	for _, r := range regexp.MustCompile(`(?m)^replace \S+ => \.\./\.\./(\S+)`).FindAllStringSubmatch(string(mod), -1) {
		if !strings.Contains(s, "COPY "+r[1]+"/go.mod "+r[1]+"/go.sum "+r[1]+"/") {
			t.Errorf("replaced module %s: its go.mod is not copied before go mod download", r[1])
		}
	}
	for _, want := range []string{
		"CGO_ENABLED=0",
		"-o /out/kvindex-epp ./cmd/kvindex-epp",
		"FROM gcr.io/distroless/static-debian12:nonroot AS kvindex-epp",
		"USER 65532:65532",
		`ENTRYPOINT ["/kvindex-epp"]`,
	} {
		if !strings.Contains(s, want) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}
}
