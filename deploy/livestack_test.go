package deploy

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/ingester"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/scenario"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/wiring/replay"
	"github.com/kvindex/kvindex/wiring/stack"
	"github.com/kvindex/kvindex/wiring/stack/stacktest"
)

// engineStack starts a standalone stack (wiring/stack) in engine-hash
// mode with a liveness window long enough that nothing expires during a
// test, and replays the named scenario files of
// testdata/fixtures/scenarios into it. Scenarios expect an empty index
// each, so their expectations are not checked here: the tests compare
// with what the stack's own API answers.
func engineStack(t *testing.T, files ...string) (*stack.Stack, *client.Client) {
	t.Helper()
	s := stacktest.Start(t, func(c *stack.Config) {
		c.Ingester = func(ic *ingester.Config) {
			ic.HashMode = keyspace.HashModeEngine
			ic.LivenessWindow = time.Hour
		}
	})
	idx, err := client.New(s.GRPCAddr(), client.WithTimeout(testutil.Timeout(30*time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { idx.Close() })
	prod, err := kgo.NewClient(kgo.SeedBrokers(s.KafkaAddr()), kgo.RecordRetries(10))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(2*time.Minute))
	defer cancel()
	dir := filepath.Join(testutil.RepoRoot(t), "testdata", "fixtures", "scenarios")
	for _, f := range files {
		sc, err := scenario.Load(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if sc.HashMode != scenario.HashModeEngine {
			t.Fatalf("%s is a scenario of hash mode %s; engineStack runs engine mode", f, sc.HashMode)
		}
		if _, err := replay.Run(ctx, replay.Target{Producer: prod, Topic: s.Topic(), Index: idx}, sc); err != nil {
			t.Fatalf("replaying %s: %v", f, err)
		}
	}
	return s, idx
}

// httpGet fetches url and returns its status and body.
func httpGet(t *testing.T, url string) (int, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(30*time.Second))
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, body
}
