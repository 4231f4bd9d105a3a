package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/testutil"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// kvindexBin builds the kvindex binary once per test run and returns its
// path.
func kvindexBin(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "kvindex-e2e-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "kvindex")
		cmd := exec.Command("go", "build", "-o", binPath, "./cmd/kvindex")
		cmd.Dir = testutil.RepoRoot(t)
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = errors.New(string(out))
		}
	})
	if buildErr != nil {
		t.Fatalf("building kvindex: %v", buildErr)
	}
	return binPath
}

// run runs the binary to completion and returns stdout, stderr and the
// exit code.
func run(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(3*time.Minute))
	defer cancel()
	cmd := exec.CommandContext(ctx, kvindexBin(t), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("running kvindex %v: %v", args, err)
	}
	return stdout.String(), stderr.String(), code
}

func fixtures(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(testutil.ScenarioGlob(t))
	if err != nil || len(files) < 12 {
		t.Fatalf("fixtures: %v, %d files", err, len(files))
	}
	return files
}

// fixture returns the path of the scenario file called name (the files do
// not start with p01: the engine scenarios sort first).
func fixture(t *testing.T, name string) string {
	t.Helper()
	return filepath.Join(filepath.Dir(testutil.ScenarioGlob(t)), name)
}

// TestReplayBinary is the acceptance command: `kvindex replay` over
// every fixture on fresh embedded stacks exits 0; a doctored expectation
// exits 1 and says what was expected and what came back.
// TestReplayBinary replays every bundled scenario through the binary, one
// subtest per file, run in parallel (each `kvindex replay FILE` starts a
// stack of its own), so no single test replays them all in a row.
func TestReplayBinary(t *testing.T) {
	t.Parallel()
	for _, f := range fixtures(t) {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".jsonl"), func(t *testing.T) {
			t.Parallel()
			out, errOut, code := run(t, "replay", f)
			if code != 0 || strings.Count(out, "PASS ") != 1 {
				t.Fatalf("replay exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
			}
		})
	}
}

// TestReplayBinaryFails: a scenario whose expectation does not hold exits
// 1 and prints expected against actual; a bad flag combination exits 2.
func TestReplayBinaryFails(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile(fixture(t, "p01_shared_prefix.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	doctored := filepath.Join(t.TempDir(), "doctored.jsonl")
	bad := bytes.Replace(src, []byte(`"blocks": 4, "tiers"`), []byte(`"blocks": 3, "tiers"`), 1)
	if bytes.Equal(bad, src) {
		t.Fatal("could not doctor the fixture")
	}
	if err := os.WriteFile(doctored, bad, 0o644); err != nil {
		t.Fatal(err)
	}
	out, _, code := run(t, "replay", doctored)
	if code != 1 || !strings.Contains(out, "FAIL ") || !strings.Contains(out, "expected:") || !strings.Contains(out, "expected 3 blocks, got 4") {
		t.Fatalf("doctored replay exit %d, output:\n%s", code, out)
	}
	_, errOut, code := run(t, "replay", "--index", "127.0.0.1:1", doctored)
	if code != 2 || !strings.Contains(errOut, "--brokers and --index go together") {
		t.Fatalf("--index without --brokers: exit %d, stderr %q", code, errOut)
	}
}

// standalone is a running `kvindex standalone` process.
type standalone struct {
	cmd                      *exec.Cmd
	etcd, kafka, grpc, metrs string
	lines                    chan string
	done                     chan error
	stderr                   *syncBuffer
}

// syncBuffer is a bytes.Buffer the child process writes while the test
// reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func startStandalone(t *testing.T, dataDir string) *standalone {
	t.Helper()
	// Every port is the kernel's pick (port 0), read back from what
	// standalone prints (waitLine), so no port picked here can be taken
	// before standalone binds it.
	s := &standalone{}
	s.cmd = exec.Command(kvindexBin(t), "standalone", "--data-dir", dataDir,
		"--etcd-listen", "127.0.0.1:0", "--kafka-listen", "127.0.0.1:0", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0")
	stdout, err := s.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	s.stderr = new(syncBuffer)
	s.cmd.Stderr = s.stderr
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s.lines, s.done = make(chan string, 64), make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			s.lines <- sc.Text()
		}
		close(s.lines)
		s.done <- s.cmd.Wait()
	}()
	t.Cleanup(func() {
		if s.cmd.ProcessState == nil {
			_ = s.cmd.Process.Kill()
			for range s.lines {
			}
			<-s.done
		}
	})
	return s
}

// waitLine reads stdout until a line starting with prefix, returning every
// line read.
func (s *standalone) waitLine(t *testing.T, prefix string) []string {
	t.Helper()
	var seen []string
	timeout := time.After(testutil.Timeout(2 * time.Minute))
	for {
		select {
		case l, ok := <-s.lines:
			if !ok {
				t.Fatalf("standalone exited before %q; stdout %q; stderr:\n%s", prefix, seen, s.stderr)
			}
			seen = append(seen, l)
			s.noteAddr(l)
			if strings.HasPrefix(l, prefix) {
				return seen
			}
		case <-timeout:
			t.Fatalf("no %q from standalone; stdout %q; stderr:\n%s", prefix, seen, s.stderr)
		}
	}
}

// noteAddr records the address a stdout line of standalone gives.
func (s *standalone) noteAddr(l string) {
	field := func(prefix string) string {
		v, _ := strings.CutPrefix(l, prefix)
		v, _, _ = strings.Cut(v, " ")
		return v
	}
	switch {
	case strings.HasPrefix(l, "kafka: "):
		s.kafka = field("kafka: ")
	case strings.HasPrefix(l, "grpc: "):
		s.grpc = field("grpc: ")
	case strings.HasPrefix(l, "etcd: http://"):
		s.etcd = field("etcd: http://")
	case strings.HasPrefix(l, "metrics: http://"):
		s.metrs = strings.TrimSuffix(field("metrics: http://"), "/metrics")
	}
}

