package deploy

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/internal/testutil"
)

// dockerInstruction is one Dockerfile instruction, continuation lines
// joined.
type dockerInstruction struct {
	Cmd  string // upper case
	Args string
}

func parseDockerfile(path string) ([]dockerInstruction, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []dockerInstruction
	var cur strings.Builder
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if cur.Len() == 0 && (line == "" || strings.HasPrefix(line, "#")) {
			continue
		}
		if cont, ok := strings.CutSuffix(line, "\\"); ok {
			cur.WriteString(cont + " ")
			continue
		}
		cur.WriteString(line)
		cmd, args, _ := strings.Cut(cur.String(), " ")
		out = append(out, dockerInstruction{Cmd: strings.ToUpper(cmd), Args: strings.TrimSpace(args)})
		cur.Reset()
	}
	return out, sc.Err()
}

// TestDockerfile reviews deploy/Dockerfile's shape, since no container
// engine runs here to build it: multi-stage, a static build of
// ./cmd/kvindex with the Go version of go.mod, a distroless or scratch
// runtime stage, a numeric non-root USER that the manifests' runAsUser
// matches, and the binary as the entrypoint (roles are subcommands).
func TestDockerfile(t *testing.T) {
	root := testutil.RepoRoot(t)
	ins, err := parseDockerfile(filepath.Join(root, "deploy", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(gomod)
	if m == nil {
		t.Fatal("go.mod has no go directive")
	}
	goVersion := string(m[1])

	args := map[string]string{}
	var froms []string
	var user, entrypoint string
	var staticBuild, copiesBinary bool
	var copies []string
	for _, in := range ins {
		switch in.Cmd {
		case "ARG":
			name, def, _ := strings.Cut(in.Args, "=")
			args[name] = def
		case "FROM":
			froms = append(froms, in.Args)
		case "RUN":
			if strings.Contains(in.Args, "CGO_ENABLED=0") && strings.Contains(in.Args, "go build") && strings.Contains(in.Args, "./cmd/kvindex") {
				staticBuild = true
			}
		case "COPY":
			copies = append(copies, in.Args)
			if strings.HasPrefix(in.Args, "--from=") && strings.HasSuffix(in.Args, " /kvindex") {
				copiesBinary = len(froms) > 1
			}
		case "USER":
			user = in.Args
		case "ENTRYPOINT":
			entrypoint = in.Args
		}
	}
	if len(froms) < 2 {
		t.Fatalf("%d FROM stages, want a build stage and a runtime stage", len(froms))
	}
	if !strings.Contains(froms[0], "golang:${GO_VERSION}") || args["GO_VERSION"] != goVersion {
		t.Errorf("build stage %q with GO_VERSION=%q, want golang:${GO_VERSION} with go.mod's %s", froms[0], args["GO_VERSION"], goVersion)
	}
	runtime := strings.Fields(froms[len(froms)-1])[0]
	if runtime != "scratch" && !strings.HasPrefix(runtime, "gcr.io/distroless/static") {
		t.Errorf("runtime stage %q, want distroless static or scratch", runtime)
	}
	if !staticBuild {
		t.Error("no RUN builds ./cmd/kvindex with CGO_ENABLED=0 (a static binary)")
	}
	if !copiesBinary {
		t.Error("the runtime stage does not COPY --from the build stage to /kvindex")
	}
	// go mod download reads the go.mod of every module the main module
	// replaces by a directory of the repository.
	for _, r := range regexp.MustCompile(`(?m)=> \./(\S+)$`).FindAllSubmatch(gomod, -1) {
		want := string(r[1]) + "/go.mod"
		if !slices.ContainsFunc(copies, func(c string) bool { return strings.Contains(c, want) }) {
			t.Errorf("go.mod replaces a module by ./%s, but no COPY brings %s before go mod download", r[1], want)
		}
	}
	var ep []string
	if err := json.Unmarshal([]byte(entrypoint), &ep); err != nil || len(ep) != 1 || ep[0] != "/kvindex" {
		t.Errorf("ENTRYPOINT %s, want [\"/kvindex\"] (exec form; the role is the first arg)", entrypoint)
	}
	uidStr, gidStr, _ := strings.Cut(user, ":")
	uid, err1 := strconv.ParseInt(uidStr, 10, 64)
	gid, err2 := strconv.ParseInt(gidStr, 10, 64)
	if err1 != nil || err2 != nil || uid == 0 || gid == 0 {
		t.Fatalf("USER %q, want numeric non-root uid:gid (runAsNonRoot can verify only a numeric user)", user)
	}
	if _, err := os.Stat(filepath.Join(root, "cmd", "kvindex")); err != nil {
		t.Errorf("the Dockerfile builds ./cmd/kvindex: %v", err)
	}

	// The manifests run the image as the same user.
	var checked int
	for _, b := range okBuilds(t) {
		kcs, _ := kvContainers(b)
		for _, k := range kcs {
			checked++
			u := k.W.Template.Spec.SecurityContext
			var got *int64
			if u != nil {
				got = u.RunAsUser
			}
			if k.C.SecurityContext != nil && k.C.SecurityContext.RunAsUser != nil {
				got = k.C.SecurityContext.RunAsUser
			}
			if got == nil || *got != uid {
				t.Errorf("%s/%s: runAsUser %v, want the image's USER %d", b.Dir, k, got, uid)
			}
		}
	}
	if checked == 0 {
		t.Error("no manifest runs the kvindex image")
	}
}
