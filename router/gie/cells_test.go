package gie_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/grpc"
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
