package gie_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"

	"github.com/kvindex/kvindex/router/gie"
)

// TestFactoryLeavesNoGoroutinesAfterClose: producers built by the factory with
// a cell map file (a watcher goroutine) and with a target (gRPC
// connections, after a Lookup) leave no goroutine behind once the
// handle's context ends.
func TestFactoryLeavesNoGoroutinesAfterClose(t *testing.T) {
	dir := t.TempDir()
	cells := filepath.Join(dir, "cells.json")
	target := hangingListener(t)
	if err := os.WriteFile(cells, []byte(`{"cells":[{"name":"a","indexd":"`+target+`","topic":"ta"},{"name":"b","indexd":"`+deadTarget(t)+`","topic":"tb"}],"models":[{"match":"m","cells":["a","b"]}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	settle := func() int {
		for range 50 {
			runtime.GC()
			time.Sleep(20 * time.Millisecond)
		}
		return runtime.NumGoroutine()
	}
	before := settle()
	for _, params := range []map[string]any{{"cellMap": cells}, {"target": target}} {
		raw, _ := json.Marshal(params)
		ctx, cancel := context.WithCancel(context.Background())
		pl, err := gie.ProducerFactory(gie.NewMetrics())("kvindex", raw, plugin.NewEppHandle(ctx, nil))
		if err != nil {
			t.Fatal(err)
		}
		p := pl.(*gie.Producer)
		for range 3 {
			_ = p.PrepareRequestData(context.Background(), tokenized(strings.Repeat("y", 64)), endpoints(2))
		}
		cancel()
	}
	after := settle()
	if after > before {
		buf := make([]byte, 1<<20)
		n := runtime.Stack(buf, true)
		var ours []string
		for _, g := range strings.Split(string(buf[:n]), "\n\n") {
			if strings.Contains(g, "grpc") || strings.Contains(g, "cellmap") || strings.Contains(g, "kvindex") {
				ours = append(ours, g)
			}
		}
		t.Errorf("%d goroutines before, %d after the handles' contexts ended; kvindex/gRPC ones:\n%s", before, after, strings.Join(ours, "\n\n"))
	}
}
