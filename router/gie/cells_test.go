package gie_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"
	framework "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"

	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
	"github.com/kvindex/kvindex/router/gie"
)

// oneCell is a real gRPC IndexService for one cell that holds the first
// blocks matched of pod.
type oneCell struct {
	kvindexv1.UnimplementedIndexServiceServer
	pod    string
	blocks uint32
}

func (c *oneCell) Lookup(context.Context, *kvindexv1.LookupRequest) (*kvindexv1.LookupResponse, error) {
	return &kvindexv1.LookupResponse{Revision: 1, Matches: []*kvindexv1.EndpointMatch{{
		Endpoint: &kvindexv1.Endpoint{Pod: c.pod}, MatchedBlocks: c.blocks, BlockSize: 16,
		Tiers: make([]kvindexv1.Tier, c.blocks),
	}}}, nil
}

// serveCell serves srv (a cell's, or any replica's, IndexService) on a
// loopback port until the test ends and returns its address.
func serveCell(t *testing.T, srv kvindexv1.IndexServiceServer) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	kvindexv1.RegisterIndexServiceServer(g, srv)
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Serve(l) }()
	t.Cleanup(func() { g.Stop(); <-done })
	return l.Addr().String()
}

// TestCellMapPartialAnswer spreads model m over a cell that answers and
// one nobody serves: the answering cell's match is written and the
// request counts as a fallback with reason partial.
func TestCellMapPartialAnswer(t *testing.T) {
	live := serveCell(t, &oneCell{pod: "10.0.0.1:8000", blocks: 2})
	doc := fmt.Sprintf(`{"cells": [{"name": "a", "indexd": %q, "topic": "ta"}, {"name": "b", "indexd": %q, "topic": "tb"}],
 "models": [{"match": "m", "cells": ["a", "b"]}, {"match": "solo", "cells": ["a"]}]}`, live, deadTarget(t))
	path := filepath.Join(t.TempDir(), "cells.json")
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, cellMap := range map[string]string{"file": path, "inline": doc} {
		t.Run(name, func(t *testing.T) {
			m := gie.NewMetrics()
			p := newProducer(t, m, map[string]any{"cellMap": cellMap})
			for i, model := range []string{"m", "solo"} {
				req := completion(model, "ignored")
				req.TokenizedPrompt = &framework.TokenizedPrompt{TokenIDs: make([]uint32, 64)}
				eps := endpoints(2)
				if err := p.PrepareRequestData(t.Context(), req, eps); err != nil {
					t.Fatal(err)
				}
				if match, total, _, ok := prefixInfo(t, eps[0]); !ok || match != 2 || total != 4 {
					t.Fatalf("model %s: pod0's match = %d of %d (written %v), want 2 of 4 from cell a", model, match, total, ok)
				}
				// Only the spread model's answer is partial.
				if got := fallbacks(t, m, gie.FallbackApproximate, gie.KindPartial); got != 1 {
					t.Fatalf("after request %d: fallbacks{approximate,partial} = %v, want 1", i, got)
				}
			}
		})
	}
}

func TestCellMapParams(t *testing.T) {
	for name, raw := range map[string]string{
		"both":         `{"target":"x:1","cellMap":"/nonexistent"}`,
		"missing_file": `{"cellMap":"/nonexistent/cells.json"}`,
		"bad_inline":   `{"cellMap":"{\"cells\": []}"}`,
	} {
		t.Run(name, func(t *testing.T) {
			_, err := gie.ProducerFactory(gie.NewMetrics())("kvindex", []byte(raw), nil)
			if !errors.Is(err, gie.ErrInvalidConfig) {
				t.Fatalf("err = %v, want ErrInvalidConfig", err)
			}
		})
	}
}

// listCell is a real gRPC IndexService for one cell: ListEndpoints names
// its pods of each model; Lookup matches nothing, with a current progress
// time unless noProgress.
type listCell struct {
	kvindexv1.UnimplementedIndexServiceServer
	eps        map[string][]string // model: pods (ListEndpoints of model "": all)
	noProgress bool
}

func (c *listCell) Lookup(context.Context, *kvindexv1.LookupRequest) (*kvindexv1.LookupResponse, error) {
	r := &kvindexv1.LookupResponse{Revision: 1}
	if !c.noProgress {
		r.ProgressTime = timestamppb.Now()
	}
	return r, nil
}

