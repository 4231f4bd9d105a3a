package gie_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"

	"github.com/kvindex/kvindex/router/gie"
)

// TestProducerFactoryRefusesBadParams feeds partial, wrong-typed,
// negative, zero and absurd parameters through the factory, as GIE's
// loader would: none may panic, the cases marked accept=false are
// refused at load (those past indexd's limits too, with which every
// request could only fall back) and the others load.
func TestProducerFactoryRefusesBadParams(t *testing.T) {
	dead := deadTarget(t)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, []byte("not a pem"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		raw    string
		accept bool
	}{
		{`{}`, false},
		{`null`, false},
		{`[]`, false},
		{`"x"`, false},
		{`{"target": ""}`, false},
		{`{"target": " "}`, false},
		{`{"target": ","}`, false},
		{`{"target": "http://indexd:50051"}`, false},
		{`{"target": 12}`, false},
		{`{"target": "` + dead + `", "blockSize": "16"}`, false},
		{`{"target": "` + dead + `", "blockSize": -1}`, false},
		{`{"target": "` + dead + `", "blockSize": 0}`, false},
		{`{"target": "` + dead + `", "blockSize": 16.5}`, false},
		{`{"target": "` + dead + `", "blockSize": 1e30}`, false},
		{`{"target": "` + dead + `", "maxPromptTokens": 0}`, false},
		{`{"target": "` + dead + `", "maxPromptTokens": 2000000}`, false},
		{`{"target": "` + dead + `", "rankPortStride": -1}`, false},
		{`{"target": "` + dead + `", "rankPortStride": 70000}`, false},
		{`{"target": "` + dead + `", "tokenizeTimeout": 150}`, false},
		{`{"target": "` + dead + `", "tokenizeTimeout": "0s"}`, false},
		{`{"target": "` + dead + `", "tokenizeTimeout": "-1s"}`, false},
		{`{"target": "` + dead + `", "tokenizeTimeout": "1e400s"}`, false},
		{`{"target": "` + dead + `", "lookupTimeout": "9223372036854775807ns"}`, false},
		{`{"target": "` + dead + `", "tokenizeTimeout": "300ms", "lookupTimeout": "100ms"}`, false},
		{`{"target": "` + dead + `", "speculativeTTL": null}`, false},
		{`{"target": "` + dead + `", "speculativeTTL": "-1s"}`, false},
		{`{"target": "` + dead + `", "speculativeMaxEntries": 0}`, false},
		{`{"target": "` + dead + `", "speculativeMaxEntries": -5}`, false},
		{`{"target": "` + dead + `", "fallback": "APPROXIMATE"}`, false},
		{`{"target": "` + dead + `", "fallbackLogInterval": "0s"}`, false},
		{`{"target": "` + dead + `", "podIdentity": "ip"}`, false},
		{`{"target": "` + dead + `", "ranks": "prefix"}`, false},
		{`{"target": "` + dead + `", "models": {}}`, false},
		{`{"target": "` + dead + `", "models": [null]}`, false},
		{`{"target": "` + dead + `", "models": [{"match": "a"}, {"match": "a"}]}`, false},
		{`{"target": "` + dead + `", "models": [{"match": "a", "Model": "b"}]}`, false},
		{`{"target": "` + dead + `", "tokenizer": "x"}`, false},
		{`{"target": "` + dead + `", "tokenizer": {"url": "http://[::1"}}`, false},
		{`{"target": "` + dead + `", "tokenizer": {"url": "ftp://x"}}`, false},
		{`{"target": "` + dead + `", "tokenizer": {"maxResponseBytes": 0}}`, false},
		{`{"target": "` + dead + `", "tokenizer": {"url": "http://a", "url": "http://b"}}`, false},
		{`{"target": "` + dead + `", "caFile": "` + ca + `"}`, false},
		{`{"target": "` + dead + `", "caFile": "/nonexistent/ca.pem"}`, false},
		{`{"target": "` + dead + `", "certFile": "x"}`, false},
		{`{"target": "` + dead + `", "serverName": "x"}`, false},
		{`{"target": "` + dead + `", "cellMap": "{}"}`, false},
		{`{"cellMap": "{}"}`, false},
		{`{"cellMap": "/nonexistent/cells.json"}`, false},
		{`{"target": "` + dead + `"} {"x": 1}`, false},
		// Every request that used them could only fall back: indexd
		// refuses extras over 1024 bytes (--max-extra-bytes) and model
		// names over 512 bytes.
		{`{"target": "` + dead + `", "models": [{"match": "a", "lora": "` + strings.Repeat("l", 2000) + `"}]}`, false},
		{`{"target": "` + dead + `", "models": [{"match": "a", "model": "` + strings.Repeat("m", 600) + `"}]}`, false},
		// Absurd: every prompt shorter than a billion tokens has 0
		// blocks for every unmatched candidate, and speculation never
		// keys a block.
		{`{"target": "` + dead + `", "blockSize": 1000000000}`, false},
		// Fine.
		{`{"target": "` + dead + `"}`, true},
		{`{"target": "` + dead + `", "rankPortStride": 0}`, true},
		{`{"target": "` + dead + `", "speculativeTTL": "0s"}`, true},
		{`{"target": "` + dead + `", "maxStaleness": "0s"}`, true},
		{`{"target": "` + dead + `", "maxStaleness": "-30s"}`, false},
		{`{"target": "` + dead + `", "maxStaleness": null}`, false},
		{`{"target": "dns:///kvindex-indexd.kvindex.svc:50051"}`, true},
	} {
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("%.120s: panic %v", tc.raw, r)
				}
			}()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			p, err := gie.ProducerFactory(gie.NewMetrics())("kvindex", json.RawMessage(tc.raw), plugin.NewEppHandle(ctx, nil))
			got := err == nil
			if got != tc.accept {
				t.Errorf("%.120s: accepted=%v (err %v), want accepted=%v", tc.raw, got, err, tc.accept)
			}
			if (p != nil) != tc.accept {
				t.Errorf("%.120s: plugin %v with accepted=%v", tc.raw, p, tc.accept)
			}
		}()
	}
}
