package ingester

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/kvindex/kvindex/internal/ingesttest"
	"github.com/kvindex/kvindex/internal/sim/refmodel"
	"github.com/kvindex/kvindex/internal/testutil"
)

// TestDeletedTopicFetchErrors: the topic deleted and created again under a
// running ingester makes every fetch fail (UNKNOWN_TOPIC_ID). The errors are counted, the
// warning is logged once per fetchErrLogEvery, not once per error (it was
// tens of thousands of lines a second), and the ingester still stops
// cleanly.
func TestDeletedTopicFetchErrors(t *testing.T) {
	t.Parallel()
	const topic = "deleted"
	e := newEnv(t, 1, []string{topic})
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(30*time.Second))
	defer cancel()
	cfg := e.config(t, topic, "g-deleted", "/kvindex/deleted/")
	reg := prometheus.NewRegistry()
	cfg.Registry = reg
	var logs testutil.LogBuffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	r := start(t, cfg)
	ingesttest.WaitApplied(t, ctx, e.etcd.Client, cfg.Keyspace, topic,
		ingesttest.Produce(t, ctx, e.prod, topic, []refmodel.Record{store(t, "p", time.Now(), 1)}))

	resps, err := kadm.NewClient(e.prod).DeleteTopics(ctx, topic)
	if err == nil {
		err = resps.Error()
	}
	if err != nil {
		t.Fatalf("deleting the topic: %v", err)
	}
	// Created again, it has a new topic ID: the member's fetches name the
	// old one.
	cresps, err := kadm.NewClient(e.prod).CreateTopics(ctx, 1, 1, nil, topic)
	if err == nil {
		err = cresps.Error()
	}
	if err != nil {
		t.Fatalf("creating the topic again: %v", err)
	}
	deadline := time.Now().Add(testutil.Timeout(20 * time.Second))
	for testutil.CounterValue(t, reg, "kvindex_ingester_fetch_errors_total", nil) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("fetch_errors_total = %v after the topic went, want at least 2", testutil.CounterValue(t, reg, "kvindex_ingester_fetch_errors_total", nil))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := r.stop(); err != nil {
		t.Fatalf("stop after the topic went: %v", err)
	}
	errs := testutil.CounterValue(t, reg, "kvindex_ingester_fetch_errors_total", nil)
	if lines := strings.Count(logs.String(), `msg="fetch error"`); lines != 1 {
		t.Errorf("%d fetch error lines for %v errors, want 1 (once per %v)", lines, errs, fetchErrLogEvery)
	}
}
