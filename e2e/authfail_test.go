package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/kvindex/kvindex/internal/kafkaauth"
	"github.com/kvindex/kvindex/internal/testutil"
)

// TestIngesterWrongSASLPasswordIsLoud runs the kvindex binary's ingester
// with a wrong SASL password at the default log level, as an operator
// would: within 20 s it logs an ERROR naming the broker and the
// mechanism, /readyz answers 503 with the reason "kafka authentication
// failed", /metrics counts the failure, and the password shows nowhere.
// This is the role's wiring of the authentication watch, end to end.
func TestIngesterWrongSASLPasswordIsLoud(t *testing.T) {
	t.Parallel()
	const (
		topic    = "events"
		mech     = kafkaauth.MechanismSCRAMSHA256
		password = "Wr0ng-S3cr3t"
	)
	e := testutil.StartEtcd(t)
	k := testutil.StartKafka(t, topic, 1, kfake.EnableSASL(), kfake.Superuser(mech, "kvuser", "the-right-password"))
	pwFile := filepath.Join(t.TempDir(), "kafka-password")
	if err := os.WriteFile(pwFile, []byte(password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := testutil.Context(t, 2*time.Minute)
	cmd := exec.CommandContext(ctx, kvindexBin(t), "ingester",
		"--etcd-endpoints", e.Endpoints[0], "--brokers", k.Brokers[0], "--topic", topic,
		"--group", "wrong-password", "--id", "ingester-wrong-password",
		"--kafka-sasl-mechanism", mech, "--kafka-sasl-username", "kvuser", "--kafka-sasl-password-file", pwFile,
		"--metrics-listen", "127.0.0.1:0", "--log-format", "json")
	line, logs := startLogged(t, ctx, cmd, "ingester starting")
	ops, _ := line["metrics"].(string)

	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + ops + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	// errorLine is the first ERROR line naming the broker and the
	// mechanism, or "".
	errorLine := func() string {
		for l := range strings.Lines(logs.String()) {
			var line map[string]any
			if json.Unmarshal([]byte(l), &line) == nil && line["level"] == "ERROR" &&
				strings.Contains(l, k.Brokers[0]) && strings.Contains(l, mech) {
				return l
			}
		}
		return ""
	}
	const reason = "kafka authentication failed"
	var code int
	var ready, logged string
	deadline := time.Now().Add(testutil.Timeout(20 * time.Second))
	for time.Now().Before(deadline) {
		code, ready = get("/readyz")
		if logged = errorLine(); logged != "" && code == http.StatusServiceUnavailable && strings.Contains(ready, reason) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if logged == "" {
		t.Errorf("no ERROR line naming the broker %s and %s within 20 s", k.Brokers[0], mech)
	}
	if code != http.StatusServiceUnavailable || !strings.Contains(ready, reason) {
		t.Errorf("/readyz = %d %q, want 503 naming %q", code, strings.TrimSpace(ready), reason)
	}
	if _, metrics := get("/metrics"); !strings.Contains(metrics, "kvindex_auth_failures_total{") {
		t.Errorf("/metrics has no kvindex_auth_failures_total series")
	}
	if strings.Contains(logs.String()+ready, password) {
		t.Errorf("the password is shown")
	}
}
