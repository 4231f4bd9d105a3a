package gie_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	framework "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"

	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
	"github.com/kvindex/kvindex/router/gie"
)

// replicaAt is an indexd stand-in (a real gRPC server) whose index is
// behind by `behind`; when ghost is set it still names pod0
// (10.0.0.1:8000) as holding 4 blocks, which a current replica no longer
// does.
type replicaAt struct {
	kvindexv1.UnimplementedIndexServiceServer
	behind time.Duration
	ghost  bool
}

// Lookup answers with the replica's progress time and, when ghost, the
// ghost match.
func (r *replicaAt) Lookup(context.Context, *kvindexv1.LookupRequest) (*kvindexv1.LookupResponse, error) {
	resp := &kvindexv1.LookupResponse{Revision: 1, ProgressTime: timestamppb.New(time.Now().Add(-r.behind))}
	if r.ghost {
		resp.Matches = []*kvindexv1.EndpointMatch{{Endpoint: &kvindexv1.Endpoint{Pod: "10.0.0.1:8000"}, MatchedBlocks: 4, BlockSize: 16,
			Tiers: []kvindexv1.Tier{1, 1, 1, 1}}}
	}
	return resp, nil
}

// ListEndpoints lists nothing.
func (r *replicaAt) ListEndpoints(context.Context, *kvindexv1.ListEndpointsRequest) (*kvindexv1.ListEndpointsResponse, error) {
	return &kvindexv1.ListEndpointsResponse{}, nil
}

// tokenized is a completions request whose tokens an upstream plugin
// already filled (one token per byte of text).
func tokenized(text string) *framework.LLMRequest {
	r := completion("m", text)
	ids := make([]uint32, len(text))
	for i := range ids {
		ids[i] = uint32(text[i])
	}
	r.TokenizedPrompt = &framework.TokenizedPrompt{TokenIDs: ids}
	return r
}

// TestAllReplicasStaleFallBack: with every indexd replica an hour behind
// (their etcd out of reach; a client already connected keeps reaching
// them, readiness or not), DESIGN "Staleness" says the router falls back
// to its own scoring. Every request falls back with reason "stale",
// nothing is scored from the stale index, and maxStaleness "0s" turns
// the check off (the stale answers are used). Before, all 20 requests
// were scored from the stale index and no fallback was counted.
func TestAllReplicasStaleFallBack(t *testing.T) {
	a := serveCell(t, &replicaAt{behind: time.Hour, ghost: true})
	b := serveCell(t, &replicaAt{behind: time.Hour, ghost: true})
	for _, tc := range []struct {
		maxStaleness string // "" leaves the default
		wantScored   bool
	}{{"", false}, {"0s", true}} {
		t.Run("maxStaleness="+tc.maxStaleness, func(t *testing.T) {
			m := gie.NewMetrics()
			params := map[string]any{"target": a + "," + b, "speculativeTTL": "0s", "identityCheckInterval": "0s", "fallback": "none"}
			if tc.maxStaleness != "" {
				params["maxStaleness"] = tc.maxStaleness
			}
			p := newProducer(t, m, params)
			scored := 0
			const requests = 20
			for range requests {
				eps := endpoints(2)
				_ = p.PrepareRequestData(t.Context(), tokenized(strings.Repeat("z", 64)), eps)
				if mt, _, _, ok := prefixInfo(t, eps[0]); ok && mt > 0 {
					scored++
				}
			}
			stale := fallbacks(t, m, gie.FallbackNone, gie.KindStale)
			if tc.wantScored {
				if scored != requests || stale != 0 {
					t.Errorf("check off: %d of %d requests scored from the index, %v stale fallbacks; want all scored, none", scored, requests, stale)
				}
				return
			}
			if scored != 0 || stale != requests {
				t.Errorf("every replica an hour stale: %d of %d requests scored from it, %v stale fallbacks; want none scored, %d fallbacks",
					scored, requests, stale, requests)
			}
		})
	}
}

// TestStaleReplicaNeverScores: of two indexd replicas one is an hour
// behind and still names pod0's evicted blocks, one is current. Under an
// EPP's concurrency (16 requests at once) no request may score pod0 from
// the replica behind: the client's freshness search prefers the current
// replica, and an answer that still comes from the stale one falls back.
func TestStaleReplicaNeverScores(t *testing.T) {
	behind := serveCell(t, &replicaAt{behind: time.Hour, ghost: true})
	current := serveCell(t, &replicaAt{})
	m := gie.NewMetrics()
	p := newProducer(t, m, map[string]any{"target": behind + "," + current, "speculativeTTL": "0s", "identityCheckInterval": "0s"})
	var reqs, ghosts atomic.Int64
	var wg sync.WaitGroup
	end := time.Now().Add(time.Second)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) {
				eps := endpoints(2)
				_ = p.PrepareRequestData(context.Background(), tokenized(strings.Repeat("z", 64)), eps)
				reqs.Add(1)
				if mt, _, _, ok := prefixInfo(t, eps[0]); ok && mt > 0 {
					ghosts.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if g, n := ghosts.Load(), reqs.Load(); g > 0 || n == 0 {
		t.Errorf("%d of %d requests scored pod0 from the replica an hour behind (a current replica answered throughout)", g, n)
	}
}