// interrupt sends Ctrl-C and waits for a clean exit.
func (s *standalone) interrupt(t *testing.T) {
	t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	s.waitLine(t, "stopped")
	for range s.lines {
	}
	if err := <-s.done; err != nil {
		t.Fatalf("standalone exit after Ctrl-C: %v; stderr:\n%s", err, s.stderr)
	}
}

type lookupJSON struct {
	Endpoints []struct {
		Pod    string   `json:"pod"`
		DPRank uint32   `json:"dp_rank"`
		Blocks int      `json:"blocks"`
		Tiers  []string `json:"tiers"`
	} `json:"endpoints"`
	Revision int64            `json:"revision"`
	Offsets  map[string]int64 `json:"offsets"`
}

func lookup(t *testing.T, grpc string, args ...string) lookupJSON {
	t.Helper()
	out, errOut, code := run(t, append([]string{"lookup", "--index", grpc, "-o", "json"}, args...)...)
	if code != 0 {
		t.Fatalf("lookup exit %d: %s", code, errOut)
	}
	var got lookupJSON
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("lookup -o json printed %q: %v", out, err)
	}
	return got
}

// TestStandaloneBinary runs `kvindex standalone` as a user would: it prints
// its addresses, serves producers and lookups, answers on /metrics, refuses
// a busy port naming the flag to change, stops cleanly on Ctrl-C, and
// keeps its etcd data and Kafka log across a restart.
func TestStandaloneBinary(t *testing.T) {
	t.Parallel()
	dataDir := t.TempDir()
	s := startStandalone(t, dataDir)
	lines := s.waitLine(t, "ready")
	for _, addr := range []string{s.kafka, s.grpc, s.etcd, s.metrs} {
		if _, port, err := net.SplitHostPort(addr); err != nil || port == "0" {
			t.Fatalf("standalone stdout %q: an address is missing or unbound (%q)", lines, addr)
		}
	}

	// The README tour: standalone runs in token mode (the default), so an
	// engine-hash fixture is refused before anything of it is produced,
	// and a token-mode one replays.
	scenarios := filepath.Dir(fixtures(t)[0])
	out, errOut, code := run(t, "replay", "--brokers", s.kafka, "--index", s.grpc, filepath.Join(scenarios, "p01_shared_prefix.jsonl"))
	if code != 2 || !strings.Contains(errOut, "--hash-mode token") {
		t.Fatalf("replay of an engine-hash fixture against token-mode standalone: exit %d\n%s\n%s", code, out, errOut)
	}
	out, errOut, code = run(t, "replay", "--brokers", s.kafka, "--index", s.grpc, filepath.Join(scenarios, "t01_same_prompt_across_pods.jsonl"))
	if code != 0 {
		t.Fatalf("replay against standalone: exit %d\n%s\n%s", code, out, errOut)
	}
	const model = "org/token-demo"
	tokens := []string{"--tokens", "1000,1001,1002,1003,1004,1005,1006,1007,1008,1009,1010,1011"}
	before := lookup(t, s.grpc, append([]string{"--model", model}, tokens...)...)
	if len(before.Endpoints) != 3 || before.Endpoints[0].Pod != "vllm-0" || before.Endpoints[0].Blocks != 3 || before.Endpoints[2].Blocks != 2 {
		t.Fatalf("lookup after t01 = %+v, want vllm-0 and vllm-1 with 3 blocks and vllm-2 with 2", before)
	}

	resp, err := http.Get("http://" + s.metrs + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"kvindex_ingester_", "kvindex_indexd_"} {
		if !strings.Contains(string(body), want) {
			t.Fatalf("/metrics has no %s metrics", want)
		}
	}

	// A second standalone on the same ports must say which flag to change.
	_, errOut, code = run(t, "standalone", "--data-dir", t.TempDir(), "--etcd-listen", s.etcd, "--kafka-listen", "127.0.0.1:0", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0")
	if code == 0 || !strings.Contains(errOut, "--etcd-listen") || !strings.Contains(errOut, s.etcd) {
		t.Fatalf("standalone on a busy etcd port: exit %d, stderr %q", code, errOut)
	}

	s.interrupt(t)

	// Same data dir (new ports): the index and the Kafka log are back.
	again := startStandalone(t, dataDir)
	again.waitLine(t, "ready")
	after := lookup(t, again.grpc, append([]string{"--model", model}, tokens...)...)
	if !reflect.DeepEqual(after.Endpoints, before.Endpoints) {
		t.Fatalf("lookup after restart = %+v, want what it was before: %+v", after, before)
	}
	for part, off := range before.Offsets {
		if after.Offsets[part] != off {
			t.Fatalf("applied offsets after restart %v, before %v", after.Offsets, before.Offsets)
		}
	}
	// The Kafka log survived too: replaying more records continues from the
	// stored offsets (an offset past the log end would have been reset).
	out, errOut, code = run(t, "replay", "--brokers", again.kafka, "--index", again.grpc, filepath.Join(scenarios, "t02_cpu_placeholders.jsonl"))
	if code != 0 {
		t.Fatalf("replay after restart: exit %d\n%s\n%s", code, out, errOut)
	}
	if strings.Contains(again.stderr.String(), "out of range") {
		t.Fatalf("the restarted standalone reset offsets:\n%s", again.stderr)
	}
	again.interrupt(t)
}