func (c *listCell) ListEndpoints(_ context.Context, req *kvindexv1.ListEndpointsRequest) (*kvindexv1.ListEndpointsResponse, error) {
	resp := &kvindexv1.ListEndpointsResponse{Revision: 1}
	for model, pods := range c.eps {
		if req.Model != "" && req.Model != model {
			continue
		}
		for _, p := range pods {
			resp.Endpoints = append(resp.Endpoints, &kvindexv1.EndpointInfo{Model: model, Endpoint: &kvindexv1.Endpoint{Pod: p}})
		}
	}
	return resp, nil
}

// TestCellMapIdentityCheckReadsEveryCell: a model spread over two cells
// whose first holds none of its endpoints (a model moving to a new cell,
// or a pool that hashed into the second) or only others than the
// candidates: the identity check reads past the first cell's page, so a
// cold prompt counts neither an unknown model nor a mismatch. Before,
// it read only the first cell's page and counted one of them.
func TestCellMapIdentityCheckReadsEveryCell(t *testing.T) {
	candidates := []string{"10.0.0.1:8000", "10.0.0.2:8000"} // endpoints(2)
	for name, first := range map[string]map[string][]string{
		"first cell holds no endpoint of the model": {"base": {"10.9.9.9:8000"}},
		"first cell holds another endpoint":         {"m": {"10.9.9.9:8000"}},
	} {
		t.Run(name, func(t *testing.T) {
			a := serveCell(t, &listCell{eps: first})
			b := serveCell(t, &listCell{eps: map[string][]string{"m": candidates}})
			doc := fmt.Sprintf(`{"cells": [{"name": "a", "indexd": %q, "topic": "ta"}, {"name": "b", "indexd": %q, "topic": "tb"}],
 "models": [{"match": "m", "cells": ["a", "b"]}, {"match": "base", "cells": ["a"]}]}`, a, b)
			m := gie.NewMetrics()
			p := newProducer(t, m, map[string]any{"cellMap": doc})
			req := completion("m", "ignored")
			req.TokenizedPrompt = &framework.TokenizedPrompt{TokenIDs: make([]uint32, 64)}
			if err := p.PrepareRequestData(t.Context(), req, endpoints(2)); err != nil {
				t.Fatal(err)
			}
			for _, metric := range []string{"kvindex_gie_unknown_model_total", "kvindex_gie_identity_mismatch_total"} {
				if got := metricValue(t, m, metric, map[string]string{"model": "m"}); got != 0 {
					t.Errorf("%s{model=m} = %v, want 0: both candidates are indexed, in cell b", metric, got)
				}
			}
		})
	}
}

// TestCellMapPartialAnswerKeepsSpeculation: a partial answer's progress
// time is the answering cells' only, so it does not end the speculative
// entry of an endpoint whose cell failed: a second request for the prefix,
// past the index lag, still credits the endpoint chosen for the first. It
// is what an answer without a progress time gives. Before, the failed
// cell's endpoint lost its entry to the live cell's progress time.
func TestCellMapPartialAnswerKeepsSpeculation(t *testing.T) {
	for name, second := range map[string]func(t *testing.T) string{
		"cell b down":                  deadTarget,
		"cell b with no progress time": func(t *testing.T) string { return serveCell(t, &listCell{noProgress: true}) },
	} {
		t.Run(name, func(t *testing.T) {
			doc := fmt.Sprintf(`{"cells": [{"name": "a", "indexd": %q, "topic": "ta"}, {"name": "b", "indexd": %q, "topic": "tb"}],
 "models": [{"match": "m", "cells": ["a", "b"]}]}`, serveCell(t, &listCell{}), second(t))
			p := newProducer(t, gie.NewMetrics(), map[string]any{"cellMap": doc, "speculativeIndexLag": "50ms", "speculativeTTL": "1m"})
			request := func() (*framework.LLMRequest, []framework.Endpoint) {
				req := completion("m", "ignored")
				req.TokenizedPrompt = &framework.TokenizedPrompt{TokenIDs: make([]uint32, 64)}
				eps := endpoints(2)
				if err := p.PrepareRequestData(t.Context(), req, eps); err != nil {
					t.Fatal(err)
				}
				return req, eps
			}
			req, eps := request()
			p.PreRequest(t.Context(), req, &framework.SchedulingResult{PrimaryProfileName: "d",
				ProfileResults: map[string]*framework.ProfileRunResult{"d": {TargetEndpoints: []framework.Endpoint{eps[1]}}}})
			time.Sleep(200 * time.Millisecond) // past the index lag
			_, eps = request()
			if match, total, _, _ := prefixInfo(t, eps[1]); match != total || total == 0 {
				t.Fatalf("the chosen endpoint's match = %d of %d after a partial answer, want all of its speculative blocks", match, total)
			}
		})
	}
}
