package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	framework "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
	attrprefix "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/datalayer/attribute/prefix"

	"github.com/kvindex/kvindex/bridge"
	"github.com/kvindex/kvindex/bridge/bridgetest"
	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/client/cellmap"
	"github.com/kvindex/kvindex/internal/events"
	"github.com/kvindex/kvindex/internal/sim/enginesim"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/router/gie"
	"github.com/kvindex/kvindex/wiring/stack"
	"github.com/kvindex/kvindex/wiring/stack/stacktest"
)

// cellEndpoint is one engine of the cells test: its model, its pod (IP
// and port, as bridges name pods) and the blocks of each prompt it
// stores.
type cellEndpoint struct {
	model, ip string
	stores    map[string]int // prompt tag → leading blocks stored
}

func (e cellEndpoint) pod() string { return e.ip + ":8000" }

// TestCellsBridgesAndPlugin: two cells and a single-cell reference, each
// a whole stack (its own Kafka, etcd, ingester, indexd). Every engine
// (enginesim) has two real bridges: one with the cell map (Config.Cells),
// which sends its records to the topic and brokers of its model's cell (a
// model spread over both cells by pod, a model in cell b), and one to the
// reference. The GIE plugin's producer with the cellMap parameter then
// writes, for every model and prompt, the same prefix match on every
// endpoint as a producer pointed at the reference, and that match is the
// one the engines stored.
func TestCellsBridgesAndPlugin(t *testing.T) {
	if testing.Short() {
		t.Skip("three stacks")
	}
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(60*time.Second))
	defer cancel()
	stacks := map[string]*stack.Stack{}
	for _, name := range []string{"a", "b", "ref"} {
		stacks[name] = stacktest.Start(t, func(c *stack.Config) { c.Topic = "cell-" + name })
	}
	const spread, solo = "spread-model", "solo-model"
	doc := fmt.Sprintf(`{
  "cells": [
    {"name": "a", "indexd": %q, "topic": %q, "brokers": [%q]},
    {"name": "b", "indexd": %q, "topic": %q, "brokers": [%q]}
  ],
  "models": [{"match": %q, "cells": ["a", "b"]}, {"match": "solo-*", "cells": ["b"]}],
  "default": "a"
}`, stacks["a"].GRPCAddr(), stacks["a"].Topic(), stacks["a"].KafkaAddr(),
		stacks["b"].GRPCAddr(), stacks["b"].Topic(), stacks["b"].KafkaAddr(), spread)
	path := filepath.Join(t.TempDir(), "cells.json")
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := cellmap.Load(path)
	if err != nil {
		t.Fatal(err)
	}

	// Four pods of the spread model, stored prefixes of different lengths
	// of one shared prompt and 4 blocks of a prompt of their own; one pod
	// of the solo model stores the shared prompt too.
	eps := []cellEndpoint{}
	for i := range 4 {
		eps = append(eps, cellEndpoint{model: spread, ip: fmt.Sprintf("10.0.0.%d", i+1),
			stores: map[string]int{"shared": i + 1, fmt.Sprintf("own%d", i): 4}})
	}
	eps = append(eps, cellEndpoint{model: solo, ip: "10.0.0.9", stores: map[string]int{"shared": 3}})
	wantCell := map[string]string{}
	for _, e := range eps {
		c, err := m.WriteCell(e.model, e.pod())
		if err != nil {
			t.Fatal(err)
		}
		wantCell[e.pod()] = c.Name
	}
	if used := slices.Collect(maps.Values(wantCell)); !slices.Contains(used, "a") || !slices.Contains(used, "b") {
		t.Fatalf("the pods' cells %v: want both cells used (pick other pods)", wantCell)
	}

	// The engines and their bridges: one through the map, one to the
	// reference.
	engines := make([]*enginesim.Engine, len(eps))
	for i, e := range eps {
		eng, err := enginesim.New(enginesim.DefaultConfig())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { eng.Close() })
		engines[i] = eng
		for _, side := range []string{"cells", "ref"} {
			cfg := bridge.DefaultConfig()
			cfg.Endpoint, cfg.ReplayEndpoint = eng.PubEndpoint(), ""
			cfg.Pod, cfg.Model = e.pod(), e.model
			cfg.HeartbeatInterval, cfg.GracePeriod = time.Hour, 0
			cfg.ProbeInterval = 50 * time.Millisecond
			cfg.Registry = prometheus.NewRegistry()
			if side == "cells" {
				cfg.Brokers, cfg.Topic, cfg.Cells = []string{stacks["a"].KafkaAddr()}, "", m
			} else {
				cfg.Brokers, cfg.Topic = []string{stacks["ref"].KafkaAddr()}, stacks["ref"].Topic()
			}
			b, err := bridge.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			r := bridgetest.Start(t, b)
			if err := bridgetest.WaitReady(ctx, r.B); err != nil {
				t.Fatal(err)
			}
		}
		if err := eng.WaitSubscriptions(ctx, 2); err != nil {
			t.Fatal(err)
		}
	}
	prompts := map[string]client.TokenPrompt{}
	for _, tag := range []string{"shared", "own0", "own1", "own2", "own3"} {
		_, prompts[tag] = prompt(tag, 4*blockSize)
	}
	for i, e := range eps {
		for _, tag := range slices.Sorted(maps.Keys(e.stores)) {
			payload, err := events.Encode(events.Batch{TS: 1.7e9, HasRank: true,
				Events: []events.Event{storedEvent(e.pod(), prompts[tag], e.stores[tag])}}, events.EncodingMap)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := engines[i].Publish(ctx, payload); err != nil {
				t.Fatal(err)
			}
		}
	}

	// What the engines stored, as matches per model and prompt: the
	// reference must answer it, and so must the cells.
	type match struct {
		Pod    string
		Blocks int
	}
	type query struct{ model, tag string }
	byPod := func(a, b match) int { return strings.Compare(a.Pod, b.Pod) }
	want := map[query][]match{} // ordered by pod
	for _, e := range eps {
		for tag, n := range e.stores {
			q := query{e.model, tag}
			want[q] = append(want[q], match{e.pod(), n})
		}
	}
	for _, ms := range want {
		slices.SortFunc(ms, byPod)
	}
	refClient, err := client.New(stacks["ref"].GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = refClient.Close() })
	cellClient, err := client.New("", client.WithCells(m))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cellClient.Close() })
	for name, cl := range map[string]*client.Client{"reference": refClient, "cells": cellClient} {
		for q, w := range want {
			model, tag := q.model, q.tag
			var got []match
			for {
				res, err := cl.LookupTokens(ctx, model, prompts[tag])
				got = nil
				if err == nil {
					for _, mt := range res.Matches {
						got = append(got, match{mt.Endpoint.Pod, mt.Blocks})
					}
					slices.SortFunc(got, byPod)
					if cmp.Equal(w, got) {
						break
					}
				}
				if ctx.Err() != nil {
					t.Fatalf("%s: %s %s never matched what the engines stored (-want +got):\n%s(last error %v)", name, model, tag, cmp.Diff(w, got), err)
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
	}

	// Every endpoint is in its write cell, and only there.
	list, err := cellClient.ListEndpoints(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	gotCell := map[string]string{}
	for _, e := range list.Endpoints {
		if prev, dup := gotCell[e.Endpoint.Pod]; dup {
			t.Errorf("pod %s listed in cells %s and %s", e.Endpoint.Pod, prev, e.Cell)
		}
		gotCell[e.Endpoint.Pod] = e.Cell
	}
	if d := cmp.Diff(wantCell, gotCell); d != "" {
		t.Errorf("each endpoint's cell (-map +listed):\n%s", d)
	}

	// The plugin: a producer with the cell map and one pointed at the
	// reference write the same prefix match on every endpoint of the pool.
	cellsMetrics := gie.NewMetrics()
	producers := map[string]*gie.Producer{
		"cells":     newCellsProducer(t, cellsMetrics, map[string]any{"cellMap": path}),
		"reference": newCellsProducer(t, gie.NewMetrics(), map[string]any{"target": stacks["ref"].GRPCAddr()}),
	}
	for _, model := range []string{spread, solo} {
		for _, tag := range slices.Sorted(maps.Keys(prompts)) {
			infos := map[string][]string{}
			for name, p := range producers {
				req := &framework.LLMRequest{RequestId: "r", TargetModel: model,
					Body:            &framework.LLMRequestBody{Completions: &framework.CompletionsRequest{Prompt: framework.Prompt{Raw: "ignored"}}},
					TokenizedPrompt: &framework.TokenizedPrompt{TokenIDs: prompts[tag].TokenIDs}}
				pool := poolOf(eps)
				if err := p.PrepareRequestData(ctx, req, pool); err != nil {
					t.Fatal(err)
				}
				for i, ep := range pool {
					info := "none"
					if v, ok := ep.Get(attrprefix.PrefixCacheMatchInfoKey); ok {
						pi := v.(*attrprefix.PrefixCacheMatchInfo)
						info = fmt.Sprintf("%d/%d blocks of %d", pi.MatchBlocks(), pi.TotalBlocks(), pi.BlockSizeTokens())
					}
					infos[name] = append(infos[name], eps[i].pod()+": "+info)
				}
			}
			if d := cmp.Diff(infos["reference"], infos["cells"]); d != "" {
				t.Errorf("%s %s: the plugin's prefix match per endpoint (-reference +cells):\n%s", model, tag, d)
			}
			// The reference's answer is what the engines stored.
			for _, w := range want[query{model, tag}] {
				line := fmt.Sprintf("%s: %d/%d blocks of %d", w.Pod, w.Blocks, 4, blockSize)
				if !slices.Contains(infos["reference"], line) {
					t.Errorf("%s %s: reference lacks %q: %v", model, tag, line, infos["reference"])
				}
			}
		}
	}
	if n := metricValue(t, cellsMetrics, "kvindex_gie_fallbacks_total", nil); n != 0 {
		t.Errorf("the cells producer counted %v fallbacks, want 0 (every cell answers)", n)
	}
}

// newCellsProducer builds the plugin's producer from JSON-able parameters
// through its factory, as the EPP does.
func newCellsProducer(t *testing.T, m *gie.Metrics, params map[string]any) *gie.Producer {
	t.Helper()
	raw, err := json.Marshal(params)
	if err != nil {
		t.Fatal(err)
	}
	p, err := gie.ProducerFactory(m)("kvindex", raw, plugin.NewEppHandle(t.Context(), nil))
	if err != nil {
		t.Fatal(err)
	}
	return p.(*gie.Producer)
}

// poolOf is the scheduling pool of the endpoints: each pod at its IP,
// port 8000.
func poolOf(eps []cellEndpoint) []framework.Endpoint {
	out := make([]framework.Endpoint, len(eps))
	for i, e := range eps {
		out[i] = framework.NewEndpoint(&fwkdl.EndpointMetadata{
			NamespacedName: types.NamespacedName{Namespace: "default", Name: fmt.Sprintf("pod%d", i)},
			PodName:        fmt.Sprintf("pod%d", i), Address: e.ip, Port: "8000",
		}, nil, nil)
	}
	return out
}

// storedEvent is the BlockStored of p's first n blocks on pod (rank 0),
// with token ids, so the index keys them in token mode as the plugin
// looks them up.
func storedEvent(pod string, p client.TokenPrompt, n int) events.Event {
	ev := events.Event{Type: events.BlockStored, BlockSize: blockSize}
	var parent uint64
	for b := range n {
		toks := p.TokenIDs[b*blockSize : (b+1)*blockSize]
		h := engineHash(pod, 0, parent, toks)
		ev.BlockHashes = append(ev.BlockHashes, h)
		for _, tk := range toks {
			ev.TokenIDs = append(ev.TokenIDs, int64(tk))
		}
		parent = h
	}
	return ev
}
